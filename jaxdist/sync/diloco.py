"""DiLoCo: local inner steps, then an outer optimizer step on the averaged pseudo-gradient.

With `eager=True`, Kale et al.'s eager updates: the average of a round's
pseudo-gradients arrives one round late, and each worker's outer step mixes
it with its own fresh pseudo-gradient (`EagerDiLoCoState`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync import _averaging, _checks
from jaxdist.sync.deferred import DeferredExchange, check_exchange
from jaxdist.sync.weighted import COUNT_BYTES, weighted_mean


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


class StepsDiLoCoState(NamedTuple):
  """State of `diloco(by_steps=True)`.

  Attributes:
    count: inner steps so far (the workers' slots, taken or sat out). Replicated.
    synced: outer steps so far. Replicated.
    anchor: the outer (global) parameters. Replicated.
    outer_state: the outer optimizer's state. Replicated.
    wire: the all-reduce of the weighted pseudo-gradient and its weight.
      Per-worker.
    just_synced: whether the last update was an outer step. Replicated.
    taken: the inner steps this worker took since the last outer step (those
      with a weight > 0). Per-worker.
  """

  SYNCED_MODEL = ('anchor', 'just_synced')  # what `jd.sync.apply_updates` puts in
  count: jax.Array
  synced: jax.Array
  anchor: Any
  outer_state: Any
  wire: tuple
  just_synced: jax.Array
  taken: jax.Array


class EagerDiLoCoState(NamedTuple):
  """State of `diloco(eager=True)`.

  Attributes:
    count: inner steps so far. Replicated.
    synced: outer steps so far. Replicated.
    anchor: this worker's outer parameters θ_m (the workers' differ by their
      own share of the last pseudo-gradient, see `diloco`). Per-worker.
    outer_state: this worker's outer optimizer state. Per-worker.
    wire: the dense all-reduce of the pseudo-gradient. Per-worker.
    pending: the average Δ̄ of the last outer step's pseudo-gradients, which
      the next outer step uses (zeros before the first). With
      `exchange='deferred'`, from the step that sends until the average
      arrives, this worker's own Δ_m. Replicated.
    mine: this worker's pseudo-gradient Δ_m of the last outer step (zeros
      before the first). Per-worker.
    just_synced: whether the last update was an outer step. Replicated.
  """

  SYNCED_MODEL = ('anchor', 'just_synced')  # what `jd.sync.apply_updates` puts in

  count: jax.Array
  synced: jax.Array
  anchor: Any
  outer_state: Any
  wire: tuple
  pending: Any
  mine: Any
  just_synced: jax.Array


def diloco(
  outer_optimizer: optax.GradientTransformation | None = None,
  period: int = 500,
  *,
  axis_name: comm.AxisName,
  averager: optax.GradientTransformation | None = None,
  eager: bool = False,
  exchange: str = 'inline',
  by_steps: bool = False,
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
    eager: Kale et al.'s eager updates (below); the state is then an
      `EagerDiLoCoState`.
    exchange: with `eager`, 'inline' (the step averages) or 'deferred' (the
      step keeps Δ_m in `pending` and sends nothing; `diloco_exchange` says
      how to average it outside the step, before the next outer step).
    by_steps: weight each worker's pseudo-gradient by the inner steps it
      took (below); the state is then a `StepsDiLoCoState`.

  With `eager`, the average of round r's pseudo-gradients is not waited for:
  worker m's outer step at the end of round r takes

    Δ̃_m^r = Δ̄^{r−1} + (Δ_m^r − Δ_m^{r−1}) / N = (Δ_m^r + Σ_{n≠m} Δ_n^{r−1}) / N

  (its own fresh pseudo-gradient, the others' from the round before, whose
  average Δ̄^{r−1} arrived meanwhile), from its own outer parameters and
  optimizer state, with Δ_m^r = θ_m^{r−1} − w_m. The all-reduce of Δ^r
  feeds only the state: it may run beside the next round's H steps. The
  workers' outer parameters differ by their own shares; with outer SGD,
  θ_m^r is the one-round-delayed DiLoCo's θ^r less lr·Δ_m^r / N (the
  difference does not grow). One worker is DiLoCo. Readings where the paper
  (whose method section we could not read; the rule is from its summaries
  and tables) is silent: before the first outer step Δ̄^0 = Δ_m^0 = 0, so
  the first takes Δ_m^1 / N; the outer state is per worker; the averager is
  one dense all-reduce.

  With `by_steps`, workers of unequal speed each take the inner steps that
  fit in a round's wall-clock window (heterogeneity-aware DiLoCo, as issue 47
  reads it: prime's and HeLoCo's write-ups, arXiv 2606.00271, state no
  per-worker rule): a worker sits out an inner step by training on no
  examples, the step's optax extra argument `weight` 0 (a counted step's
  count; with micro-batches it computes nothing), its inner optimizer
  wrapped in `jd.sync.sit_out` so its model stays. The outer step averages
  Δ = Σ_n h_n (a − w_n) / Σ_n h_n, h_n the steps worker n took this round:
  one all-reduce of h_n (a − w_n) and h_n. With every worker taking every
  step it is plain DiLoCo's mean (to float rounding). Dense all-reduce only
  (no averager), not with `eager`.

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
    Kale, Douillard, Donchev. Eager Updates For Overlapped Communication and
    Computation in DiLoCo. 2025. https://arxiv.org/abs/2502.12996
  """
  _averaging.check_period(period)
  _averaging.check_averager(averager)
  outer = outer_optimizer or optax.sgd(0.7, momentum=0.9, nesterov=True)
  deferred = check_exchange(exchange, eager, averager, 'eager=True')
  if by_steps:
    if eager or averager is not None or deferred:
      raise ValueError(
        'diloco(by_steps=True) weights the pseudo-gradients by the steps taken in one dense '
        'all-reduce, inline: not with eager, exchange or an averager'
      )
    return _by_steps(outer, period, axis_name)
  if eager:
    if averager is not None:
      raise ValueError('diloco(eager=True) averages with one dense all-reduce; pass averager=None')
    return _eager(outer, period, axis_name, deferred)

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


