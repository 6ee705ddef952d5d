"""Hierarchical Top-k all-reduce (HiTopKComm, Shi et al. 2021) on nodes × local workers.

Workers form a 2-D grid: n nodes (slow links between them) of m local
workers each (fast links inside a node). Worker (i, j) is local rank j of
node i. With the whole model flattened into one float32 vector of D
elements, padded to m·s (s = ⌈D/m⌉: shard j is elements [j·s, (j+1)·s)),
one step is

  1. intra-node reduce-scatter (dense, fast links): worker (i, j) gets
     S_ij = Σ_l g_il[shard j], its node's sum on shard j;
  2. error feedback and a sparsifier on that shard, with k/m elements:
     w_ij = S_ij + e_ij;  sends C(w_ij);  e_ij <- w_ij − C(w_ij);
  3. inter-node sparse all-gather (slow links) of (values, int32 indices)
     among the n workers with the same local rank j (a "rail"), all m rails
     at once;
  4. scatter-add of the n payloads and division by n·m, then intra-node
     dense all-gather of the m shards: every worker gets

       (1/(n·m)) Σ_i C(w_ij) on shard j, for every j.

In jaxdist's layout (`runtime.AXES` = ('data', 'sim')) the simulated
workers that share a device are a node's local workers and the devices are
the nodes: `node_axis='data', local_axis='sim'` (worker index i·m + j, as
`comm.axis_index(runtime.AXES)` counts). On a real 2-D mesh pass its axes,
e.g. `node_axis='node', local_axis='gpu'`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from jaxdist import comm
from jaxdist.comm.collectives import INTER, INTRA
from jaxdist.compress.base import Compressor
from jaxdist.compress.sparsify import scatter

REDUCE_SCATTER = 'reduce-scatter'  # `Transfer.op` of the intra-node reduce-scatter


class HiTopKState(NamedTuple):
  """State of `hitopk_allreduce`.

  Attributes:
    count: update calls so far. Replicated.
    key: PRNG key (raw uint32[2]) for stochastic sparsifiers (MSTopK's random
      run), folded with the step and the worker index. Replicated.
    residual: float32[s], the error-feedback memory e_ij of worker (i, j): the
      part of its node's error-fed sum on shard j that was not sent (node-sum
      units, not a mean); () without error feedback. Per-worker.
    compressor_state: the sparsifier's state for a shard of s elements.
      Per-worker.
    intra: the intra-node collectives (fast links, among the m local
      workers): the reduce-scatter (kind `all-to-all`, op 'reduce-scatter',
      payload 4·m·s bytes) and the dense all-gather (payload 4·s bytes).
      Per-worker.
    inter: the inter-node sparse all-gather (slow links, among the n workers
      of a rail; payload: the sparsifier's k/m values and indices).
      Per-worker.
  """

  count: jax.Array
  key: jax.Array
  residual: Any
  compressor_state: Any
  intra: tuple[comm.Transfer, ...]
  inter: tuple[comm.Transfer, ...]


def hitopk_allreduce(
  compressor: Compressor,
  *,
  node_axis: str,
  local_axis: str,
  local_size: int,
  error_feedback: bool = True,
  seed: int = 0,
) -> optax.GradientTransformation:
  """Averages gradients over nodes × local workers with hierarchical Top-k (HiTopKComm).

  Each worker gets the mean over all n·m workers of the node sums'
  compressed shards,

    out[shard j] = (1/(n·m)) Σ_i C(S_ij + e_ij),   S_ij = Σ_l g_il[shard j],

  where the dense sums inside a node (reduce-scatter, then all-gather) use
  the fast links and only the sparse payloads cross nodes. With error
  feedback, e_ij <- S_ij + e_ij − C(S_ij + e_ij): nothing a node sums is
  lost, only delayed. With a sparsifier that keeps everything (ratio 1) it
  is the dense mean.

  Recorded transfers (`HiTopKState.intra` / `.inter`, with `Transfer.link`
  'intra' / 'inter'): comm has no reduce-scatter kind, so the
  reduce-scatter is recorded as an `all-to-all` with op 'reduce-scatter'
  (the α-β model prices a ring reduce-scatter and an all-to-all alike:
  (m−1)α + (m−1)/m·Mβ). `jaxdist.netmodel.link_time` (the trainer's
  ledger) and `hierarchical_time` price each by its link: N = m on the
  intra-node network, N = n on a rail of the inter-node one.

  Args:
    compressor: a sparsifier of `jaxdist.compress` (mstopk, topk, dgc,
      threshold). With a `ratio`, each shard keeps that ratio of its s
      elements; with a fixed `k`, each shard keeps ⌈k/m⌉.
    node_axis: the axis across nodes (slow links), e.g. 'data'.
    local_axis: the axis inside a node (fast links), e.g. 'sim'.
    local_size: m, the workers on `local_axis` (fixes the shard shapes that
      the state holds, since `init` cannot see the axes); the mapped step
      fails with a clear error if the axis differs. A lone worker (both
      axes of size 1, as when the trainer times one worker's compute) has
      nothing to reduce or send: its gradient passes through, its residual
      is kept and no transfer runs.
    error_feedback: keep each shard's unsent part and add it to the next one.
    seed: seed of the transform's PRNG key.

  Returns:
    An `optax.GradientTransformation`; put it before the optimizer.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdist import compress, sync
    >>> tx = sync.hitopk_allreduce(
    ...   compress.topk(ratio=0.5), node_axis='node', local_axis='gpu', local_size=2)
    >>> grid = lambda f: jax.vmap(jax.vmap(f, axis_name='gpu'), axis_name='node')  # 2 x 2
    >>> g = jnp.array([[[1.0, 0, 0, 2], [0, 3, 0, 0]], [[0, 0, 4, 0], [0, 0, 1, 1]]])
    >>> out, state = grid(tx.update)(g, grid(tx.init)(g))
    >>> out[0, 0]  # node sums [1, 3, 0, 2], [0, 0, 5, 1]: top-1 of each shard, / 4
    Array([0.  , 0.75, 1.25, 0.5 ], dtype=float32)
    >>> state.residual  # worker (i, j) keeps what shard j of node i's sum did not send
    Array([[[1., 0.],
            [0., 0.]],
    <BLANKLINE>
           [[0., 0.],
            [0., 1.]]], dtype=float32)

  In `testing.Run(tx, params, workers=n * m, devices=n)`, pass
  `node_axis='data', local_axis='sim'`.

  References:
    Shi, Zhou, Song, Cheng, Chu et al. Towards Scalable Distributed Training
    of Deep Learning on Public Cloud Clusters. MLSys 2021 (HiTopKComm and
    MSTopK). https://arxiv.org/abs/2010.10458 The paper's text and code were
    not available here: this follows its abstract and a third-party summary
    (research/ALGORITHMS.md §7.2); where the paper keeps its error feedback
    and how it pads shards are assumptions.
  """
  c = _checked(compressor, node_axis, local_axis, local_size)
  m = local_size

  def sizes(tree) -> tuple[int, int]:
    d = sum(math.prod(jnp.shape(x)) for x in jax.tree.leaves(tree))
    if d < 1:
      raise ValueError('hitopk_allreduce needs parameters with at least one element')
    s = -(-d // m)
    c.check(s)
    return d, s

  def transfers(s: int, ran: int) -> tuple[tuple, tuple]:
    rs = comm.transfer(comm.ALL_TO_ALL, 4 * m * s, ran, op=REDUCE_SCATTER, link=INTRA)
    ag = comm.transfer(comm.ALL_GATHER, 4 * s, ran, link=INTRA)
    return (rs, ag), (comm.transfer(comm.ALL_GATHER, c.wire_bytes(s), ran, link=INTER),)

  def init_fn(params):
    _, s = sizes(params)
    intra, inter = transfers(s, 0)
    return HiTopKState(
      count=jnp.zeros([], jnp.int32),
      key=jax.random.PRNGKey(seed),
      residual=jnp.zeros((s,), jnp.float32) if error_feedback else (),
      compressor_state=c.init(s),
      intra=intra,
      inter=inter,
    )

  def update_fn(updates, state, params=None):
    del params
    d, s = sizes(updates)
    if comm.axis_size((node_axis, local_axis)) == 1:  # a lone worker: nothing to reduce or send
      intra, inter = comm.silence((state.intra, state.inter))
      count = optax.safe_increment(state.count)
      return updates, state._replace(count=count, intra=intra, inter=inter)
    _check_axis(local_axis, m)
    n = comm.axis_size(node_axis, subgroup=True)
    leaves = jax.tree.leaves(updates)
    flat_D, unravel = ravel_pytree([x.astype(jnp.float32) for x in leaves])
    flat_MxS = jnp.pad(flat_D, (0, m * s - d)).reshape(m, s)
    # 1. intra-node reduce-scatter: this worker's shard of its node's sum
    node_S = lax.psum_scatter(flat_MxS, local_axis, scatter_dimension=0)
    # 2. error feedback and the sparsifier on the shard
    wanted_S = node_S + state.residual if error_feedback else node_S
    key = jax.random.fold_in(state.key, state.count)
    if c.stochastic and not c.shared_randomness:
      key = jax.random.fold_in(key, comm.axis_index((node_axis, local_axis)))
    (vals_K, idx_K), cstate = c.encode(wanted_S, state.compressor_state, key)
    residual = wanted_S - c.decode((vals_K, idx_K), cstate, s) if error_feedback else ()
    # 3. inter-node sparse all-gather along the rail
    (vals_NxK, idx_NxK), _ = comm.all_gather((vals_K, idx_K), node_axis, subgroup=True)
    # 4. scatter-add, mean, intra-node all-gather of the shards
    mean_S = scatter(vals_NxK.reshape(-1), idx_NxK.reshape(-1), s) / (n * m)
    mean_MxS, _ = comm.all_gather(mean_S, local_axis, subgroup=True)
    out = unravel(mean_MxS.reshape(-1)[:d])
    out = [x.astype(g.dtype) for x, g in zip(out, leaves, strict=True)]
    intra, inter = transfers(s, 1)
    new_state = HiTopKState(
      optax.safe_increment(state.count), state.key, residual, cstate, intra, inter
    )
    return jax.tree.unflatten(jax.tree.structure(updates), out), new_state

  return optax.GradientTransformation(init_fn, update_fn)


def _checked(compressor, node_axis, local_axis, local_size) -> Compressor:
  """hitopk_allreduce's argument checks; the sparsifier each shard uses."""
  if not isinstance(compressor, Compressor) or not compressor.sparse:
    raise ValueError(
      'compressor must be a jaxdist.compress sparsifier (mstopk, topk, dgc, threshold), '
      f'got {compressor!r}'
    )
  for name, axis in (('node_axis', node_axis), ('local_axis', local_axis)):
    if not isinstance(axis, str) or not axis:
      raise ValueError(f'{name} must be one axis name (a str), got {axis!r}')
  if node_axis == local_axis:
    raise ValueError(f'node_axis and local_axis must differ, got {node_axis!r} for both')
  if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
    raise ValueError(f'local_size must be an int >= 1, got {local_size!r}')
  if getattr(compressor, 'k', None) is not None:
    return dataclasses.replace(compressor, k=-(-compressor.k // local_size))
  return compressor


def _check_axis(local_axis: str, local_size: int) -> None:
  """Fails at trace time when the mesh does not hold `local_size` workers per node."""
  got = lax.axis_size(local_axis)
  if got != local_size:
    raise ValueError(
      f'local_axis {local_axis!r} holds {got} workers per node, but local_size={local_size}: '
      f'lay the workers out as nodes x {local_size} (e.g. runtime.layout(workers, '
      f'devices=workers // {local_size}) for node_axis="data", local_axis="sim")'
    )
