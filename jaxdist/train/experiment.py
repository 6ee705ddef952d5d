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

from jaxdist import control, data, netmodel, runtime


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything a run needs, built and checked from a config (`factory.build`)."""

  workdir: str
  dataset: data.Dataset
  model: Any
  tx: optax.GradientTransformation | Any  # or a step.SplitChain (per_worker='device')
  schedule: optax.Schedule
  workers: runtime.Workers
  networks: Mapping[str, netmodel.Network | netmodel.Schedule]
  record: Mapping[str, Any]  # the config as JSON
  # what ran: the summary's and the checkpoints' names
  method: str
  model_name: str
  dataset_name: str
  # the loop
  steps: int
  seed: int
  batch_size: int  # global
  eval_every: int
  eval_batch_size: int
  checkpoint_every: int
  keep_checkpoints: int
  progress: bool
  noise_every: int  # 0: never
  noise_decay: float
  kill_at_step: int  # 0: never
  kill_signal: int  # what kill_at_step sends (config.fault.signal)
  # the step
  way: str  # how a device computes its workers' gradients (make_train_step's per_worker)
  way_asked: str  # the way as the config gives it ('auto' unresolved)
  staggered: bool
  reshard_multiple: int  # elastic restore: a number of workers must be a multiple of it
  # the modelled clock
  compute_s: float  # the compute term given; 0: measured
  compute_budget_s: float  # seconds of timed steps measuring it
  algorithm: str  # the collectives' algorithm (ring, tree, ...)
  hierarchy: netmodel.Hierarchy  # the devices as nodes, their simulated workers local
  wait: Mapping[str, Any]  # the method's waiting rule: `netmodel.WorkerClock` arguments
  cluster: netmodel.Cluster | None = None
  # the host
  batching_mode: str = 'uniform'  # uniform | static | dynamic | stream
  batching: control.DynamicBatching | control.Streams | None = None  # per-worker batches
  held: int = 0  # examples each worker holds per step: its batch, or b_max
  sampler: data.Sampler | None = None  # which examples each worker trains on
  ratio_control: control.Controller | None = None  # the ratio's (config.adaptive), or None
  ratios: tuple[float, ...] = ()  # its candidates, compiled into the chain (dense after them)
  drops: tuple = ()  # `inject.Drop`s (config.fault.drop)

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

    None without a cluster. `compute_s`: one worker's measured step on its
    batch (the compute term).
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
