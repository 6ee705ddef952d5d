"""One exchange of `compressed_allreduce`: a compressor's payloads over one collective.

An `Exchange` is a compressor and the collective its payloads cross with, or
the dense all-reduce of the error-fed groups (compressor None). `transfers`
lists what it puts on the wire (the transform's ledger, count 0 until it
runs); `run` performs it on the float32 groups every worker wants to get
across and returns the mean over workers with what each kept back.

The collectives (see `jaxdist.sync.compressed`): `allgather` gathers every
worker's payload, decodes and averages; `allreduce` sums summable payloads on
the wire, and for sparsifiers is AR-compatible Top-k (the leader's indices,
every worker's values at them). A narrow float cast first scales each block
of a vector (`Compressor.scale_block` elements) by a power of two all workers
share, agreed by an all-reduce of one int8 exponent per block
(`_shared_exponents`, `_room`).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxdist import comm
from jaxdist.compress.base import Compressor, buckets
from jaxdist.compress.sparsify import scatter, take

_NO_BOUND = 127  # a block of zeros' exponent before the all-reduce: any scale would do


class Exchange(NamedTuple):
  """A compressor and its collective; compressor None: the dense all-reduce."""

  compressor: Compressor | None
  collective: str


DENSE = Exchange(None, 'dense')


def collectives(c: Compressor) -> tuple[str, ...]:
  """The collectives `c`'s payloads can cross with, in the order 'auto' offers them."""
  if c.sparse:
    return ('allgather', 'allreduce')
  if c.summable:
    return ('allreduce', 'allgather')
  return ('allgather',)


def transfers(ex: Exchange, groups: tuple[int, ...], leader: str) -> list[comm.Transfer]:
  """The collectives `ex` issues for vectors of sizes `groups` (count 0)."""
  zero = lambda kind, nbytes, op=None: comm.transfer(kind, nbytes, 0, op)
  c = ex.compressor
  if c is None:
    return [zero(comm.ALL_REDUCE, 4 * sum(groups))]
  wire = sum(c.wire_bytes(n) for n in groups)
  scale = []  # a narrow float cast's shared scales: an int8 exponent per block, all-reduced first
  if c.narrow_dtype is not None and groups:
    scale = [zero(comm.ALL_REDUCE, sum(_num_blocks(m, c.scale_block) for m in groups))]
  if ex.collective == 'allgather':
    return [*scale, zero(comm.ALL_GATHER, wire)]
  if not c.sparse:
    return [*scale, zero(comm.ALL_REDUCE, wire)]
  k_total = sum(c.kept(n) for n in groups)
  out = [zero(comm.ALL_GATHER, 4)] if leader == 'var' else []
  return [*out, zero(comm.ALL_REDUCE, 4 * k_total, 'broadcast'), zero(comm.ALL_REDUCE, 4 * k_total)]


def run(ex: Exchange, wanted, cstates, step_key, *, axis_name, n: int, leader: str, count):
  """(mean over workers, kept back, Σ‖sent‖², sent mask, new compressor states) per group.

  `wanted`: this worker's float32 groups; `cstates`: the compressor's state
  per group (passed through by the dense all-reduce); `step_key`: the
  step's PRNG key, folded per group (and per worker unless the compressor
  shares its randomness); `count`: the step (STAR's round-robin leader).
  The mask (sparsifiers and the dense all-reduce; else None) marks what was
  sent.
  """
  c = ex.compressor
  if c is None:
    mean, _ = comm.pmean(wanted, axis_name)
    rest, sent_sq = _kept_back(wanted, wanted)
    mask = tuple(jnp.ones(w.shape, bool) for w in wanted)
    return mean, rest, sent_sq, mask, cstates
  keys = [_key(c, step_key, j, axis_name) for j in range(len(wanted))]
  mean, (rest, sent_sq), mask, cstates = _compressed(
    c, ex.collective, wanted, cstates, keys, axis_name, n, leader, count
  )
  return mean, rest, sent_sq, mask, cstates


def _key(c, step_key, group: int, axis_name):
  key = jax.random.fold_in(step_key, group)
  if c.stochastic and not c.shared_randomness:
    key = jax.random.fold_in(key, comm.axis_index(axis_name))
  return key


