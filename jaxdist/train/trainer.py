"""`train_and_evaluate(config, workdir)`, `train(experiment)`: the training loop.

`factory.build` turns the config into an `Experiment` (objects and typed
values, no config) and checks it before the work directory is touched;
`train` runs it. The loop resumes from the latest checkpoint
if there is one, runs the jitted sharded step, fetches its metrics one step
late (the host never stalls the device), prices each step's communication
(`ledger.Ledger`), evaluates and checkpoints every N steps with the clock
paused, and ends with a summary table and a plot.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from jaxdist import comm, control, data, netmodel, runtime, timing
from jaxdist.faults import inject
from jaxdist.train import checkpoint, elastic, factory, ledger, metrics, report
from jaxdist.train import step as step_lib

SUMMARY_FILE = 'summary.json'
PLOT_FILE = 'curves.png'
BATCHES_PLOT = 'batches.png'
CONFIG_FILE = 'config.json'
CHECKPOINTS = 'checkpoints'
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
  'noise_every', 'noise_decay', 'checkpoint_every', 'keep_checkpoints', 'progress',
  'fault.kill_at_step', 'dataset.data_dir', 'dataset.download', 'network.compute_budget_s',
  'compare', 'variants',
)  # fmt: skip
START_AFRESH = (
  'resume with the config that wrote it, or start afresh with --fresh (fresh=True in Python), '
  'which deletes that run, or in a new --workdir'
)
ConfigError = factory.ConfigError


def put_batch(
  exp: factory.Experiment, t: int, sizes=None, scale: float | None = None, counts=None
) -> tuple[tuple[jax.Array, ...], np.ndarray]:
  """Global batch `t` as [workers, held, ...] arrays, and [K] examples each worker received.

  `exp.sampler` chooses each worker's examples (`jd.data.Partition`: iid,
  SelDP, non-IID labels, with or without data injection). With per-worker
  batch `sizes` ([K] ints), worker k's examples are repeated to fill its
  `exp.held` slots (the step trains on the first sizes[k]); with
  `exp.counted` the `counts` (default: the sizes; 0 for a dropped worker,
  whose drawn examples are then lost) come as a third array and a
  learning-rate `scale`, if given, as a fourth. Each process loads its own
  workers.
  """
  w, split = exp.workers, exp.dataset.train
  batch = exp.sampler.indices(t, [exp.per_worker] * w.count if sizes is None else sizes)
  idx = np.stack([np.resize(part, exp.held) for part in batch.indices])[w.local_workers()]
  arrays = [exp.dataset.normalize(split.images[idx]), split.labels[idx]]
  if exp.counted:
    counts = sizes if counts is None else counts
    arrays.append(np.asarray(counts, np.int32)[w.local_workers()])
    if scale is not None:
      arrays.append(np.full(w.count, scale, np.float32)[w.local_workers()])
  put = lambda a: jax.make_array_from_process_local_data(w.sharding, a, (w.count, *a.shape[1:]))
  return tuple(put(a) for a in arrays), batch.injected


def eval_chunks(exp: factory.Experiment) -> list[tuple[jax.Array, ...]]:
  """The test split in device-sharded, padded chunks (x, y, mask)."""
  split, w = exp.dataset.test, exp.workers
  chunk = -(-min(exp.eval_batch_size, len(split)) // w.devices) * w.devices
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


def evaluate(eval_step, state, chunks) -> dict[str, float]:
  """Test loss and accuracy of the worker-averaged model over all chunks."""
  sums = [jax.device_get(eval_step(state, *c)) for c in chunks]
  count = sum(float(s['count']) for s in sums)
  return {
    'test_loss': sum(float(s['loss']) for s in sums) / count,
    'test_accuracy': sum(float(s['correct']) for s in sums) / count,
  }


def measure_worker_step(
  exp: factory.Experiment, repeats: int = 20, budget_s: float = 2.0, candidate: int | None = None
) -> float:
  """Median seconds of one worker's step on its own: compute, compression, optimizer.

  The median of `repeats` timed steps, or of as many (at least three) as fit
  in `budget_s` seconds. With a ratio controller, the step runs `candidate`
  (default: the one the run starts with).

  The same optax chain runs on a 1-worker layout (one local device) with the
  per-worker batch; its collectives span one worker and cost nothing, so
  this is a worker's step minus communication: the compute term of the
  modelled clock.
  """
  return measure_worker_steps(exp, [candidate], repeats, budget_s)[0]


def measure_worker_steps(
  exp: factory.Experiment,
  candidates: Sequence[int | None],
  repeats: int = 20,
  budget_s: float = 2.0,
) -> list[float]:
  """`measure_worker_step` for each candidate, with one compiled step for all of them.

  The candidate is an argument of the step (`compressed_allreduce(ratios=...)`
  switches on it), so one program serves every candidate; each candidate's
  timing starts from a fresh train state.
  """
  one = runtime.layout(1, devices=1, device_list=jax.local_devices()[:1])
  counted = exp.counted
  init = step_lib.make_init(exp.model, exp.tx, one, exp.dataset.image_shape)
  train_step = step_lib.make_train_step(exp.model, exp.tx, one, counted=counted)
  idx = data.batch_indices(
    0, seed=exp.seed, num_examples=len(exp.dataset.train), batch_size=exp.per_worker
  )
  x = jax.device_put(exp.dataset.normalize(exp.dataset.train.images[idx])[None], one.sharding)
  y = jax.device_put(exp.dataset.train.labels[idx][None], one.sharding)
  counts = (jax.device_put(np.full(1, exp.per_worker, np.int32), one.sharding),) if counted else ()

  def seconds(candidate: int | None) -> float:
    tx_args = {}
    if exp.ratio_control is not None:  # the candidate the run starts with
      ctl = exp.ratio_control
      args = dict(ctl.plan(ctl.init(), 0).tx_args)
      if candidate is not None:
        args['candidate'] = np.full_like(args['candidate'], candidate)
      tx_args = {k: jax.device_put(v[:1], one.sharding) for k, v in args.items()}
    box = [init(jax.random.key(exp.seed))]

    def run():
      box[0], metrics = train_step(box[0], x, y, *counts, **tx_args)
      return metrics

    return timing.median_seconds(run, repeats, budget_s=budget_s)

  return [seconds(c) for c in candidates]


def candidate_step_s(exp: factory.Experiment, meta: dict[str, Any]) -> list[float]:
  """With a ratio controller, the compute term of each candidate (dense last), else [].

  A worker's step costs what its compressor costs: a 10× Top-k's selection
  is slower than a 1000×'s. The modelled clock charges each step the
  measured step of the candidate it ran. Measured once, like `worker_step_s`;
  with a compute term given (`exp.compute_s`), that for every candidate.
  """
  ctl = exp.ratio_control
  if ctl is None:
    return []
  if meta.get('compute_s_candidates'):
    return [float(v) for v in meta['compute_s_candidates']]
  if exp.compute_s:
    return [exp.compute_s] * (len(exp.ratios) + 1)
  budget_s = exp.compute_budget_s / 4
  out = measure_worker_steps(exp, range(len(exp.ratios) + 1), budget_s=budget_s)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    out = [float(v) for v in multihost_utils.broadcast_one_to_all(np.asarray(out, np.float64))]
  return out


def worker_step_s(exp: factory.Experiment, meta: dict[str, Any]) -> float:
  """The compute term: measured once per run, the same in every process, kept by checkpoints.

  A resumed run reuses the measurement its checkpoint recorded, and with
  several processes process 0's measurement is everyone's, so host-side
  decisions that read the modelled clock (streams, GraVAC) agree across
  processes and across a crash. A compute term given (`exp.compute_s`,
  `config.network.compute_s`) stands in for the measurement.
  """
  if meta.get('compute_s'):
    return float(meta['compute_s'])
  if exp.compute_s:  # given: no measurement
    return exp.compute_s
  compute_s = measure_worker_step(exp, budget_s=exp.compute_budget_s)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    compute_s = float(multihost_utils.broadcast_one_to_all(np.float64(compute_s)))
  return compute_s


class Noise:
  """Scavenger's gradient-noise indicator γ, measured every `exp.noise_every` steps.

  `jd.train.step.make_noise_step` computes mean_k ‖g_k‖² and ‖ḡ‖² on the
  step's batch at the workers' current parameters, beside training; a host
  `jd.control.noise_meter` smooths each, and γ is their ratio (>= 1; K if orthogonal).
  """

  def __init__(self, exp: factory.Experiment):
    self.exp, self.every = exp, exp.noise_every
    self.meter = control.noise_meter(exp.noise_decay)
    self.state = self.meter.init()
    self.step = None
    if self.every:
      self.step = step_lib.make_noise_step(
        exp.model, exp.workers, counted=exp.counted, per_worker=exp.way_asked
      )

  def measure(self, t: int, state, batch: tuple[jax.Array, ...], clock: Clock) -> dict[str, float]:
    """The record's noise fields at step t (0-based), if it is measured; else {}.

    The steps before it finish on the clock; the measurement is off it. A
    measurement that is not finite (a run that diverged) is recorded but not
    smoothed in: the run goes on and its loss says what happened.
    """
    if not self.every or t % self.every:
      return {}
    jax.block_until_ready(state)
    with clock.paused():
      args = batch[: 3 if self.exp.counted else 2]
      worker_sq, mean_sq = jax.device_get(self.step(state, *args))
    if np.isfinite(worker_sq) and np.isfinite(mean_sq):
      self.state = self.meter.update(self.state, worker_sq, mean_sq)
    return {'noise_worker_sq': float(worker_sq), 'noise_mean_sq': float(mean_sq), **self.summary()}

  def summary(self) -> dict[str, float]:
    if not self.state.count:
      return {}
    k = self.exp.workers.count
    gamma = control.scavenger.gamma(self.state)
    return {'gamma': gamma, 'gamma_normalized': gamma / k}


class Host:
  """The host controllers around each step (`jd.control.host`), the noise meter, and the
  copy of the train state an exploration keeps.

  The controllers are one chain: per-worker batches (`exp.batching`, dropped
  workers) and the ratio controller (`exp.ratio_control`). Each step runs the
  plan they make for it; each step's record, once fetched, is what they
  observe, before the next plan whenever a plan said it reads the last step
  (`Plan.needs_last`).

  Args:
    exp: the run.
    compute_s: one worker's measured step (the compute term).
    prices: the run's ledger (streams take a synchronising step's time from it).
    clock: the training clock (the noise measurement pauses it).
    candidate_s: the compute term of each candidate ratio, if any.
  """

  def __init__(self, exp, compute_s: float, prices: ledger.Ledger, clock: Clock,
               candidate_s: Sequence[float] = ()):  # fmt: skip
    self.exp, self.clock, self.candidate_s = exp, clock, list(candidate_s)
    self.example_bytes = exp.dataset.train.images[0].nbytes
    parts = {}
    k = exp.workers.count
    if exp.batching is not None or exp.drops:
      parts['batching'] = control.batches(
        exp.batching, exp.batching_mode, num_workers=k, global_batch=exp.batch_size,
        cluster=exp.cluster, per_example_s=compute_s / exp.per_worker, comm_s=prices.sync_s,
        alive=(lambda t: inject.alive(exp.drops, k, t)) if exp.drops else None,
        example_bytes=self.example_bytes,
      )  # fmt: skip
    if exp.ratio_control is not None:
      parts['adaptive'] = exp.ratio_control
    self.controllers = control.chain(**parts)
    self.state = self.controllers.init()
    self.noise = Noise(exp)
    self.saved = None  # a copy of the train state an exploration started from
    self.last = control.Plan()  # the plan of the last step

  def plan(self, t: int, log: StepLog) -> control.Plan:
    """Step t's plan; first the last step's record, if the last plan asked to observe it."""
    if self.last.needs_last:
      log.flush()
    self.last = self.controllers.plan(self.state, t)
    return self.last

  def batch(self, t: int, state, plan: control.Plan):
    """Step t's device arrays, the chain's extra arguments, and fields measured before it."""
    arrays, injected = put_batch(self.exp, t, plan.batches, plan.lr_scale, plan.counts)
    fields = self.noise.measure(t, state, arrays, self.clock)
    if self.exp.sampler.partition.injects:  # bytes each worker received, on average
      fields['inject_bytes'] = float(np.mean(injected)) * self.example_bytes
    w = self.exp.workers
    put = lambda a: jax.make_array_from_process_local_data(w.sharding, a[w.local_workers()])
    return arrays, {k: put(v) for k, v in plan.tx_args.items()}, fields

  def prepare(self, state, plan: control.Plan):
    """The train state the next step starts from: a plan may keep a copy of it before an
    exploration and go back to the copy afterwards."""
    if plan.snapshot:
      self.saved = _copy(state)
    elif plan.restore:
      if self.saved is None:
        raise RuntimeError('the controller asked to restore a train state it never saved')
      state = _copy(self.saved)
      if not plan.exploring:
        self.saved = None
    return state

  @property
  def exploring(self) -> bool:
    """Whether the current steps will be undone (evaluations and checkpoints wait)."""
    return self.saved is not None

  def finish(self, state):
    """The run's last state: an exploration still running is undone."""
    if self.saved is not None:
      state, self.saved = self.saved, None
    return state

  def compute_at(self, plan: control.Plan) -> float | None:
    """The compute term of a step that ran `plan`, if it depends on the candidate, else None."""
    if not self.candidate_s or 'candidate' not in plan.tx_args:
      return None
    return self.candidate_s[int(plan.tx_args['candidate'][0])]

  def observe(self, record: control.Record) -> dict[str, Any]:
    """Fields the controllers add to a step's record."""
    self.state, fields = self.controllers.observe(self.state, record)
    return fields

  def summary(self) -> dict[str, Any]:
    return {**self.noise.summary(), **self.controllers.summary(self.state)}

  def to_tree(self) -> dict[str, Any]:
    """Every controller's state and the noise meter's, for the checkpoint's control item."""
    return {**control.host.to_tree(self.state), 'noise': control.host.to_tree(self.noise.state)}

  def restore(self, saved: dict[str, Any]) -> None:
    """The states `to_tree` saved (absent ones stay as they start)."""
    self.state = control.host.from_tree(self.state, saved)
    if saved.get('noise'):
      self.noise.state = control.host.from_tree(self.noise.state, saved['noise'])


