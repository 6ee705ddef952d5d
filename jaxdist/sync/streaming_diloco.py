"""Streaming DiLoCo: DiLoCo's outer step, one fragment of the model at a time, overlapped.

The model is cut into P fragments (`fragment_labels`); each is synchronised
every H inner steps, fragment p at the steps t with t + 1 ≡ (p + 1)·H/P
(mod H), so some fragment synchronises every H/P steps and a step sends at
most one fragment. A fragment's outer step is DiLoCo's on its leaves alone
(its own slice of the anchor and its own outer optimizer state); its averaged
pseudo-gradient may arrive τ inner steps after it was taken, and the worker
then blends its local fragment with the new anchor.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync import _averaging, _checks
from jaxdist.sync._fragments import Cut, Layout, check_layout
from jaxdist.sync.deferred import DeferredExchange, check_exchange
from jaxdist.sync.diloco import outer_step


class StreamingDiLoCoState(NamedTuple):
  """State of `streaming_diloco`.

  Attributes:
    count: inner steps so far. Replicated.
    synced: fragment outer steps so far (one per fragment synchronised). Replicated.
    anchor: the outer (global) parameters, each fragment as of its last outer
      step. Replicated.
    outer_state: the outer optimizer's state, one per fragment (over that
      fragment's leaves; `optax.MaskedNode` elsewhere). Replicated.
    averager: the averager's state, one per fragment (() without one). Per-worker.
    wire: one dense all-reduce per fragment, of its bytes (() with an
      averager); marked `overlap` when delay >= 1. Per-worker.
    pending: the averaged pseudo-gradient in flight, held from the step that
      sends it to the step that applies it (the fragment's leaves; the others
      are what the last fragment left or zeros), with delay >= 1 (() with
      delay 0: applied in the step that sends it). Replicated.
    just_synced: per leaf, whether the last update gave that leaf the anchor
      (its fragment's outer step, with alpha = 0). Replicated.
  """

  SYNCED_MODEL = ('anchor', 'just_synced')  # what `jd.sync.apply_updates` puts in

  count: jax.Array
  synced: jax.Array
  anchor: Any
  outer_state: tuple
  averager: tuple
  wire: tuple
  pending: Any
  just_synced: Any


def streaming_diloco(
  outer_optimizer: optax.GradientTransformation | None = None,
  period: int = 500,
  *,
  axis_name: comm.AxisName,
  fragments: int = 1,
  delay: int = 0,
  alpha: float = 0.0,
  layout: Layout = 'sequential',
  averager: optax.GradientTransformation | None = None,
  exchange: str = 'inline',
) -> optax.GradientTransformation:
  """Streaming DiLoCo: DiLoCo's outer step on one fragment at a time, overlapped, blended.

  The parameters are cut into `fragments` = P fragments (`fragment_labels`).
  Fragment p takes DiLoCo's outer step every `period` = H inner steps, at the
  steps t (counted from 0) with t + 1 ≡ (p + 1)·H/P (mod H): fragment 0
  after H/P steps, fragment 1 after 2H/P, and so on, so one fragment
  synchronises every H/P steps and no step sends more than one. At fragment
  p's outer step, at step t:

    Δ_p = (1/N) Σ_n (a_p − w_{n,p}),   w taken τ = `delay` steps before
    a_p ← outer step of a_p on Δ_p     (its own outer optimizer state)
    w_{n,p} ← a_p + α·(w_{n,p} − a_p)  (w_{n,p}: the local value now, after step t)

  with a the anchor (outer parameters), w_n worker n's parameters and α =
  `alpha` the weight kept on the local value (torchft's `lerp`). The
  pseudo-gradient is taken after the inner step of step t − τ, and averaged
  there (one collective of the fragment's bytes, in a `lax.switch` over the
  fragments, so a step sends only the fragment due); with τ = 0 the average
  is applied at once (DiLoCo), with τ ≥ 1 it waits in the state (`pending`)
  and is applied τ steps later: the collective's result feeds only the
  state that step returns, never its update, so the exchange may run behind
  the next τ steps' compute. Its transfers are then marked `overlap` for the
  network model, which charges what outlasts one step's compute (for τ ≥ 2,
  which has τ steps to hide it, an upper bound). The inner optimizer (before
  this transform in the chain) keeps its state. Put it last in the chain.

  One fragment, τ = 0 and α = 0 is `diloco`. With α = 0 every worker holds
  the fragment's anchor after its outer step, bitwise with
  `jd.sync.apply_updates` (its `just_synced` is a flag per leaf).

  Readings taken where the paper (whose body we could not read) is silent:
  the schedule, τ < H/P, α's convention and the anchor of the pseudo-gradient
  are torchft's (`_StreamingDiLoCoFragment`); fragments are cut as
  `fragment_labels` says; each fragment has its own outer optimizer state
  (the same as one shared state for elementwise outer optimizers such as
  Nesterov SGD, whose count-free state is per parameter); the outer
  gradients are full precision unless `averager` quantises them (the
  paper's FP4 is an averager's business).

  Args:
    outer_optimizer: optax optimizer of the anchor (default Nesterov SGD,
      lr 0.7, momentum 0.9).
    period: inner steps H between two outer steps of the same fragment; a
      multiple of `fragments`.
    axis_name: the worker axis (or tuple of axes).
    fragments: P, how many fragments (1 <= P <= H, P divides H).
    delay: τ, inner steps between taking a fragment's pseudo-gradient and
      applying its average (0 <= τ < H/P; 0 is blocking).
    alpha: α in [0, 1), the weight on the local value when the fragment's
      new anchor arrives (0: take the anchor; 0.5 averages).
    layout: how leaves are cut into fragments: 'sequential', 'strided', or a
      function of the parameters returning a tree (or prefix) of fragment
      indices (`fragment_labels`).
    averager: a transform that averages a fragment's pseudo-gradient over
      `axis_name` (e.g. a quantised all-reduce), one state per fragment; None
      is one dense all-reduce of the fragment.
    exchange: 'inline' (the step averages and applies, above) or 'deferred'
      (delay >= 1, no averager): the step keeps the fragment's own
      pseudo-gradient in `pending` and applies nothing; `streaming_exchange`'s
      programs average it and apply it, outside the step (below).

  Returns:
    An `optax.GradientTransformation`; put it after the inner optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> outer = optax.sgd(1.0)  # lr 1, no momentum: the new anchor is the plain average
    >>> tx = optax.chain(
    ...   optax.sgd(1.0), sync.streaming_diloco(outer, 2, axis_name=runtime.AXES, fragments=2)
    ... )
    >>> run = testing.Run(tx, {'a': jnp.zeros(()), 'b': jnp.zeros(())}, workers=2)
    >>> g = jnp.array([-1.0, -3.0])
    >>> run({'a': g, 'b': g})  # fragment 0 ('a') is averaged after step 0
    {'a': Array([2., 2.], dtype=float32), 'b': Array([1., 3.], dtype=float32)}
    >>> run({'a': g, 'b': g})  # fragment 1 ('b') after step 1
    {'a': Array([3., 5.], dtype=float32), 'b': Array([4., 4.], dtype=float32)}

  With `exchange='deferred'` the step sends nothing: the fragment's bytes
  are recorded in `wire` as sent (the same records as inline) but its
  pseudo-gradient stays in `pending` unaveraged, and the step due to apply
  an average leaves its fragment at the local value (no outer step, no
  blend). `streaming_exchange` gives the two programs that finish the job:
  `average` of the sent fragment, which the caller may run on its own thread
  beside the next τ steps, and `merge` after the step due to apply it, the
  outer step and blend the inline step would have done. Run so, the models
  are the inline run's to float32 rounding: the outer step is the same
  arithmetic in another program, which XLA may round otherwise (bitwise in
  the tests, with α = 0; 3e-7 of the final loss apart on the 2-host GPT of
  `configs/variants/overlap_lm.py`), and with α > 0 the blend is taken as the
  new value, not as params + (new − params).
  `jd.train` does this with `config.sync.streaming_diloco.exchange`.

  References:
    Douillard et al. Streaming DiLoCo with overlapping communication: Towards
    a Distributed Free Lunch. 2025. https://arxiv.org/abs/2501.18512
    Douillard et al. DiLoCo: Distributed Low-Communication Training of
    Language Models. 2023. https://arxiv.org/abs/2311.08105
  """
  _averaging.check_period(period)
  _averaging.check_averager(averager)
  every = _check_schedule(period, fragments, delay, alpha)
  deferred = _deferred(exchange, delay, averager)
  check_layout(layout)
  outer = outer_optimizer or optax.sgd(0.7, momentum=0.9, nesterov=True)
  mean = _averaging.mean_fn(averager, axis_name)
  mark = comm.overlapped if delay >= 1 else lambda tree: tree

  def init_fn(params):
    cut = Cut.of(params, fragments, layout)
    parts = [cut.part(params, p) for p in range(fragments)]
    with_averager = averager is not None
    return StreamingDiLoCoState(
      count=jnp.zeros([], jnp.int32),
      synced=jnp.zeros([], jnp.int32),
      anchor=params,
      outer_state=tuple(outer.init(x) for x in parts),
      averager=mark(tuple(averager.init(x) for x in parts)) if with_averager else (),
      wire=() if with_averager else mark(tuple(_averaging.dense_wire(x, None) for x in parts)),
      pending=jax.tree.map(jnp.zeros_like, params) if delay else (),
      just_synced=cut.flags(jnp.zeros([], jnp.bool_), -1),
    )

  def update_fn(updates, state, params=None):
    _checks.needs_params('streaming_diloco', params)
    cut = Cut.of(params, fragments, layout)
    count = state.count

    which = lambda offset: _due(count + offset, every, fragments, axis_name)

    # send: average the pseudo-gradient of the fragment due `delay` steps from now
    start, _, _ = which(1 + delay)
    base = optax.apply_updates(params, updates)  # the local model after this step
    pending = state.pending if delay else jax.tree.map(jnp.zeros_like, params)
    send = _holder(cut, mark) if deferred else _sender(cut, mean, mark)

    def idle(base, anchor, pending, avg_states, wires):
      del base, anchor
      return pending, comm.silence(avg_states), comm.silence(wires)

    branches = [idle, *map(send, range(fragments))]
    args = (base, state.anchor, pending, state.averager, state.wire)
    pending, avg_states, wires = lax.switch(start, branches, *args)

    # apply: the outer step of the fragment whose average is here, and the blend
    apply, frag, due = which(1)
    apply, due_here = apply * (not deferred), due & (not deferred)  # deferred: `merge` applies
    take = _taker(cut, outer, alpha)

    def keep(params, updates, anchor, outer_states, pending):
      del params, pending
      return updates, anchor, outer_states

    # with delay >= 1 no step both sends and applies (delay < period/fragments): the average
    # applied is the one in the state, and this step's collective feeds only the state returned
    arrived = state.pending if delay else pending
    branches = [keep, *map(take, range(fragments))]
    args = (params, updates, state.anchor, state.outer_state, arrived)
    updates, anchor, outer_states = lax.switch(apply, branches, *args)
    count, synced = _averaging.counted(state, due)
    just = cut.flags(due_here & (alpha == 0), frag)
    pending = pending if delay else ()
    fields = (count, synced, anchor, outer_states, avg_states, wires, pending, just)
    return updates, StreamingDiLoCoState(*fields)

  return optax.GradientTransformation(init_fn, update_fn)


def _check_schedule(period: int, fragments: int, delay: int, alpha: float) -> int:
  """Checks the schedule's arguments; returns H/P, the steps between two outer steps."""
  _checks.check('fragments', fragments, lambda p: p >= 1, '>= 1')
  every = period // fragments
  if _checks.concrete(period):  # (optax.inject_hyperparams passes it traced to update)
    _checks.check('fragments', fragments, lambda p: p <= period, f'in [1, period={period}]')
    _checks.check('period', period, lambda h: h % fragments == 0, f'a multiple of {fragments=}')
    _checks.check('delay', delay, lambda d: 0 <= d < every, f'in [0, period/fragments={every})')
  _checks.check(
    'alpha', alpha, lambda a: 0 <= a < 1, 'in [0, 1) (alpha = 1 keeps the local model forever)'
  )
  return every


def _schedule(step, every: int, fragments: int):
  """(the fragment due at inner step `step`, whether one is): traced arrays or Python ints."""
  return (step // every - 1) % fragments, step % every == 0


def _due(step: jax.Array, every: int, fragments: int, axis_name: comm.AxisName):
  """(switch index: 0, or 1 + the fragment due; the fragment due; due) at inner step `step`."""
  frag, due = _schedule(step, every, fragments)
  return comm.agree(jnp.where(due, frag + 1, 0), axis_name), frag, due


def _deferred(exchange: str, delay: int, averager: Any) -> bool:
  """`check_exchange` for Streaming DiLoCo: deferred needs delay >= 1."""
  return check_exchange(exchange, _checks.concrete(delay) and delay >= 1, averager, 'delay >= 1')


def _sender(cut: Cut, mean, mark):
  """`send(p)`: the switch branch that averages fragment p's pseudo-gradient into `pending`."""

  def send(p):
    def branch(base, anchor, pending, avg_states, wires):
      pseudo = optax.tree.sub(cut.part(anchor, p), cut.part(base, p))
      avg = _waited(avg_states[p]) if avg_states else ()
      wire = wires[p] if wires else ()
      pseudo, avg, wire = mean(pseudo, avg, wire)
      avg_states = _at(comm.silence(avg_states), p, mark(avg)) if avg_states else ()
      wires = _at(comm.silence(wires), p, mark(wire)) if wires else ()
      return cut.merge(pending, pseudo, p), avg_states, wires

    return branch

  return send


def _holder(cut: Cut, mark):
  """`hold(p)`: the deferred switch branch: fragment p's own pseudo-gradient into `pending`.

  Its all-reduce is recorded as sent (the inline branch's record): the
  caller runs it, as `streaming_exchange`'s `average`.
  """

  def hold(p):
    def branch(base, anchor, pending, avg_states, wires):
      pseudo = optax.tree.sub(cut.part(anchor, p), cut.part(base, p))
      sent = mark(tuple(comm.ran(w, 1) for w in wires[p]))
      return cut.merge(pending, pseudo, p), avg_states, _at(comm.silence(wires), p, sent)

    return branch

  return hold


def _outer(cut: Cut, outer: optax.GradientTransformation, alpha: float, p: int):
  """Fragment p's outer step and blend: (local, anchor, outer states, pending) -> (new, ...).

  `local` is fragment p of the worker's model after this step's inner update;
  `new` its value after the blend (the new anchor's fragment with α = 0).
  """

  def step(local, anchor, outer_states, pending):
    part, outer_p = outer_step(outer, cut.part(pending, p), outer_states[p], cut.part(anchor, p))
    new = part
    if alpha:
      new = jax.tree.map(lambda a, w: (a + alpha * (w - a)).astype(a.dtype), part, local)
    return new, cut.merge(anchor, part, p), _at(outer_states, p, outer_p)

  return step


def _taker(cut: Cut, outer: optax.GradientTransformation, alpha: float):
  """`take(p)`: the switch branch of fragment p's outer step and its blend with the local model."""

  def take(p):
    def branch(params, updates, anchor, outer_states, pending):
      mine = cut.part(params, p)
      local = optax.apply_updates(mine, cut.part(updates, p)) if alpha else mine
      new, anchor, outer_states = _outer(cut, outer, alpha, p)(local, anchor, outer_states, pending)
      return cut.merge(updates, optax.tree.sub(new, mine), p), anchor, outer_states

    return branch

  return take


def streaming_exchange(
  outer_optimizer: optax.GradientTransformation | None = None,
  period: int = 500,
  *,
  axis_name: comm.AxisName,
  fragments: int = 1,
  delay: int = 1,
  alpha: float = 0.0,
  layout: Layout = 'sequential',
  averager: optax.GradientTransformation | None = None,
  exchange: str = 'deferred',
) -> DeferredExchange:
  """How to finish the steps of `streaming_diloco(..., exchange='deferred')`.

  Pass the arguments the transform was made with (`exchange` must be
  'deferred'). After the step that takes fragment p's pseudo-gradient
  (`sent` gives p), `average` takes its mean over the workers; after the
  step due to apply it, τ steps later (`applied`), `merge` takes fragment
  p's outer step and blend, which the inline step takes inside itself: the
  exchange may run beside those τ steps.

  Args:
    outer_optimizer: as `streaming_diloco`'s.
    period: as `streaming_diloco`'s.
    axis_name: as `streaming_diloco`'s.
    fragments: as `streaming_diloco`'s.
    delay: as `streaming_diloco`'s (>= 1).
    alpha: as `streaming_diloco`'s.
    layout: as `streaming_diloco`'s.
    averager: as `streaming_diloco`'s (None).
    exchange: 'deferred'.

  Returns:
    A `DeferredExchange`.
  """
  _averaging.check_averager(averager)
  every = _check_schedule(period, fragments, delay, alpha)
  if not _deferred(exchange, delay, averager):
    raise ValueError("streaming_exchange finishes exchange='deferred' steps; got 'inline'")
  check_layout(layout)
  outer = outer_optimizer or optax.sgd(0.7, momentum=0.9, nesterov=True)

  def average(p, pending):
    cut = Cut.of(pending, fragments, layout)
    mean, _ = comm.pmean(cut.part(pending, p), axis_name)
    return cut.merge(pending, mean, p)

  def merge(p, params, state):
    cut = Cut.of(params, fragments, layout)
    step = _outer(cut, outer, alpha, p)
    new, anchor, outer_states = step(cut.part(params, p), state.anchor, state.outer_state,
                                     state.pending)  # fmt: skip
    just = cut.flags(jnp.asarray(alpha == 0), p)
    state = state._replace(anchor=anchor, outer_state=outer_states, just_synced=just)
    return cut.merge(params, new, p), state

  def due(steps):  # the fragment whose schedule comes round after `steps` steps (None: none)
    frag, is_due = _schedule(steps, every, fragments)
    return frag if is_due else None

  sent = lambda count: due(count + 1 + delay)
  applied = lambda count: due(count + 1)
  return DeferredExchange(
    StreamingDiLoCoState, sent, average, applied, merge, tuple(range(fragments))
  )


def _at(items: tuple, p: int, value: Any) -> tuple:
  """`items` with entry p replaced by `value`."""
  return tuple(value if i == p else x for i, x in enumerate(items))


def _waited(tree: Any) -> Any:
  """`tree` with its transfers' `overlap` marks cleared (as the averager made them)."""
  is_t = lambda x: isinstance(x, comm.Transfer)
  clear = lambda x: dataclasses.replace(x, overlap=False) if is_t(x) else x
  return jax.tree.map(clear, tree, is_leaf=is_t)
