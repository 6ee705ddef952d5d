"""Sparsifiers: keep k of n elements, send (values, int32 indices).

Payloads have a fixed size k; where a method finds fewer than k elements, the
unused slots carry value 0 at index n (one past the end), which `scatter`
drops and `take` reads as 0, so padding never touches a real element
(`base`). `TopK` and `MSTopK` are in `topk`, `DGC` in `dgc`, `RandomK` in
`randomk`, `Threshold` in `threshold`; the scans they share (compaction,
bisection of bit patterns, row folds) in `_scan`. The private helpers named
here are re-exported for tests/compress and experiments/bench_compress.py.
"""

from __future__ import annotations

# first, so that `jd.compress.REGISTRY` lists topk, mstopk, dgc, threshold in this order
from jaxdist.compress.sparsify.topk import BISECT_FROM, SELECTIONS, MSTopK, TopK, top_k_bisect

# isort: split
from jaxdist.compress.sparsify._scan import COMPACT_BY_WORDS_FROM, FOLD_CHAIN
from jaxdist.compress.sparsify._scan import _compact_by_positions as _compact_by_positions
from jaxdist.compress.sparsify._scan import _compact_counted as _compact_counted
from jaxdist.compress.sparsify._scan import _kth_largest as _kth_largest
from jaxdist.compress.sparsify._scan import _prefix_sum as _prefix_sum
from jaxdist.compress.sparsify.base import _gather as _gather
from jaxdist.compress.sparsify.base import scatter, take
from jaxdist.compress.sparsify.dgc import DGC
from jaxdist.compress.sparsify.randomk import RandomK
from jaxdist.compress.sparsify.threshold import Threshold
from jaxdist.compress.sparsify.topk import _candidates as _candidates
from jaxdist.compress.sparsify.topk import _dividing_width as _dividing_width
from jaxdist.compress.sparsify.topk import _top_k_candidates as _top_k_candidates

__all__ = [
  'BISECT_FROM',
  'COMPACT_BY_WORDS_FROM',
  'DGC',
  'FOLD_CHAIN',
  'SELECTIONS',
  'MSTopK',
  'RandomK',
  'Threshold',
  'TopK',
  'scatter',
  'take',
  'top_k_bisect',
]
