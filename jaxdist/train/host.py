"""The host's side of each step: its controllers, the noise meter, and exploration's copy.

`Host` runs the chain of host controllers (`jd.control.host`) that plans
every step (per-worker batches, the ratio candidate) and observes its
record, beside the gradient-noise meter (`jaxdist.train.noise`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxdist import control
from jaxdist.faults import inject
from jaxdist.train import ledger
from jaxdist.train.feed import put_batch
from jaxdist.train.noise import Noise
from jaxdist.train.steplog import Clock, StepLog


class Host:
  """The host controllers around each step (`jd.control.host`), the noise meter, and the
  copy of the train state an exploration keeps.

  The controllers are one chain: per-worker batches (`exp.batching`, dropped
  workers) and the ratio controller (`exp.ratio_control`). Each step runs the
  plan they make for it; each step's record, once fetched, is what they
  observe, before the next plan whenever a plan said it reads the last step
  (`Plan.needs_last`).

  Args:
    exp: the run.
    compute_s: one worker's measured step (the compute term).
    prices: the run's ledger (streams take a synchronising step's time from it).
    clock: the training clock (the noise measurement pauses it).
    candidate_s: the compute term of each candidate ratio, if any.
  """

  def __init__(self, exp, compute_s: float, prices: ledger.Ledger, clock: Clock,
               candidate_s: Sequence[float] = ()):  # fmt: skip
    self.exp, self.clock, self.candidate_s = exp, clock, list(candidate_s)
    self.example_bytes = exp.dataset.example_bytes
    parts = {}
    k = exp.workers.count
    if exp.batching is not None or exp.drops:
      parts['batching'] = control.batches(
        exp.batching, exp.batching_mode, num_workers=k, global_batch=exp.batch_size,
        cluster=exp.cluster, per_example_s=compute_s / exp.per_worker, comm_s=prices.sync_s,
        alive=(lambda t: inject.alive(exp.drops, k, t)) if exp.drops else None,
        example_bytes=self.example_bytes,
      )  # fmt: skip
    if exp.ratio_control is not None:
      parts['adaptive'] = exp.ratio_control
    self.controllers = control.chain(**parts)
    # streams in wall-clock: this process's workers wait for their data before each step
    self.mine = np.asarray(exp.workers.local_workers()) if exp.realtime else None
    self.arrivals = exp.batching.arrivals(self.mine) if exp.realtime else None
    self.state = self.controllers.init()
    self.noise = Noise(exp)
    self.saved = None  # a copy of the train state an exploration started from
    self.last = control.Plan()  # the plan of the last step

  def plan(self, t: int, log: StepLog) -> control.Plan:
    """Step t's plan; first the last step's record, if the last plan asked to observe it."""
    if self.last.needs_last:
      log.flush()
    self.last = self.controllers.plan(self.state, t)
    return self.last

  def batch(self, t: int, state, plan: control.Plan):
    """Step t's device arrays, the chain's extra arguments, and fields measured before it
    (with streams in wall-clock, first the wait for this process's data: `data_wait_s`)."""
    waited = {}
    if self.arrivals is not None:
      wait = float(self.arrivals.take(plan.counts[self.mine], time.perf_counter()).max())
      time.sleep(wait)
      waited['data_wait_s'] = wait
    arrays, injected = put_batch(self.exp, t, plan.batches, plan.lr_scale, plan.counts)
    fields = {**waited, **self.noise.measure(t, state, arrays, self.clock)}
    if self.exp.sampler.partition.injects:  # bytes each worker received, on average
      fields['inject_bytes'] = float(np.mean(injected)) * self.example_bytes
    w = self.exp.workers
    put = lambda a: jax.make_array_from_process_local_data(w.sharding, a[w.local_workers()])
    return arrays, {k: put(v) for k, v in plan.tx_args.items()}, fields

  def prepare(self, state, plan: control.Plan):
    """The train state the next step starts from: a plan may keep a copy of it before an
    exploration and go back to the copy afterwards."""
    if plan.snapshot:
      self.saved = _copy(state)
    elif plan.restore:
      if self.saved is None:
        raise RuntimeError('the controller asked to restore a train state it never saved')
      state = _copy(self.saved)
      if not plan.exploring:
        self.saved = None
    return state

  @property
  def exploring(self) -> bool:
    """Whether the current steps will be undone (evaluations and checkpoints wait)."""
    return self.saved is not None

  def finish(self, state):
    """The run's last state: an exploration still running is undone."""
    if self.saved is not None:
      state, self.saved = self.saved, None
    return state

  def finish_at_last(self, loop) -> None:
    """A loop hook: `finish` after the loop's last step."""
    if loop.t == loop.steps:
      loop.state = self.finish(loop.state)

  def compute_at(self, plan: control.Plan) -> float | None:
    """The compute term of a step that ran `plan`, if it depends on the candidate, else None."""
    if not self.candidate_s or 'candidate' not in plan.tx_args:
      return None
    return self.candidate_s[int(plan.tx_args['candidate'][0])]

  def observe(self, record: control.Record) -> dict[str, Any]:
    """Fields the controllers add to a step's record."""
    self.state, fields = self.controllers.observe(self.state, record)
    return fields

  def summary(self) -> dict[str, Any]:
    return {**self.noise.summary(), **self.controllers.summary(self.state)}

  def to_tree(self) -> dict[str, Any]:
    """Every controller's state and the noise meter's, for the checkpoint's control item."""
    return {**control.host.to_tree(self.state), 'noise': control.host.to_tree(self.noise.state)}

  def restore(self, saved: dict[str, Any]) -> None:
    """The states `to_tree` saved (absent ones stay as they start)."""
    self.state = control.host.from_tree(self.state, saved)
    if saved.get('noise'):
      self.noise.state = control.host.from_tree(self.noise.state, saved['noise'])


@jax.jit
def _copy(state):
  """New buffers holding `state` (the train step donates its input's)."""
  return jax.tree.map(lambda x: x + jax.numpy.zeros((), x.dtype) if _numeric(x) else x, state)


def _numeric(x) -> bool:
  return not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
