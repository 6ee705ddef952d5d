"""The compressor interface: pure encode / decode with fixed-shape payloads.

A compressor knows nothing of communication. It maps a flat float32 vector of
static length n to a payload (a tuple of fixed-shape arrays: what a worker
would put on the wire) and back. Its wire size is *derived* from the
payload's shapes and dtypes (`wire_bytes`), so it cannot drift from what is
really sent.

Class attributes tell the collectives what they may do with a payload:
`summable` payloads can be added elementwise across workers before decoding
(an all-reduce); others are gathered and decoded one by one. `sparse`
payloads are (values, indices) pairs, which AR-compatible Top-k can use.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

Payload = tuple[jax.Array, ...]


@dataclasses.dataclass(frozen=True)
class Compressor:
  """Base class; subclasses are frozen dataclasses of their hyper-parameters."""

  name: ClassVar[str] = 'compressor'
  summable: ClassVar[bool] = False  # decode(sum of payloads) == sum of decodes
  sparse: ClassVar[bool] = False  # payload == (values[k], int32 indices[k])
  unbiased: ClassVar[bool] = False  # E[decode(encode(x))] == x
  stochastic: ClassVar[bool] = False  # encode uses its key
  shared_randomness: ClassVar[bool] = False  # every worker must use the same key

  def check(self, n: int) -> None:
    """Raises ValueError if the compressor cannot handle vectors of length n."""
    del n

  def init(self, n: int) -> Any:
    """Compressor state for vectors of length n (e.g. nothing, or a warm start)."""
    del n
    return ()

  def encode(self, x: jax.Array, state: Any, key: jax.Array) -> tuple[Payload, Any]:
    """(payload, new state) for the float32 vector x."""
    raise NotImplementedError

  def decode(self, payload: Payload, state: Any, n: int) -> jax.Array:
    """The float32 vector of length n that `payload` stands for."""
    raise NotImplementedError

  def wire_bytes(self, n: int) -> int:
    """Exact bytes of the payload for a vector of length n."""
    shapes = jax.eval_shape(
      lambda: self.encode(jnp.zeros((n,), jnp.float32), self.init(n), jax.random.key(0))[0]
    )
    return sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(shapes))

  def roundtrip(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """decode(encode(x)) on one worker, from a fresh state (for tests and studies)."""
    key = jax.random.key(0) if key is None else key
    state = self.init(x.size)
    payload, state = self.encode(x, state, key)
    return self.decode(payload, state, x.size)


def check_ratio(ratio: float) -> None:
  if not 0 < ratio <= 1:
    raise ValueError(f'ratio must be in (0, 1], got {ratio}')


def num_kept(n: int, ratio: float) -> int:
  """k = max(1, floor(n * ratio)): how many of n elements a sparsifier keeps."""
  return max(1, int(n * ratio))


# --- bit packing: low-bit payloads travel as uint8 -----------------------------


def pack_bits(values: jax.Array, bits: int) -> jax.Array:
  """Packs unsigned integers < 2**bits (bits in 1, 2, 4, 8) into uint8, little end first."""
  if bits not in (1, 2, 4, 8):
    raise ValueError(f'bits must be 1, 2, 4 or 8, got {bits}')
  values = values.astype(jnp.uint8)
  if bits == 8:
    return values
  per_byte = 8 // bits
  pad = (-values.size) % per_byte
  v = jnp.pad(values, (0, pad)).reshape(-1, per_byte)
  shifts = jnp.arange(per_byte, dtype=jnp.uint8) * bits
  return jnp.sum(v << shifts, axis=1, dtype=jnp.uint8)


def unpack_bits(packed: jax.Array, bits: int, n: int) -> jax.Array:
  """Inverse of `pack_bits`: the first n values, as uint8."""
  if bits == 8:
    return packed[:n]
  per_byte = 8 // bits
  shifts = jnp.arange(per_byte, dtype=jnp.uint8) * bits
  mask = jnp.uint8((1 << bits) - 1)
  return ((packed[:, None] >> shifts) & mask).reshape(-1)[:n]


def bits_for(levels: int) -> int:
  """Smallest of 1, 2, 4, 8 bits that holds `levels` distinct values."""
  for bits in (1, 2, 4, 8):
    if levels <= 1 << bits:
      return bits
  raise ValueError(f'{levels} levels do not fit in 8 bits')


def buckets(x: jax.Array, size: int | None) -> jax.Array:
  """x reshaped to [num_buckets, size], zero-padded (one bucket if size is None)."""
  if size is None or size >= x.size:
    return x.reshape(1, -1)
  pad = (-x.size) % size
  return jnp.pad(x, (0, pad)).reshape(-1, size)
