"""The exponentially weighted moving average every controller here smooths with."""

from __future__ import annotations

import numpy as np


def ewma(previous, new, decay: float):
  """decay · previous + (1 − decay) · new; `new` itself where there is no previous value.

  No previous value is None (nothing seen yet) or, element by element, NaN.
  Scalars stay Python floats; arrays are NumPy arrays.

  Args:
    previous: the average so far: None, a float, or an array (NaN: none).
    new: the new value, of the same shape.
    decay: the weight of `previous`, in [0, 1).

  Returns:
    The new average.

  >>> ewma(None, 4.0, 0.5), ewma(2.0, 4.0, 0.5)
  (4.0, 3.0)
  >>> ewma(np.array([np.nan, 2.0]), np.array([4.0, 4.0]), 0.5).tolist()
  [4.0, 3.0]
  """
  if previous is None:
    return new
  smoothed = decay * previous + (1 - decay) * new
  if isinstance(previous, np.ndarray):
    return np.where(np.isnan(previous), new, smoothed)
  return smoothed
