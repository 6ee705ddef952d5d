r"""Samples/s of the sharded data-parallel step against a plain single-device jit.

Every row trains the same model on the same global batch with plain SGD; only
where the workers live changes: one device and no workers (the baseline), 8
workers on 8 devices, and workers simulated beyond the devices, all on one
device or spread over all of them. Simulated workers compute their gradients
each way of `make_train_step(per_worker=...)` (`--per_worker`), side by side in
one run:

  vmap  together, as the step did at the start of issue 14: per-worker weights
        make every convolution a grouped one.
  loop  one after the other (`lax.map`), dense convolutions; on the CPU with
        the convolutions in Eigen's layout and the sums over workers written
        as dots. What `'auto'` picks on the CPU.

Each figure is the median of `--repeats` timed windows of `--steps` steps after
a warm-up, the windows of all rows taken in turns so that a change in the
machine's load touches every row alike. Compile time is that of
`lower(...).compile()`; memory is XLA's `compiled.memory_analysis()` of the
program one device runs: arguments + outputs - donated + temporaries, and the
temporaries (activations) alone.

The second table is the scaling of the step with the number of workers on all
devices (`--scaling`).

  python experiments/bench_step.py                       # CNN, digits-sized input
  python experiments/bench_step.py --model=resnet20 --image=32,32,3 --batch=256 \
      --steps=2 --repeats=3
"""

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
flags.DEFINE_string('results', None, 'Also write the tables as markdown here, with the command.')
FLAGS = flags.FLAGS


def _time_together(runs: dict) -> dict:
  """Samples/s of each `runs[key]()` (one window of steps), timed in turns."""
  for run in runs.values():
    run()
  windows = {key: [] for key in runs}
  for _ in range(FLAGS.repeats):
    for key, run in runs.items():
      start = time.perf_counter()
      run()
      windows[key].append(time.perf_counter() - start)
  return {key: FLAGS.steps * FLAGS.batch / statistics.median(w) for key, w in windows.items()}


def _compile(jitted, args):
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  seconds = time.perf_counter() - start
  m = compiled.memory_analysis()
  if m is None:
    return compiled, seconds, None, None
  total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  return compiled, seconds, total + m.temp_size_in_bytes, m.temp_size_in_bytes


def main(argv):
  del argv
  import jax

  jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  import numpy as np
  import optax

  import jaxdist as jd
  from jaxdist.train import report
  from jaxdist.train import step as step_lib

  shape = tuple(int(d) for d in FLAGS.image)
  batch = FLAGS.batch
  model = jd.models.get(FLAGS.model, num_classes=10)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((batch, *shape), dtype=np.float32)
  y = rng.integers(0, 10, batch).astype(np.int32)
  n_dev = len(jax.devices())
  platform = jax.devices()[0].platform
  print(f'{FLAGS.model}, input {shape}, global batch {batch}, {n_dev} {platform} device(s)')
  sharded_devices = min(8, n_dev)

  measured, runs = {}, {}

  def baseline():
    tx = optax.sgd(0.01)
    params, model_state = step_lib.init_params(model, jax.random.key(0), shape)
    carry = [params, model_state, tx.init(params)]
    xd, yd = jax.device_put(x), jax.device_put(y)
    reference, seconds, memory, temp = _compile(
      step_lib.make_reference_step(model, tx), (*carry, xd, yd)
    )

    def run():
      for _ in range(FLAGS.steps):
        carry[0], carry[1], carry[2], loss = reference(*carry, xd, yd)
      jax.block_until_ready(loss)

    measured['baseline'] = {
      'layout': 'single device, plain jit',
      'workers': 1,
      'devices': 1,
      'sim': '-',
      'per_worker': '-',
      'compile': seconds,
      'memory': memory,
      'temp': temp,
    }
    runs['baseline'] = run
    return measured['baseline']

  def workers_row(count, devices, per_worker):
    if count == devices:
      per_worker = 'vmap'  # one worker per device: one dense program either way
    key = (count, devices, per_worker)
    if key in measured:
      return measured[key]
    workers = jd.runtime.layout(count, devices=devices)
    tx = optax.chain(jd.sync.allreduce(axis_name=workers.axis_name), optax.sgd(0.01))
    box = [step_lib.make_init(model, tx, workers, shape)(jax.random.key(0))]
    xw = jax.device_put(x.reshape(count, batch // count, *shape), workers.sharding)
    yw = jax.device_put(y.reshape(count, batch // count), workers.sharding)
    jitted = step_lib.make_train_step(model, tx, workers, per_worker=per_worker)
    train_step, seconds, memory, temp = _compile(jitted, (box[0], xw, yw))

    def run():
      for _ in range(FLAGS.steps):
        box[0], metrics = train_step(box[0], xw, yw)
      jax.block_until_ready(metrics)

    kind = 'sharded' if workers.per_device == 1 else 'simulated'
    measured[key] = {
      'layout': f'{kind}, allreduce',
      'workers': count,
      'devices': workers.devices,
      'sim': workers.per_device,
      'per_worker': per_worker,
      'compile': seconds,
      'memory': memory,
      'temp': temp,
    }
    runs[key] = run
    return measured[key]

  def rows_for(count, devices):
    if batch % count or count % devices:
      return []
    rows = [workers_row(count, devices, v) for v in FLAGS.per_worker]
    return list({id(r): r for r in rows}.values())

  table = [baseline()]
  table += rows_for(8, sharded_devices)
  for w in (int(w) for w in FLAGS.workers):
    table += rows_for(w, 1) + rows_for(w, min(n_dev, w))
  table = list({id(r): r for r in table}.values())
  scaling = []
  for w in (int(w) for w in FLAGS.scaling):
    scaling += rows_for(w, min(n_dev, w))

  for key, sps in _time_together(runs).items():
    measured[key]['sps'] = sps

  def fmt(rows):
    out = []
    for r in rows:
      base = measured['baseline']
      sharded = measured.get((8, sharded_devices, 'vmap'))
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

  columns = [
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
  title = f'{FLAGS.model}, input {shape}, global batch {batch}, {n_dev} {platform} device(s)'
  print(report.table(fmt(table), columns))
  scaling_title = f'scaling: workers on {min(n_dev, 8)} device(s), global batch {batch}'
  if scaling:
    print(f'\n{scaling_title}')
    print(report.table(fmt(scaling), columns[1:]))
  if FLAGS.results:
    import sys

    command = ' '.join(['python', 'experiments/bench_step.py', *sys.argv[1:]])
    parts = [report.provenance(command), title + ':', report.markdown(fmt(table), columns)]
    if scaling:
      parts += [scaling_title + ':', report.markdown(fmt(scaling), columns[1:])]
    with open(FLAGS.results, 'w') as f:
      f.write('\n\n'.join(parts) + '\n')
    print(f'results: {FLAGS.results}')


if __name__ == '__main__':
  app.run(main)
