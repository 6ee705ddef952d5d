"""Per-worker batches as a host `Controller`: static, dynamic, streamed, and dropped workers.

Each step the cluster's modelled compute time of every worker (batch / speed
× the measured time per example) is what the dynamic-batching controller
observes, as the worker's iteration time would be on real heterogeneous
hardware. With streams (`jd.control.streams`) each step's modelled time (the
slowest worker's compute plus `comm_s(t)`, the step's synchronisation) is
how long data streamed in; the record keeps each worker's wait for data,
which the modelled clock charges. A dropped worker trains on 0 examples; its
drawn examples are lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from jaxdist import netmodel
from jaxdist.control.dynamic_batching import DynamicBatching
from jaxdist.control.host import Controller, Plan, Record
from jaxdist.control.streams import Streams, buffer_report, lr_scale


def batches(
  inner: DynamicBatching | Streams | None, mode: str, *, num_workers: int, global_batch: int,
  cluster: netmodel.Cluster | None, per_example_s: float, comm_s: Callable[[int], float],
  alive: Callable[[int], np.ndarray] | None = None, example_bytes: int = 0,
) -> Controller:  # fmt: skip
  """The batches of every step, and the fields its log records.

  Args:
    inner: the batch-size controller (`jd.control.dynamic_batching` or
      `streams`), or None for the uniform batch (with dropped workers).
    mode: 'static' (the controller's first allocation, kept), 'dynamic'
      (updated on the modelled times), 'stream' (streams, with ScaDLES's
      learning-rate scale), or 'uniform' (streams or none at B / K).
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
  streaming = isinstance(inner, Streams)
  adapts = mode == 'dynamic' or streaming  # its next batches read this step's times
  uniform = np.full(num_workers, global_batch // num_workers)

  def init() -> Any:
    if inner is None:
      return ()
    if streaming:
      return inner.init(num_workers)
    return inner.init(num_workers, cluster.speeds if mode == 'static' else None)

  def plan(state: Any, t: int) -> Plan:
    sizes = None if inner is None else state.batches
    counts = uniform if sizes is None else sizes
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
    if inner is None:  # uniform batches with dropped workers
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
