"""The training clock and the per-step records.

`Clock` counts seconds spent training (evaluation and checkpoints pause it);
`StepLog` fetches each step's device metrics one step late, prices them
(`ledger.Ledger`), adds what the host controllers observe, and writes them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import jax

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


class StepLog:
  """Per-step records: device metrics fetched one step late, priced by the ledger, then written.

  `observe(record)` (a `control.Record`) gives the fields the host controllers
  add; `compute_at(plan)` the compute term of a step that ran `plan`, where
  it depends on the plan (None: the run's).
  """

  def __init__(
    self, writer: metrics.MetricsWriter, prices: ledger.Ledger, schedule, on_write, observe=None,
    compute_at=None,
  ):  # fmt: skip
    self.writer, self.prices, self.schedule, self.on_write = writer, prices, schedule, on_write
    self.observe = observe or (lambda record: {})
    self.compute_at = compute_at or (lambda plan: None)
    self._pending: tuple[int, Any, control.Plan] | None = None
    self._extra: dict[str, float] = {}
    self._last_fetch: float | None = None

  def push(self, step: int, device_metrics: Any, plan: control.Plan | None = None) -> None:
    """Writes the previous step's record, then holds this one's (still on the device)."""
    self.flush()
    self._pending = (step, device_metrics, plan or control.Plan())

  def add(self, fields: dict[str, float]) -> None:
    """Adds `fields` (e.g. an evaluation) to the pending step's record."""
    self._extra.update(fields)

  def flush(self) -> None:
    """Fetches and writes the pending record, if any."""
    if self._pending is None:
      return
    t, m, plan = self._pending
    self._pending = None
    m = jax.device_get(m)
    now = time.perf_counter()
    step_s = now - self._last_fetch if self._last_fetch else None
    self._last_fetch = now
    record = {
      'loss': float(m['loss']),
      'accuracy': float(m['accuracy']),
      'learning_rate': float(self.schedule(t - 1)),
      **self.prices.record(t, [int(c) for c in m['wire']]),
      'step_s': step_s,
      **self._extra,
    }
    compute_s = self.compute_at(plan)
    if compute_s is not None:  # this step's candidate's compute term, not the run's first
      record['step_compute_s'] = compute_s
      for name in self.prices.networks:
        blocking, hidden = record[f'comm_s@{name}'], record.get(f'overlap_s@{name}', 0.0)
        record[f'modelled_s@{name}'] = netmodel.step_time(compute_s, blocking, hidden)
    record.update(self.observe(control.Record(t, plan, {'step': t, **record}, m)))
    self._extra = {}
    self.writer.write(t, record)
    self.on_write(record)
