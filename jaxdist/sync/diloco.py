"""DiLoCo: local inner steps, then an outer optimizer step on the averaged pseudo-gradient."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync import _averaging, _checks


class DiLoCoState(NamedTuple):
  """State of `diloco`.

  Attributes:
    count: inner steps so far. Replicated.
    synced: outer steps so far. Replicated.
    anchor: the outer (global) parameters. Replicated.
    outer_state: the outer optimizer's state. Replicated.
    averager: the averager's state (() without one). Per-worker.
    wire: the dense all-reduce of the pseudo-gradient (() with an averager).
      Per-worker.
    just_synced: whether the last update was an outer step, so that `anchor`
      is the model every worker takes now. Replicated.
  """

  SYNCED_MODEL = ('anchor', 'just_synced')  # what `jd.sync.apply_updates` puts in

  count: jax.Array
  synced: jax.Array
  anchor: Any
  outer_state: Any
  averager: Any
  wire: tuple
  just_synced: jax.Array


def diloco(
  outer_optimizer: optax.GradientTransformation | None = None,
  period: int = 500,
  *,
  axis_name: comm.AxisName,
  averager: optax.GradientTransformation | None = None,
) -> optax.GradientTransformation:
  """DiLoCo: local inner steps, then an outer step on the averaged pseudo-gradient.

  Every `period` inner steps, the pseudo-gradient Δ = (1/N) Σ_n (a − w_n),
  with a the anchor (outer parameters) and w_n worker n's parameters, is
  given to `outer_optimizer` (by default Nesterov SGD, lr 0.7, momentum 0.9,
  as in the paper); the anchor takes the outer step and every worker
  restarts from it. The inner optimizer (the one before this transform in
  the chain) keeps its state across outer steps. Put it last in the chain.

  After an outer step every worker should hold the anchor a exactly. The
  update moves worker n there as w_n + (a − w_n), which rounds: with
  `optax.apply_updates` the workers' models differ from a, and from each
  other, by up to an ulp of max(|w_n|, |a|) in some of the elements (it does
  not grow: the next outer step starts from a). `jd.sync.apply_updates(params,
  updates, opt_state)` gives every worker a itself, bitwise, from the state
  (no memory added: the anchor is kept anyway); the library's loops use it.

  Args:
    outer_optimizer: optax optimizer of the anchor (default Nesterov SGD).
    period: inner steps H between outer steps.
    axis_name: the worker axis (or tuple of axes).
    averager: a transform that averages the pseudo-gradient over `axis_name`
      (e.g. `compressed_allreduce(topk(0.01), axis_name=...)`, error
      feedback included); None is one dense all-reduce.

  Returns:
    An `optax.GradientTransformation`; put it after the inner optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> outer = optax.sgd(1.0)  # lr 1, no momentum: the outer step is the plain average
    >>> tx = optax.chain(optax.sgd(0.5), sync.diloco(outer, 2, axis_name=runtime.AXES))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> _ = run({'x': jnp.array([1.0, 3.0])})
    >>> run({'x': jnp.array([1.0, 3.0])})['x']
    Array([-2., -2.], dtype=float32)

  References:
    Douillard et al. DiLoCo: Distributed Low-Communication Training of
    Language Models. 2023. https://arxiv.org/abs/2311.08105
  """
  _averaging.check_period(period)
  _averaging.check_averager(averager)
  outer = outer_optimizer or optax.sgd(0.7, momentum=0.9, nesterov=True)

  sync, skip = _outer_step(outer, _averaging.mean_fn(averager, axis_name))

  def init_fn(params):
    fields = _averaging.init_sync(params, averager)
    return DiLoCoState(**fields | dict(outer_state=outer.init(params)))

  def update_fn(updates, state, params=None):
    _checks.needs_params('diloco', params)
    due = comm.agree((state.count + 1) % period == 0, axis_name)
    updates, anchor, outer_state, avg_state, wire = lax.cond(
      due, sync, skip, params, updates, state.anchor, state.outer_state, state.averager, state.wire
    )
    count, synced = _averaging.counted(state, due)
    return updates, DiLoCoState(count, synced, anchor, outer_state, avg_state, wire, due)

  return optax.GradientTransformation(init_fn, update_fn)


def outer_step(
  outer: optax.GradientTransformation, pseudo: Any, outer_state: Any, anchor: Any
) -> tuple[Any, Any]:
  """(anchor, outer state) after `outer`'s step on the averaged pseudo-gradient `pseudo`."""
  outer_updates, outer_state = outer.update(pseudo, outer_state, anchor)
  return optax.apply_updates(anchor, outer_updates), outer_state


def _outer_step(outer: optax.GradientTransformation, mean):
  """The `lax.cond` branches (sync, skip) of DiLoCo's outer step.

  Both map (params, updates, anchor, outer state, averager state, wire) to
  (updates, anchor, outer state, averager state, wire).
  """

  def sync(params, updates, anchor, outer_state, avg_state, wire):
    pseudo = optax.tree.sub(anchor, optax.apply_updates(params, updates))  # per worker
    pseudo, avg_state, wire = mean(pseudo, avg_state, wire)
    anchor, outer_state = outer_step(outer, pseudo, outer_state, anchor)
    return optax.tree.sub(anchor, params), anchor, outer_state, avg_state, wire

  def skip(params, updates, anchor, outer_state, avg_state, wire):
    del params
    return updates, anchor, outer_state, comm.silence(avg_state), comm.silence(wire)

  return sync, skip
