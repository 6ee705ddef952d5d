"""DGC's local gradient clipping: each worker clips its own gradient before compression."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm
from jaxdist.sync import _checks


def local_clip(max_norm: float, *, axis_name: comm.AxisName) -> optax.GradientTransformation:
  """DGC's local gradient clipping: each worker clips to max_norm / sqrt(N).

  Each worker clips its own gradient by global norm before compression,

    g_n <- g_n · min(1, (max_norm / √N) / ‖g_n‖),

  the threshold scaled by N^(-1/2) so that the sum of N clipped gradients
  respects `max_norm` (Lin et al. 2018, §3.2). Communicates nothing; the
  axis only gives N. `max_norm` may be injected
  (`optax.inject_hyperparams(local_clip)(max_norm=1.0, axis_name=...)`).

  Args:
    max_norm: the global-norm bound of the sum of the N workers' gradients.
    axis_name: the worker axis (or tuple of axes); gives N.

  Returns:
    An `optax.GradientTransformation`; put it before `compressed_allreduce`.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.local_clip(10.0, axis_name=runtime.AXES)  # 4 workers: each to norm 5
    >>> run = testing.Run(tx, {'x': jnp.zeros(2)}, workers=4)
    >>> g = jnp.array([[6.0, 8.0], [3.0, 4.0], [0.0, 1.0], [0.0, 20.0]])
    >>> run({'x': g})['x']  # params 0 + the clipped gradients
    Array([[3., 4.],
           [3., 4.],
           [0., 1.],
           [0., 5.]], dtype=float32)

  Reference:
    Lin, Han, Mao, Wang, Dally. Deep Gradient Compression: Reducing the
    Communication Bandwidth for Distributed Training. ICLR 2018.
    https://arxiv.org/abs/1712.01887
  """

  _checks.check('max_norm', max_norm, lambda m: m > 0, '> 0')

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    limit = max_norm / math.sqrt(comm.axis_size(axis_name))
    norm = optax.global_norm(updates)
    scale = jnp.minimum(1.0, limit / jnp.maximum(norm, 1e-12))
    return jax.tree.map(lambda g: g * scale, updates), state

  return optax.GradientTransformation(init_fn, update_fn)
