r"""Samples/s of the sharded data-parallel step against a plain single-device jit.

Every row trains the same model on the same global batch with plain SGD; only
where the workers live changes: one device and no workers (the baseline), 8
workers on 8 devices, and workers simulated beyond the devices, all on one
device or spread over all of them. Simulated workers compute their gradients
each way of `make_train_step(per_worker=...)` (`--per_worker`), side by side in
one run:

  vmap  together (`jax.vmap` over the workers): per-worker weights
        make every convolution a grouped one.
  loop  one after the other (`lax.map`), dense convolutions; on the CPU with
        the convolutions in Eigen's layout and the sums over workers written
        as dots. What `'auto'` picks on the CPU.
  shared, mean
        one copy of the weights read by every worker of a device (see
        `make_train_step`); the state still holds one model per worker.
  device
        one backward pass of the device's mean loss, the chain once per
        device, and one model per device in the state: its memory does not
        grow with the simulated workers (plain all-reduce is exact this way).
        With `--method=topk`, each worker's own gradient at its device's
        model, compressed with its own residual; the optimizer once per
        device (`SplitChain`): only the residuals grow with the workers.

`--method` is the chain of the workers' rows of the first two tables:
`allreduce` (plain SGD after a dense all-reduce) or `topk` (Top-k 1% with
error feedback, all-gathered, then SGD with momentum 0.9: state per worker of
weights, momentum and residual, except with `device`). The single-device row
stays plain SGD on the dense gradient either way.

Each figure is the median of `--repeats` timed windows of `--steps` steps after
a warm-up, the windows of all rows taken in turns so that a change in the
machine's load touches every row alike. Compile time is that of
`lower(...).compile()`; memory is XLA's `compiled.memory_analysis()` of the
program one device runs: arguments + outputs - donated + temporaries, and the
temporaries (activations) alone.

The second table is the scaling of the step with the number of workers on all
devices (`--scaling`).

The third (`--overhead_params`) is what each compressor family adds to a
step, against dense all-reduce, as the model grows: for each target size the
digits CNN with all its widths scaled by m/8 (m = 8 is the digits CNN itself,
151,306 parameters on 8x8x1; m is chosen to bring the count nearest the
target; `--overhead_model=mlp` scales the MLP's instead), trained by
`--overhead_workers` workers (8: one per device on 8 devices) on the same
global batch with plain SGD. Each method is the chain `jaxdist.train.factory`
builds from the config keys a user would set (`--config.<key>=<value>`):

  dense     sync.method=allreduce
  topk      sync.method=compressed_allreduce compress.name=topk compress.topk.ratio=0.01
            (exact `lax.top_k`, error feedback, all-gather of values and indices)
  dgc       ... compress.name=dgc compress.dgc.ratio=0.01 (sampled threshold, error feedback)
  qsgd      ... compress.name=qsgd compress.qsgd.levels=127 (8 bits: sign and 7-bit level)
  powersgd  sync.method=powersgd sync.powersgd.rank=2 (error feedback, warm start)

The rows of one size are timed in turns, like the others, in windows of
`--overhead_steps` steps (0: as many as make the dense row's window about
`--overhead_window_s`, at most `--steps`). Bytes are the library's own
accounting (`jaxdist.train.ledger`): the payload each worker puts into its
collectives per step, and what it sends with ring algorithms (an all-gather
sends its payload to N-1 workers). `--nolayouts --scaling=` prints this table
alone.

The fourth (`--lm`) is the language model's: every variant of
`--lm_variants` (configs/variants/lm.py: AdamW with a dense all-reduce first,
then the DiLoCo family and the compressors) on `--lm_config`'s GPT, built by
the trainer's own factory from the variant's config keys, timed in turns in
windows of `--lm_steps` steps (a multiple of every period, so that a window
holds each periodic method's outer steps in their share), with its ratio to
the first variant's step; beside it, the library's trainer running the same
config for `--lm_trainer_steps` steps (its median step, the first 3 left out,
no gradient-noise pass) and its ratio to the timed step: what the loop adds.
`--nolayouts --scaling= --overhead_params= --lm=all` prints it alone.

  python experiments/bench_step.py                       # CNN, digits-sized input
  python experiments/bench_step.py --model=resnet20 --image=32,32,3 --batch=256 \
      --steps=2 --repeats=3
  python experiments/bench_step.py --nolayouts --scaling= --repeats=5   # compressors only
"""

