"""Sparsifiers: keep k of n elements, send (values, int32 indices).

Payloads have a fixed size k; where a method finds fewer than k elements, the
unused slots carry value 0 at index n (one past the end), which `scatter`
drops and `take` reads as 0, so padding never touches a real element.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdist.compress.base import Compressor, Payload, check_ratio, num_kept


def scatter(values: jax.Array, indices: jax.Array, n: int) -> jax.Array:
  """The dense vector of length n with `values` added at `indices` (index n: dropped)."""
  return jnp.zeros((n,), values.dtype).at[indices].add(values, mode='drop')


def take(x: jax.Array, indices: jax.Array) -> jax.Array:
  """x at `indices`; 0 where an index is n (a padding slot)."""
  return x.at[indices].get(mode='fill', fill_value=0)


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


def _strided_first_largest(x: jax.Array, bins: int) -> tuple[jax.Array, jax.Array]:
  """(largest[bins], row[bins]): each strided bin's largest |x| and the first row holding it.

  Bin j holds x[j], x[j + bins], x[j + 2 bins], ...: row r is x[r bins :
  (r + 1) bins], and the last row may be short. One read of x, vectorised
  across bins (`_fold_rows`). NaN never ranks as a largest; a bin with
  nothing else reads largest -1.
  """
  n = x.size
  full, tail = divmod(n, bins)
  largest, row = _fold_rows(x[: full * bins] if tail else x, bins, jnp.abs)
  if tail:
    last = jnp.pad(jnp.abs(x[full * bins :]), (0, bins - tail), constant_values=-1)
    largest, row = _keep_larger(largest, row, last, full)
  return largest, row


def _dividing_width(n: int, width: int) -> int:
  """The width within [2/3, 3/2] of `width` nearest to it that divides n, else `width`.

  Every width gives top_k's positions; one that divides n spares the
  padding, which on XLA's CPU backend made `top_k_bisect` about twice as
  slow (1M + 3 floats: 4.3 against 2.3 ms at 1M).
  """
  near = [d for d in range(max(1, -(-2 * width // 3)), 3 * width // 2 + 1) if n % d == 0]
  return min(near, key=lambda d: (abs(d - width), d)) if near else width


def top_k_bisect(a: jax.Array, k: int, width: int | None = None) -> jax.Array:
  """The positions of `lax.top_k(a, k)` for floats a >= +0.0 of at most 32 bits, ascending; no sort.

  a is cut into bins of `width` elements (default about sqrt(n/k), moved to
  a width that divides n where one is near: `_dividing_width`). The
  answer lies in the k bins with the largest maxima (ties to the lower bin):
  a bin left out has its maximum at most the k-th largest bin maximum, which
  is at most the k-th largest element, and each of the k chosen bins holds an
  element at least as large that comes first or is larger. So the k-th
  largest bin maximum is found by bisection of bit patterns (31 counting
  passes over n/width maxima), the chosen bins' k·width elements are
  gathered, and the same selection runs over them. Ties and NaN (ranked
  first, as top_k does) give top_k's positions; only their order differs
  (ascending here, by value there), which no decode sees. (-0.0 would rank
  below every other value: pass |x|, as `TopK` does.)

  Cost (a 2-core CPU, 151K floats, k = 1%, eight devices each
  selecting): 3.0 ms against 5.0 ms for `lax.top_k`; at 10M floats on one
  device far less than top_k, which sorts. Needs n >= 2k (else use top_k).
  Tried there and slower or no faster: widths 4-40 against the default 10,
  a third level (bins of bin maxima), 2-5 bits per counting pass, and
  compaction by scattering each held position to its slot. Where the width
  does not divide n, x is padded (1M + 3 floats: 4.3 against 2.3 ms at 1M);
  windows of x instead of padded rows (as DGC's contiguous bins read them
  until 2026-11-24) were slower here (5.8 ms), and so was a strided
  reduce_window for the maxima (4.7 ms). At 151K
  floats on one device (0.58 ms) the two bisections are about half the time,
  and each pass over 15K bin maxima costs what XLA's CPU runtime spends per
  kernel (about 4 us an iteration, 6 kernels), not the counting. Tried there
  and slower: a regula falsi search of the cut, with bisection where it
  stalls (16 passes instead of 31 in a NumPy model, 0.75 against 0.69 ms:
  more kernels per pass), the loop unrolled 2, 4 or 31 times, integer
  counts, XLA's small-while-loop hoisting (the YNN reduction in the loop
  blocks it; with YNN off, 1.08 ms), compaction by scattering each held
  position to its slot, and `lax.top_k` over the elements above a sampled
  threshold (about 2 ms).
  """
  n = a.size
  if width is None:
    width = _dividing_width(n, max(1, round(float(np.sqrt(n / k)))))
  width = max(1, min(width, n // k))  # at least k bins
  bins = -(-n // width)
  bits = lax.bitcast_convert_type(a.astype(jnp.float32), jnp.int32)  # exact from 16 bits
  bits_BxW = jnp.pad(bits, (0, bins * width - n), constant_values=-1).reshape(bins, width)
  chosen_K = _first_k_largest(jnp.max(bits_BxW, axis=1), k)
  rows_KxW = bits_BxW.at[chosen_K].get(mode='promise_in_bounds')
  picked_K = _first_k_largest(rows_KxW.reshape(-1), k)
  return chosen_K[picked_K // width] * width + picked_K % width


def _top_k_candidates(a: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k(a, k)` for non-negative floats a, from the elements above a threshold.

  See `_candidates`; where they do not hold the answer, top_k over all of a,
  in a `while_loop` that runs its body at most once (a `cond` would run both
  branches under `vmap`). `TopK(selection='candidates')`'s way.
  """

  def whole(_):
    return jnp.bool_(True), *lax.top_k(a, k)

  values, idx, found = _candidates(a, k)
  _, values, idx = lax.while_loop(lambda c: ~c[0], whole, (found, values, idx))
  return values, idx


