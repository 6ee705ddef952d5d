"""Scavenger's gradient noise γ (Eq. 2) and McCandlish's simple noise scale.

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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxdist.control.ewma import ewma


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
  """A host-side meter of Scavenger's γ: `init()` and `update(state, worker_sq, mean_sq)`.

  Attributes:
    init: `() -> NoiseMeterState`.
    update: `(state, worker_sq, mean_sq) -> NoiseMeterState`, one
      measurement of `noise_terms`.
  """

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

  Args:
    state: the meter's state, after one update at least.

  Returns:
    γ, a float: inf when the smoothed ‖ḡ‖² is 0 while the workers' is not,
    and NaN when both are 0.

  Raises:
    ValueError: if nothing was measured yet.
  """
  if state.count < 1:
    raise ValueError('gamma needs at least one measurement (state.count is 0)')
  if state.mean_sq == 0:
    return math.inf if state.worker_sq > 0 else math.nan
  return state.worker_sq / state.mean_sq


def gamma_normalized(state: NoiseMeterState, num_workers: int) -> float:
  """γ/K, >= 1/K (at most 1 in expectation with i.i.d. batches): what the models use.

  Args:
    state: the meter's state.
    num_workers: K.

  Returns:
    γ/K, a float.
  """
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  return gamma(state) / num_workers


def simple_noise_scale(state: NoiseMeterState, num_workers: int, global_batch: int) -> float:
  """McCandlish's simple noise scale B_simple = B · (γ − 1) / (K − γ), in examples.

  From per-worker batches b = B/K and the global batch B. γ ≥ K (noise
  dominates at both sizes) gives inf; γ ≤ 1 gives 0 or less; K = 1 cannot
  estimate it (NaN).

  Args:
    state: the meter's state.
    num_workers: K.
    global_batch: B, in examples (>= K).

  Returns:
    B_simple in examples, a float.

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
