"""Trees packed into few buffers before a collective, where the backend pays per operand.

A collective over a pytree lowers to one operand per leaf; `packed` sends
the leaves of each dtype side by side in one flat buffer instead (bounded
by `PACK_BYTES`, as PyTorch DDP's buckets are), and slices the result back.
Every numbers-preserving collective of `jaxdist.comm` (sums, means, maxima,
gathers) goes through it; the bytes on the wire are the same. A gather moves
bits, so its leaves of one width share a pack whatever their dtypes
(float32 values and int32 positions in one buffer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

# The most bytes one packed buffer holds (PyTorch DDP's default bucket, bucket_cap_mb=25).
PACK_BYTES = 25 * 2**20
# Backends whose collectives pay a fixed cost per operand (below), where trees are packed.
PACKING_BACKENDS = ('cpu',)


def packs(pack: bool | None = None) -> bool:
  """Whether a collective sends a tree packed: `pack`, or where it is None, by the backend.

  XLA combines a step's all-reduces into one with an operand per leaf, and on
  the CPU (gloo between processes, a rendezvous of threads within one) it
  runs one collective per operand, each with its fixed cost: over 8
  processes on this machine's loopback, a model average of the digits CNN's
  8 leaves took 150 ms where one buffer of the same bytes takes ~20 ms.
  So on the CPU a tree goes as one buffer per dtype (`PACK_BYTES` at most
  each). On GPU and TPU, XLA's combined all-reduce is one grouped NCCL (or
  ICI) call: the trees go as they are (not measured here: no GPU was lent).

  Args:
    pack: True or False to choose; None for the backend's default.

  Returns:
    Whether to pack.
  """
  if pack is not None:
    return pack
  return jax.default_backend() in PACKING_BACKENDS


# The unsigned integer of each width that a bit-moving collective carries other dtypes as.
_CARRIERS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _carrier(dtype: Any) -> Any:
  """The unsigned integer dtype `dtype` travels as in a bit-moving pack (itself: none fits)."""
  dtype = jnp.dtype(dtype)
  if dtype.kind in 'fiu' and dtype.itemsize in _CARRIERS:
    return jnp.dtype(_CARRIERS[dtype.itemsize])
  return dtype  # bools and complex numbers go in packs of their own dtype


def _cast(x: jax.Array, dtype: Any) -> jax.Array:
  """x bit-cast to `dtype` (None: as it is)."""
  return x if dtype is None else lax.bitcast_convert_type(x, dtype)


def pack_groups(
  leaves: Sequence[Any], limit: int = PACK_BYTES, bits: bool = False
) -> list[list[int]]:
  """The leaves' indices in packs: same dtype, in tree order, at most `limit` bytes each.

  A leaf larger than `limit` is a pack of its own (leaves are not split).

  Args:
    leaves: arrays (or shape-dtype structs).
    limit: the most bytes of one pack.
    bits: the collective moves bits unchanged (a gather): leaves whose dtypes
      have one width (float32 values and int32 positions) share a pack.

  Returns:
    The packs, each a list of indices into `leaves`, ordered by their first leaf.
  """
  open_: dict[Any, list[int]] = {}
  sizes: dict[Any, int] = {}
  packs_: list[list[int]] = []
  for i, x in enumerate(leaves):
    dtype, size = jnp.dtype(x.dtype), math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
    key = _carrier(dtype) if bits else dtype
    if key in open_ and sizes[key] + size <= limit:
      open_[key].append(i)
      sizes[key] += size
    else:
      open_[key], sizes[key] = [i], size
      packs_.append(open_[key])
  return packs_


def packed(
  fn: Callable[[jax.Array], jax.Array], tree: Any, pack: bool | None = None, bits: bool = False
) -> Any:
  """`fn` applied to `tree`'s leaves, on one flat buffer per pack (`pack_groups`) where `packs`.

  `fn` maps a 1-D array to an array whose last axis is that array's
  (an all-reduce; an all-gather's [N, size]); each leaf comes back as its
  slice of that axis, reshaped. Elementwise collectives give the same
  numbers packed or not. With `bits` (a collective that moves bits
  unchanged, as a gather does), leaves of one width travel in one pack,
  bit-cast to the unsigned integer of that width and back.

  Args:
    fn: the collective, of one array.
    tree: the pytree it applies to.
    pack: pack (True), leaf by leaf (False), or by the backend (None: `packs`).
    bits: `fn` moves bits unchanged: dtypes of one width share a pack.

  Returns:
    `tree` with each leaf `x` replaced by `fn(x)` (reshaped from its pack).
  """
  leaves, treedef = jax.tree.flatten(tree)
  if len(leaves) < 2 or not packs(pack):
    return jax.tree.unflatten(treedef, [fn(x) for x in leaves])
  out = list(leaves)
  for group in pack_groups(leaves, bits=bits):
    if len(group) == 1:
      out[group[0]] = fn(leaves[group[0]])
      continue
    carrier = _carrier(leaves[group[0]].dtype) if bits else None
    flat = fn(jnp.concatenate([jnp.ravel(_cast(leaves[i], carrier)) for i in group]))
    start = 0
    for i in group:
      x = leaves[i]
      piece = flat[..., start : start + x.size].reshape((*flat.shape[:-1], *x.shape))
      out[i] = _cast(piece, None if carrier is None else x.dtype)
      start += x.size
  return jax.tree.unflatten(treedef, out)
