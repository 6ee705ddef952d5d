"""Per-worker batches as a host `Controller`: static, dynamic, streamed, windowed, and dropped
workers.

Each step the cluster's modelled compute time of every worker (batch / speed
× the measured time per example) is what the dynamic-batching controller
observes, as the worker's iteration time would be on real heterogeneous
hardware. With streams (`jd.control.streams`) each step's modelled time (the
slowest worker's compute plus `comm_s(t)`, the step's synchronisation) is
how long data streamed in; the record keeps each worker's wait for data,
which the modelled clock charges. With a `Window` (heterogeneity-aware
DiLoCo) each worker trains B / K examples on the inner steps of a round that
fit its window and 0 on the rest. A dropped worker trains on 0 examples; its
drawn examples are lost, as are those of a worker sitting a step out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxdist import netmodel
from jaxdist.control.dynamic_batching import DynamicBatching
from jaxdist.control.host import Controller, Plan, Record
from jaxdist.control.streams import Streams, buffer_report, lr_scale


@dataclasses.dataclass(frozen=True)
class Window:
  """Heterogeneity-aware DiLoCo's round: the inner steps each worker fits in one window.

  A round is `period` (H) inner steps of the fastest worker: the window
  lasts H · min_j t_j, with t_k worker k's modelled step at B / K examples.
  Worker k takes the first h_k = clip(⌊H · min_j t_j / t_k⌋, 1, H) steps of
  the round and sits out the rest (trains on 0 examples; with
  `jd.sync.diloco(by_steps=True)` and `jd.sync.sit_out` its model and
  optimizer stay, and the outer step weights its pseudo-gradient by h_k).
  A worker too slow for one step in the window still takes one, and the
  round waits for it. Readings (prime's and HeLoCo's write-ups, arXiv
  2606.00271, give the window, not a rule): h_k is planned at the round's
  first step, from the cluster's times then (a worker that straggles later
  in the round keeps its plan); rounds start at step 0 of the run, as
  `diloco`'s count does.

  Args:
    period: H, the inner steps a round (`diloco`'s period).
  """

  period: int

  def __post_init__(self):
    if self.period < 1:
      raise ValueError(f'Window: period must be >= 1 inner steps a round, got {self.period}')

  def steps(self, times) -> np.ndarray:
    """[K] the inner steps h_k each worker takes this round.

    Args:
      times: [K] each worker's modelled step at B / K examples, seconds (> 0).

    Returns:
      int [K] in [1, period].
    """
    t = np.asarray(times, float)
    if t.ndim != 1 or not np.all(t > 0):  # NaN fails too
      raise ValueError(f'Window.steps: times must be [K] seconds > 0, got {times}')
    return np.clip(np.floor(self.period * (t.min() / t)), 1, self.period).astype(int)

  def counts(self, t: int, times, uniform: np.ndarray) -> np.ndarray:
    """[K] each worker's examples at step t (0-based): `uniform` in its window, else 0.

    Args:
      t: the step.
      times: [K] the workers' modelled steps at the round's first step.
      uniform: [K] B / K each.

    Returns:
      [K] counts.
    """
    return np.where(t % self.period < self.steps(times), uniform, 0)


def batches(
  inner: DynamicBatching | Streams | Window | None, mode: str, *, num_workers: int,
  global_batch: int,
  cluster: netmodel.Cluster | None, per_example_s: float, comm_s: Callable[[int], float],
  alive: Callable[[int], np.ndarray] | None = None, example_bytes: int = 0,
) -> Controller:  # fmt: skip
  """The batches of every step, and the fields its log records.

  Args:
    inner: the batch-size controller (`jd.control.dynamic_batching` or
      `streams`), a `Window`, or None for the uniform batch (with dropped
      workers).
    mode: 'static' (the controller's first allocation, kept), 'dynamic'
      (updated on the modelled times), 'stream' (streams, with ScaDLES's
      learning-rate scale), 'window' (B / K in each worker's window of a
      round, else 0), or 'uniform' (streams or none at B / K).
    num_workers: K.
    global_batch: B.
    cluster: the modelled cluster (speeds, stragglers), or None.
    per_example_s: a speed-1 worker's measured seconds per example.
    comm_s: a synchronising step's modelled seconds at step t (0-based).
    alive: [K] bools per step t, False while a worker is dropped (None: all).
    example_bytes: one example's bytes, for the streams' buffer report.

  Returns:
    A `Controller`: its plans set `batches`, `counts` and (streams)
    `lr_scale`; its fields are each step's `batches`, `compute_s` and the
    streams' waits and queues.
  """
  streaming, window = isinstance(inner, Streams), isinstance(inner, Window)
  if window and cluster is None:
    raise ValueError("batching='window' fits each worker's steps to its speed: give a cluster")
  adapts = mode == 'dynamic' or streaming  # its next batches read this step's times
  uniform = np.full(num_workers, global_batch // num_workers)

  def init() -> Any:
    if inner is None or window:
      return ()
    if streaming:
      return inner.init(num_workers)
    return inner.init(num_workers, cluster.speeds if mode == 'static' else None)

  def plan(state: Any, t: int) -> Plan:
    sizes = None if inner is None or window else state.batches
    counts = uniform if sizes is None else sizes
    if window:
      first = t - t % inner.period  # the round's first step
      counts = inner.counts(t, cluster.compute_seconds(first, uniform, per_example_s), uniform)
    if alive is not None:
      counts = np.where(alive(t), counts, 0)
    scale = lr_scale(sizes, global_batch) if mode == 'stream' else None
    return Plan(batches=sizes, counts=counts, lr_scale=scale, needs_last=adapts)

  def observe(state: Any, record: Record) -> tuple[Any, dict[str, Any]]:
    t, counts = record.step - 1, record.plan.counts
    fields: dict[str, Any] = {'batches': counts.tolist()}
    if cluster is not None:
      times = cluster.compute_seconds(t, counts, per_example_s)
      fields['compute_s'] = times.tolist()
    if inner is None or window:  # uniform or windowed batches (with dropped workers)
      return state, fields
    if record.plan.lr_scale is not None:  # this step's learning rate is learning_rate × it
      fields['lr_scale'] = record.plan.lr_scale
    if streaming:
      fields.update(wait_s=state.wait_s.tolist(), queue=state.queue.tolist())
      state = inner.update(state, float(times.max()) + comm_s(t))
    elif mode == 'dynamic':
      state = inner.update(state, times)
    return state, fields

  def summary(state: Any) -> dict[str, Any]:
    """The streams' buffers (ScaDLES's persistence vs truncation), if any."""
    if not streaming:
      return {}
    report = buffer_report(state, bytes_per_sample=example_bytes)
    return {f'buffer_{k}': v for k, v in report.items() if not isinstance(v, list)}

  return Controller(init, plan, observe, summary)