def _candidates(a: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(values, positions, found): `lax.top_k(a, k)` from a candidate set where `found`.

  A threshold t is read off an evenly spaced sample of a (16,384 elements) where about
  2k elements of a should lie at or above it. If between k and 4k do (NaN
  counts as above, as top_k ranks it first), the positions of those
  candidates are compacted in order (`_compact_counted`) and top_k runs over the 4k
  candidate slots instead of all n: the k-th largest value is at least t, so
  every element of the answer is a candidate; candidates keep their order,
  so ties break towards the lower position as in top_k, and the answer is the
  same arrays. Otherwise (a sample that misled, many ties at t) `found` is
  false and the arrays are not the answer.

  Exact whatever the sample where found; the sample only decides how often
  it is not. Costs about three passes over a (sample and sort, compare,
  compaction) plus top_k over 4k elements.
  """
  n = a.size
  cap = 4 * k
  s = min(n, 16384)
  sample = a[np.arange(s, dtype=np.int64) * n // s]  # evenly spaced over all of a
  rank = min(s, -(-2 * k * s // n) + 1)
  t = jnp.sort(sample)[s - rank]
  where, count = _compact_counted(~(a < t), cap)  # a >= t, or NaN
  values, picked = lax.top_k(a.at[where].get(mode='fill', fill_value=-1), k)
  return values, where[picked], (count >= k) & (count <= cap)


def _gather(x: jax.Array, idx: jax.Array, valid: jax.Array) -> Payload:
  idx = jnp.where(valid, idx, x.size).astype(jnp.int32)
  return take(x, idx), idx


@dataclasses.dataclass(frozen=True)
class _Sparsifier(Compressor):
  """Base of the (values, indices) compressors; `k` fixed from `ratio` or given."""

  ratio: float | None = None
  k: int | None = None
  sparse: ClassVar[bool] = True

  def __post_init__(self):
    if (self.ratio is None) == (self.k is None):
      raise ValueError(
        f'{self.name}: give exactly one of ratio and k, got ratio={self.ratio}, k={self.k}'
      )
    if self.ratio is not None:
      check_ratio(self.ratio)
    if self.k is not None and self.k < 1:
      raise ValueError(f'{self.name}: k must be >= 1, got {self.k}')

  def kept(self, n: int) -> int:
    return self.k if self.k is not None else num_kept(n, self.ratio)

  def check(self, n: int) -> None:
    if self.k is not None and self.k > n:
      raise ValueError(f'{self.name}: k={self.k} is larger than the tensor ({n} elements)')

  def decode(self, payload: Payload, state, n: int) -> jax.Array:
    del state
    values, indices = payload
    return scatter(values, indices, n)


SELECTIONS = ('auto', 'top_k', 'bisect', 'candidates')
BISECT_FROM = 1 << 18  # TopK(selection='auto') bisects vectors this long and longer on the CPU


@dataclasses.dataclass(frozen=True)
class TopK(_Sparsifier):
  """Exact Top-k by magnitude: the k largest |x|, ties to the lower position (as `lax.top_k`).

  `selection` is how the k positions are found; every way sends the same
  elements, and only the order of the payload's slots differs:
  - `'top_k'`: `lax.top_k` (slots by value, largest first).
  - `'bisect'`: `top_k_bisect`, bins and bisection of bit patterns, no sort
    (slots by position). On a 2-core CPU, eight devices each
    selecting 1% of 151K floats: 3.0 against 5.0 ms; on one device, 2.5
    against 9.8 ms at 1M floats and 30 against 180 ms at 10M, where top_k
    sorts (`experiments/bench_compress.py` prints the rows side by side).
  - `'candidates'`: elements above a threshold read off an evenly spaced
    sample, then `lax.top_k` over 4k of them, falling back to the whole
    vector where the sample misled (`_top_k_candidates`; slots by value).
    Slower than top_k in the digits CNN's step on the CPU (its compaction
    over all n); meant for accelerators whose TopK sorts the whole
    vector when k is large, not yet timed on one.
  - `'auto'` (default): `'bisect'` on the CPU from `BISECT_FROM` elements,
    `'top_k'` below and on other backends. Bisect compiles in ~0.7 s against
    top_k's 0.08 s (one call, 151K floats), which a few hundred steps repay
    at 1M floats but only about a thousand at the digits CNN's 151K, and a
    run with ratio candidates compiles one selection per candidate. An
    H100's top_k was 2.5x-9x a memory pass at 1M-10M floats; bisect has not
    been timed there.
  Where n < 2k, or for float64, `'bisect'` is `lax.top_k`.
  """

  selection: str = 'auto'
  name: ClassVar[str] = 'topk'

  def __post_init__(self):
    super().__post_init__()
    if self.selection not in SELECTIONS:
      raise ValueError(f'topk: selection must be one of {SELECTIONS}, got {self.selection!r}')

  def encode(self, x, state, key):
    del key
    n, k = x.size, self.kept(x.size)
    way = self.selection
    if way == 'auto':
      way = 'bisect' if jax.default_backend() == 'cpu' and n >= BISECT_FROM else 'top_k'
    if way == 'bisect' and n >= 2 * k and jnp.finfo(x.dtype).bits <= 32:
      idx = top_k_bisect(jnp.abs(x), k)
    else:
      _, idx = (_top_k_candidates if way == 'candidates' else lax.top_k)(jnp.abs(x), k)
    return (x[idx], idx.astype(jnp.int32)), state


@dataclasses.dataclass(frozen=True)
class MSTopK(_Sparsifier):
  """Multi-sampling approximate Top-k: a magnitude threshold found by binary search.

  Follows the MSTopK re-implementation used as a baseline by Tyagi & Swany
  (ADOPT, 2023; `sahiltyagi4/ARTopk`): `rounds` bisection steps of a threshold
  between mean(|x|) and max(|x|); the k1 <= k elements above the best lower
  threshold are certain, and k - k1 more come as one contiguous run (from a
  random start) of the candidates between the two thresholds. Each round is a
  pass over x, so this is exact-count search, not a fast kernel.

  Reference: Shi et al., Towards Scalable Distributed Training of Deep
  Learning on Public Cloud Clusters, MLSys 2021. https://arxiv.org/abs/2010.10458
  (the paper's own code was not found; see ALGORITHMS.md §7).
  """

  rounds: int = 25
  name: ClassVar[str] = 'mstopk'
  stochastic: ClassVar[bool] = True

  def encode(self, x, state, key):
    n, k = x.size, self.kept(x.size)
    a = jnp.abs(x)
    mean, top = jnp.mean(a), jnp.max(a)

    def bisect(_, carry):
      lo, hi, k1, t1, k2, t2 = carry
      mid = lo + (hi - lo) / 2
      thres = mean + mid * (top - mean)
      nnz = jnp.sum(a >= thres)
      few = nnz <= k
      return (
        jnp.where(few, lo, mid),
        jnp.where(few, mid, hi),
        jnp.where(few & (nnz > k1), nnz, k1),
        jnp.where(few & (nnz > k1), thres, t1),
        jnp.where(~few & (nnz < k2), nnz, k2),
        jnp.where(~few & (nnz < k2), thres, t2),
      )

    init = (0.0, 1.0, jnp.int32(0), top + 1.0, jnp.int32(n), jnp.float32(0.0))
    _, _, k1, t1, _, t2 = lax.fori_loop(0, self.rounds, bisect, init)
    certain, certain_ok = _compact(a >= t1, k)
    offset = jax.random.randint(key, (), 0, n)
    extra, extra_ok = _compact((a >= t2) & (a < t1), k, offset)
    slot = jnp.arange(k)
    from_extra = slot >= k1
    idx = jnp.where(from_extra, extra[jnp.clip(slot - k1, 0, k - 1)], certain)
    valid = jnp.where(from_extra, extra_ok[jnp.clip(slot - k1, 0, k - 1)], certain_ok)
    return _gather(x, idx, valid), state


@dataclasses.dataclass(frozen=True)
class DGC(_Sparsifier):
  """Top-k approximated with a threshold estimated from a random sample (DGC).

  The threshold is the k·s/n-th largest |x| of a random sample of s = n ·
  `sample_ratio` elements, drawn with replacement and clipped to
  [`min_sample`, `max_sample`] (DGC samples 1% with no upper bound; the
  bound keeps the sample's top-k cheap at 10M+ elements, and 16k samples
  still see ~160 elements above a 1% threshold).

  Departure from DGC, for a fixed-shape payload at near memory speed:
  instead of compacting every element above the threshold (and re-sampling
  when the count is off), x is cut into B = `bins_per_k`·k strided bins (bin
  j holds x[j], x[j + B], x[j + 2B], ...), and each bin offers only its
  largest |x| (the first, on ties); the first k bins (from a random start)
  whose largest passes the threshold are sent. Elements that lose to a
  larger one in their bin stay in the error-feedback residual.

  Why strided: large gradient elements come in runs (a layer's bias, the
  last layer's weights), and a run inside one bin offers one element. Until
  2026-11-24 the bins were contiguous runs of n/B elements. On the gradients
  of the digits CNN and of ResNet-20 (synthetic CIFAR shapes), at 0, 50 and
  200 steps and ratios 1% and 0.1%, contiguous bins filled 4-37% of the k
  slots (ResNet-20: 4-7%) and kept 10-45% of exact Top-k's energy; strided
  bins fill 61-89% and keep 68-98% (`experiments/bench_compress.py`'s
  gradients table, in the README). On i.i.d. values the two layouts send
  alike: about 1 - e^(-1/2) = 79% of the slots fill with 2 bins per slot.
  Runs longer than B still collide. A NaN never ranks as a bin's largest;
  a NaN drawn into the sample makes the threshold NaN, and nothing is sent.

  Cost (encode + decode, a 2-core CPU, 1%): 2.51x a memory
  pass at 10M floats, 2.69x at 10,000,008 and 3.00x at 1M in the README's
  bench_compress run (the contiguous bins: 3.18x, 3.88x and 3.20x in the
  run before). Scratch breakdown at 10M: one read of x folds each bin's
  largest and its row, vectorised across bins (`_strided_first_largest`,
  ~1 pass); the sample's k-th largest by bisection of its bit patterns
  (~0.17); the compaction of the 2k bins' mask into k slots (~0.3); k
  gathers; the decode's dense write (~1). The contiguous bins needed a
  second, random read of x to find where in each chosen bin its largest
  sat; finding it in the first read instead (`argmax`, a variadic reduce,
  or a chain of selects across each bin's columns) cost 2-8 passes for that
  read alone on XLA's CPU backend. The mask and the positions come from one
  array of each passing bin's row (else -1): from the largest and the row
  as two arrays, XLA fused the fold into the positions' gather too, which
  re-read x at random for every chosen bin (encode 2.5 passes instead of
  1.2). A `fori_loop` over the rows keeps them apart but runs its body on
  one thread (1.6-2.2 passes for the fold). At 0.1% (500 rows of 20K at
  10M) the encode took 1.8 passes in scratch runs, as the contiguous bins'.

  Reference: Lin, Han, Mao, Wang, Dally. Deep Gradient Compression. ICLR 2018.
  https://arxiv.org/abs/1712.01887
  """

  sample_ratio: float = 0.01
  min_sample: int = 2048
  max_sample: int = 16384
  bins_per_k: int = 2
  name: ClassVar[str] = 'dgc'
  stochastic: ClassVar[bool] = True

  def __post_init__(self):
    super().__post_init__()
    if not 0 < self.sample_ratio <= 1:
      raise ValueError(f'sample_ratio must be in (0, 1], got {self.sample_ratio}')
    if not 1 <= self.min_sample <= self.max_sample:
      raise ValueError(
        f'need 1 <= min_sample <= max_sample, got {self.min_sample} and {self.max_sample}'
      )
    if self.bins_per_k < 1:
      raise ValueError(f'bins_per_k must be >= 1, got {self.bins_per_k}')

  def encode(self, x, state, key):
    n, k = x.size, self.kept(x.size)
    sample_key, start_key = jax.random.split(key)
    s = min(n, max(self.min_sample, min(self.max_sample, int(n * self.sample_ratio))))
    sample = jnp.abs(x[jax.random.randint(sample_key, (s,), 0, n)])
    threshold = _kth_largest(sample, max(1, round(s * k / n)))
    bins = min(n, self.bins_per_k * k)
    largest_B, row_B = _strided_first_largest(x, bins)
    # one array for the mask and the positions: with two, XLA's CPU backend fused the fold into
    # the positions' gather as well, re-reading x at random for every chosen bin
    row_B = jnp.where(largest_B >= threshold, row_B, -1)
    start = jax.random.randint(start_key, (), 0, bins)
    chosen_K, valid_K = _compact(row_B >= 0, k, start)
    bin_K = jnp.minimum(chosen_K, bins - 1)  # invalid slots read a real bin; _gather drops them
    at_K = row_B.at[bin_K].get(mode='promise_in_bounds') * bins + bin_K
    return _gather(x, at_K, valid_K), state


@dataclasses.dataclass(frozen=True)
class RandomK(Compressor):
  """k elements at random positions, the same positions on every worker.

  Positions are drawn with replacement from a key that all workers share, so
  only the values travel and payloads can be summed (all-reduce). With
  `rescale` (the default), values are scaled by n/k, which makes
  decode(encode(x)) an unbiased estimate of x; without it, use error feedback.

  Reference: Stich, Cordonnier, Jaggi. Sparsified SGD with Memory. NeurIPS
  2018. https://arxiv.org/abs/1809.07599
  """

  ratio: float = 0.01
  rescale: bool = True
  name: ClassVar[str] = 'randomk'
  summable: ClassVar[bool] = True
  stochastic: ClassVar[bool] = True
  shared_randomness: ClassVar[bool] = True

  def __post_init__(self):
    check_ratio(self.ratio)

  @property
  def unbiased(self) -> bool:  # type: ignore[override]
    return self.rescale

  def init(self, n):
    return jnp.zeros((num_kept(n, self.ratio),), jnp.int32)  # positions of the last encode

  def encode(self, x, state, key):
    n = x.size
    k = num_kept(n, self.ratio)
    idx = jax.random.randint(key, (k,), 0, n, dtype=jnp.int32)
    scale = n / k if self.rescale else 1.0
    return (x[idx] * scale,), idx

  def decode(self, payload, state, n):
    (values,) = payload
    return scatter(values, state, n)


@dataclasses.dataclass(frozen=True)
class Threshold(_Sparsifier):
  """Every element with |x| >= `tau`, up to a capacity of k (from `ratio` or `k`).

  Beyond capacity, the first k by position are sent; the rest wait in the
  error-feedback residual (GRACE pads threshold payloads the same way).
  """

  tau: float = 0.0
  name: ClassVar[str] = 'threshold'

  def __post_init__(self):
    super().__post_init__()
    if self.tau < 0:
      raise ValueError(f'tau must be >= 0, got {self.tau}')

  def encode(self, x, state, key):
    del key
    idx, valid = _compact(jnp.abs(x) >= self.tau, self.kept(x.size))
    return _gather(x, idx, valid), state
