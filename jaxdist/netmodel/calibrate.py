"""α and β of the running platform, fitted to measured all-reduces."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import comm, timing
from jaxdist.netmodel.model import Network
from jaxdist.runtime import Workers


def calibrate(
  workers: Workers,
  sizes: Sequence[int] = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22),
  repeats: int = 5,
) -> Network:
  """Fits the ring all-reduce model t = 2(N-1)α + 2(N-1)/N·Mβ to timed psums.

  Args:
    workers: the layout to measure on (its real devices carry the traffic).
    sizes: payload sizes in float32 elements.
    repeats: timings per size; the median is used.

  Returns:
    A `Network` named 'calibrated'. On one host it describes the device
    interconnect (or, on CPU, memory copies), not a datacentre network.
  """
  n = workers.count
  if n < 2:
    raise ValueError('calibration needs at least 2 workers')
  reduce = jax.jit(workers.map(lambda x: comm.psum(x, workers.axis_name)[0], in_axes=(0,)))
  xs, ts = [], []
  for size in sizes:
    x = jax.device_put(jnp.ones((n, size), jnp.float32), workers.sharding)
    xs.append(4.0 * size)
    ts.append(timing.median_seconds(lambda x=x: reduce(x), repeats))
  return fit_ring(n, xs, ts)


def fit_ring(n: int, nbytes: Sequence[float], seconds: Sequence[float]) -> Network:
  """α and β of the ring all-reduce model fitted to all-reduces of `nbytes` taking `seconds`.

  The line t = 2(N-1)α + 2(N-1)/N·Mβ is fitted in relative error (each
  point weighted by 1/t): a single least-squares line in absolute error is
  set by the largest payloads, and its intercept, α, can come out anywhere
  from negative to several times the small payloads' real cost.

  Args:
    n: N, the workers of the ring.
    nbytes: M per all-reduce, bytes; at least two different sizes.
    seconds: the measured time of each.

  Returns:
    A `Network` named 'calibrated' (α clipped at 0).
  """
  if n < 2:
    raise ValueError(f'a ring needs at least 2 workers, got {n}')
  x, t = np.asarray(nbytes, float), np.asarray(seconds, float)
  if x.shape != t.shape or len(set(x.tolist())) < 2 or not np.all(np.isfinite(t) & (t > 0)):
    raise ValueError('fit_ring needs one positive, finite time per size and at least 2 sizes')
  slope, intercept = np.polyfit(x, t, 1, w=1.0 / t)
  latency = max(float(intercept), 0.0) / (2 * (n - 1))
  beta = max(float(slope), 1e-15) * n / (2 * (n - 1))
  return Network(latency=latency, bandwidth=1.0 / beta, name='calibrated')
