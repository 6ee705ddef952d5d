"""The sparsifiers' scans: compaction of a mask into slots, bisection of bit patterns, row folds.

Positions come back as int32, with index n (one past the end) in the slots
nothing fills, the sparse payloads' padding (`jaxdist.compress.sparsify`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _compact(mask: jax.Array, k: int, offset: jax.Array | int = 0) -> tuple[jax.Array, jax.Array]:
  """(indices[k], valid[k]): `_compact_counted`'s positions, and which slots hold one."""
  idx, total = _compact_counted(mask, k, offset)
  return idx, jnp.arange(k) < total


def _prefix_sum(x: jax.Array, block: int = 32, bound: int | None = None) -> jax.Array:
  """Inclusive prefix sums of non-negative int32 counts along the last axis.

  `bound` is the most the sums can reach (default: the length, as for
  counts of 0 or 1). Blocks of `block` are summed by a matmul with a
  triangular matrix of ones and the blocks' totals by the same, recursively:
  exact in float32 while the bound is below 2^24 (else `lax.associative_scan`).
  On a 2-core CPU this runs as fast as `associative_scan` and compiles
  2-3x faster; jnp's `cumsum` (towers of reduce-windows) runs 2-3x slower.
  """
  *lead, n = x.shape
  bound = n if bound is None else bound
  if bound >= 1 << 24:
    return lax.associative_scan(jnp.add, x, axis=-1)
  width = min(n, block)
  blocks = -(-n // width)
  pad = [(0, 0)] * len(lead) + [(0, blocks * width - n)]
  x_MxB = jnp.pad(x.astype(jnp.float32), pad).reshape(*lead, blocks, width)
  ones_BxB = jnp.triu(jnp.ones((width, width), jnp.float32))
  inner_MxB = jnp.matmul(x_MxB, ones_BxB, precision=lax.Precision.HIGHEST)
  if blocks > 1:
    totals_M = inner_MxB[..., -1]
    before_M = _prefix_sum(totals_M.astype(jnp.int32), block, bound) - totals_M
    inner_MxB = inner_MxB + before_M[..., None]
  return inner_MxB.reshape(*lead, blocks * width)[..., :n].astype(jnp.int32)


def _compact_by_positions(mask: jax.Array, k: int, offset: jax.Array | int = 0):
  """`_compact_counted` for short masks: k binary searches over every position's prefix sum.

  Fewer operations than packing into words, which is what counts below
  `COMPACT_BY_WORDS_FROM` positions (eight CPU devices each compacting on two
  cores, 15K positions into 1.5K slots: 0.76 against 1.23 ms).
  """
  n = mask.size
  held_N = mask.astype(jnp.int32)
  upto_N = _prefix_sum(held_N)  # held positions up to and including each
  total = upto_N[-1]
  at_offset = upto_N[offset] - held_N[offset]  # held before offset
  slot_K = lax.iota(jnp.int32, k)
  rank_K = (at_offset + slot_K) % jnp.maximum(total, 1)
  idx = jnp.searchsorted(upto_N, rank_K + 1, side='left', method='scan').astype(jnp.int32)
  return jnp.where(slot_K < total, idx, n), total


COMPACT_BY_WORDS_FROM = 1 << 14  # masks longer than this are packed into 32-bit words


def _compact_counted(
  mask: jax.Array, k: int, offset: jax.Array | int = 0
) -> tuple[jax.Array, jax.Array]:
  """Up to k positions where `mask` holds, scanning from `offset` (cyclically).

  Returns (indices[k], how many positions hold); unfilled slots hold index n.
  Above `COMPACT_BY_WORDS_FROM` positions the mask is packed into 32-bit
  words and the words' population counts are prefix-summed; slot j takes the
  position of rank (held before offset + j) mod total. Its word is the first
  whose count reaches the rank, found by k binary searches over the n/32
  word counts, or, where n <= 16k (DGC's 2k bins), by one pass over the
  ranks (a histogram of the words' counts, prefix-summed); then the rank's
  bit within the word by 5 halving steps of population counts. On a 2-core
  CPU, against binary searches over every position's prefix sum
  (`_compact_by_positions`, used below): 10M positions, k = 100K: 12 against
  61 ms; 1M, 100K: 3.3 against 5.8 ms; DGC's 200K bins, 100K slots: 0.9
  against 2.6 ms; 151K, 1.5K: 0.29 against 0.81 ms. Scattering every
  position to its slot, and `jnp.nonzero`, cost more.
  """
  n = mask.size
  if n <= COMPACT_BY_WORDS_FROM:
    return _compact_by_positions(mask, k, offset)
  words = -(-n // 32)
  bits_WxB = jnp.pad(mask, (0, words * 32 - n)).reshape(words, 32).astype(jnp.uint32)
  word_W = jnp.sum(bits_WxB << lax.iota(jnp.uint32, 32), axis=1, dtype=jnp.uint32)
  count_W = lax.population_count(word_W).astype(jnp.int32)
  upto_W = _prefix_sum(count_W, bound=n)  # held positions up to and including each word
  before_W = upto_W - count_W
  total = upto_W[-1]
  at, bit = offset // 32, jnp.asarray(offset % 32, jnp.uint32)
  below_offset = word_W[at] & ((jnp.uint32(1) << bit) - 1)
  at_offset = before_W[at] + lax.population_count(below_offset).astype(jnp.int32)
  slot_K = lax.iota(jnp.int32, k)
  rank_K = (at_offset + slot_K) % jnp.maximum(total, 1)
  if n <= 16 * k:  # words whose count is at most each rank: a histogram over the ranks
    reached_R = jnp.zeros((n + 1,), jnp.int32).at[upto_W].add(1, mode='promise_in_bounds')
    word_K = _prefix_sum(reached_R)[rank_K]
  else:
    word_K = jnp.searchsorted(upto_W, rank_K + 1, side='left', method='scan')
  word_K = jnp.minimum(word_K.astype(jnp.int32), words - 1)  # (words: no position holds)
  left_K, bits_K = rank_K - before_W[word_K], word_W[word_K]
  pos_K = jnp.zeros_like(left_K)
  for half in (16, 8, 4, 2, 1):  # the (left_K + 1)-th set bit, from the lowest
    low = lax.population_count((bits_K >> pos_K.astype(jnp.uint32)) & ((1 << half) - 1))
    low = low.astype(jnp.int32)
    past = left_K >= low
    left_K = jnp.where(past, left_K - low, left_K)
    pos_K = jnp.where(past, pos_K + half, pos_K)
  return jnp.where(slot_K < total, word_K * 32 + pos_K, n), total


def _count_at_least(bits: jax.Array, t: jax.Array) -> jax.Array:
  """How many of `bits` are >= t; summed as floats (exact below 2^24, and faster on the CPU)."""
  held = bits >= t
  return jnp.sum(held, dtype=jnp.float32 if bits.size < 1 << 24 else jnp.int32)


def _kth_largest_bits(bits: jax.Array, k: int) -> jax.Array:
  """The largest t >= 0 with at least k of the int32 `bits` at or above it (needs k <= size).

  Built bit by bit from the top: 31 counting passes over `bits`, in a loop
  (unrolled, it compiled about 2x slower and ran slower on the CPU). For the bit
  patterns of non-negative floats (NaN above inf, as `lax.top_k` ranks it)
  this is the pattern of the k-th largest value; negative entries (padding)
  never count.
  """

  def bit(i, t):
    candidate = t | (jnp.int32(1) << (30 - i))
    return jnp.where(_count_at_least(bits, candidate) >= k, candidate, t)

  return lax.fori_loop(0, 31, bit, jnp.zeros_like(bits, shape=()))  # varying, as bits, in shard_map


def _kth_largest(a: jax.Array, k: int) -> jax.Array:
  """The k-th largest of the non-negative float32 values `a` (exactly `lax.top_k(a, k)[0][-1]`).

  Non-negative floats order as their int32 bit patterns (`_kth_largest_bits`):
  31 counting passes over `a`, a fraction of the cost of top_k's sort.
  """
  t = _kth_largest_bits(lax.bitcast_convert_type(a, jnp.int32), k)
  return lax.bitcast_convert_type(t, jnp.float32)


def _first_k_largest(bits: jax.Array, k: int) -> jax.Array:
  """positions[k]: `lax.top_k(bits, k)`'s set, ascending, for k <= #entries >= 0.

  Every entry above the k-th largest value t, and the first of those equal
  to t by position (top_k breaks ties towards the lower position) up to k.
  Where more entries tie at t than there is room for, the cut position is
  found by bisection of positions (about log2(n) counting passes; none
  where every tie fits, as with distinct values); then one compaction.
  """
  n = bits.size
  t = _kth_largest_bits(bits, k)
  above_N, tied_N = bits > t, bits == t
  room = k - jnp.sum(above_N, dtype=jnp.int32)
  pos_N = lax.iota(jnp.int32, n)

  def halve(lo_hi):  # the first cut with `room` ties before it lies in [lo, hi]
    lo, hi = lo_hi
    mid = (lo + hi) // 2
    enough = jnp.sum(tied_N & (pos_N < mid), dtype=jnp.int32) >= room
    return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

  every_tie_fits = jnp.sum(tied_N, dtype=jnp.int32) <= room
  start = (jnp.where(every_tie_fits, n, 0), jnp.full_like(room, n))
  cut, _ = lax.while_loop(lambda lo_hi: lo_hi[0] < lo_hi[1], halve, start)
  return _compact_counted(above_N | (tied_N & (pos_N < cut)), k)[0]


FOLD_CHAIN = 64  # rows folded in one unrolled chain of selects; more go through partial results


def _keep_larger(largest, label, value, value_label):
  """(largest, label) after offering `value`: a larger one wins, so ties keep the earlier offer."""
  wins = value > largest
  return jnp.where(wins, value, largest), jnp.where(wins, value_label, label)


def _fold_rows(v: jax.Array, width: int, of=lambda v: v) -> tuple[jax.Array, jax.Array]:
  """(largest[width], row[width]): `of` of v's rows of `width`, column by column, first on ties.

  Row r is v[r width : (r + 1) width]. Each row is a 1-D slice of v and the
  rows an unrolled chain of selects, which XLA fuses into one read of v (on
  XLA's CPU backend, a slice of v reshaped into rows was written out first,
  and so was `of` applied to all of v at once; chains much longer than
  `FOLD_CHAIN` compiled for seconds and ran slowly). Above `FOLD_CHAIN` rows,
  runs of c rows are folded as at most `FOLD_CHAIN` super-rows of c·width
  first, then the c rows of their result by a variadic reduce, ties to the
  smaller row (a chain of selects over slices of that result made XLA write
  out each step's mask, recomputing the first fold for each: a round trip
  of 14.8 passes at 10M floats, 0.1%, in a scratch run). Above
  `FOLD_CHAIN`^2 rows (thin rows: k below about n/2000), a loop folds runs
  of `FOLD_CHAIN` rows: a third level of super-rows made XLA recompute the
  second in every consumer (18 s for 4,097 rows of 20).
  """
  rows = v.size // width
  largest = jnp.full((width,), -1, v.dtype)
  row = jnp.zeros((width,), jnp.int32)
  done = 0
  if rows > FOLD_CHAIN**2:
    runs = rows // FOLD_CHAIN

    def run(i, carry):
      block = lax.dynamic_slice_in_dim(v, i * FOLD_CHAIN * width, FOLD_CHAIN * width)
      for r in range(FOLD_CHAIN):
        carry = _keep_larger(*carry, of(block[r * width : (r + 1) * width]), i * FOLD_CHAIN + r)
      return carry

    largest, row = lax.fori_loop(0, runs, run, (largest, row))
    done = runs * FOLD_CHAIN
  elif rows > FOLD_CHAIN:
    c = -(-rows // FOLD_CHAIN)
    span = c * width
    part = jnp.full((span,), -1, v.dtype)
    super_row = jnp.zeros((span,), jnp.int32)
    for s in range(rows // c):
      part, super_row = _keep_larger(part, super_row, of(v[s * span : (s + 1) * span]), s)
    part_row = super_row * c + jnp.repeat(lax.iota(jnp.int32, c), width)  # row s·c + i

    def larger(a, b):
      wins = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
      return jnp.where(wins, b[0], a[0]), jnp.where(wins, b[1], a[1])

    largest, row = lax.reduce(
      (part.reshape(c, width), part_row.reshape(c, width)),
      (jnp.asarray(-1, v.dtype), jnp.int32(0)),
      larger,
      (0,),
    )
    done = rows // c * c
  for r in range(done, rows):
    largest, row = _keep_larger(largest, row, of(v[r * width : (r + 1) * width]), r)
  return largest, row
