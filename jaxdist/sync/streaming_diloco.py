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
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync import _averaging, _checks
from jaxdist.sync.diloco import outer_step

Layout = str | Callable[[Any], Any]
LAYOUTS = ('sequential', 'strided')


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

  References:
    Douillard et al. Streaming DiLoCo with overlapping communication: Towards
    a Distributed Free Lunch. 2025. https://arxiv.org/abs/2501.18512
    Douillard et al. DiLoCo: Distributed Low-Communication Training of
    Language Models. 2023. https://arxiv.org/abs/2311.08105
  """
  _averaging.check_period(period)
  _averaging.check_averager(averager)
  every = _check_schedule(period, fragments, delay, alpha)
  _check_layout(layout)
  outer = outer_optimizer or optax.sgd(0.7, momentum=0.9, nesterov=True)
  mean = _averaging.mean_fn(averager, axis_name)
  mark = comm.overlapped if delay >= 1 else lambda tree: tree

  def init_fn(params):
    cut = _Cut.of(params, fragments, layout)
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
    cut = _Cut.of(params, fragments, layout)
    count = state.count

    which = lambda offset: _due(count + offset, every, fragments, axis_name)

    # send: average the pseudo-gradient of the fragment due `delay` steps from now
    start, _, _ = which(1 + delay)
    base = optax.apply_updates(params, updates)  # the local model after this step
    pending = state.pending if delay else jax.tree.map(jnp.zeros_like, params)
    send = _sender(cut, mean, mark)

    def idle(base, anchor, pending, avg_states, wires):
      del base, anchor
      return pending, comm.silence(avg_states), comm.silence(wires)

    branches = [idle, *map(send, range(fragments))]
    args = (base, state.anchor, pending, state.averager, state.wire)
    pending, avg_states, wires = lax.switch(start, branches, *args)

    # apply: the outer step of the fragment whose average is here, and the blend
    apply, frag, due = which(1)
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
    just = cut.flags(due & (alpha == 0), frag)
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


def _due(step: jax.Array, every: int, fragments: int, axis_name: comm.AxisName):
  """(switch index: 0, or 1 + the fragment due; the fragment due; due) at inner step `step`."""
  due = step % every == 0
  frag = (step // every - 1) % fragments
  return comm.agree(jnp.where(due, frag + 1, 0), axis_name), frag, due


def _sender(cut: _Cut, mean, mark):
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


def _taker(cut: _Cut, outer: optax.GradientTransformation, alpha: float):
  """`take(p)`: the switch branch of fragment p's outer step and its blend with the local model."""

  def take(p):
    def branch(params, updates, anchor, outer_states, pending):
      part = cut.part(anchor, p)
      part, outer_p = outer_step(outer, cut.part(pending, p), outer_states[p], part)
      mine = cut.part(params, p)
      new = part
      if alpha:
        local = optax.apply_updates(mine, cut.part(updates, p))
        new = jax.tree.map(lambda a, w: (a + alpha * (w - a)).astype(a.dtype), part, local)
      updates = cut.merge(updates, optax.tree.sub(new, mine), p)
      return updates, cut.merge(anchor, part, p), _at(outer_states, p, outer_p)

    return branch

  return take


def fragment_labels(params: Any, fragments: int, layout: Layout = 'sequential') -> Any:
  """The fragment of every leaf of `params`: a tree of ints in [0, fragments).

  A fragment is made of whole units: the entries of the tree's top level
  (below any chain of single-entry containers, such as flax's `{'params':
  ...}`), so a transformer's `block_i`, `embed`, `ln_f` each go whole into
  one fragment, as the paper groups whole blocks. Where there are fewer units
  than fragments, every leaf is a unit. Units are ordered by name, numbers
  compared as numbers (`block_2` before `block_10`).

  - 'sequential': consecutive units, cut into `fragments` groups (none
    empty) so that the largest group's bytes, the peak a step sends, is as
    small as it can be.
  - 'strided': unit i goes to fragment i mod `fragments` (the paper's
    strided layout).
  - a function: `layout(params)` returns the fragment of each leaf, as a tree
    of ints with the structure of `params` or a prefix of it.

  Args:
    params: the parameters (shapes and dtypes are enough).
    fragments: P.
    layout: 'sequential', 'strided' or a function (above).

  Returns:
    A tree with the structure of `params`, an int per leaf.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxdist import sync
    >>> params = {f'block_{i}': jnp.zeros(4) for i in range(3)} | {'embed': jnp.zeros(2)}
    >>> sync.fragment_labels(params, 2)
    {'block_0': 0, 'block_1': 0, 'block_2': 1, 'embed': 1}
    >>> sync.fragment_labels(params, 2, 'strided')
    {'block_0': 0, 'block_1': 1, 'block_2': 0, 'embed': 1}
  """
  _check_layout(layout)
  cut = _Cut.of(params, fragments, layout)
  return jax.tree.unflatten(cut.treedef, list(cut.labels))


# --- cutting a tree into fragments ------------------------------------------------------------


