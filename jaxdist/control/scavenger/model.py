"""Scavenger's time and cost models (Eqs. 3–10), fitted to profiles and runs to the target.

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

SECONDS_PER_HOUR = 3600.0


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
    """τ = c0 + c1 · B/K + s0 + s1 · K + other_s, seconds.

    Args:
      num_workers: K.
      batch_size: B, the global batch.

    Returns:
      τ in seconds.
    """
    _check_config(num_workers, batch_size)
    return (
      self.c0 + self.c1 * batch_size / num_workers + self.s0 + self.s1 * num_workers + self.other_s
    )

  def gamma_normalized(self, batch_size: int) -> float:
    """γ/K = g0 + g1 / √B.

    Args:
      batch_size: B, the global batch.

    Returns:
      γ/K.
    """
    return self.g0 + self.g1 / math.sqrt(batch_size)

  def epochs(self, gamma_norm: float) -> float:
    """e = e* + θ · γ/K.

    Args:
      gamma_norm: γ/K.

    Returns:
      e, epochs to the target.
    """
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
  """(e*, θ) of e = e* + θ · γ/K from (γ/K, epochs) of runs to the target (Eq. 6).

  Args:
    runs: `TargetRun`s, or tuples of their fields; two distinct γ/K at least.

  Returns:
    (e*, θ), by least squares.
  """
  rows = _target_runs(runs)
  return _affine(
    np.array([r.gamma_normalized for r in rows], float),
    np.array([r.epochs for r in rows], float),
    'epochs = e* + θ·γ/K',
    'train at least two configurations with different γ/K to the target',
  )


def fit_noise(profiles: Iterable[Sequence[float]]) -> tuple[float, float]:
  """(g0, g1) of γ/K = g0 + g1 / √B, over the profiles of every K (Eq. 7, the "average model").

  Args:
    profiles: `Profile`s, or tuples of their fields; two distinct B at least.

  Returns:
    (g0, g1), by least squares.

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
