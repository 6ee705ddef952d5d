"""Config -> objects: the dataset, model, optax chain, worker layout and networks of a run.

The only reader of `config.sync` and `config.compress`. A method's section is
passed to its factory as keyword arguments unchanged (the keys are the
argument names; see `jaxdist.train.config`), so an error names the key the
user typed: `config.sync.selsync: alpha must be in [0, 1), got 1.5`.
Everything is checked here, before the run touches its work directory.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import optax

from jaxdist import compress, control, data, models, netmodel, runtime, sync
from jaxdist.faults import inject
from jaxdist.train import adaptive, methods
from jaxdist.train import config as config_lib
from jaxdist.train import step as step_lib


class ConfigError(ValueError):
  """The config, flags or work directory cannot run; the message says why."""


def load_config(spec: str, **overrides: Any) -> ml_collections.ConfigDict:
  """A config from `path/to/config.py[:arg]`, as `--config=` reads it.

  Args:
    spec: the config file, optionally followed by `:arg` (e.g. `:runlocal,workers=16`).
    **overrides: dotted keys to set afterwards, e.g. `**{'sync.method': 'local_sgd'}`.
  """
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_jaxdist_config', path)
  if module_spec is None or not os.path.exists(path):
    raise ConfigError(f'no config file at {path}')
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(arg or None)
  config.update_from_flattened_dict(overrides)
  return config


# --- one factory call per config section ------------------------------------------


def call(factory: Callable[..., Any], where: str, section: Any, **supplied: Any) -> Any:
  """`factory(**section, **supplied)`; errors name the config section `where`.

  Args:
    factory: a jaxdist factory (transform or compressor).
    where: the section's dotted config path, e.g. 'sync.local_sgd'.
    section: its keys and values (the factory's argument names).
    **supplied: arguments the trainer provides (axis_name, optimizers...).
  """
  kwargs = dict(section or {})
  allowed = set(inspect.signature(factory).parameters) - set(supplied)
  unknown = sorted(set(kwargs) - allowed)
  if unknown:
    raise ValueError(
      f'config.{where} has {unknown}, which {factory.__name__} does not take; '
      f'its arguments: {sorted(allowed - {"axis_name"})}'
    )
  try:
    return factory(**kwargs, **supplied)
  except (ValueError, TypeError) as e:
    raise ValueError(f'config.{where}: {e}') from e


def build_optimizer(cfg: Any, steps: int, where: str = 'optimizer'):
  """(optimizer, learning-rate schedule) of an optimizer section (`config.optimizer`)."""
  cfg = ml_collections.ConfigDict(dict(cfg))
  lr = cfg.learning_rate
  if cfg.schedule == 'constant':
    schedule = optax.constant_schedule(lr)
  elif cfg.schedule == 'cosine':
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(cfg.warmup_steps, steps - 1), steps)
  else:
    raise ValueError(
      f"config.{where}.schedule must be 'constant' or 'cosine', got {cfg.schedule!r}"
    )
  rate = lr if cfg.schedule == 'constant' else schedule
  if cfg.name == 'sgd':
    opt = optax.sgd(rate, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
  elif cfg.name == 'adam':
    opt = optax.adam(rate)
  elif cfg.name == 'adamw':
    opt = optax.adamw(rate, weight_decay=cfg.weight_decay)
  else:
    raise ValueError(f"config.{where}.name must be 'sgd', 'adam' or 'adamw', got {cfg.name!r}")
  if cfg.weight_decay and cfg.name != 'adamw':
    opt = optax.chain(optax.add_decayed_weights(cfg.weight_decay), opt)
  return opt, schedule


def build_compressor(cfg: ml_collections.ConfigDict) -> compress.Compressor:
  """The compressor `cfg.name` with the arguments of its section `cfg[cfg.name]`."""
  if cfg.name not in compress.REGISTRY or cfg.name not in cfg:
    raise ValueError(
      f'unknown compress.name {cfg.name!r}; choose one of '
      f'{sorted(n for n in compress.REGISTRY if n in cfg)}'
    )
  return call(compress.REGISTRY[cfg.name], f'compress.{cfg.name}', cfg[cfg.name])


def _averager(name: str, config, axis_name, where: str):
  """The averaging transform an `averager` key names ('' = average the models)."""
  if not name:
    return None
  if name == 'allreduce':
    return sync.allreduce(axis_name=axis_name)
  if name == 'compressed_allreduce':
    c = build_compressor(config.compress)
    section = config.sync.compressed_allreduce
    return call(
      sync.compressed_allreduce,
      'sync.compressed_allreduce',
      section,
      compressor=c,
      axis_name=axis_name,
    )
  if name == 'powersgd':
    return call(sync.powersgd, 'sync.powersgd', config.sync.powersgd, axis_name=axis_name)
  raise ValueError(
    f"config.{where}.averager must be '', 'allreduce', 'compressed_allreduce' or 'powersgd', "
    f'got {name!r}'
  )


def _sparsifier(cfg: ml_collections.ConfigDict, where: str) -> compress.Compressor:
  """The compressor of `config.compress`, which must be a sparsifier (for `where`)."""
  sparsifiers = sorted(n for n, c in compress.REGISTRY.items() if c.sparse and n in cfg)
  if cfg.name in compress.REGISTRY and not compress.REGISTRY[cfg.name].sparse:
    raise ValueError(
      f'config.{where} sends the shards of a sparsifier: config.compress.name must be one of '
      f'{sparsifiers}, got {cfg.name!r}'
    )
  return build_compressor(cfg)


def _compressor(config, workers: runtime.Workers, section: dict, where: str) -> dict[str, Any]:
  """compressed_allreduce's compressor, and the candidate ratios `config.adaptive` chooses."""
  compressor = build_compressor(config.compress)
  section['ratios'] = adaptive.ratios(config, getattr(compressor, 'ratio', None))
  if config.adaptive == 'adopt':  # it measures the candidate it runs: no extra top-k
    section['gains'] = 'sent'
  return {'compressor': compressor}


def _hierarchy(config, workers: runtime.Workers, section: dict, where: str) -> dict[str, Any]:
  """hitopk_allreduce's layout: the devices are the nodes, their simulated workers local."""
  return {
    'compressor': _sparsifier(config.compress, where),
    'node_axis': runtime.DATA,
    'local_axis': runtime.SIM,
    'local_size': workers.per_device,
  }


# What a method's row may ask the trainer to supply (`methods.Method.supplies`): each gives
# factory arguments (and may set section values that depend on the run).
SUPPLIES: dict[str, Callable[..., dict[str, Any]]] = {
  'axis_name': lambda config, workers, section, where: {'axis_name': workers.axis_name},
  'num_workers': lambda config, workers, section, where: {'num_workers': workers.count},
  'compressor': _compressor,
  'hierarchy': _hierarchy,
}


def sync_transform(config, workers: runtime.Workers, opt) -> optax.GradientTransformation:
  """The transform `config.sync.method` names, built from its section, with `opt` passed in."""
  method = config.sync.method
  row, where = methods.get(method), f'sync.{method}'
  section = dict(config.sync[method])
  for key in [k for k in section if k.endswith('optimizer')]:
    section[key] = build_optimizer(section[key], config.steps, f'{where}.{key}')[0]
  if 'averager' in section:
    section['averager'] = _averager(section['averager'], config, workers.axis_name, where)
  for key, convert in row.convert.items():
    section[key] = convert(section[key], where)
  supplied: dict[str, Any] = {}
  for name in row.supplies:
    supplied.update(SUPPLIES[name](config, workers, section, where))
  uneven = config.batching != 'uniform' or str(config.fault.drop).strip()
  make = row.weighted if row.weighted and uneven else row.make  # weights b_k / G
  if row.optimizer == 'in':
    supplied[next(iter(inspect.signature(make).parameters))] = opt
  return call(make, where, section, **supplied)


COMPENSATIONS = ('spike_compensation', 'linear_weight_prediction')


# make_train_step's per-worker ways each method allows (its row: one_model, mean_only, device)
SHARED_MODEL = methods.having('one_model')
MEAN_ONLY = methods.having('mean_only')
DEVICE_MODEL = methods.having('device', 'model')
DEVICE_SPLIT = methods.having('device', 'split')


def _mean_not_exact(config) -> str:
  """Why the chain sees more of the workers' gradients than their equal-weight sum ('' if not)."""
  s = config.sync
  if s.method not in MEAN_ONLY:
    return f'sync.method={s.method!r} is not one of {MEAN_ONLY}'
  averager = s[s.method].get('averager', '')
  if averager not in ('', 'allreduce'):
    return f'sync.{s.method}.averager={averager!r} compresses'
  if s.local_clip.max_norm:
    return "sync.local_clip clips each worker's own gradient"
  if config.batching != 'uniform':
    return f'batching={config.batching!r} weights the workers by their batches'
  if config.fault.drop:
    return 'fault.drop weights dropped workers 0'
  return ''


def _split_not_exact(config) -> str:
  """Why per_worker='device' cannot split the chain of `config` ('' if it can)."""
  if config.batching != 'uniform':
    return f'batching={config.batching!r} weights the workers by their batches'
  if config.adaptive != 'none':
    return f'adaptive={config.adaptive!r} hands each worker its candidate ratio'
  return ''


def per_worker(config, per_device: int, platform: str) -> str:
  """The way the trainer's step runs a device's workers: `config.sync.per_worker`, 'auto'
  resolved to 'mean' off the CPU where that is exact (an H100: ResNet-20, 8 simulated
  workers at 1.09x one plain batch's samples/s, against 0.37x with `vmap`), else left to
  make_train_step ('loop' on the CPU, where 'mean' is no faster, 'vmap' elsewhere).
  """
  way = config.sync.per_worker
  if (
    way == 'auto'
    and platform != 'cpu'
    and per_device > 1
    and not config.sync.staggered
    and not _mean_not_exact(config)
  ):
    return 'mean'
  return way


def check_per_worker(config) -> None:
  """`config.sync.per_worker`: a way make_train_step knows; 'shared', 'mean' and 'device'
  where exact."""
  way = config.sync.per_worker
  if way not in step_lib.PER_WORKER:
    raise ValueError(f'config.sync.per_worker must be {step_lib.WAYS}, got {way!r}')
  split = way == 'device' and config.sync.method in DEVICE_SPLIT
  if split and (why := _split_not_exact(config)):
    raise ValueError(
      f"config.sync.per_worker='device' keeps one model per device and each worker's "
      f'error-feedback state; it runs equal batches with one compiled ratio, but {why}; use '
      'per_worker=auto'
    )
  if way in step_lib.MEAN_GRADIENT and not split and (why := _mean_not_exact(config)):
    raise ValueError(
      f"config.sync.per_worker={way!r} hands each worker its device's mean gradient, exact only "
      f"where the update sees the workers' gradients only through their sum, but {why}; use "
      'per_worker=auto'
    )
  if way == 'device' and config.sync.method not in DEVICE_MODEL + DEVICE_SPLIT:
    raise ValueError(
      "config.sync.per_worker='device' keeps one model per device: tested for "
      f'{", ".join(DEVICE_MODEL + DEVICE_SPLIT)}, not sync.method={config.sync.method!r}; '
      'use per_worker=mean or auto'
    )
  if way == 'shared' and config.sync.method not in SHARED_MODEL:
    raise ValueError(
      f"config.sync.per_worker='shared' reads one worker's weights for all of them; "
      f'sync.method={config.sync.method!r} keeps a model per worker. Use it only with '
      f'{", ".join(SHARED_MODEL)}, or per_worker=auto'
    )
  if config.sync.staggered and way in step_lib.TOGETHER:
    raise ValueError(
      f'config.sync.staggered runs the workers one after the other: '
      f'config.sync.per_worker={way!r} contradicts it; use auto or loop'
    )


def build_chain(
  config, workers: runtime.Workers
) -> tuple[optax.GradientTransformation | step_lib.SplitChain, Any]:
  """The optax chain of `config.sync.method` around the local optimizer, and its schedule."""
  method = config.sync.method
  row = methods.get(method)
  opt, schedule = build_optimizer(config.optimizer, config.steps)
  fixes = config_lib.names(config.sync.compensation)
  if fixes and not row.compensations:
    takes = ', '.join(methods.having('compensations'))
    raise ValueError(f'config.sync.compensation applies to {takes}, not {method!r}')
  if unknown := set(fixes) - set(COMPENSATIONS):
    raise ValueError(f'config.sync.compensation: unknown {sorted(unknown)}; use {COMPENSATIONS}')
  if 'spike_compensation' in fixes:  # it carries the momentum: the optimizer keeps only its rate
    if config.optimizer.name != 'sgd':
      raise ValueError('config.sync.compensation: spike_compensation replaces SGD momentum; '
                       f'it needs optimizer.name sgd, got {config.optimizer.name!r}')  # fmt: skip
    opt = optax.scale_by_learning_rate(schedule)
  tx = sync_transform(config, workers, opt)
  if row.optimizer == 'after':
    return optax.chain(opt, tx), schedule
  if row.optimizer == 'in':
    return tx, schedule
  parts = [tx]
  if config.sync.local_clip.max_norm:
    parts.insert(
      0,
      call(sync.local_clip, 'sync.local_clip', config.sync.local_clip, axis_name=workers.axis_name),
    )
  if row.compensations:  # pipelined backprop: the delay is the pipeline's, not the net's
    delay = methods.delay(config.sync[method].delay, f'sync.{method}')
    parts.insert(-1, sync.allreduce(axis_name=workers.axis_name))
    if 'spike_compensation' in fixes:  # weight decay enters the momentum, as in optax.sgd
      sc = config.sync.spike_compensation
      if config.optimizer.weight_decay:
        parts.append(optax.add_decayed_weights(config.optimizer.weight_decay))
      parts.append(call(sync.spike_compensation, 'sync.spike_compensation', sc, delay=delay))
  if config.sync.per_worker == 'device' and method in DEVICE_SPLIT:
    return step_lib.SplitChain(optax.chain(*parts), opt), schedule
  tx = optax.chain(*parts, opt)
  if 'linear_weight_prediction' in fixes:
    lwp = config.sync.linear_weight_prediction
    lwp = call(sync.linear_weight_prediction, 'sync.linear_weight_prediction', lwp, delay=delay)
    tx = optax.chain(tx, lwp)
  return tx, schedule


# --- the cluster the modelled clock pretends to have --------------------------------


def _phases(text: str) -> tuple[tuple[int, tuple[float, ...]], ...]:
  phases = []
  for i, part in enumerate(p for p in str(text).split(';') if p.strip()):
    steps, colon, factors = part.partition(':')
    if not colon or not steps.strip().isdigit():
      raise ValueError(
        f"config.cluster.phases: phase {i} must be 'steps:factor,factor,...', got {part!r}"
      )
    phases.append((int(steps), config_lib.numbers(factors, 'cluster.phases')))
  return tuple(phases)


def _stream_rates(cfg, num_workers: int) -> tuple[float, ...]:
  """`cluster.stream_rates`: numbers, or a named rate set drawn for `num_workers` workers."""
  text = str(cfg.stream_rates).strip()
  if text.upper() in control.RATE_SETS:
    rates = control.stream_rates(text.upper(), num_workers, seed=cfg.seed)
    return tuple(float(r) for r in rates)
  return config_lib.numbers(text, 'cluster.stream_rates')


def build_cluster(cfg, num_workers: int, straggles: tuple = ()) -> netmodel.Cluster | None:
  """The cluster `config.cluster` describes, or None (equal workers: no cluster model).

  Injected `straggles` (`config.fault.straggle`) need the per-worker clock: with
  them, equal workers of speed 1 if `config.cluster` describes none.
  """
  kwargs = dict(
    straggler_p=cfg.straggler_p,
    straggler_slowdown=cfg.straggler_slowdown,
    seed=cfg.seed,
    phases=_phases(cfg.phases),
    stream_rates=_stream_rates(cfg, num_workers),
    price=cfg.price,
    straggles=tuple(straggles),
  )
  speeds, cores = config_lib.numbers(cfg.speeds, 'cluster.speeds'), str(cfg.cores).strip()
  described = speeds or cores or cfg.straggler_p or kwargs['phases'] or cfg.price or straggles
  if not (described or kwargs['stream_rates']):
    return None
  if speeds and cores:
    raise ValueError('config.cluster: give speeds or cores, not both')
  try:
    if cores:
      by_name = cores.lower() in netmodel.H_LEVELS
      cluster = netmodel.Cluster.from_cores(
        cores if by_name else config_lib.numbers(cores, 'cluster.cores'), **kwargs
      )
    else:
      cluster = netmodel.Cluster(speeds or (1.0,) * num_workers, **kwargs)
    cluster.check_workers(num_workers)
  except ValueError as e:
    raise ValueError(f'config.cluster: {e}') from e
  return cluster


def waiting_rule(config, num_workers: int) -> dict[str, Any]:
  """`WorkerClock` arguments of the method's waiting rule (see `jd.netmodel.cluster`)."""
  method = config.sync.method
  return methods.get(method).wait(config.sync[method], num_workers)


BATCHING = ('uniform', 'static', 'dynamic', 'stream')


def build_batching(
  config, cluster: netmodel.Cluster | None
) -> control.DynamicBatching | control.Streams | None:
  """The batch-size controller `config.batching` asks for (None: uniform batches).

  Streams (`config.cluster.stream_rates`) give a `control.Streams`: with
  'stream', ScaDLES's stream-proportional batches; with 'uniform', the fixed
  B / K of the paper's baseline (every worker waits for its data).
  """
  mode = config.batching
  if mode not in BATCHING:
    raise ValueError(f'config.batching must be one of {BATCHING}, got {mode!r}')
  rates = cluster.stream_rates if cluster is not None else ()
  if mode == 'uniform' and not rates:
    return None
  if mode == 'stream' and not rates:
    raise ValueError(
      "config.batching='stream' sizes batches by the data streaming in: give "
      "config.cluster.stream_rates (numbers per worker, or a rate set 'S1', 'S2', 'S10', 'S20')"
    )
  if rates and mode in ('static', 'dynamic'):
    raise ValueError(
      f'config.batching={mode!r} and config.cluster.stream_rates: choose one way to size '
      "batches ('stream' for streams)"
    )
  if cluster is None:
    raise ValueError(
      f"config.batching={mode!r} sizes batches by the workers' speeds: describe them in "
      'config.cluster (speeds or cores)'
    )
  if mode != 'uniform' and config.sync.method != 'allreduce':
    raise ValueError(
      f'config.batching={mode!r} averages gradients with weights b_k / Σb: it needs '
      f'sync.method=allreduce, got {config.sync.method!r}'
    )
  if rates:
    section = dict(config.streams)
    section['b_max'] = section['b_max'] or config.batch_size
    policy = 'proportional' if mode == 'stream' else 'fixed'
    ctl = call(
      control.streams, 'streams', section, rates=rates, base_batch=config.batch_size, policy=policy
    )
    where = 'streams'
  else:
    section = config.dynamic_batching
    ctl = call(
      control.dynamic_batching, 'dynamic_batching', section, global_batch=config.batch_size
    )
    where = 'dynamic_batching'
  try:
    ctl.init(config.workers)  # the bounds admit the batches
  except ValueError as e:
    raise ValueError(f'config.{where}: {e}') from e
  return ctl


def worker_clock(config, cluster: netmodel.Cluster | None, compute_s: float):
  """A fresh `netmodel.WorkerClock` of `cluster` under the method's rule (None without one).

  Args:
    config: the run's config (method, batch, workers).
    cluster: from `build_cluster`.
    compute_s: one worker's measured step on its batch (the compute term).
  """
  if cluster is None:
    return None
  per_example_s = compute_s / (config.batch_size // config.workers)
  return netmodel.WorkerClock(cluster, per_example_s, **waiting_rule(config, config.workers))


# --- the run -----------------------------------------------------------------------


@dataclasses.dataclass
class Experiment:
  """Everything a run needs, built and checked from a config."""

  config: ml_collections.ConfigDict
  workdir: str
  dataset: data.Dataset
  model: Any
  tx: optax.GradientTransformation | step_lib.SplitChain
  schedule: Any
  workers: runtime.Workers
  networks: dict[str, netmodel.Network | netmodel.Schedule]
  cluster: netmodel.Cluster | None = None
  # per-worker batch sizes (None: uniform)
  batching: control.DynamicBatching | control.Streams | None = None
  sampler: data.Sampler | None = None  # which examples each worker trains on
  ratio_control: adaptive.RatioControl | None = None  # config.adaptive
  drops: tuple[inject.Drop, ...] = ()  # config.fault.drop

  @property
  def counted(self) -> bool:
    """Whether workers' batches may differ: the step takes counts and weights by them."""
    return self.config.batching != 'uniform' or bool(self.drops)

  @property
  def held(self) -> int:
    """Examples each worker holds per step: its batch, or b_max with per-worker batches."""
    if self.config.batching == 'uniform':
      return self.per_worker
    section = self.config.streams if self.streaming else self.config.dynamic_batching
    return section.b_max or self.config.batch_size

  @property
  def streaming(self) -> bool:
    """Whether data streams in (ScaDLES): workers wait for it; 'stream' scales the lr."""
    return isinstance(self.batching, control.Streams)

  @property
  def per_worker(self) -> int:
    return self.config.batch_size // self.workers.count

  def clock(self, compute_s: float) -> netmodel.WorkerClock | None:
    """A fresh per-worker clock of the run's cluster (None without one); see `worker_clock`."""
    return worker_clock(self.config, self.cluster, compute_s)

  def __str__(self) -> str:
    w = self.workers
    return (
      f'{w.count} workers = {w.devices} devices ({jax.devices()[0].platform}) x {w.per_device} '
      f'simulated; global batch {self.config.batch_size}, {self.per_worker} per worker'
    )


def load_dataset(cfg: ml_collections.ConfigDict) -> data.Dataset:
  """The dataset a config names: a tfds name, or 'synthetic' with the shapes it gives."""
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
  if config.noise_every < 0:
    raise ValueError(f'noise_every must be >= 0 (0: never), got {config.noise_every}')
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


def build(config: ml_collections.ConfigDict, workdir: str) -> Experiment:
  """Checks `config` and `workdir` and builds the run; raises `ConfigError`.

  Nothing in `workdir` is created or changed here.
  """
  try:
    if os.path.exists(workdir) and not os.path.isdir(workdir):
      raise ValueError(f'workdir {workdir} exists and is not a directory; pass a directory path')
    _check_counts(config)
    check_per_worker(config)
    if config.model.name not in models.MODELS:  # before the (slower) data loading
      models.get(config.model.name, num_classes=1)
    workers = runtime.layout(config.workers, devices=config.devices or None)
    tx, schedule = build_chain(config, workers)
    if config.network.algorithm not in netmodel.ALGORITHMS:
      raise ValueError(
        f'network.algorithm must be one of {netmodel.ALGORITHMS}, got {config.network.algorithm!r}'
      )
    if not 0 <= float(config.network.compute_s) < math.inf:
      raise ValueError(
        f"network.compute_s must be a finite number of seconds >= 0 (0: measure one worker's "
        f'step here), got {config.network.compute_s}'
      )
    if not 0 < float(config.network.compute_budget_s) < math.inf:
      raise ValueError(
        'network.compute_budget_s must be a finite number of seconds > 0 (the time spent '
        f'timing the compute term; e.g. 2.0), got {config.network.compute_budget_s}'
      )
    networks = {name: netmodel.resolve(name) for name in config_lib.names(config.network.profiles)}
    _check_hierarchy(config, workers)
    straggles = inject.parse_straggles(config.fault.straggle, config.workers)
    drops = build_drops(config)
    cluster = build_cluster(config.cluster, config.workers, straggles)
    batching = build_batching(config, cluster)
    ds = load_dataset(config.dataset)
    data.batch_indices(
      0, seed=config.seed, num_examples=len(ds.train), batch_size=config.batch_size
    )
    sampler = build_sampler(config, ds)
    model = models.get(config.model.name, num_classes=ds.num_classes, **_model_args(config.model))
    ratio_control = adaptive.build(config, workers.count, networks, _num_params(model, ds))
  except ValueError as e:
    raise ConfigError(str(e)) from e
  return Experiment(
    config, workdir, ds, model, tx, schedule, workers, networks, cluster, batching, sampler,
    ratio_control, drops,
  )  # fmt: skip


def build_drops(config) -> tuple[inject.Drop, ...]:
  """`config.fault.drop`, checked against the method: a dropped worker is weighted 0."""
  drops = inject.parse_drops(config.fault.drop, config.workers)
  if drops and config.sync.method != 'allreduce':
    raise ValueError(
      f'config.fault.drop={config.fault.drop!r} takes a worker out of the weighted all-reduce '
      f'(weight 0, the mean over the others): it needs sync.method=allreduce, got '
      f'{config.sync.method!r}'
    )
  if drops and config.batching not in ('uniform', 'static'):
    raise ValueError(
      f'config.fault.drop with config.batching={config.batching!r}: a dropped worker would '
      "feed the batch controller a zero time; use batching='uniform' or 'static'"
    )
  return drops


def _check_hierarchy(config, workers: runtime.Workers) -> None:
  """`config.network.intra` and `shared_nic`: what the ledger prices intra-node links with."""
  try:
    netmodel.Hierarchy(
      nodes=workers.devices,
      local=workers.per_device,
      intra=netmodel.profile(str(config.network.intra)),
      shared_nic=config.network.shared_nic,
    )
  except ValueError as e:
    key = 'shared_nic' if 'shared_nic' in str(e) else 'intra'
    raise ValueError(f'config.network.{key}: {e}') from e


def _model_args(cfg) -> dict[str, Any]:
  """Keyword arguments of the model from `config.model` (the MLP's `hidden` widths)."""
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
  params = jax.eval_shape(lambda k: step_lib.init_params(model, k, ds.image_shape)[0],
                          jax.random.key(0))  # fmt: skip
  return sum(x.size for x in jax.tree.leaves(params))


def build_sampler(config, ds: data.Dataset) -> data.Sampler:
  """The sampler of `config.partition`, checked on the first step's uniform batches."""
  partition = call(data.Partition, 'partition', config.partition, seed=config.seed)
  try:
    sampler = data.make_sampler(partition, ds.train.labels, config.workers)
    sampler.indices(0, [config.batch_size // config.workers] * config.workers)
  except ValueError as e:
    raise ValueError(f'config.partition: {e}') from e
  return sampler
