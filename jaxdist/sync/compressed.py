"""Compressed gradient aggregation: compressors + collectives + error feedback.

`compressed_allreduce` replaces each worker's gradient by the mean over
workers of the compressed gradients, with one of these collectives:

- `allgather`: every worker's payload is gathered (Top-k: values and int32
  indices; QSGD: its packed uint8 codes and norms), decoded and averaged.
- `allreduce`: payloads are summed on the wire. Summable compressors
  (identity, bf16/fp16 casts, scaled as below, shared-seed random-k) sum
  their payloads; sparsifiers use AR-compatible Top-k (Tyagi & Swany 2023):
  a leader's indices go to all (STAR: round-robin by step; VAR: the worker
  whose selected values have the largest norm), and every worker
  all-reduces its own values at those indices.
- `auto`: whichever of the above costs less under the α-β network model for
  the worker count and network profile, decided at trace time for each
  sparsity warm-up stage (each stage's ratio has its own cheapest).

Error feedback keeps, per worker, what the worker did not get across (its
input minus its own decoded contribution) and adds it to the next gradient.

Casts to a narrow float (bf16, fp16, fp8) scale each block of a vector first
(`cast(..., block_size=256)` elements; None: the whole vector) by a power of
two s that every worker shares: the largest that puts the block's max_n
‖w_n‖_∞ at the top of the format, with room on an all-reduce for a sum of N
payloads in the format itself (`_exchange._room`: N rounded up to a power of
two, times 2 for the additions' rounding). One all-reduce of an int8 exponent
per block agrees on the scales (1 byte per 256 elements by default); the
payload then crosses in the narrow format, and on an all-reduce is summed in
it (as PyTorch's fp16/bf16 hooks sum theirs, one rounding per addition). So no
sum overflows where every input was finite in the format, and a gradient is
not flushed to zero for being small in absolute terms, nor for sharing its
vector with large ones: what goes (to subnormal precision, then to zero) is
what lies about the format's span below its own block's largest element
(float16: 2^40, over the room's divisor on an all-reduce: 2^36 for 8 workers;
float8_e4m3fn 2^17.8, float8_e5m2 2^31.8); error feedback keeps it for later.
PyTorch's `fp16_compress_hook` divides by N before its float16 all-reduce
instead: no overflow either, but every element moves log2 N binades toward
the subnormals, so with 64 workers an element below 1.9e-6 is lost whatever
the others hold.

PowerSGD, whose two all-reduces sit between the steps of its power
iteration, is its own transform: `jaxdist.sync.powersgd`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from jaxdist import comm, netmodel
from jaxdist.compress.base import Compressor
from jaxdist.compress.lowrank import PowerSGD
from jaxdist.sync import _choice, _exchange
from jaxdist.sync.clip import local_clip  # noqa: F401  (public here too)

COLLECTIVES = ('allgather', 'allreduce', 'auto')
LEADERS = ('star', 'var')


class CompressedState(NamedTuple):
  """State of `compressed_allreduce`.

  Attributes:
    count: update calls so far. Replicated.
    key: PRNG key (raw uint32[2]) for stochastic compressors; folded with the
      step (and with the worker index unless the compressor shares its
      randomness). Replicated.
    residual: error-feedback memory, one float32 array per compressed group
      (() without error feedback). Per-worker.
    momentum: DGC momentum-correction buffer, like `residual` (() without).
      Per-worker.
    compressor_state: per compressor (warm-up stage), per group: e.g. the
      last random-k positions. Per-worker (equal on all workers where the
      compressor shares its randomness).
    wire: every collective this transform may issue; counts say which ran.
      Per-worker.
    norms: [2] float32, this step's ‖w_n‖² (the error-fed gradient) and
      ‖C(w_n)‖² (what the worker got across): the compression gain
      δ = ‖C(w)‖² / ‖w‖² of GraVAC and ADOPT is their ratio. Per-worker.
    gains: with `ratios`, [len(ratios)] float32: each candidate's gain
      ‖Top-k_r(w_n)‖² / ‖w_n‖² on this step's w_n, whichever was sent (one
      top-k at the largest ratio; the smaller ratios' are its prefix sums,
      GraVAC's multi-level compression). Exact Top-k's gain for any
      sparsifier. With `gains='sent'`, only the candidate that was sent
      has its gain (‖C(w_n)‖² / ‖w_n‖², no extra top-k), the others 0.
      Without `ratios`, [1]: the gain of what was sent. Per-worker.
  """

  PROBES = ('norms', 'gains')  # the train step's metrics (`jaxdist.probes`)

  count: jax.Array
  key: jax.Array
  residual: tuple
  momentum: tuple
  compressor_state: tuple
  wire: tuple
  norms: jax.Array
  gains: jax.Array


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Which leaves are compressed and how: static, from shapes alone."""

  compressed: tuple[int, ...]  # leaf indices
  dense: tuple[int, ...]
  groups: tuple[int, ...]  # lengths of the compressed vectors
  fused: bool


