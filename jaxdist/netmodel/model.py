"""α-β cost of collectives, network profiles, and calibration.

A link costs α seconds per message (latency) plus β seconds per byte
(β = 1/bandwidth). For N workers and M bytes (log base 2), from Table I of
Tyagi & Swany (2023):

  ring all-reduce     2(N-1)α + 2(N-1)/N·Mβ
  tree all-reduce     2α·log N + 2·log N·Mβ
  parameter server    2α + 2(N-1)Mβ
  broadcast (tree)    α·log N + log N·Mβ
  all-gather          α·log N + (N-1)Mβ        (M = each worker's part)
  permute             α + Mβ                   (one neighbour exchange)
  gossip round        d(α + Mβ)                (d neighbours, one permute each)
  all-to-all          (N-1)α + (N-1)/N·Mβ

AR-Top-k prices as a broadcast of the leader's indices plus an all-reduce of
the values, which reproduces the paper's ART-Ring (4a) and ART-Tree (4b).

Reference: Tyagi & Swany. Flexible Communication for Optimal Distributed
Learning over Unpredictable Networks. IEEE BigData 2023.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from jaxdist import comm

ALGORITHMS = ('ring', 'tree', 'ps')


@dataclasses.dataclass(frozen=True)
class Network:
  """A link: `latency` α in seconds, `bandwidth` in bytes per second.

  Attributes:
    latency: α, seconds per message (>= 0).
    bandwidth: bytes per second (> 0); β = 1 / bandwidth.
    name: what `str` shows ('' for '<Gbit/s>gbps@<α>us').
  """

  latency: float
  bandwidth: float
  name: str = ''

  def __post_init__(self):
    if self.latency < 0:
      raise ValueError(f'latency must be >= 0 seconds, got {self.latency}')
    if self.bandwidth <= 0:
      raise ValueError(f'bandwidth must be > 0 bytes/s, got {self.bandwidth}')

  @property
  def beta(self) -> float:
    """Seconds per byte."""
    return 1.0 / self.bandwidth

  def __str__(self) -> str:
    return self.name or f'{self.bandwidth * 8 / 1e9:g}gbps@{self.latency * 1e6:g}us'


def gbps(gbit_per_s: float, latency_s: float, name: str = '') -> Network:
  """A `Network` of `gbit_per_s` Gbit/s.

  Args:
    gbit_per_s: the bandwidth in Gbit/s (10^9 bits).
    latency_s: α, in seconds.
    name: the network's name.

  Returns:
    The `Network`, its bandwidth in bytes per second.
  """
  return Network(latency=latency_s, bandwidth=gbit_per_s * 1e9 / 8, name=name)


# Representative latencies (assumptions, not measurements): commodity TCP over
# 1 and 10 GbE, and RDMA at 100 Gbit/s.
PROFILES = {
  '1gbps': gbps(1, 100e-6, '1gbps'),
  '10gbps': gbps(10, 25e-6, '10gbps'),
  '100gbps': gbps(100, 5e-6, '100gbps'),
}

_NUMBER = r'\d+(?:\.\d+)?'
_SPEC = re.compile(rf'^(?P<bw>{_NUMBER})gbps(?:@(?P<lat>{_NUMBER})(?P<unit>s|ms|us))?$')
DEFAULT_LATENCY = 25e-6  # of a spec that gives none


def profile(name: str) -> Network:
  """A named profile ('1gbps', '10gbps', '100gbps') or a spec like '20gbps@4ms'.

  A spec without a latency ('40gbps') gets `DEFAULT_LATENCY`.

  Args:
    name: the profile or spec (latency in s, ms or us; case and spaces
      ignored).

  Returns:
    The `Network`.

  Raises:
    ValueError: if `name` is neither.
  """
  key = name.replace(' ', '').lower()
  if key in PROFILES:
    return PROFILES[key]
  m = _SPEC.match(key)
  if not m:
    raise ValueError(
      f'unknown network profile {name!r}; use one of {sorted(PROFILES)} or a spec like "20gbps@4ms"'
    )
  scale = {'s': 1.0, 'ms': 1e-3, 'us': 1e-6}
  latency = float(m['lat']) * scale[m['unit']] if m['lat'] else DEFAULT_LATENCY
  return gbps(float(m['bw']), latency, key)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A network that changes over training: phases of `steps` steps, repeated.

  Attributes:
    phases: (steps, Network) pairs, in order.
  """

  phases: tuple[tuple[int, Network], ...]

  def __post_init__(self):
    if not self.phases or any(s < 1 for s, _ in self.phases):
      raise ValueError('a schedule needs phases of at least one step each')

  def at(self, step: int) -> Network:
    """The network in force at `step`.

    Args:
      step: the 0-based step; the phases repeat.

    Returns:
      The phase's `Network`.
    """
    t = step % sum(s for s, _ in self.phases)
    for steps, net in self.phases:
      if t < steps:
        return net
      t -= steps
    raise AssertionError


