r"""Trains several variants of one config and compares them in one table and plot.

Each variant (named in the config's `variants`, chosen by its `compare` field
or --only) trains into workdir/<name>. The table gives test accuracy, bytes
per worker per step, and modelled time to the first variant's final accuracy
on each network profile; `compare.png` plots accuracy against modelled time.

  python experiments/compare.py --config=configs/digits.py --workdir=/tmp/cmp
  python experiments/compare.py --config=configs/digits.py --workdir=/tmp/cmp \
      --only=dense,topk1_ef,topk1_noef,qsgd8
  python experiments/compare.py --config=configs/digits.py --workdir=/tmp/cmp \
      --only=dense,topk1_ef --results=experiments/results/compression.md
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from jaxdist.train import cli

config_flags.DEFINE_config_file('config', None, 'Base config, e.g. configs/digits.py.')
flags.DEFINE_string('workdir', None, 'Directory; each variant trains in a subdirectory.')
flags.DEFINE_list('only', None, "Variants to train (default: the config's `compare`).")
flags.DEFINE_string('results', None, 'Also write the markdown table here (e.g. for the README).')
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

  names = FLAGS.only or [n.strip() for n in FLAGS.config.compare.split(',') if n.strip()]
  command = ' '.join(['python', *sys.argv])
  cli.run(
    compare.run, FLAGS.config, FLAGS.workdir, names, FLAGS.results, command, fresh=FLAGS.fresh
  )


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
