"""CPR's recovery bookkeeping: what a run saved, what its failures lost, and its modelled time.

`Recovery` follows one run under a `cpr.Strategy`, step by step, on CPR's
modelled clock: each step costs `costs.step_s`; a failure whose time the
clock has passed (`next_failure`) costs `restart_s` plus the load of what it
restores (`fail`); a checkpoint its share of `save_s` (`checkpoint`). It
holds the row-level checkpoint (`cpr.RowCheckpoint`) and the MLP's copy and
says what a failure restores; the training around it is the caller's
(`jaxdist.train.failures.train_with_failures`). Host-side NumPy only.

- full recovery: tables, MLP and data position go back to the last full
  checkpoint; the steps since it are lost work and run again;
- partial recovery: the failed worker's tables go back to their saved rows;
  the MLP is a data-parallel replica, taken from a surviving worker (a
  simplification: nothing of it is lost); the run goes on at the same step.

PLS (`cpr.pls`) counts, per failure, the samples trained since the failed
shard's last full checkpoint or its last restore, whichever is later
(samples a shard already lost are not lost twice; MFU/SSU's prioritised
checkpoints do not count); lost updates are the lookups whose updates a
restore discarded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from jaxdist.faults import cpr

Rows = tuple[np.ndarray, np.ndarray]  # a checkpoint's per-row arrays: tables and their accumulators


class Restore(NamedTuple):
  """What a failure puts back.

  Attributes:
    step: the step the run goes on from.
    tables: the tables.
    accum: their accumulators.
    mlp: the MLP (None: the run's own, as it is).
  """

  step: int
  tables: np.ndarray
  accum: np.ndarray
  mlp: Any


class Recovery:
  """One run's checkpoints, failures and charges under `strategy` (see the module docstring).

  Args:
    strategy: checkpointing and recovery.
    costs: the modelled clock.
    trace: the failures (times on the modelled clock, failed workers); none
      are used under recovery 'none'.
    rows: the initial tables and accumulators (the free first checkpoint).
    mlp: the initial MLP (host arrays).
    workers: the shards (one per worker).
    batch_size: the global batch (PLS counts samples).
    ssu_oversample: SSU samples lookups at this many times the rate that
      would fill its buffer once per prioritised interval.
    seed: SSU's sampling seed.
  """

  def __init__(
    self, strategy: cpr.Strategy, costs: cpr.Costs, trace: cpr.Failures, rows: Rows, mlp: Any,
    *, workers: int, batch_size: int, ssu_oversample: float, seed: int,
  ):  # fmt: skip
    self.strategy, self.costs, self.workers, self.batch_size = strategy, costs, workers, batch_size
    if strategy.recovery == 'none':
      trace = cpr.Failures(trace.times_s[:0], trace.workers[:0])
    self.trace, self.failures = trace, 0
    t_count, n_rows = rows[0].shape[:2]
    self.shards = [cpr.shard_tables(k, t_count, workers) for k in range(workers)]
    self.ckpt = cpr.RowCheckpoint(*rows)
    self.mlp, self.ckpt_step = mlp, 0
    self.since = np.zeros(workers, np.int64)  # per shard: step of its last full save or restore
    self.counts = np.zeros((t_count, n_rows), np.int64)  # lookups since each row's last save
    self.capacity = max(1, round(strategy.fraction * n_rows * t_count / workers))
    self.ssu = None
    if strategy.priority == 'ssu':
      per = strategy.priority_every * batch_size * t_count
      rate = min(1.0, ssu_oversample * self.capacity * workers / per)
      self.ssu = cpr.SSUSampler(t_count, n_rows, workers, self.capacity, rate, seed=seed)
    self.clock = self.compute_s = self.save_s = self.lost_s = self.recovery_s = 0.0
    self.lost_samples: list[int] = []
    self.lost_updates = self.executed = 0
    self.full_saves = self.priority_saves = self.rows_written = 0

  def stepped(self, ids_BxT: np.ndarray) -> None:
    """A training step ran on lookups `ids_BxT`: counted, and charged to the clock.

    Args:
      ids_BxT: [B, T] the step's row ids.
    """
    t_count, n_rows = self.counts.shape
    flat = (np.arange(t_count)[None, :] * n_rows + ids_BxT).reshape(-1)
    self.counts += np.bincount(flat, minlength=t_count * n_rows).reshape(t_count, n_rows)
    if self.ssu is not None:
      self.ssu.record(ids_BxT)
    self.executed += 1
    self.clock += self.costs.step_s
    self.compute_s += self.costs.step_s

  def next_failure(self, step: int, steps: int) -> int | None:
    """The worker of the next failure whose time the clock has passed, if any.

    Args:
      step: steps trained so far.
      steps: the run's steps (no failure after the last).

    Returns:
      The failed worker, or None.
    """
    times, i = self.trace.times_s, self.failures
    if i < len(times) and times[i] <= self.clock and step < steps:
      self.failures += 1
      return int(self.trace.workers[i])
    return None

  def fail(self, worker: int, step: int, rows: Rows) -> Restore:
    """`worker` failed after `step` steps with the tables `rows`: what to restore.

    Args:
      worker: the failed worker (its shard).
      step: steps trained so far.
      rows: the current tables and accumulators.

    Returns:
      The `Restore`: the last full checkpoint (full recovery), or the
      worker's tables from their saved rows at the same step (partial).
    """
    costs = self.costs
    if self.strategy.recovery == 'full':
      self.lost_s += (step - self.ckpt_step) * costs.step_s
      self.counts[...] = 0
      restore = Restore(self.ckpt_step, *self.ckpt.values, self.mlp)
      load = costs.load_s
    else:
      tables = list(self.shards[worker])
      self.lost_updates += int(self.counts[tables].sum())
      self.counts[tables] = 0
      self.lost_samples.append((step - self.since[worker]) * self.batch_size)
      self.since[worker] = step
      restore = Restore(step, *self.ckpt.restore(rows, self.shards[worker]), None)
      load = costs.load_s / self.workers
    self.recovery_s += costs.restart_s + load
    self.clock += costs.restart_s + load
    return restore

  def checkpoint(self, step: int, steps: int, rows: Callable[[], Rows], mlp: Callable[[], Any]):
    """The strategy's checkpoint after `step` steps, if one is due.

    Args:
      step: steps trained so far.
      steps: the run's steps (no checkpoint after the last).
      rows: reads the current tables and accumulators (called only then).
      mlp: reads the current MLP (called only then).
    """
    strategy, t_count, n_rows = self.strategy, *self.counts.shape
    if strategy.recovery == 'none' or step == steps:
      return
    if step % strategy.interval == 0 and step > self.ckpt_step:
      self.ckpt.save(rows(), step)
      self.mlp, self.ckpt_step = mlp(), step
      self.since[:] = step
      self.counts[...] = 0
      self.full_saves += 1
      self.rows_written += t_count * n_rows
      self.save_s += self.costs.save_s
      self.clock += self.costs.save_s
    elif strategy.priority and step % strategy.priority_every == 0:
      mask = np.zeros((t_count, n_rows), bool)
      for k, tables in enumerate(self.shards):
        mask |= cpr.mfu_mask(self.counts, tables, self.capacity) if strategy.priority == 'mfu' \
          else self.ssu.take(k)  # fmt: skip
      written = self.ckpt.save(rows(), step, mask)
      self.counts[mask] = 0
      self.priority_saves += 1
      self.rows_written += written
      cost = self.costs.save_s * written / (t_count * n_rows)
      self.save_s += cost
      self.clock += cost

  def summary(self, steps: int) -> dict[str, Any]:
    """The run's measurements (`jaxdist.train.failures.train_with_failures` lists them).

    Args:
      steps: the run's steps.

    Returns:
      A dict of the measurements: counts, PLS, seconds and overheads.
    """
    strategy, costs, workers = self.strategy, self.costs, self.workers
    failure_free_s = steps * costs.step_s
    interval_s = strategy.interval * costs.step_s
    expected = 0.0
    if strategy.recovery != 'none':
      per_full = strategy.interval // strategy.priority_every if strategy.priority else 1
      writes = 1 + (per_full - 1) * strategy.fraction  # full checkpoints' worth per interval
      expected = cpr.expected_overhead(strategy.recovery, interval_s, costs, workers, writes)
    partial = strategy.recovery == 'partial'
    assert abs(self.compute_s - self.lost_s - failure_free_s) < 1e-6 * failure_free_s
    return {
      'strategy': strategy.name,
      'recovery': strategy.recovery,
      'priority': strategy.priority,
      'interval_steps': strategy.interval,
      'priority_every': strategy.priority_every,
      'pls_target': strategy.pls_target,
      'steps': steps,
      'executed_steps': self.executed,
      'failures': self.failures,
      'pls': cpr.pls(self.lost_samples, workers, steps * self.batch_size),
      'expected_pls': cpr.expected_pls(interval_s, costs.mttf_s, workers) if partial else 0.0,
      'lost_updates': self.lost_updates / (steps * self.batch_size * self.counts.shape[0]),
      'full_saves': self.full_saves,
      'priority_saves': self.priority_saves,
      'rows_written': self.rows_written,
      'checkpoint_s': self.save_s,
      'lost_s': self.lost_s,
      'recovery_s': self.recovery_s,
      'total_s': self.clock,
      'failure_free_s': failure_free_s,
      'checkpoint_overhead': self.save_s / failure_free_s,
      'lost_overhead': self.lost_s / failure_free_s,
      'recovery_overhead': self.recovery_s / failure_free_s,
      'total_overhead': (self.clock - failure_free_s) / failure_free_s,
      'expected_overhead': expected,
    }
