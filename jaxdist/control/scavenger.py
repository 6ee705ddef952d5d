"""Scavenger: the cloud configuration (K, B) by time and cost models (Tyagi & Sharma, 2023).

Host-side and pure NumPy/SciPy: short profiling runs measure step times and
the gradient noise; affine models fitted to them predict, for every number of
workers K and global batch B = K·b, the time and the cost to train to a
target; a search lists the predictions and `choose` picks one.

Noise (Eq. 2), from the per-worker gradients g_k and their mean ḡ:

  γ = E[(1/K) Σ_k ‖g_k‖²] / E[‖ḡ‖²] ≥ 1,

1 when the workers' gradients agree, K when they are orthogonal (of equal
norms), more than K when they point against each other. With i.i.d. worker
batches γ ≤ K in expectation (E‖g_k‖² = ‖G‖² + tr Σ/b, E‖ḡ‖² = ‖G‖² + tr Σ/B);
one measurement, or non-IID shards, can exceed it (digits with one label per
worker gives γ/K ≈ 3). γ/K (1/K to 1 in the i.i.d. case) is the normalised
noise the models use. `noise_meter` smooths the numerator and the
denominator separately (EWMA each) and divides: a ratio of expectations, as
Eq. 2 writes it, not an average of per-step ratios.

The "GNS": McCandlish et al.'s simple noise scale B_simple = tr(Σ)/‖G‖² (Σ the
per-example gradient covariance, G the true gradient), estimated from the two
batch sizes b and B = K·b at hand:

  B_simple = B · (γ − 1) / (K − γ).

It equals the ratio of McCandlish's unbiased estimates of tr(Σ) and ‖G‖²
(his Appendix A.1) made from the same smoothed numerator and denominator.

Time and cost (Eqs. 3–10), for a dataset of D examples and a price p per
worker-hour:

  τ(K, B)   = compute_s + sync_s (+ other_s)        seconds per step
  compute_s = c0 + c1 · (B / K)                     per-worker batch b = B/K
  sync_s    = s0 + s1 · K
  γ/K       = g0 + g1 / √B                          (one model for every K)
  e         = e* + θ · γ/K                          epochs to the target
  n         = e · D / B                             steps
  T         = n · τ                                 seconds
  C         = (T / 3600) · K · p                    currency (p per worker-hour)

Each model is a least-squares fit (`numpy.linalg.lstsq`) with an intercept.
`other_s` is the mean of step_s − compute_s − sync_s over the profiles (0 when
the profiled step is exactly compute plus sync).

Searches: `full_search` uses the profiled step time and noise of every (K, B)
(profiles at every point) and the epoch model; `partial_search` profiles a few
extreme points and interpolates everything with the fitted models. `choose`
minimises time or cost, or takes the knee of the cost–time Pareto front,
under caps on cost, time, batch (memory) and K.

Departures from the paper, after the check in research/ALGORITHMS.md §5:

- The paper's "∝" in Eqs. 7–10 are fitted here as affine models with an
  intercept (its own Fig. 9, γ/K ≈ 0.7 at 1/√B ≈ 0.045, is not a line through
  the origin); the noise in Eqs. 6–7 is the normalised γ/K.
- Partial search needs profiles at two K at least (an intercept and a slope
  of sync_s), two per-worker batches b and two B; the paper's partial search
  profiles (K_min, B_min) and (K_min, B_max) only and then "adds more VMs".
  `fit` says which is missing.
- The knee: the paper finds knees per batch size over K. Here it is the
  knee of the Pareto front of the feasible (T, C) points (x = T ascending,
  C decreasing and convex), by `kneed.KneeLocator` (Kneedle: normalise both
  to [0, 1], difference curve D = (1 − C) − T; kneed returns the first local
  maximum of D that D later falls below by S = 1 mean x-spacing). When kneed
  finds none (a front of two points, or one that never flattens) the plain
  argmax of D is taken, with a warning.
- n = e·D/B is not rounded up to whole steps.
- Not implemented: the memory-priced cost (Fig. 12, C ∝ B·T) and the no-search
  mode (a stored model of a similar job).

Reference: Tyagi & Sharma. Scavenger: A Cloud Service For Optimizing Cost and
Performance of ML Training. IEEE/ACM CCGrid 2023, pp. 403–413.
https://arxiv.org/abs/2303.06659
McCandlish, Kaplan, Amodei et al. An Empirical Model of Large-Batch Training.
https://arxiv.org/abs/1812.06162
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from jaxdist.control.ewma import ewma

SECONDS_PER_HOUR = 3600.0
OBJECTIVES = ('time', 'cost', 'knee')

# ---------------------------------------------------------------------------------------------
# Noise (Eq. 2)


def noise_terms(worker_grads: np.ndarray) -> tuple[float, float]:
  """Eq. 2's two terms from per-worker gradients: (mean_k ‖g_k‖², ‖ḡ‖²).

  Args:
    worker_grads: [K, ...] worker k's (flattened or not) gradient in row k.

  Returns:
    (mean over k of ‖g_k‖², ‖mean over k of g_k‖²), Python floats.

  Example:
    >>> noise_terms(np.array([[1.0, 0.0], [0.0, 1.0]]))  # orthogonal: ḡ = (½, ½)
    (1.0, 0.5)
  """
  g = np.asarray(worker_grads, float)
  if g.ndim < 1 or g.shape[0] < 1:
    raise ValueError(f'worker_grads must have a leading worker axis, got shape {g.shape}')
  g_KxP = g.reshape(g.shape[0], -1)
  worker_sq = float(np.mean(np.sum(g_KxP**2, axis=1)))
  mean_sq = float(np.sum(np.mean(g_KxP, axis=0) ** 2))
  return worker_sq, mean_sq


class NoiseMeterState(NamedTuple):
  """State of `noise_meter`: Python numbers, so `json.dumps(state._asdict())` saves it.

  Attributes:
    worker_sq: EWMA of mean_k ‖g_k‖² (Eq. 2's numerator); 0 before any update.
    mean_sq: EWMA of ‖ḡ‖² (the denominator); 0 before any update.
    count: measurements so far.
  """

  worker_sq: float
  mean_sq: float
  count: int


class NoiseMeter(NamedTuple):
  """A host-side meter of Scavenger's γ: `init()` and `update(state, worker_sq, mean_sq)`."""

  init: Callable[[], NoiseMeterState]
  update: Callable[[NoiseMeterState, float, float], NoiseMeterState]


def noise_meter(decay: float = 0.9) -> NoiseMeter:
  """EWMAs of Eq. 2's numerator and denominator; read them with `gamma` and friends.

  The first measurement sets both averages; each later one moves them by
  x ← decay · x + (1 − decay) · new.

  Args:
    decay: EWMA weight of the past, in [0, 1) (0: the last measurement only).

  Returns:
    `NoiseMeter(init, update)`; `update(state, worker_sq, mean_sq)` takes one
    measurement of mean_k ‖g_k‖² and ‖ḡ‖² (see `noise_terms`).

  Example:
    >>> meter = noise_meter(decay=0.5)
    >>> state = meter.update(meter.init(), 2.0, 1.0)
    >>> state = meter.update(state, 4.0, 4.0)
    >>> state  # (2 + 4) / 2, (1 + 4) / 2
    NoiseMeterState(worker_sq=3.0, mean_sq=2.5, count=2)
    >>> gamma(state)  # 3 / 2.5, not the mean of the ratios 2 and 1
    1.2
  """
  if not 0.0 <= decay < 1.0:
    raise ValueError(f'decay must be in [0, 1), got {decay}')

  def init() -> NoiseMeterState:
    return NoiseMeterState(0.0, 0.0, 0)

  def update(state: NoiseMeterState, worker_sq: float, mean_sq: float) -> NoiseMeterState:
    worker_sq, mean_sq = float(worker_sq), float(mean_sq)
    for name, v in (('worker_sq', worker_sq), ('mean_sq', mean_sq)):
      if not (math.isfinite(v) and v >= 0):
        raise ValueError(f'{name} must be finite and >= 0, got {v}')
    seen = state.count > 0  # else nothing to smooth with yet
    smooth = lambda old, new: ewma(old if seen else None, new, decay)
    return NoiseMeterState(smooth(state.worker_sq, worker_sq), smooth(state.mean_sq, mean_sq),
                           state.count + 1)  # fmt: skip

  return NoiseMeter(init, update)


def gamma(state: NoiseMeterState) -> float:
  """γ = EWMA(mean_k ‖g_k‖²) / EWMA(‖ḡ‖²), >= 1 (up to rounding); see the module docstring.

  Returns inf when the smoothed ‖ḡ‖² is 0 while the workers' is not, and NaN
  when both are 0.
  """
  if state.count < 1:
    raise ValueError('gamma needs at least one measurement (state.count is 0)')
  if state.mean_sq == 0:
    return math.inf if state.worker_sq > 0 else math.nan
  return state.worker_sq / state.mean_sq


def gamma_normalized(state: NoiseMeterState, num_workers: int) -> float:
  """γ/K, >= 1/K (at most 1 in expectation with i.i.d. batches): what the models use."""
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  return gamma(state) / num_workers


def simple_noise_scale(state: NoiseMeterState, num_workers: int, global_batch: int) -> float:
  """McCandlish's simple noise scale B_simple = B · (γ − 1) / (K − γ), in examples.

  From per-worker batches b = B/K and the global batch B. γ ≥ K (noise
  dominates at both sizes) gives inf; γ ≤ 1 gives 0 or less; K = 1 cannot
  estimate it (NaN).

  Example:
    >>> simple_noise_scale(NoiseMeterState(3.0, 1.5, 1), 4, 128)  # γ = 2: 128 · 1 / 2
    64.0
  """
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  if global_batch < num_workers:
    raise ValueError(
      f'global_batch must be >= num_workers ({num_workers}) examples, got {global_batch}'
    )
  g = gamma(state)
  if num_workers == 1 or math.isnan(g):
    return math.nan
  if g >= num_workers:
    return math.inf
  return global_batch * (g - 1) / (num_workers - g)


# ---------------------------------------------------------------------------------------------
# Models (Eqs. 3–10)


class Profile(NamedTuple):
  """One profiled configuration: measured means over some steps after the noise settled.

  Attributes:
    num_workers: K.
    batch_size: the global batch B = K · b, in examples.
    step_s: seconds per step.
    compute_s: of which the per-worker compute, in seconds.
    sync_s: of which the synchronisation, in seconds.
    gamma_normalized: γ/K (Eq. 2 over K).
  """

  num_workers: int
  batch_size: int
  step_s: float
  compute_s: float
  sync_s: float
  gamma_normalized: float


class TargetRun(NamedTuple):
  """A run trained to the target: its noise and the epochs it took.

  Attributes:
    gamma_normalized: γ/K of the run (after it settled).
    epochs: passes over the dataset to reach the target (steps · B / D).
  """

  gamma_normalized: float
  epochs: float


class Prediction(NamedTuple):
  """One row of a search: a configuration and its predicted time and cost.

  Attributes:
    num_workers: K.
    batch_size: B, examples per step over all workers.
    step_s: τ, seconds per step.
    gamma_normalized: γ/K.
    epochs: e, passes over the dataset to the target.
    steps: n = e · D / B (not rounded).
    time_s: T = n · τ, seconds.
    cost: C = (T / 3600) · K · p, in the currency of p (per worker-hour).
  """

  num_workers: int
  batch_size: int
  step_s: float
  gamma_normalized: float
  epochs: float
  steps: float
  time_s: float
  cost: float


def _predict(
  num_workers: int,
  batch_size: int,
  step_s: float,
  gamma_norm: float,
  epochs: float,
  dataset_size: int,
  price_per_hour: float,
) -> Prediction:
  """T and C from τ, γ/K and e (Eqs. 3–5); checks that they are usable."""
  if dataset_size < 1:
    raise ValueError(f'dataset_size must be >= 1 examples, got {dataset_size}')
  if not (math.isfinite(price_per_hour) and price_per_hour >= 0):
    raise ValueError(f'price_per_hour must be finite and >= 0, got {price_per_hour}')
  where = f'at K={num_workers}, B={batch_size}'
  if not (math.isfinite(step_s) and step_s > 0):
    raise ValueError(f'the step time {where} must be finite and > 0 s, got {step_s}')
  if not (math.isfinite(epochs) and epochs > 0):
    raise ValueError(
      f'the predicted epochs {where} must be finite and > 0, got {epochs} '
      f'(γ/K = {gamma_norm}): the configuration is outside the range of the epoch model'
    )
  steps = epochs * dataset_size / batch_size
  time_s = steps * step_s
  cost = time_s / SECONDS_PER_HOUR * num_workers * price_per_hour
  values = (step_s, gamma_norm, epochs, steps, time_s, cost)
  return Prediction(int(num_workers), int(batch_size), *(float(v) for v in values))


class Model(NamedTuple):
  """Scavenger's fitted models (Eqs. 6–10); see the module docstring.

  Attributes:
    c0: compute_s intercept, seconds.
    c1: compute_s per example of the per-worker batch b = B/K, seconds.
    s0: sync_s intercept, seconds.
    s1: sync_s per worker, seconds.
    other_s: the step's remainder, mean of step_s − compute_s − sync_s, seconds.
    g0: γ/K intercept.
    g1: γ/K slope in 1/√B (units √examples).
    e_star: e*, epochs at zero noise.
    theta: θ, epochs per unit of γ/K.
  """

  c0: float
  c1: float
  s0: float
  s1: float
  other_s: float
  g0: float
  g1: float
  e_star: float
  theta: float

  def step_s(self, num_workers: int, batch_size: int) -> float:
    """τ = c0 + c1 · B/K + s0 + s1 · K + other_s, seconds."""
    _check_config(num_workers, batch_size)
    return (
      self.c0 + self.c1 * batch_size / num_workers + self.s0 + self.s1 * num_workers + self.other_s
    )

  def gamma_normalized(self, batch_size: int) -> float:
    """γ/K = g0 + g1 / √B."""
    return self.g0 + self.g1 / math.sqrt(batch_size)

  def epochs(self, gamma_norm: float) -> float:
    """e = e* + θ · γ/K."""
    return self.e_star + self.theta * gamma_norm

  def predict(
    self, num_workers: int, batch_size: int, dataset_size: int, price_per_hour: float
  ) -> Prediction:
    """Predicted time (seconds) and cost (price per worker-hour × worker-hours) of (K, B).

    Args:
      num_workers: K.
      batch_size: the global batch B, in examples.
      dataset_size: D, examples per epoch.
      price_per_hour: p, the price of one worker for one hour.

    Returns:
      The `Prediction`: T = (e · D / B) · τ seconds, C = T / 3600 · K · p.

    Example:
      >>> m = Model(c0=0.1, c1=0.01, s0=0.04, s1=0.025, other_s=0.0,
      ...           g0=0.5, g1=2.0, e_star=2.0, theta=8.0)
      >>> p = m.predict(4, 64, dataset_size=6400, price_per_hour=0.9)
      >>> round(p.step_s, 9)  # 0.1 + 0.01 · 16 + 0.04 + 0.025 · 4
      0.4
      >>> p.gamma_normalized, p.epochs, p.steps  # 0.5 + 2/8; 2 + 8 · 0.75; 8 · 6400/64
      (0.75, 8.0, 800.0)
      >>> round(p.time_s, 9), round(p.cost, 9)  # 800 · 0.4 s; 320/3600 h · 4 · 0.9
      (320.0, 0.32)
    """
    _check_config(num_workers, batch_size)
    gamma_norm = self.gamma_normalized(batch_size)
    return _predict(
      num_workers,
      batch_size,
      self.step_s(num_workers, batch_size),
      gamma_norm,
      self.epochs(gamma_norm),
      dataset_size,
      price_per_hour,
    )


def _check_config(num_workers: int, batch_size: int) -> None:
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  if batch_size < num_workers:
    raise ValueError(
      f'batch_size must be >= num_workers ({num_workers}) examples, got {batch_size}'
    )


def _affine(x: np.ndarray, y: np.ndarray, what: str, need: str) -> tuple[float, float]:
  """Least squares y ≈ a + b·x; raises unless x takes two distinct values at least."""
  distinct = np.unique(x)
  if distinct.size < 2:
    raise ValueError(
      f'cannot fit {what} (an intercept and a slope): {need}; got only {distinct.tolist()}'
    )
  design = np.stack([np.ones_like(x), x], axis=1)
  (a, b), _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
  if rank < 2:  # distinct values this close: numerically one point
    raise ValueError(f'cannot fit {what}: the values {distinct.tolist()} are too close; {need}')
  return float(a), float(b)


def _profiles(profiles: Iterable[Sequence[float]]) -> list[Profile]:
  rows = [Profile(*p) for p in profiles]
  if not rows:
    raise ValueError('profiles is empty')
  for p in rows:
    _check_config(p.num_workers, p.batch_size)
    values = (p.step_s, p.compute_s, p.sync_s, p.gamma_normalized)
    if not all(math.isfinite(v) and v >= 0 for v in values) or p.step_s <= 0:
      raise ValueError(
        f'a profile needs finite times >= 0 (step_s > 0) and γ/K >= 0, got {tuple(p)}'
      )
  return rows


def _target_runs(runs: Iterable[Sequence[float]]) -> list[TargetRun]:
  rows = [TargetRun(*r) for r in runs]
  for r in rows:
    if not (math.isfinite(r.gamma_normalized) and math.isfinite(r.epochs) and r.epochs > 0):
      raise ValueError(f'a target run needs finite γ/K and epochs > 0, got {tuple(r)}')
  return rows


def fit_epochs(runs: Iterable[Sequence[float]]) -> tuple[float, float]:
  """(e*, θ) of e = e* + θ · γ/K from (γ/K, epochs) of runs to the target (Eq. 6)."""
  rows = _target_runs(runs)
  return _affine(
    np.array([r.gamma_normalized for r in rows], float),
    np.array([r.epochs for r in rows], float),
    'epochs = e* + θ·γ/K',
    'train at least two configurations with different γ/K to the target',
  )


def fit_noise(profiles: Iterable[Sequence[float]]) -> tuple[float, float]:
  """(g0, g1) of γ/K = g0 + g1 / √B, over the profiles of every K (Eq. 7, the "average model").

  Example:
    >>> rows = [(2, 16, 0.5, 0.3, 0.2, 1.0), (4, 64, 0.5, 0.3, 0.2, 0.75)]  # 0.5 + 2/√B
    >>> [round(g, 9) for g in fit_noise(rows)]
    [0.5, 2.0]
  """
  rows = _profiles(profiles)
  return _affine(
    1 / np.sqrt(np.array([p.batch_size for p in rows], float)),
    np.array([p.gamma_normalized for p in rows], float),
    'γ/K = g0 + g1/√B',
    'profile at least two global batches B',
  )


def fit(profiles: Iterable[Sequence[float]], runs: Iterable[Sequence[float]]) -> Model:
  """Fits Scavenger's affine models (Eqs. 6–10) by least squares.

  Args:
    profiles: rows (K, B, step_s, compute_s, sync_s, γ/K), see `Profile`; they
      must span two K, two per-worker batches B/K and two B at least.
    runs: rows (γ/K, epochs to the target), see `TargetRun`; two different γ/K
      at least.

  Returns:
    The fitted `Model`.

  Example:
    >>> compute = lambda k, b: 0.1 + 0.01 * b / k
    >>> sync = lambda k: 0.04 + 0.025 * k
    >>> rows = [(k, b, compute(k, b) + sync(k), compute(k, b), sync(k), 0.5 + 2 / b**0.5)
    ...         for k, b in [(2, 16), (4, 64)]]
    >>> m = fit(rows, runs=[(1.0, 10.0), (0.75, 8.0)])
    >>> [round(v, 9) for v in m]
    [0.1, 0.01, 0.04, 0.025, 0.0, 0.5, 2.0, 2.0, 8.0]
  """
  rows = _profiles(profiles)
  k = np.array([p.num_workers for p in rows], float)
  b = np.array([p.batch_size for p in rows], float)
  c0, c1 = _affine(
    b / k,
    np.array([p.compute_s for p in rows], float),
    'compute_s = c0 + c1·B/K',
    'profile at least two per-worker batches B/K',
  )
  s0, s1 = _affine(
    k,
    np.array([p.sync_s for p in rows], float),
    'sync_s = s0 + s1·K',
    'profile at least two K (numbers of workers)',
  )
  g0, g1 = fit_noise(rows)
  other_s = float(np.mean([p.step_s - p.compute_s - p.sync_s for p in rows]))
  e_star, theta = fit_epochs(runs)
  return Model(c0, c1, s0, s1, other_s, g0, g1, e_star, theta)


# ---------------------------------------------------------------------------------------------
# Search


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