def _check_layout(layout: Any) -> None:
  if not callable(layout) and layout not in LAYOUTS:
    raise ValueError(f'layout must be one of {LAYOUTS} or a function, got {layout!r}')


@dataclasses.dataclass(frozen=True)
class _Cut:
  """The fragment of every leaf (in flatten order) of trees with one structure."""

  treedef: Any
  labels: tuple[int, ...]

  @classmethod
  def of(cls, params: Any, fragments: int, layout: Layout) -> _Cut:
    leaves, treedef = jax.tree.flatten(params)
    if len(leaves) < fragments:
      raise ValueError(
        f'fragments must be <= the number of parameter arrays ({len(leaves)}), got {fragments}'
      )
    if callable(layout):
      labels = _called(layout, params, treedef)
    else:
      units = _units(params)
      if len(units) < fragments:
        units = [[i] for i in range(len(leaves))]
      sizes = [sum(leaves[i].size * jnp.dtype(leaves[i].dtype).itemsize for i in u) for u in units]
      of_unit = _sequential(sizes, fragments) if layout == 'sequential' else None
      labels = [0] * len(leaves)
      for k, unit in enumerate(units):
        for i in unit:
          labels[i] = of_unit[k] if of_unit else k % fragments
    empty = sorted(set(range(fragments)) - set(labels))
    if empty or any(not 0 <= x < fragments for x in labels):
      raise ValueError(
        f'every leaf needs a fragment in [0, {fragments}) and every fragment a leaf; '
        f'got labels {labels} (empty fragments: {empty})'
      )
    return cls(treedef, tuple(labels))

  def part(self, tree: Any, p: int) -> Any:
    """`tree` with the leaves of fragment p, `optax.MaskedNode` elsewhere."""
    leaves = self.treedef.flatten_up_to(tree)
    kept = [x if f == p else optax.MaskedNode() for x, f in zip(leaves, self.labels, strict=True)]
    return self.treedef.unflatten(kept)

  def merge(self, tree: Any, part: Any, p: int) -> Any:
    """`tree` with fragment p's leaves taken from `part` (as `self.part` made it)."""
    leaves = self.treedef.flatten_up_to(tree)
    new = iter(jax.tree.leaves(part))
    out = [next(new) if f == p else x for x, f in zip(leaves, self.labels, strict=True)]
    return self.treedef.unflatten(out)

  def flags(self, on: jax.Array, p: jax.Array | int) -> Any:
    """A boolean per leaf: `on` for fragment p's leaves, False elsewhere."""
    return self.treedef.unflatten([on & (p == f) for f in self.labels])


def _called(layout: Callable[[Any], Any], params: Any, treedef: Any) -> list[int]:
  """The labels `layout(params)` gives, broadcast from a prefix to every leaf."""
  given = layout(params)
  full = jax.tree.map(lambda f, sub: jax.tree.map(lambda _: f, sub), given, params)
  return [int(x) for x in treedef.flatten_up_to(full)]


def _units(params: Any) -> list[list[int]]:
  """Leaf indices of each unit (top-level entry below single-entry chains), in name order."""
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  depth = 0
  while all(len(p) > depth + 1 for p in paths) and len({p[depth] for p in paths}) == 1:
    depth += 1
  units: dict[str, list[int]] = {}
  for i, path in enumerate(paths):
    name = jax.tree_util.keystr((path[depth],)) if len(path) > depth else str(i)
    units.setdefault(name, []).append(i)
  return [units[name] for name in sorted(units, key=_natural)]


def _natural(name: str) -> list[Any]:
  """A sort key comparing the digits in `name` as numbers."""
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name)]


def _sequential(sizes: Sequence[int], fragments: int) -> list[int]:
  """Consecutive groups (none empty) with the smallest largest sum: the group of each size."""
  n = len(sizes)
  prefix = np.concatenate([[0], np.cumsum(sizes)])
  # best[k][i]: the smallest largest sum of the first i sizes in k groups; cut[k][i]: last start
  best = np.full((fragments + 1, n + 1), np.inf)
  cut = np.zeros((fragments + 1, n + 1), int)
  best[0][0] = 0
  for k in range(1, fragments + 1):
    for i in range(k, n + 1):
      for j in range(k - 1, i):
        worst = max(best[k - 1][j], prefix[i] - prefix[j])
        if worst < best[k][i]:
          best[k][i], cut[k][i] = worst, j
  groups, i = [0] * n, n
  for k in range(fragments, 0, -1):
    j = cut[k][i]
    groups[j:i] = [k - 1] * (i - j)
    i = j
  return groups


def _at(items: tuple, p: int, value: Any) -> tuple:
  """`items` with entry p replaced by `value`."""
  return tuple(value if i == p else x for i, x in enumerate(items))


def _waited(tree: Any) -> Any:
  """`tree` with its transfers' `overlap` marks cleared (as the averager made them)."""
  is_t = lambda x: isinstance(x, comm.Transfer)
  clear = lambda x: dataclasses.replace(x, overlap=False) if is_t(x) else x
  return jax.tree.map(clear, tree, is_leaf=is_t)
