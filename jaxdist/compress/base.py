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
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

Payload = tuple[jax.Array, ...]


@dataclasses.dataclass(frozen=True)
class Compressor:
  """Base class; subclasses are frozen dataclasses of their hyper-parameters."""

  name: ClassVar[str] = 'compressor'
  summable: ClassVar[bool] = False  # decode(sum of payloads) == sum of decodes
  # payload == (values[k], int32 indices[k]), decode == their scatter; the indices are
  # distinct but for padding slots (index n, value 0): compressed_allreduce relies on it
  sparse: ClassVar[bool] = False
  unbiased: ClassVar[bool] = False  # E[decode(encode(x))] == x
  stochastic: ClassVar[bool] = False  # encode uses its key
  shared_randomness: ClassVar[bool] = False  # every worker must use the same key
  # the narrow float dtype a payload rounds to (casts): compressed_allreduce then scales each
  # block of `scale_block` elements by a power of two that every worker shares, so that it
  # fits (None: no scale)
  narrow_dtype: ClassVar[Any] = None
  scale_block: ClassVar[int | None] = None  # elements per shared scale; None: one per vector

  def check(self, n: int) -> None:
    """Raises ValueError if the compressor cannot handle vectors of length n.

    Args:
      n: the vector's length.
    """
    del n

  def init(self, n: int) -> Any:
    """Compressor state for vectors of length n (e.g. nothing, or a warm start).

    Args:
      n: the vector's length.

    Returns:
      The state `encode` and `decode` take (here `()`).
    """
    del n
    return ()

  def encode(self, x: jax.Array, state: Any, key: jax.Array) -> tuple[Payload, Any]:
    """(payload, new state) for the float32 vector x.

    Args:
      x: the float32 vector [n].
      state: the compressor's state (from `init`).
      key: a PRNG key, for stochastic compressors.

    Returns:
      (the payload, a tuple of fixed-shape arrays; the new state).
    """
    raise NotImplementedError

  def decode(self, payload: Payload, state: Any, n: int) -> jax.Array:
    """The float32 vector of length n that `payload` stands for.

    Args:
      payload: what `encode` gave (or, if `summable`, a sum of payloads).
      state: the compressor's state.
      n: the vector's length.

    Returns:
      The float32 vector [n].
    """
    raise NotImplementedError

  def wire_bytes(self, n: int) -> int:
    """Exact bytes of the payload for a vector of length n.

    Read off the payload's shapes (`jax.eval_shape` of `encode`), once per
    compressor and length: host-side controllers ask every step (ADOPT's
    cost model, for each candidate), and tracing Top-k's selection each
    time cost ~30 ms a call on the CPU.

    Args:
      n: the vector's length.

    Returns:
      The payload's bytes, a Python int.
    """
    try:
      hash(self)
    except TypeError:  # a field that cannot be hashed: not memoised
      return _payload_bytes.__wrapped__(self, n, jax.config.jax_enable_x64)
    return _payload_bytes(self, n, jax.config.jax_enable_x64)

  def roundtrip(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """decode(encode(x)) on one worker, from a fresh state (for tests and studies).

    Args:
      x: a float32 vector.
      key: the PRNG key for `encode` (None: `jax.random.key(0)`).

    Returns:
      The float32 vector the payload stands for, x's size.
    """
    key = jax.random.key(0) if key is None else key
    state = self.init(x.size)
    payload, state = self.encode(x, state, key)
    return self.decode(payload, state, x.size)


@functools.lru_cache(maxsize=4096)
def _payload_bytes(c: Compressor, n: int, x64: bool) -> int:
  """`Compressor.wire_bytes` (x64: JAX's 64-bit mode, which can change dtypes)."""
  del x64  # part of the memo's key only
  shapes = jax.eval_shape(
    lambda: c.encode(jnp.zeros((n,), jnp.float32), c.init(n), jax.random.key(0))[0]
  )
  return sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(shapes))


