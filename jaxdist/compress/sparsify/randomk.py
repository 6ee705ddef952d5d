"""Random-k: k positions drawn from a key every worker shares, so payloads sum."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxdist.compress.base import Compressor, check_ratio, num_kept
from jaxdist.compress.sparsify.base import scatter


@dataclasses.dataclass(frozen=True)
class RandomK(Compressor):
  """k elements at random positions, the same positions on every worker.

  Positions are drawn with replacement from a key that all workers share, so
  only the values travel and payloads can be summed (all-reduce). With
  `rescale` (the default), values are scaled by n/k, which makes
  decode(encode(x)) an unbiased estimate of x; without it, use error feedback.

  Attributes:
    ratio: the fraction of elements sent, in (0, 1]: k = max(1, ⌊n·ratio⌋).
    rescale: scale the values by n/k (unbiased).

  Reference: Stich, Cordonnier, Jaggi. Sparsified SGD with Memory. NeurIPS
  2018. https://arxiv.org/abs/1809.07599
  """

  ratio: float = 0.01
  rescale: bool = True
  name: ClassVar[str] = 'randomk'
  summable: ClassVar[bool] = True
  stochastic: ClassVar[bool] = True
  shared_randomness: ClassVar[bool] = True

  def __post_init__(self):
    check_ratio(self.ratio)

  @property
  def unbiased(self) -> bool:  # type: ignore[override]
    return self.rescale

  def init(self, n):
    return jnp.zeros((num_kept(n, self.ratio),), jnp.int32)  # positions of the last encode

  def encode(self, x, state, key):
    n = x.size
    k = num_kept(n, self.ratio)
    idx = jax.random.randint(key, (k,), 0, n, dtype=jnp.int32)
    scale = n / k if self.rescale else 1.0
    return (x[idx] * scale,), idx

  def decode(self, payload, state, n):
    (values,) = payload
    return scatter(values, state, n)
