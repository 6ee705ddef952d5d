"""Threshold sparsification: every element at or above a magnitude, up to a capacity."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from jaxdist.compress.sparsify._scan import _compact
from jaxdist.compress.sparsify.base import _gather, _Sparsifier


@dataclasses.dataclass(frozen=True)
class Threshold(_Sparsifier):
  """Every element with |x| >= `tau`, up to a capacity of k (from `ratio` or `k`).

  Beyond capacity, the first k by position are sent; the rest wait in the
  error-feedback residual (GRACE pads threshold payloads the same way).

  Attributes:
    ratio: the capacity as a fraction of the elements, in (0, 1].
    k: the capacity in elements (give `ratio` or `k`, not both).
    tau: the magnitude threshold (>= 0).
  """

  tau: float = 0.0
  name: ClassVar[str] = 'threshold'

  def __post_init__(self):
    super().__post_init__()
    if self.tau < 0:
      raise ValueError(f'tau must be >= 0, got {self.tau}')

  def encode(self, x, state, key):
    del key
    idx, valid = _compact(jnp.abs(x) >= self.tau, self.kept(x.size))
    return _gather(x, idx, valid), state
