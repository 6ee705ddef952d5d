r"""CPR: checkpointing and partial recovery of embedding tables (Maeng et al., MLSys 2021).

Host-side and framework-free: the failure process, the checkpoint intervals,
the portion of lost samples, the choice of rows a prioritised checkpoint
saves, and a row-level checkpoint store with full and partial restore.
`jaxdist.train.failures` trains a DLRM with them in modelled time.

Readings of the paper (arXiv 2011.02999; the code is not public), with
notation: N embedding shards (here: workers, each owning T/N tables), T_fail
the mean time between failures of the job (any one shard fails; failures are
a Poisson process), O_save the time to write a full checkpoint, T_save the
checkpoint interval:

- **Full recovery**: on a failure every node rolls back to the last
  checkpoint; the work since it is lost and computed again. Young's interval
  minimises checkpoint + expected lost time: T_save* = √(2·O_save·T_fail).
- **Partial recovery**: only the failed shard reloads its last checkpoint;
  the others go on. No work is recomputed; the updates the shard received
  since its checkpoint are lost. A failure loses on average T_save/2 worth of
  samples on 1/N of the tables.
- **PLS**, the portion of lost samples, for failures f = 1..F with s_f the
  samples trained since the failed shard's last checkpoint (or its last
  restore, if later: what it already lost is not lost twice) and S the
  samples of the run: PLS = Σ_f s_f / (N · S). Its expectation is
  T_save / (2 · N · T_fail) (`expected_pls`); CPR reports accuracy loss about
  linear in PLS and picks the largest T_save whose PLS meets a target:
  T_save = 2 · PLS_target · N · T_fail (`pls_interval`).
- **CPR-MFU** saves the most-frequently-used rows more often than the rest;
  **CPR-SSU** saves a sub-sample of the used rows, which favours hot rows
  without per-row counters. Here (a reading, not the paper's stated
  schedule): full checkpoints every T_full, and between them `k − 1`
  prioritised checkpoints of a fraction φ of each shard's rows, spaced
  T_full / k. With T_full = T_save·(1 + (k − 1)·φ) the write budget equals
  plain partial recovery at T_save (`priority_schedule`), so the comparison
  is at equal checkpoint overhead. MFU ranks rows by lookups since the row
  was last saved (the updates a failure would lose); SSU records a uniform
  sample of lookups and saves the distinct sampled rows.

Also measured by `jaxdist.train.failures`: the lost updates, the row-level
form of PLS (lookups discarded by restores / all lookups). With one lookup
per table per example and T/N tables per shard it equals PLS for plain
partial recovery; for MFU/SSU it counts what the prioritised saves kept.

Simplifications: checkpoint time is charged in proportion to the rows
written (the MLP's share is neglected; DLRM's tables dominate); checkpoints
are host copies, not files; a failure is noticed at the end of the step it
falls in (one during a restart, at the restart's end); a node that fails is
replaced after `restart_s` and loads its shard, the MLP replica it held comes
from a surviving worker (nothing of it is lost); per-row optimizer state
(row-wise Adagrad's accumulators) is saved and restored with its row; every
strategy sees the same sequence of failure times on its own clock.

References: Maeng, Bharuka, Gao, Jeffrey, Saraph, Su, Trippel, Yang, Rabbat,
Lucia, Wu. CPR: Understanding and Improving Failure Tolerant Training for
Deep Learning Recommendation with Partial Recovery. MLSys 2021.
https://arxiv.org/abs/2011.02999 — Young. A first order approximation to the
optimum checkpoint interval. CACM 17(9), 1974.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

RECOVERIES = ('none', 'full', 'partial')
PRIORITIES = (None, 'mfu', 'ssu')


def _positive(name: str, value: float) -> float:
  if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
    raise ValueError(f'{name} must be > 0, got {value}')
  return float(value)


def _fraction(name: str, value: float) -> float:
  if not (isinstance(value, numbers.Real) and 0 < value < 1):
    raise ValueError(f'{name} must be in (0, 1), got {value}')
  return float(value)


def young_interval(save_s: float, mttf_s: float) -> float:
  """Young's checkpoint interval √(2·O_save·T_fail), seconds of work between checkpoints.

  Args:
    save_s: O_save, seconds a full checkpoint takes (> 0).
    mttf_s: T_fail, mean seconds between failures (> 0).

  Returns:
    The interval in seconds.

  >>> young_interval(2.0, 100.0)
  20.0
  """
  return math.sqrt(2 * _positive('save_s', save_s) * _positive('mttf_s', mttf_s))


def pls_interval(pls_target: float, mttf_s: float, num_shards: int) -> float:
  """CPR's interval for a PLS target: T_save = 2 · PLS · N · T_fail.

  Args:
    pls_target: the PLS to expect, in (0, 1).
    mttf_s: T_fail, mean seconds between failures.
    num_shards: N.

  Returns:
    T_save in seconds.

  >>> pls_interval(0.05, 100.0, 8)
  80.0
  """
  _fraction('pls_target', pls_target)
  if num_shards < 1:
    raise ValueError(f'num_shards must be >= 1, got {num_shards}')
  return 2 * pls_target * num_shards * _positive('mttf_s', mttf_s)


def expected_pls(interval_s: float, mttf_s: float, num_shards: int) -> float:
  """The PLS partial recovery expects at checkpoint interval T_save: T_save / (2·N·T_fail).

  Args:
    interval_s: T_save, seconds between checkpoints.
    mttf_s: T_fail, mean seconds between failures.
    num_shards: N.

  Returns:
    The expected PLS.

  >>> expected_pls(80.0, 100.0, 8)
  0.05
  """
  if num_shards < 1:
    raise ValueError(f'num_shards must be >= 1, got {num_shards}')
  return _positive('interval_s', interval_s) / (2 * num_shards * _positive('mttf_s', mttf_s))


def pls(lost_samples: Iterable[float], num_shards: int, total_samples: float) -> float:
  """Portion of lost samples: Σ_f s_f / (N · S).

  Args:
    lost_samples: per failure, the samples trained since the failed shard's
      last checkpoint or restore (whose updates to that shard were discarded).
    num_shards: N, the shards the embedding tables are split over.
    total_samples: S, the samples of the whole run.

  Returns:
    PLS, a float.

  >>> pls([100, 300], num_shards=4, total_samples=1000)
  0.1
  """
  if num_shards < 1:
    raise ValueError(f'num_shards must be >= 1, got {num_shards}')
  return float(sum(lost_samples)) / (num_shards * _positive('total_samples', total_samples))


@dataclasses.dataclass(frozen=True)
class Costs:
  """The modelled cluster: seconds of one step, of checkpoints and recoveries; failure rate.

  Attributes:
    step_s: one training step without failures.
    save_s: O_save, writing a full checkpoint (every table); a checkpoint of a
      fraction of the rows takes that fraction of it.
    load_s: reading a full checkpoint; a shard reads 1/N of it.
    restart_s: replacing a failed node, before it loads.
    mttf_s: T_fail, mean time between failures of the job (exponential).
  """

  step_s: float = 1.0
  save_s: float = 1.0
  load_s: float = 2.0
  restart_s: float = 1.0
  mttf_s: float = 300.0

  def __post_init__(self):
    for name in ('step_s', 'save_s', 'mttf_s'):
      _positive(name, getattr(self, name))
    for name in ('load_s', 'restart_s'):
      if getattr(self, name) < 0:
        raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')


def expected_overhead(
  recovery: str, interval_s: float, costs: Costs, num_shards: int, save_fraction: float = 1.0
) -> float:
  """First-order overhead as a fraction of the failure-free time.

  full:    O_save/T_save + (T_save/2 + O_load + O_restart) / T_fail
  partial: O_save/T_save + (O_load/N + O_restart) / T_fail

  Args:
    recovery: 'full' or 'partial'.
    interval_s: T_save, seconds between (full) checkpoints.
    costs: the modelled cluster (O_save, O_load, O_restart, T_fail).
    num_shards: N.
    save_fraction: scales O_save: the full checkpoints' worth of rows
      written per interval.

  Returns:
    The overhead, a fraction of the failure-free time.

  >>> costs = Costs(save_s=2, load_s=0, restart_s=0, mttf_s=100)
  >>> round(expected_overhead('full', 20.0, costs, num_shards=8), 3)
  0.2
  """
  _positive('interval_s', interval_s)
  save = costs.save_s * save_fraction / interval_s
  if recovery == 'full':
    return save + (interval_s / 2 + costs.load_s + costs.restart_s) / costs.mttf_s
  if recovery == 'partial':
    return save + (costs.load_s / num_shards + costs.restart_s) / costs.mttf_s
  raise ValueError(f"recovery must be 'full' or 'partial', got {recovery!r}")


class Failures(NamedTuple):
  """A failure trace of F failures.

  Attributes:
    times_s: [F] float64, increasing modelled seconds.
    workers: [F] int64, the worker each one fails.
  """

  times_s: np.ndarray
  workers: np.ndarray


def sample_failures(mttf_s: float, horizon_s: float, num_workers: int, seed: int) -> Failures:
  """Failures of a Poisson process of mean gap `mttf_s` up to `horizon_s`, each of one worker.

  Args:
    mttf_s: the mean gap, seconds.
    horizon_s: the last time that may fail, seconds.
    num_workers: failed workers are drawn uniformly from these.
    seed: seeds the gaps and the workers.

  Returns:
    The `Failures`.

  >>> f = sample_failures(10.0, 1000.0, 4, seed=0)
  >>> bool(np.all(np.diff(f.times_s) > 0)), set(f.workers.tolist()) <= {0, 1, 2, 3}
  (True, True)
  """
  _positive('mttf_s', mttf_s)
  if horizon_s < 0:
    raise ValueError(f'horizon_s must be >= 0, got {horizon_s}')
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  rng = np.random.default_rng(seed)
  times, t = [], 0.0
  while True:
    t += rng.exponential(mttf_s)
    if t > horizon_s:
      break
    times.append(t)
  workers = rng.integers(0, num_workers, size=len(times))
  return Failures(np.asarray(times, np.float64), workers.astype(np.int64))


def shard_tables(shard: int, num_tables: int, num_shards: int) -> range:
  """The tables shard `shard` owns: [k·T/N, (k+1)·T/N), as the hybrid layout places them.

  Args:
    shard: k, in [0, N).
    num_tables: T, a multiple of N.
    num_shards: N.

  Returns:
    The range of table indices.
  """
  if num_tables % num_shards:
    raise ValueError(f'num_tables ({num_tables}) must be a multiple of num_shards ({num_shards})')
  if not 0 <= shard < num_shards:
    raise ValueError(f'shard must be in [0, {num_shards}), got {shard}')
  per = num_tables // num_shards
  return range(shard * per, (shard + 1) * per)


def mfu_rows(counts_R: np.ndarray, k: int) -> np.ndarray:
  """The (at most) `k` rows with the most lookups, used rows only; ties to the lower id.

  Args:
    counts_R: [R] lookups of each row.
    k: the most rows to pick (>= 0).

  Returns:
    The rows' ids, ascending.

  >>> mfu_rows(np.array([3, 0, 5, 3, 1]), 3).tolist()
  [0, 2, 3]
  """
  if k < 0:
    raise ValueError(f'k must be >= 0, got {k}')
  counts_R = np.asarray(counts_R)
  order = np.argsort(-counts_R, kind='stable')[:k]
  return np.sort(order[counts_R[order] > 0])


def mfu_mask(counts_TxR: np.ndarray, tables: Sequence[int] | range, k: int) -> np.ndarray:
  """[T, R] mask of the `k` most-used rows among `tables` (one shard's), as `mfu_rows` ranks them.

  Args:
    counts_TxR: [T, R] lookups of each row.
    tables: the tables to choose from.
    k: the most rows to pick.

  Returns:
    bool [T, R].

  >>> mfu_mask(np.array([[0, 4], [2, 9], [7, 1]]), tables=[0, 1], k=2).astype(int).tolist()
  [[0, 1], [0, 1], [0, 0]]
  """
  counts_TxR = np.asarray(counts_TxR)
  idx = list(tables)
  flat = mfu_rows(counts_TxR[idx].reshape(-1), k)
  mask = np.zeros(counts_TxR.shape, bool)
  rows = counts_TxR.shape[1]
  mask[np.asarray(idx)[flat // rows], flat % rows] = True
  return mask


class SSUSampler:
  """CPR-SSU's record of used rows: a uniform sample of lookups, distinct rows, bounded.

  Each step `record` keeps each lookup with probability `rate` (so a row is
  kept about in proportion to how often it is used) until a shard holds
  `capacity` distinct rows; `take(shard)` returns them as a [T, R] mask and
  forgets them. No per-row counters: memory is the bounded sample.

  Args:
    num_tables: T.
    rows: R, rows per table.
    num_shards: N; T must be a multiple.
    capacity: distinct rows each shard keeps (>= 1).
    rate: the probability each lookup is kept, in (0, 1].
    seed: seeds the sample.

  >>> s = SSUSampler(num_tables=2, rows=4, num_shards=2, capacity=2, rate=1.0, seed=0)
  >>> s.record(np.array([[1, 3], [2, 3], [0, 0]]))
  >>> np.argwhere(s.take(0)).tolist(), np.argwhere(s.take(1)).tolist()
  ([[0, 1], [0, 2]], [[1, 0], [1, 3]])
  """

  def __init__(
    self, num_tables: int, rows: int, num_shards: int, capacity: int, rate: float, seed: int
  ):
    if capacity < 1:
      raise ValueError(f'capacity must be >= 1, got {capacity}')
    if not 0 < rate <= 1:
      raise ValueError(f'rate must be in (0, 1], got {rate}')
    shard_tables(0, num_tables, num_shards)  # validates the split
    self.num_tables, self.rows, self.num_shards = num_tables, rows, num_shards
    self.capacity, self.rate = capacity, rate
    self._rng = np.random.default_rng(seed)
    self._rows: list[dict[int, None]] = [{} for _ in range(num_shards)]

  def record(self, ids_BxT: np.ndarray) -> None:
    """Samples this step's lookups.

    Args:
      ids_BxT: [B, T] the step's row ids, one per table per example.
    """
    keep = self._rng.random(ids_BxT.shape) < self.rate
    _, t = np.nonzero(keep)
    keys = t.astype(np.int64) * self.rows + ids_BxT[keep]
    per = self.num_tables // self.num_shards
    for shard in range(self.num_shards):
      rows = self._rows[shard]
      mine = keys[(t // per) == shard]
      _, first = np.unique(mine, return_index=True)
      for key in mine[np.sort(first)]:  # first come, first kept
        if len(rows) >= self.capacity:
          break
        rows[int(key)] = None

  def take(self, shard: int) -> np.ndarray:
    """[T, R] mask of the rows sampled on `shard` since its last `take`; forgets them.

    Args:
      shard: the shard, in [0, N).

    Returns:
      bool [T, R].
    """
    mask = np.zeros(self.num_tables * self.rows, bool)
    mask[list(self._rows[shard])] = True
    self._rows[shard] = {}
    return mask.reshape(self.num_tables, self.rows)


class RowCheckpoint:
  """The last saved value of every embedding row, and the step it was saved at.

  Holds one or more arrays whose leading axes are [T, R] (the tables, and
  per-row optimizer state such as row-wise Adagrad's accumulators), saved
  and restored row by row together.

  Args:
    *arrays: the initial arrays, each [T, R, ...] (copied).
    step: the step they are saved at.

  Attributes:
    values: the saved arrays, each [T, R, ...].
    saved_at: [T, R] step of each row's last save.

  >>> ckpt = RowCheckpoint(np.zeros((2, 3)))
  >>> ckpt.save([np.ones((2, 3))], step=5, mask_TxR=np.eye(2, 3, dtype=bool))
  2
  >>> ckpt.restore([np.full((2, 3), 7.0)], tables=[1])[0].tolist()
  [[7.0, 7.0, 7.0], [0.0, 1.0, 0.0]]
  """

  def __init__(self, *arrays: np.ndarray, step: int = 0):
    if not arrays:
      raise ValueError('RowCheckpoint needs at least one array')
    self.values = tuple(np.array(a, copy=True) for a in arrays)
    shape = self.values[0].shape[:2]
    if any(v.shape[:2] != shape for v in self.values):
      raise ValueError(
        f'arrays must share their leading [T, R] axes, got {[v.shape for v in self.values]}'
      )
    self.saved_at = np.full(shape, step, np.int64)

  def save(
    self, arrays: Sequence[np.ndarray], step: int, mask_TxR: np.ndarray | None = None
  ) -> int:
    """Saves every row (or the rows of `mask_TxR`); returns how many rows were written.

    Args:
      arrays: the current arrays, as many as `values`.
      step: the step they are at.
      mask_TxR: [T, R] bool, the rows to save (None: all).

    Returns:
      The rows written.
    """
    if len(arrays) != len(self.values):
      raise ValueError(f'expected {len(self.values)} arrays, got {len(arrays)}')
    for saved, a in zip(self.values, arrays, strict=True):
      if mask_TxR is None:
        saved[...] = a
      else:
        saved[mask_TxR] = np.asarray(a)[mask_TxR]
    if mask_TxR is None:
      self.saved_at[...] = step
      return self.saved_at.size
    self.saved_at[mask_TxR] = step
    return int(mask_TxR.sum())

  def restore(
    self, arrays: Sequence[np.ndarray], tables: Sequence[int] | range
  ) -> tuple[np.ndarray, ...]:
    """Copies of `arrays` with `tables` (a failed shard's) set back to their saved rows.

    Args:
      arrays: the current arrays, as many as `values`.
      tables: the tables to restore.

    Returns:
      The restored copies, in `values`' order.
    """
    idx = list(tables)
    out = []
    for saved, a in zip(self.values, arrays, strict=True):
      a = np.array(a, copy=True)
      a[idx] = saved[idx]
      out.append(a)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Strategy:
  """How a run checkpoints and recovers, in steps.

  Attributes:
    name: a label for tables and plots.
    recovery: 'none' (the failure-free baseline: no failures injected, no
      checkpoints), 'full' or 'partial'.
    interval: steps between full checkpoints (>= 1); 0 with recovery 'none'.
    priority: None, 'mfu' or 'ssu': prioritised checkpoints between full ones.
    priority_every: steps between prioritised checkpoints (0: none).
    fraction: φ, the fraction of each shard's rows a prioritised checkpoint writes.
    pls_target: the PLS target the interval was chosen for (partial), or None.
  """

  name: str
  recovery: str
  interval: int
  priority: str | None = None
  priority_every: int = 0
  fraction: float = 0.0
  pls_target: float | None = None

  def __post_init__(self):
    if self.recovery not in RECOVERIES:
      raise ValueError(f'recovery must be one of {RECOVERIES}, got {self.recovery!r}')
    if self.priority not in PRIORITIES:
      raise ValueError(f'priority must be one of {PRIORITIES}, got {self.priority!r}')
    if self.recovery == 'none' and self.interval != 0:
      raise ValueError(
        f"recovery 'none' never checkpoints: interval must be 0, got {self.interval}"
      )
    if self.recovery != 'none' and self.interval < 1:
      raise ValueError(f'interval must be >= 1 step, got {self.interval}')
    if self.priority and self.recovery != 'partial':
      raise ValueError(f'priority {self.priority!r} needs partial recovery')


def _steps(seconds: float, step_s: float) -> int:
  return max(1, round(seconds / step_s))


def priority_schedule(interval_s: float, fraction: float, per_full: int) -> tuple[float, float]:
  """(T_full, T_priority): full and prioritised intervals at the write budget of `interval_s`.

  Writes per second: 1/T_full + (per_full − 1)·φ/T_full = 1/interval_s.

  Args:
    interval_s: the plain partial-recovery interval whose budget to match.
    fraction: φ, in (0, 1).
    per_full: k, checkpoints per full interval, the full one included (>= 2).

  Returns:
    (T_full, T_priority = T_full / k), in seconds.

  >>> priority_schedule(100.0, 0.125, 8)
  (187.5, 23.4375)
  """
  _fraction('fraction', fraction)
  if per_full < 2:
    raise ValueError(f'per_full must be >= 2, got {per_full}')
  full = _positive('interval_s', interval_s) * (1 + (per_full - 1) * fraction)
  return full, full / per_full


def strategy(
  name: str,
  costs: Costs,
  num_shards: int,
  *,
  pls_target: float = 0.05,
  fraction: float = 0.125,
  per_full: int = 8,
) -> Strategy:
  """The strategy called `name`, with its intervals from `costs`.

  Names: 'none' (the failure-free baseline: no failures, no checkpoints;
  CPR's overheads are the time checkpoints and failures add to its time),
  'full' (Young's interval), 'partial' (PLS-target interval), 'partial_mfu'
  and 'partial_ssu' (`priority_schedule` of the PLS interval).

  Args:
    name: the strategy's name, above.
    costs: the modelled cluster.
    num_shards: N.
    pls_target: the partial strategies' PLS target.
    fraction: φ of the prioritised ones.
    per_full: k of the prioritised ones.

  Returns:
    The `Strategy`, its intervals in steps (at least 1).
  """
  if name == 'none':
    return Strategy(name, 'none', 0)
  young = _steps(young_interval(costs.save_s, costs.mttf_s), costs.step_s)
  if name == 'full':
    return Strategy(name, 'full', young)
  target_s = pls_interval(pls_target, costs.mttf_s, num_shards)
  if name == 'partial':
    return Strategy(name, 'partial', _steps(target_s, costs.step_s), pls_target=pls_target)
  if name in ('partial_mfu', 'partial_ssu'):
    _, every_s = priority_schedule(target_s, fraction, per_full)
    every = _steps(every_s, costs.step_s)
    return Strategy(
      name, 'partial', every * per_full, name.removeprefix('partial_'), every, fraction, pls_target
    )
  raise ValueError(
    f"unknown strategy {name!r}; choose 'none', 'full', 'partial', 'partial_mfu' or 'partial_ssu'"
  )