def _plan(tree, fused: bool, min_size: int) -> _Plan:
  leaves = jax.tree.leaves(tree)
  ok = lambda x: x.size >= max(min_size, 1)
  compressed = tuple(i for i, x in enumerate(leaves) if ok(x))
  dense = tuple(i for i, x in enumerate(leaves) if not ok(x))
  if fused:
    groups = (sum(leaves[i].size for i in compressed),) if compressed else ()
  else:
    groups = tuple(leaves[i].size for i in compressed)
  return _Plan(compressed, dense, groups, fused)


def compressed_allreduce(
  compressor: Compressor,
  *,
  axis_name: comm.AxisName,
  collective: str = 'allgather',
  error_feedback: bool = True,
  fused: bool = True,
  min_size: int = 0,
  leader: str = 'star',
  momentum_correction: float = 0.0,
  nesterov: bool = False,
  warmup_steps: int = 0,
  warmup_stages: int = 4,
  ratios: Sequence[float] = (),
  gains: str = 'all',
  network: str | netmodel.Network = '10gbps',
  algorithm: str = 'ring',
  seed: int = 0,
) -> optax.GradientTransformation:
  """Averages compressed gradients over `axis_name`, with error feedback.

  With C the compressor's round trip (decode ∘ encode) and e_n worker n's
  error memory, each step

    w_n = g_n + e_n;   sends C(w_n);   e_n <- w_n − C(w_n) = e_n + g_n − C(e_n + g_n);
    every worker gets (1/N) Σ_n C(w_n),

  so nothing is lost, only delayed (error feedback = False: e_n stays 0).
  With DGC's momentum correction, u_n <- m·u_n + g_n takes g_n's place and
  u_n is zeroed where values were sent. AR-Top-k sends every worker's values
  at the leader's indices: C_n(w) = w at the leader's top-k positions.

  Args:
    compressor: a `jaxdist.compress` compressor.
    axis_name: the worker axis (or tuple of axes).
    collective: 'allgather', 'allreduce' (AR-Top-k for sparsifiers; payload
      sums for summable compressors) or 'auto'. 'auto' takes the one the α-β
      model prices lower, for each warm-up stage's ratio on its own.
    error_feedback: keep what was not sent and add it to the next gradient.
    fused: compress the whole model as one flattened vector (as Tyagi &
      Swany do) rather than each tensor on its own.
    min_size: tensors with fewer elements (biases, norms) are all-reduced
      uncompressed.
    leader: AR-Top-k's leader: 'star' (round-robin by step) or 'var' (the
      worker whose selected values have the largest squared norm).
    momentum_correction: DGC's momentum correction m (0 = off): u <- m·u + g
      is what gets accumulated and sent, and u is zeroed where values were
      sent. Use plain SGD (no momentum) after this transform.
    nesterov: DGC's Nesterov variant of momentum correction.
    warmup_steps: DGC's sparsity warm-up (0 = off): for this many steps the
      ratio ramps exponentially to the compressor's, in `warmup_stages`
      stages (`jaxdist.compress.warmup_ratios`). Each stage is its own
      branch of a `lax.switch`, so only its collective runs.
    warmup_stages: stages of the warm-up.
    ratios: candidate kept fractions, compiled together for controllers that
      change the ratio while training (GraVAC, ADOPT): each is a branch of
      a `lax.switch`, and so is a dense all-reduce of the error-fed
      gradient (index `len(ratios)`, or any index out of range: everything
      is sent, the residual empties). Each step's index comes as optax's extra argument
      `candidate` (an int every worker is given equally, traced: changing
      it never recompiles); only that branch's collective runs, and the
      error-feedback memory carries across changes. The compressor's own
      ratio is then unused. Not with `warmup_steps`.
      With `collective='auto'` as well, every (ratio, collective) pair is
      its own branch, and the extra argument `via` (optional, traced)
      indexes the collectives ('allgather', 'allreduce' for sparsifiers;
      'allreduce', 'allgather' for summable payloads) for controllers that
      choose the collective per step too (ADOPT); without it each ratio
      takes the one the α-β model prices lower.
    gains: with `ratios`, 'all' (every candidate's exact Top-k gain each
      step: GraVAC compares two, ScaDLES's rule needs it while sending
      dense) or 'sent' (only the sent candidate's, from the norms: ADOPT,
      which measures the candidate it runs, skips the extra top-k).
    network: profile (or `netmodel.Network`) that 'auto' prices against.
    algorithm: all-reduce algorithm that 'auto' assumes ('ring', 'tree', 'ps').
    seed: seed of the transform's PRNG key.

  Returns:
    An `optax.GradientTransformation`; put it before the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import compress, runtime, sync, testing
    >>> avg = sync.compressed_allreduce(compress.topk(ratio=0.5), axis_name=runtime.AXES)
    >>> run = testing.Run(optax.chain(avg, optax.sgd(1.0)), {'x': jnp.zeros(2)}, workers=2)
    >>> run({'x': jnp.array([[1.0, 0.5], [0.25, 3.0]])})['x']  # each sends its largest entry
    Array([[-0.5, -1.5],
           [-0.5, -1.5]], dtype=float32)
    >>> run.state[0].residual[0]  # e_n: what each worker kept back for the next step
    Array([[0.  , 0.5 ],
           [0.25, 0.  ]], dtype=float32)

  References:
    Karimireddy, Rebjock, Stich, Jaggi. Error Feedback Fixes SignSGD and other
    Gradient Compression Schemes. ICML 2019. https://arxiv.org/abs/1901.09847
    Stich, Cordonnier, Jaggi. Sparsified SGD with Memory. NeurIPS 2018.
    https://arxiv.org/abs/1809.07599
    Lin, Han, Mao, Wang, Dally. Deep Gradient Compression. ICLR 2018
    (momentum correction, warm-up). https://arxiv.org/abs/1712.01887
    Tyagi & Swany. Flexible Communication for Optimal Distributed Learning
    over Unpredictable Networks. IEEE BigData 2023 (AR-Top-k, α-β choice;
    no link was verified for it).
  """
  _check(compressor, collective, leader, min_size, momentum_correction, error_feedback)
  if gains not in ('all', 'sent'):
    raise ValueError(f"gains must be 'all' or 'sent', got {gains!r}")
  choice = _compose(compressor, collective, warmup_steps, warmup_stages, ratios, network, algorithm)
  layout = lambda tree: _layout(tree, choice, fused, min_size, leader)

  def init_fn(params):
    plan, wire, dense = layout(params)
    zeros = tuple(jnp.zeros((n,), jnp.float32) for n in plan.groups)
    return CompressedState(
      count=jnp.zeros([], jnp.int32),
      key=jax.random.PRNGKey(seed),
      residual=zeros if error_feedback else (),
      momentum=zeros if momentum_correction else (),
      compressor_state=tuple(tuple(c.init(n) for n in plan.groups) for c in choice.stages),
      wire=tuple(t for ts in wire for t in ts) + tuple(dense),
      norms=jnp.zeros([2], jnp.float32),
      gains=jnp.zeros([len(ratios) or 1], jnp.float32),  # orbax saves no empty arrays
    )

  def update_fn(updates, state, params=None, *, candidate=None, via=None, **extra_args):
    del params, extra_args
    _check_extra(bool(ratios), collective, candidate, via)
    plan, wire, dense = layout(updates)
    n = comm.axis_size(axis_name)
    leaves, treedef = jax.tree.flatten(updates)
    grads, ungroup = _groups(leaves, plan)
    wanted, momentum = _accumulate(grads, state, momentum_correction, nesterov, error_feedback)
    key = jax.random.fold_in(state.key, state.count)
    run = functools.partial(
      _exchange.run, step_key=key, axis_name=axis_name, n=n, leader=leader, count=state.count
    )
    extra, operands = {'candidate': candidate, 'via': via}, (wanted, state.compressor_state)
    mean, rest, sent_sq, mask, cstate, counts = _choice.switch(
      choice, wire, n, state.count, extra, axis_name, run, operands
    )
    norms = (
      jnp.stack([sum(jnp.sum(x * x) for x in wanted), sent_sq])
      if wanted
      else (jnp.zeros([2], jnp.float32))
    )
    if momentum_correction:
      momentum = tuple(jnp.where(m, 0.0, u) for m, u in zip(mask, momentum, strict=True))
    out, transfers = _outputs(leaves, plan, ungroup(mean), wire, counts, dense, axis_name)
    count = optax.safe_increment(state.count)
    norms_32 = norms.astype(jnp.float32)
    if not ratios:
      step_gains = _sent_gain(norms)
    elif gains == 'all':
      step_gains = _gains(wanted, choice.stages, norms[0])
    else:
      step_gains = _sent_gain(norms) * (jnp.arange(len(ratios)) == candidate)
    residual = rest if error_feedback else ()
    new_state = CompressedState(
      count, state.key, residual, momentum, cstate, tuple(transfers), norms_32, step_gains
    )
    return jax.tree.unflatten(treedef, out), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _check(compressor, collective, leader, min_size, momentum_correction, error_feedback) -> None:
  """compressed_allreduce's argument checks (those that need no other state)."""
  if isinstance(compressor, PowerSGD):
    raise ValueError(
      'compressed_allreduce does not take PowerSGD, whose all-reduces sit inside its power '
      'iteration: use jd.sync.powersgd(rank=..., axis_name=...)'
    )
  if not isinstance(compressor, Compressor):
    raise ValueError(f'compressor must be a jaxdist.compress compressor, got {compressor!r}')
  if collective not in COLLECTIVES:
    raise ValueError(f'collective must be one of {COLLECTIVES}, got {collective!r}')
  if collective != 'auto' and collective not in _exchange.collectives(compressor):
    raise ValueError(
      f"{compressor.name} payloads cannot be summed on the wire: use collective='allgather' "
      f'(possible: {_exchange.collectives(compressor)})'
    )
  if leader not in LEADERS:
    raise ValueError(f'leader must be one of {LEADERS}, got {leader!r}')
  if min_size < 0:
    raise ValueError(f'min_size must be >= 0, got {min_size}')
  if not 0 <= momentum_correction < 1:
    raise ValueError(f'momentum_correction must be in [0, 1), got {momentum_correction}')
  if momentum_correction and not (error_feedback and getattr(compressor, 'sparse', False)):
    raise ValueError('momentum_correction needs a sparsifier and error_feedback=True (as in DGC)')


