"""Model synchronisation shared by local SGD, DiLoCo and SelSync.

A synchronising step either averages the models themselves with one dense
all-reduce (`averager=None`), or hands each worker's change since the last
synchronisation to an averaging transform (any `optax.GradientTransformation`
that averages over the workers, e.g. `compressed_allreduce(topk(0.01), ...)`)
and moves the shared anchor by the result. Either way the state keeps the
synchronised model as its `anchor` and `just_synced` says whether the last
step produced it, so that `jd.sync.apply_updates` can give every worker that
model exactly (w + (m − w) is not m in floating point). The averager's state
lives in the method's state; on a step that does not synchronise, its
transfers are marked as not having run.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm
from jaxdist.sync import _checks


def check_averager(averager: Any) -> None:
  """Raises ValueError unless `averager` is None or a gradient transformation."""
  if averager is not None and not (hasattr(averager, 'init') and hasattr(averager, 'update')):
    raise ValueError(
      'averager must be None or an optax.GradientTransformation that averages over the '
      f'workers (e.g. jd.sync.allreduce(axis_name=...)), got {averager!r}'
    )


def dense_wire(params: Any, averager: optax.GradientTransformation | None) -> tuple:
  """The dense all-reduce of the model, not yet run (() with an averager)."""
  if averager is not None:
    return ()
  return (comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0),)


def init_sync(params: Any, averager: optax.GradientTransformation | None) -> dict[str, Any]:
  """The fields every synchronising method's state starts with.

  count and synced at 0; the anchor (the model itself: one copy of it);
  the averager's state; the dense model all-reduce (without one);
  just_synced False.
  """
  return dict(
    count=jnp.zeros([], jnp.int32),
    synced=jnp.zeros([], jnp.int32),
    anchor=params,
    averager=averager.init(params) if averager is not None else (),
    wire=dense_wire(params, averager),
    just_synced=jnp.zeros([], jnp.bool_),
  )


def counted(state: Any, due: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(count, synced) after a step that synchronised if `due`."""
  return optax.safe_increment(state.count), state.synced + due.astype(jnp.int32)


def mean_fn(averager: optax.GradientTransformation | None, axis_name: comm.AxisName):
  """(tree, averager state, wire) -> (mean over workers, averager state, wire)."""

  def mean(tree, avg_state, wire):
    if averager is None:
      out, sent = comm.pmean(tree, axis_name)
      return out, avg_state, (comm.ran(sent, 1),)
    out, avg_state = averager.update(tree, avg_state)
    return out, avg_state, wire

  return mean


def model_sync(averager: optax.GradientTransformation | None, axis_name: comm.AxisName):
  """The two `lax.cond` branches of a model synchronisation, (sync, skip).

  Both map (params, updates, anchor, averager state, wire) to (updates,
  anchor, averager state, wire). Dense: the anchor becomes the mean of the
  models params + updates. With an averager: the anchor moves by the
  averaged change (params + updates − anchor). The updates move every worker
  to the new anchor (up to the rounding of params + (anchor − params)).
  """
  mean = mean_fn(averager, axis_name)

  def sync(params, updates, anchor, avg_state, wire):
    local = optax.apply_updates(params, updates)
    if averager is None:
      anchor, avg_state, wire = mean(local, avg_state, wire)
      return optax.tree.sub(anchor, params), anchor, avg_state, wire
    delta, avg_state, wire = mean(optax.tree.sub(local, anchor), avg_state, wire)
    anchor = optax.apply_updates(anchor, delta)
    return optax.tree.sub(anchor, params), anchor, avg_state, wire

  def skip(params, updates, anchor, avg_state, wire):
    del params
    return updates, anchor, comm.silence(avg_state), comm.silence(wire)

  return sync, skip


def check_period(period: int) -> None:
  _checks.check('period', period, lambda p: p >= 1, '>= 1')
