r"""Trains several variants of one config and compares them in two tables and a plot.

The variants come from a variants file (configs/variants/<group>.py: its
`VARIANTS`, and `SETTINGS` the group shares); each trains into
workdir/<name>. The per-run table gives each variant's test accuracy and
modelled time to the first variant's final accuracy (the target) on each
network profile, the per-step table its bytes per worker and step times;
`compare.png` plots accuracy against modelled time, with the target. The config is
the file's settings, then the command line's `--config.*`, then each
variant's overrides.

  python experiments/compare.py --config=configs/digits.py --workdir=/tmp/cmp
  python experiments/compare.py --config=configs/digits.py --workdir=/tmp/cmp \
      --only=dense,topk1_ef,topk1_noef,qsgd8
  python experiments/compare.py --config=configs/digits.py --workdir=/tmp/cmp \
      --variants=configs/variants/compression.py --results=experiments/results/compression.md
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from jaxdist.train import cli, columns

__doc__ += '\n' + columns.help_text()

VARIANTS_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'variants'
)

config_flags.DEFINE_config_file('config', None, 'Base config, e.g. configs/digits.py.')
flags.DEFINE_string('workdir', None, 'Directory; each variant trains in a subdirectory.')
flags.DEFINE_string(
  'variants',
  os.path.join(VARIANTS_DIR, 'default.py'),
  'Variants file: its settings and, without --only, its variants (default: what `make run` '
  'compares).',
)
flags.DEFINE_list(
  'only', None, 'Variants to train, by name: any in configs/variants/ (default: the whole file).'
)
flags.DEFINE_string('results', None, 'Also write the markdown table here (e.g. for the docs).')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_bool(
  'fresh', False, "Start afresh: delete the variants' runs in --workdir instead of resuming them."
)
flags.mark_flags_as_required(['config', 'workdir'])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup(FLAGS.cpu_devices)
  from jaxdist.train import compare

  keep = config_flags.get_override_values(FLAGS['config'])
  base, variants = cli.run(
    compare.choose, FLAGS.config, FLAGS.variants, FLAGS.only, folder=VARIANTS_DIR, keep=keep
  )
  command = ' '.join(['python', *sys.argv])
  cli.run(compare.run, base, FLAGS.workdir, variants, FLAGS.results, command, fresh=FLAGS.fresh)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
