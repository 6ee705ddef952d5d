"""A job planned as Scavenger plans it, with the training given: `plan_job(measure, ...)`.

The four steps, over the grid `workers` × `batches`:

1. Profile: `measure('profile', K, B, profile_steps)` at the four corners of
   the grid (search='partial') or at every point ('full').
2. Run to the target: `measure('target', K, B, max_steps)` for each of
   `targets`; its epochs are steps · B / D and its cost time / 3600 · K ·
   price. The epoch model e = e* + θ·γ/K is fitted on each run's own γ/K
   (epoch_noise='measured', the paper) or on the γ/K the search predicts at
   its (K, B) ('predicted').
3. Fit the models, search (`full_search` or `partial_search`) and `choose`
   under `objective` and `caps`; warnings on the way are kept as notes.
4. Train the choice to the target (a run of step 2 is reused) and compare
   its predicted and measured step, γ/K, epochs, steps, time and cost.

What a trial is (a trainer, a simulator, a cluster) is the caller's: this
module only calls `measure` and does no I/O.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from jaxdist.control.scavenger.model import (
  SECONDS_PER_HOUR,
  Model,
  Prediction,
  Profile,
  fit,
  fit_noise,
)
from jaxdist.control.scavenger.search import choose, full_search, pareto_front, partial_search

SEARCHES = ('partial', 'full')
EPOCH_NOISE = ('measured', 'predicted')
COMPARED = ('step_s', 'gamma_normalized', 'epochs', 'steps', 'time_s', 'cost')


class Measurement(NamedTuple):
  """What a trial of (K, B) measured; a run to the target fills the last four.

  Attributes:
    K: workers.
    B: the global batch, in examples.
    step_s: seconds per step (e.g. the median step of a modelled clock).
    compute_s: of which one worker's compute, seconds.
    sync_s: the rest of the step, seconds.
    gamma_normalized: γ/K (Eq. 2 over K) at step `profile_steps`.
    steps: a run to the target: the step that first reached it.
    epochs: a run to the target: steps · B / D (`plan_job` fills it).
    time_s: a run to the target: seconds to that step.
    cost: a run to the target: time_s / 3600 · K · price (`plan_job` fills it).
  """

  K: int
  B: int
  step_s: float
  compute_s: float
  sync_s: float
  gamma_normalized: float
  steps: int | None = None
  epochs: float | None = None
  time_s: float | None = None
  cost: float | None = None


# (kind, K, B, steps) -> Measurement: kind is 'profile' or 'target'; a 'target' trial gives
# `steps` (the step that reached the target) and `time_s`.
Measure = Callable[[str, int, int, int], Measurement]


class JobPlan(NamedTuple):
  """A planned job (`plan_job`).

  Attributes:
    profiles: the profiling trials (step 1), by (K, B).
    target_runs: the runs to the target (step 2), in the order of `targets`.
    model: the fitted models (partial search); None for a full search.
    table: the search's predictions, by (K, B).
    front: the Pareto front of `table` (`pareto_front`).
    chosen: the chosen prediction.
    actual: the chosen configuration's run to the target (step 4).
    compare: per quantity of `COMPARED`: {'what', 'predicted', 'actual',
      'error'}, the error relative to the actual, as text ('+4.4%').
    notes: the warnings of fitting, searching and choosing, as text.
  """

  profiles: list[Measurement]
  target_runs: list[Measurement]
  model: Model | None
  table: list[Prediction]
  front: list[Prediction]
  chosen: Prediction
  actual: Measurement
  compare: list[dict[str, Any]]
  notes: list[str]


class PlanError(ValueError):
  """The measurements plan no job (`plan_job`); the message says why.

  A model cannot be fitted, a configuration falls outside the epoch model's
  range, or no configuration meets the caps.
  """


def plan_job(
  measure: Measure,
  *,
  workers: Sequence[int],
  batches: Sequence[int],
  targets: Sequence[tuple[int, int]],
  profile_steps: int,
  max_steps: int,
  dataset_size: int,
  price: float,
  search: str = 'partial',
  epoch_noise: str = 'measured',
  objective: str = 'knee',
  caps: Mapping[str, float | int | None] | None = None,
) -> JobPlan:
  """Plans a job in the module docstring's four steps, each trial run by `measure`.

  Args:
    measure: runs a trial (`Measure`).
    workers: the K of the grid.
    batches: the global batches B of the grid, each a multiple of every K.
    targets: the (K, B) of the runs to the target: two at least, B a
      multiple of K.
    profile_steps: steps of a profiling trial.
    max_steps: steps of a run to the target.
    dataset_size: D, examples per epoch.
    price: p, the price of one worker for one hour.
    search: 'partial' or 'full' (`SEARCHES`).
    epoch_noise: 'measured' or 'predicted' (`EPOCH_NOISE`).
    objective: 'time', 'cost' or 'knee' (`choose`).
    caps: `choose`'s caps by name (max_cost, max_time_s, max_batch,
      min_workers, max_workers); None values cap nothing.

  Returns:
    The `JobPlan`. Raises `PlanError` when the measurements plan nothing.
  """
  workers, batches = sorted({int(k) for k in workers}), sorted({int(b) for b in batches})
  targets = [(int(k), int(b)) for k, b in targets]
  _check(workers, batches, targets, search, epoch_noise)

  def reached(k: int, b: int) -> Measurement:
    m = measure('target', k, b, max_steps)
    if m.steps is None or m.time_s is None:
      raise ValueError(f"measure('target', {k}, {b}, ...) gave no steps or time_s: {m}")
    cost = m.time_s / SECONDS_PER_HOUR * k * price
    return m._replace(epochs=m.steps * b / dataset_size, cost=cost)

  profiles = [measure('profile', k, b, profile_steps) for k, b in _points(workers, batches, search)]
  runs = {(k, b): reached(k, b) for k, b in targets}
  grid = dict(workers=workers, batches=batches, dataset_size=dataset_size, price=price)
  model, table, chosen, notes = _choose(
    profiles, list(runs.values()), search, epoch_noise, objective, dict(caps or {}), **grid
  )
  key = (chosen.num_workers, chosen.batch_size)
  actual = runs[key] if key in runs else reached(*key)
  compare = [
    {'what': name, 'predicted': getattr(chosen, name), 'actual': getattr(actual, name)}
    for name in COMPARED
  ]
  for c in compare:
    c['error'] = f'{(c["predicted"] - c["actual"]) / c["actual"]:+.1%}'
  front = pareto_front(table)
  return JobPlan(profiles, list(runs.values()), model, table, front, chosen, actual, compare, notes)


def _check(workers, batches, targets, search: str, epoch_noise: str) -> None:
  if search not in SEARCHES:
    raise ValueError(f'search must be one of {SEARCHES}, got {search!r}')
  if epoch_noise not in EPOCH_NOISE:
    raise ValueError(f'epoch_noise must be one of {EPOCH_NOISE}, got {epoch_noise!r}')
  bad = [(k, b) for k in workers for b in batches if b % k]
  if bad:
    raise ValueError(f'every batch must be a multiple of every K; not so: {bad}')
  if any(b % k for k, b in targets) or len(set(targets)) < 2:
    raise ValueError(f'targets must be two (K, B) at least, B a multiple of K; got {targets}')


def _points(workers: list[int], batches: list[int], search: str) -> list[tuple[int, int]]:
  """The profiled (K, B): every point of the grid (full search), or its four corners."""
  if search == 'full':
    return [(k, b) for k in workers for b in batches]
  return sorted({(k, b) for k in (workers[0], workers[-1]) for b in (batches[0], batches[-1])})


def _choose(
  profiles: list[Measurement],
  runs: list[Measurement],
  search: str,
  epoch_noise: str,
  objective: str,
  caps: dict[str, Any],
  *,
  workers: list[int],
  batches: list[int],
  dataset_size: int,
  price: float,
) -> tuple[Model | None, list[Prediction], Prediction, list[str]]:
  """Step 3: (model, table, chosen, notes); a ValueError of the fits becomes a PlanError."""
  rows = [Profile(*p[:6]) for p in profiles]

  def noise(run: Measurement) -> float:
    """The γ/K that the epoch model sees for a run to the target (`epoch_noise`)."""
    if epoch_noise == 'measured':
      return run.gamma_normalized
    if search == 'partial':
      g0, g1 = fit_noise(rows)
      return g0 + g1 / run.B**0.5
    point = [p.gamma_normalized for p in profiles if (p.K, p.B) == (run.K, run.B)]
    if not point:
      raise ValueError(f'run K={run.K}, B={run.B} is not a profiled point of the grid')
    return point[0]

  priced = dict(dataset_size=dataset_size, price_per_hour=price)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    try:
      fitted = [(noise(r), r.epochs) for r in runs]
      if search == 'full':
        model, table = None, full_search(rows, fitted, **priced)
      else:
        model = fit(rows, fitted)
        table = partial_search(rows, fitted, workers=workers, batches=batches, **priced)
      chosen = choose(table, objective, **caps)
    except ValueError as e:  # unidentifiable fits, epochs out of range, caps no one meets
      raise PlanError(str(e)) from e
  return model, table, chosen, [str(n.message) for n in caught]
