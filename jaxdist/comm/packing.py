"""Trees packed into few buffers before a collective, where the backend pays per operand.

A collective over a pytree lowers to one operand per leaf; `packed` sends
the leaves of each dtype side by side in one flat buffer instead (bounded
by `PACK_BYTES`, as PyTorch DDP's buckets are), and slices the result back.
Every numbers-preserving collective of `jaxdist.comm` (sums, means, maxima,
gathers) goes through it; the bytes on the wire are the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

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


def pack_groups(leaves: Sequence[Any], limit: int = PACK_BYTES) -> list[list[int]]:
  """The leaves' indices in packs: same dtype, in tree order, at most `limit` bytes each.

  A leaf larger than `limit` is a pack of its own (leaves are not split).

  Args:
    leaves: arrays (or shape-dtype structs).
    limit: the most bytes of one pack.

  Returns:
    The packs, each a list of indices into `leaves`, ordered by their first leaf.
  """
  open_: dict[Any, list[int]] = {}
  sizes: dict[Any, int] = {}
  packs_: list[list[int]] = []
  for i, x in enumerate(leaves):
    dtype, size = jnp.dtype(x.dtype), math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
    if dtype in open_ and sizes[dtype] + size <= limit:
      open_[dtype].append(i)
      sizes[dtype] += size
    else:
      open_[dtype], sizes[dtype] = [i], size
      packs_.append(open_[dtype])
  return packs_


def packed(fn: Callable[[jax.Array], jax.Array], tree: Any, pack: bool | None = None) -> Any:
  """`fn` applied to `tree`'s leaves, on one flat buffer per pack (`pack_groups`) where `packs`.

  `fn` maps a 1-D array to an array whose last axis is that array's
  (an all-reduce; an all-gather's [N, size]); each leaf comes back as its
  slice of that axis, reshaped. Elementwise collectives give the same
  numbers packed or not.

  Args:
    fn: the collective, of one array.
    tree: the pytree it applies to.
    pack: pack (True), leaf by leaf (False), or by the backend (None: `packs`).

  Returns:
    `tree` with each leaf `x` replaced by `fn(x)` (reshaped from its pack).
  """
  leaves, treedef = jax.tree.flatten(tree)
  if len(leaves) < 2 or not packs(pack):
    return jax.tree.unflatten(treedef, [fn(x) for x in leaves])
  out = list(leaves)
  for group in pack_groups(leaves):
    if len(group) == 1:
      out[group[0]] = fn(leaves[group[0]])
      continue
    flat = fn(jnp.concatenate([jnp.ravel(leaves[i]) for i in group]))
    start = 0
    for i in group:
      x = leaves[i]
      out[i] = flat[..., start : start + x.size].reshape((*flat.shape[:-1], *x.shape))
      start += x.size
  return jax.tree.unflatten(treedef, out)
