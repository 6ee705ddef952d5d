"""Quantisers: every element travels, in fewer bits.

Low-bit codes are bit-packed into uint8, so a QSGD 4-bit payload of n
elements is n/2 bytes on the wire (plus one float32 scale per bucket), and an
all-gather of it shows as a u8 all-gather in the HLO.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxdist.compress.base import (
  RNG_BITS,
  Compressor,
  bernoulli,
  bits_for,
  buckets,
  pack_bits,
  unpack_bits,
)


def _unbucket(b: jax.Array, n: int) -> jax.Array:
  return b.reshape(-1)[:n]


def _bucket_counts(n: int, size: int | None) -> jax.Array:
  """Number of real (unpadded) elements in each bucket."""
  if size is None or size >= n:
    return jnp.array([n], jnp.float32)
  full, rest = divmod(n, size)
  counts = [size] * full + ([rest] if rest else [])
  return jnp.array(counts, jnp.float32)


def _check_bucket(bucket_size):
  if bucket_size is not None and bucket_size < 1:
    raise ValueError(f'bucket_size must be >= 1 or None, got {bucket_size}')


def _per_element(v: jax.Array, size: int | None, n: int) -> jax.Array:
  """Each bucket's value in `v` repeated over the bucket's elements: [n]."""
  if size is None or size >= n:
    return jnp.broadcast_to(v, (n,))
  return jnp.broadcast_to(v[:, None], (v.size, size)).reshape(-1)[:n]


def _draw(key: jax.Array, p: jax.Array, rng_bits: int | None, size: int | None) -> jax.Array:
  """Bernoulli(p) over the flat p; rng_bits=None: `jax.random.bernoulli` per bucket."""
  if rng_bits is None:  # jax.random.bernoulli over the zero-padded [buckets, size] layout
    return _unbucket(jax.random.bernoulli(key, buckets(p, size)), p.size)
  return bernoulli(key, p, rng_bits)


def _check_rng_bits(rng_bits):
  if rng_bits is not None and rng_bits not in RNG_BITS:
    raise ValueError(f'rng_bits must be one of {RNG_BITS} or None, got {rng_bits}')


def with_rng_bits(c: QSGD | TernGrad, rng_bits: int | None) -> QSGD | TernGrad:
  """`c` with coins of `rng_bits` bits (8, 16 or 32), or None: `jax.random.bernoulli`.

  The coins' width is a class attribute, not a hyper-parameter (configs do not
  set it): this makes a subclass that overrides it, with `c`'s fields.

  Args:
    c: a `QSGD` or `TernGrad`.
    rng_bits: 8, 16 or 32, or None.

  Returns:
    An instance of a subclass of c's class (one per class and width), with
    c's fields.
  """
  return _rng_variant(type(c), rng_bits)(
    **{f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
  )


@functools.cache
def _rng_variant(cls: type, rng_bits: int | None) -> type:
  _check_rng_bits(rng_bits)
  return type(f'{cls.__name__}_rng{rng_bits}', (cls,), {'rng_bits': rng_bits})


@dataclasses.dataclass(frozen=True)
class Identity(Compressor):
  """No compression: the float32 vector itself."""

  name: ClassVar[str] = 'identity'
  summable: ClassVar[bool] = True
  unbiased: ClassVar[bool] = True

  def encode(self, x, state, key):
    del key
    return (x,), state

  def decode(self, payload, state, n):
    del state, n
    return payload[0]


_CASTS = {
  'bfloat16': (jnp.bfloat16, True),
  'float16': (jnp.float16, True),
  'float8_e4m3fn': (jnp.float8_e4m3fn, False),
  'float8_e5m2': (jnp.float8_e5m2, False),
}


@dataclasses.dataclass(frozen=True)
class Cast(Compressor):
  """Rounds to a narrower float: bfloat16 / float16 (summable) or float8 (gathered).

  Values are clipped to the format's finite range first, so a large gradient
  saturates instead of becoming inf. float8 sums are not taken on the wire (an
  all-reduce in 8 bits loses too much); they are gathered and summed in float32.

  `compressed_allreduce` multiplies each block of `block_size` elements by a
  power of two that every worker shares before the cast (`narrow_dtype`,
  `scale_block`), so that the clip is never reached, N payloads summed on the
  wire cannot overflow, and small gradients are not flushed to zero for being
  small, nor for sharing a vector with large ones: only what lies about the
  format's span below its own block's largest element is lost. The workers
  agree on the scales with one all-reduce of an int8 exponent per block.

  Attributes:
    dtype: 'bfloat16', 'float16', 'float8_e4m3fn' or 'float8_e5m2'.
    block_size: elements per shared scale under `compressed_allreduce`
      (None: one scale per vector). The default, 256 (the block of
      `jaxdist.sync.quantized_allreduce`), costs one byte per 256 elements:
      0.2% of a float16 payload, 0.4% of a float8 one. Smaller blocks buy
      little for float16, whose elements are lost only some 2^36 below their
      block's largest (8 workers on an all-reduce); more for float8, whose
      span is 2^17.8 (e4m3fn) or 2^31.8 (e5m2).
  """

  dtype: str = 'bfloat16'
  block_size: int | None = 256
  name: ClassVar[str] = 'cast'

  def __post_init__(self):
    if self.dtype not in _CASTS:
      raise ValueError(f'dtype must be one of {sorted(_CASTS)}, got {self.dtype!r}')
    size = self.block_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
      raise ValueError(f'block_size must be an int >= 1 or None, got {size!r}')

  @property
  def summable(self) -> bool:  # type: ignore[override]
    return _CASTS[self.dtype][1]

  @property
  def narrow_dtype(self):  # type: ignore[override]
    return _CASTS[self.dtype][0]

  @property
  def scale_block(self) -> int | None:  # type: ignore[override]
    return self.block_size

  def encode(self, x, state, key):
    del key
    limit = float(jnp.finfo(self.narrow_dtype).max)
    return (jnp.clip(x, -limit, limit).astype(self.narrow_dtype),), state

  def decode(self, payload, state, n):
    del state, n
    return payload[0].astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class QSGD(Compressor):
  """QSGD: stochastic rounding of |x|/‖x‖ to `levels` levels, per bucket; unbiased.

  Each element becomes sign·ℓ with ℓ ∈ {0..s}, rounded up with probability
  s|x_i|/‖x‖ − ⌊s|x_i|/‖x‖⌋; the 2s+1 codes are packed into 2, 4 or 8 bits
  (s = 127 is "8-bit QSGD"), with one float32 norm per bucket. The paper's
  Elias coding of levels is not done (fixed-width codes keep shapes static).

  The rounding coins compare 16-bit uniform integers (`bernoulli`), so the
  expectation is x to within 2^-17 of a level step (‖x‖/s) per element;
  `with_rng_bits` gives 8 or 32 bits, or None: `jax.random.bernoulli`
  (threefry, 23-bit floats; 5-10x slower on the CPU).

  Attributes:
    levels: s, in [1, 127].
    bucket_size: elements per norm (None: one bucket of all).

  Reference: Alistarh, Grubic, Li, Tomioka, Vojnovic. QSGD:
  Communication-Efficient SGD via Gradient Quantization and Encoding.
  NeurIPS 2017. https://arxiv.org/abs/1610.02132
  """

  levels: int = 127
  bucket_size: int | None = 512
  rng_bits: ClassVar[int | None] = 16  # see `with_rng_bits`
  name: ClassVar[str] = 'qsgd'
  unbiased: ClassVar[bool] = True
  stochastic: ClassVar[bool] = True

  def __post_init__(self):
    if not 1 <= self.levels <= 127:
      raise ValueError(f'levels must be in [1, 127], got {self.levels}')
    _check_bucket(self.bucket_size)
    _check_rng_bits(self.rng_bits)

  @property
  def bits(self) -> int:
    return bits_for(2 * self.levels + 1)

  def coins(self, key: jax.Array, p: jax.Array) -> jax.Array:
    """The rounding coins: Bernoulli(p) for the flat p, `rng_bits` bits each.

    Args:
      key: the PRNG key.
      p: the probabilities [n], in [0, 1].

    Returns:
      bool [n].
    """
    return _draw(key, p, self.rng_bits, self.bucket_size)

  def encode(self, x, state, key):
    n, size = x.size, self.bucket_size
    norm = jnp.linalg.norm(buckets(x, size), axis=1)
    scaled = jnp.abs(x) * _per_element(self.levels / jnp.where(norm > 0, norm, 1.0), size, n)
    floor = jnp.floor(scaled)
    level = floor + self.coins(key, scaled - floor)
    code = (jnp.sign(x) * level + self.levels).astype(jnp.uint8)
    return (norm, pack_bits(code, self.bits)), state

  def decode(self, payload, state, n):
    del state
    norm, packed = payload
    code = unpack_bits(packed, self.bits, n).astype(jnp.float32) - self.levels
    return code * _per_element(norm, self.bucket_size, n) / self.levels


@dataclasses.dataclass(frozen=True)
class TernGrad(Compressor):
  """TernGrad: s·sign(x)·Bernoulli(|x|/s) with s = max|x| per bucket; 2 bits each; unbiased.

  Per-tensor (one bucket) by default, as the paper's layer-wise ternarising
  when used per tensor. Not done: the paper's gradient clipping at 2.5σ and
  scalar sharing (max s over workers), which would need a collective.
  Coins as in `QSGD`: unbiased to within s·2^-17 (`with_rng_bits`).

  Attributes:
    bucket_size: elements per scale s (None: one bucket of all).

  Reference: Wen et al. TernGrad: Ternary Gradients to Reduce Communication
  in Distributed Deep Learning. NeurIPS 2017. https://arxiv.org/abs/1705.07878
  """

  bucket_size: int | None = None
  rng_bits: ClassVar[int | None] = 16  # see `with_rng_bits`
  name: ClassVar[str] = 'terngrad'
  unbiased: ClassVar[bool] = True
  stochastic: ClassVar[bool] = True

  def __post_init__(self):
    _check_bucket(self.bucket_size)
    _check_rng_bits(self.rng_bits)

  def coins(self, key: jax.Array, p: jax.Array) -> jax.Array:
    """The rounding coins: Bernoulli(p) for the flat p, `rng_bits` bits each.

    Args:
      key: the PRNG key.
      p: the probabilities [n], in [0, 1].

    Returns:
      bool [n].
    """
    return _draw(key, p, self.rng_bits, self.bucket_size)

  def encode(self, x, state, key):
    n, size = x.size, self.bucket_size
    b = buckets(x, size)
    scale = jnp.maximum(jnp.max(b, axis=1), -jnp.min(b, axis=1))  # max |x|, reading x in place
    p = jnp.abs(x) * _per_element(1 / jnp.where(scale > 0, scale, 1.0), size, n)
    code = (jnp.sign(x) * self.coins(key, p) + 1).astype(jnp.uint8)  # 0, 1, 2
    return (scale, pack_bits(code, 2)), state

  def decode(self, payload, state, n):
    del state
    scale, packed = payload
    code = unpack_bits(packed, 2, n).astype(jnp.float32) - 1
    return code * _per_element(scale, self.bucket_size, n)


def _signs(x):
  return pack_bits((x >= 0).astype(jnp.uint8), 1)


def _unsign(packed, n):
  return unpack_bits(packed, 1, n).astype(jnp.float32) * 2 - 1


@dataclasses.dataclass(frozen=True)
class Sign(Compressor):
  """signSGD: one bit per element; decodes to ±1 (0 counts as +).

  Averaged over workers, as this library's collectives do, the result is the
  fraction of the majority vote rather than its sign.

  Reference: Bernstein, Wang, Azizzadenesheli, Anandkumar. signSGD:
  Compressed Optimisation for Non-Convex Problems. ICML 2018.
  https://arxiv.org/abs/1802.04434
  """

  name: ClassVar[str] = 'sign'

  def encode(self, x, state, key):
    del key
    return (_signs(x),), state

  def decode(self, payload, state, n):
    del state
    return _unsign(payload[0], n)


@dataclasses.dataclass(frozen=True)
class EFSign(Compressor):
  """Scaled sign: (‖x‖₁/d)·sign(x) per bucket of d elements; use with error feedback.

  Attributes:
    bucket_size: d (None: one bucket of all).

  Reference: Karimireddy, Rebjock, Stich, Jaggi. Error Feedback Fixes SignSGD
  and other Gradient Compression Schemes. ICML 2019.
  https://arxiv.org/abs/1901.09847
  """

  bucket_size: int | None = None
  name: ClassVar[str] = 'ef_sign'

  def __post_init__(self):
    _check_bucket(self.bucket_size)

  def encode(self, x, state, key):
    del key
    b = buckets(x, self.bucket_size)
    scale = jnp.sum(jnp.abs(b), axis=1) / _bucket_counts(x.size, self.bucket_size)
    return (scale, _signs(x)), state

  def decode(self, payload, state, n):
    del state
    scale, packed = payload
    return _unbucket(buckets(_unsign(packed, n), self.bucket_size) * scale[:, None], n)


@dataclasses.dataclass(frozen=True)
class OneBit(Compressor):
  """1-bit SGD: one bit per element, decoded to the mean of its sign's elements.

  Per bucket, positive entries decode to the mean of the non-negative
  entries and negative ones to the mean of the negative entries (two float32
  per bucket); use with error feedback, as the paper does.

  Attributes:
    bucket_size: elements per pair of means (None: one bucket of all).

  Reference: Seide, Fu, Droppo, Li, Yu. 1-Bit Stochastic Gradient Descent and
  its Application to Data-Parallel Distributed Training of Speech DNNs.
  Interspeech 2014.
  """

  bucket_size: int | None = None
  name: ClassVar[str] = 'onebit'

  def __post_init__(self):
    _check_bucket(self.bucket_size)

  def encode(self, x, state, key):
    del key
    b = buckets(x, self.bucket_size)
    real = buckets(jnp.ones_like(x), self.bucket_size) > 0
    pos = (b >= 0) & real
    neg = (b < 0) & real
    mean_pos = jnp.sum(jnp.where(pos, b, 0), 1) / jnp.maximum(jnp.sum(pos, 1), 1)
    mean_neg = jnp.sum(jnp.where(neg, b, 0), 1) / jnp.maximum(jnp.sum(neg, 1), 1)
    return (jnp.stack([mean_pos, mean_neg], 1), _signs(x)), state

  def decode(self, payload, state, n):
    del state
    means, packed = payload
    up = buckets(_unsign(packed, n), self.bucket_size) > 0
    return _unbucket(jnp.where(up, means[:, :1], means[:, 1:]), n)


@dataclasses.dataclass(frozen=True)
class TwoBit(Compressor):
  """MXNet's 2-bit threshold quantisation: each element sends +τ, −τ or 0.

  x ≥ τ sends +τ, x ≤ −τ sends −τ, anything in between sends 0; 2 bits each,
  τ fixed (not sent). Biased: use with error feedback, which keeps the rest
  (as MXNet's kvstore does). CD-SGD's compressor.

  Attributes:
    threshold: τ (> 0).
  """

  threshold: float = 0.5
  name: ClassVar[str] = 'twobit'

  def __post_init__(self):
    if self.threshold <= 0:
      raise ValueError(f'threshold must be > 0, got {self.threshold}')

  def encode(self, x, state, key):
    del key
    code = jnp.where(x >= self.threshold, 2, jnp.where(x <= -self.threshold, 0, 1))
    return (pack_bits(code.astype(jnp.uint8), 2),), state

  def decode(self, payload, state, n):
    del state
    return (unpack_bits(payload[0], 2, n).astype(jnp.float32) - 1) * self.threshold
