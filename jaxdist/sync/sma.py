"""Crossbow's synchronous model averaging (SMA): learners pulled towards a central model."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from jaxdist import comm
from jaxdist.sync import _checks


class SMAState(NamedTuple):
  """State of `sma`.

  Attributes:
    center: the central average model z. Replicated.
    previous: z before the last step (for its momentum). Replicated.
    wire: the all-reduce of the corrections. Per-worker.
  """

  center: Any
  previous: Any
  wire: tuple


def sma(
  alpha: float, momentum: float = 0.9, *, axis_name: comm.AxisName
) -> optax.GradientTransformation:
  """Crossbow's synchronous model averaging: learners pulled towards a central model.

  After each learner's own step, with correction c_j = α(w_j − z) taken
  before the step:  w_j <- w_j − η∇ − c_j  and  z <- z + Σ_j c_j + μ(z − z_prev).
  Learners may diverge; the average model moves by their corrections, with
  momentum. Put it after the optimizer. α = 0 leaves learners independent.
  Evaluation in this library uses the learners' mean, not z.

  Args:
    alpha: correction weight α (Crossbow suggests about 1/number of learners).
    momentum: μ, momentum of the central model.
    axis_name: the worker axis (or tuple of axes).

  Returns:
    An `optax.GradientTransformation`; put it after the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = optax.chain(optax.sgd(1.0), sync.sma(0.5, axis_name=runtime.AXES))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> run.params = {'x': jnp.array([2.0, -2.0])}  # learners away from z = 0
    >>> run({'x': jnp.zeros(2)})['x']  # each pulled half-way back
    Array([ 1., -1.], dtype=float32)

  Reference:
    Koliousis et al. Crossbow: Scaling Deep Learning with Small Batch Sizes
    on Multi-GPU Servers. VLDB 2019. https://arxiv.org/abs/1901.02244
    (equations follow the authors' code, lsds/Crossbow; the paper's exact
    form was not verified.)
  """
  _checks.check('alpha', alpha, lambda a: a >= 0, '>= 0')
  _checks.check('momentum', momentum, lambda m: 0 <= m < 1, 'in [0, 1)')

  def init_fn(params):
    return SMAState(params, params, (comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0),))

  def update_fn(updates, state, params=None):
    _checks.needs_params('sma', params)
    correction = jax.tree.map(lambda w, z: alpha * (w - z), params, state.center)
    total, sent = comm.psum(correction, axis_name)
    center = jax.tree.map(
      lambda z, c, p: z + c + momentum * (z - p), state.center, total, state.previous
    )
    return optax.tree.sub(updates, correction), SMAState(center, state.center, (sent,))

  return optax.GradientTransformation(init_fn, update_fn)
