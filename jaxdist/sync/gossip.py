"""Decentralised averaging (gossip): each worker mixes with its neighbours only.

After its local step, worker i takes Σ_j W_ij x_j over itself and its
neighbours, with a doubly-stochastic mixing matrix W of the topology:

- 'ring': neighbours i ± 1, weight 1/3 each (with self);
- 'torus': a rows × cols grid with wrap-around, 4 neighbours, weight 1/5;
- 'exponential': neighbours i − 2^k for 2^k < N, weight 1/(log2 N + 1)
  (the one-way exponential graph of Assran et al. 2019);
- 'complete': everybody, weight 1/N (exact averaging, for reference).

Neighbour exchanges are collective-permutes (`comm.shift`): no all-reduce
and no global model; the trainer evaluates the workers' mean, which is the
optional final average. Adapt-then-combine order (local step, then mix), as
D-PSGD's variants in Lian et al. 2017 allow.

Reference: Lian et al. Can Decentralized Algorithms Outperform Centralized
Algorithms? NeurIPS 2017. https://arxiv.org/abs/1705.09056
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdist import comm

TOPOLOGIES = ('ring', 'torus', 'exponential', 'complete')


def _torus_shape(n: int, rows: int | None) -> tuple[int, int]:
  if rows is None:
    rows = math.isqrt(n)
  if rows < 1 or n % rows:
    raise ValueError(f'a torus needs rows dividing the {n} workers, got rows={rows}')
  return rows, n // rows


def check_topology(topology: str, n: int, rows: int | None = None) -> None:
  """Raises ValueError if `topology` cannot connect n workers."""
  if topology not in TOPOLOGIES:
    raise ValueError(f'topology must be one of {TOPOLOGIES}, got {topology!r}')
  if topology == 'torus':
    r, c = _torus_shape(n, rows)
    if r < 3 or c < 3:
      raise ValueError(
        f'a torus of {n} workers as {r} x {c} has repeated neighbours; it needs at least 3 x 3 '
        f'(e.g. 9, 12 or 16 workers), or choose ring/exponential'
      )
  elif n < 2:
    raise ValueError(f'{topology} gossip needs at least 2 workers, got {n}')


def _offsets(topology: str, n: int) -> list[int]:
  """Cyclic offsets of the neighbours (receive from i - offset)."""
  if topology == 'ring':
    return sorted({1 % n, -1 % n} - {0})
  if topology == 'exponential':
    return [1 << k for k in range(max(1, (n - 1).bit_length())) if (1 << k) < n]
  if topology == 'complete':
    return list(range(1, n))
  raise AssertionError(topology)


def mixing_matrix(topology: str, n: int, rows: int | None = None) -> np.ndarray:
  """W [n, n]: worker i's new model is Σ_j W[i, j] x_j."""
  check_topology(topology, n, rows)
  w = np.zeros((n, n))
  if topology == 'torus':
    r, c = _torus_shape(n, rows)
    for i in range(n):
      y, x = divmod(i, c)
      for j in (
        i,
        ((y + 1) % r) * c + x,
        ((y - 1) % r) * c + x,
        y * c + (x + 1) % c,
        y * c + (x - 1) % c,
      ):
        w[i, j] += 1 / 5
    return w
  offsets = _offsets(topology, n)
  for i in range(n):
    w[i, i] += 1 / (len(offsets) + 1)
    for k in offsets:
      w[i, (i - k) % n] += 1 / (len(offsets) + 1)
  return w


class GossipState(NamedTuple):
  """State of `gossip`.

  Attributes:
    wire: one collective-permute per neighbour exchange. Per-worker.
  """

  wire: tuple


def gossip(
  topology: str = 'ring',
  *,
  axis_name: comm.AxisName,
  num_workers: int,
  rows: int | None = None,
) -> optax.GradientTransformation:
  """Mixes each worker's model with its neighbours' after the local step.

  Put it after the optimizer: `optax.chain(optax.sgd(0.1), gossip('ring',
  axis_name=...))`.

  Args:
    topology: 'ring', 'torus', 'exponential' or 'complete'.
    axis_name: the worker axis (or tuple of axes).
    num_workers: N, the number of workers on `axis_name` (the topology is
      checked against it here, and against the axis when the step is traced).
    rows: rows of the torus (default: the integer square root of N).
  """
  check_topology(topology, num_workers, rows)

  def exchanges(n):
    """[(offset, select_columns)]: each a shift; torus wraps need two shifts and a select."""
    if topology != 'torus':
      return [(k, None) for k in _offsets(topology, n)]
    _, c = _torus_shape(n, rows)
    # vertical: whole rows; horizontal: +1 / -1 except at the row's wrap
    return [(c, None), (-c, None), (1, 0), (-(c - 1), 0), (-1, c - 1), (c - 1, c - 1)]

  def init_fn(params):
    sent = comm.transfer(comm.PERMUTE, comm.tree_nbytes(params), 0)
    return GossipState(wire=tuple(sent for _ in exchanges(num_workers)))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('gossip needs params: call update(updates, state, params)')
    n = comm.axis_size(axis_name)
    if n == 1:  # a lone worker (e.g. timing one worker's step) has nobody to mix with
      return updates, comm.silence(state)
    if n != num_workers:
      raise ValueError(f'gossip was built for {num_workers} workers, but {axis_name} has {n}')
    local = optax.apply_updates(params, updates)
    plan = exchanges(n)
    received, wire = [], []
    for offset, _ in plan:
      got, sent = comm.shift(local, offset, axis_name)
      received.append(got)
      wire.append(sent)
    if topology == 'torus':
      _, c = _torus_shape(n, rows)
      column = comm.axis_index(axis_name) % c
      pick = lambda a, b, edge: jax.tree.map(lambda u, v: jnp.where(column == edge, v, u), a, b)
      up, down, right, right_wrap, left, left_wrap = received
      received = [up, down, pick(right, right_wrap, 0), pick(left, left_wrap, c - 1)]
    weight = 1 / (len(received) + 1)
    mixed = jax.tree.map(lambda x, *others: weight * (x + sum(others)), local, *received)
    return optax.tree.sub(mixed, params), GossipState(wire=tuple(wire))

  return optax.GradientTransformation(init_fn, update_fn)