def _compose(compressor, collective, warmup_steps, warmup_stages, ratios, network, algorithm):
  """The `_choice.Choice` of the arguments (checked): candidates or warm-up, and the collective."""
  if algorithm not in netmodel.ALGORITHMS:
    raise ValueError(f'algorithm must be one of {netmodel.ALGORITHMS}, got {algorithm!r}')
  net = netmodel.profile(network) if isinstance(network, str) else network
  choice = _choice.warmup(compressor, warmup_steps, warmup_stages)  # `fixed` without steps
  if ratios:
    if warmup_steps:
      raise ValueError('ratios and warmup_steps both choose the ratio per step: give one')
    choice = _choice.candidates(compressor, ratios)
  options = _exchange.collectives(compressor) if collective == 'auto' else (collective,)
  return _choice.per_collective(choice, options, net, algorithm)


def _layout(tree, choice: _choice.Choice, fused: bool, min_size: int, leader: str):
  """(plan, [each exchange's transfers, in `_choice.exchanges` order], [the dense all-reduce])."""
  plan = _plan(tree, fused, min_size)
  for n in plan.groups:
    for c in choice.stages:
      c.check(n)
  wire = [_exchange.transfers(ex, plan.groups, leader) for ex in _choice.exchanges(choice)]
  dense_bytes = comm.tree_nbytes([jax.tree.leaves(tree)[i] for i in plan.dense])
  dense = [comm.transfer(comm.ALL_REDUCE, dense_bytes, 0)] if plan.dense else []
  return plan, wire, dense


