"""Wall-clock timing of jitted work: the median of repeated, blocking runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def median_seconds(
  run: Callable[[], Any], repeats: int = 10, warmup: int = 1, budget_s: float | None = None
) -> float:
  """Median seconds of `run()` (which returns arrays to wait for) over `repeats` runs.

  `warmup` untimed runs come first (compilation, caches). With `budget_s`,
  timing stops early once the timed runs add up to it (after at least
  three, or `repeats` if fewer).
  """
  if repeats < 1:
    raise ValueError(f'repeats must be >= 1, got {repeats}')
  for _ in range(warmup):
    jax.block_until_ready(run())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(run())
    times.append(time.perf_counter() - start)
    if budget_s is not None and len(times) >= 3 and sum(times) >= budget_s:
      break
  return statistics.median(times)
