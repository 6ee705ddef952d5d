"""Trials: a config trained in a work directory, as it is or at K workers and batch B.

`train` runs a config and reads back its per-step records (`compare.run`
trains each variant with it); `trial` first sets the workers, the global
batch and the steps. `scavenger_measure` makes trials the measurements of
Scavenger's planner (`control.scavenger.plan_job`) on the modelled clock, and
`scavenger_plan` plans a job for a config with it and writes the report
(`report.write_job_plan`): experiments/plan.py.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from jaxdist.control import scavenger
from jaxdist.train import factory, ledger, metrics, report, trainer

PAPER_PRICE = 0.13402  # GCP e2-standard-4, $/hour, Scavenger's §V


def train(
  config: ml_collections.ConfigDict, workdir: str, *, fresh: bool = False, label: str = ''
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """Trains `config` in `workdir` (resuming a run there unless `fresh`).

  Args:
    config: the run's config.
    workdir: the run's directory.
    fresh: remove the run in `workdir` first instead of resuming it.
    label: the run's name on the console (`trainer.train_and_evaluate`).

  Returns:
    (summary, per-step records from its metrics.jsonl).
  """
  summary = trainer.train_and_evaluate(config, workdir, fresh=fresh, label=label)
  return summary, metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))


def trial(
  config: ml_collections.ConfigDict,
  workdir: str,
  num_workers: int,
  batch_size: int,
  steps: int,
  *,
  eval_every: int,
  fresh: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """`config` at K = `num_workers`, B = `batch_size` for `steps`, quietly: (summary, records).

  It evaluates every `eval_every` steps (at most `steps`), checkpoints at the
  end and shows no progress bar; what it prints goes nowhere (its own table
  is in `workdir`).

  Args:
    config: the job's config (not changed: a copy is trained).
    workdir: the trial's directory.
    num_workers: K.
    batch_size: B, the global batch.
    steps: steps to train.
    eval_every: steps between evaluations.
    fresh: remove a run there first.

  Returns:
    (the summary, the per-step records).
  """
  c = config.copy_and_resolve_references()
  c.workers, c.batch_size, c.steps = num_workers, batch_size, steps
  c.eval_every, c.checkpoint_every, c.progress = min(eval_every, steps), steps, False
  with contextlib.redirect_stdout(io.StringIO()):
    return train(c, workdir, fresh=fresh)


def scavenger_measure(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  network: str,
  target: float,
  profile_steps: int,
  eval_every: int,
  fresh: bool = False,
) -> scavenger.Measure:
  """Scavenger's `measure(kind, K, B, steps)`: a `trial` in workdir/<kind>/K<K>_B<B>.

  From its records: the step, the median increment of the modelled clock on
  `network` with the run's measured compute term (the summary's
  `worker_step_s`, re-measured when a finished run is reused); compute, that
  term; sync, the rest; γ/K, the last `gamma_normalized` by step
  `profile_steps`. A 'target' trial also gives the first step evaluated at
  test accuracy `target` and its modelled time. With `fresh`, each trial's
  directory is emptied the first time it trains.

  Args:
    config: the job's config.
    workdir: the trials go in its subdirectories.
    network: the profile name of the modelled clock.
    target: the test accuracy of the runs to the target.
    profile_steps: the step γ/K is read at.
    eval_every: steps between evaluations.
    fresh: empty each trial's directory before it first trains.

  Returns:
    The `scavenger.Measure`.
  """
  trained = set()  # the trials this measure trained (fresh removes each one once)

  def measure(kind: str, k: int, b: int, steps: int) -> scavenger.Measurement:
    where = os.path.join(workdir, kind, f'K{k}_B{b}')
    once = fresh and where not in trained
    trained.add(where)
    summary, records = trial(config, where, k, b, steps, eval_every=eval_every, fresh=once)
    print(f'{kind:7s} K={k:<3d} B={b:<5d} {steps} steps, test acc {summary["test_accuracy"]:.4f}')
    what = f'the {kind} run K={k}, B={b}'
    compute_s = summary['worker_step_s']
    clock = [t for _, t in ledger.modelled_clock(records, network, compute_s)]
    step_s = float(np.median(np.diff([0.0, *clock])))  # the clock's per-step increments
    noise = [r for r in records if 'gamma_normalized' in r and r['step'] <= profile_steps]
    if not noise:
      raise factory.ConfigError(
        f"the records of {what} have no 'gamma_normalized' by step {profile_steps}: this "
        'trainer does not log the gradient noise (Scavenger’s γ)'
      )
    out = scavenger.Measurement(
      k, b, step_s, compute_s, step_s - compute_s, noise[-1]['gamma_normalized']
    )
    if kind != 'target':
      return out
    hit = next((r['step'] for r in records if r.get('test_accuracy', -1) >= target), None)
    if hit is None:
      best = max(r['test_accuracy'] for r in records if 'test_accuracy' in r)
      raise factory.ConfigError(
        f'{what} did not reach test accuracy {target} in {steps} steps (best {best:.4f});'
        ' raise --max_steps or lower --target'
      )
    time_s = ledger.time_to_accuracy(records, target, network, compute_s)[1]
    return out._replace(steps=hit, time_s=time_s)

  return measure


def scavenger_plan(
  config: ml_collections.ConfigDict,
  workdir: str,
  command: str = '',
  *,
  workers: Sequence[int],
  batches: Sequence[int],
  target_runs: Sequence[str] | None = None,
  search: str = 'partial',
  profile_steps: int = 20,
  target: float = 0.95,
  max_steps: int = 120,
  eval_every: int = 2,
  epoch_noise: str = 'measured',
  price: float | None = None,
  network: str | None = None,
  objective: str = 'knee',
  caps: Mapping[str, float | int | None] | None = None,
  fresh: bool = False,
) -> dict[str, Any]:
  """Plans `config`'s job by Scavenger (`control.scavenger.plan_job`) and reports it.

  The arguments are experiments/plan.py's flags (its docstring). Everything
  is checked before anything trains (a `ConfigError` says what is wrong).
  Writes plan.md, plan.json and plan.png into `workdir`
  (`report.write_job_plan`).

  Args:
    config: the job's config.
    workdir: the plan's directory; each run trains in a subdirectory.
    command: the command line, for the report.
    workers: the K of the grid.
    batches: the global batches B of the grid, each a multiple of every K.
    target_runs: 'K:B' runs to the target (None: the grid's corners).
    search: 'partial' (profile the corners) or 'full' (every point).
    profile_steps: steps of a profiling run; γ/K is read at this step.
    target: the test accuracy to train to.
    max_steps: steps of a run to the target.
    eval_every: steps between evaluations.
    epoch_noise: 'measured' or 'predicted' (`scavenger.plan_job`).
    price: the price per worker-hour (None: config.cluster.price, or the
      paper's).
    network: the profile of the clock (None: the first).
    objective: 'time', 'cost' or 'knee'.
    caps: caps by name (max_cost, max_time_s, max_batch, min_workers,
      max_workers); None values cap nothing.
    fresh: train every run afresh.

  Returns:
    What plan.json holds.
  """
  workers, batches, targets = _grid(workers, batches, target_runs)
  exp = factory.build(config, workdir)
  if exp.clock(1.0) is not None:
    raise factory.ConfigError('plan.py models equal workers; clear config.cluster')
  net = network or next(iter(exp.networks))
  if net not in exp.networks:
    raise factory.ConfigError(f'--network {net!r} is not in config.network.profiles')
  price = price if price is not None else (config.cluster.price or PAPER_PRICE)
  size = len(exp.dataset.train)
  sched = config.optimizer
  if sched.schedule != 'constant' and profile_steps > sched.warmup_steps:
    logging.warning(
      'profile_steps %d > warmup_steps %d: the profiles and the long runs differ before step %d',
      profile_steps, sched.warmup_steps, profile_steps,
    )  # fmt: skip
  measure = scavenger_measure(
    config, workdir, network=net, target=target, profile_steps=profile_steps,
    eval_every=eval_every, fresh=fresh,
  )  # fmt: skip
  caps = dict(caps or {})
  try:
    job = scavenger.plan_job(
      measure, workers=workers, batches=batches, targets=targets, profile_steps=profile_steps,
      max_steps=max_steps, dataset_size=size, price=price, search=search,
      epoch_noise=epoch_noise, objective=objective, caps=caps,
    )  # fmt: skip
  except scavenger.PlanError as e:
    raise factory.ConfigError(str(e)) from e
  about = {
    'search': search, 'objective': objective, 'caps': caps, 'network': net,
    'price_per_hour': price, 'dataset_size': size, 'target': target,
  }  # fmt: skip
  return report.write_job_plan(workdir, job, about, epoch_noise=epoch_noise, command=command)


def _grid(
  workers: Sequence[int], batches: Sequence[int], target_runs: Sequence[str] | None
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
  """The grid's K and B, sorted, and the runs to the target (default: the grid's corners)."""
  workers = sorted({int(k) for k in workers})
  batches = sorted({int(b) for b in batches})
  bad = [(k, b) for k in workers for b in batches if b % k]
  if bad:
    raise factory.ConfigError(f'every batch must be a multiple of every K; not so: {bad}')
  targets = [(workers[0], batches[0]), (workers[-1], batches[-1])]
  if target_runs:
    try:
      targets = [tuple(int(v) for v in s.split(':', 1)) for s in target_runs]
    except ValueError as e:
      raise factory.ConfigError(f'--target_runs takes K:B pairs, got {target_runs}') from e
  if any(len(t) != 2 or t[1] % t[0] for t in targets) or len(set(targets)) < 2:
    raise factory.ConfigError(
      f'--target_runs needs two K:B pairs at least, B a multiple of K; got {targets}'
    )
  return workers, batches, targets