def _by_steps(outer: optax.GradientTransformation, period: int, axis_name):
  """`diloco(by_steps=True)`'s transform (see `diloco`)."""

  def init_fn(params):
    fields = _averaging.init_sync(params, None)
    del fields['averager']  # one dense all-reduce, of the tree and its weight
    wire = (comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params) + COUNT_BYTES, 0),)
    taken = jnp.zeros([], jnp.int32)
    return StepsDiLoCoState(**fields | dict(outer_state=outer.init(params), wire=wire, taken=taken))

  def sync(params, updates, anchor, outer_state, wire, taken):
    pseudo = optax.tree.sub(anchor, optax.apply_updates(params, updates))  # a − w_n
    mean, sent = weighted_mean(pseudo, taken.astype(jnp.float32), axis_name)  # by h_n
    anchor, outer_state = outer_step(outer, mean, outer_state, anchor)
    return optax.tree.sub(anchor, params), anchor, outer_state, (comm.ran(sent, 1),)

  def skip(params, updates, anchor, outer_state, wire, taken):
    del params, taken
    return updates, anchor, outer_state, comm.silence(wire)

  def update_fn(updates, state, params=None, *, weight=None, **extra_args):
    del extra_args
    _checks.needs_params('diloco', params)
    if weight is None:
      raise ValueError(
        'diloco(by_steps=True) counts the steps each worker takes: call update(updates, state, '
        "params, weight=b) with the worker's examples this step (0: it sat the step out)"
      )
    taken = state.taken + (jnp.asarray(weight) > 0).astype(jnp.int32)
    due = comm.agree((state.count + 1) % period == 0, axis_name)
    args = (params, updates, state.anchor, state.outer_state, state.wire, taken)
    updates, anchor, outer_state, wire = lax.cond(due, sync, skip, *args)
    count, synced = _averaging.counted(state, due)
    taken = jnp.where(due, 0, taken)
    return updates, StepsDiLoCoState(count, synced, anchor, outer_state, wire, due, taken)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _eager(outer: optax.GradientTransformation, period: int, axis_name, deferred: bool):
  """`diloco(eager=True)`'s transform (see `diloco`)."""

  def init_fn(params):
    fields = _averaging.init_sync(params, None)
    del fields['averager']  # one dense all-reduce
    zeros = jax.tree.map(jnp.zeros_like, params)
    return EagerDiLoCoState(**fields | dict(
      outer_state=outer.init(params), wire=comm.overlapped(fields['wire']), pending=zeros,
      mine=zeros,
    ))  # fmt: skip

  def sync(params, updates, anchor, outer_state, wire, pending, mine):
    fresh = optax.tree.sub(anchor, optax.apply_updates(params, updates))  # Δ_m^r
    if deferred:  # `diloco_exchange`'s average, outside the step
      sent, wire = fresh, tuple(comm.ran(w, 1) for w in wire)
    else:
      sent, transfer = comm.pmean(fresh, axis_name)
      wire = comm.overlapped((comm.ran(transfer, 1),))
    n = comm.axis_size(axis_name)
    mixed = jax.tree.map(lambda avg, new, old: avg + (new - old) / n, pending, fresh, mine)
    anchor, outer_state = outer_step(outer, mixed, outer_state, anchor)
    return optax.tree.sub(anchor, params), anchor, outer_state, wire, sent, fresh

  def skip(params, updates, anchor, outer_state, wire, pending, mine):
    del params
    return updates, anchor, outer_state, comm.silence(wire), pending, mine

  def update_fn(updates, state, params=None):
    _checks.needs_params('diloco', params)
    due = comm.agree((state.count + 1) % period == 0, axis_name)
    args = (params, updates, state.anchor, state.outer_state, state.wire, state.pending, state.mine)
    updates, anchor, outer_state, wire, pending, mine = lax.cond(due, sync, skip, *args)
    count, synced = _averaging.counted(state, due)
    fields = (count, synced, anchor, outer_state, wire, pending, mine, due)
    return updates, EagerDiLoCoState(*fields)

  return optax.GradientTransformation(init_fn, update_fn)