import math
import os
import statistics
import time

from absl import app, flags

flags.DEFINE_string('model', 'cnn', 'Model name (mlp, cnn, resnet20).')
flags.DEFINE_list('image', ['8', '8', '1'], 'Input shape H,W,C.')
flags.DEFINE_integer('batch', 512, 'Global batch (divisible by the worker counts).')
flags.DEFINE_integer('steps', 20, 'Steps per timed window.')
flags.DEFINE_integer('repeats', 5, 'Timed windows; the median is reported.')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_list('workers', ['8', '64'], 'Simulated worker counts (on one device and on all).')
flags.DEFINE_list('scaling', ['8', '16', '64', '256'], 'Worker counts of the scaling table.')
flags.DEFINE_list('per_worker', ['vmap', 'loop'], 'Ways to compare (see above).')
flags.DEFINE_enum('method', 'allreduce', ['allreduce', 'topk'], 'Chain of the first two tables.')
flags.DEFINE_bool('layouts', True, 'Print the first table (single device, sharded, simulated).')
flags.DEFINE_list(
  'overhead_params', ['150000', '1000000', '10000000'], 'Model sizes of the compressor table.'
)
flags.DEFINE_list(
  'compressors', ['topk', 'dgc', 'qsgd', 'powersgd'], 'Methods of the compressor table.'
)
flags.DEFINE_enum('overhead_model', 'cnn', ['cnn', 'mlp'], 'Model family of the compressor table.')
flags.DEFINE_integer('overhead_workers', 8, 'Workers of the compressor table (on all devices).')
flags.DEFINE_integer('overhead_steps', 0, 'Steps per window of the compressor table (0: auto).')
flags.DEFINE_float('overhead_window_s', 1.0, "Auto windows last about this long (dense row's).")
flags.DEFINE_list('lm', [], "Variants of --lm_variants for the LM table ('all': every one).")
flags.DEFINE_string('lm_variants', 'configs/variants/lm.py', 'Variants file of the LM table.')
flags.DEFINE_string('lm_config', 'shakespeare_gpt.py', 'Config (with :args) of the LM table.')
flags.DEFINE_integer('lm_steps', 50, 'Steps per window of the LM table.')
flags.DEFINE_integer(
  'lm_trainer_steps',
  60,
  "Steps of the trainer's run of each LM variant (0: none): its median step.",
)
flags.DEFINE_string('results', None, 'Also write the tables as markdown here, with the command.')
FLAGS = flags.FLAGS


def _chain(method: str, axis_name, split: bool):
  """The layout tables' optax chain (see the module's docstring); a SplitChain for 'device'."""
  import optax

  import jaxdist as jd
  from jaxdist.train import step as step_lib

  if method == 'allreduce':
    return optax.chain(jd.sync.allreduce(axis_name=axis_name), optax.sgd(0.01))
  compressed = jd.sync.compressed_allreduce(jd.compress.topk(ratio=0.01), axis_name=axis_name)
  opt = optax.sgd(0.01, momentum=0.9)
  return step_lib.SplitChain(compressed, opt) if split else optax.chain(compressed, opt)


def _windows(runs: dict, warm: bool = True) -> dict:
  """Median seconds of each `runs[key]()` (one window of steps), timed in turns."""
  if warm:
    for run in runs.values():
      run()
  windows = {key: [] for key in runs}
  for _ in range(FLAGS.repeats):
    for key, run in runs.items():
      start = time.perf_counter()
      run()
      windows[key].append(time.perf_counter() - start)
  return {key: statistics.median(w) for key, w in windows.items()}


def _time_together(runs: dict) -> dict:
  """Samples/s of each `runs[key]()` (one window of `--steps` steps), timed in turns."""
  return {key: FLAGS.steps * FLAGS.batch / s for key, s in _windows(runs).items()}


