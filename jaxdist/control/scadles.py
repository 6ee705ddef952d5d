"""ScaDLES's compress-or-not rule (Tyagi & Swany, BigData 2022, §IV-D).

Each worker keeps EWMAs of its ‖w‖² and of its ‖Top-k(w)‖²; the workers vote
to compress when |‖w‖² − ‖Top-k(w)‖²| / ‖w‖² ≤ δ on those averages, and the
step sends Top-k(w) if more than half of them vote so (the authors' code
lets half suffice), dense otherwise. Which step the decision applies to, and
what a dense step does to the residual, is the trainer's
(`jaxdist.control.ratio.scadles_control`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxdist.control.ewma import ewma


class ScaDLESState(NamedTuple):
  """State of `scadles_compression`.

  Attributes:
    sums: [K, 2] float64, each worker's EWMA of ‖w‖² and of ‖Top-k(w)‖²
      (NaN: none yet).
  """

  sums: np.ndarray


class ScaDLES(NamedTuple):
  """ScaDLES's rule: `init()` and `update(state, sq_norms, kept) -> (state, compress)`.

  Attributes:
    init: `() -> ScaDLESState`.
    update: `(state, sq_norms [K], kept [K]) -> (state, compress)`.
  """

  init: Callable[[], ScaDLESState]
  update: Callable[[ScaDLESState, np.ndarray, np.ndarray], tuple[ScaDLESState, bool]]


def scadles_compression(num_workers: int, *, delta: float = 0.3, decay: float = 0.9) -> ScaDLES:
  """The rule as (init, update): update(state, sq_norms [K], kept [K]) -> (state, compress).

  `kept` is each worker's ‖Top-k(w)‖² / ‖w‖² (its compression gain).
  `compress` is true when more than half the workers' EWMA signals
  |‖w‖² − ‖Top-k(w)‖²| / ‖w‖² are within δ.

  Args:
    num_workers: K.
    delta: δ, in [0, 1].
    decay: the EWMAs' decay, in [0, 1).

  Returns:
    `ScaDLES(init, update)`.

  >>> rule = scadles_compression(3, delta=0.3, decay=0.5)
  >>> sq = np.array([1.0, 2.0, 1.0])
  >>> state, compress = rule.update(rule.init(), sq, np.array([0.8, 0.6, 0.75]))
  >>> compress  # signals 0.2, 0.4, 0.25: two of three are within δ
  True
  """
  if not 0.0 <= delta <= 1.0:
    raise ValueError(f'delta must be in [0, 1], got {delta}')
  if not 0.0 <= decay < 1.0:
    raise ValueError(f'decay must be in [0, 1), got {decay}')

  def init() -> ScaDLESState:
    return ScaDLESState(np.full((num_workers, 2), np.nan))

  def update(state: ScaDLESState, sq_norms, kept) -> tuple[ScaDLESState, bool]:
    total = np.asarray(sq_norms, np.float64)  # float64, as a checkpoint restores it
    new = np.stack([total, np.asarray(kept) * total], axis=1)
    sums = ewma(state.sums, new, decay)
    total, kept_sq = sums[:, 0], sums[:, 1]
    signal = np.abs(total - kept_sq) / np.maximum(total, 1e-30)
    votes = int(np.sum(signal <= delta))
    return ScaDLESState(sums), votes > num_workers / 2

  return ScaDLES(init, update)
