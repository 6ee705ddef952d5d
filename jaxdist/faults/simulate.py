"""Trains the hybrid-parallel DLRM through injected failures, on CPR's modelled clock.

`train_with_failures` runs one `jaxdist.faults.cpr.Strategy`: real training
steps (`jaxdist.faults.hybrid`) on the click stream, a modelled clock that
charges each step `costs.step_s`, each checkpoint its share of `save_s`, each
failure `restart_s` plus the load of what it restores, and the failure trace
of `cpr.sample_failures` (the same modelled times for every strategy with
the same `failure_seed`). Recovery 'none' is the failure-free baseline:
no failures and no checkpoints, its clock steps × step_s, the time the
overheads are fractions of. After each step, every failure whose time the
clock has passed happens:

- full recovery: tables, MLP and data position go back to the last full
  checkpoint; the steps since it run again (the stream is a function of the
  step, so they see the same batches) and their time is the lost work;
- partial recovery: the failed worker's tables go back to their saved rows
  (`RowCheckpoint.restore`); the MLP is a data-parallel replica and is taken
  from a surviving worker (a simplification: nothing of it is lost); the run
  goes on at the same step.

Checkpoints are host copies (the tables are small), written at the
strategy's steps; MFU and SSU write the rows they choose in between.
Measured per run: PLS (`cpr.pls`; per failure, the samples trained since
the failed shard's last full checkpoint or its last restore, whichever is
later: samples a shard already lost are not lost twice; MFU/SSU's
prioritised checkpoints do not count), lost updates (lookups whose updates
a restore discarded, over all lookups; equal to PLS for plain partial
recovery, lower with MFU/SSU), the time of checkpoints, of lost work and of
recoveries, each as a fraction of the failure-free time steps × step_s, and
the final test log-loss, accuracy and AUC.
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
from jaxdist.models import dlrm


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
  """Log-loss, accuracy (threshold 0.5) and AUC of the model's probabilities on `split`."""
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
    lr_tables, lr_mlp: learning rates of the tables and (SGD) of the MLP.
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
  t_count, rows = data.num_tables, data.rows
  if batch_size % workers:
    raise ValueError(f'batch_size ({batch_size}) must be a multiple of the workers ({workers})')
  if steps < 1:
    raise ValueError(f'steps must be >= 1, got {steps}')
  shards = [cpr.shard_tables(k, t_count, workers) for k in range(workers)]
  start = time.perf_counter()

  step_fn, eval_fn = _compiled(model, mesh, lr_tables, lr_mlp, optimizer)
  state_sharding, _ = hybrid.shardings(mesh)
  init = hybrid.init_state(
    model, jax.random.key(seed), num_tables=t_count, rows=rows, num_dense=data.num_dense
  )
  state = jax.device_put(init, state_sharding)
  test = data.test(test_size)

  failure_free_s = steps * costs.step_s
  horizon = 10 * failure_free_s + 20 * costs.mttf_s
  trace = failures or cpr.sample_failures(costs.mttf_s, horizon, workers, failure_seed)
  if len(trace.workers) and not 0 <= trace.workers.min() <= trace.workers.max() < workers:
    raise ValueError(f'failed workers must be in [0, {workers}), got {trace.workers}')
  if strategy.recovery == 'none':
    trace = cpr.Failures(trace.times_s[:0], trace.workers[:0])

  ckpt = cpr.RowCheckpoint(np.asarray(init.tables), np.asarray(init.accum))  # free
  mlp_ckpt, ckpt_step = jax.device_get(init.mlp), 0
  since = np.zeros(workers, np.int64)  # per shard: step of its last full save or restore
  counts = np.zeros((t_count, rows), np.int64)  # lookups since each row's last save
  ssu = None
  capacity = max(1, round(strategy.fraction * rows * t_count / workers))
  if strategy.priority == 'ssu':
    rate = min(
      1.0, ssu_oversample * capacity * workers / (strategy.priority_every * batch_size * t_count)
    )
    ssu = cpr.SSUSampler(t_count, rows, workers, capacity, rate, seed=failure_seed + 1)

  writer = None
  if metrics_dir is not None:
    from jaxdist.train.metrics import MetricsWriter

    os.makedirs(metrics_dir, exist_ok=True)
    writer = MetricsWriter(metrics_dir, resume_step=0)

  records: list[dict[str, Any]] = []

  def log(step, **scalars):
    records.append({'step': step, **scalars})
    if writer is not None:
      writer.write(step, scalars)

  clock = compute_s = save_s = lost_s = recovery_s = 0.0
  lost_samples: list[int] = []
  lost_updates = 0
  full_saves = priority_saves = rows_written = 0
  fi, step, executed = 0, 0, 0
  while step < steps:
    batch = data.batch(step, batch_size)
    flat = (np.arange(t_count)[None, :] * rows + batch.ids).reshape(-1)
    counts += np.bincount(flat, minlength=t_count * rows).reshape(t_count, rows)
    if ssu is not None:
      ssu.record(batch.ids)
    state, loss = step_fn(state, batch.dense, batch.ids, batch.labels)
    step += 1
    executed += 1
    clock += costs.step_s
    compute_s += costs.step_s
    if step % log_every == 0 or step == steps:
      loss = float(loss)
      if not np.isfinite(loss):
        raise FloatingPointError(f'{strategy.name}: training loss {loss} at step {step}')
      log(step, loss=loss, clock_s=clock)
    if eval_every and step % eval_every == 0 and step < steps:
      log(step, clock_s=clock, **evaluate(eval_fn, state, test))

    # failures the clock has passed, in order
    while fi < len(trace.times_s) and trace.times_s[fi] <= clock and step < steps:
      worker = int(trace.workers[fi])
      fi += 1
      if strategy.recovery == 'full':
        lost_s += (step - ckpt_step) * costs.step_s
        step = ckpt_step
        saved = hybrid.DLRMState(ckpt.values[0], mlp_ckpt, ckpt.values[1])
        # copies: the step donates its state, the checkpoint must never share a buffer with it
        state = jax.device_put(jax.tree.map(np.array, saved), state_sharding)
        counts[...] = 0
        load = costs.load_s
      else:
        tables = shards[worker]
        lost_updates += int(counts[list(tables)].sum())
        counts[list(tables)] = 0
        lost_samples.append((step - since[worker]) * batch_size)
        since[worker] = step
        tab, acc = ckpt.restore(_rows(state), tables)
        state = jax.device_put(hybrid.DLRMState(tab, state.mlp, acc), state_sharding)
        load = costs.load_s / workers
      recovery_s += costs.restart_s + load
      clock += costs.restart_s + load
      log(step, clock_s=clock, failed_worker=worker)

    # checkpoints (none without recovery, none after the last step)
    if strategy.recovery == 'none' or step == steps:
      continue
    if step % strategy.interval == 0 and step > ckpt_step:
      ckpt.save(_rows(state), step)
      mlp_ckpt, ckpt_step = jax.device_get(state.mlp), step
      since[:] = step
      counts[...] = 0
      full_saves += 1
      rows_written += t_count * rows
      save_s += costs.save_s
      clock += costs.save_s
    elif strategy.priority and step % strategy.priority_every == 0:
      if strategy.priority == 'mfu':
        mask = np.zeros((t_count, rows), bool)
        for tables in shards:
          mask |= cpr.mfu_mask(counts, tables, capacity)
      else:
        mask = np.zeros((t_count, rows), bool)
        for k in range(workers):
          mask |= ssu.take(k)
      written = ckpt.save(_rows(state), step, mask)
      counts[mask] = 0
      priority_saves += 1
      rows_written += written
      cost = costs.save_s * written / (t_count * rows)
      save_s += cost
      clock += cost

  final = evaluate(eval_fn, state, test)
  log(steps, clock_s=clock, **final)
  if writer is not None:
    writer.close()
  total_lookups = steps * batch_size * t_count
  interval_s = strategy.interval * costs.step_s
  expected = 0.0
  if strategy.recovery != 'none':
    per_full = strategy.interval // strategy.priority_every if strategy.priority else 1
    writes = 1 + (per_full - 1) * strategy.fraction  # full checkpoints' worth per interval
    expected = cpr.expected_overhead(strategy.recovery, interval_s, costs, workers, writes)
  summary = {
    'strategy': strategy.name,
    'recovery': strategy.recovery,
    'priority': strategy.priority,
    'interval_steps': strategy.interval,
    'priority_every': strategy.priority_every,
    'pls_target': strategy.pls_target,
    'steps': steps,
    'executed_steps': executed,
    'failures': fi,
    'pls': cpr.pls(lost_samples, workers, steps * batch_size),
    'expected_pls': (
      cpr.expected_pls(interval_s, costs.mttf_s, workers) if strategy.recovery == 'partial' else 0.0
    ),
    'lost_updates': lost_updates / total_lookups,
    'full_saves': full_saves,
    'priority_saves': priority_saves,
    'rows_written': rows_written,
    'checkpoint_s': save_s,
    'lost_s': lost_s,
    'recovery_s': recovery_s,
    'total_s': clock,
    'failure_free_s': failure_free_s,
    'checkpoint_overhead': save_s / failure_free_s,
    'lost_overhead': lost_s / failure_free_s,
    'recovery_overhead': recovery_s / failure_free_s,
    'total_overhead': (clock - failure_free_s) / failure_free_s,
    'expected_overhead': expected,
    'bayes_loss': data.bayes_logloss(test),
    **final,
    'wall_s': time.perf_counter() - start,
    'records': records,
    'state': jax.device_get(state),
  }
  assert abs(compute_s - lost_s - failure_free_s) < 1e-6 * failure_free_s
  return summary