def network_at(net: Network | Schedule, step: int) -> Network:
  """The network in force at `step` (a fixed one, or a schedule's phase).

  Args:
    net: a `Network` or a `Schedule`.
    step: the 0-based step.

  Returns:
    The `Network`.
  """
  return net.at(step) if isinstance(net, Schedule) else net


_SCHEDULE = re.compile(r'^adopt_c1@(?P<steps>\d+)$')


def resolve(name: str) -> Network | Schedule:
  """A profile or spec (see `profile`), or 'adopt_c1@<steps per phase>'.

  Args:
    name: the profile, spec or schedule.

  Returns:
    A `Network`, or the `Schedule` of 'adopt_c1@...'.
  """
  m = _SCHEDULE.match(name.replace(' ', '').lower())
  if m:
    steps = int(m['steps'])
    if steps < 1:
      raise ValueError(f'adopt_c1 needs >= 1 step per phase, got {name!r}')
    return adopt_c1(steps)
  return profile(name)


def adopt_c1(steps_per_phase: int) -> Schedule:
  """The varying network of Tyagi & Swany's ADOPT experiments (their code's schedule).

  (α ms, Gbit/s) steps from (1, 25) to (32, 1) and back, `steps_per_phase`
  each; both ends are held for two phases, as in their schedule.

  Args:
    steps_per_phase: steps each network holds (>= 1).

  Returns:
    The `Schedule` of 12 phases.
  """
  up = [(1, 25), (2, 20), (4, 15), (8, 10), (16, 5), (32, 1)]
  cycle = up + up[::-1]
  return Schedule(
    tuple((steps_per_phase, gbps(bw, ms * 1e-3, f'{bw}gbps@{ms}ms')) for ms, bw in cycle)
  )


# --- costs ---------------------------------------------------------------------


def _log2(n: int) -> float:
  return math.log2(n) if n > 1 else 0.0


def allreduce(nbytes: float, n: int, net: Network, algorithm: str = 'ring') -> float:
  """Seconds an all-reduce of M bytes takes (the module docstring's table).

  Args:
    nbytes: M, each worker's payload.
    n: N, the workers.
    net: the link.
    algorithm: 'ring', 'tree' or 'ps' (parameter server).

  Returns:
    Seconds (0 for one worker).
  """
  if n <= 1:
    return 0.0
  a, b = net.latency, net.beta
  if algorithm == 'ring':
    return 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes * b
  if algorithm == 'tree':
    return 2 * a * _log2(n) + 2 * _log2(n) * nbytes * b
  if algorithm == 'ps':
    return 2 * a + 2 * (n - 1) * nbytes * b
  raise ValueError(f'algorithm must be one of {ALGORITHMS}, got {algorithm!r}')


def broadcast(nbytes: float, n: int, net: Network) -> float:
  """Seconds a tree broadcast of M bytes takes: α·log N + log N·Mβ.

  Args:
    nbytes: M.
    n: N, the workers.
    net: the link.

  Returns:
    Seconds (0 for one worker).
  """
  return 0.0 if n <= 1 else net.latency * _log2(n) + _log2(n) * nbytes * net.beta


def allgather(nbytes: float, n: int, net: Network) -> float:
  """Seconds an all-gather takes: α·log N + (N − 1)Mβ.

  Args:
    nbytes: M, each worker's part.
    n: N, the workers.
    net: the link.

  Returns:
    Seconds (0 for one worker).
  """
  return 0.0 if n <= 1 else net.latency * _log2(n) + (n - 1) * nbytes * net.beta


def permute(nbytes: float, net: Network, n: int = 2) -> float:
  """Seconds one neighbour exchange of M bytes takes: α + Mβ.

  Args:
    nbytes: M.
    net: the link.
    n: N, the workers (one: nothing to exchange).

  Returns:
    Seconds (0 for one worker).
  """
  return 0.0 if n <= 1 else net.latency + nbytes * net.beta


def gossip(nbytes: float, degree: int, net: Network) -> float:
  """One decentralised averaging round: exchange M bytes with each of `degree` neighbours.

  Args:
    nbytes: M.
    degree: d, the neighbours.
    net: the link.

  Returns:
    Seconds, d(α + Mβ).
  """
  return degree * permute(nbytes, net)