def check_ratio(ratio: float) -> None:
  """Raises ValueError unless 0 < ratio <= 1.

  Args:
    ratio: the fraction of elements a compressor keeps.
  """
  if not 0 < ratio <= 1:
    raise ValueError(f'ratio must be in (0, 1], got {ratio}')


def num_kept(n: int, ratio: float) -> int:
  """k = max(1, floor(n * ratio)): how many of n elements a sparsifier keeps.

  Args:
    n: the vector's length.
    ratio: the fraction kept, in (0, 1].

  Returns:
    k, a Python int.
  """
  return max(1, int(n * ratio))


# --- bit packing: low-bit payloads travel as uint8 -----------------------------


def pack_bits(values: jax.Array, bits: int) -> jax.Array:
  """Packs unsigned integers < 2**bits (bits in 1, 2, 4, 8) into uint8, little end first.

  Args:
    values: a 1-D array of integers in [0, 2**bits).
    bits: bits per value: 1, 2, 4 or 8.

  Returns:
    uint8 array [ceil(len(values) · bits / 8)]; value i sits in bits
    (i mod 8/bits) · bits upwards of byte i // (8/bits), zero-padded.

  Raises:
    ValueError: if `bits` is not 1, 2, 4 or 8.
  """
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
  """Inverse of `pack_bits`: the first n values, as uint8.

  Args:
    packed: the uint8 array `pack_bits` gave.
    bits: bits per value, as packed.
    n: how many values to return (the rest are padding).

  Returns:
    uint8 array [n].
  """
  if bits == 8:
    return packed[:n]
  per_byte = 8 // bits
  shifts = jnp.arange(per_byte, dtype=jnp.uint8) * bits
  mask = jnp.uint8((1 << bits) - 1)
  return ((packed[:, None] >> shifts) & mask).reshape(-1)[:n]


def bits_for(levels: int) -> int:
  """Smallest of 1, 2, 4, 8 bits that holds `levels` distinct values.

  Args:
    levels: how many distinct values.

  Returns:
    The bits, 1, 2, 4 or 8.

  Raises:
    ValueError: if more than 256 levels.
  """
  for bits in (1, 2, 4, 8):
    if levels <= 1 << bits:
      return bits
  raise ValueError(f'{levels} levels do not fit in 8 bits')


# --- coin flips for stochastic rounding -----------------------------------------

RNG_BITS = (8, 16, 32)
_CHUNK = 1 << 16  # 32-bit words per step of the loop that draws them
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> list[jax.Array]:
  """JAX's Threefry-2x32 hash (20 rounds), unrolled: equal to `jax.extend.random.threefry_2x32`.

  JAX lowers its own hash on the CPU as a 5-step loop over full-size
  temporaries (`use_rolled_loops`), several memory passes per draw; written
  out, XLA fuses the 20 rounds into one element-wise kernel.
  """
  ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
  x = [x0 + ks[0], x1 + ks[1]]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x[0] = x[0] + x[1]
      x[1] = x[0] ^ ((x[1] << jnp.uint32(r)) | (x[1] >> jnp.uint32(32 - r)))
    x[0] = x[0] + ks[(i + 1) % 3]
    x[1] = x[1] + ks[(i + 2) % 3] + jnp.uint32(i + 1)
  return x


