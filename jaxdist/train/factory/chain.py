"""Config -> the optax chain: the sync method's transform around the local optimizer.

A method's section is passed to its factory as keyword arguments unchanged
(the keys are the argument names; see `jaxdist.train.config`), so an error
names the key the user typed: `config.sync.selsync: alpha must be in [0, 1),
got 1.5`. What else the trainer knows of a method is its row in
`jaxdist.train.methods`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import ml_collections
import optax

from jaxdist import compress, runtime, sync
from jaxdist.train import config as config_lib
from jaxdist.train import methods, ways
from jaxdist.train import step as step_lib
from jaxdist.train.factory import controls
from jaxdist.train.factory.sections import call


def build_optimizer(cfg: Any, steps: int, where: str = 'optimizer', start: int = 0):
  """(optimizer, learning-rate schedule) of an optimizer section (`config.optimizer`).

  Args:
    cfg: the section.
    steps: the run's steps (the cosine schedule's length).
    where: the section's dotted path, for errors.
    start: the step a warm-started run begins at (`config.init_step`): the
      optimizer's own count starts at 0 there, so its rate is the schedule
      `start` steps on.

  Returns:
    (the optax optimizer, the schedule by the run's step).
  """
  cfg = ml_collections.ConfigDict(dict(cfg))
  scale = cfg.get('lr_scale', 1.0)
  if not scale > 0:
    raise ValueError(f'config.{where}.lr_scale must be > 0, got {scale}')
  lr = cfg.learning_rate * scale
  if cfg.schedule == 'constant':
    schedule = optax.constant_schedule(lr)
  elif cfg.schedule == 'cosine':
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(cfg.warmup_steps, steps - 1), steps)
  else:
    raise ValueError(
      f"config.{where}.schedule must be 'constant' or 'cosine', got {cfg.schedule!r}"
    )
  rate = lr if cfg.schedule == 'constant' else schedule
  if cfg.schedule != 'constant':
    rate = shifted(schedule, start)
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


def _updates(config, section: dict[str, Any], key: str) -> int:
  """How many updates an optimizer argument of a method takes in the run: its schedule's
  length (and its warm-up's unit). An outer optimizer (`outer_optimizer` of a method with a
  `period`) steps once a period, counted from the run's first step (a warm-started run's
  outer optimizer is fresh); any other steps every step."""
  if key == 'outer_optimizer' and 'period' in section:
    return max(1, (config.steps - warm_start_step(config)) // int(section['period']))
  return config.steps


def shifted(schedule: optax.Schedule, start: int) -> optax.Schedule:
  """`schedule` read `start` steps on: the rate of a transform whose own count starts at 0
  at step `start` (a warm start); `schedule` itself for 0."""
  return (lambda count: schedule(count + start)) if start else schedule


def warm_start_step(config) -> int:
  """The step a warm-started run begins at (`config.init_step`, resolved by `factory.build`);
  0 for a run that starts afresh."""
  return int(config.init_step) if config.init_from else 0


def build_compressor(cfg: ml_collections.ConfigDict) -> compress.Compressor:
  """The compressor `cfg.name` with the arguments of its section `cfg[cfg.name]`.

  Args:
    cfg: `config.compress`.

  Returns:
    The `compress.Compressor`.
  """
  if cfg.name not in compress.REGISTRY or cfg.name not in cfg:
    raise ValueError(
      f'unknown compress.name {cfg.name!r}; choose one of '
      f'{sorted(n for n in compress.REGISTRY if n in cfg)}'
    )
  return call(compress.REGISTRY[cfg.name], f'compress.{cfg.name}', cfg[cfg.name])


def _averager(name: str, config, workers: runtime.Workers, where: str):
  """The averaging transform an `averager` key names ('' = average the models)."""
  if not name:
    return None
  axis_name = workers.axis_name
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
  if name == 'quantized_allreduce':
    section = config.sync.quantized_allreduce
    return call(
      sync.quantized_allreduce,
      'sync.quantized_allreduce',
      section,
      axis_name=axis_name,
      num_workers=workers.count,
    )
  raise ValueError(
    f"config.{where}.averager must be '', 'allreduce', 'compressed_allreduce', "
    f"'quantized_allreduce' or 'powersgd', got {name!r}"
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
  section['ratios'] = controls.ratios(config, getattr(compressor, 'ratio', None))
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


def sync_transform(
  config, workers: runtime.Workers, opt, schedule=None, make: Callable[..., Any] | None = None
) -> optax.GradientTransformation:
  """The transform `config.sync.method` names, built from its section.

  Args:
    config: the run's config.
    workers: the worker layout.
    opt: the local optimizer, passed in as the first argument of a method
      that wraps it ('in').
    schedule: config.optimizer's learning rate, passed as the
      `learning_rate` of a method that is the whole optimizer ('own'; None:
      built from config.optimizer).
    make: what to call with the section instead of the method's factory
      (`deferred_exchange`).

  Returns:
    The transform (or what `make` returns).
  """
  method = config.sync.method
  row, where = methods.get(method), f'sync.{method}'
  section = dict(config.sync[method])
  for key in [k for k in section if k.endswith('optimizer')]:
    steps = _updates(config, section, key)
    section[key] = build_optimizer(section[key], steps, f'{where}.{key}')[0]
  if 'averager' in section:
    section['averager'] = _averager(section['averager'], config, workers, where)
  for key, convert in row.convert.items():
    section[key] = convert(section[key], where)
  supplied: dict[str, Any] = {}
  for name in row.supplies:
    supplied.update(SUPPLIES[name](config, workers, section, where))
  uneven = config.batching != 'uniform' or str(config.fault.drop).strip()
  if make is None:
    make = row.weighted if row.weighted and uneven else row.make  # weights b_k / G
  if row.optimizer == 'in':
    supplied[next(iter(inspect.signature(make).parameters))] = opt
  if row.optimizer == 'own':
    if schedule is None:
      schedule = build_optimizer(config.optimizer, config.steps)[1]
    supplied['learning_rate'] = shifted(schedule, warm_start_step(config))
  return call(make, where, section, **supplied)


EXCHANGES = {'streaming_diloco': sync.streaming_exchange, 'diloco': sync.diloco_exchange}


def deferred_exchange(config, workers: runtime.Workers) -> sync.DeferredExchange | None:
  """The method's exchange, run beside the steps (`exchange: deferred`), or None.

  Args:
    config: the run's config.
    workers: the worker layout.

  Returns:
    `jd.sync.streaming_exchange` or `jd.sync.diloco_exchange` of the method's
    section, or None.
  """
  method = config.sync.method
  if method not in EXCHANGES or config.sync[method].get('exchange') != 'deferred':
    return None
  platform = workers.mesh.devices.flat[0].platform
  if per_worker(config, workers.per_device, platform) == 'device':
    raise ValueError(
      f"config.sync.{method}.exchange='deferred' runs on a model per worker; "
      "set config.sync.per_worker to 'auto' or 'vmap', or exchange to 'inline'"
    )
  return sync_transform(config, workers, None, make=EXCHANGES[method])


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
  """The way the trainer's step runs a device's workers: `config.sync.per_worker`.

  'auto' is resolved to 'mean' off the CPU where that is exact (an H100:
  ResNet-20, 8 simulated workers at 1.09x one plain batch's samples/s,
  against 0.37x with `vmap`), else left to make_train_step ('loop' on the
  CPU, where 'mean' is no faster, 'vmap' elsewhere).

  Args:
    config: the run's config.
    per_device: simulated workers per device.
    platform: the devices' platform ('cpu', 'gpu', ...).

  Returns:
    The way.
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
  """Checks `config.sync.per_worker`: a way make_train_step knows, used only where exact.

  'shared', 'mean' and 'device' are exact only for some methods and settings.

  Args:
    config: the run's config.

  Raises:
    ValueError: saying why the way does not fit the config.
  """
  way = config.sync.per_worker
  if way not in ways.PER_WORKER:
    raise ValueError(f'config.sync.per_worker must be {ways.NAMES}, got {way!r}')
  split = way == 'device' and config.sync.method in DEVICE_SPLIT
  if split and (why := _split_not_exact(config)):
    raise ValueError(
      f"config.sync.per_worker='device' keeps one model per device and each worker's "
      f'error-feedback state; it runs equal batches with one compiled ratio, but {why}; use '
      'per_worker=auto'
    )
  if way in ways.MEAN_GRADIENT and not split and (why := _mean_not_exact(config)):
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
  if config.sync.staggered and way in ways.TOGETHER:
    raise ValueError(
      f'config.sync.staggered runs the workers one after the other: '
      f'config.sync.per_worker={way!r} contradicts it; use auto or loop'
    )


