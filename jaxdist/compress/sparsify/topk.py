"""Exact Top-k (`TopK`, three ways to select) and multi-sampling approximate Top-k (`MSTopK`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdist.compress.sparsify._scan import _compact, _compact_counted, _first_k_largest
from jaxdist.compress.sparsify.base import _gather, _Sparsifier


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
  windows of x instead of padded rows (as contiguous bins can be read)
  were slower here (5.8 ms), and so was a strided
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

  Attributes:
    ratio: the fraction of elements sent, in (0, 1]: k = max(1, ⌊n·ratio⌋).
    k: the elements sent (give `ratio` or `k`, not both).
    selection: 'auto', 'top_k', 'bisect' or 'candidates' (above).
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

  Attributes:
    ratio: the fraction of elements sent, in (0, 1].
    k: the elements sent (give `ratio` or `k`, not both).
    rounds: bisection steps of the threshold.

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
