"""Error-fed Top-k per tile (optionally of the tile's DCT, optionally 2-bit), all-gathered.

The exchange of SparseLoCo (`jaxdist.sync.sparseloco`, as DiLoCo's averager)
and DeMo (`jaxdist.sync.demo`, on its momentum). Each worker keeps an
error accumulator e; every call

  e <- β·e + x;   sends C(e);   e <- e − C(e);
  every worker gets the mean of the C(e_n) over the workers that sent each entry

where C keeps, in every tile (`jaxdist.compress.chunked`), the k entries of
largest magnitude (of the tile's orthonormal DCT with `dct=True`, the result
mapped back), their values quantised to `bits` with SparseLoCo's statistical
quantiser (float32 without). The payload of a step is one uint8 buffer per
worker: for each leaf its in-tile positions (12 bits each for tiles of at most
4,096 entries), then its codes (packed) and 4·(2^bits + 1) bytes of lookup
table and shift, or its float32 values. One all-gather of it per call; the
decoding adds every worker's entries into one sum, a worker at a time in a
fixed order, so every worker computes the same mean bitwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdist import comm
from jaxdist.compress import chunked as ck
from jaxdist.sync import _checks

AVERAGES = ('selected', 'all')
BITS = (1, 2, 4, 8, 32)  # bits per sent value; 32: float32, no quantiser


class ChunkedState(NamedTuple):
  """State of `chunked_allgather`.

  Attributes:
    error: the error accumulator e, one float32 array per leaf (the leaf's
      shape): what was not sent yet. DeMo's momentum. Per-worker.
    wire: the all-gather of the payload (count 0 until it runs). Per-worker.
  """

  error: Any
  wire: comm.Transfer


@dataclasses.dataclass(frozen=True)
class Leaf:
  """How one leaf is cut and how much of it is sent (static, from its shape)."""

  shape: tuple[int, ...]
  tiles: int  # T
  size: int  # entries per tile, h·w
  k: int  # entries kept per tile

  def nbytes(self, bits: int | None) -> int:
    """Bytes of this leaf's part of the payload."""
    count = self.tiles * self.k
    index = ck.index_bytes(count, self.size)
    if bits is None:
      return index + 4 * count
    return index + ck.code_bytes(count, bits) + 4 * ((1 << bits) + 1)


