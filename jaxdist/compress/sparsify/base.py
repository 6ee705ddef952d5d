"""What the sparsifiers share: the payload's layout, `scatter` and `take`, and `_Sparsifier`.

Payloads have a fixed size k; where a method finds fewer than k elements, the
unused slots carry value 0 at index n (one past the end), which `scatter`
drops and `take` reads as 0, so padding never touches a real element.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxdist.compress.base import Compressor, Payload, check_ratio, num_kept


def scatter(values: jax.Array, indices: jax.Array, n: int) -> jax.Array:
  """The dense vector of length n with `values` added at `indices` (index n: dropped).

  Args:
    values: the values [k].
    indices: their int32 positions [k], n for a padding slot.
    n: the dense vector's length.

  Returns:
    [n] in `values`' dtype; values at a repeated index add up.
  """
  return jnp.zeros((n,), values.dtype).at[indices].add(values, mode='drop')


def take(x: jax.Array, indices: jax.Array) -> jax.Array:
  """x at `indices`; 0 where an index is n (a padding slot).

  Args:
    x: the dense vector [n].
    indices: int32 positions [k], n for a padding slot.

  Returns:
    [k] in x's dtype.
  """
  return x.at[indices].get(mode='fill', fill_value=0)


def _gather(x: jax.Array, idx: jax.Array, valid: jax.Array) -> Payload:
  idx = jnp.where(valid, idx, x.size).astype(jnp.int32)
  return take(x, idx), idx


@dataclasses.dataclass(frozen=True)
class _Sparsifier(Compressor):
  """Base of the (values, indices) compressors; `k` fixed from `ratio` or given."""

  ratio: float | None = None
  k: int | None = None
  sparse: ClassVar[bool] = True

  def __post_init__(self):
    if (self.ratio is None) == (self.k is None):
      raise ValueError(
        f'{self.name}: give exactly one of ratio and k, got ratio={self.ratio}, k={self.k}'
      )
    if self.ratio is not None:
      check_ratio(self.ratio)
    if self.k is not None and self.k < 1:
      raise ValueError(f'{self.name}: k must be >= 1, got {self.k}')

  def kept(self, n: int) -> int:
    return self.k if self.k is not None else num_kept(n, self.ratio)

  def check(self, n: int) -> None:
    if self.k is not None and self.k > n:
      raise ValueError(f'{self.name}: k={self.k} is larger than the tensor ({n} elements)')

  def decode(self, payload: Payload, state, n: int) -> jax.Array:
    del state
    values, indices = payload
    return scatter(values, indices, n)