def sits_out(config) -> bool:
  """Whether the local optimizer is wrapped in `jd.sync.sit_out`: with heterogeneity-aware
  DiLoCo (`batching='window'`, `sync.diloco.by_steps`) a worker training on no examples takes no
  inner step.

  Raises:
    ValueError: `by_steps` where every worker takes every step (plain DiLoCo's mean).
  """
  if config.sync.method != 'diloco':
    return False
  window, by_steps = config.batching == 'window', bool(config.sync.diloco.by_steps)
  if by_steps and not (window or str(config.fault.drop).strip()):
    raise ValueError(
      'config.sync.diloco.by_steps weights the outer mean by the inner steps each worker took: '
      "give batching='window' (or fault.drop); with every step taken it is plain DiLoCo"
    )
  return window or by_steps


def build_chain(
  config, workers: runtime.Workers
) -> tuple[optax.GradientTransformation | step_lib.SplitChain, Any]:
  """The optax chain of `config.sync.method` around the local optimizer, and its schedule.

  Args:
    config: the run's config.
    workers: the worker layout.

  Returns:
    (the chain, or a `step.SplitChain` with per_worker='device'; the
    learning-rate schedule).
  """
  method = config.sync.method
  row = methods.get(method)
  opt, schedule = build_optimizer(config.optimizer, config.steps, start=warm_start_step(config))
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
  tx = sync_transform(config, workers, opt, schedule)
  if row.optimizer == 'after':
    if sits_out(config):  # a worker out of its window (or dropped) keeps its model and state
      opt = sync.sit_out(opt)
    return optax.chain(opt, tx), schedule
  if row.optimizer in ('in', 'own'):
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