@jax.jit
def _copy(state):
  """New buffers holding `state` (the train step donates its input's)."""
  return jax.tree.map(lambda x: x + jax.numpy.zeros((), x.dtype) if _numeric(x) else x, state)


def _numeric(x) -> bool:
  return not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class Clock:
  """Seconds spent training: from the end of the first (compiling) step, less paused time."""

  def __init__(self):
    self.steps = 0  # steps timed
    self._start: float | None = None
    self._paused = 0.0

  def step(self, metrics: Any) -> None:
    """Counts a step; the first one is waited for and starts the clock."""
    if self._start is None:
      jax.block_until_ready(metrics)
      self._start = time.perf_counter()
    else:
      self.steps += 1

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    """Time inside (evaluation, checkpoints) does not count."""
    tick = time.perf_counter()
    try:
      yield
    finally:
      if self._start is not None:
        self._paused += time.perf_counter() - tick

  def seconds(self) -> float:
    if self._start is None:
      return float('nan')
    return time.perf_counter() - self._start - self._paused


class StepLog:
  """Per-step records: device metrics fetched one step late, priced by the ledger, then written.

  `observe(record)` (a `control.Record`) gives the fields the host controllers
  add; `compute_at(plan)` the compute term of a step that ran `plan`, where
  it depends on the plan (None: the run's).
  """

  def __init__(
    self, writer: metrics.MetricsWriter, prices: ledger.Ledger, schedule, on_write, observe=None,
    compute_at=None,
  ):  # fmt: skip
    self.writer, self.prices, self.schedule, self.on_write = writer, prices, schedule, on_write
    self.observe = observe or (lambda record: {})
    self.compute_at = compute_at or (lambda plan: None)
    self._pending: tuple[int, Any, control.Plan] | None = None
    self._extra: dict[str, float] = {}
    self._last_fetch: float | None = None

  def push(self, step: int, device_metrics: Any, plan: control.Plan | None = None) -> None:
    """Writes the previous step's record, then holds this one's (still on the device)."""
    self.flush()
    self._pending = (step, device_metrics, plan or control.Plan())

  def add(self, fields: dict[str, float]) -> None:
    """Adds `fields` (e.g. an evaluation) to the pending step's record."""
    self._extra.update(fields)

  def flush(self) -> None:
    """Fetches and writes the pending record, if any."""
    if self._pending is None:
      return
    t, m, plan = self._pending
    self._pending = None
    m = jax.device_get(m)
    now = time.perf_counter()
    step_s = now - self._last_fetch if self._last_fetch else None
    self._last_fetch = now
    record = {
      'loss': float(m['loss']),
      'accuracy': float(m['accuracy']),
      'learning_rate': float(self.schedule(t - 1)),
      **self.prices.record(t, [int(c) for c in m['wire']]),
      'step_s': step_s,
      **self._extra,
    }
    compute_s = self.compute_at(plan)
    if compute_s is not None:  # this step's candidate's compute term, not the run's first
      record['step_compute_s'] = compute_s
      for name in self.prices.networks:
        blocking, hidden = record[f'comm_s@{name}'], record.get(f'overlap_s@{name}', 0.0)
        record[f'modelled_s@{name}'] = netmodel.step_time(compute_s, blocking, hidden)
    record.update(self.observe(control.Record(t, plan, {'step': t, **record}, m)))
    self._extra = {}
    self.writer.write(t, record)
    self.on_write(record)


