r"""What one worker's step costs at each count of examples it trains: masked, and micro-batched.

Dynamic batching on real hosts (`config.dynamic_batching.micro_batch`,
`jaxdist.train.micro`) gives every worker the same static batch of `--held`
examples and a count of its own: masked (`micro_batch=0`), the step computes
all it holds and the loss weighs only the first `count`; micro-batched, it
runs only the ⌈count / m⌉ micro-batches of m examples that hold them (one
micro-batch is a `lax.cond`, several a `while_loop`), so a slow worker given
few examples computes few. This times the train step (forward, backward, the
optimizer: AdamW behind the count-weighted all-reduce, one worker) at each
count, for each micro-batch size, on the first device, and prints the median
step and its ratio to the masked step at the full count. On a GPU the
question is what a micro-batch costs beside its share of the compute (a
trip of the loop, smaller matrices); `count = 0` is a worker that sits out
(heterogeneity-aware DiLoCo's window), whose step should cost almost nothing.

Needs only jax, flax and optax (the model is jaxdist's GPT on random tokens,
or its CNN on random images): it runs where jaxdist's other dependencies are
not installed, e.g. on a GPU machine from the source tree (`PYTHONPATH=.`).

  python experiments/bench_micro.py --model=gpt --size=small --held=64 --micro=0,8,16,32 \
      --json=micro_gpu.json   # on the GPU machine, then here:
  python experiments/bench_micro.py --from_json=micro_gpu.json \
      --results=experiments/results/micro_gpu.md
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

flags.DEFINE_enum('model', 'gpt', ['gpt', 'cnn'], "jaxdist's GPT (text) or CNN (images).")
flags.DEFINE_string('size', 'tiny', "The GPT's size (jaxdist.models.transformer's SIZES).")
flags.DEFINE_integer('context', 256, "The GPT's window, in tokens.")
flags.DEFINE_integer('held', 64, 'Examples the worker holds a step (the static batch, b_max).')
flags.DEFINE_list('micro', ['0', '8', '16', '32'], 'Micro-batch sizes (0: masked).')
flags.DEFINE_list('counts', None, 'Counts to time (default: 0, 1, each micro, held / 2, held).')
flags.DEFINE_integer('repeats', 20, 'Timed steps per point (after one to compile).')
flags.DEFINE_string('json', None, 'JSON file for the measurement (needs nothing beyond jax).')
flags.DEFINE_string('from_json', None, 'Write --results from this JSON instead of measuring.')
flags.DEFINE_string('results', None, 'Markdown file for the table (imports jaxdist.train.report).')
FLAGS = flags.FLAGS


def build(model_name: str, size: str, context: int, held: int):
  """(model, tx, layout, x, y) for one worker on the first device, random data."""
  import jax
  import optax

  from jaxdist import models, runtime, sync

  layout = runtime.layout(1, devices=1, device_list=jax.devices()[:1])
  rng = np.random.default_rng(0)
  if model_name == 'gpt':
    model = models.get('gpt', num_classes=65, size=size)
    x = rng.integers(0, 65, (1, held, context), dtype=np.int32)
    y = rng.integers(0, 65, (1, held, context), dtype=np.int32)
    shape, dtype = (context,), np.int32
  else:
    model = models.get('cnn', num_classes=10)
    x = rng.normal(size=(1, held, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, 10, (1, held), dtype=np.int32)
    shape, dtype = (28, 28, 1), np.float32
  tx = optax.chain(sync.weighted_allreduce(axis_name=layout.axis_name), optax.adamw(1e-3))
  put = lambda a: jax.device_put(a, layout.sharding)
  return model, tx, layout, put(x), put(y), shape, dtype


def time_step(train_step, state, x, y, counts, repeats: int) -> tuple[float, object]:
  """Median seconds of `repeats` steps at `counts` (after one that compiles); the state."""
  import jax

  state, m = train_step(state, x, y, counts)
  jax.block_until_ready(m)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, m = train_step(state, x, y, counts)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - start)
  return float(np.median(times)), state


def measure(micro: list[int], counts: list[int], held: int, repeats: int) -> list[dict]:
  """Per micro-batch size and count, the median step (ms) and its ratio to masked at `held`."""
  import jax

  from jaxdist.train import step as step_lib

  model, tx, layout, x, y, shape, dtype = build(FLAGS.model, FLAGS.size, FLAGS.context, held)
  init = step_lib.make_init(model, tx, layout, shape, 'auto', input_dtype=dtype)
  rows = []
  for m in micro:
    train_step = step_lib.make_train_step(
      model, tx, layout, counted=True, micro_batch=m, replicated=False
    )
    state = init(jax.random.key(0))
    for c in counts:
      counts_w = jax.device_put(np.full(1, c, np.int32), layout.sharding)
      seconds, state = time_step(train_step, state, x, y, counts_w, repeats)
      rows.append({'micro': m or 'masked', 'count': c, 'trips': -(-c // m) if m else 'all',
                   'ms': 1e3 * seconds})  # fmt: skip
      print(f'micro {m or "masked":>6}  count {c:>5}  {1e3 * seconds:9.3f} ms', flush=True)
  full = next(r['ms'] for r in rows if r['micro'] == 'masked' and r['count'] == held)
  for r in rows:
    r['versus'] = r['ms'] / full
  return rows


COLUMNS = [('micro', 'micro-batch'), ('count', 'count'), ('trips', 'micro-batches run'),
           ('ms', 'median step ms'), ('versus', 'vs masked at the full batch')]  # fmt: skip


def run() -> dict:
  """Measures as the flags say: the command, machine, date, the table's title and its rows."""
  import datetime

  import jax

  held, micro = FLAGS.held, [int(m) for m in FLAGS.micro]
  if 0 not in micro:
    micro = [0, *micro]  # the reference: masked
  for m in micro:
    if m < 0 or (m and held % m):
      raise app.UsageError(f'--micro: {m} must divide --held={held}')
  counts = sorted({int(c) for c in FLAGS.counts} if FLAGS.counts else
                  {0, 1, held // 2, held, *(m for m in micro if 0 < m <= held)})  # fmt: skip
  if any(not 0 <= c <= held for c in counts) or held not in counts:
    raise app.UsageError(f'--counts must lie in [0, --held={held}] and include {held}')
  rows = measure(micro, counts, held, FLAGS.repeats)
  device = jax.devices()[0]
  model = f'{FLAGS.model} {FLAGS.size}, {FLAGS.context}-token windows' if FLAGS.model == 'gpt' \
    else FLAGS.model  # fmt: skip
  return {
    'command': ' '.join(['python', 'experiments/bench_micro.py', *sys.argv[1:]]),
    'machine': f'{platform.machine()} {os.cpu_count()} cores, {device.device_kind}',
    'date': datetime.date.today().isoformat(),
    'title': f"One worker's train step ({model}; AdamW behind the count-weighted all-reduce), "
             f'{held} examples held, on {device.device_kind} ({device.platform}); jax '
             f'{jax.__version__}, Python {platform.python_version()}; median of '
             f'{FLAGS.repeats} steps',
    'rows': rows,
  }  # fmt: skip


def write(found: dict, path: str) -> None:
  """The markdown results file of a measurement (`run`'s dict)."""
  from jaxdist.train import report

  command = re.sub(r'--json=\S*/', '--json=', found['command'])  # the other machine's folder
  made = f'Command: `{command}`; machine: {found["machine"]}; date: {found["date"]}.'
  with open(path, 'w') as f:
    f.write('\n\n'.join([made, f'{found["title"]}.', report.markdown(found['rows'], COLUMNS)]))
    f.write('\n')


def main(argv):
  del argv
  if FLAGS.from_json:
    with open(FLAGS.from_json) as f:
      found = json.load(f)
  else:
    found = run()
    if FLAGS.json:
      with open(FLAGS.json, 'w') as f:
        json.dump(found, f, indent=1)
  if FLAGS.results:
    write(found, FLAGS.results)
    print(f'results: {FLAGS.results}')


if __name__ == '__main__':
  app.run(main)