def bernoulli(key: jax.Array, p: jax.Array, bits: int = 16, chunk: int | None = None) -> jax.Array:
  """Bernoulli(p) for each element of p in [0, 1], from `bits`-bit uniform integers.

  Element i is true when a uniform `bits`-bit integer u_i is below
  t_i = round(p_i · 2^bits), so P(true) = t_i / 2^bits: exactly 0 at p = 0,
  exactly 1 at p = 1, and within 2^-(bits+1) of p_i in between (the float
  path of `jax.random.bernoulli` compares 23-bit uniforms: within 2^-23).

  The integers are cut from 32-bit words, 32 / bits elements to a word;
  words 2j and 2j + 1 are the two halves of the Threefry-2x32 hash of the
  counter j (JAX's default PRNG function, unrolled in `threefry2x32`), keyed
  by two words drawn from `key`. On the CPU the words are drawn in a loop
  of `_CHUNK`-word steps, so they are materialised once: fused into an
  element-wise consumer, XLA would hash again for every element that reads
  a word. On a GPU they are drawn in one step: the loop's steps run one
  after the other as small kernels (an H100 took 4.5x a memory pass at 10M
  floats with the loop, against 1.1x for `jax.random.bernoulli`), and
  hashing again costs little there. The words, and so the coins, are the
  same for every chunk size.

  Not JAX's other key implementations (jax 0.10, CPU): `philox4x32` is no
  faster per word than this hash and its `mulhi` does not lower inside
  `shard_map` ("Unable to convert MHLO to StableHLO"); `rbg` / `unsafe_rbg`
  are as slow as the rolled threefry and, under `vmap` (simulated workers),
  draw every key's bits from the first key.

  Args:
    key: a PRNG key (typed, or a raw uint32 key of the default implementation).
    p: probabilities in [0, 1], any shape.
    bits: 8, 16 or 32 bits per comparison.
    chunk: 32-bit words per step of the drawing loop; None: `_CHUNK` on
      the CPU, all of them in one step on other backends.

  Returns:
    bool array of p's shape.
  """
  if bits not in RNG_BITS:
    raise ValueError(f'bits must be one of {RNG_BITS}, got {bits}')
  k0, k1 = jax.random.bits(key, (2,), jnp.uint32)
  per = 32 // bits  # elements per word
  flat = p.reshape(-1)
  num_words = -(-flat.size // per)
  if chunk is None:
    chunk = _CHUNK if jax.default_backend() == 'cpu' else num_words
  elif chunk < 1:
    raise ValueError(f'chunk must be >= 1 words, got {chunk}')
  half = -(-min(chunk, num_words) // 2)  # blocks per step: two words each

  def draw(step):
    counter_H = step * half + lax.iota(jnp.uint32, half)
    hi_H, lo_H = threefry2x32(k0, k1, counter_H, jnp.zeros_like(counter_H))
    word = lax.broadcasted_iota(jnp.int32, (half, 2), 1)
    return jnp.where(word == 0, hi_H[:, None], lo_H[:, None])  # both halves: words 2j, 2j + 1

  steps = jnp.arange(-(-num_words // (2 * half)), dtype=jnp.uint32)
  words_W = lax.map(draw, steps).reshape(-1)
  # element i reads bits [(i % per) * bits, ...) of word i // per; p is not padded or reshaped
  # (which would make XLA write it out once more)
  words_N = jnp.broadcast_to(words_W[:, None], (words_W.size, per)).reshape(-1)[: flat.size]
  if bits == 32:
    # p * 2^32 is exact in float32, and below 1 it is at most 2^32 - 256
    t_N = jnp.minimum(flat * 4294967296.0, 4294967040.0).astype(jnp.uint32)
    coin_N = (words_N < t_N) | (flat >= 1)
  else:
    shift_N = (lax.iota(jnp.uint32, flat.size) % per) * bits
    u_N = (words_N >> shift_N) & jnp.uint32((1 << bits) - 1)
    coin_N = u_N < jnp.floor(flat * float(1 << bits) + 0.5).astype(jnp.uint32)
  return coin_N.reshape(p.shape)


def buckets(x: jax.Array, size: int | None) -> jax.Array:
  """x reshaped to [num_buckets, size], zero-padded (one bucket if size is None).

  Args:
    x: a 1-D vector.
    size: elements per bucket (None, or at least x's size: one bucket of all).

  Returns:
    [ceil(n / size), size], the last bucket zero-padded; [1, n] for one.
  """
  if size is None or size >= x.size:
    return x.reshape(1, -1)
  pad = (-x.size) % size
  return jnp.pad(x, (0, pad)).reshape(-1, size)