def alltoall(nbytes: float, n: int, net: Network) -> float:
  """Seconds an all-to-all takes: (N − 1)α + (N − 1)/N·Mβ.

  Args:
    nbytes: M, each worker's payload.
    n: N, the workers.
    net: the link.

  Returns:
    Seconds (0 for one worker).
  """
  return 0.0 if n <= 1 else (n - 1) * net.latency + (n - 1) / n * nbytes * net.beta


def artopk(value_bytes: float, n: int, net: Network, algorithm: str = 'ring') -> float:
  """AR-Top-k: broadcast of the leader's k indices + all-reduce of k values.

  Args:
    value_bytes: the k values' bytes (the indices' are taken as the same).
    n: N, the workers.
    net: the link.
    algorithm: the all-reduce's, as `allreduce`.

  Returns:
    Seconds.
  """
  return broadcast(value_bytes, n, net) + allreduce(value_bytes, n, net, algorithm)


def sent_bytes(t: comm.Transfer, num_workers: int) -> float:
  """Bytes one worker sends for one run of `t`, with a bandwidth-optimal algorithm.

  Ring all-reduce sends 2(N-1)/N of the payload, ring all-gather (N-1) times
  it, all-to-all (N-1)/N of it, a permute all of it, a pipelined broadcast
  (N-1)/N of it (each byte once). Other algorithms (tree, parameter server)
  are priced by `transfer_time`.

  Args:
    t: the transfer (its kind, payload and `op`).
    num_workers: N.

  Returns:
    Bytes, for one run (0 for one worker).

  Example:
    >>> from jaxdist import comm, netmodel
    >>> netmodel.sent_bytes(comm.transfer(comm.ALL_REDUCE, 800), 8)
    1400.0
  """
  n = num_workers
  if n <= 1:
    return 0.0
  if t.op == 'broadcast':
    return (n - 1) / n * t.nbytes
  factor = {
    comm.ALL_REDUCE: 2 * (n - 1) / n,
    comm.ALL_GATHER: n - 1,
    comm.ALL_TO_ALL: (n - 1) / n,
    comm.PERMUTE: 1,
  }[t.kind]
  return factor * t.nbytes


def transfer_time(t: comm.Transfer, n: int, net: Network, algorithm: str = 'ring') -> float:
  """Seconds one run of `t` takes among n workers.

  Args:
    t: the transfer (a broadcast `op` prices as `broadcast`).
    n: N, the workers.
    net: the link.
    algorithm: the all-reduce's, as `allreduce`.

  Returns:
    Seconds.

  Raises:
    ValueError: for a kind with no cost model.
  """
  if t.op == 'broadcast':
    return broadcast(t.nbytes, n, net)
  if t.kind == comm.ALL_REDUCE:
    return allreduce(t.nbytes, n, net, algorithm)
  if t.kind == comm.ALL_GATHER:
    return allgather(t.nbytes, n, net)
  if t.kind == comm.PERMUTE:
    return permute(t.nbytes, net, n)
  if t.kind == comm.ALL_TO_ALL:
    return alltoall(t.nbytes, n, net)
  raise ValueError(f'no cost model for {t.kind!r}')


def comm_time(
  transfers: Sequence[comm.Transfer],
  n: int,
  net: Network,
  algorithm: str = 'ring',
  counts: Sequence[int] | None = None,
  overlap: bool | None = None,
) -> float:
  """Seconds the `transfers` of one step take, each times its count.

  Args:
    transfers: the step's `Transfer`s.
    n: N, the workers.
    net: the link.
    algorithm: the all-reduce's, as `allreduce`.
    counts: how many times each ran (None: their own counts).
    overlap: True only transfers that overlap the next step's compute,
      False only those the step waits for, None all.

  Returns:
    Seconds, Σ count × `transfer_time`.
  """
  counts = [int(t.count) for t in transfers] if counts is None else counts
  return sum(
    c * transfer_time(t, n, net, algorithm)
    for t, c in zip(transfers, counts, strict=True)
    if overlap is None or t.overlap == overlap
  )


def step_time(compute_s: float, blocking_s: float, overlapped_s: float) -> float:
  """A step's modelled time: compute, what it waits for, and what compute cannot hide.

  Args:
    compute_s: the step's compute seconds.
    blocking_s: communication seconds it waits for.
    overlapped_s: communication seconds that run behind the next compute.

  Returns:
    compute_s + blocking_s + max(0, overlapped_s − compute_s).
  """
  return compute_s + blocking_s + max(0.0, overlapped_s - compute_s)
