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
  slope, intercept = np.polyfit(np.asarray(xs), np.asarray(ts), 1)
  latency = max(float(intercept), 0.0) / (2 * (n - 1))
  beta = max(float(slope), 1e-15) * n / (2 * (n - 1))
  return Network(latency=latency, bandwidth=1.0 / beta, name='calibrated')
