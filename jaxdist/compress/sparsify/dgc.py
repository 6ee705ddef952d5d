"""DGC: Top-k approximated by a sampled threshold over strided bins."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxdist.compress.sparsify._scan import _compact, _fold_rows, _keep_larger, _kth_largest
from jaxdist.compress.sparsify.base import _gather, _Sparsifier


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
  last layer's weights), and a run inside one bin offers one element. On the
  gradients of the digits CNN and of ResNet-20 (synthetic CIFAR shapes), at
  0, 50 and 200 steps and ratios 1% and 0.1%, contiguous bins of n/B
  elements fill 4-37% of the k slots (ResNet-20: 4-7%) and keep 10-45% of
  exact Top-k's energy; strided bins fill 61-89% and keep 68-98% (the
  gradients table of `experiments/results/compress_bench.md`, in the docs'
  benchmarks). On i.i.d. values
  the two layouts send alike: about 1 - e^(-1/2) = 79% of the slots fill
  with 2 bins per slot.
  Runs longer than B still collide. A NaN never ranks as a bin's largest;
  a NaN drawn into the sample makes the threshold NaN, and nothing is sent.

  Cost (encode + decode, a 2-core CPU, 1%): 2.51x a memory
  pass at 10M floats, 2.69x at 10,000,008 and 3.00x at 1M in the
  bench_compress run of the docs' benchmarks (contiguous bins: 3.18x, 3.88x
  and 3.20x). Scratch breakdown at 10M: one read of x folds each bin's
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
  10M) the encode took 1.8 passes in scratch runs, as contiguous bins do.

  Attributes:
    ratio: the fraction of elements sent, in (0, 1].
    k: the elements sent (give `ratio` or `k`, not both).
    sample_ratio: the sample's size as a fraction of n, in (0, 1].
    min_sample: the fewest elements sampled.
    max_sample: the most elements sampled.
    bins_per_k: B / k, the strided bins per payload slot (>= 1).

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
