"""Decentralised averaging (gossip): each worker mixes with its neighbours only.

After its local step, worker i takes Σ_j W_ij x_j over itself and its
neighbours, with a doubly-stochastic mixing matrix W of the topology:

- 'ring': neighbours i ± 1, weight 1/3 each (with self);
- 'torus': a rows × cols grid with wrap-around, 4 neighbours, weight 1/5;
- 'exponential': all neighbours i − 2^k for 2^k < N every step: ⌈log2 N⌉
  of them, weight 1/(⌈log2 N⌉ + 1) (the static one-way exponential graph);
- 'one_peer_exponential': at step t the one neighbour i − 2^(t mod ⌈log2 N⌉),
  weight 1/2 (the time-varying exponential graph of SGP, Assran et al. 2019;
  one permute per step; for N a power of two, log2 N consecutive steps
  average exactly, Ying et al. 2021);
- 'complete': everybody, weight 1/N (exact averaging, for reference).

Neighbour exchanges are collective-permutes (`comm.shift`): no all-reduce
and no global model; the trainer evaluates the workers' mean, which is the
optional final average. Adapt-then-combine order (local step, then mix), as
D-PSGD's variants in Lian et al. 2017 allow.

References:
  Lian et al. Can Decentralized Algorithms Outperform Centralized
  Algorithms? NeurIPS 2017. https://arxiv.org/abs/1705.09056
  Assran et al. Stochastic Gradient Push for Distributed Deep Learning.
  ICML 2019. https://arxiv.org/abs/1811.10792
  Ying et al. Exponential Graph is Provably Efficient for Decentralized Deep
  Training. NeurIPS 2021. https://arxiv.org/abs/2110.13363
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync import _checks

TOPOLOGIES = ('ring', 'torus', 'exponential', 'one_peer_exponential', 'complete')


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
  if topology in ('exponential', 'one_peer_exponential'):
    return [1 << k for k in range(max(1, (n - 1).bit_length())) if (1 << k) < n]
  if topology == 'complete':
    return list(range(1, n))
  raise AssertionError(topology)


def mixing_matrix(topology: str, n: int, rows: int | None = None, *, step: int = 0) -> np.ndarray:
  """W [n, n]: worker i's new model is Σ_j W[i, j] x_j (at `step`, for 'one_peer_exponential').

  Args:
    topology: one of `TOPOLOGIES`: 'ring', 'torus', 'exponential',
      'one_peer_exponential' or 'complete'.
    n: the number of workers.
    rows: the torus's rows (None: ⌊√n⌋); only 'torus' reads it.
    step: the step whose single peer 'one_peer_exponential' averages with
      (the offsets 1, 2, 4, ... in turn); the other topologies ignore it.

  Returns:
    A float64 numpy array [n, n], each row summing to 1: a worker averages
    itself and its neighbours with equal weights.

  Raises:
    ValueError: if `topology` is unknown or cannot connect `n` workers.

  Example:
    >>> from jaxdist import sync
    >>> sync.mixing_matrix('exponential', 6)[0]  # from 0 - 1, 0 - 2, 0 - 4: 1/(⌈log2 6⌉ + 1)
    array([0.25, 0.  , 0.25, 0.  , 0.25, 0.25])
    >>> sync.mixing_matrix('one_peer_exponential', 6, step=2)[0]  # from 0 - 2^(2 mod 3)
    array([0.5, 0. , 0.5, 0. , 0. , 0. ])
  """
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
  if topology == 'one_peer_exponential':  # one of them per step, in turn
    offsets = [offsets[step % len(offsets)]]
  for i in range(n):
    w[i, i] += 1 / (len(offsets) + 1)
    for k in offsets:
      w[i, (i - k) % n] += 1 / (len(offsets) + 1)
  return w


class GossipState(NamedTuple):
  """State of `gossip`.

  Attributes:
    count: update calls so far (picks the peer of 'one_peer_exponential').
      Replicated.
    wire: one collective-permute per neighbour exchange. Per-worker.
  """

  count: jax.Array
  wire: tuple


def gossip(
  topology: str = 'ring',
  *,
  axis_name: comm.AxisName,
  num_workers: int,
  rows: int | None = None,
) -> optax.GradientTransformation:
  """Mixes each worker's model with its neighbours' after the local step (D-PSGD).

  x_i(t+1) = Σ_j W_ij(t) (x_j(t) + u_j(t)), u_j the local optimizer's update
  and W(t) = `mixing_matrix(topology, N, step=t)`, doubly stochastic (fixed
  except for 'one_peer_exponential'). Put it after the optimizer:
  `optax.chain(optax.sgd(0.1), gossip('ring', axis_name=...))`.

  'one_peer_exponential' is the time-varying directed exponential graph of
  SGP (Assran et al. 2019; `DynamicDirectedExponentialGraph` in the authors'
  PyTorch code, the "one-peer exponential graph" of Ying et al. 2021): at
  step t worker i averages with worker i − 2^(t mod ⌈log2 N⌉), weights 1/2,
  one collective-permute per step. It departs from SGP in two ways: plain
  averaging instead of push-sum (every worker receives from exactly one
  peer, so the push-sum weights stay 1 and the two agree), and one direction
  only (the authors' code alternates i + 2^k and i − 2^k), which gives Ying
  et al.'s exact averaging over log2 N steps when N is a power of two.

  Args:
    topology: 'ring', 'torus', 'exponential', 'one_peer_exponential' or
      'complete'.
    axis_name: the worker axis (or tuple of axes).
    num_workers: N, the number of workers on `axis_name` (the topology is
      checked against it here, and against the axis when the step is traced).
    rows: rows of the torus (default: the integer square root of N).

  Returns:
    An `optax.GradientTransformation` whose updates move each worker to its
    mixed model.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> mix = sync.gossip('one_peer_exponential', axis_name=runtime.AXES, num_workers=4)
    >>> run = testing.Run(optax.chain(optax.sgd(1.0), mix), {'x': jnp.zeros(())}, workers=4)
    >>> run({'x': -jnp.arange(4.0)})['x']  # steps to 0, 1, 2, 3, then mixes with i - 1
    Array([1.5, 0.5, 1.5, 2.5], dtype=float32)
    >>> run({'x': jnp.zeros(4)})['x']  # with i - 2: log2 N steps average exactly
    Array([1.5, 1.5, 1.5, 1.5], dtype=float32)
    >>> run.history  # one collective-permute per step
    [[1], [1]]

  References:
    Lian et al. Can Decentralized Algorithms Outperform Centralized
    Algorithms? NeurIPS 2017. https://arxiv.org/abs/1705.09056
    Assran et al. Stochastic Gradient Push for Distributed Deep Learning.
    ICML 2019. https://arxiv.org/abs/1811.10792
    Ying et al. Exponential Graph is Provably Efficient for Decentralized
    Deep Training. NeurIPS 2021. https://arxiv.org/abs/2110.13363

  (Longer than 80 lines only for its documentation; the steps are helpers.)
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
    per_step = 1 if topology == 'one_peer_exponential' else len(exchanges(num_workers))
    return GossipState(count=jnp.zeros([], jnp.int32), wire=(sent,) * per_step)

  def update_fn(updates, state, params=None):
    _checks.needs_params('gossip', params)
    n = comm.axis_size(axis_name)
    count = optax.safe_increment(state.count)
    if n == 1:  # a lone worker (e.g. timing one worker's step) has nobody to mix with
      return updates, GossipState(count, comm.silence(state.wire))
    if n != num_workers:
      raise ValueError(f'gossip was built for {num_workers} workers, but {axis_name} has {n}')
    local = optax.apply_updates(params, updates)
    plan = [] if topology == 'one_peer_exponential' else exchanges(n)
    received, wire = [], []
    if topology == 'one_peer_exponential':  # one switch branch per offset: one permute runs
      offsets = _offsets(topology, n)
      shifts = [lambda x, k=k: comm.shift(x, k, axis_name) for k in offsets]
      turn = comm.agree(state.count % len(offsets), axis_name)
      got, sent = lax.switch(turn, shifts, local)
      received, wire = [got], [sent]
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
    return optax.tree.sub(mixed, params), GossipState(count, tuple(wire))

  return optax.GradientTransformation(init_fn, update_fn)