def _check_extra(ratios: bool, collective: str, candidate, via) -> None:
  """The extra arguments' misuse: `candidate` exactly with ratios, `via` only with 'auto' too."""
  if ratios != (candidate is not None):
    raise ValueError(
      'compressed_allreduce with ratios needs the extra argument candidate= (an index into '
      'ratios, or len(ratios) for dense), and without ratios takes none'
    )
  if via is not None and not (ratios and collective == 'auto'):
    raise ValueError(
      "compressed_allreduce takes the extra argument via= (the collective's index) only "
      "with ratios and collective='auto'"
    )


def _accumulate(grads, state: CompressedState, momentum_correction, nesterov, error_feedback):
  """What this worker wants to get across (gradient (+ momentum) + memory), and the momentum."""
  momentum = state.momentum
  if momentum_correction:
    if nesterov:
      momentum = tuple((u + g) * momentum_correction for u, g in zip(momentum, grads, strict=True))
      grads = tuple(u + g for u, g in zip(momentum, grads, strict=True))
    else:
      momentum = tuple(momentum_correction * u + g for u, g in zip(momentum, grads, strict=True))
      grads = momentum
  if error_feedback:
    return tuple(g + r for g, r in zip(grads, state.residual, strict=True)), momentum
  return grads, momentum


