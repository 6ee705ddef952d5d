"""The 1-bit compressed all-reduce of 1-bit Adam and 0/1 Adam (DeepSpeed's `compressed_allreduce`).

Each worker sends sign bits and one scale per tensor of (vector + its worker
error); an all-to-all gives worker j chunk j of every worker's signs (the
"server" role); it averages them, adds its server error, compresses again,
and an all-gather gives everyone every server's chunk. Signs are packed 8
to a byte, so the bytes in the lowered HLO are the honest 1-bit payload.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist import comm
from jaxdist.compress.base import pack_bits


def chunk_sizes(params: Any, n: int) -> list[int]:
  """Per leaf, the server chunk c (a multiple of 8): the leaf is zero-padded to n·c elements."""
  return [8 * max(1, math.ceil(x.size / (8 * n))) for x in jax.tree.leaves(params)]


def planned_wire(params: Any, n: int) -> tuple[comm.Transfer, ...]:
  """The collectives of one compressed all-reduce of `params`, not run (count 0).

  (all-to-all of the packed worker signs, n·c/8 bytes a leaf; all-gather of
  the worker scales, 4 bytes a leaf; all-gather of the packed server signs,
  c/8 bytes a leaf; all-gather of the server scales, 4 bytes a leaf.)
  """
  chunks, leaves = chunk_sizes(params, n), len(jax.tree.leaves(params))
  signs = sum(chunks) // 8
  return (
    comm.transfer(comm.ALL_TO_ALL, n * signs, 0),
    comm.transfer(comm.ALL_GATHER, 4 * leaves, 0),
    comm.transfer(comm.ALL_GATHER, signs, 0),
    comm.transfer(comm.ALL_GATHER, 4 * leaves, 0),
  )


def _unpack_NxC(packed_NxB: jax.Array) -> jax.Array:
  """±1.0 of packed sign bits [N, B] (little end first), as [N, 8·B]."""
  bits = (packed_NxB[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & jnp.uint8(1)
  return bits.reshape(packed_NxB.shape[0], -1).astype(jnp.float32) * 2 - 1


def _rms(x: jax.Array, count: jax.Array | int) -> jax.Array:
  """‖x‖₂ / √count (the scale of a sign code: magnitude of x over magnitude of sign(x))."""
  return jnp.sqrt(jnp.sum(jnp.square(x))) / jnp.sqrt(jnp.maximum(count, 1).astype(jnp.float32))


def onebit_allreduce(
  tree: Any, worker_error: Any, server_error: jax.Array, *, axis_name: comm.AxisName
) -> tuple[Any, Any, jax.Array, tuple[comm.Transfer, ...]]:
  """The mean of `tree` over workers, sent at 1 bit per element with two error feedbacks.

  Per leaf of d elements, zero-padded to N chunks of c (`chunk_sizes`):

    worker:  x = tree + δ_w;  s = ‖x‖/√d;  sends sgn(x) (sgn(0) = +1) and s;
             δ_w ← x − s·sgn(x)
    server j (after an all-to-all of chunk j of every worker's signs and an
             all-gather of the scales):
             y = (1/N) Σ_i s_i·sgn_i[chunk j] + δ_s;  s̄ = ‖y‖/√d_j;
             sends sgn(y) and s̄;  δ_s ← y − s̄·sgn(y)
    everyone (after an all-gather of the servers' signs and scales):
             result = concat_j s̄_j·sgn_j, padding dropped.

  d_j counts chunk j's elements that are not padding, and padding never
  enters y or δ_s (DeepSpeed counts padding zeros in √d and lets them carry
  error; here padding has no effect, so the result does not depend on how
  the leaf is padded).

  Args:
    tree: this worker's vectors (any pytree of float arrays).
    worker_error: δ_w, float32, shaped like `tree`.
    server_error: δ_s, float32 [Σ_l c_l], this worker's chunk of every leaf.
    axis_name: the worker axis (or tuple of axes).

  Returns:
    (the mean, the same on every worker, in `tree`'s dtypes; new δ_w; new
    δ_s; the four `comm.Transfer`s of `planned_wire`).
  """
  n = comm.axis_size(axis_name)
  leaves, treedef = jax.tree.flatten(tree)
  errors = treedef.flatten_up_to(worker_error)
  chunks = chunk_sizes(leaves, n)
  signs, scales, new_errors = [], [], []
  for x, e, c in zip(leaves, errors, chunks, strict=True):
    x_D = x.reshape(-1).astype(jnp.float32) + e.reshape(-1)
    s = _rms(x_D, x_D.size)
    new_errors.append((x_D - s * jnp.where(x_D >= 0, 1.0, -1.0)).reshape(x.shape))
    bits = jnp.pad(x_D >= 0, (0, n * c - x_D.size), constant_values=True)
    signs.append(pack_bits(bits, 1).reshape(n, c // 8))
    scales.append(s)
  recv_NxB, sent_signs = comm.all_to_all(jnp.concatenate(signs, axis=1), axis_name)
  scales_NxL, sent_scales = comm.all_gather(jnp.stack(scales), axis_name)

  j = comm.axis_index(axis_name)
  server_signs, server_scales, new_server = [], [], []
  byte, at = 0, 0
  for leaf, (x, c) in enumerate(zip(leaves, chunks, strict=True)):
    sgn_NxC = _unpack_NxC(recv_NxB[:, byte : byte + c // 8])
    real_C = j * c + jnp.arange(c) < x.size
    y_C = (
      jnp.sum(scales_NxL[:, leaf, None] * sgn_NxC, axis=0) * (1.0 / n) + server_error[at : at + c]
    )
    y_C = jnp.where(real_C, y_C, 0.0)
    s = _rms(y_C, jnp.clip(x.size - j * c, 0, c))
    new_server.append(jnp.where(real_C, y_C - s * jnp.where(y_C >= 0, 1.0, -1.0), 0.0))
    server_signs.append(pack_bits(y_C >= 0, 1))
    server_scales.append(s)
    byte, at = byte + c // 8, at + c
  all_NxB, sent_server_signs = comm.all_gather(jnp.concatenate(server_signs), axis_name)
  all_NxL, sent_server_scales = comm.all_gather(jnp.stack(server_scales), axis_name)

  out, byte = [], 0
  for leaf, (x, c) in enumerate(zip(leaves, chunks, strict=True)):
    sgn_NxC = _unpack_NxC(all_NxB[:, byte : byte + c // 8])
    mean = (all_NxL[:, leaf, None] * sgn_NxC).reshape(-1)[: x.size]
    out.append(mean.reshape(x.shape).astype(x.dtype))
    byte += c // 8
  wire = (sent_signs, sent_scales, sent_server_signs, sent_server_scales)
  return (
    jax.tree.unflatten(treedef, out),
    jax.tree.unflatten(treedef, new_errors),
    jnp.concatenate(new_server),
    wire,
  )
