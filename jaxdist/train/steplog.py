"""The training clock and the per-step records.

`Clock` counts seconds spent training (evaluation and checkpoints pause it);
`StepLog` fetches each step's device metrics late, without stalling the next step, prices them
(`ledger.Ledger`), adds what the host controllers observe, and writes them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import control, netmodel
from jaxdist.train import ledger, metrics, step_metrics


class Clock:
  """Seconds spent training: from the end of the first (compiling) step, less paused time."""

  def __init__(self):
    self.steps = 0  # steps timed
    self._start: float | None = None
    self._paused = 0.0

  def step(self, metrics: Any) -> None:
    """Counts a step; the first one is waited for and starts the clock."""
    if self._start is None:
      jax.block_until_ready(metrics)
      self._start = time.perf_counter()
    else:
      self.steps += 1

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    """Time inside (evaluation, checkpoints) does not count."""
    tick = time.perf_counter()
    try:
      yield
    finally:
      if self._start is not None:
        self._paused += time.perf_counter() - tick

  def seconds(self) -> float:
    if self._start is None:
      return float('nan')
    return time.perf_counter() - self._start - self._paused


class Rates:
  """An optax schedule's values by step, computed a block of steps at a time.

  A schedule is jax code: called with a step on the host, each call is a few
  ops dispatched to the device, queued behind the step running there, so
  reading its value waited for that step (in a loop that fetches metrics one
  step late, the wait undid the lateness: 71 % of a local SGD step's host time
  over 8 processes). Here one jitted program gives `BLOCK` steps' values
  at once, fetched when a step of a new block is first asked for.

  Args:
    schedule: the learning rate by step (an optax schedule).
  """

  BLOCK = 4096

  def __init__(self, schedule):
    self._block_of = jax.jit(lambda start: jax.vmap(schedule)(start + jnp.arange(self.BLOCK)))
    self._start, self._values = None, None

  def __call__(self, step: int) -> float:
    start = step - step % self.BLOCK
    if start != self._start:
      self._values = np.asarray(jax.device_get(self._block_of(start)), np.float64)
      self._start = start
    return float(self._values[step - start])


class Fetch:
  """How a `StepLog` reads steps' metrics: as the step returns them (replicated), by default.

  `start(device_metrics)` begins reading some steps' metrics and returns a
  handle; `read(handle)` their metrics dicts, in order. `every` is how many
  finished steps a `StepLog` reads at once.
  """

  every = 1

  def prepare(self, device_metrics: Any) -> None:
    """Called with the first step's metrics, before the run is timed (e.g. to compile)."""

  def start(self, device_metrics: list[Any]) -> Any:
    return device_metrics

  def read(self, handle: Any) -> list[dict[str, Any]]:
    return jax.device_get(handle)


HOSTS_DIR = 'hosts'  # each process's step times, in a run of several (`StepLog.close`)