def plan(tree: Any, chunk: int, density: float | None, topk: int | None) -> tuple[Leaf, ...]:
  """Every leaf's `Leaf`: k = round(size·density) (SparseLoCo) or min(topk, size) (DeMo)."""
  out = []
  for x in jax.tree.leaves(tree):
    h, w = ck.tile_shape(x.shape, chunk)
    size = h * w
    k = ck.kept_per_tile(size, density) if topk is None else min(topk, size)
    out.append(Leaf(tuple(x.shape), x.size // size, size, k))
  return tuple(out)


def payload_bytes(leaves: tuple[Leaf, ...], bits: int | None) -> int:
  """Bytes each worker all-gathers per call."""
  return sum(leaf.nbytes(bits) for leaf in leaves)


def _as_bytes(x: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint8).reshape(-1)


def _as_floats(b: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(b.reshape(-1, 4), jnp.float32)


def _tiles(x: jax.Array, chunk: int, dct: bool) -> jax.Array:
  """[T, h·w] float32: the tiles of x (their DCT with `dct`)."""
  t = ck.to_tiles(x.astype(jnp.float32), chunk)
  t = ck.dct(t) if dct else t
  return t.reshape(t.shape[0], -1)


def _untile(t_TxL: jax.Array, shape, chunk: int, dct: bool) -> jax.Array:
  """Inverse of `_tiles`."""
  h, w = ck.tile_shape(shape, chunk)
  t = t_TxL.reshape(-1, h, w)
  return ck.from_tiles(ck.idct(t) if dct else t, shape, chunk)


def encode(e_tiles, leaves, bits, value_range):
  """(payload uint8[B], each leaf's sent (values [T, k] as decoded, positions [T, k])): C(e)."""
  parts, sent = [], []
  for t, leaf in zip(e_tiles, leaves, strict=True):
    vals, idx = ck.topk_per_tile(t, leaf.k)
    parts.append(ck.pack_indices(idx, leaf.size))
    if bits is None:
      parts.append(_as_bytes(vals))
    else:
      codes, lookup, shift = ck.quantize(vals, bits, value_range)
      vals = ck.dequantize(codes, lookup, shift)
      parts += [ck.pack_codes(codes, bits), _as_bytes(jnp.append(lookup, shift))]
    sent.append((vals, idx))
  return jnp.concatenate(parts), sent


def _sent_back(vals_TxK, idx_TxK, shape, chunk: int, dct: bool) -> jax.Array:
  """The leaf of `shape` whose tiles hold only the sent entries (mapped back with `dct`).

  With `dct` the inverse DCT of a tile with k entries is their sum of k outer
  products of the DCT matrices' rows, C_h[i]ᵀ v C_w[j]: T·k·h·w operations
  where the dense transform of the scattered tile takes 2·T·h·w·(h + w).
  """
  h, w = ck.tile_shape(shape, chunk)
  if not dct:
    return _untile(ck.scatter_tiles(vals_TxK, idx_TxK, h * w), shape, chunk, False)
  rows = jnp.asarray(ck.dct_matrix(h))[idx_TxK // w]  # [T, k, h]
  cols = jnp.asarray(ck.dct_matrix(w))[idx_TxK % w]  # [T, k, w]
  tiles = jnp.einsum('tn,tna,tnb->tab', vals_TxK, rows, cols, precision=lax.Precision.HIGHEST)
  return ck.from_tiles(tiles, shape, chunk)


def decode(payload, leaves, bits):
  """One worker's payload: each leaf's (values [T, k], in-tile positions [T, k])."""
  out, at = [], 0
  for leaf in leaves:
    count = leaf.tiles * leaf.k
    n_idx = ck.index_bytes(count, leaf.size)
    idx = ck.unpack_indices(payload[at : at + n_idx], count, leaf.size).reshape(leaf.tiles, -1)
    at += n_idx
    if bits is None:
      vals = _as_floats(payload[at : at + 4 * count]).reshape(leaf.tiles, -1)
      at += 4 * count
    else:
      n_codes, bins = ck.code_bytes(count, bits), 1 << bits
      codes = ck.unpack_codes(payload[at : at + n_codes], bits, count)
      table = _as_floats(payload[at + n_codes : at + n_codes + 4 * (bins + 1)])
      vals = ck.dequantize(codes, table[:bins], table[bins]).reshape(leaf.tiles, -1)
      at += n_codes + 4 * (bins + 1)
    out.append((vals, idx))
  return out


def mean_of(gathered_NxB, leaves, bits, average):
  """Each leaf's mean tiles: per entry over the workers that sent it ('selected') or over all.

  The workers' kept entries are added into one [T, size] sum (and count) a
  worker at a time, in worker order (a `lax.scan`; within one worker the
  positions are distinct), so every worker adds the same numbers in the same
  order and gets the same mean bitwise, on any backend. No worker's entries
  are spread into a dense [T, size] array of their own: the sums cost the
  entries sent (N·T·k), not N dense copies of the tree.
  """
  decoded = jax.vmap(lambda p: decode(p, leaves, bits))(gathered_NxB)
  n = gathered_NxB.shape[0]
  out = []
  for leaf, (vals_N, idx_N) in zip(leaves, decoded, strict=True):
    flat_N = (idx_N + (jnp.arange(leaf.tiles) * leaf.size)[:, None]).reshape(n, -1)
    vals_N = vals_N.reshape(n, -1).astype(jnp.float32)

    def add(carry, sent):
      total, count = carry
      pos, vals = sent
      total = total.at[pos].add(vals, unique_indices=True)
      count = count.at[pos].add(1.0, unique_indices=True)
      return (total, count), None

    zeros = jnp.zeros(leaf.tiles * leaf.size, jnp.float32)
    (total, count), _ = lax.scan(add, (zeros, zeros), (flat_N, vals_N))
    mean = total / n if average == 'all' else total / jnp.maximum(count, 1.0)
    out.append(mean.reshape(leaf.tiles, leaf.size))
  return out


def check(chunk, density, topk, bits, value_range, error_decay, average) -> None:
  """The argument checks of `chunked_allgather` (and of the methods built on it)."""
  _checks.check('chunk', chunk, lambda c: isinstance(c, int) and c >= 1, 'an int >= 1')
  if (density is None) == (topk is None):
    raise ValueError(f'give one of density and topk, got density={density}, topk={topk}')
  if density is not None:
    _checks.check('density', density, lambda d: 0 < d <= 1, 'in (0, 1]')
  if topk is not None:
    _checks.check('topk', topk, lambda k: isinstance(k, int) and k >= 1, 'an int >= 1')
  _checks.check('bits', bits, lambda b: b in BITS, f'one of {BITS} (32: float32 values)')
  _checks.check('value_range', value_range, lambda r: r > 0, '> 0')
  _checks.check('error_decay', error_decay, lambda b: 0 <= b <= 1, 'in [0, 1]')
  if average not in AVERAGES:
    raise ValueError(f'average must be one of {AVERAGES}, got {average!r}')


def chunked_allgather(
  *,
  axis_name: comm.AxisName,
  density: float | None = None,
  topk: int | None = None,
  chunk: int = 64,
  bits: int = 32,
  value_range: float = 6.0,
  dct: bool = False,
  error_decay: float = 1.0,
  average: str = 'selected',
) -> optax.GradientTransformation:
  """Averages error-fed Top-k-per-tile sparsified trees over `axis_name` (one all-gather).

  Worker n keeps e_n (zeros at first); each call with input x_n

    e_n <- β·e_n + x_n;   s_n = C(e_n);   e_n <- e_n − s_n;
    out = Σ_n s_n / (number of workers that sent each entry)   ('selected')
    out = (1/N) Σ_n s_n                                        ('all')

  C keeps the k entries of largest |.| in each tile (of the tile's DCT with
  `dct`, mapped back by the inverse DCT), their values quantised with
  SparseLoCo's statistical quantiser at `bits` bits. e_n loses exactly what
  the others receive (quantisation error included, as in the authors' code).
  Tiles: each leaf viewed as a matrix (0-D 1x1, 1-D 1xn, more dimensions
  prod(leading) x last), cut along rows and columns by the largest divisor
  at most `chunk` (`jaxdist.compress.chunked`).

  Args:
    axis_name: the worker axis (or tuple of axes).
    density: kept fraction of each tile, k = round(size·density) in [1, size]
      (SparseLoCo: 128 of a 64x64 tile is 0.03125). Give this or `topk`.
    topk: kept entries per tile, min(topk, size) (DeMo: 32).
    chunk: the longest tile side.
    bits: bits per sent value (2: SparseLoCo's 4 bins); 32: float32 values,
      not quantised.
    value_range: the quantiser's range in standard deviations (6).
    dct: select in the orthonormal 2-D DCT-II of each tile (DeMo).
    error_decay: β, the error accumulator's decay (1: classical error
      feedback; 0: what is not sent is dropped).
    average: 'selected' (each entry averaged over the workers that sent it, as
      the authors' code of SparseLoCo and DeMo does) or 'all' (divided by N, the
      SparseLoCo paper's formula).

  Returns:
    An `optax.GradientTransformation` (an averager for `diloco`, `local_sgd`;
    or before an optimizer).

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> avg = sync.chunked_allgather(axis_name=runtime.AXES, density=0.5)
    >>> run = testing.Run(optax.chain(avg, optax.sgd(1.0)), {'x': jnp.zeros(2)}, workers=2)
    >>> run({'x': jnp.array([[4.0, 1.0], [2.0, 3.0]])})['x']  # 4 and 3 sent, each by one
    Array([[-4., -3.],
           [-4., -3.]], dtype=float32)

  References:
    Sarfi, Thérien, Lidin, Belilovsky. Communication Efficient LLM Pre-training
    with SparseLoCo. 2025. https://arxiv.org/abs/2508.15706
    Peng, Quesnelle, Kingma. DeMo: Decoupled Momentum Optimization. 2024.
    https://arxiv.org/abs/2411.19870
  """
  check(chunk, density, topk, bits, value_range, error_decay, average)
  bits = None if bits == 32 else bits  # None below: float32 values

  def init_fn(params):
    leaves = plan(params, chunk, density, topk)
    error = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
    return ChunkedState(error, comm.transfer(comm.ALL_GATHER, payload_bytes(leaves, bits), 0))

  def update_fn(updates, state, params=None):
    del params
    leaves = plan(updates, chunk, density, topk)
    xs, treedef = jax.tree.flatten(updates)
    errors = [
      error_decay * e + x.astype(jnp.float32)
      for e, x in zip(treedef.flatten_up_to(state.error), xs, strict=True)
    ]
    e_tiles = [_tiles(e, chunk, dct) for e in errors]
    payload, sent = encode(e_tiles, leaves, bits, value_range)
    gathered, wire = comm.all_gather(payload, axis_name)
    means = mean_of(gathered, leaves, bits, average)
    new_errors, out = [], []
    for e, (vals, idx), m, x in zip(errors, sent, means, xs, strict=True):
      new_errors.append(e - _sent_back(vals, idx, x.shape, chunk, dct))
      out.append(_untile(m, x.shape, chunk, dct).astype(x.dtype))
    assert wire.nbytes == payload_bytes(leaves, bits)
    error = jax.tree.unflatten(treedef, new_errors)
    return jax.tree.unflatten(treedef, out), ChunkedState(error, wire)

  return optax.GradientTransformation(init_fn, update_fn)