def _compressed(c, collective, wanted, cstates, keys, axis_name, n, leader, count):
  """Per group: (mean over workers, (kept back, ‖sent‖²), sent mask, new compressor states)."""
  sizes = [w.size for w in wanted]
  narrow = c.narrow_dtype is not None and wanted  # a cast, of at least one vector
  exponents = _shared_exponents(c, wanted, collective, axis_name, n) if narrow else None
  scaled = lambda x, g, sign: _times_power_of_two(x, sign * exponents[g], c.scale_block)
  inputs = wanted if exponents is None else [scaled(w, g, 1) for g, w in enumerate(wanted)]
  encoded = [c.encode(w, s, k) for w, s, k in zip(inputs, cstates, keys, strict=True)]
  payloads = tuple(p for p, _ in encoded)
  new_states = tuple(s for _, s in encoded)

  if not c.sparse:
    unscale = (lambda x, g: x) if exponents is None else (lambda x, g: scaled(x, g, -1))
    per_group = lambda decode, arrays: tuple(
      unscale(decode(arrays[g], new_states[g], sizes[g]), g) for g in range(len(sizes))
    )
    local = per_group(c.decode, payloads)
    if collective == 'allgather':
      gathered, _ = comm.all_gather(payloads, axis_name)
      mean = per_group(lambda p, s, m: _mean_decoded(c, p, s, m), gathered)
    else:  # summable payloads, summed in their own dtype
      summed, _ = comm.psum(payloads, axis_name)
      mean = per_group(lambda p, s, m: c.decode(p, s, m) / n, summed)
    return mean, _kept_back(wanted, local), None, new_states

  if collective == 'allgather':
    gathered, _ = comm.all_gather(payloads, axis_name)
    mean = tuple(
      scatter(vals.reshape(-1), idx.reshape(-1), m) / n
      for (vals, idx), m in zip(gathered, sizes, strict=True)
    )
    sent = payloads
  else:  # AR-compatible Top-k: the leader's indices, everybody's own values there.
    me = comm.axis_index(axis_name)
    if leader == 'star':
      lead = count % n
    else:
      norm = sum(jnp.sum(p[0] ** 2) for p in payloads)
      norms, _ = comm.all_gather(norm, axis_name)
      lead = jnp.argmax(norms)
    indices, _ = comm.psum(tuple(jnp.where(me == lead, p[1], 0) for p in payloads), axis_name)
    own = tuple(take(w, idx) for w, idx in zip(wanted, indices, strict=True))
    sums, _ = comm.psum(own, axis_name)
    mean = tuple(scatter(v, idx, m) / n for v, idx, m in zip(sums, indices, sizes, strict=True))
    sent = tuple(zip(own, indices, strict=True))
  mask = tuple(scatter(jnp.ones_like(v), i, m) > 0 for (v, i), m in zip(sent, sizes, strict=True))
  return mean, _kept_back_sparse(wanted, sent), mask, new_states


def _shared_exponents(c: Compressor, wanted, collective: str, axis_name, n: int) -> list[jax.Array]:
  """Per group, [blocks] int32: e of the power of two 2^e every worker scales a block by.

  A block is `c.scale_block` elements of the vector (the last one shorter;
  None: the whole vector). e is the largest with 2^e · max_n ‖block_n‖_∞ ≤
  `_room`, in [-126, 126] (2^e and 2^-e normal floats), and 0 for a block of
  zeros. Non-finite elements are left out of the maximum (they stay what
  they are). Each worker finds the largest e for its own blocks, from the
  exponents of their maxima (`frexp`, so no quotient overflows: bfloat16's
  range is float32's); the bound decreases as the maximum grows, so the
  smallest of the workers' is the one for the largest maximum: one
  all-reduce of an int8 per block (the maximum of −e; 127, "no bound", for
  a block of zeros).
  """
  room_mantissa, room_exponent = math.frexp(_room(c.narrow_dtype, collective, n))  # m·2^e
  mine = []
  for w in wanted:
    amax_K = jnp.max(buckets(jnp.where(jnp.isfinite(w), jnp.abs(w), 0.0), c.scale_block), axis=1)
    mantissa_K, exponent_K = jnp.frexp(amax_K)
    e_K = room_exponent - exponent_K - (mantissa_K > room_mantissa).astype(jnp.int32)
    mine.append(jnp.where(amax_K > 0, jnp.clip(e_K, -126, 126), _NO_BOUND))
  minus_e, _ = comm.pmax(-jnp.concatenate(mine).astype(jnp.int8), axis_name)
  e = -minus_e.astype(jnp.int32)
  e = jnp.where(e == _NO_BOUND, 0, e)
  ends = itertools.accumulate(x.size for x in mine)
  return [e[end - x.size : end] for x, end in zip(mine, ends, strict=True)]


