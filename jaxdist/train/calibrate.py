"""The compute term of the modelled clock: one worker's step, measured once per run.

A worker's step without its communication is the same chain run on a
1-worker layout, whose collectives cost nothing (`measure_worker_step`).
`worker_step_s` and `candidate_step_s` measure it once per run (or take the
term given in the config, or the one the checkpoint recorded) and agree
across processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxdist import data, runtime, timing
from jaxdist.train import step as step_lib
from jaxdist.train.experiment import Experiment


def measure_worker_step(
  exp: Experiment,
  state: Any,
  repeats: int = 20,
  budget_s: float = 2.0,
  candidate: int | None = None,
) -> float:
  """Median seconds of one worker's step on its own: compute, compression, optimizer.

  The median of `repeats` timed steps, or of as many (at least three) as fit
  in `budget_s` seconds. With a ratio controller, the step runs `candidate`
  (default: the one the run starts with).

  The same optax chain runs on a 1-worker layout (one local device) with the
  per-worker batch, from a copy of one worker's replica of `state`, the
  run's train state (`one_replica`); its collectives span one worker and
  cost nothing, so this is a worker's step minus communication: the compute
  term of the modelled clock.
  """
  return measure_worker_steps(exp, state, [candidate], repeats, budget_s)[0]


def measure_worker_steps(
  exp: Experiment,
  state: Any,
  candidates: Sequence[int | None],
  repeats: int = 20,
  budget_s: float = 2.0,
) -> list[float]:
  """`measure_worker_step` for each candidate, with one compiled step for all of them.

  The candidate is an argument of the step (`compressed_allreduce(ratios=...)`
  switches on it), so one program serves every candidate; each candidate's
  timing starts from its own copy of one worker's replica of `state`.
  """
  one = runtime.layout(1, devices=1, device_list=jax.local_devices()[:1])
  counted = exp.counted
  ds = exp.dataset
  train_step = step_lib.make_train_step(
    exp.model, exp.tx, one, counted=counted, micro_batch=exp.micro_batch
  )
  idx = data.batch_indices(
    0, seed=exp.seed, num_examples=len(exp.dataset.train), batch_size=exp.per_worker
  )
  x, y = (jax.device_put(a[None], one.sharding) for a in ds.inputs(ds.train, idx))
  counts = (jax.device_put(np.full(1, exp.per_worker, np.int32), one.sharding),) if counted else ()

  def seconds(candidate: int | None) -> float:
    tx_args = {}
    if exp.ratio_control is not None:  # the candidate the run starts with
      ctl = exp.ratio_control
      args = dict(ctl.plan(ctl.init(), 0).tx_args)
      if candidate is not None:
        args['candidate'] = np.full_like(args['candidate'], candidate)
      tx_args = {k: jax.device_put(v[:1], one.sharding) for k, v in args.items()}
    box = [one_replica(state, one)]

    def run():
      box[0], metrics = train_step(box[0], x, y, *counts, **tx_args)
      return metrics

    return timing.median_seconds(run, repeats, budget_s=budget_s)

  return [seconds(c) for c in candidates]


def one_replica(state: Any, one: runtime.Workers) -> Any:
  """A copy of the first replica of `state` this process holds, on the 1-worker layout `one`.

  Every leaf of a train state leads with an axis of replicas (workers, or
  devices for `per_worker='device'`), sharded over the devices; the 1-worker
  layout's state is the same tree with one replica. The copy is new buffers
  (the train step donates its input), made from this process's first shard,
  so each process of a multi-process run copies its own.
  """
  local = jax.tree.map(lambda x: x.addressable_shards[0].data, state)
  first = jax.jit(lambda tree: jax.tree.map(lambda x: x[:1], tree))(local)
  return jax.device_put(first, one.sharding)


def candidate_step_s(exp: Experiment, meta: dict[str, Any], state: Any) -> list[float]:
  """With a ratio controller, the compute term of each candidate (dense last), else [].

  A worker's step costs what its compressor costs: a 10× Top-k's selection
  is slower than a 1000×'s. The modelled clock charges each step the
  measured step of the candidate it ran. Measured once, like `worker_step_s`;
  with a compute term given (`exp.compute_s`), that for every candidate.
  `state` is the run's train state, as for `worker_step_s`.
  """
  ctl = exp.ratio_control
  if ctl is None:
    return []
  if meta.get('compute_s_candidates'):
    return [float(v) for v in meta['compute_s_candidates']]
  if exp.compute_s:
    return [exp.compute_s] * (len(exp.ratios) + 1)
  budget_s = exp.compute_budget_s / 4
  out = measure_worker_steps(exp, state, range(len(exp.ratios) + 1), budget_s=budget_s)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    out = [float(v) for v in multihost_utils.broadcast_one_to_all(np.asarray(out, np.float64))]
  return out


def worker_step_s(exp: Experiment, meta: dict[str, Any], state: Any) -> tuple[float, float | None]:
  """The compute term: measured once per run, the same in every process, kept by checkpoints.

  A resumed run reuses the measurement its checkpoint recorded, and with
  several processes process 0's measurement is everyone's, so host-side
  decisions that read the modelled clock (streams, GraVAC) agree across
  processes and across a crash. A compute term given (`exp.compute_s`,
  `config.network.compute_s`) stands in for the measurement. What is
  measured is one worker's replica of `state`, the run's train state.

  Returns:
    (the compute term, this process's own measurement): on unequal hosts
    each process measures its own; None where nothing was measured.
  """
  if meta.get('compute_s'):
    return float(meta['compute_s']), None
  if exp.compute_s:  # given: no measurement
    return exp.compute_s, None
  own = compute_s = measure_worker_step(exp, state, budget_s=exp.compute_budget_s)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    compute_s = float(multihost_utils.broadcast_one_to_all(np.float64(compute_s)))
  return compute_s, own
