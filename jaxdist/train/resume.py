"""A run's work directory: what a run writes there, and whether its checkpoint may go on.

`restore_or_init` starts a run from the latest checkpoint (resharded by
`jaxdist.train.elastic` when the workers changed) or afresh;
`check_resume` says, before anything is written, whether the checkpoint in a
work directory may resume with a config (`MAY_CHANGE_ON_RESUME`);
`clear_run` removes a run's files (`RUN_FILES`) and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import jax

from jaxdist.train import checkpoint, elastic, metrics, warm_start
from jaxdist.train.experiment import Experiment
from jaxdist.train.factory import ConfigError

SUMMARY_FILE = 'summary.json'
PLOT_FILE = 'curves.png'
BATCHES_PLOT = 'batches.png'
CONFIG_FILE = 'config.json'
CHECKPOINTS = checkpoint.DIRECTORY
# What a run writes into its work directory: `fresh=True` removes these, and nothing else.
RUN_FILES = (
  CHECKPOINTS, metrics.TENSORBOARD_DIR, metrics.METRICS_FILE, SUMMARY_FILE, CONFIG_FILE,
  PLOT_FILE, BATCHES_PLOT,
)  # fmt: skip
# Config keys a run may change when it resumes: how long it trains (`steps`), where its
# workers run (`workers`, `devices`: the checkpoint is resharded, `jaxdist.train.elastic`;
# `sync.per_worker`: how a device computes its workers' gradients, one run whichever, but
# `elastic.check_same_run` refuses a change to or from 'device'), and what only watches or
# keeps the run (evaluation, the gradient-noise measurement beside training, checkpoints,
# progress bar, fault injection, where the data is, the budget of a measurement the
# checkpoint keeps; `compare`, `variants`: no config has them, older checkpoints' configs
# hold the compare binary's variants there). Any other change stops the resume (`check_resume`).
MAY_CHANGE_ON_RESUME = (
  'steps', 'workers', 'devices', 'sync.per_worker', 'eval_every', 'eval_batch_size',
  'eval_examples', 'noise_every', 'noise_decay', 'checkpoint_every', 'keep_checkpoints', 'progress',
  'fault.kill_at_step', 'fault.signal', 'dataset.data_dir', 'dataset.download',
  'network.compute_budget_s', 'compare', 'variants',
)  # fmt: skip
START_AFRESH = (
  'resume with the config that wrote it, or start afresh with --fresh (fresh=True in Python), '
  'which deletes that run, or in a new --workdir'
)


def restore_or_init(exp, ckpt, init, state_shape) -> tuple[Any, int, dict[str, Any], dict]:
  """(state, step, metadata, controllers' states): the latest checkpoint's, or a fresh state
  at step 0 (at the source's step and model for a warm start, `exp.init_from`).

  A checkpoint of another number of workers is read as NumPy, resharded for
  this run's (`jaxdist.train.elastic`: per-method rules) and placed as a
  restore places it, its host controllers starting afresh (elastic restore
  refuses those that keep state per worker); one of the same number is
  restored as it was saved.

  Args:
    exp: the run (`factory.Experiment`).
    ckpt: its `checkpoint.Checkpointer`.
    init: `key -> state`, the fresh train state.
    state_shape: the train state's shapes (`jax.eval_shape` of `init`).

  Returns:
    (state, step, metadata, controllers' states by name).

  Raises:
    ConfigError: if the checkpoint cannot be resumed by this run.
  """
  start = ckpt.latest_step() or 0
  if not start and exp.init_from:  # a warm start: the other run's model at its step
    try:
      state = warm_start.start_state(exp, init, state_shape)
    except ValueError as e:
      raise ConfigError(str(e)) from e
    return state, exp.init_step, {'init_from': exp.init_from}, {}
  if not start:
    return init(jax.random.key(exp.seed)), 0, {}, {}
  where = f'cannot resume from the checkpoint at step {start} in {exp.workdir}'
  saved = checkpoint.read_meta(ckpt.directory, start)
  try:
    elastic.check_same_run(saved, exp)
    if elastic.needed(saved, exp):
      state, meta, done = elastic.restore(exp, ckpt.directory, start, state_shape, saved)
      logging.info('resumed from step %d, resharded %s (%s): %s', start, done, exp.method,
                   elastic.describe(exp.method))  # fmt: skip
      return state, start, meta, {}
  except elastic.ReshardError as e:
    raise ConfigError(f'{where}: {e}') from e
  shardings = jax.tree.map(lambda _: exp.workers.sharding, state_shape)
  try:
    state, meta = ckpt.restore(start, checkpoint.abstract(state_shape, shardings))
  except Exception as e:
    raise ConfigError(
      f'{where}: it does not match '
      f'this config ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}). '
      f'Use a fresh --workdir or the config that wrote it.'
    ) from e
  logging.info('resumed from step %d (%s)', start, {k: v for k, v in meta.items() if k != 'config'})
  return state, start, meta, checkpoint.read_control(ckpt.directory, start)


def config_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
  """(key, saved value, value now) per dotted key that differs, less `MAY_CHANGE_ON_RESUME`.

  A key only one side has gives None on the other.

  Args:
    saved: the config the checkpoint was written with, as JSON.
    now: the config now, as JSON.

  Returns:
    The differences, by key.
  """
  old, new = _flat(saved), _flat(now)
  may = lambda k: any(k == m or k.startswith(m + '.') for m in MAY_CHANGE_ON_RESUME)
  keys = sorted(k for k in set(old) | set(new) if not may(k))
  return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def _flat(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def resume_problem(saved: dict[str, Any] | None, now: dict[str, Any], step: int,
                   saved_workers: int | None = None) -> str | None:  # fmt: skip
  """Why a checkpoint at `step` of a run with config `saved` cannot go on with config `now`.

  None if it can: the configs agree but for `MAY_CHANGE_ON_RESUME`, the run
  has not passed `now['steps']`, and a run that reached them (nothing left to
  train) changes no workers or devices: its results would be reported as
  those of workers that never trained. `saved_workers` (the checkpoint's
  record) stands in for `saved['workers']`; `saved` None (not recorded) skips
  the key-by-key comparison.

  Args:
    saved: the config that wrote the checkpoint, as JSON, or None.
    now: the config now, as JSON.
    step: the checkpoint's step.
    saved_workers: the checkpoint's workers, if recorded.

  Returns:
    The reason, or None.
  """
  changes = config_changes(saved, now) if saved is not None else []
  if changes:
    shown = [f'{k} {json.dumps(a)} → {json.dumps(b)}' for k, a, b in changes]
    return f'its config differs in {len(changes)} key(s): {", ".join(shown)}'
  if step > now['steps']:
    return f'it is past config.steps={now["steps"]}'
  saved = saved or {}
  was = saved_workers or saved.get('workers', now['workers']), saved.get('devices', now['devices'])
  if step == now['steps'] and was != (now['workers'], now['devices']):
    return (
      f'it is a finished run of workers={was[0]}, devices={was[1]}: nothing is left to train '
      f'with workers={now["workers"]}, devices={now["devices"]} (raise config.steps above '
      f'{step} to go on with those)'
    )
  return None


def check_resume(record: dict[str, Any], workdir: str) -> None:
  """Raises ConfigError unless the run in `workdir`, if any, may go on with the config
  `record` (as JSON: `factory.record(config)`, `Experiment.record`).

  The checkpoint's metadata holds the config that wrote it (`config.json` in
  `workdir` for checkpoints that do not); `resume_problem` says what may
  differ. Reads only: nothing in `workdir` is written.

  Args:
    record: the config as JSON.
    workdir: the run's directory.
  """
  directory = os.path.join(os.path.abspath(workdir), CHECKPOINTS)
  step = checkpoint.latest_step(directory)
  if not step:
    return
  meta = checkpoint.read_meta(directory, step)
  saved = meta.get('config')
  if saved is None and os.path.isfile(os.path.join(workdir, CONFIG_FILE)):
    with open(os.path.join(workdir, CONFIG_FILE)) as f:
      saved = json.load(f)
  problem = resume_problem(saved, dict(record), step, meta.get('workers'))
  if problem:
    where = f'cannot resume from the checkpoint at step {step} in {os.path.abspath(workdir)}'
    raise ConfigError(f'{where}: {problem}; {START_AFRESH}')


def clear_run(workdir: str) -> None:
  """Removes what a run wrote into `workdir` (`RUN_FILES`); anything else there stays.

  Args:
    workdir: the run's directory.
  """
  for name in RUN_FILES:
    path = os.path.join(workdir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.lexists(path):
      os.remove(path)


def open_workdir(exp: Experiment, fresh: bool) -> None:
  """Makes `exp.workdir` ready: the old run removed if `fresh`, else checked resumable.

  Args:
    exp: the run.
    fresh: remove the run there (process 0, the others waiting for it).
  """
  if fresh:
    if jax.process_index() == 0:
      clear_run(exp.workdir)
    if jax.process_count() > 1:  # no process opens the checkpoints before they are gone
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices('jaxdist: fresh workdir')
  else:
    check_resume(exp.record, exp.workdir)
  os.makedirs(exp.workdir, exist_ok=True)
