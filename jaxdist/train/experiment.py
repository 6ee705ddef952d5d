"""`Experiment`: a run, built and checked from a config, that holds no config.

`jaxdist.train.factory.build` is the only code that reads the config; what
the loop, the ledger, elastic restore and the report need of it arrives here
as typed values and built objects. `record` keeps the config as JSON, which
checkpoints and `config.json` store so that a resume can be checked against
it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import optax

from jaxdist import control, data, netmodel, runtime, sync


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything a run needs, built and checked from a config (`factory.build`).

  Attributes:
    workdir: where checkpoints, metrics and the summary go.
    dataset: the data.
    model: the Flax model.
    tx: the optax chain, or a `step.SplitChain` (per_worker='device').
    schedule: the learning rate by step.
    workers: the worker layout.
    networks: the networks the ledger prices every step on, by name.
    record: the config as JSON.
    method: what ran (`config.sync.method`), for the summary and the checkpoints.
    model_name: the model's name.
    dataset_name: the dataset's name.
    steps: steps to train.
    seed: the run's seed (initialisation, data order).
    batch_size: the global batch.
    eval_every: steps between evaluations.
    eval_batch_size: examples per evaluation batch.
    eval_examples: the test split's first examples an evaluation takes (0: all).
    checkpoint_every: steps between checkpoints.
    keep_checkpoints: checkpoints kept.
    progress: show a progress bar.
    noise_every: steps between measurements of the gradient noise γ (0: never).
    noise_decay: the EWMA decay of those measurements.
    kill_at_step: send `kill_signal` to the process after this step (0: never).
    kill_signal: the signal it sends (`config.fault.signal`: SIGKILL, SIGTERM or SIGINT).
    way: how a device computes its workers' gradients (make_train_step's
      per_worker).
    way_asked: the way as the config gives it ('auto' unresolved).
    staggered: a device's workers run their passes one after the other.
    reshard_multiple: elastic restore: a number of workers must be a
      multiple of it.
    compute_s: the compute term given; 0: measured.
    compute_budget_s: seconds of timed steps measuring it.
    algorithm: the collectives' algorithm (ring, tree, ...).
    hierarchy: the devices as nodes, their simulated workers local.
    wait: the method's waiting rule: `netmodel.WorkerClock` arguments.
    cluster: the modelled heterogeneous cluster, or None.
    batching_mode: 'uniform', 'static', 'dynamic' or 'stream'.
    batching: the per-worker batch controller, or None.
    held: examples each worker holds per step: its batch, or b_max.
    micro_batch: with per-worker batches, a worker computes only the
      micro-batches of this many examples that hold its own (0: all it
      holds, masked; `make_train_step(micro_batch=...)`).
    sampler: which examples each worker trains on, or None.
    ratio_control: the ratio's controller (config.adaptive), or None.
    ratios: its candidates, compiled into the chain (dense after them).
    drops: `inject.Drop`s (config.fault.drop).
    init_from: the checkpoints' directory of the run this one starts from ('': none).
    init_step: the step of its checkpoint this run starts at (0 without `init_from`).
    exchange: Streaming DiLoCo's deferred exchange, run beside the steps
      (`overlap.Overlap`), or None.
    realtime: streams in wall-clock (`config.streams.realtime`): each
      process waits for its workers' data before a step.
  """

  workdir: str
  dataset: data.Dataset
  model: Any
  tx: optax.GradientTransformation | Any
  schedule: optax.Schedule
  workers: runtime.Workers
  networks: Mapping[str, netmodel.Network | netmodel.Schedule]
  record: Mapping[str, Any]
  method: str
  model_name: str
  dataset_name: str
  steps: int
  seed: int
  batch_size: int
  eval_every: int
  eval_batch_size: int
  eval_examples: int
  checkpoint_every: int
  keep_checkpoints: int
  progress: bool
  noise_every: int
  noise_decay: float
  kill_at_step: int
  kill_signal: int
  way: str
  way_asked: str
  staggered: bool
  reshard_multiple: int
  compute_s: float
  compute_budget_s: float
  algorithm: str
  hierarchy: netmodel.Hierarchy
  wait: Mapping[str, Any]
  cluster: netmodel.Cluster | None = None
  batching_mode: str = 'uniform'
  batching: control.DynamicBatching | control.Streams | None = None
  held: int = 0
  sampler: data.Sampler | None = None
  ratio_control: control.Controller | None = None
  ratios: tuple[float, ...] = ()
  drops: tuple = ()
  init_from: str = ''
  init_step: int = 0
  micro_batch: int = 0
  exchange: sync.StreamingExchange | None = None
  realtime: bool = False

  @property
  def counted(self) -> bool:
    """Whether workers' batches may differ: the step takes counts and weights by them."""
    return self.batching_mode != 'uniform' or bool(self.drops)

  @property
  def streaming(self) -> bool:
    """Whether data streams in (ScaDLES): workers wait for it; 'stream' scales the lr."""
    return isinstance(self.batching, control.Streams)

  @property
  def per_worker(self) -> int:
    """Examples per worker per step with uniform batches."""
    return self.batch_size // self.workers.count

  def clock(self, compute_s: float) -> netmodel.WorkerClock | None:
    """A fresh per-worker clock of the run's cluster under the method's waiting rule.

    Args:
      compute_s: one worker's measured step on its batch (the compute term).

    Returns:
      The `netmodel.WorkerClock`, or None without a cluster.
    """
    if self.cluster is None:
      return None
    return netmodel.WorkerClock(self.cluster, compute_s / self.per_worker, **self.wait)

  def __str__(self) -> str:
    w = self.workers
    return (
      f'{w.count} workers = {w.devices} devices ({jax.devices()[0].platform}) x {w.per_device} '
      f'simulated; global batch {self.batch_size}, {self.per_worker} per worker'
    )