def _compile(jitted, args):
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  seconds = time.perf_counter() - start
  m = compiled.memory_analysis()
  if m is None:
    return compiled, seconds, None, None
  total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  return compiled, seconds, total + m.temp_size_in_bytes, m.temp_size_in_bytes


# The methods of the compressor table, as the config keys a user sets (`--config.<key>=<value>`).
def _compressed(name: str, **args) -> dict:
  keys = {'sync.method': 'compressed_allreduce', 'compress.name': name}
  return keys | {f'compress.{name}.{k}': v for k, v in args.items()}


OVERHEAD_METHODS = {
  'dense': ('dense all-reduce', {'sync.method': 'allreduce'}),
  'topk': ('Top-k 1%, EF', _compressed('topk', ratio=0.01)),
  'dgc': ('DGC 1%, EF', _compressed('dgc', ratio=0.01)),
  'qsgd': ('QSGD 8-bit', _compressed('qsgd', levels=127)),
  'powersgd': ('PowerSGD rank 2', {'sync.method': 'powersgd', 'sync.powersgd.rank': 2}),
}
PLAIN_SGD = {  # the optimizer of every row: plain SGD, as in the other tables
  'optimizer.learning_rate': 0.01,
  'optimizer.momentum': 0.0,
  'optimizer.nesterov': False,
  'optimizer.weight_decay': 0.0,
  'optimizer.schedule': 'constant',
}


def _widened(family: str, m: int):
  """The library's `family` model with every width scaled by m/8 (m = 8: as it is)."""
  import jaxdist as jd

  scale = lambda w: max(1, round(w * m / 8))
  if family == 'cnn':
    c = jd.models.CNN
    return c(num_classes=10, features=tuple(map(scale, c.features)), hidden=scale(c.hidden))
  return jd.models.MLP(num_classes=10, hidden=tuple(map(scale, jd.models.MLP.hidden)))


def _num_params(model, shape) -> int:
  import jax

  from jaxdist.train import step as step_lib

  tree = jax.eval_shape(lambda k: step_lib.init_params(model, k, shape)[0], jax.random.key(0))
  return sum(x.size for x in jax.tree.leaves(tree))


def _sized(family: str, shape, target: int):
  """(model, m, parameters): the `family` model widened by m/8, m bringing it nearest `target`."""
  counts = {}

  def count(m):
    if m not in counts:
      counts[m] = _num_params(_widened(family, m), shape)
    return counts[m]

  hi = 1
  while count(hi) < target:
    hi *= 2
  lo = hi // 2  # count(lo) < target <= count(hi), or lo == 0
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if count(mid) < target else (lo, mid)
  off = lambda m: abs(math.log(count(m) / target))
  m = lo if lo >= 1 and off(lo) < off(hi) else hi
  return _widened(family, m), m, count(m)


