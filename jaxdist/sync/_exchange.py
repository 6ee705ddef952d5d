"""One exchange of `compressed_allreduce`: a compressor's payloads over one collective.

An `Exchange` is a compressor and the collective its payloads cross with, or
the dense all-reduce of the error-fed groups (compressor None). `transfers`
lists what it puts on the wire (the transform's ledger, count 0 until it
runs); `run` performs it on the float32 groups every worker wants to get
across and returns the mean over workers with what each kept back.

The collectives (see `jaxdist.sync.compressed`): `allgather` gathers every
worker's payload, decodes and averages; `allreduce` sums summable payloads on
the wire, and for sparsifiers is AR-compatible Top-k (the leader's indices,
every worker's values at them). A narrow float cast first scales each vector
by a power of two all workers share (`_shared_scales`, `_room`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxdist import comm
from jaxdist.compress.base import Compressor
from jaxdist.compress.sparsify import scatter, take


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
  scale = []  # a narrow float cast's shared scales: a float32 maximum per group, all-reduced first
  if c.narrow_dtype is not None and groups:
    scale = [zero(comm.ALL_REDUCE, 4 * len(groups))]
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
  scales = _shared_scales(c, wanted, collective, axis_name, n) if narrow else None
  inputs = wanted if scales is None else [w * s for w, s in zip(wanted, scales, strict=True)]
  encoded = [c.encode(w, s, k) for w, s, k in zip(inputs, cstates, keys, strict=True)]
  payloads = tuple(p for p, _ in encoded)
  new_states = tuple(s for _, s in encoded)

  if not c.sparse:
    unscale = (lambda x, g: x) if scales is None else (lambda x, g: x / scales[g])
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


def _shared_scales(c: Compressor, wanted, collective: str, axis_name, n: int) -> jax.Array:
  """[groups] float32: per group, the power of two s every worker multiplies by before a cast.

  s is the largest power of two with s · max_n ‖w_n‖_∞ ≤ `_room`; the maximum
  over workers is one all-reduce of a float32 per group. Non-finite elements
  are left out of the maximum (they stay what they are); s is 1 for a group
  of zeros, and in [2^-126, 2^126] (both normal floats) otherwise. Found from
  the exponents (`frexp`), so no quotient overflows (bfloat16's range is
  float32's).
  """
  amax_G = jnp.stack([jnp.max(jnp.where(jnp.isfinite(w), jnp.abs(w), 0.0)) for w in wanted])
  amax_G, _ = comm.pmax(amax_G, axis_name)
  room_mantissa, room_exponent = math.frexp(_room(c.narrow_dtype, collective, n))  # m·2^e
  mantissa_G, exponent_G = jnp.frexp(amax_G)
  exponent_G = room_exponent - exponent_G - (mantissa_G > room_mantissa).astype(jnp.int32)
  s_G = jnp.ldexp(jnp.float32(1.0), jnp.clip(exponent_G, -126, 126))
  return jnp.where(amax_G > 0, s_G, 1.0)


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