def kill_at_step(step: int) -> Callable[[int, StepLog, checkpoint.Checkpointer], None]:
  """Fault-injection hook: SIGKILL this process once step `step` is logged (0 = never).

  A crash between checkpoints: the steps after the last checkpoint are
  logged, then lost, and a rerun resumes from the checkpoint.
  """

  def hook(done: int, log: StepLog, ckpt: checkpoint.Checkpointer) -> None:
    if done != step:
      return
    log.flush()
    log.writer.flush()
    ckpt.wait()  # only so that which checkpoint survives is deterministic
    logging.warning('fault.kill_at_step=%d: killing this process (SIGKILL)', done)
    os.kill(os.getpid(), signal.SIGKILL)

  return hook


def restore_or_init(exp, ckpt, init, state_shape) -> tuple[Any, int, dict[str, Any], dict]:
  """(state, step, metadata, controllers' states): the latest checkpoint's, or a fresh state
  at step 0.

  A checkpoint of another number of workers is read as NumPy, resharded for
  this run's (`jaxdist.train.elastic`: per-method rules) and placed as a
  restore places it, its host controllers starting afresh (elastic restore
  refuses those that keep state per worker); one of the same number is
  restored as it was saved.
  """
  start = ckpt.latest_step() or 0
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
  """Removes what a run wrote into `workdir` (`RUN_FILES`); anything else there stays."""
  for name in RUN_FILES:
    path = os.path.join(workdir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.lexists(path):
      os.remove(path)


def open_workdir(exp: factory.Experiment, fresh: bool) -> None:
  """Makes `exp.workdir` ready: the old run removed if `fresh`, else checked resumable."""
  if fresh:
    if jax.process_index() == 0:
      clear_run(exp.workdir)
    if jax.process_count() > 1:  # no process opens the checkpoints before they are gone
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices('jaxdist: fresh workdir')
  else:
    check_resume(exp.record, exp.workdir)
  os.makedirs(exp.workdir, exist_ok=True)


def train_and_evaluate(config, workdir: str, *, fresh: bool = False) -> dict[str, Any]:
  """Trains and evaluates as `config` says, in `workdir`; returns the summary.

  Resumes from the latest checkpoint in `workdir` if there is one and its
  config matches (`check_resume`); with `fresh`, removes that run instead
  (`clear_run`) and starts anew.

  Raises:
    ConfigError: a bad config or work directory, or a checkpoint that may not
      resume with `config`, before anything is written.
  """
  return train(factory.build(config, os.path.abspath(workdir)), fresh=fresh)


def train(exp: factory.Experiment, *, fresh: bool = False) -> dict[str, Any]:
  """Trains and evaluates the run `exp` (`factory.build`) in `exp.workdir`; the summary."""
  workers, lead = exp.workers, jax.process_index() == 0
  open_workdir(exp, fresh)
  logging.info('%s', exp)
  init = step_lib.make_init(exp.model, exp.tx, workers, exp.dataset.image_shape, exp.way)
  train_step = step_lib.make_train_step(
    exp.model, exp.tx, workers, staggered=exp.staggered, counted=exp.counted, per_worker=exp.way
  )
  eval_step = step_lib.make_eval_step(exp.model, workers)
  state_shape = jax.eval_shape(init, jax.random.key(exp.seed))
  ckpt = checkpoint.Checkpointer(os.path.join(exp.workdir, CHECKPOINTS), keep=exp.keep_checkpoints)
  state, start, meta, control_state = restore_or_init(exp, ckpt, init, state_shape)
  if lead:  # the config this run goes on with
    metrics.write_atomic(os.path.join(exp.workdir, CONFIG_FILE), json.dumps(exp.record, indent=2))

  compute_s = worker_step_s(exp, meta)  # the compute term of the modelled clock
  prices = ledger.Ledger.of(exp, comm.find_transfers(state_shape.opt_state), compute_s)
  bar = report.progress(exp.steps, start, enabled=lead and exp.progress)
  chunks, clock, last_eval, wall0 = eval_chunks(exp), Clock(), {}, time.time()
  host = Host(exp, compute_s, prices, clock, candidate_step_s(exp, meta))
  host.restore(control_state)
  writer = metrics.MetricsWriter(exp.workdir, start, enabled=lead)
  log = StepLog(writer, prices, exp.schedule, bar.show, host.observe, host.compute_at)
  hooks = [kill_at_step(exp.kill_at_step)]
  evaluate_due = save_due = False  # held back while an exploration runs
  for t in range(start, exp.steps):
    plan = host.plan(t, log)  # first the last step's record, if the plan reads it
    state = host.prepare(state, plan)
    batch, tx_args, fields = host.batch(t, state, plan)
    state, m = train_step(state, *batch, **tx_args)
    log.push(t + 1, m, plan)
    log.add(fields)
    bar.update(1)
    clock.step(m)
    done = t + 1
    with clock.paused():
      if done == exp.steps:
        state = host.finish(state)
      evaluate_due = evaluate_due or done % exp.eval_every == 0 or done == exp.steps
      save_due = save_due or done % exp.checkpoint_every == 0 or done == exp.steps
      if evaluate_due and not host.exploring:
        evaluate_due = False
        last_eval = evaluate(eval_step, state, chunks)
        log.add(last_eval)
      if save_due and not host.exploring:
        save_due = False
        log.flush()
        log.writer.flush()  # the log reaches the checkpoint's step before the checkpoint commits
        saved = {'step': done, 'seed': exp.seed, 'config': dict(exp.record),
                 'compute_s': compute_s, 'compute_s_candidates': host.candidate_s,
                 **elastic.recorded(exp)}  # fmt: skip
        ckpt.save(done, state, saved, host.to_tree())
      for hook in hooks:
        hook(done, log, ckpt)
  log.flush()
  jax.block_until_ready(state)
  last_eval = last_eval or evaluate(eval_step, state, chunks)  # nothing left to train
  bar.close()
  log.writer.close()
  ckpt.close()

  records = metrics.read_jsonl(log.writer.path) if lead else []
  summary = {
    'dataset': exp.dataset_name, 'model': exp.model_name, 'sync': exp.method,
    'workers': workers.count, 'steps': exp.steps, 'steps_this_run': exp.steps - start,
    'test_accuracy': last_eval.get('test_accuracy'), 'test_loss': last_eval.get('test_loss'),
    'samples_per_s': clock.steps * exp.batch_size / clock.seconds() if clock.steps else None,
    'wall_s': time.time() - wall0,
    **ledger.summarize(records, list(exp.networks), compute_s, exp.clock),
    **host.summary(),
  }  # fmt: skip
  if lead:
    _report(exp, summary, records, log.writer.path)
  return summary


def _report(exp: factory.Experiment, summary: dict[str, Any], records, metrics_path: str) -> None:
  """summary.json, the curves' PNG and the table on the console."""
  metrics.write_atomic(os.path.join(exp.workdir, SUMMARY_FILE), json.dumps(summary, indent=2))
  title = f'{exp.model_name} on {exp.dataset_name}, {exp.workers.count} workers, {exp.method}'
  plot = os.path.join(exp.workdir, PLOT_FILE)
  report.save(report.plot_curves(records, title), plot)
  if any('batches' in r for r in records):
    report.save(report.plot_batches(records, title), os.path.join(exp.workdir, BATCHES_PLOT))
  print()
  print(report.table([summary], SUMMARY_COLUMNS))
  print(f'\nmetrics: {metrics_path}\nplot:    {plot}')


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