class StepLog:
  """Per-step records: device metrics fetched late, priced by the ledger, then written.

  A step's metrics stay on the devices until `fetch` (a `Fetch`) reads them.
  Each push waits for the previous step to finish on this process's devices
  (which is its time, `step_s`), never for a collective of its own. With
  `fetch.every == 1` each step is read one step late; with `every = k`, the
  finished steps are read k at a time, the reading started behind the next
  step and finished one step later (the trainer across processes: one
  all-gather of k steps' figures). `flush()` writes everything now (a
  controller that reads the last step, an evaluation, a checkpoint, the end).

  `observe(record)` (a `control.Record`) gives the fields the host controllers
  add; `compute_at(plan)` the compute term of a step that ran `plan`, where
  it depends on the plan (None: the run's).
  """

  def __init__(
    self, writer: metrics.MetricsWriter, prices: ledger.Ledger, schedule, on_write, observe=None,
    compute_at=None, fetch: Fetch | None = None, host_compute_s: float | None = None,
  ):  # fmt: skip
    self.writer, self.prices, self.on_write = writer, prices, on_write
    self.rates = Rates(schedule)
    self.observe = observe or (lambda record: {})
    self.compute_at = compute_at or (lambda plan: None)
    self.fetch = fetch or Fetch()
    self._pending: list[list[Any]] = []  # [step, device metrics, plan, step_s, extra fields]
    self._inflight: tuple[list[list[Any]], Any] | None = None  # dispatched, not yet read
    self._last_done: float | None = None
    # [step, step_s, host_wait_s] on this process, kept only where `close` writes them
    self.host_times: list[list[Any]] | None = [] if jax.process_count() > 1 else None
    self.host_compute_s = host_compute_s  # this process's own compute term, if it measured one

  def push(self, step: int, device_metrics: Any, plan: control.Plan | None = None) -> None:
    """Times the previous step (waiting for it), writes what is due, holds this one's."""
    if self._last_done is None and not self._pending:
      self.fetch.prepare(device_metrics)
    self._time_last()
    self._pending.append([step, device_metrics, plan or control.Plan(), None, {}])
    if self._inflight is not None:
      self._write(self._inflight[0], self.fetch.read(self._inflight[1]))
      self._inflight = None
    done = self._pending[:-1]
    if len(done) >= self.fetch.every:
      self._pending = self._pending[-1:]
      handle = self.fetch.start([e[1] for e in done])
      if self.fetch.every == 1:
        self._write(done, self.fetch.read(handle))
      else:
        self._inflight = (done, handle)

  def add(self, fields: dict[str, float]) -> None:
    """Adds `fields` (e.g. an evaluation) to the latest step's record."""
    if self._pending:
      self._pending[-1][4].update(fields)

  def flush(self, alone: bool = False) -> None:
    """Fetches and writes every pending record.

    Args:
      alone: only this process flushes here (it is about to kill itself):
        records whose reading needs the other processes (`fetch.every > 1`)
        stay pending, and are lost with the process.
    """
    if alone and self.fetch.every > 1:
      return
    if self._inflight is not None:
      self._write(self._inflight[0], self.fetch.read(self._inflight[1]))
      self._inflight = None
    if not self._pending:
      return
    self._time_last()
    done, self._pending = self._pending, []
    self._write(done, self.fetch.read(self.fetch.start([e[1] for e in done])))

  def _time_last(self) -> None:
    """Waits for the latest pushed step on this process's devices.

    Its `step_s` (from the end of the step before it), and `host_wait_s`, the part
    of it the host spent waiting for the devices here (the rest, the loop's
    own work on the host: the batch, the dispatch, the records).
    """
    if not self._pending or self._pending[-1][3] is not None:
      return
    tick = time.perf_counter()
    jax.block_until_ready(self._pending[-1][1])
    now = time.perf_counter()
    first = self._last_done is None
    times = self._pending[-1][3] = {
      'step_s': None if first else now - self._last_done,
      'host_wait_s': None if first else now - tick,
    }
    if self.host_times is not None:
      self.host_times.append([self._pending[-1][0], times['step_s'], times['host_wait_s']])
    self._last_done = now

  def close(self) -> None:
    """Closes the writer; in a run of several processes, each writes its own step times.

    `hosts/process<i>.json` beside the metrics: this run's `[step, step_s,
    host_wait_s]` as timed on process i's devices (`_time_last`) and its
    `compute_s`, one worker's step timed alone there (`host_compute_s`; None
    where the run took its compute term from a checkpoint or the config): on
    unequal hosts, each host's own compute term and steps
    (`experiments/bench_hetero.py`).
    """
    self.writer.close()
    if self.host_times is None:
      return
    index = jax.process_index()
    folder = os.path.join(os.path.dirname(self.writer.path), HOSTS_DIR)
    os.makedirs(folder, exist_ok=True)
    times = {'process': index, 'compute_s': self.host_compute_s, 'steps': self.host_times}
    metrics.write_atomic(os.path.join(folder, f'process{index}.json'), json.dumps(times))

  def _write(self, entries, fetched) -> None:
    for (t, _, plan, times, extra), m in zip(entries, fetched, strict=True):
      self._record(t, plan, times, extra, m)

  def _record(self, t: int, plan: control.Plan, times: dict, extra: dict, m: dict) -> None:
    record = {
      'loss': float(m['loss']),
      'accuracy': float(m['accuracy']),
      'learning_rate': self.rates(t - 1),
      **self.prices.record(t, [int(c) for c in m['wire']]),
      **times,
      **extra,
    }
    compute_s = self.compute_at(plan)
    if compute_s is not None:  # this step's candidate's compute term, not the run's first
      record['step_compute_s'] = compute_s
      for name in self.prices.networks:
        blocking, hidden = record[f'comm_s@{name}'], record.get(f'overlap_s@{name}', 0.0)
        record[f'modelled_s@{name}'] = netmodel.step_time(compute_s, blocking, hidden)
    record.update(self.observe(control.Record(t, plan, {'step': t, **record}, m)))
    self.writer.write(t, record)
    self.on_write(record)


class PerWorkerFetch(Fetch):
  """Reads the train step's per-worker metrics (`step_metrics.RawMetrics`), reduced on the host.

  In one process the figures are all here: each step is read one step late
  (`jax.device_get`). Across processes each holds its own workers'; the
  finished steps are gathered `GATHER_EVERY` at a time in one all-gather
  (`step_metrics.metrics_gather`, compiled at the first step; fewer steps at a flush
  are padded to as many), not one collective per step.

  Args:
    workers: the layout.
    runs: the train step's `runs` (`step_metrics.reduce_metrics`).
    submit: runs a gather where the run's other collectives between processes
      run, returning a future (`overlap.Overlap.submit`); None: here, now.
  """

  GATHER_EVERY = 10

  def __init__(self, workers, runs, submit=None):
    self.workers, self.runs, self.submit = workers, runs, submit
    self.every = 1 if jax.process_count() == 1 else self.GATHER_EVERY
    self._gather = None

  def prepare(self, device_metrics) -> None:
    """Compiles the gather of `every` steps' metrics like `device_metrics` (several processes).

    Args:
      device_metrics: the first step's `RawMetrics`.
    """
    if self.every > 1 and self._gather is None:
      self._gather = step_metrics.metrics_gather([device_metrics] * self.every, self.workers)

  def start(self, device_metrics):
    """Starts fetching steps' `RawMetrics`: across processes, their gather, `every` at a time.

    Args:
      device_metrics: the steps' `RawMetrics`, on the devices.

    Returns:
      What `read` takes.
    """
    if self.every == 1:
      return device_metrics
    n = len(device_metrics)
    padded = [*device_metrics, *[device_metrics[-1]] * (-n % self.every)]

    def gather():
      gathered = [
        self._gather(padded[i : i + self.every])[: min(self.every, n - i)]
        for i in range(0, n, self.every)
      ]
      for x in jax.tree.leaves(gathered):
        x.copy_to_host_async()
      return [raw for part in gathered for raw in part]

    return gather() if self.submit is None else self.submit(gather)

  def read(self, handle):
    """The steps' metrics dicts (`step_metrics.reduce_metrics`).

    Args:
      handle: what `start` returned.

    Returns:
      One dict per step, in order.
    """
    if isinstance(handle, concurrent.futures.Future):
      handle = handle.result()
    return [step_metrics.reduce_metrics(raw, self.runs) for raw in jax.device_get(handle)]
