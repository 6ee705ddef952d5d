r"""Samples/s of the sharded data-parallel step against a plain single-device jit.

Every row trains the same model on the same global batch with plain SGD; only
where the workers live changes: one device and no workers (the baseline), 8
workers on 8 devices, and 8, 16 and 64 workers simulated with `vmap`, either
all on one device or spread over the devices. Measured side by side in one
run; each figure is the median of `--repeats` timed windows of `--steps` steps
after a warm-up.

  python experiments/bench_step.py                       # CNN, digits-sized input
  python experiments/bench_step.py --model=resnet20 --image=32,32,3 --batch=256
"""

import statistics
import time

from absl import app, flags

flags.DEFINE_string('model', 'cnn', 'Model name (mlp, cnn, resnet20).')
flags.DEFINE_list('image', ['8', '8', '1'], 'Input shape H,W,C.')
flags.DEFINE_integer('batch', 512, 'Global batch (divisible by 64).')
flags.DEFINE_integer('steps', 20, 'Steps per timed window.')
flags.DEFINE_integer('repeats', 5, 'Timed windows; the median is reported.')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_list('workers', ['8', '16', '64'], 'Simulated worker counts.')
FLAGS = flags.FLAGS


def _time(run_steps) -> float:
  run_steps()  # compile and warm up
  windows = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    run_steps()
    windows.append(time.perf_counter() - start)
  return FLAGS.steps * FLAGS.batch / statistics.median(windows)


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

  rows = []
  # Baseline: a plain jit of the whole global batch on one device.
  tx = optax.sgd(0.01)
  params, model_state = step_lib.init_params(model, jax.random.key(0), shape)
  carry = [params, model_state, tx.init(params)]
  reference = step_lib.make_reference_step(model, tx)
  xd, yd = jax.device_put(x), jax.device_put(y)

  def run_reference():
    for _ in range(FLAGS.steps):
      carry[0], carry[1], carry[2], loss = reference(*carry, xd, yd)
    jax.block_until_ready(loss)

  baseline = _time(run_reference)
  rows.append(
    {'layout': 'single device, plain jit', 'workers': 1, 'devices': 1, 'sim': '-', 'sps': baseline}
  )

  layouts = [(8, min(8, n_dev))]
  for w in (int(w) for w in FLAGS.workers):
    layouts += [(w, 1), (w, min(n_dev, w))]
  seen = set()
  for count, devices in layouts:
    if (count, devices) in seen or batch % count:
      continue
    seen.add((count, devices))
    workers = jd.runtime.layout(count, devices=devices)
    tx = optax.chain(jd.sync.allreduce(axis_name=workers.axis_name), optax.sgd(0.01))
    box = [step_lib.make_init(model, tx, workers, shape)(jax.random.key(0))]
    train_step = step_lib.make_train_step(model, tx, workers)
    xw = jax.device_put(x.reshape(count, batch // count, *shape), workers.sharding)
    yw = jax.device_put(y.reshape(count, batch // count), workers.sharding)

    def run_workers(box=box, train_step=train_step, xw=xw, yw=yw):
      for _ in range(FLAGS.steps):
        box[0], metrics = train_step(box[0], xw, yw)
      jax.block_until_ready(metrics)

    sps = _time(run_workers)
    kind = 'sharded' if workers.per_device == 1 else 'simulated'
    rows.append(
      {
        'layout': f'{kind}, allreduce',
        'workers': count,
        'devices': workers.devices,
        'sim': workers.per_device,
        'sps': sps,
      }
    )
  for r in rows:
    r['ratio'] = f'{r["sps"] / baseline:.2f}x'
    r['sps'] = f'{r["sps"]:,.0f}'
  print(
    report.table(
      rows,
      [
        ('layout', 'layout'),
        ('workers', 'workers'),
        ('devices', 'devices'),
        ('sim', 'sim/device'),
        ('sps', 'samples/s'),
        ('ratio', 'vs single device'),
      ],
    )
  )


if __name__ == '__main__':
  app.run(main)
