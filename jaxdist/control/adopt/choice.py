"""ADOPT's multi-objective choice among the compiled candidates: NSGA-II, then ASF.

NSGA-II (pop 40, 10 offspring, SBX(0.9, η=15), PM(η=20), 40 generations,
seed 1) minimises (f1, f2) = (t_sync(c), 1 / gain(c)) on [min, max] of the
candidates; the achievement scalarising function

  ASF(c) = max_i w_i · (f_i(c) − z_i^ideal) / (z_i^nadir − z_i^ideal),   w = (0.6, 0.4)

scores each compiled candidate, and the lowest wins. pymoo loads when
`solve` first runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

CANDIDATES = (0.1, 0.0333, 0.0111, 0.0037, 0.0012)  # c_high / 3^k, k = 0..4, rounded
POP_SIZE, OFFSPRING, GENERATIONS = 40, 10, 40  # NSGA-II, as the authors' code


class Solution(NamedTuple):
  """What `solve` chose.

  Attributes:
    ratio: the chosen candidate ratio.
    index: its position in the grid.
    asf: each grid candidate's ASF score (lower is better), Python floats.
  """

  ratio: float
  index: int
  asf: tuple[float, ...]


def _check_weights(weights) -> np.ndarray:
  w = np.asarray(weights, float)
  if w.shape != (2,) or not np.all(np.isfinite(w)) or w.min() < 0 or abs(w.sum() - 1) > 1e-9:
    raise ValueError(
      f'weights must be two finite numbers >= 0 summing to 1 (comm time, gain), got {weights}'
    )
  return w


def _asf(F, ideal, nadir, w) -> np.ndarray:
  """max_i w_i (F_i − ideal_i) / (nadir_i − ideal_i); a flat objective scores 0."""
  span = np.where(nadir - ideal > 0, nadir - ideal, 1.0)
  return np.max(w * (F - ideal) / span, axis=1)


def solve(
  comm_fit: Callable,
  gain_fit: Callable,
  *,
  low: float = 0.001,
  high: float = 0.1,
  weights: Sequence[float] = (0.6, 0.4),
  seed: int = 1,
  grid: Sequence[float] = CANDIDATES,
) -> Solution:
  """NSGA-II for (comm ms, 1/gain) on [low, high], then ASF, restricted to the compiled candidates.

  NSGA-II (pymoo; pop 40, 10 offspring, SBX(0.9, η=15), PM(η=20), 40
  generations) finds the Pareto front of f1 = `comm_fit`(c) and
  f2 = 1 / `gain_fit`(c). Its nadir and (with the grid's own points) ideal
  normalise the objectives; each grid candidate gets ASF = max_i w_i · nF_i,
  and the lowest wins (ties: the first). The code takes the front's ASF
  point instead, a continuous ratio; jaxdist compiles only the grid.

  Args:
    comm_fit: c -> communication ms (vectorised), e.g. `fit_comm_time`'s.
    gain_fit: c -> gain (vectorised), > 0 on [low, high], e.g. `fit_gain`'s.
    low: the smallest ratio, > 0.
    high: the largest, in (low, 1].
    weights: (comm time, gain) weights, >= 0, summing to 1; (1, 0) picks the
      fastest candidate, (0, 1) the highest gain.
    seed: NSGA-II's seed.
    grid: the compiled candidates, each in [low, high].

  Returns:
    `Solution(ratio, index, asf)`.

  Raises:
    ValueError: bad arguments, or a fitted gain that is not positive (or
      objectives that are not finite) on [low, high].
  """
  w = _check_weights(weights)
  if not (0 < low < high <= 1):
    raise ValueError(f'low and high must satisfy 0 < low < high <= 1, got low={low}, high={high}')
  g = np.asarray(grid, float)
  if g.ndim != 1 or not g.size or not np.all((g >= low) & (g <= high)):
    raise ValueError(f'grid must be a non-empty list of ratios in [{low}, {high}], got {grid}')

  def objectives(c):
    c = np.asarray(c, float)
    return np.stack([np.asarray(comm_fit(c), float), 1.0 / np.asarray(gain_fit(c), float)], -1)

  probe = np.r_[np.linspace(low, high, 1001), g]
  if np.any(np.asarray(gain_fit(probe), float) <= 0) or not np.all(np.isfinite(objectives(probe))):
    raise ValueError(f'gain_fit must be > 0 and both fits finite on [low, high] = [{low}, {high}]')
  front = _nsga2(objectives, low, high, seed)
  F_grid = objectives(g)
  ideal = np.minimum(front.min(0), F_grid.min(0))
  scores = _asf(F_grid, ideal, front.max(0), w)
  i = int(np.argmin(scores))
  return Solution(float(g[i]), i, tuple(float(s) for s in scores))


def _nsga2(objectives, low: float, high: float, seed: int) -> np.ndarray:
  """The objective values of NSGA-II's final non-dominated set, [P, 2]."""
  from pymoo.algorithms.moo.nsga2 import NSGA2
  from pymoo.core.problem import Problem
  from pymoo.operators.crossover.sbx import SBX
  from pymoo.operators.mutation.pm import PM
  from pymoo.operators.sampling.rnd import FloatRandomSampling
  from pymoo.optimize import minimize

  class _Ratio(Problem):
    def __init__(self):
      super().__init__(n_var=1, n_obj=2, xl=np.array([low]), xu=np.array([high]))

    def _evaluate(self, x, out, *args, **kwargs):
      out['F'] = objectives(x[:, 0])

  algorithm = NSGA2(
    pop_size=POP_SIZE,
    n_offsprings=OFFSPRING,
    sampling=FloatRandomSampling(),
    crossover=SBX(prob=0.9, eta=15),
    mutation=PM(eta=20),
    eliminate_duplicates=True,
  )
  res = minimize(_Ratio(), algorithm, ('n_gen', GENERATIONS), seed=seed, verbose=False)
  return np.atleast_2d(np.asarray(res.F, float))
