"""Config -> the cluster the modelled clock pretends to have, its batches and its faults."""

from __future__ import annotations

from typing import Any

from jaxdist import control, netmodel
from jaxdist.faults import inject
from jaxdist.train import config as config_lib
from jaxdist.train import methods
from jaxdist.train.factory.sections import call

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

  Args:
    cfg: `config.cluster`.
    num_workers: K.
    straggles: injected `Straggle`s (`config.fault.straggle`); they need the
      per-worker clock: with them, equal workers of speed 1 if `cfg`
      describes none.

  Returns:
    The `netmodel.Cluster`, or None.
  """
  kwargs = dict(
    straggler_p=cfg.straggler_p,
    straggler_slowdown=cfg.straggler_slowdown,
    seed=cfg.seed,
    phases=_phases(cfg.phases),
    stream_rates=_stream_rates(cfg, num_workers),
    price=cfg.price,
    straggles=tuple(straggles),
    fixed_s=config_lib.numbers(cfg.fixed_s, 'cluster.fixed_s'),
  )
  speeds, cores = config_lib.numbers(cfg.speeds, 'cluster.speeds'), str(cfg.cores).strip()
  described = speeds or cores or cfg.straggler_p or kwargs['phases'] or cfg.price or straggles
  described = described or kwargs['fixed_s']
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
  """`WorkerClock` arguments of the method's waiting rule (see `jd.netmodel.cluster`).

  Args:
    config: the run's config.
    num_workers: K.

  Returns:
    The arguments.
  """
  method = config.sync.method
  return methods.get(method).wait(config.sync[method], num_workers)


BATCHING = ('uniform', 'static', 'dynamic', 'stream', 'window')


def build_batching(
  config, cluster: netmodel.Cluster | None
) -> control.DynamicBatching | control.Streams | control.Window | None:
  """The batch-size controller `config.batching` asks for (None: uniform batches).

  Streams (`config.cluster.stream_rates`) give a `control.Streams`: with
  'stream', ScaDLES's stream-proportional batches; with 'uniform', the fixed
  B / K of the paper's baseline (every worker waits for its data). 'window'
  gives heterogeneity-aware DiLoCo's `control.Window` of `sync.diloco.period`
  inner steps.

  Args:
    config: the run's config.
    cluster: from `build_cluster`.

  Returns:
    The controller, or None.
  """
  mode = config.batching
  if mode not in BATCHING:
    raise ValueError(f'config.batching must be one of {BATCHING}, got {mode!r}')
  rates = cluster.stream_rates if cluster is not None else ()
  if config.streams.realtime and not rates:
    raise ValueError(
      "config.streams.realtime waits for data streaming in at each worker's rate: give "
      'config.cluster.stream_rates, or set config.streams.realtime=False'
    )
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
  if mode == 'window':
    if config.sync.method != 'diloco' or rates:
      raise ValueError(
        "config.batching='window' fits each worker's inner steps of a DiLoCo round to its "
        f'speed: it needs sync.method=diloco and no stream rates, got {config.sync.method!r}'
      )
    return control.Window(int(config.sync.diloco.period))
  if mode != 'uniform' and config.sync.method != 'allreduce':
    raise ValueError(
      f'config.batching={mode!r} averages gradients with weights b_k / Σb: it needs '
      f'sync.method=allreduce, got {config.sync.method!r}'
    )
  if rates:
    section = dict(config.streams)
    section.pop('realtime')  # the trainer's (`Experiment.realtime`)
    section['b_max'] = section['b_max'] or config.batch_size
    policy = 'proportional' if mode == 'stream' else 'fixed'
    ctl = call(
      control.streams, 'streams', section, rates=rates, base_batch=config.batch_size, policy=policy
    )
    where = 'streams'
  else:
    section = dict(config.dynamic_batching)
    multiple = micro_batch(config) or 1
    section.pop('micro_batch', None)
    ctl = call(
      control.dynamic_batching, 'dynamic_batching', section, global_batch=config.batch_size,
      multiple=multiple,
    )  # fmt: skip
    where = 'dynamic_batching'
  try:
    ctl.init(config.workers)  # the bounds admit the batches
  except ValueError as e:
    raise ValueError(f'config.{where}: {e}') from e
  return ctl


def micro_batch(config) -> int:
  """`config.dynamic_batching.micro_batch`, checked: 0, or m dividing every batch a worker holds.

  With `batching='window'` it defaults to B / K, one micro-batch: a step a
  worker sits out computes nothing. With `batching='stream'` a worker's
  count is what streamed in, so m need only divide `streams.b_max`.

  Args:
    config: the run's config.

  Returns:
    m (0: the masked pass over all held examples).
  """
  m = int(config.dynamic_batching.micro_batch or 0)
  uniform = config.batch_size // config.workers
  window, stream = config.batching == 'window', config.batching == 'stream'
  if window:
    m = m or uniform
  elif not m:
    return 0
  if m < 0 or config.batching not in ('static', 'dynamic', 'window', 'stream'):
    raise ValueError(
      f'config.dynamic_batching.micro_batch={m}: micro-batches of m >= 1 examples serve '
      f"batching='static', 'dynamic', 'window' or 'stream' (got {config.batching!r}); 0 turns "
      'them off'
    )
  section = config.streams if stream else config.dynamic_batching
  held = uniform if window else section.b_max or config.batch_size
  if held % m or (not stream and uniform % m):
    raise ValueError(
      f'config.dynamic_batching.micro_batch={m} must divide the examples a worker holds '
      f'({held})'
      + ('' if stream else f' and the uniform batch B / K ({uniform})')
      + ': each worker holds whole micro-batches'
    )
  return m


def worker_clock(config, cluster: netmodel.Cluster | None, compute_s: float):
  """A fresh `netmodel.WorkerClock` of `cluster` under the method's rule (None without one).

  Args:
    config: the run's config (method, batch, workers).
    cluster: from `build_cluster`.
    compute_s: one worker's measured step on its batch (the compute term).

  Returns:
    The clock, or None.
  """
  if cluster is None:
    return None
  per_example_s = compute_s / (config.batch_size // config.workers)
  return netmodel.WorkerClock(cluster, per_example_s, **waiting_rule(config, config.workers))


def build_drops(config) -> tuple[inject.Drop, ...]:
  """`config.fault.drop`, checked against the method: a dropped worker is weighted 0.

  Args:
    config: the run's config.

  Returns:
    The `inject.Drop`s.
  """
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