def _num_blocks(size: int, block: int | None) -> int:
  """Blocks of `block` elements in a vector of `size` (`buckets`): one if `block` is None."""
  return 1 if block is None else -(-size // block)


def _times_power_of_two(x_N: jax.Array, e_K: jax.Array, block: int | None) -> jax.Array:
  """x · 2^e, with e_K per block of `block` elements of x (None: one block); e in [-126, 126].

  2^e is written as float32 bits (biased exponent e + 127, mantissa 0): `jnp.ldexp`'s
  arithmetic, fused into the element loop, would run once per element.
  """
  s_K = lax.bitcast_convert_type((e_K + 127) << 23, jnp.float32)
  if block is None or block >= x_N.size:
    return x_N * s_K
  s_N = jnp.broadcast_to(s_K[:, None], (s_K.size, block)).reshape(-1)[: x_N.size]
  return x_N * s_N


def _room(dtype, collective: str, n: int) -> float:
  """The largest magnitude a scaled element may have before it is cast to `dtype`.

  N payloads are summed in `dtype` on an all-reduce's wire, in float32 after
  an all-gather. Their sum, each addition rounded, in any order, is at most
  (1 + u)^(N-1) times the sum of their magnitudes (u: the unit roundoff of
  the format they are summed in), so it stays finite when each is at most
  that format's largest value divided by N' (N rounded up to a power of two)
  and by 2^k ≥ (1 + u)^(N-1): k = 1 up to 1,420 workers for float16, 178 for
  bfloat16, millions for float32. The room is that bound on the wire (the
  format's largest value over a power of two: representable), and for a
  gather the smaller of the format's largest value and the largest power of
  two within the bound (only bfloat16, float32's range, comes near it):
  representable either way, so an element at most the room rounds to at most
  the room.
  """
  top = float(jnp.finfo(dtype).max)
  if n == 1:
    return top
  on_wire = collective == 'allreduce'
  summed_in = jnp.finfo(dtype if on_wire else jnp.float32)
  k = math.ceil((n - 1) * math.log2(1 + float(summed_in.eps) / 2))
  bound = float(summed_in.max) / 2 ** (math.ceil(math.log2(n)) + k)
  return bound if on_wire else min(top, 2.0 ** math.floor(math.log2(bound)))


def _kept_back(wanted, local) -> tuple[tuple[jax.Array, ...], jax.Array]:
  """(w − C(w) per group, Σ‖C(w)‖²) from the decoded contributions C(w)."""
  rest = tuple(w - lo for w, lo in zip(wanted, local, strict=True))
  return rest, sum((jnp.sum(lo * lo) for lo in local), jnp.float32(0))


def _kept_back_sparse(wanted, payloads) -> tuple[tuple[jax.Array, ...], jax.Array]:
  """`_kept_back` for (values, indices) payloads, without decoding them densely.

  A sparse payload's indices are distinct (padding slots point past the end
  and are dropped), so w − scatter(v, i) is w with v subtracted at i (equal
  floats, up to the sign of a NaN or of a zero: 0 + (−0) is +0) and ‖C(w)‖²
  is Σ v² (another order of summation): one scatter into w and a sum over k
  values instead of a dense decode, a subtraction and a sum over n.
  """
  rest = tuple(w.at[i].add(-v, mode='drop') for w, (v, i) in zip(wanted, payloads, strict=True))
  return rest, sum((jnp.sum(v * v) for v, _ in payloads), jnp.float32(0))


def _mean_decoded(c: Compressor, gathered, state, size: int) -> jax.Array:
  """Mean of the decoded rows of `gathered` (one payload per worker), one row at a time.

  On the CPU not `mean(vmap(decode)(gathered))`: that materialises all N decoded rows, and
  XLA's CPU backend sums a few long rows far slower than N element-wise adds (QSGD 8-bit, 8
  workers' payloads of 10M floats, one CPU device: 659 ms against 61 ms). On a GPU the
  vmapped mean is the faster (an H100's step with QSGD at 1M parameters: 1.15 ms against
  1.47 ms row by row, `bench_step.py`'s compressor table).
  """
  rows = jax.tree.leaves(gathered)[0].shape[0]
  if jax.default_backend() != 'cpu':
    return jnp.mean(jax.vmap(lambda p: c.decode(p, state, size))(gathered), axis=0)
  first, rest = jax.tree.map(lambda a: a[0], gathered), jax.tree.map(lambda a: a[1:], gathered)
  add = lambda total, p: (total + c.decode(p, state, size), None)
  total, _ = lax.scan(add, c.decode(first, state, size), rest)
  return total / rows
