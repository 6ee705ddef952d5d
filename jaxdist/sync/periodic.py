"""Less synchronisation: local SGD, DiLoCo, SelSync and Crossbow's SMA.

Workers step on their own; now and then (local SGD, DiLoCo), when a worker
sees a significant change (SelSync), or softly every step (SMA) their models
are brought together. A step that does not synchronise does not communicate:
the collective sits in a `lax.cond` whose predicate every worker agrees on
(`comm.agree`), so XLA skips the branch, and the byte accounting counts only
the steps that synchronised.

Synchronising averages parameters densely (one all-reduce of the model), or,
given a `compressor`, averages each worker's change since the last sync with
`compressed_allreduce` (error feedback included) and adds it to the shared
anchor.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync.compressed import compressed_allreduce


class _Averager(NamedTuple):
  init: Any
  mean: Any  # (tree, state) -> (mean tree, state, dense transfers)


def _averager(compressor, axis_name, compress_kwargs) -> _Averager:
  """Mean over workers, dense or through `compressed_allreduce`."""
  if compressor is None:

    def mean(tree, state):
      out, sent = comm.pmean(tree, axis_name)
      return out, state, (sent,)

    return _Averager(lambda params: (), mean)
  tx = compressed_allreduce(compressor, axis_name=axis_name, **compress_kwargs)

  def compressed_mean(tree, state):
    out, state = tx.update(tree, state)
    return out, state, ()

  return _Averager(tx.init, compressed_mean)


def _dense_wire(params, compressor) -> tuple:
  if compressor is not None:
    return ()
  return (comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0),)


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


def _sub(a, b):
  return jax.tree.map(jnp.subtract, a, b)


def _check_period(period: int) -> None:
  if period < 1:
    raise ValueError(f'period must be >= 1, got {period}')


# --- local SGD -------------------------------------------------------------------


class LocalSGDState(NamedTuple):
  """State of `local_sgd`.

  Attributes:
    count: update calls so far. Replicated.
    synced: how many of them synchronised. Replicated.
    anchor: the model of the last synchronisation (() when averaging densely).
      Replicated.
    averager: the compressed averager's state (() when dense). Per-worker.
    wire: the dense all-reduce of the model (() when compressed). Per-worker.
  """

  count: jax.Array
  synced: jax.Array
  anchor: Any
  averager: Any
  wire: tuple


def _model_sync(averager, compressor, axis_name):
  """(params, updates, anchor, averager state) -> synced (updates, anchor, state, wire)."""

  def sync(params, updates, anchor, avg_state, wire):
    local = _add(params, updates)
    if compressor is None:
      mean, avg_state, sent = averager.mean(local, avg_state)
      return _sub(mean, params), anchor, avg_state, tuple(comm.ran(t, 1) for t in sent)
    delta, avg_state, _ = averager.mean(_sub(local, anchor), avg_state)
    anchor = _add(anchor, delta)
    return _sub(anchor, params), anchor, avg_state, wire

  def skip(params, updates, anchor, avg_state, wire):
    del params
    return updates, anchor, comm.silence(avg_state), comm.silence(wire)

  return sync, skip


def local_sgd(
  period: int,
  *,
  axis_name: comm.AxisName,
  warmup_steps: int = 0,
  compressor=None,
  **compress_kwargs,
) -> optax.GradientTransformation:
  """Averages parameters over `axis_name` after every `period` local steps.

  Put it after the optimizer: `optax.chain(optax.sgd(0.1), local_sgd(8,
  axis_name=...))`. Each worker's optimizer state stays its own.

  Args:
    period: local steps between averages (1 = average every step).
    axis_name: the worker axis (or tuple of axes).
    warmup_steps: post-local SGD (Lin et al. 2020): average every step for
      this many steps, then every `period`.
    compressor: average each worker's change since the last sync with this
      `jaxdist.compress` compressor (through `compressed_allreduce`, error
      feedback on) instead of averaging the model densely.
    **compress_kwargs: passed to `compressed_allreduce`.

  References:
    Stich. Local SGD Converges Fast and Communicates Little. ICLR 2019.
    https://arxiv.org/abs/1805.09767
    Lin, Stich, Patel, Jaggi. Don't Use Large Mini-Batches, Use Local SGD.
    ICLR 2020 (post-local SGD). https://arxiv.org/abs/1808.07217
  """
  _check_period(period)
  if warmup_steps < 0:
    raise ValueError(f'warmup_steps must be >= 0, got {warmup_steps}')
  averager = _averager(compressor, axis_name, compress_kwargs)
  sync, skip = _model_sync(averager, compressor, axis_name)

  def init_fn(params):
    return LocalSGDState(
      count=jnp.zeros([], jnp.int32),
      synced=jnp.zeros([], jnp.int32),
      anchor=params if compressor is not None else (),
      averager=averager.init(params),
      wire=_dense_wire(params, compressor),
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('local_sgd needs params: call update(updates, state, params)')
    due = ((state.count + 1) % period == 0) | (state.count < warmup_steps)
    due = comm.agree(due, axis_name)
    updates, anchor, avg_state, wire = lax.cond(
      due, sync, skip, params, updates, state.anchor, state.averager, state.wire
    )
    new = LocalSGDState(
      optax.safe_increment(state.count),
      state.synced + due.astype(jnp.int32),
      anchor,
      avg_state,
      wire,
    )
    return updates, new

  return optax.GradientTransformation(init_fn, update_fn)


# --- DiLoCo ------------------------------------------------------------------------


class DiLoCoState(NamedTuple):
  """State of `diloco`.

  Attributes:
    count: inner steps so far. Replicated.
    synced: outer steps so far. Replicated.
    anchor: the outer (global) parameters. Replicated.
    outer_state: the outer optimizer's state. Replicated.
    averager: the compressed averager's state (() when dense). Per-worker.
    wire: the dense all-reduce of the pseudo-gradient (() when compressed).
      Per-worker.
  """

  count: jax.Array
  synced: jax.Array
  anchor: Any
  outer_state: Any
  averager: Any
  wire: tuple


def diloco(
  outer_optimizer: optax.GradientTransformation | None = None,
  period: int = 500,
  *,
  axis_name: comm.AxisName,
  compressor=None,
  **compress_kwargs,
) -> optax.GradientTransformation:
  """DiLoCo: local inner steps, then an outer step on the averaged pseudo-gradient.

  Every `period` inner steps, the pseudo-gradient Δ = anchor − mean over
  workers of the local parameters is given to `outer_optimizer` (by default
  Nesterov SGD, lr 0.7, momentum 0.9, as in the paper), the anchor moves, and
  every worker restarts from it. The inner optimizer (the one before this
  transform in the chain) keeps its state across outer steps.

  Args:
    outer_optimizer: optax optimizer of the anchor (default Nesterov SGD).
    period: inner steps H between outer steps.
    axis_name: the worker axis (or tuple of axes).
    compressor: compress the pseudo-gradient with this compressor (through
      `compressed_allreduce`, error feedback on by default).
    **compress_kwargs: passed to `compressed_allreduce`.

  References:
    Douillard et al. DiLoCo: Distributed Low-Communication Training of
    Language Models. 2023. https://arxiv.org/abs/2311.08105
  """
  _check_period(period)
  outer = outer_optimizer or optax.sgd(0.7, momentum=0.9, nesterov=True)
  averager = _averager(compressor, axis_name, compress_kwargs)

  def sync(params, updates, anchor, outer_state, avg_state, wire):
    pseudo = _sub(anchor, _add(params, updates))  # per worker
    pseudo, avg_state, sent = averager.mean(pseudo, avg_state)
    outer_updates, outer_state = outer.update(pseudo, outer_state, anchor)
    anchor = optax.apply_updates(anchor, outer_updates)
    wire = tuple(comm.ran(t, 1) for t in sent) if sent else wire
    return _sub(anchor, params), anchor, outer_state, avg_state, wire

  def skip(params, updates, anchor, outer_state, avg_state, wire):
    del params
    return updates, anchor, outer_state, comm.silence(avg_state), comm.silence(wire)

  def init_fn(params):
    return DiLoCoState(
      count=jnp.zeros([], jnp.int32),
      synced=jnp.zeros([], jnp.int32),
      anchor=params,
      outer_state=outer.init(params),
      averager=averager.init(params),
      wire=_dense_wire(params, compressor),
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('diloco needs params: call update(updates, state, params)')
    due = comm.agree((state.count + 1) % period == 0, axis_name)
    updates, anchor, outer_state, avg_state, wire = lax.cond(
      due, sync, skip, params, updates, state.anchor, state.outer_state, state.averager, state.wire
    )
    new = DiLoCoState(
      optax.safe_increment(state.count),
      state.synced + due.astype(jnp.int32),
      anchor,
      outer_state,
      avg_state,
      wire,
    )
    return updates, new

  return optax.GradientTransformation(init_fn, update_fn)


# --- SelSync -------------------------------------------------------------------------


class SelSyncState(NamedTuple):
  """State of `selsync`.

  Attributes:
    count: steps so far. Replicated.
    synced: steps that synchronised. Replicated.
    inner: the wrapped optimizer's state. Per-worker.
    norms: this worker's last `window` gradient norms, newest first. Per-worker.
    deltas: its last `window` relative changes, newest first. Per-worker.
    smoothed: the smoothed norm of the previous step. Per-worker.
    anchor: model of the last sync (() when averaging densely). Replicated.
    averager: the compressed averager's state (() when dense). Per-worker.
    wire: the flags all-reduce, then the dense model all-reduce (if dense).
      Per-worker.
  """

  count: jax.Array
  synced: jax.Array
  inner: Any
  norms: jax.Array
  deltas: jax.Array
  smoothed: jax.Array
  anchor: Any
  averager: Any
  wire: tuple


def _windowed_mean(values: jax.Array, filled: jax.Array, alpha: float) -> jax.Array:
  """Weighted mean of the newest `filled` values, weights (1 − α)^age (SelSync's EWMA)."""
  weights = (1 - alpha) ** jnp.arange(values.size, dtype=jnp.float32)
  weights = jnp.where(jnp.arange(values.size) < filled, weights, 0.0)
  return jnp.sum(weights * values) / jnp.maximum(jnp.sum(weights), 1e-12)


def _push(buffer: jax.Array, value: jax.Array) -> jax.Array:
  return jnp.concatenate([value[None], buffer[:-1]])


def gradient_norm(grads, kind: str = 'layer_sum', squared: bool = False) -> jax.Array:
  """SelSync's gradient norm: sum of per-tensor L2 norms ('layer_sum', as its code) or global."""
  leaves = [g.astype(jnp.float32) for g in jax.tree.leaves(grads)]
  if kind == 'layer_sum':
    norms = [jnp.sum(g * g) if squared else jnp.linalg.norm(g.reshape(-1)) for g in leaves]
    return sum(norms)
  if kind == 'global':
    total = sum(jnp.sum(g * g) for g in leaves)
    return total if squared else jnp.sqrt(total)
  raise ValueError(f"norm must be 'layer_sum' or 'global', got {kind!r}")


def selsync(
  optimizer: optax.GradientTransformation,
  threshold: float,
  *,
  axis_name: comm.AxisName,
  window: int = 25,
  alpha: float = 0.01,
  norm: str = 'layer_sum',
  squared: bool = False,
  compressor=None,
  **compress_kwargs,
) -> optax.GradientTransformation:
  """SelSync: a local step always; parameter averaging when any worker's gradient changed.

  Wraps the local `optimizer`. Each worker tracks its gradient norm,
  smoothed over the last `window` steps, and the relative change of the
  smoothed norm from one step to the next (smoothed again); the worker flags
  the step when the change is at least `threshold`. Flags go through a
  4-byte all-reduce; if any worker flagged, all average their parameters
  after the local step (parameter aggregation, the paper's "PA"), otherwise
  the step stays local. During the first `window` steps every step
  synchronises, as in the authors' code.

  Defaults follow the authors' code (sahiltyagi4/SelSync): norm = sum of
  per-layer L2 norms, not squared; smoothing = weighted mean of the last 25
  values with weights (1 − 0.01)^age. The paper's Eq. 2 uses expected
  squared norms: `norm='global', squared=True`.

  Args:
    optimizer: the local optimizer (e.g. `optax.sgd(0.1, momentum=0.9)`).
    threshold: δ; 0 synchronises every step.
    axis_name: the worker axis (or tuple of axes).
    window: steps of smoothing (and of always-sync warm-up).
    alpha: smoothing factor of the windowed weighted mean.
    norm: 'layer_sum' or 'global'.
    squared: use squared norms.
    compressor: synchronise each worker's change since the last sync with
      this compressor instead of averaging the model densely.
    **compress_kwargs: passed to `compressed_allreduce`.

  Reference:
    Tyagi & Swany. Accelerating Distributed ML Training via Selective
    Synchronization. IEEE CLUSTER 2023. https://arxiv.org/abs/2307.07950
  """
  if threshold < 0:
    raise ValueError(f'threshold must be >= 0, got {threshold}')
  if window < 1:
    raise ValueError(f'window must be >= 1, got {window}')
  if not 0 <= alpha < 1:
    raise ValueError(f'alpha must be in [0, 1), got {alpha}')
  gradient_norm(jnp.zeros(1), norm)  # validates `norm`
  averager = _averager(compressor, axis_name, compress_kwargs)
  sync, skip = _model_sync(averager, compressor, axis_name)

  def init_fn(params):
    return SelSyncState(
      count=jnp.zeros([], jnp.int32),
      synced=jnp.zeros([], jnp.int32),
      inner=optimizer.init(params),
      norms=jnp.zeros([window], jnp.float32),
      deltas=jnp.zeros([window], jnp.float32),
      smoothed=jnp.zeros([], jnp.float32),
      anchor=params if compressor is not None else (),
      averager=averager.init(params),
      wire=(comm.transfer(comm.ALL_REDUCE, 4, 0), *_dense_wire(params, compressor)),
    )

  def update_fn(grads, state, params=None):
    if params is None:
      raise ValueError('selsync needs params: call update(grads, state, params)')
    filled = jnp.minimum(state.count + 1, window)
    norms = _push(state.norms, gradient_norm(grads, norm, squared))
    smoothed = _windowed_mean(norms, filled, alpha)
    change = jnp.where(
      state.count > 0, jnp.abs(smoothed - state.smoothed) / jnp.maximum(state.smoothed, 1e-12), 0.0
    )
    deltas = _push(state.deltas, change)
    significant = (_windowed_mean(deltas, filled, alpha) >= threshold) | (state.count < window)
    updates, inner = optimizer.update(grads, state.inner, params)
    flags, flag_wire = comm.psum(significant.astype(jnp.int32), axis_name)
    due = comm.agree(flags > 0, axis_name)
    updates, anchor, avg_state, model_wire = lax.cond(
      due, sync, skip, params, updates, state.anchor, state.averager, state.wire[1:]
    )
    new = SelSyncState(
      count=optax.safe_increment(state.count),
      synced=state.synced + due.astype(jnp.int32),
      inner=inner,
      norms=norms,
      deltas=deltas,
      smoothed=smoothed,
      anchor=anchor,
      averager=avg_state,
      wire=(flag_wire, *model_wire),
    )
    return updates, new

  return optax.GradientTransformation(init_fn, update_fn)


# --- Crossbow SMA --------------------------------------------------------------------


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
  Evaluation in this library uses the learners' mean, not z (see README).

  Args:
    alpha: correction weight α (Crossbow suggests about 1/number of learners).
    momentum: μ, momentum of the central model.
    axis_name: the worker axis (or tuple of axes).

  Reference:
    Koliousis et al. Crossbow: Scaling Deep Learning with Small Batch Sizes
    on Multi-GPU Servers. VLDB 2019. https://arxiv.org/abs/1901.02244
    (equations follow the authors' code, lsds/Crossbow; the paper's exact
    form was not verified.)
  """
  if alpha < 0:
    raise ValueError(f'alpha must be >= 0, got {alpha}')
  if not 0 <= momentum < 1:
    raise ValueError(f'momentum must be in [0, 1), got {momentum}')

  def init_fn(params):
    return SMAState(params, params, (comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0),))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('sma needs params: call update(updates, state, params)')
    correction = jax.tree.map(lambda w, z: alpha * (w - z), params, state.center)
    total, sent = comm.psum(correction, axis_name)
    center = jax.tree.map(
      lambda z, c, p: z + c + momentum * (z - p), state.center, total, state.previous
    )
    return _sub(updates, correction), SMAState(center, state.center, (sent,))

  return optax.GradientTransformation(init_fn, update_fn)
