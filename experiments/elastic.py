r"""Elastic restore: a run of N workers continues on M, against the run that never stopped.

For each variant, the uninterrupted run trains on `--workers` (checkpoints
every `--resume_at` steps, all kept); then a copy of its work directory cut
back to the checkpoint at `--resume_at` continues to the end on each of
`--to` workers (`jaxdist.train.elastic` reshards the state: replicated
state kept, local models, optimizer states and error-feedback memories
averaged). The global batch and the learning-rate schedule are the same, so
the question is only what resharding costs. The table gives each run's
final test accuracy, its difference from the uninterrupted run in
percentage points, and how far the run's own test accuracy moved between
its evaluations after the resume step (the noise the difference sits in).
Run again in the same work directory, it re-reads the finished runs (--fresh:
trains them all again).

  python experiments/elastic.py --config=configs/digits.py --workdir=/tmp/elastic
  python experiments/elastic.py --config=configs/digits.py --workdir=/tmp/elastic \
      --variants=configs/variants/elastic.py --only=dense,local4 --to=4,16 \
      --results=experiments/results/elastic.md
"""

import os
import shutil
import sys
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from jaxdist.train import cli, columns
from jaxdist.train.columns import Column

__doc__ += '\n' + columns.help_text()

VARIANTS_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'variants'
)

config_flags.DEFINE_config_file('config', None, 'Base config, e.g. configs/digits.py.')
flags.DEFINE_string('workdir', None, 'Directory; each run trains in a subdirectory.')
flags.DEFINE_string(
  'variants',
  os.path.join(VARIANTS_DIR, 'elastic.py'),
  'Variants file (configs/variants/<group>.py): its settings and, without --only, its variants.',
)
flags.DEFINE_list(
  'only', None, 'Variants to train, by name: any in configs/variants/ (default: the whole file).'
)
flags.DEFINE_integer('workers', 8, 'Workers of the uninterrupted run (N).')
flags.DEFINE_list('to', ['4', '16'], 'Workers the run continues on (M).')
flags.DEFINE_integer('resume_at', None, 'Step the run continues from (default: half the steps).')
flags.DEFINE_string('results', None, 'Also write the markdown table here.')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_bool('fresh', False, 'Train every run afresh, deleting those in --workdir.')
flags.mark_flags_as_required(['config', 'workdir'])
cli.integers('to')
FLAGS = flags.FLAGS

COLUMNS = (
  Column('variant', 'variant'),
  Column('sync', 'sync'),
  Column('workers', 'workers'),
  Column('test_accuracy', 'test acc'),
  Column('delta_pp', 'Δ vs uninterrupted (pp)'),
  Column('spread_pp', 'test acc range after the resume step (pp)'),
  Column('test_loss', 'test loss'),
  Column('final_loss', 'train loss (last step)'),
)


def cut_back(source: str, target: str, step: int) -> None:
  """A copy of work directory `source` whose checkpoints end at `step`."""
  keep = str(step)
  ignore = lambda d, names: [
    n for n in names if os.path.basename(d) == 'checkpoints' and n.isdigit() and int(n) > step
  ]
  shutil.copytree(source, target, ignore=ignore)
  if not os.path.isdir(os.path.join(target, 'checkpoints', keep)):
    raise ValueError(f'{source} has no checkpoint at step {step}')


def runs_of(config, name: str, resume_at: int) -> list[tuple[str, str, Any]]:
  """(label, workdir, config) of variant `name`'s uninterrupted run, then of each resumed one."""
  config.progress = False
  config.workers = FLAGS.workers
  config.checkpoint_every = resume_at
  config.keep_checkpoints = -(-config.steps // resume_at) + 1
  runs = [(f'{FLAGS.workers}', os.path.join(FLAGS.workdir, name, f'{FLAGS.workers}'), config)]
  for m in map(int, FLAGS.to):
    c = config.copy_and_resolve_references()
    c.workers = m
    resumed = os.path.join(FLAGS.workdir, name, f'{FLAGS.workers}to{m}')
    runs.append((f'{FLAGS.workers} → {m} at step {resume_at}', resumed, c))
  return runs


def main(argv):
  del argv
  cli.setup(FLAGS.cpu_devices)
  from jaxdist.train import compare, factory, metrics, report, resume, trainer

  keep = config_flags.get_override_values(FLAGS['config'])
  base, variants = cli.run(
    compare.choose, FLAGS.config, FLAGS.variants, FLAGS.only, folder=VARIANTS_DIR, keep=keep
  )
  resume_at = FLAGS.resume_at or base.steps // 2
  rows = []
  plans = {
    name: runs_of(cli.run(compare.variant_config, base, variants, name), name, resume_at)
    for name in variants
  }
  for runs in plans.values():  # every run that exists may go on with its config
    for _, workdir, c in runs if not FLAGS.fresh else []:
      cli.run(resume.check_resume, factory.record(c), workdir)
  for name, runs in plans.items():
    straight, first = runs[0][1], None
    for label, workdir, c in runs:
      print(f'\n=== {name}: {label}', flush=True)
      if workdir != straight and (FLAGS.fresh or not os.path.exists(workdir)):
        shutil.rmtree(workdir, ignore_errors=True)
        cut_back(straight, workdir, resume_at)
      fresh = FLAGS.fresh and workdir == straight
      summary = cli.run(trainer.train_and_evaluate, c, workdir, fresh=fresh)
      records = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
      first = summary['test_accuracy'] if first is None else first
      later = [
        r['test_accuracy'] for r in records if 'test_accuracy' in r and r['step'] > resume_at
      ]
      rows.append({
        'variant': name, 'sync': c.sync.method, 'workers': label,
        'test_accuracy': summary['test_accuracy'],
        'delta_pp': 100 * (summary['test_accuracy'] - first),
        'spread_pp': 100 * (max(later) - min(later)),
        'test_loss': summary['test_loss'], 'final_loss': records[-1]['loss'],
      })  # fmt: skip
  print(f'\n{report.table(rows, COLUMNS)}\n\nColumns:\n{columns.legend(COLUMNS)}')
  if FLAGS.results:
    command = ' '.join(['python', *sys.argv])
    note = (
      f'{base.dataset.name} {base.model.name}, global batch {base.batch_size}, {base.steps} '
      f"steps; the resumed runs continue from the uninterrupted run's checkpoint at step "
      f'{resume_at}; test accuracy every {base.eval_every} steps.'
    )
    with open(FLAGS.results, 'w') as f:
      f.write(f'{report.provenance(command)}\n\n{note}\n\n{report.markdown(rows, COLUMNS)}\n')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
