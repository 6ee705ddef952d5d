"""`train_and_evaluate(config, workdir)`: the only place that reads a config.

It turns names into objects (dataset, model, optimizer chain, worker layout),
checks them all before touching the work directory, then runs the loop:
resume from the latest checkpoint if there is one, a jitted sharded step,
metrics fetched one step late, periodic evaluation, JSONL + TensorBoard logs,
checkpoints every N steps and at the end, and a summary table and plot.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import signal
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
import tqdm

from jaxdist import comm, compress, data, models, netmodel, runtime, sync, timing
from jaxdist.train import checkpoint, metrics, report, step

SUMMARY_FILE = 'summary.json'
PLOT_FILE = 'curves.png'


class ConfigError(ValueError):
  """The config, flags or work directory cannot run; the message says why."""


def load_config(spec: str, **overrides: Any) -> ml_collections.ConfigDict:
  """A config from `path/to/config.py[:arg]`, as `--config=` reads it.

  Args:
    spec: the config file, optionally followed by `:arg` (e.g. `:runlocal`).
    **overrides: dotted keys to set afterwards, e.g. `**{'sync.method': 'allreduce'}`.
  """
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_jaxdist_config', path)
  if module_spec is None or not os.path.exists(path):
    raise ConfigError(f'no config file at {path}')
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(arg or None)
  for key, value in overrides.items():
    *parents, leaf = key.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


# --- names to objects --------------------------------------------------------


def build_optimizer(cfg: ml_collections.ConfigDict, steps: int):
  """The local optimizer and its learning-rate schedule."""
  if cfg.schedule == 'constant':
    schedule = optax.constant_schedule(cfg.learning_rate)
  elif cfg.schedule == 'cosine':
    schedule = optax.warmup_cosine_decay_schedule(
      0.0, cfg.learning_rate, min(cfg.warmup_steps, steps - 1), steps
    )
  else:
    raise ValueError(f"optimizer.schedule must be 'constant' or 'cosine', got {cfg.schedule!r}")
  if cfg.name == 'sgd':
    opt = optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
  elif cfg.name == 'adam':
    opt = optax.adam(schedule)
  elif cfg.name == 'adamw':
    opt = optax.adamw(schedule, weight_decay=cfg.weight_decay)
  else:
    raise ValueError(f"optimizer.name must be one of 'sgd', 'adam', 'adamw', got {cfg.name!r}")
  if cfg.weight_decay and cfg.name != 'adamw':
    opt = optax.chain(optax.add_decayed_weights(cfg.weight_decay), opt)
  return opt, schedule


def build_compressor(cfg: ml_collections.ConfigDict):
  """The compressor named `cfg.compressor`, with the hyper-parameters it takes."""
  name = cfg.compressor
  if name in ('topk', 'mstopk', 'dgc'):
    return compress.REGISTRY[name](ratio=cfg.ratio)
  if name == 'threshold':
    return compress.threshold(tau=cfg.tau, ratio=cfg.ratio)
  if name == 'randomk':
    return compress.randomk(ratio=cfg.ratio)
  if name == 'qsgd':
    return compress.qsgd(levels=cfg.levels, bucket_size=cfg.bucket_size or None)
  if name == 'powersgd':
    return compress.powersgd(rank=cfg.rank)
  if name == 'cast':
    return compress.cast(dtype=cfg.dtype)
  if name in ('identity', 'terngrad', 'sign', 'ef_sign', 'onebit'):
    return compress.REGISTRY[name]()
  raise ValueError(f'unknown sync.compressor {name!r}; choose one of {sorted(compress.REGISTRY)}')


def _compression_kwargs(cfg) -> dict[str, Any]:
  return dict(
    collective=cfg.collective,
    error_feedback=cfg.error_feedback,
    fused=cfg.fused,
    min_size=cfg.min_size,
    network=cfg.auto_network,
  )


def _sync_compressor(cfg):
  """(compressor, kwargs) for methods that may compress their synchronisation."""
  if not cfg.compress_sync:
    return None, {}
  return build_compressor(cfg), _compression_kwargs(cfg)


def _sync_allreduce(cfg, workers, opt):
  del cfg
  return optax.chain(sync.allreduce(axis_name=workers.axis_name), opt)


def _sync_compressed(cfg, workers, opt):
  tx = sync.compressed_allreduce(
    build_compressor(cfg),
    axis_name=workers.axis_name,
    leader=cfg.leader,
    momentum_correction=cfg.momentum_correction,
    nesterov=cfg.nesterov,
    warmup_steps=cfg.warmup_steps,
    **_compression_kwargs(cfg),
  )
  if cfg.clip:
    tx = optax.chain(sync.local_clip(cfg.clip, axis_name=workers.axis_name), tx)
  return optax.chain(tx, opt)


def _sync_local_sgd(cfg, workers, opt):
  compressor, kwargs = _sync_compressor(cfg)
  return optax.chain(
    opt,
    sync.local_sgd(
      cfg.period,
      axis_name=workers.axis_name,
      warmup_steps=cfg.local_warmup,
      compressor=compressor,
      **kwargs,
    ),
  )


def _sync_diloco(cfg, workers, opt):
  compressor, kwargs = _sync_compressor(cfg)
  outer = optax.sgd(cfg.outer_lr, momentum=cfg.outer_momentum or None, nesterov=cfg.outer_nesterov)
  return optax.chain(
    opt,
    sync.diloco(outer, cfg.period, axis_name=workers.axis_name, compressor=compressor, **kwargs),
  )


def _sync_selsync(cfg, workers, opt):
  compressor, kwargs = _sync_compressor(cfg)
  return sync.selsync(
    opt,
    cfg.threshold,
    axis_name=workers.axis_name,
    window=cfg.window,
    alpha=cfg.ewma_alpha,
    norm=cfg.norm,
    squared=cfg.squared,
    compressor=compressor,
    **kwargs,
  )


def _sync_stale(kind):
  def build(cfg, workers, opt):
    ax = workers.axis_name
    if kind == 'ssp':
      tx = sync.ssp(cfg.staleness, axis_name=ax, seed=cfg.delay_seed)
    elif kind == 'async':
      tx = sync.async_sgd(cfg.staleness, axis_name=ax, p=cfg.delay_p, seed=cfg.delay_seed)
    else:
      tx = sync.delayed(cfg.staleness, axis_name=ax)
    return optax.chain(tx, opt)

  return build


def _sync_gossip(cfg, workers, opt):
  gossip = sync.gossip(
    cfg.topology,
    axis_name=workers.axis_name,
    num_workers=workers.count,
    rows=cfg.torus_rows or None,
  )
  return optax.chain(opt, gossip)


def _sync_sma(cfg, workers, opt):
  return optax.chain(opt, sync.sma(cfg.sma_alpha, cfg.sma_momentum, axis_name=workers.axis_name))


def _local_optimizer(cfg):
  return optax.sgd(cfg.local_lr, momentum=cfg.local_momentum or None)


def _sync_delay_tolerant(kind):
  def build(cfg, workers, opt):
    ax, local = workers.axis_name, _local_optimizer(cfg)
    common = dict(axis_name=ax, warmup_steps=cfg.delay_warmup, compensation=cfg.compensation)
    if kind == 'od_sgd':
      return sync.od_sgd(opt, local, delay=cfg.delay, **common)
    if kind == 'ssd_sgd':
      return sync.ssd_sgd(opt, local, cfg.k, **common)
    return sync.cd_sgd(opt, local, cfg.k, threshold=cfg.twobit_threshold, delay=cfg.delay, **common)

  return build


def _pipeline_delay(cfg):
  return 'stages' if cfg.pipeline_delay == 'stages' else int(cfg.pipeline_delay)


def _sync_delayed_gradients(cfg, workers, opt):
  """BSP with every gradient applied D steps late, optionally compensated (SC, LWP)."""
  delay = _pipeline_delay(cfg)
  if cfg.pipeline_fix not in ('none', 'sc', 'lwp', 'sc+lwp'):
    raise ValueError(f'sync.pipeline_fix must be none, sc, lwp or sc+lwp, got {cfg.pipeline_fix!r}')
  parts = [sync.allreduce(axis_name=workers.axis_name), sync.gradient_delay(delay)]
  if 'sc' in cfg.pipeline_fix:  # momentum moves into spike compensation (opt has none)
    parts += [sync.spike_compensation(delay, cfg.pipeline_momentum), opt]
  else:
    parts.append(opt)
  if 'lwp' in cfg.pipeline_fix:
    parts.append(sync.linear_weight_prediction(delay))
  return optax.chain(*parts)


def _sync_tick_tock(cfg, workers, opt):
  if cfg.waves < 1 or workers.count % cfg.waves:
    raise ValueError(f'sync.waves={cfg.waves} must divide the {workers.count} workers')
  return sync.tick_tock(opt, axis_name=workers.axis_name, waves=cfg.waves)


def _sync_bucketed(cfg, workers, opt):
  if cfg.bucket_bytes <= 0:
    raise ValueError(f'sync.bucket_bytes must be > 0, got {cfg.bucket_bytes}')
  from jaxdist.sync import bucketing

  def plan(tree):  # fixed-size buckets, last leaves first (backward order of flax's naming)
    sizes = [x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)]
    return bucketing.threshold_buckets(sizes, cfg.bucket_bytes)

  compressor, kwargs = _sync_compressor(cfg)
  bucketed = sync.bucketed_allreduce(
    plan, axis_name=workers.axis_name, compressor=compressor, **kwargs
  )
  return optax.chain(bucketed, opt)


# method name -> (sync config, workers, local optimizer) -> the whole optax chain
SYNC_METHODS = {
  'allreduce': _sync_allreduce,
  'compressed': _sync_compressed,
  'local_sgd': _sync_local_sgd,
  'diloco': _sync_diloco,
  'selsync': _sync_selsync,
  'ssp': _sync_stale('ssp'),
  'async': _sync_stale('async'),
  'delayed': _sync_stale('delayed'),
  'gossip': _sync_gossip,
  'sma': _sync_sma,
  'od_sgd': _sync_delay_tolerant('od_sgd'),
  'ssd_sgd': _sync_delay_tolerant('ssd_sgd'),
  'cd_sgd': _sync_delay_tolerant('cd_sgd'),
  'delayed_gradients': _sync_delayed_gradients,
  'tick_tock': _sync_tick_tock,
  'bucketed': _sync_bucketed,
}


def build_chain(
  config: ml_collections.ConfigDict, workers: runtime.Workers
) -> tuple[optax.GradientTransformation, Any]:
  """The optax chain of `config.sync.method` around the local optimizer, and its schedule."""
  method = config.sync.method
  if method not in SYNC_METHODS:
    raise ValueError(f'unknown sync.method {method!r}; choose one of {sorted(SYNC_METHODS)}')
  opt, schedule = build_optimizer(config.optimizer, config.steps)
  if method == 'delayed_gradients' and 'sc' in config.sync.pipeline_fix:
    # spike compensation carries the momentum: the rest is SGD without it
    decay = config.optimizer.weight_decay
    opt = optax.chain(optax.add_decayed_weights(decay), optax.scale_by_learning_rate(schedule))
  return SYNC_METHODS[method](config.sync, workers, opt), schedule


@dataclasses.dataclass
class Experiment:
  """Everything a run needs, built and checked from a config."""

  config: ml_collections.ConfigDict
  workdir: str
  dataset: data.Dataset
  model: Any
  tx: optax.GradientTransformation
  schedule: Any
  workers: runtime.Workers
  networks: dict[str, netmodel.Network | netmodel.Schedule]

  @property
  def per_worker(self) -> int:
    return self.config.batch_size // self.workers.count


def build(config: ml_collections.ConfigDict, workdir: str) -> Experiment:
  """Checks `config` and `workdir` and builds the run; raises `ConfigError`.

  Nothing in `workdir` is created or changed here.
  """
  try:
    if os.path.exists(workdir) and not os.path.isdir(workdir):
      raise ValueError(f'workdir {workdir} exists and is not a directory; pass a directory path')
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
    if config.model.name not in models.MODELS:  # before the (slower) data loading
      models.get(config.model.name, num_classes=1)
    workers = runtime.layout(config.workers, devices=config.devices or None)
    tx, schedule = build_chain(config, workers)
    ds = load_dataset(config.dataset)
    data.batch_indices(
      0, seed=config.seed, num_examples=len(ds.train), batch_size=config.batch_size
    )
    model = models.get(config.model.name, num_classes=ds.num_classes)
    networks = {name: netmodel.resolve(name) for name in _names(config.network.profiles)}
    if config.network.algorithm not in netmodel.ALGORITHMS:
      raise ValueError(
        f'network.algorithm must be one of {netmodel.ALGORITHMS}, got {config.network.algorithm!r}'
      )
  except ValueError as e:
    raise ConfigError(str(e)) from e
  return Experiment(config, workdir, ds, model, tx, schedule, workers, networks)


def load_dataset(cfg: ml_collections.ConfigDict) -> data.Dataset:
  """The dataset a config names: a tfds name, or 'synthetic' with the shapes it gives."""
  if cfg.name == 'synthetic':
    return data.synthetic(
      image_shape=tuple(int(d) for d in str(cfg.get('image_shape', '32,32,3')).split(',')),
      num_classes=cfg.get('num_classes', 10),
      train_size=cfg.get('train_size', 2048),
      test_size=cfg.get('test_size', 512),
    )
  return data.load(
    cfg.name,
    data_dir=cfg.data_dir or None,
    download=cfg.download,
    train_split=cfg.train_split,
    test_split=cfg.test_split,
  )


def _names(text: str) -> list[str]:
  return [t.strip() for t in text.split(',') if t.strip()]


# --- the loop ----------------------------------------------------------------


def _put_batch(exp: Experiment, t: int) -> tuple[jax.Array, jax.Array]:
  """Global batch `t` as [workers, per_worker, ...] arrays; each process loads its own workers."""
  w, b, split = exp.workers, exp.per_worker, exp.dataset.train
  idx = data.worker_indices(
    t, seed=exp.config.seed, num_examples=len(split), workers=w.count, per_worker=b
  )[w.local_workers()]
  x = exp.dataset.normalize(split.images[idx])
  y = split.labels[idx]
  put = lambda a: jax.make_array_from_process_local_data(w.sharding, a, (w.count, *a.shape[1:]))
  return put(x), put(y)


def _eval_chunks(exp: Experiment) -> list[tuple[jax.Array, ...]]:
  """The test split in device-sharded, padded chunks (x, y, mask)."""
  split, w = exp.dataset.test, exp.workers
  chunk = -(-min(exp.config.eval_batch_size, len(split)) // w.devices) * w.devices
  sharding = jax.NamedSharding(w.mesh, jax.sharding.PartitionSpec(runtime.DATA))
  chunks = []
  for start in range(0, len(split), chunk):
    n = min(chunk, len(split) - start)
    arrays = (
      exp.dataset.normalize(split.images[start : start + n]),
      split.labels[start : start + n],
      np.ones(n, np.float32),
    )
    arrays = [np.concatenate([a, np.zeros((chunk - n, *a.shape[1:]), a.dtype)]) for a in arrays]
    chunks.append(
      tuple(jax.make_array_from_callback(a.shape, sharding, lambda i, a=a: a[i]) for a in arrays)
    )
  return chunks


def measure_worker_step(exp: Experiment, repeats: int = 20) -> float:
  """Median seconds of one worker's step on its own: compute, compression, optimizer.

  The same optax chain runs on a 1-worker layout (one local device) with the
  per-worker batch; its collectives span one worker and cost nothing, so
  this is a worker's step minus communication: the compute term of the
  modelled clock.
  """
  one = runtime.layout(1, devices=1, device_list=jax.local_devices()[:1])
  init = step.make_init(exp.model, exp.tx, one, exp.dataset.image_shape)
  train_step = step.make_train_step(exp.model, exp.tx, one)
  state = init(jax.random.key(exp.config.seed))
  idx = data.batch_indices(
    0, seed=exp.config.seed, num_examples=len(exp.dataset.train), batch_size=exp.per_worker
  )
  x = jax.device_put(exp.dataset.normalize(exp.dataset.train.images[idx])[None], one.sharding)
  y = jax.device_put(exp.dataset.train.labels[idx][None], one.sharding)
  box = [state]

  def run():
    box[0], metrics = train_step(box[0], x, y)
    return metrics

  return timing.median_seconds(run, repeats)


def _evaluate(eval_step, state, chunks) -> dict[str, float]:
  sums = [jax.device_get(eval_step(state, *c)) for c in chunks]
  count = sum(float(s['count']) for s in sums)
  return {
    'test_loss': sum(float(s['loss']) for s in sums) / count,
    'test_accuracy': sum(float(s['correct']) for s in sums) / count,
  }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains and evaluates as `config` says, in `workdir`; returns the summary.

  Resumes from the latest checkpoint in `workdir` if there is one.

  Raises:
    ConfigError: a bad config or work directory, before anything is written.
  """
  workdir = os.path.abspath(workdir)  # orbax takes absolute paths only
  exp = build(config, workdir)
  cfg, workers = exp.config, exp.workers
  lead = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  logging.info(
    '%d workers = %d devices (%s) x %d simulated; global batch %d, %d per worker',
    workers.count,
    workers.devices,
    jax.devices()[0].platform,
    workers.per_device,
    cfg.batch_size,
    exp.per_worker,
  )

  init = step.make_init(exp.model, exp.tx, workers, exp.dataset.image_shape)
  train_step = step.make_train_step(exp.model, exp.tx, workers, staggered=cfg.sync.staggered)
  eval_step = step.make_eval_step(exp.model, workers)
  state_shape = jax.eval_shape(init, jax.random.key(cfg.seed))
  transfers = comm.find_transfers(state_shape.opt_state)

  ckpt = checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'), keep=cfg.keep_checkpoints)
  start = ckpt.latest_step() or 0
  if start:
    target = checkpoint.abstract(state_shape, jax.tree.map(lambda _: workers.sharding, state_shape))
    try:
      state, meta = ckpt.restore(start, target)
    except Exception as e:
      raise ConfigError(
        f'cannot resume from the checkpoint at step {start} in {workdir}: it does not match this '
        f'config ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}). '
        f'Use a fresh --workdir or the config that wrote it.'
      ) from e
    logging.info('resumed from step %d (%s)', start, meta)
  else:
    state = init(jax.random.key(cfg.seed))
    if lead:
      metrics.write_atomic(os.path.join(workdir, 'config.json'), cfg.to_json_best_effort(indent=2))

  writer = metrics.MetricsWriter(workdir, start, enabled=lead)
  chunks = _eval_chunks(exp)
  n = workers.count
  payload_per_step = lambda counts: comm.total_bytes(transfers, counts) / n
  sent_per_step = lambda counts: (
    sum(t.sent_bytes(n) * int(c) for t, c in zip(transfers, counts, strict=True)) / n
  )
  algorithm = cfg.network.algorithm
  # a step "synchronised" if its largest collective ran (not, say, SelSync's 4-byte flags)
  biggest = max(range(len(transfers)), key=lambda i: transfers[i].nbytes) if transfers else 0

  last_eval: dict[str, float] = {}
  pending = None  # (step, device metrics): fetched one step late
  timer = {'t0': None, 'steps': 0, 'overhead': 0.0, 'fetched': None}  # overhead: eval + checkpoint

  def flush_pending():
    nonlocal pending
    if pending is None:
      return
    t, m = pending
    pending = None
    m = jax.device_get(m)
    now = time.perf_counter()
    step_s, timer['fetched'] = (now - timer['fetched'] if timer['fetched'] else None), now
    counts = [int(c) for c in m.pop('wire')]
    per_worker = [c / n for c in counts]  # every worker takes part in every collective
    synced = bool(transfers) and counts[biggest] > 0
    record = {
      'loss': float(m['loss']),
      'accuracy': float(m['accuracy']),
      'learning_rate': float(exp.schedule(t - 1)),
      'payload_bytes': payload_per_step(counts),
      'sent_bytes': sent_per_step(counts),
      'synced': int(synced),
      'step_s': step_s,
    }
    for name, net in exp.networks.items():
      net = netmodel.network_at(net, t - 1)
      blocking = netmodel.comm_time(transfers, n, net, algorithm, per_worker, overlap=False)
      hidden = netmodel.comm_time(transfers, n, net, algorithm, per_worker, overlap=True)
      record[f'comm_s@{name}'] = blocking
      if hidden:
        record[f'overlap_s@{name}'] = hidden
      record[f'modelled_s@{name}'] = netmodel.step_time(worker_s, blocking, hidden)
    if t in evals:
      record.update(evals.pop(t))
    writer.write(t, record)
    bar.set_postfix(loss=f'{record["loss"]:.3f}', acc=f'{record["accuracy"]:.3f}', refresh=False)

  evals: dict[int, dict[str, float]] = {}
  worker_s = measure_worker_step(exp)  # the compute term of the modelled clock
  bar = tqdm.tqdm(
    total=cfg.steps, initial=start, disable=not (lead and cfg.progress), desc='train', unit='step'
  )
  wall0 = time.time()
  for t in range(start, cfg.steps):
    x, y = _put_batch(exp, t)
    state, m = train_step(state, x, y)
    flush_pending()
    pending = (t + 1, m)
    bar.update(1)
    if t == start:  # the first step compiles; time the rest
      jax.block_until_ready(m)
      timer['t0'] = time.perf_counter()
    else:
      timer['steps'] += 1
    done = t + 1
    tick = time.perf_counter()
    if done % cfg.eval_every == 0 or done == cfg.steps:
      last_eval = _evaluate(eval_step, state, chunks)
      evals[done] = last_eval
    if done % cfg.checkpoint_every == 0 or done == cfg.steps:
      flush_pending()
      writer.flush()  # the log reaches the checkpoint's step before the checkpoint commits
      ckpt.save(done, state, {'step': done, 'seed': cfg.seed})
    if t != start:
      timer['overhead'] += time.perf_counter() - tick
    if done == cfg.fault.kill_at_step:
      # A crash between checkpoints: steps after the last one are logged, then lost.
      flush_pending()
      writer.flush()
      ckpt.wait()  # only so that which checkpoint survives is deterministic
      logging.warning('fault.kill_at_step=%d: killing this process (SIGKILL)', done)
      os.kill(os.getpid(), signal.SIGKILL)
  flush_pending()
  jax.block_until_ready(state)
  elapsed = time.perf_counter() - timer['t0'] - timer['overhead'] if timer['t0'] else float('nan')
  if not last_eval:  # nothing left to train: report the checkpoint's model
    last_eval = _evaluate(eval_step, state, chunks)
  bar.close()
  writer.close()
  ckpt.close()

  records = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE)) if lead else []
  steps_done = cfg.steps - start
  summary = {
    'dataset': cfg.dataset.name,
    'model': cfg.model.name,
    'sync': cfg.sync.method,
    'workers': n,
    'steps': cfg.steps,
    'test_accuracy': last_eval.get('test_accuracy'),
    'test_loss': last_eval.get('test_loss'),
    'samples_per_s': timer['steps'] * cfg.batch_size / elapsed if timer['steps'] else None,
    'wall_s': time.time() - wall0,
    'payload_bytes_per_step': (
      sum(r['payload_bytes'] for r in records) / len(records) if records else None
    ),
    'sent_bytes_per_step': sum(r['sent_bytes'] for r in records) / len(records)
    if records
    else None,
    'sent_bytes_per_worker': sum(r['sent_bytes'] for r in records) if records else None,
    'steps_this_run': steps_done,
    'sync_fraction': sum(r['synced'] for r in records) / len(records) if records else None,
    'median_step_s': report.median_step_s(records),
    'worker_step_s': worker_s,
  }
  for name in exp.networks:
    clock = report.modelled_clock(records, name, worker_s)
    summary[f'modelled_s@{name}'] = clock[-1][1] if clock else None
  if lead:
    metrics.write_atomic(os.path.join(workdir, SUMMARY_FILE), json.dumps(summary, indent=2))
    report.plot_curves(
      records,
      os.path.join(workdir, PLOT_FILE),
      f'{cfg.model.name} on {cfg.dataset.name}, {n} workers, {cfg.sync.method}',
    )
    print()
    print(report.table([summary], SUMMARY_COLUMNS))
    print(f'\nmetrics: {writer.path}\nplot:    {os.path.join(workdir, PLOT_FILE)}')
  return summary


SUMMARY_COLUMNS = (
  ('sync', 'sync'),
  ('workers', 'workers'),
  ('steps', 'steps'),
  ('test_accuracy', 'test acc'),
  ('samples_per_s', 'samples/s'),
  ('payload_bytes_per_step', 'payload B/worker/step'),
  ('sent_bytes_per_worker', 'sent B/worker (ring)'),
  ('median_step_s', 'step s, all workers'),
  ('worker_step_s', 'step s, one worker'),
)
