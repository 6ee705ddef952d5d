r"""jaxdist's side of the PyTorch DDP comparison (../shared/peers/side_by_side.sh), in today's keys.

The same work as the peers' script: the digits CNN (151,306 parameters) with
8 workers on 8 CPU devices, global batch 128, SGD lr 0.05 momentum 0.9 (no
Nesterov, no weight decay), constant schedule, 300 steps; dense all-reduce,
PowerSGD rank 2, and local SGD period 4 after 10 dense steps. Prints one
table (median step, ratio to dense, test accuracy, payload) and, with
--out, appends one JSON line per method in the peers' format.

  python experiments/bench_peers.py --workdir=/tmp/peers
  python experiments/bench_peers.py --workdir=/tmp/peers --out=side_by_side.jsonl
"""

import json
import os

from absl import app, flags

flags.DEFINE_string('workdir', None, 'Directory; each method trains in a subdirectory.')
flags.DEFINE_string('out', None, "Append the peers' JSON lines here.")
flags.DEFINE_integer('steps', 300, 'Training steps (the peers: 300).')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.mark_flags_as_required(['workdir'])
FLAGS = flags.FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ('dense', 'powersgd2', 'local4')
# the settings of side_by_side.sh, as overrides of configs/digits.py
SETTINGS = {
  'optimizer.learning_rate': 0.05,
  'optimizer.nesterov': False,
  'optimizer.schedule': 'constant',
  'optimizer.weight_decay': 0.0,
  'optimizer.warmup_steps': 0,
  'sync.local_sgd.warmup_steps': 10,  # was --config.sync.local_warmup=10
  'progress': False,
}


def main(argv):
  del argv
  from jaxdist.train import cli

  cli.setup(FLAGS.cpu_devices)
  from jaxdist.train import compare, factory, report

  config = factory.load_config(
    os.path.join(REPO, 'configs', 'digits.py'), steps=FLAGS.steps, **SETTINGS
  )
  cli.run(compare.run, config, FLAGS.workdir, METHODS)
  summaries = {}
  for name in METHODS:
    with open(os.path.join(FLAGS.workdir, name, 'summary.json')) as f:
      summaries[name] = json.load(f)
  dense_ms = 1000 * summaries['dense']['median_step_s']
  table = []
  for name, s in summaries.items():
    ms = 1000 * s['median_step_s']
    table.append({
      'method': name, 'median_step_ms': ms, 'ratio': ms / dense_ms,
      'test_accuracy': s['test_accuracy'], 'payload': s['payload_bytes_per_step'],
    })  # fmt: skip
  columns = (
    ('method', 'method'),
    ('median_step_ms', 'median step ms (8 workers)'),
    ('ratio', '÷ dense'),
    ('test_accuracy', 'test acc'),
    ('payload', 'payload B/worker/step'),
  )
  print('\njaxdist, the work of ../shared/peers/side_by_side.sh:\n')
  print(report.table(table, columns))
  if FLAGS.out:
    with open(FLAGS.out, 'a') as f:
      for name, s in summaries.items():
        line = {
          'system': 'jaxdist', 'hook': name, 'world_size': s['workers'],
          'median_step_ms': round(1000 * s['median_step_s'], 3),
          'test_acc': round(s['test_accuracy'], 4), 'payload_bytes': s['payload_bytes_per_step'],
          'tag': 'side_by_side',
        }  # fmt: skip
        f.write(json.dumps(line) + '\n')


if __name__ == '__main__':
  app.run(main)