def diloco_exchange(
  outer_optimizer: optax.GradientTransformation | None = None,
  period: int = 500,
  *,
  axis_name: comm.AxisName,
  averager: optax.GradientTransformation | None = None,
  eager: bool = True,
  exchange: str = 'deferred',
  by_steps: bool = False,
) -> DeferredExchange:
  """How to finish the steps of `diloco(..., eager=True, exchange='deferred')`.

  Pass the arguments the transform was made with. After each outer step
  (`sent`), `average` takes the mean over the workers of the pseudo-gradient
  the step left in `pending`; it is needed at the next outer step
  (`applied`, H steps later, which reads it): the exchange may run beside
  the H − 1 steps between.

  Args:
    outer_optimizer: as `diloco`'s.
    period: as `diloco`'s.
    axis_name: as `diloco`'s.
    averager: as `diloco`'s (None).
    eager: True.
    exchange: 'deferred'.
    by_steps: False (`diloco(by_steps=True)` averages inline).

  Returns:
    A `DeferredExchange`.
  """
  del outer_optimizer  # the outer step is the step's own
  _averaging.check_period(period)
  if by_steps:
    raise ValueError('diloco(by_steps=True) averages inline: no deferred exchange to finish')
  if not check_exchange(exchange, eager, averager, 'eager=True'):
    raise ValueError("diloco_exchange finishes exchange='deferred' steps; got 'inline'")
  outer_due = lambda count: 0 if (count + 1) % period == 0 else None
  average = lambda p, pending: comm.pmean(pending, axis_name)[0]
  return DeferredExchange(EagerDiLoCoState, outer_due, average, outer_due)


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
