"""A heterogeneous cluster and the modelled clock of each of its workers.

`Cluster` describes the workers a run pretends to have: relative compute
speeds (static heterogeneity, e.g. the CPU cores of Tyagi & Sharma's H-levels),
speeds that change on a schedule, stochastic stragglers, per-worker stream
rates and a price per worker-hour. `WorkerClock` advances one clock per worker
through a run, step by step, and applies the waiting rule of the method.

Notation: step t = 0, 1, ...; worker k of K. Worker k's compute time of step t is

  c[t, k] = b[t, k] / v[t, k] · e · (σ if k straggles at t, else 1)

with b its batch, v its speed (phase factor included), e the measured
seconds per example of one worker on this machine, σ the straggler slowdown.
With m[t] the blocking and h[t] the overlapped communication seconds of the
step (from the ledger), the worker's own step takes

  s[t, k] = netmodel.step_time(c[t, k], m[t], h[t]) = m[t] + max(c[t, k], h[t]).

F[t, k] is the time worker k finishes step t (F[−1, k] = 0). The rules:

  bsp         F[t, k] = max_j (F[t−1, j] + s[t, j])        every step is a barrier
  periodic    as bsp at a synchronising step (default: m[t] > 0), else
              F[t, k] = F[t−1, k] + s[t, k]               (local SGD, DiLoCo, SelSync)
  ssp         F[t, k] = max(F[t−1, k], max_j F[t−S−1, j]) + s[t, k]
              a worker may start step t only when every worker has finished
              step t−S−1, i.e. it runs at most S steps ahead of the slowest
  async       F[t, k] = F[t−1, k] + s[t, k]               never waits
  neighbours  F[t, k] = max_{j ∈ {k} ∪ in(k)} (F[t−1, j] + s[t, j])
              gossip: a worker mixes after the models it receives are ready

The cluster's time after step t is max_k F[t, k]; a step's time is its
increase. SSP with S = 0 ends at the same time as BSP; with equal speeds and
no stragglers every rule gives Σ_t netmodel.step_time(c, m[t], h[t]), the
clock of `jaxdist.train.ledger.modelled_clock`. Cost = K × time / 3600 ×
price: every worker is paid for while it waits (Scavenger's C = T·K·p).

References: Tyagi & Sharma. Taming Resource Heterogeneity In Distributed ML
Training With Dynamic Batching. IEEE ACSOS 2020 (H-levels: cores (9, 12, 18)
and (2, 17, 20)). Ho et al. More Effective Distributed ML via a Stale
Synchronous Parallel Parameter Server. NeurIPS 2013. Tyagi & Sharma.
Scavenger. IEEE/ACM CCGrid 2023, https://arxiv.org/abs/2303.06659.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from jaxdist.netmodel.model import step_time

WAITS = ('bsp', 'periodic', 'ssp', 'async', 'neighbours')

# Tyagi & Sharma (ACSOS 2020) §V: three CPU workers, 39 cores in all; H-level
# = most cores / fewest cores.
H_LEVELS = {'h2': (9, 12, 18), 'h10': (2, 17, 20)}


def _floats(name: str, values: Sequence[float]) -> tuple[float, ...]:
  try:
    return tuple(float(v) for v in values)
  except (TypeError, ValueError):
    raise ValueError(f'{name} must be a sequence of numbers, got {values!r}') from None


@dataclasses.dataclass(frozen=True)
class Cluster:
  """K workers of different speeds, with stragglers, changing speeds, streams and a price.

  Attributes:
    speeds: relative compute speed of each worker (> 0): worker k takes
      b / speeds[k] × (measured seconds per example) for a batch of b. A
      speed of 1 is the machine the per-example time was measured on.
    straggler_p: probability that a worker straggles at a step, drawn per
      worker per step, in [0, 1].
    straggler_slowdown: a straggling worker's compute time is multiplied by
      this (>= 1).
    seed: seed of the straggler draws; draw (step, worker) depends on nothing
      else, so a resumed run draws the same.
    phases: speeds that change over training: (steps, factors) pairs, in
      order and repeated (as `netmodel.Schedule`); during a phase worker k's
      speed is speeds[k] × factors[k]. Empty: speeds hold throughout.
    stream_rates: samples per second arriving at each worker (ScaDLES), or
      () if the data is not streamed.
    price: price of one worker-hour (any currency); cost = K × hours × price.
    straggles: injected slowdowns (`config.fault.straggle`): (worker, factor,
      start, end) tuples; worker's compute time is multiplied by factor on
      0-based steps start <= t < end (`jaxdist.faults.inject.Straggle`).
    fixed_s: each worker's seconds a step whatever its batch (its loop on the
      host, dispatch), added to its compute on a step with examples, slowed
      down with it by stragglers, not changed by phases; () for none.
  """

  speeds: tuple[float, ...]
  straggler_p: float = 0.0
  straggler_slowdown: float = 2.0
  seed: int = 0
  phases: tuple[tuple[int, tuple[float, ...]], ...] = ()
  stream_rates: tuple[float, ...] = ()
  price: float = 0.0
  straggles: tuple[tuple[int, float, int, int], ...] = ()
  fixed_s: tuple[float, ...] = ()

  def __post_init__(self):
    speeds = _floats('speeds', self.speeds)
    if not speeds:
      raise ValueError('speeds must name at least one worker, got ()')
    if min(speeds) <= 0:
      raise ValueError(f'speeds must all be > 0, got {speeds}')
    if not 0.0 <= self.straggler_p <= 1.0:
      raise ValueError(f'straggler_p must be in [0, 1], got {self.straggler_p}')
    if self.straggler_slowdown < 1.0:
      raise ValueError(f'straggler_slowdown must be >= 1, got {self.straggler_slowdown}')
    if self.price < 0:
      raise ValueError(f'price must be >= 0 per worker-hour, got {self.price}')
    k = len(speeds)
    phases = []
    for i, phase in enumerate(self.phases):
      try:
        steps, factors = phase
      except (TypeError, ValueError):
        raise ValueError(f'phases[{i}] must be a (steps, factors) pair, got {phase!r}') from None
      factors = _floats(f'phases[{i}] factors', factors)
      if int(steps) != steps or steps < 1:
        raise ValueError(f'phases[{i}] must last >= 1 step, got {steps!r}')
      if len(factors) != k:
        raise ValueError(
          f'phases[{i}] has {len(factors)} speed factors, but speeds has {k} workers'
        )
      if min(factors) <= 0:
        raise ValueError(f'phases[{i}] speed factors must all be > 0, got {factors}')
      phases.append((int(steps), factors))
    rates, fixed = _floats('stream_rates', self.stream_rates), _floats('fixed_s', self.fixed_s)
    for name, values, unit in (('stream_rates', rates, 'samples/s'), ('fixed_s', fixed, 's')):
      if values and len(values) != k:
        raise ValueError(f'{name} has {len(values)} workers, but speeds has {k}')
      if values and min(values) < 0:
        raise ValueError(f'{name} must all be >= 0 {unit}, got {values}')
    for i, (worker, factor, start, end) in enumerate(self.straggles):
      if not 0 <= worker < k or factor < 1.0 or not 0 <= start < end:
        raise ValueError(
          f'straggles[{i}] must be (worker in [0, {k}), factor >= 1, start < end), '
          f'got {self.straggles[i]!r}'
        )
    object.__setattr__(self, 'speeds', speeds)
    object.__setattr__(self, 'phases', tuple(phases))
    object.__setattr__(self, 'stream_rates', rates)
    object.__setattr__(self, 'fixed_s', fixed)

  @classmethod
  def uniform(cls, num_workers: int, **kwargs) -> Cluster:
    """`num_workers` workers of speed 1 (today's homogeneous clock).

    Args:
      num_workers: K (>= 1).
      **kwargs: the other `Cluster` fields.

    Returns:
      The `Cluster`.
    """
    if num_workers < 1:
      raise ValueError(f'num_workers must be >= 1, got {num_workers}')
    return cls(speeds=(1.0,) * num_workers, **kwargs)

  @classmethod
  def from_cores(
    cls, cores: Sequence[float] | str, reference: float | None = None, **kwargs
  ) -> Cluster:
    """Speeds proportional to CPU cores (or any throughput estimate, e.g. FLOPs).

    Args:
      cores: cores of each worker, or an H-level name of `H_LEVELS` ('h2',
        'h10').
      reference: the cores of a speed-1 worker. Default: the mean, so the
        cluster has the throughput of K speed-1 workers and an H-level
        compares with the homogeneous cluster of the same total (the papers'
        39 cores = 3 × 13).
      **kwargs: the other `Cluster` fields.

    Returns:
      The `Cluster`.

    Example:
      >>> Cluster.from_cores('h10').speeds
      (0.15384615384615385, 1.3076923076923077, 1.5384615384615385)
    """
    if isinstance(cores, str):
      if cores.lower() not in H_LEVELS:
        raise ValueError(f'cores must be numbers or one of {sorted(H_LEVELS)}, got {cores!r}')
      cores = H_LEVELS[cores.lower()]
    cores = _floats('cores', cores)
    if not cores or min(cores) <= 0:
      raise ValueError(f'cores must all be > 0, got {cores}')
    reference = sum(cores) / len(cores) if reference is None else reference
    if reference <= 0:
      raise ValueError(f'reference must be > 0 cores, got {reference}')
    return cls(speeds=tuple(c / reference for c in cores), **kwargs)

  @property
  def num_workers(self) -> int:
    return len(self.speeds)

  @property
  def heterogeneity(self) -> float:
    """Fastest speed over slowest (the papers' H-level), ignoring phases."""
    return max(self.speeds) / min(self.speeds)

  def check_workers(self, num_workers: int) -> None:
    """Raises ValueError unless the cluster describes exactly `num_workers` workers.

    Args:
      num_workers: the run's K.
    """
    if num_workers != self.num_workers:
      raise ValueError(
        f'the cluster describes {self.num_workers} workers (speeds={self.speeds}), '
        f'but the run has {num_workers}'
      )

  def speeds_at(self, step: int) -> np.ndarray:
    """[K] speeds in force at `step` (0-based): `speeds`, times the phase's factors.

    Args:
      step: the 0-based step.

    Returns:
      float [K].
    """
    speeds = np.asarray(self.speeds)
    if not self.phases:
      return speeds
    t = step % sum(s for s, _ in self.phases)
    for steps, factors in self.phases:
      if t < steps:
        return speeds * np.asarray(factors)
      t -= steps
    raise AssertionError

  def stragglers(self, step: int) -> np.ndarray:
    """[K] bool: which workers straggle at `step` (seeded by (seed, step) only).

    Args:
      step: the 0-based step.

    Returns:
      bool [K].
    """
    if self.straggler_p == 0.0:
      return np.zeros(self.num_workers, bool)
    u = np.random.default_rng([self.seed, step]).random(self.num_workers)
    return u < self.straggler_p

  def compute_seconds(
    self, step: int, batches: Sequence[float] | float, per_example_s: float
  ) -> np.ndarray:
    """[K] seconds each worker computes at `step`: (fixed + b / speed × per-example) × slowdown.

    Args:
      step: the step (0-based), for the phase, the straggler draw and the
        injected straggles.
      batches: each worker's batch (examples), or one batch for all.
      per_example_s: measured seconds per example of a speed-1 worker.

    Returns:
      float [K].
    """
    b = np.broadcast_to(np.asarray(batches, float), (self.num_workers,))
    slow = np.where(self.stragglers(step), self.straggler_slowdown, 1.0)
    for worker, factor, start, end in self.straggles:
      if start <= step < end:
        slow[worker] *= factor
    fixed = np.where(b > 0, self.fixed_s or 0.0, 0.0)
    return (fixed + b / self.speeds_at(step) * per_example_s) * slow

  def cost(self, seconds: float) -> float:
    """Price of renting every worker for `seconds`: K × hours × price.

    Args:
      seconds: how long.

    Returns:
      The price, in `price`'s currency.
    """
    return self.num_workers * seconds / 3600.0 * self.price


class Timeline(NamedTuple):
  """A run on the modelled per-worker clock.

  Attributes:
    finish_s: [T, K] when each worker finished each step (F[t, k]).
    compute_s: [T, K] each worker's compute time per step (c[t, k]), the
      iteration times a controller such as dynamic batching observes.
    wait_s: [T, K] time each worker stood idle at each step, waiting for others.
    step_s: [T] increase of the cluster's time (max_k F) at each step.
    total_s: the cluster's time at the end.
    cost: K × total_s / 3600 × the cluster's price.
  """

  finish_s: np.ndarray
  compute_s: np.ndarray
  wait_s: np.ndarray
  step_s: np.ndarray
  total_s: float
  cost: float


def _in_neighbours(neighbours, k: int) -> np.ndarray:
  """[K, K] bool: worker k waits for j where True (itself included)."""
  w = np.asarray(neighbours)
  if w.ndim == 2:
    if w.shape != (k, k):
      raise ValueError(f'neighbours must be a [{k}, {k}] mixing matrix, got shape {w.shape}')
    waits = w != 0
  else:
    offsets = [int(o) for o in np.atleast_1d(w)]
    waits = np.zeros((k, k), bool)
    for i in range(k):
      for o in offsets:  # as comm.shift: worker i receives from i - offset
        waits[i, (i - o) % k] = True
  return waits | np.eye(k, dtype=bool)


class WorkerClock:
  """Per-worker modelled clocks, advanced one step at a time under a waiting rule.

  The rules and their formulas are in this module's docstring.

  Args:
    cluster: the workers.
    per_example_s: measured seconds per example of a speed-1 worker (one
      worker's step without communication over its batch).
    wait: 'bsp', 'periodic', 'ssp', 'async' or 'neighbours'.
    staleness: S of 'ssp': how many steps a worker may run ahead of the slowest.
    neighbours: of 'neighbours': a [K, K] mixing matrix (worker k waits for j
      where W[k, j] != 0, e.g. `jd.sync.mixing_matrix('ring', K)`), the
      offsets of `comm.shift` (worker k waits for k − offset), or a function
      of the step giving either, for a topology that changes every step
      (`lambda t: jd.sync.mixing_matrix('one_peer_exponential', K, step=t)`).
    start_step: the first step's index (phases and straggler draws follow it).

  Attributes:
    finish_s: [K] when each worker finished its last step (F[t, ·]).
    wait_s: [K] how long each worker stood idle in the last step.
    step: the index of the next step.

  Example:
    >>> clock = WorkerClock(Cluster(speeds=(1.0, 2.0)), per_example_s=0.01)
    >>> clock.advance([10, 10], comm_s=0.05)  # compute times; the fast one waits
    array([0.1 , 0.05])
    >>> round(clock.total_s, 6), clock.finish_s
    (0.15, array([0.15, 0.15]))
  """

  def __init__(
    self,
    cluster: Cluster,
    per_example_s: float,
    *,
    wait: str = 'bsp',
    staleness: int = 0,
    neighbours: Sequence | np.ndarray | Callable[[int], Sequence | np.ndarray] | None = None,
    start_step: int = 0,
  ):
    if wait not in WAITS:
      raise ValueError(f'wait must be one of {WAITS}, got {wait!r}')
    if per_example_s < 0:
      raise ValueError(f'per_example_s must be >= 0 seconds, got {per_example_s}')
    if staleness < 0 or int(staleness) != staleness:
      raise ValueError(f'staleness must be an integer >= 0, got {staleness}')
    if wait == 'neighbours' and neighbours is None:
      raise ValueError("wait='neighbours' needs neighbours (a mixing matrix or shift offsets)")
    self.cluster, self.per_example_s, self.wait = cluster, per_example_s, wait
    self.staleness = int(staleness)
    k = cluster.num_workers
    self._neighbours = neighbours if callable(neighbours) else None
    fixed = wait == 'neighbours' and not callable(neighbours)
    self._waits_for = _in_neighbours(neighbours, k) if fixed else None
    self.step = start_step
    self.finish_s = np.zeros(k)
    self.wait_s = np.zeros(k)
    # max_j F[u, j] of the last S + 1 steps u (SSP's barrier), 0 before the first
    self._done = collections.deque([0.0] * (self.staleness + 1), maxlen=self.staleness + 1)

  @property
  def total_s(self) -> float:
    """The cluster's time so far: when the last worker finished."""
    return float(self.finish_s.max())

  @property
  def cost(self) -> float:
    return self.cluster.cost(self.total_s)

  def advance(
    self,
    batches: Sequence[float] | float,
    comm_s: float = 0.0,
    overlap_s: float = 0.0,
    *,
    synced: bool | None = None,
    data_wait_s: Sequence[float] | float = 0.0,
  ) -> np.ndarray:
    """Advances every worker's clock by one step; returns [K] compute seconds (c[t, ·]).

    Args:
      batches: each worker's batch this step (or one for all).
      comm_s: the step's blocking communication seconds (ledger `comm_s@net`).
      overlap_s: its communication overlapping the next compute (`overlap_s@net`).
      synced: of 'periodic': whether this step synchronises (a barrier);
        default: comm_s > 0.
      data_wait_s: how long each worker (or every worker) waits for its
        data before it computes (streamed data, `jd.control.streams`).

    Returns:
      float [K], each worker's compute seconds this step.
    """
    compute = self.cluster.compute_seconds(self.step, batches, self.per_example_s)
    own = np.array([step_time(c, comm_s, overlap_s) for c in compute])  # s[t, k]
    own = own + np.broadcast_to(np.asarray(data_wait_s, float), own.shape)
    ready = self.finish_s + own  # each worker alone
    if self.wait == 'bsp' or (
      self.wait == 'periodic' and (comm_s > 0 if synced is None else synced)
    ):
      finish = np.full_like(ready, ready.max())
    elif self.wait == 'ssp':
      finish = np.maximum(self.finish_s, self._done[0]) + own
    elif self.wait == 'neighbours':
      waits = self._waits_for
      if self._neighbours is not None:
        waits = _in_neighbours(self._neighbours(self.step), len(ready))
      finish = np.where(waits, ready[None, :], -np.inf).max(axis=1)
    else:  # async, or a periodic step that does not synchronise
      finish = ready
    self.wait_s = finish - ready  # idle time of each worker this step
    self.finish_s = finish
    self._done.append(float(finish.max()))
    self.step += 1
    return compute


def simulate(
  cluster: Cluster,
  batches: np.ndarray | Sequence,
  per_example_s: float,
  comm_s: Sequence[float] | float = 0.0,
  overlap_s: Sequence[float] | float = 0.0,
  *,
  synced: Sequence[bool] | None = None,
  **clock_kwargs,
) -> Timeline:
  """A whole run on the per-worker clock (`WorkerClock` step by step).

  Args:
    cluster: the workers.
    batches: [T, K] batches per step and worker, or [T] (the same for all).
    per_example_s: measured seconds per example of a speed-1 worker.
    comm_s: [T] blocking communication seconds per step (or one for all).
    overlap_s: [T] overlapped communication seconds per step (or one for all).
    synced: [T] of 'periodic': which steps synchronise (default comm_s > 0).
    **clock_kwargs: `wait`, `staleness`, `neighbours`, `start_step`.

  Returns:
    The `Timeline`.
  """
  k = cluster.num_workers
  b = np.asarray(batches, float)
  if b.ndim == 1:
    b = np.repeat(b[:, None], k, axis=1)
  if b.ndim != 2 or b.shape[1] != k:
    raise ValueError(
      f'batches must be [steps, {k}] (one per worker of the cluster), got shape {b.shape}'
    )
  steps = b.shape[0]
  per_step = lambda name, x: _per_step(name, x, steps)
  comm, hidden = per_step('comm_s', comm_s), per_step('overlap_s', overlap_s)
  sync = [None] * steps if synced is None else list(per_step('synced', synced).astype(bool))
  clock = WorkerClock(cluster, per_example_s, **clock_kwargs)
  finish, compute, wait = (np.zeros((steps, k)) for _ in range(3))
  for t in range(steps):
    compute[t] = clock.advance(b[t], comm[t], hidden[t], synced=sync[t])
    finish[t], wait[t] = clock.finish_s, clock.wait_s
  total = np.concatenate([[0.0], finish.max(axis=1)])
  return Timeline(finish, compute, wait, np.diff(total), float(total[-1]), clock.cost)


def _per_step(name: str, x, steps: int) -> np.ndarray:
  a = np.asarray(x, float)
  if a.ndim == 0:
    return np.full(steps, float(a))
  if a.shape != (steps,):
    raise ValueError(f'{name} must have one value per step ({steps}), got shape {a.shape}')
  return a
