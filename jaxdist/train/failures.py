"""Trains the hybrid-parallel DLRM through injected failures, on CPR's modelled clock.

`train_with_failures` runs one `jaxdist.faults.cpr.Strategy` on `loop.run`:
real training steps (`jaxdist.faults.hybrid`) on the click stream, and hooks
after each that log, evaluate, recover from every failure whose time the
modelled clock has passed, and checkpoint. The bookkeeping (the row-level
checkpoint, what each failure restores and loses, the clock's charges) is
`jaxdist.faults.recovery.Recovery`. The failure trace is
`cpr.sample_failures`' (the same modelled times for every strategy with the
same `failure_seed`). Recovery 'none' is the failure-free baseline: no
failures and no checkpoints, its clock steps × step_s, the time the
overheads are fractions of. A full recovery rewinds the loop to the last
full checkpoint; the steps since it run again (the stream is a function of
the step, so they see the same batches). Checkpoints are host copies (the
tables are small), written at the strategy's steps; MFU and SSU write the
rows they choose in between.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdist.data.clicks import Clicks
from jaxdist.faults import cpr, hybrid
from jaxdist.faults.recovery import Recovery
from jaxdist.models import dlrm
from jaxdist.train import loop as loop_lib
from jaxdist.train.metrics import MetricsWriter


@functools.lru_cache(maxsize=16)
def _compiled(model, mesh, lr_tables, lr_mlp, optimizer):
  """The hybrid step and the evaluation, built once per configuration (runs share them)."""
  step = hybrid.make_hybrid_step(
    model, mesh, lr_tables=lr_tables, lr_mlp=lr_mlp, optimizer=optimizer
  )
  return step, hybrid.make_eval(model)


def _rows(state: hybrid.DLRMState) -> tuple[np.ndarray, np.ndarray]:
  """The per-row arrays a checkpoint holds: the tables and their optimizer state."""
  return np.asarray(state.tables), np.asarray(state.accum)


def evaluate(
  eval_fn: Callable[..., jax.Array], state: hybrid.DLRMState, split: Any
) -> dict[str, float]:
  """Log-loss, accuracy (threshold 0.5) and AUC of the model's probabilities on `split`.

  Args:
    eval_fn: `(state, dense, ids) -> probabilities` (`hybrid.make_eval`).
    state: the model.
    split: a `ClickBatch`.

  Returns:
    {'test_loss', 'test_accuracy', 'test_auc'}.

  Raises:
    FloatingPointError: if the log-loss is not finite.
  """
  from sklearn.metrics import roc_auc_score

  p = np.clip(np.asarray(eval_fn(state, split.dense, split.ids), np.float64), 1e-7, 1 - 1e-7)
  y = split.labels
  logloss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
  if not np.isfinite(logloss):
    raise FloatingPointError(f'test log-loss is {logloss}')
  return {
    'test_loss': logloss,
    'test_accuracy': float(np.mean((p > 0.5) == (y > 0.5))),
    'test_auc': float(roc_auc_score(y, p)),
  }


def train_with_failures(
  data: Clicks,
  strategy: cpr.Strategy,
  costs: cpr.Costs,
  *,
  mesh: jax.sharding.Mesh,
  steps: int,
  batch_size: int,
  model: dlrm.DLRM | None = None,
  lr_tables: float = 0.1,
  lr_mlp: float = 0.3,
  optimizer: str = 'rowwise_adagrad',
  seed: int = 0,
  failure_seed: int = 0,
  failures: cpr.Failures | None = None,
  test_size: int = 8192,
  eval_every: int = 0,
  log_every: int = 10,
  ssu_oversample: float = 2.0,
  metrics_dir: str | None = None,
) -> dict[str, Any]:
  """Trains `steps` steps under `strategy` and returns the run's summary, with its `records`.

  Args:
    data: the click stream; its tables are spread over the mesh's workers.
    strategy: checkpointing and recovery (`cpr.strategy(name, ...)`).
    costs: the modelled clock and the failure rate.
    mesh: 1-D mesh with axis `data`; each device is a worker and an
      embedding shard.
    steps: training steps that count (recomputed steps come on top).
    batch_size: the global batch, a multiple of the workers.
    model: the dense part (default: `DLRM(embed_dim=16)`).
    lr_tables: learning rate of the tables.
    lr_mlp: learning rate (SGD) of the MLP.
    optimizer: the tables', 'rowwise_adagrad' or 'sgd' (`jaxdist.faults.hybrid`).
    seed: the model's initialisation.
    failure_seed: the failure trace's seed.
    failures: a failure trace to use instead (e.g. one chosen by hand).
    test_size: held-out examples of the evaluations.
    eval_every: also evaluate every this many steps (0: only at the end).
    log_every: a training record every this many steps.
    ssu_oversample: SSU samples lookups at this many times the rate that
      would fill its buffer once per prioritised interval.
    metrics_dir: if set, the records go to `metrics_dir/metrics.jsonl` (and
      TensorBoard) with `jaxdist.train.metrics.MetricsWriter`.

  Returns:
    A dict: the strategy and interval, `failures`, `pls`, `expected_pls`,
    `lost_updates`, `checkpoint_s`, `lost_s`, `recovery_s`, `total_s`,
    `failure_free_s`, the overheads as fractions (`*_overhead`) and the
    first-order model's (`expected_overhead`, `cpr.expected_overhead`), the
    final `test_loss`, `test_accuracy`, `test_auc`, `bayes_loss` (the
    teacher's), `wall_s`, `records` (step, loss, modelled clock,
    evaluations, failures) and the final `state` (on the host).
  """
  model = model or dlrm.DLRM(embed_dim=16)
  workers = mesh.size
  if batch_size % workers:
    raise ValueError(f'batch_size ({batch_size}) must be a multiple of the workers ({workers})')
  if steps < 1:
    raise ValueError(f'steps must be >= 1, got {steps}')
  start = time.perf_counter()
  step_fn, eval_fn = _compiled(model, mesh, lr_tables, lr_mlp, optimizer)
  state_sharding, _ = hybrid.shardings(mesh)
  init = hybrid.init_state(
    model, jax.random.key(seed), num_tables=data.num_tables, rows=data.rows,
    num_dense=data.num_dense,
  )  # fmt: skip
  test = data.test(test_size)
  horizon = 10 * steps * costs.step_s + 20 * costs.mttf_s
  trace = failures or cpr.sample_failures(costs.mttf_s, horizon, workers, failure_seed)
  if len(trace.workers) and not 0 <= trace.workers.min() <= trace.workers.max() < workers:
    raise ValueError(f'failed workers must be in [0, {workers}), got {trace.workers}')
  recovery = Recovery(
    strategy, costs, trace, _rows(init), jax.device_get(init.mlp), workers=workers,
    batch_size=batch_size, ssu_oversample=ssu_oversample, seed=failure_seed + 1,
  )  # fmt: skip
  log = _Log(metrics_dir)
  last = {}

  def step(t: int, state):
    batch = data.batch(t, batch_size)
    recovery.stepped(batch.ids)
    state, last['loss'] = step_fn(state, batch.dense, batch.ids, batch.labels)
    return state

  def logged(loop):
    loss = float(last['loss'])
    if not np.isfinite(loss):
      raise FloatingPointError(f'{strategy.name}: training loss {loss} at step {loop.t}')
    log(loop.t, loss=loss, clock_s=recovery.clock)

  def evaluated(loop):
    if loop.t < loop.steps:
      log(loop.t, clock_s=recovery.clock, **evaluate(eval_fn, loop.state, test))

  hooks = [loop_lib.every(log_every, logged), loop_lib.every(eval_every, evaluated, last=False),
           *_recovering(recovery, log, state_sharding)]  # fmt: skip
  state = jax.device_put(init, state_sharding)
  state = loop_lib.run(loop_lib.Loop(state, 0, steps), step, hooks).state
  final = evaluate(eval_fn, state, test)
  log(steps, clock_s=recovery.clock, **final)
  log.close()
  return {
    **recovery.summary(steps),
    'bayes_loss': data.bayes_logloss(test),
    **final,
    'wall_s': time.perf_counter() - start,
    'records': log.records,
    'state': jax.device_get(state),
  }


def _recovering(recovery: Recovery, log, state_sharding) -> tuple[loop_lib.Hook, loop_lib.Hook]:
  """The hooks of failures (every one the clock has passed, in order) and checkpoints."""

  def failed(loop):
    while (worker := recovery.next_failure(loop.t, loop.steps)) is not None:
      back = recovery.fail(worker, loop.t, _rows(loop.state))
      if back.mlp is None:  # partial: the shard's rows (restored as copies), the run's MLP
        saved = hybrid.DLRMState(back.tables, loop.state.mlp, back.accum)
      else:  # full: copies, as the step donates its state and the checkpoint must never
        # share a buffer with it
        saved = jax.tree.map(np.array, hybrid.DLRMState(back.tables, back.mlp, back.accum))
      loop.state = jax.device_put(saved, state_sharding)
      loop.t = back.step
      log(loop.t, clock_s=recovery.clock, failed_worker=worker)

  def checkpointed(loop):
    rows, mlp = (lambda: _rows(loop.state)), (lambda: jax.device_get(loop.state.mlp))
    recovery.checkpoint(loop.t, loop.steps, rows, mlp)

  return failed, checkpointed


class _Log:
  """`log(step, **scalars)`: a record kept in `records`, and written to `metrics_dir` if given."""

  def __init__(self, metrics_dir: str | None):
    self.records: list[dict[str, Any]] = []
    self.writer = None
    if metrics_dir is not None:
      os.makedirs(metrics_dir, exist_ok=True)
      self.writer = MetricsWriter(metrics_dir, resume_step=0)

  def __call__(self, step: int, **scalars) -> None:
    self.records.append({'step': step, **scalars})
    if self.writer is not None:
      self.writer.write(step, scalars)

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()
