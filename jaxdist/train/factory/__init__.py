"""Config -> objects: the dataset, model, optax chain, worker layout and networks of a run.

The only reader of the config: `build` returns an `Experiment` that holds
typed values and built objects, no config. A method's section is passed to
its factory as keyword arguments unchanged (the keys are the argument names;
see `jaxdist.train.config`), so an error names the key the user typed:
`config.sync.selsync: alpha must be in [0, 1), got 1.5`. Everything is
checked here, before the run touches its work directory.

- `chain`: the sync method's transform around the local optimizer;
- `cluster`: the modelled cluster, its batches, waiting rule and faults;
- `controls`: the ratio controller of `config.adaptive`;
- `sections`: one factory call per config section.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
from typing import Any

import jax
import ml_collections

from jaxdist import data, models, netmodel, runtime
from jaxdist.faults import inject
from jaxdist.train import config as config_lib
from jaxdist.train import methods, warm_start
from jaxdist.train import step as step_lib
from jaxdist.train.experiment import Experiment
from jaxdist.train.factory import controls, warm
from jaxdist.train.factory.chain import (
  COMPENSATIONS,
  DEVICE_MODEL,
  DEVICE_SPLIT,
  MEAN_ONLY,
  SHARED_MODEL,
  SUPPLIES,
  build_chain,
  build_compressor,
  build_optimizer,
  check_per_worker,
  deferred_exchange,
  per_worker,
  sync_transform,
)
from jaxdist.train.factory.cluster import (
  BATCHING,
  build_batching,
  build_cluster,
  build_drops,
  micro_batch,
  waiting_rule,
  worker_clock,
)
from jaxdist.train.factory.sections import call

__all__ = [
  'BATCHING', 'COMPENSATIONS', 'DEVICE_MODEL', 'DEVICE_SPLIT', 'MEAN_ONLY', 'SHARED_MODEL',
  'SUPPLIES', 'ConfigError', 'Experiment', 'build', 'build_batching', 'build_chain',
  'build_cluster', 'build_compressor', 'build_drops', 'build_optimizer', 'build_sampler', 'call',
  'check_per_worker', 'hierarchy', 'load_config', 'load_dataset', 'micro_batch', 'per_worker',
  'record', 'sync_transform', 'waiting_rule', 'worker_clock',
]  # fmt: skip


class ConfigError(ValueError):
  """The config, flags or work directory cannot run; the message says why."""


def load_config(spec: str, **overrides: Any) -> ml_collections.ConfigDict:
  """A config from `path/to/config.py[:arg]`, as `--config=` reads it.

  Args:
    spec: the config file, optionally followed by `:arg` (e.g. `:runlocal,workers=16`);
      where no file of that path exists, a config file that comes with jaxdist by that
      name (`config_lib.config_path`): `load_config('digits.py:runlocal')`.
    **overrides: dotted keys to set afterwards, e.g. `**{'sync.method': 'local_sgd'}`.

  Returns:
    The config.

  Raises:
    ConfigError: if there is no such config file.
  """
  name, _, arg = spec.partition(':')
  path = config_lib.find(name)
  module_spec = importlib.util.spec_from_file_location('_jaxdist_config', path)
  if module_spec is None or not os.path.exists(path):
    raise ConfigError(f'no config file at {path} (nor in {config_lib.config_path()})')
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(arg or None)
  config.update_from_flattened_dict(overrides)
  return config


# --- the run -----------------------------------------------------------------------


def load_dataset(cfg: ml_collections.ConfigDict) -> data.Dataset | data.Sequences:
  """The dataset a config names: a tfds name, or 'synthetic' with the shapes it gives.

  With `context` > 0 the dataset is text, read as tokens (`cfg.level`) and
  cut into windows (`jaxdist.data.sequences`); `test_split` is its
  validation split.

  Args:
    cfg: `config.dataset`.

  Returns:
    A `data.Dataset`, or `data.Sequences` for text.
  """
  if cfg.context:
    if cfg.level not in ('char', 'byte'):
      raise ValueError(f"config.dataset.level must be 'char' or 'byte', got {cfg.level!r}")
    text = data.load_text(
      cfg.name, data_dir=cfg.data_dir or None, download=cfg.download, level=cfg.level,
      train_split=cfg.train_split, validation_split=cfg.test_split, text_key=cfg.text_key or None,
    )  # fmt: skip
    try:
      return data.sequences.from_tokens(
        cfg.name, text.train, text.validation, text.vocab_size, cfg.context, text.level,
        text.decode,
      )  # fmt: skip
    except ValueError as e:
      raise ValueError(f'config.dataset.context: {e}') from None
  if cfg.name == 'synthetic':
    return data.synthetic(
      image_shape=tuple(int(d) for d in str(cfg.image_shape).split(',')),
      num_classes=cfg.num_classes,
      train_size=cfg.train_size,
      test_size=cfg.test_size,
    )
  return data.load(
    cfg.name,
    data_dir=cfg.data_dir or None,
    download=cfg.download,
    train_split=cfg.train_split,
    test_split=cfg.test_split,
  )


def _check_counts(config) -> None:
  for key, meaning in (('noise_every', 'never'), ('eval_examples', 'the whole test split')):
    if config[key] < 0:
      raise ValueError(f'{key} must be >= 0 (0: {meaning}), got {config[key]}')
  for key in (
    'steps',
    'batch_size',
    'workers',
    'eval_every',
    'checkpoint_every',
    'keep_checkpoints',
  ):
    if config[key] < 1:
      raise ValueError(f'{key} must be >= 1, got {config[key]}')
  if config.batch_size % config.workers:
    raise ValueError(
      f'batch_size {config.batch_size} (global) is not divisible by workers {config.workers}; '
      f'use a multiple of {config.workers}, e.g. --config.batch_size='
      f'{max(1, round(config.batch_size / config.workers)) * config.workers}'
    )


def record(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """`config` as the JSON a checkpoint's metadata and `config.json` keep.

  Args:
    config: the config.

  Returns:
    Its JSON, as Python dicts and values.
  """
  return json.loads(config.to_json_best_effort())


def _check_network(config) -> None:
  n = config.network
  if n.algorithm not in netmodel.ALGORITHMS:
    raise ValueError(f'network.algorithm must be one of {netmodel.ALGORITHMS}, got {n.algorithm!r}')
  if not 0 <= float(n.compute_s) < math.inf:
    raise ValueError(
      f"network.compute_s must be a finite number of seconds >= 0 (0: measure one worker's "
      f'step here), got {n.compute_s}'
    )
  if not 0 < float(n.compute_budget_s) < math.inf:
    raise ValueError(
      'network.compute_budget_s must be a finite number of seconds > 0 (the time spent '
      f'timing the compute term; e.g. 2.0), got {n.compute_budget_s}'
    )


def _held(config, per_worker: int) -> int:
  """Examples each worker holds per step: its batch, or b_max with per-worker batches."""
  if config.batching in ('uniform', 'window'):
    return per_worker
  section = config.streams if config.batching == 'stream' else config.dynamic_batching
  return section.b_max or config.batch_size


def build(config: ml_collections.ConfigDict, workdir: str) -> Experiment:
  """Checks `config` and `workdir` and builds the run; raises `ConfigError`.

  Nothing in `workdir` is created or changed here.

  Args:
    config: the run's config.
    workdir: its directory (it may not exist yet).

  Returns:
    The `Experiment`.
  """
  try:
    if os.path.exists(workdir) and not os.path.isdir(workdir):
      raise ValueError(f'workdir {workdir} exists and is not a directory; pass a directory path')
    config = warm.resolved(config)  # init_step: the step a warm start begins at
    _check_counts(config)
    check_per_worker(config)
    if config.model.name not in models.MODELS:  # before the (slower) data loading
      models.get(config.model.name, num_classes=1)
    workers = runtime.layout(config.workers, devices=config.devices or None)
    tx, schedule = build_chain(config, workers)
    _check_network(config)
    networks = {name: netmodel.resolve(name) for name in config_lib.names(config.network.profiles)}
    nodes = hierarchy(config, workers)
    straggles = inject.parse_straggles(config.fault.straggle, config.workers)
    drops = build_drops(config)
    cluster = build_cluster(config.cluster, config.workers, straggles)
    batching, micro = build_batching(config, cluster), micro_batch(config)
    ds = load_dataset(config.dataset)
    data.batch_indices(
      0, seed=config.seed, num_examples=len(ds.train), batch_size=config.batch_size
    )
    sampler = build_sampler(config, ds)
    model = models.get(config.model.name, num_classes=ds.num_classes, **_model_args(config, ds))
    ratio_control = controls.build(config, workers.count, networks, _num_params(model, ds))
    candidates = controls.compiled(config) if ratio_control is not None else ()
    kill = kill_signal(config)
    exchange = deferred_exchange(config, workers)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  return Experiment(
    workdir=workdir, dataset=ds, model=model, tx=tx, schedule=schedule, workers=workers,
    networks=networks, record=record(config), **_run(config, workers), hierarchy=nodes,
    cluster=cluster, batching=batching, sampler=sampler, ratio_control=ratio_control,
    ratios=candidates, drops=drops, kill_signal=kill, exchange=exchange, micro_batch=micro,
  )  # fmt: skip


KILL_SIGNALS = ('SIGKILL', 'SIGTERM', 'SIGINT')  # what config.fault.signal may send


def kill_signal(config) -> int:
  """The signal `config.fault.kill_at_step` sends (`config.fault.signal`: a name, SIG optional).

  Args:
    config: the run's config.

  Returns:
    The signal's number.

  Raises:
    ValueError: a name not in `KILL_SIGNALS`.
  """
  name = str(config.fault.signal).upper()
  name = name if name.startswith('SIG') else f'SIG{name}'
  if name not in KILL_SIGNALS:
    raise ValueError(
      f'config.fault.signal must be one of {KILL_SIGNALS}, got {config.fault.signal!r}'
    )
  return int(getattr(signal, name))


def _run(config, workers: runtime.Workers) -> dict[str, Any]:
  """The Experiment's plain values, from `config` (checked by `build` before)."""
  method = methods.get(config.sync.method)
  platform = workers.mesh.devices.flat[0].platform
  return dict(
    method=config.sync.method, model_name=config.model.name, dataset_name=config.dataset.name,
    steps=config.steps, seed=config.seed, batch_size=config.batch_size,
    eval_every=config.eval_every, eval_batch_size=config.eval_batch_size,
    eval_examples=config.eval_examples,
    checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
    progress=bool(config.progress), noise_every=config.noise_every,
    noise_decay=config.noise_decay, kill_at_step=config.fault.kill_at_step,
    way=per_worker(config, workers.per_device, platform), way_asked=config.sync.per_worker,
    staggered=bool(config.sync.staggered),
    reshard_multiple=config.sync[config.sync.method][method.multiple_of] if method.multiple_of
    else 1,
    compute_s=float(config.network.compute_s),
    compute_budget_s=float(config.network.compute_budget_s),
    algorithm=config.network.algorithm, wait=waiting_rule(config, config.workers),
    batching_mode=config.batching, held=_held(config, config.batch_size // workers.count),
    init_from=warm_start.source_directory(config.init_from) if config.init_from else '',
    init_step=int(config.init_step), realtime=bool(config.streams.realtime),
  )  # fmt: skip


def hierarchy(config, workers: runtime.Workers) -> netmodel.Hierarchy:
  """The devices as nodes and their simulated workers local, linked by `config.network.intra`.

  What the ledger prices intra-node links with.

  Args:
    config: the run's config (`network.intra`, `network.shared_nic`).
    workers: the worker layout.

  Returns:
    The `netmodel.Hierarchy`.
  """
  try:
    return netmodel.Hierarchy(
      nodes=workers.devices,
      local=workers.per_device,
      intra=netmodel.profile(str(config.network.intra)),
      shared_nic=config.network.shared_nic,
    )
  except ValueError as e:
    key = 'shared_nic' if 'shared_nic' in str(e) else 'intra'
    raise ValueError(f'config.network.{key}: {e}') from e


def _model_args(config, ds) -> dict[str, Any]:
  """Keyword arguments of the model from `config.model` (the MLP's `hidden` widths; the GPT's
  size and the data's context)."""
  cfg, text = config.model, bool(config.dataset.context)
  if (cfg.name in models.SEQUENCE_MODELS) != text:
    raise ValueError(
      f'config.model.name {cfg.name!r} does not fit config.dataset {config.dataset.name!r}: '
      f'language models ({sorted(models.SEQUENCE_MODELS)}) take text (dataset.context > 0), '
      f'the others images (dataset.context = 0)'
    )
  if text:
    return {'size': cfg.size, 'context': ds.context}
  widths = config_lib.names(str(cfg.get('hidden', '')))
  if not widths:
    return {}
  if cfg.name != 'mlp':
    raise ValueError(f"config.model.hidden sets the MLP's widths; model.name is {cfg.name!r}")
  try:
    hidden = tuple(int(w) for w in widths)
  except ValueError:
    raise ValueError(
      f'config.model.hidden must be comma-separated ints, got {cfg.hidden!r}'
    ) from None
  if any(w < 1 for w in hidden):
    raise ValueError(f'config.model.hidden must be positive widths, got {cfg.hidden!r}')
  return {'hidden': hidden}


def _num_params(model, ds: data.Dataset) -> int:
  """Elements of one replica's parameters (without evaluating them)."""
  init = lambda k: step_lib.init_params(model, k, ds.input_shape, ds.input_dtype)[0]
  params = jax.eval_shape(init, jax.random.key(0))
  return sum(x.size for x in jax.tree.leaves(params))


def build_sampler(config, ds: data.Dataset) -> data.Sampler:
  """The sampler of `config.partition`, checked on the first step's uniform batches.

  Args:
    config: the run's config.
    ds: the dataset.

  Returns:
    The `data.Sampler`.
  """
  partition = call(data.Partition, 'partition', config.partition, seed=config.seed)
  if partition.kind == 'labels' and isinstance(ds, data.Sequences):
    raise ValueError(
      "config.partition.kind 'labels' deals classes to workers; text has none: use 'iid' or 'seldp'"
    )
  try:
    sampler = data.make_sampler(partition, ds.train.labels, config.workers)
    sampler.indices(0, [config.batch_size // config.workers] * config.workers)
  except ValueError as e:
    raise ValueError(f'config.partition: {e}') from e
  return sampler
