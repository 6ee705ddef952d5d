"""ADOPT's fitted curves of the kept fraction c (Eq. 6, as in the authors' code).

  t_sync(c) = v2 · exp(v1 · c) − 1                                   (ms)
  gain(c) = (e^{v1 c} − e^{−v2 c} + v5) / (e^{v3 c} + e^{−v4 c} + v6)

`fit_comm_time` fits the first to the modelled communication of the
candidates; `fit_gain` the second to the explored gains plus the anchors
(0, 0) and (1, 1). scipy's curve_fit gets up to 20000 evaluations (its
default for 6 parameters: 1400).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

_MAXFEV = 20000


def _comm_curve(x, v1, v2):
  return v2 * np.exp(v1 * x) - 1.0


def _gain_curve(x, v1, v2, v3, v4, v5, v6):
  return (np.exp(v1 * x) - np.exp(-v2 * x) + v5) / (np.exp(v3 * x) + np.exp(-v4 * x) + v6)


_CURVES = {'comm_ms': _comm_curve, 'gain': _gain_curve}


class Fit(NamedTuple):
  """A fitted curve of the ratio; `fit(ratio)` evaluates it (scalar or array).

  Attributes:
    kind: 'comm_ms' (v2 · exp(v1 · c) − 1) or 'gain' (the rational tanh-like).
    params: (v1, v2) or (v1, ..., v6), Python floats.
  """

  kind: str
  params: tuple[float, ...]

  def __call__(self, ratio):
    return _CURVES[self.kind](np.asarray(ratio, float), *self.params)


def _points(ratios, values, name: str, n_params: int, extra: int = 0):
  x, y = np.asarray(ratios, float), np.asarray(values, float)
  if x.ndim != 1 or x.shape != y.shape:
    raise ValueError(
      f'ratios and {name} must be vectors of one length, got shapes {x.shape}, {y.shape}'
    )
  if x.size + extra < n_params:
    raise ValueError(
      f'ratios: the {name} fit has {n_params} parameters and needs at least '
      f'{n_params - extra} points, got {x.size}'
    )
  if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
    raise ValueError(f'ratios and {name} must be finite, got {x.tolist()}, {y.tolist()}')
  if x.min() <= 0 or x.max() >= 1 or np.unique(x).size != x.size:
    raise ValueError(f'ratios must be distinct and in (0, 1), got {x.tolist()}')
  return x, y


def _curve_fit(kind: str, x, y) -> Fit:
  from scipy.optimize import OptimizeWarning, curve_fit

  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', OptimizeWarning)
      warnings.simplefilter('ignore', RuntimeWarning)
      params, _ = curve_fit(_CURVES[kind], x, y, maxfev=_MAXFEV)
  except RuntimeError as e:
    raise ValueError(f'the {kind} fit did not converge: {e}') from None
  fit = Fit(kind, tuple(float(p) for p in params))
  if not (np.all(np.isfinite(params)) and np.all(np.isfinite(fit(x)))):
    raise ValueError(f'the {kind} fit did not converge: parameters {fit.params}')
  return fit


def fit_comm_time(ratios: Sequence[float], ms: Sequence[float]) -> Fit:
  """Fits t(c) = v2 · exp(v1 · c) − 1 to communication times in milliseconds.

  Args:
    ratios: kept fractions in (0, 1), distinct, at least two.
    ms: the communication time of each, in milliseconds (the "− 1" makes the
      unit matter).

  Returns:
    A `Fit` of kind 'comm_ms'.

  Raises:
    ValueError: too few or invalid points, or no convergence.

  Example:
    >>> import math
    >>> fit = fit_comm_time([0.1, 0.01, 0.001], [2 * math.exp(2.0) - 1, 2 * math.exp(0.2) - 1,
    ...                                          2 * math.exp(0.02) - 1])
    >>> [round(p, 6) for p in fit.params]  # v1 = 20, v2 = 2
    [20.0, 2.0]
  """
  x, y = _points(ratios, ms, 'ms', 2)
  return _curve_fit('comm_ms', x, y)


def fit_gain(ratios: Sequence[float], gains: Sequence[float]) -> Fit:
  """Fits the rational tanh-like gain curve, anchored with (0, 0) and (1, 1).

  g(c) = (e^{v1 c} − e^{−v2 c} + v5) / (e^{v3 c} + e^{−v4 c} + v6). Its six
  parameters are not identifiable from a few points (different ones draw
  the same curve); the curve is what counts.

  Args:
    ratios: kept fractions in (0, 1), distinct, at least four (four plus the
      two anchors for six parameters).
    gains: the measured compression gain of each (‖C(g)‖ / ‖g‖, in [0, 1]).

  Returns:
    A `Fit` of kind 'gain'.

  Raises:
    ValueError: too few or invalid points, or no convergence (flat gains do
      not converge).
  """
  x, y = _points(ratios, gains, 'gains', 6, extra=2)
  return _curve_fit('gain', np.r_[x, 1.0, 0.0], np.r_[y, 1.0, 0.0])