def _overhead(x, y, shape) -> tuple[str, list[dict]]:
  """The compressor table: (title, rows), one row per model size and method."""
  import jax

  import jaxdist as jd
  from jaxdist import comm
  from jaxdist.train import config as config_lib
  from jaxdist.train import factory, ledger, report
  from jaxdist.train import step as step_lib

  batch, family = FLAGS.batch, FLAGS.overhead_model
  workers = jd.runtime.layout(FLAGS.overhead_workers)
  if batch % workers.count:
    raise app.UsageError(f'--batch ({batch}) must divide by --overhead_workers ({workers.count})')
  methods = ['dense', *(c for c in FLAGS.compressors if c != 'dense')]
  if unknown := sorted(set(methods) - set(OVERHEAD_METHODS)):
    raise app.UsageError(f'unknown --compressors {unknown}; choose from {list(OVERHEAD_METHODS)}')
  xw = jax.device_put(x.reshape(workers.count, batch // workers.count, *shape), workers.sharding)
  yw = jax.device_put(y.reshape(workers.count, batch // workers.count), workers.sharding)
  title = (
    f'compressor overhead: {family} widened, {workers.count} workers on {workers.devices} '
    f'device(s), global batch {batch}, plain SGD'
  )
  targets = [int(t) for t in FLAGS.overhead_params]
  if min(targets) < 1:
    raise app.UsageError(f'--overhead_params must be positive, got {FLAGS.overhead_params}')
  rows = []
  for target in targets:
    model, m, n = _sized(family, shape, target)
    print(f'{title}: {n:,} parameters ({family} x{m}/8)...', flush=True)
    steps, runs, found = [1], {}, {}
    for name in methods:
      label, keys = OVERHEAD_METHODS[name]
      config = config_lib.base()
      config.update_from_flattened_dict({**PLAIN_SGD, **keys})
      tx, _ = factory.build_chain(config, workers)
      box = [step_lib.make_init(model, tx, workers, shape)(jax.random.key(0)), None]
      jitted = step_lib.make_train_step(model, tx, workers)
      train_step, seconds, memory, temp = _compile(jitted, (box[0], xw, yw))

      def run(train_step=train_step, box=box, steps=steps):
        for _ in range(steps[0]):
          box[0], box[1] = train_step(box[0], xw, yw)
        jax.block_until_ready(box[1])

      run()  # warm-up: one step
      runs[name] = run
      found[name] = (box, {
        'params': f'{n:,}',
        'width': f'{m / 8:g}x',
        'method': label,
        'compile': f'{seconds:.2f}',
        'memory': report.human_bytes(memory) if memory is not None else '-',
        'temp': report.human_bytes(temp) if temp is not None else '-',
      })  # fmt: skip
    start = time.perf_counter()
    runs['dense']()
    one = time.perf_counter() - start
    steps[0] = FLAGS.overhead_steps or max(
      1, min(FLAGS.steps, round(FLAGS.overhead_window_s / one))
    )
    window_s = _windows(runs, warm=False)
    for name in methods:
      box, row = found[name]
      transfers = comm.find_transfers(box[0].opt_state)
      counts = [int(c) for c in box[1]['wire']]
      wire = ledger.Ledger(transfers, workers.count, {}, 'ring', 0.0).record(1, counts)
      ms = 1e3 * window_s[name] / steps[0]
      row |= {
        'steps': steps[0],
        'ms': ms,
        'ratio': window_s[name] / window_s['dense'],
        'payload': wire['payload_bytes'],
        'sent': wire['sent_bytes'],
      }
      rows.append(row)
    del runs, found  # free this size's states and programs before the next
  return title, rows


OVERHEAD_COLUMNS = [
  ('params', 'params'),
  ('width', 'widths'),
  ('method', 'method'),
  ('steps', 'steps/window'),
  ('ms_text', 'step ms'),
  ('ratio_text', '÷ dense'),
  ('compile', 'compile s'),
  ('memory', 'memory/device'),
  ('temp', 'temporaries'),
  ('payload_text', 'payload B/worker/step'),
  ('sent_text', 'sent B/worker/step (ring)'),
]


def _fmt_overhead(rows: list[dict]) -> list[dict]:
  from jaxdist.train import report

  return [
    r
    | {
      'ms_text': f'{r["ms"]:.2f}',
      'ratio_text': f'{r["ratio"]:.2f}',
      'payload_text': report.human_bytes(r['payload']),
      'sent_text': report.human_bytes(r['sent']),
    }
    for r in rows
  ]


class _Layouts:
  """The rows of the layout and scaling tables, each measured once, and their timed runs.

  A row is compiled when first asked for; `time` then times every row's
  window of `--steps` steps in turns and frees the programs.
  """

  def __init__(self, model, shape, x, y):
    self.model, self.shape, self.x, self.y = model, shape, x, y
    self.measured, self.runs = {}, {}

  def baseline(self) -> dict:
    """The single-device row: plain SGD on the dense gradient, one jitted program."""
    import jax
    import optax

    from jaxdist.train import step as step_lib

    if 'baseline' in self.measured:
      return self.measured['baseline']
    model, shape, tx = self.model, self.shape, optax.sgd(0.01)
    params, model_state = step_lib.init_params(model, jax.random.key(0), shape)
    carry = [params, model_state, tx.init(params)]
    xd, yd = jax.device_put(self.x), jax.device_put(self.y)
    reference, seconds, memory, temp = _compile(
      step_lib.make_reference_step(model, tx), (*carry, xd, yd)
    )

    def run():
      for _ in range(FLAGS.steps):
        carry[0], carry[1], carry[2], loss = reference(*carry, xd, yd)
      jax.block_until_ready(loss)

    self.measured['baseline'] = {
      'layout': 'single device, plain jit',
      'workers': 1,
      'devices': 1,
      'sim': '-',
      'per_worker': '-',
      'compile': seconds,
      'memory': memory,
      'temp': temp,
    }
    self.runs['baseline'] = run
    return self.measured['baseline']

  def workers_row(self, count: int, devices: int, per_worker: str) -> dict:
    """The row of `count` workers on `devices` devices, computing their gradients `per_worker`."""
    import jax

    import jaxdist as jd
    from jaxdist.train import step as step_lib

    if count == devices:
      per_worker = 'vmap'  # one worker per device: one dense program either way
    key = (count, devices, per_worker)
    if key in self.measured:
      return self.measured[key]
    model, shape, batch = self.model, self.shape, FLAGS.batch
    workers = jd.runtime.layout(count, devices=devices)
    tx = _chain(FLAGS.method, workers.axis_name, split=per_worker == 'device')
    box = [step_lib.make_init(model, tx, workers, shape, per_worker)(jax.random.key(0))]
    xw = jax.device_put(self.x.reshape(count, batch // count, *shape), workers.sharding)
    yw = jax.device_put(self.y.reshape(count, batch // count), workers.sharding)
    jitted = step_lib.make_train_step(model, tx, workers, per_worker=per_worker)
    train_step, seconds, memory, temp = _compile(jitted, (box[0], xw, yw))

    def run():
      for _ in range(FLAGS.steps):
        box[0], metrics = train_step(box[0], xw, yw)
      jax.block_until_ready(metrics)

    kind = 'sharded' if workers.per_device == 1 else 'simulated'
    self.measured[key] = {
      'layout': f'{kind}, {FLAGS.method}',
      'workers': count,
      'devices': workers.devices,
      'sim': workers.per_device,
      'per_worker': per_worker,
      'compile': seconds,
      'memory': memory,
      'temp': temp,
    }
    self.runs[key] = run
    return self.measured[key]

  def rows_for(self, count: int, devices: int) -> list[dict]:
    """A row per `--per_worker` way (fewer where they coincide); none if the batch won't split."""
    if FLAGS.batch % count or count % devices:
      return []
    return _distinct([self.workers_row(count, devices, v) for v in FLAGS.per_worker])

  def time(self) -> None:
    """Times every row's window in turns (its samples/s), then frees the programs."""
    for key, sps in _time_together(self.runs).items():
      self.measured[key]['sps'] = sps
    self.runs.clear()

  def fmt(self, rows: list[dict], sharded_devices: int) -> list[dict]:
    """The rows as text, with their speed against the single device and 8 sharded workers."""
    from jaxdist.train import report

    base = self.measured['baseline']
    sharded = self.measured.get((8, sharded_devices, 'vmap'))
    out = []
    for r in rows:
      r = dict(r)
      r['ratio'] = f'{r["sps"] / base["sps"]:.2f}x'
      if sharded:
        r['vs_sharded'] = f'{r["sps"] / sharded["sps"]:.2f}x'
      r['sps'] = f'{r["sps"]:,.0f}'
      r['compile'] = f'{r["compile"]:.2f}'
      for k in ('memory', 'temp'):
        r[k] = report.human_bytes(r[k]) if r[k] is not None else '-'
      out.append(r)
    return out


def _distinct(rows: list[dict]) -> list[dict]:
  """`rows` without repeats of the same row object, in order."""
  return list({id(r): r for r in rows}.values())


def _layout_rows(layouts: _Layouts, n_dev: int) -> list[dict]:
  """The first table: single device, 8 sharded workers, `--workers` on one device and on all."""
  table = [layouts.baseline(), *layouts.rows_for(8, min(8, n_dev))]
  for w in (int(w) for w in FLAGS.workers):
    table += layouts.rows_for(w, 1) + layouts.rows_for(w, min(n_dev, w))
  return _distinct(table)


def _scaling_rows(layouts: _Layouts, n_dev: int) -> list[dict]:
  """The second table: `--scaling` workers on all devices."""
  return [r for w in (int(w) for w in FLAGS.scaling) for r in layouts.rows_for(w, min(n_dev, w))]


def _layout_columns(sharded_devices: int) -> list[tuple[str, str]]:
  return [
    ('layout', 'layout'),
    ('workers', 'workers'),
    ('devices', 'devices'),
    ('sim', 'sim/device'),
    ('per_worker', 'per_worker'),
    ('sps', 'samples/s'),
    ('ratio', 'vs single device'),
    ('vs_sharded', f'vs 8 on {sharded_devices}'),
    ('compile', 'compile s'),
    ('memory', 'memory/device'),
    ('temp', 'temporaries'),
  ]


LM_COLUMNS = [
  ('variant', 'variant'),
  ('method', 'sync'),
  ('ms_text', 'step ms'),
  ('ratio_text', '÷ first'),
  ('tokens_text', 'tokens/s'),
  ('compile', 'compile s'),
  ('memory', 'memory/device'),
  ('trainer_text', "the trainer's median step ms"),
  ('trainer_ratio', 'trainer ÷ step'),
]


def _lm_table() -> tuple[str, list[dict]]:
  """The language model's table: (title, rows), one row per variant of `--lm_variants`."""
  import os
  import tempfile

  import jax
  import numpy as np

  from jaxdist import data
  from jaxdist.train import compare, factory, report
  from jaxdist.train import config as config_lib
  from jaxdist.train import step as step_lib

  path = config_lib.find(FLAGS.lm_variants)
  only = None if FLAGS.lm == ['all'] else FLAGS.lm
  base = factory.load_config(FLAGS.lm_config)
  try:
    shared, variants = compare.choose(base, path, only, folder=os.path.dirname(path))
  except factory.ConfigError as e:
    raise app.UsageError(f'--lm: {e}') from None
  # a warm-started variant's step is its method's (it differs in where it begins): left out
  names = [n for n in variants if not compare.variant_config(shared, variants, n).init_from]
  runs, found, steps, title = {}, {}, FLAGS.lm_steps, ''
  for name in names:
    config = compare.variant_config(shared, variants, name)
    config.progress = False
    with tempfile.TemporaryDirectory() as tmp:
      exp = factory.build(config, tmp)
    ds, workers = exp.dataset, exp.workers
    per = config.batch_size // workers.count
    idx = data.worker_indices(
      0, seed=0, num_examples=len(ds.train), workers=workers.count, per_worker=per
    )
    x, y = (jax.device_put(a, workers.sharding) for a in ds.inputs(ds.train, idx))
    init = step_lib.make_init(exp.model, exp.tx, workers, ds.input_shape, exp.way, ds.input_dtype)
    box = [init(jax.random.key(0)), None]
    jitted = step_lib.make_train_step(exp.model, exp.tx, workers, per_worker=exp.way)
    train_step, seconds, memory, _ = _compile(jitted, (box[0], x, y))

    def run(train_step=train_step, box=box, x=x, y=y):
      for _ in range(steps):
        box[0], box[1] = train_step(box[0], x, y)
      jax.block_until_ready(box[1])

    runs[name] = run
    found[name] = {
      'variant': name,
      'method': config.sync.method,
      'compile': f'{seconds:.2f}',
      'memory': report.human_bytes(memory) if memory is not None else '-',
      'tokens': config.batch_size * ds.tokens_per_example,
    }
    n = sum(int(np.prod(p.shape[1:])) for p in jax.tree.leaves(box[0].params))
    title = (
      f'language model: {config.model.name} {config.model.size} ({n:,} parameters), '
      f'{workers.count} workers on {workers.devices} device(s), '
      f'{config.batch_size} x {ds.tokens_per_example} tokens per step, windows of {steps} steps'
    )
    print(f'{title}: {name} compiled in {seconds:.1f} s', flush=True)
  window_s = _windows(runs)
  first = window_s[names[0]]
  rows = []
  for name in names:
    row = found[name]
    ms = 1e3 * window_s[name] / steps
    trainer = _trainer_step_s(compare.variant_config(shared, variants, name))
    rows.append(row | {
      'ms_text': f'{ms:.2f}',
      'ratio_text': f'{window_s[name] / first:.3f}',
      'tokens_text': f'{row["tokens"] / (ms / 1e3):,.0f}',
      'trainer_text': '-' if trainer is None else f'{1e3 * trainer:.2f}',
      'trainer_ratio': '-' if trainer is None else f'{1e3 * trainer / ms:.2f}',
    })  # fmt: skip
  return title, rows


def _trainer_step_s(config) -> float | None:
  """The median step of the library's trainer running `config` (`--lm_trainer_steps` steps,
  the first 3 and the evaluating ones left out; no gradient-noise pass), or None."""
  import statistics
  import tempfile

  from jaxdist.train import metrics, trainer

  if not FLAGS.lm_trainer_steps:
    return None
  config.steps = FLAGS.lm_trainer_steps
  config.eval_every = config.checkpoint_every = config.steps
  config.noise_every, config.progress = 0, False
  with tempfile.TemporaryDirectory() as tmp:
    trainer.train_and_evaluate(config, tmp)
    records = metrics.read_jsonl(os.path.join(tmp, 'metrics.jsonl'))
  times = [r['step_s'] for r in records[3:] if r.get('step_s') and r.get('test_loss') is None]
  return statistics.median(times) if times else None


def _report(tables: list[tuple[str, str, list[dict], list]]) -> None:
  """Prints the tables ((name, title, rows, columns)) and writes them to `--results` if given.

  On the terminal the layout table follows the header line, which is its
  title; in the results file every table follows its title.
  """
  from jaxdist.train import report

  for name, title, rows, columns in tables:
    if name != 'layouts':
      print(f'\n{title}')
    print(report.table(rows, columns))
  if FLAGS.results:
    import sys

    command = ' '.join(['python', 'experiments/bench_step.py', *sys.argv[1:]])
    parts = [report.provenance(command)]
    for _, title, rows, columns in tables:
      parts += [title + ':', report.markdown(rows, columns)]
    with open(FLAGS.results, 'w') as f:
      f.write('\n\n'.join(parts) + '\n')
    print(f'results: {FLAGS.results}')


def main(argv):
  del argv
  import jax

  from jaxdist import runtime

  runtime.cpu_devices(FLAGS.cpu_devices)
  import numpy as np

  import jaxdist as jd

  shape = tuple(int(d) for d in FLAGS.image)
  batch = FLAGS.batch
  model = jd.models.get(FLAGS.model, num_classes=10)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((batch, *shape), dtype=np.float32)
  y = rng.integers(0, 10, batch).astype(np.int32)
  n_dev = len(jax.devices())
  platform = jax.devices()[0].platform
  title = f'{FLAGS.model}, input {shape}, global batch {batch}, {n_dev} {platform} device(s)'
  print(title)
  sharded_devices = min(8, n_dev)

  layouts = _Layouts(model, shape, x, y)
  if FLAGS.scaling:
    layouts.baseline()  # the scaling table, too, compares with the single device
  table = _layout_rows(layouts, n_dev) if FLAGS.layouts else []
  scaling = _scaling_rows(layouts, n_dev)
  layouts.time()
  overhead_title, overhead = _overhead(x, y, shape) if FLAGS.overhead_params else ('', [])
  lm_title, lm = _lm_table() if FLAGS.lm else ('', [])

  columns = _layout_columns(sharded_devices)
  tables = []
  if FLAGS.layouts:
    tables.append(('layouts', title, layouts.fmt(table, sharded_devices), columns))
  if scaling:
    scaling_title = f'scaling: workers on {min(n_dev, 8)} device(s), global batch {batch}'
    tables.append(('scaling', scaling_title, layouts.fmt(scaling, sharded_devices), columns[1:]))
  if overhead:
    tables.append(('overhead', overhead_title, _fmt_overhead(overhead), OVERHEAD_COLUMNS))
  if lm:
    tables.append(('lm', lm_title, lm, LM_COLUMNS))
  _report(tables)


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
