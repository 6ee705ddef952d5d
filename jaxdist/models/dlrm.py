"""A small DLRM: embedding tables, a bottom and a top MLP, dot interaction (Naumov et al., 2019).

The model is split the way DLRM trains it. The embedding tables are one
stacked array `tables_TxRxD` (T tables of R rows, width D) that lives outside
the Flax module; `DLRM` is the dense part, from the dense features and the
looked-up vectors `emb_BxTxD` to a click logit:

  bottom MLP(dense) → z_0 ∈ R^D;  z_t = tables[t, ids[:, t]]
  dot:  the pairwise dot products ⟨z_i, z_j⟩ (i < j) of z_0..z_T, concatenated with z_0
  cat:  z_0..z_T concatenated
  top MLP → one logit

`lookup` reads the vectors from the whole stack (one device). `sharded_lookup`
is the model-parallel lookup of the hybrid layout: worker k of N holds tables
[k·T/N, (k+1)·T/N) and its own slice of the batch; one all-to-all sends each
owner the ids of its tables for every worker's examples, the owner gathers the
rows, and a second all-to-all returns the vectors to the examples' workers
(its transpose, an all-to-all, carries the gradients back to the owners).

References: Naumov et al. Deep Learning Recommendation Model for
Personalization and Recommendation Systems. 2019.
https://arxiv.org/abs/1906.00091
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

INTERACTIONS = ('dot', 'cat')


class DLRM(nn.Module):
  """DLRM's dense part: bottom MLP, interaction with the looked-up vectors, top MLP → logit.

  Attributes:
    embed_dim: width D of the embedding vectors (the bottom MLP ends at D).
    bottom: hidden widths of the bottom MLP (before its last layer of width D).
    top: hidden widths of the top MLP (before its one-unit output).
    interaction: 'dot' (pairwise dot products, DLRM's default) or 'cat'.
  """

  embed_dim: int
  bottom: Sequence[int] = (32,)
  top: Sequence[int] = (32,)
  interaction: str = 'dot'

  @nn.compact
  def __call__(self, dense_BxF: jax.Array, emb_BxTxD: jax.Array) -> jax.Array:
    if self.interaction not in INTERACTIONS:
      raise ValueError(f'interaction must be one of {INTERACTIONS}, got {self.interaction!r}')
    x = dense_BxF
    for width in self.bottom:
      x = nn.relu(nn.Dense(width)(x))
    z0_BxD = nn.relu(nn.Dense(self.embed_dim)(x))
    z_BxNxD = jnp.concatenate([z0_BxD[:, None], emb_BxTxD], axis=1)
    if self.interaction == 'dot':
      n = z_BxNxD.shape[1]
      gram_BxNxN = jnp.einsum('bid,bjd->bij', z_BxNxD, z_BxNxD)
      i, j = np.triu_indices(n, k=1)
      h = jnp.concatenate([z0_BxD, gram_BxNxN[:, i, j]], axis=1)
    else:
      h = z_BxNxD.reshape((z_BxNxD.shape[0], -1))
    for width in self.top:
      h = nn.relu(nn.Dense(width)(h))
    return nn.Dense(1)(h)[:, 0]


def init_tables(rng: jax.Array, num_tables: int, rows: int, dim: int) -> jax.Array:
  """[T, R, D] tables, uniform in ±1/√R as DLRM initialises them.

  Args:
    rng: the PRNG key.
    num_tables: T.
    rows: R, rows per table.
    dim: D, the embeddings' width.

  Returns:
    float32 [T, R, D].
  """
  bound = 1 / np.sqrt(rows)
  return jax.random.uniform(rng, (num_tables, rows, dim), jnp.float32, -bound, bound)


def lookup(tables_TxRxD: jax.Array, ids_BxT: jax.Array) -> jax.Array:
  """[B, T, D]: row ids[b, t] of table t, from the whole stack.

  Args:
    tables_TxRxD: the tables.
    ids_BxT: the row ids, one per table per example.

  Returns:
    [B, T, D] embeddings.
  """
  return tables_TxRxD[jnp.arange(tables_TxRxD.shape[0])[None, :], ids_BxT]


def sharded_lookup(tables_LxRxD: jax.Array, ids_BxT: jax.Array, axis_name: str) -> jax.Array:
  """[B, T, D] vectors of this worker's examples, the tables spread over `axis_name`.

  Worker k holds tables [k·L, (k+1)·L) (L = T / N) and the ids of its own B
  examples for all T tables. Run it under `shard_map` over `axis_name`.

  Args:
    tables_LxRxD: this worker's L tables.
    ids_BxT: this worker's examples' ids, one per table.
    axis_name: the mesh axis of the N workers.

  Returns:
    The vectors of this worker's examples, as `lookup` on the whole stack gives.
  """
  n = lax.axis_size(axis_name)
  b, t = ids_BxT.shape
  local = tables_LxRxD.shape[0]
  if local * n != t:
    raise ValueError(f'{t} tables need {t // n} per worker on {n} workers, got {local}')
  # [N owners, B, L]: ids of owner o's tables; after the all-to-all, [N sources, B, L]
  ids_NxBxL = jnp.transpose(ids_BxT.reshape(b, n, local), (1, 0, 2))
  ids_NxBxL = lax.all_to_all(ids_NxBxL, axis_name, 0, 0, tiled=True)
  emb_NxBxLxD = tables_LxRxD[jnp.arange(local)[None, None, :], ids_NxBxL]
  # back to the examples' workers: [N owners, B, L, D]
  emb_NxBxLxD = lax.all_to_all(emb_NxBxLxD, axis_name, 0, 0, tiled=True)
  return jnp.transpose(emb_NxBxLxD, (1, 0, 2, 3)).reshape(b, t, -1)