def _gains(wanted, stages, total_sq) -> jax.Array:
  """[candidates] ‖Top-k_r(w)‖² / ‖w‖², from one top-k per group at the largest k."""
  kept = jnp.zeros([len(stages)], jnp.float32)
  for w in wanted:
    ks = [c.kept(w.size) for c in stages]
    top = jnp.cumsum(lax.top_k(w * w, max(ks))[0])
    kept = kept + jnp.stack([top[k - 1] for k in ks])
  return jnp.where(total_sq > 0, kept / jnp.maximum(total_sq, 1e-30), 1.0)


def _sent_gain(norms: jax.Array) -> jax.Array:
  """[1] ‖C(w)‖² / ‖w‖² of what was sent (1 for w = 0)."""
  return jnp.where(norms[0] > 0, norms[1] / jnp.maximum(norms[0], 1e-30), 1.0)[None]


def _groups(leaves, plan: _Plan):
  """The float32 vectors to compress, and the function that turns them back into leaves."""
  compressed = [leaves[i].astype(jnp.float32) for i in plan.compressed]
  if not compressed:
    return (), lambda vecs: []
  if plan.fused:
    flat, unravel = ravel_pytree(compressed)
    return (flat,), lambda vecs: unravel(vecs[0])
  return (
    tuple(x.reshape(-1) for x in compressed),
    lambda vecs: [v.reshape(x.shape) for v, x in zip(vecs, compressed, strict=True)],
  )


def _outputs(leaves, plan: _Plan, means, wire, counts, dense, axis_name):
  """The updates' leaves (the groups' means, the small leaves' pmean) and the step's transfers."""
  out = list(leaves)
  for i, x in zip(plan.compressed, means, strict=True):
    out[i] = x.astype(leaves[i].dtype)
  transfers = [comm.ran(t, counts[i]) for i, t in enumerate(t for ts in wire for t in ts)]
  if plan.dense:
    dense_mean, dense_t = comm.pmean([leaves[i] for i in plan.dense], axis_name)
    assert dense_t.nbytes == dense[0].nbytes
    for i, x in zip(plan.dense, dense_mean, strict=True):
      out[i] = x
    transfers.append(dense_t)
  return out, transfers
