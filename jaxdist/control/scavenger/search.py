"""Scavenger's searches over (K, B) and the choice by time, cost or the Pareto knee.

Searches: `full_search` uses the profiled step time and noise of every (K, B)
(profiles at every point) and the epoch model; `partial_search` profiles a few
extreme points and interpolates everything with the fitted models. `choose`
minimises time or cost, or takes the knee of the cost–time Pareto front,
under caps on cost, time, batch (memory) and K.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence

import numpy as np

from jaxdist.control.scavenger.model import (
  Prediction,
  Profile,
  _predict,
  _profiles,
  fit,
  fit_epochs,
)

OBJECTIVES = ('time', 'cost', 'knee')


def full_search(
  profiles: Iterable[Sequence[float]],
  runs: Iterable[Sequence[float]],
  *,
  dataset_size: int,
  price_per_hour: float,
) -> list[Prediction]:
  """Full search: every profiled (K, B) with its measured τ and γ/K, and the epoch model.

  Profiles of the same (K, B) are averaged. Only e = e* + θ · γ/K is fitted.

  Args:
    profiles: rows (K, B, step_s, compute_s, sync_s, γ/K), one per grid point
      at least.
    runs: rows (γ/K, epochs to the target), two different γ/K at least.
    dataset_size: D, examples per epoch.
    price_per_hour: p, the price of one worker for one hour.

  Returns:
    One `Prediction` per distinct (K, B), sorted by (K, B).
  """
  rows = _profiles(profiles)
  e_star, theta = fit_epochs(runs)
  groups: dict[tuple[int, int], list[Profile]] = {}
  for p in rows:
    groups.setdefault((int(p.num_workers), int(p.batch_size)), []).append(p)
  table = []
  for (k, b), group in sorted(groups.items()):
    step_s = float(np.mean([p.step_s for p in group]))
    gamma_norm = float(np.mean([p.gamma_normalized for p in group]))
    table.append(
      _predict(k, b, step_s, gamma_norm, e_star + theta * gamma_norm, dataset_size, price_per_hour)
    )
  return table


def partial_search(
  profiles: Iterable[Sequence[float]],
  runs: Iterable[Sequence[float]],
  *,
  workers: Sequence[int],
  batches: Sequence[int],
  dataset_size: int,
  price_per_hour: float,
) -> list[Prediction]:
  """Partial search: fit on a few profiles (the extremes), predict the grid workers × batches.

  The profiles need two K, two B/K and two B at least, e.g. (K_min, B_min),
  (K_min, B_max), (K_max, B_max); points outside their range are
  extrapolated by the affine models.

  Args:
    profiles: rows (K, B, step_s, compute_s, sync_s, γ/K).
    runs: rows (γ/K, epochs to the target), two different γ/K at least.
    workers: the K of the grid.
    batches: the global batches B of the grid; pairs with B < K are skipped.
    dataset_size: D, examples per epoch.
    price_per_hour: p, the price of one worker for one hour.

  Returns:
    One `Prediction` per grid point, sorted by (K, B).
  """
  model = fit(profiles, runs)
  grid = [(int(k), int(b)) for k in sorted(set(workers)) for b in sorted(set(batches)) if b >= k]
  if not grid:
    raise ValueError(f'the grid workers={list(workers)} x batches={list(batches)} is empty')
  return [model.predict(k, b, dataset_size, price_per_hour) for k, b in grid]


# ---------------------------------------------------------------------------------------------
# Choice


def pareto_front(table: Iterable[Prediction]) -> list[Prediction]:
  """The configurations no other beats in both time and cost, by ascending time.

  Along the front time strictly increases and cost strictly decreases; of
  equal (T, C) points the first in (time, cost, K, B) order is kept.

  Args:
    table: `Prediction`s, e.g. a search's rows.

  Returns:
    The front's `Prediction`s, by ascending time.

  Example:
    >>> rows = [Prediction(k, 64, 1.0, 0.5, 1.0, 1.0, t, c)
    ...         for k, t, c in [(1, 4.0, 1.0), (2, 2.0, 2.0), (3, 3.0, 2.5), (4, 1.0, 4.0)]]
    >>> [p.num_workers for p in pareto_front(rows)]  # K=3 is slower and dearer than K=2
    [4, 2, 1]
  """
  front: list[Prediction] = []
  for p in sorted(table, key=lambda p: (p.time_s, p.cost, p.num_workers, p.batch_size)):
    if not front or p.cost < front[-1].cost:
      front.append(p)
  return front


def knee(front: Sequence[Prediction]) -> Prediction:
  """The knee of a Pareto front (`pareto_front`) by Kneedle (`kneed.KneeLocator`).

  x = time ascending, y = cost decreasing, curve convex. When kneed finds no
  knee, the argmax of its difference curve D = (1 − C) − T on the normalised
  points (ties to the faster point), with a warning.

  Args:
    front: a Pareto front, by ascending time (`pareto_front`).

  Returns:
    The knee's `Prediction` (the only point of a front of one).

  Raises:
    ValueError: if `front` is empty or not a Pareto front.
  """
  front = list(front)
  if not front:
    raise ValueError('the Pareto front is empty')
  if len(front) == 1:
    return front[0]
  times = np.array([p.time_s for p in front], float)
  costs = np.array([p.cost for p in front], float)
  if np.any(np.diff(times) <= 0) or np.any(np.diff(costs) >= 0):
    raise ValueError('front must be a Pareto front: time increasing and cost decreasing')
  import kneed  # here: only the knee needs it

  locator = kneed.KneeLocator(times, costs, curve='convex', direction='decreasing')
  if locator.knee is not None:
    return front[int(np.flatnonzero(times == locator.knee)[0])]
  diff = np.asarray(locator.y_difference, float)
  i = int(np.flatnonzero(diff >= diff.max() - 1e-12)[0])  # rounding ties go to the faster
  warnings.warn(
    f'kneed found no knee on a Pareto front of {len(front)} points; taking the maximum of '
    f'the difference curve (K={front[i].num_workers}, B={front[i].batch_size})',
    stacklevel=2,
  )
  return front[i]


def choose(
  table: Iterable[Prediction],
  objective: str = 'time',
  *,
  max_cost: float | None = None,
  max_time_s: float | None = None,
  max_batch: int | None = None,
  min_workers: int | None = None,
  max_workers: int | None = None,
) -> Prediction:
  """The configuration of `table` that best meets `objective` within the caps.

  Args:
    table: the predictions of a search.
    objective: 'time' (least T; ties to less cost), 'cost' (least C; ties to
      less time) or 'knee' (the knee of the Pareto front of the feasible
      points, see `knee`).
    max_cost: keep C <= max_cost (the currency of the price).
    max_time_s: keep T <= max_time_s seconds.
    max_batch: keep B <= max_batch (what fits in memory).
    min_workers: keep K >= min_workers.
    max_workers: keep K <= max_workers.

  Returns:
    The chosen `Prediction`.

  Example:
    >>> rows = [Prediction(k, 64, 1.0, 0.5, 1.0, 1.0, t, c)
    ...         for k, t, c in [(1, 4.0, 1.0), (2, 2.0, 2.0), (4, 1.0, 4.0)]]
    >>> choose(rows, 'time').num_workers, choose(rows, 'cost').num_workers
    (4, 1)
    >>> choose(rows, 'time', max_cost=3.0).num_workers
    2
  """
  if objective not in OBJECTIVES:
    raise ValueError(f'objective must be one of {OBJECTIVES}, got {objective!r}')
  rows = list(table)
  if not rows:
    raise ValueError('table is empty')
  for p in rows:
    if not (math.isfinite(p.time_s) and math.isfinite(p.cost)):
      raise ValueError(f'the table has a non-finite time or cost: {p}')
  caps = {
    'max_cost': (max_cost, lambda p, v: p.cost <= v),
    'max_time_s': (max_time_s, lambda p, v: p.time_s <= v),
    'max_batch': (max_batch, lambda p, v: p.batch_size <= v),
    'min_workers': (min_workers, lambda p, v: p.num_workers >= v),
    'max_workers': (max_workers, lambda p, v: p.num_workers <= v),
  }
  feasible = [p for p in rows if all(v is None or ok(p, v) for v, ok in caps.values())]
  if not feasible:
    given = ', '.join(f'{name}={v}' for name, (v, _) in caps.items() if v is not None)
    raise ValueError(
      f'no configuration satisfies {given}: of {len(rows)}, the least cost is '
      f'{min(p.cost for p in rows):.4g}, the least time {min(p.time_s for p in rows):.4g} s, '
      f'the smallest batch {min(p.batch_size for p in rows)}, '
      f'K from {min(p.num_workers for p in rows)} to {max(p.num_workers for p in rows)}'
    )
  if objective == 'time':
    return min(feasible, key=lambda p: (p.time_s, p.cost, p.num_workers, p.batch_size))
  if objective == 'cost':
    return min(feasible, key=lambda p: (p.cost, p.time_s, p.num_workers, p.batch_size))
  return knee(pareto_front(feasible))
