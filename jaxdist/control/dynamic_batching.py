"""Dynamic batching for heterogeneous workers (Tyagi & Sharma, ACSOS 2020).

Worker k trains on b_k of the global batch G = Σ_k b_k, so that slow and fast
workers finish their iterations together; gradients are then averaged with
weights b_k / G (`jaxdist.sync.weighted.weighted_allreduce`, Eqs. 2–3).
Host-side and pure NumPy: the trainer feeds each step's per-worker iteration
times in and reads the batches out; the device step never recompiles, since
every worker holds b_max examples and a count (`jaxdist.models.masked`).

Static (open-loop) allocation, §III-B: b_k ∝ X_k, a throughput estimate (CPU
cores, FLOPs): `allocate(G, X, b_min, b_max)`.

Proportional controller, Eqs. 4–5: with µ_k the EWMA of worker k's
iteration times since the last adjustment and t̄ = mean_k µ_k,

  b_k ← b_k − X_k (µ_k − t̄) = b_k · t̄ / µ_k,   X_k = b_k / µ_k (measured throughput).

Departures from the paper, after the check in research/ALGORITHMS.md §3.3:

- b_k · t̄ / µ_k alone does not keep Σ b = G. The candidates are scaled by one
  common factor to sum to G, which makes them G · X_k / Σ_j X_j: the static
  allocation with measured throughputs. Then `allocate` applies the bounds by
  water-filling (a clipped worker's excess goes to the unclipped ones in
  proportion to X) and rounds to integers by largest remainder (ties to the
  lower worker index). Σ b = G and b_min ≤ b_k ≤ b_max hold after every
  adjustment. (OmniLearn's code adds the clipped excess equally to every
  worker and restores G additively, which can give negative batches.)
- Dead-band: no change while every |µ_k − t̄| / t̄ ≤ `deadband` (5%). The
  paper tests |Δb_k| / b_k = |t̄ − µ_k| / µ_k, the same to first order.
- The decision is taken every `interval` iterations. µ restarts after an
  adjustment (the times of the old batches say nothing of the new ones) and
  keeps averaging after a decision that changes nothing.
- Not implemented: lowering b_max when throughput drops after raising b.

Noise-free, iteration times proportional to the batch equalise in one
adjustment (H2 cores (9, 12, 18), G = 96: batches (22, 30, 44); H10 (2, 17,
20): (5, 42, 49)); with a fixed cost per iteration, in about two.

Reference: Tyagi & Sharma. Taming Resource Heterogeneity In Distributed ML
Training With Dynamic Batching. IEEE ACSOS 2020, pp. 188–194.
https://sahiltyagi4.github.io/files/resource_taming.pdf
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from jaxdist.control.ewma import ewma


def _bounds(global_batch: int, num_workers: int | None, b_min: int, b_max: int | None) -> int:
  """Checks the bounds (against G and K, given K); returns b_max (default G)."""
  b_max = global_batch if b_max is None else b_max
  if b_min < 1:
    raise ValueError(f'b_min must be >= 1, got {b_min}')
  if b_min > b_max:
    raise ValueError(f'b_min must be <= b_max, got b_min={b_min} > b_max={b_max}')
  if num_workers is not None and not num_workers * b_min <= global_batch <= num_workers * b_max:
    raise ValueError(
      f'global_batch {global_batch} cannot be split over {num_workers} workers within '
      f'[b_min, b_max] = [{b_min}, {b_max}]: it must be in '
      f'[{num_workers * b_min}, {num_workers * b_max}]'
    )
  return b_max


def _units(global_batch: int, b_min: int, b_max: int | None, multiple: int) -> tuple[int, ...]:
  """(G, b_min, b_max) in units of `multiple` examples; raises where G is not a multiple."""
  if multiple < 1 or global_batch % multiple:
    raise ValueError(
      f'the global batch {global_batch} must be a multiple of multiple={multiple} (>= 1): '
      'every worker trains whole micro-batches'
    )
  b_max = global_batch if b_max is None else b_max
  if b_max < multiple:
    raise ValueError(f'b_max={b_max} holds no whole micro-batch of multiple={multiple} examples')
  return global_batch // multiple, -(-b_min // multiple), b_max // multiple


def allocate(
  global_batch: int,
  weights: Sequence[float],
  b_min: int = 1,
  b_max: int | None = None,
  multiple: int = 1,
) -> np.ndarray:
  """Integer batches ∝ `weights`, summing to `global_batch`, each in [b_min, b_max].

  Water-filling: x_k = clip(λ · w_k, b_min, b_max) with λ such that Σ x = G
  (a worker at a bound hands its excess to the others in proportion to their
  weights); then floors, and the G − Σ floor(x) examples left go one each to
  the largest remainders x_k − floor(x_k) among workers below b_max (ties to
  the lower index).

  Args:
    global_batch: G, the examples per step over all workers.
    weights: [K] throughputs (> 0), e.g. cores, FLOPs or measured examples/s.
    b_min: the smallest batch of a worker (>= 1).
    b_max: the largest (default G), e.g. what fits in a worker's memory.
    multiple: every batch is a multiple of it (micro-batches of that many
      examples, `make_train_step(micro_batch=...)`): the allocation is made
      in its units, of G / multiple, within [⌈b_min / multiple⌉,
      ⌊b_max / multiple⌋]; G must be a multiple of it.

  Returns:
    [K] int64 batches.

  Example:
    >>> allocate(96, (2, 17, 20))  # the H10 cluster's cores
    array([ 5, 42, 49])
    >>> allocate(12, (1, 1, 10), b_max=6)
    array([3, 3, 6])
    >>> allocate(96, (2, 17, 20), multiple=8)
    array([ 8, 40, 48])
  """
  if multiple != 1:
    units = _units(global_batch, b_min, b_max, multiple)
    return allocate(*units[:1], weights, *units[1:]) * multiple
  w = np.asarray(weights, float)
  if w.ndim != 1 or not w.size:
    raise ValueError(f'weights must be a non-empty vector, got shape {w.shape}')
  if not np.all(np.isfinite(w)) or w.min() <= 0:
    raise ValueError(f'weights must all be finite and > 0, got {w.tolist()}')
  b_max = _bounds(global_batch, w.size, b_min, b_max)
  w = w / w.max()
  fill = lambda lam: np.clip(lam * w, b_min, b_max)
  lo, hi = 0.0, b_max / w.min()  # Σ fill(lo) = K b_min <= G <= K b_max = Σ fill(hi)
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if fill(mid).sum() < global_batch else (lo, mid)
  x = fill(hi)
  b = np.clip(np.floor(x + 1e-9), b_min, b_max).astype(np.int64)
  order = np.argsort(-(x - b), kind='stable')  # largest remainder first
  while (short := global_batch - int(b.sum())) != 0:
    step = 1 if short > 0 else -1
    movable = [k for k in (order if step > 0 else order[::-1]) if b_min <= b[k] + step <= b_max]
    for k in movable[: abs(short)]:
      b[k] += step
  return b


class DynamicBatchingState(NamedTuple):
  """State of the dynamic-batching controller (host side).

  Attributes:
    batches: [K] int, each worker's batch now; Σ = the global batch.
    mean_s: [K] EWMA of each worker's iteration seconds since the last
      adjustment (NaN before the first observation).
    observed: iterations observed since the last decision.
    adjustments: how many decisions changed the batches.
  """

  batches: np.ndarray
  mean_s: np.ndarray
  observed: int
  adjustments: int


class DynamicBatching(NamedTuple):
  """A host-side controller: `init(num_workers, throughputs=None)` and `update(state, times)`.

  Attributes:
    init: `(num_workers, throughputs=None) -> DynamicBatchingState`, batches
      in proportion to `throughputs` (None: equal).
    update: `(state, times [K]) -> DynamicBatchingState`, one iteration's
      seconds per worker.
  """

  init: Callable[..., DynamicBatchingState]
  update: Callable[[DynamicBatchingState, Sequence[float]], DynamicBatchingState]


def dynamic_batching(
  global_batch: int,
  *,
  b_min: int = 1,
  b_max: int | None = None,
  deadband: float = 0.05,
  decay: float = 0.5,
  interval: int = 10,
  multiple: int = 1,
) -> DynamicBatching:
  """The proportional batch-size controller of Tyagi & Sharma (2020), Eqs. 4–5.

  See the module docstring for the rule and where it departs from the paper.

  Args:
    global_batch: G = Σ_k b_k, preserved by every adjustment.
    b_min: the smallest batch a worker gets (>= 1).
    b_max: the largest (default G); the static shape each worker holds.
    deadband: no change while every |µ_k − t̄| / t̄ is within it, in [0, 1).
    decay: EWMA weight of the past, µ ← decay · µ + (1 − decay) · t, in [0, 1).
    interval: iterations between decisions (>= 1).
    multiple: every batch is a multiple of it: micro-batches of that many
      examples, each worker computing only its own (`allocate`).

  Returns:
    `DynamicBatching(init, update)`. `init(num_workers, throughputs=None)`
    starts from equal batches, or from the static allocation ∝ `throughputs`;
    `update(state, times)` observes one iteration's [K] seconds and, every
    `interval` iterations, may change the batches.

  Example:
    >>> ctl = dynamic_batching(12, interval=1)
    >>> state = ctl.init(2)
    >>> state.batches
    array([6, 6])
    >>> state = ctl.update(state, [3.0, 1.0])  # worker 0 is 3x slower
    >>> state.batches  # X = (2, 6) examples/s: 12 · X / ΣX
    array([3, 9])
  """
  if global_batch < 1:
    raise ValueError(f'global_batch must be >= 1, got {global_batch}')
  _bounds(global_batch, None, b_min, b_max)
  units, unit_min, unit_max = _units(global_batch, b_min, b_max, multiple)
  _bounds(units, None, unit_min, unit_max)
  if not 0.0 <= deadband < 1.0:
    raise ValueError(f'deadband must be in [0, 1), got {deadband}')
  if not 0.0 <= decay < 1.0:
    raise ValueError(f'decay must be in [0, 1), got {decay}')
  if interval < 1:
    raise ValueError(f'interval must be >= 1, got {interval}')

  def init(num_workers: int, throughputs: Sequence[float] | None = None) -> DynamicBatchingState:
    if num_workers < 1:
      raise ValueError(f'num_workers must be >= 1, got {num_workers}')
    weights = np.ones(num_workers) if throughputs is None else np.asarray(throughputs, float)
    if weights.shape != (num_workers,):
      raise ValueError(
        f'throughputs must have one value per worker ({num_workers}), got shape {weights.shape}'
      )
    batches = allocate(global_batch, weights, b_min, b_max, multiple)
    return DynamicBatchingState(batches, np.full(num_workers, np.nan), 0, 0)

  def update(state: DynamicBatchingState, times: Sequence[float]) -> DynamicBatchingState:
    t = np.asarray(times, float)
    if t.shape != state.batches.shape:
      raise ValueError(
        f'times must have one value per worker ({state.batches.size}), got shape {t.shape}'
      )
    if not np.all(np.isfinite(t)) or t.min() <= 0:
      raise ValueError(f'times must all be finite and > 0 seconds, got {t.tolist()}')
    mean = ewma(state.mean_s, t, decay)
    observed = state.observed + 1
    if observed < interval:
      return state._replace(mean_s=mean, observed=observed)
    t_bar = mean.mean()
    if np.abs(mean - t_bar).max() <= deadband * t_bar:
      return state._replace(mean_s=mean, observed=0)
    batches = allocate(global_batch, state.batches / mean, b_min, b_max, multiple)
    if np.array_equal(batches, state.batches):  # the bounds or rounding allow no change
      return state._replace(mean_s=mean, observed=0)
    return DynamicBatchingState(batches, np.full_like(mean, np.nan), 0, state.adjustments + 1)

  return DynamicBatching(init, update)
