"""The training clock and the per-step records.

`Clock` counts seconds spent training (evaluation and checkpoints pause it);
`StepLog` fetches each step's device metrics late, without stalling the next step, prices them
(`ledger.Ledger`), adds what the host controllers observe, and writes them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import control, netmodel
from jaxdist.train import ledger, metrics


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
    compute_at=None, fetch: Fetch | None = None,
  ):  # fmt: skip
    self.writer, self.prices, self.on_write = writer, prices, on_write
    self.rates = Rates(schedule)
    self.observe = observe or (lambda record: {})
    self.compute_at = compute_at or (lambda plan: None)
    self.fetch = fetch or Fetch()
    self.every = self.fetch.every
    self._pending: list[list[Any]] = []  # [step, device metrics, plan, step_s, extra fields]
    self._inflight: tuple[list[list[Any]], Any] | None = None  # dispatched, not yet read
    self._last_done: float | None = None

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
    if len(done) >= self.every:
      self._pending = self._pending[-1:]
      handle = self.fetch.start([e[1] for e in done])
      if self.every == 1:
        self._write(done, self.fetch.read(handle))
      else:
        self._inflight = (done, handle)

  def add(self, fields: dict[str, float]) -> None:
    """Adds `fields` (e.g. an evaluation) to the latest step's record."""
    if self._pending:
      self._pending[-1][4].update(fields)

  def flush(self) -> None:
    """Fetches and writes every pending record."""
    if self._inflight is not None:
      self._write(self._inflight[0], self.fetch.read(self._inflight[1]))
      self._inflight = None
    if not self._pending:
      return
    self._time_last()
    done, self._pending = self._pending, []
    self._write(done, self.fetch.read(self.fetch.start([e[1] for e in done])))

  def _time_last(self) -> None:
    """Waits for the latest pushed step on this process's devices; its `step_s`."""
    if not self._pending or self._pending[-1][3] is not None:
      return
    jax.block_until_ready(self._pending[-1][1])
    now = time.perf_counter()
    self._pending[-1][3] = now - self._last_done if self._last_done else None
    self._last_done = now

  def _write(self, entries, fetched) -> None:
    for (t, _, plan, step_s, extra), m in zip(entries, fetched, strict=True):
      self._record(t, plan, step_s, extra, m)

  def _record(self, t: int, plan: control.Plan, step_s, extra: dict, m: dict) -> None:
    record = {
      'loss': float(m['loss']),
      'accuracy': float(m['accuracy']),
      'learning_rate': self.rates(t - 1),
      **self.prices.record(t, [int(c) for c in m['wire']]),
      'step_s': step_s,
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
