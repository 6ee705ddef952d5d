r"""Trains and evaluates a data-parallel model as a config file says.

  python experiments/train.py --config=configs/digits.py --workdir=/tmp/digits
  python experiments/train.py --config=configs/digits.py:runlocal --workdir=/tmp/d \
      --config.sync.method=compressed_allreduce --config.compress.name=topk \
      --config.workers=16

Multi-process (one command per process; on a cluster, `--distributed` alone
lets JAX find its peers):

  python experiments/train.py ... --coordinator_address=127.0.0.1:12345 \
      --num_processes=2 --process_id=0 --cpu_devices=4
"""

from absl import app, flags
from ml_collections import config_flags

from jaxdist.train import cli, columns

__doc__ += '\n' + columns.help_text()

config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/digits.py:runlocal.')
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and plots.')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_bool(
  'fresh', False, 'Start afresh: delete the run in --workdir instead of resuming it.'
)
flags.DEFINE_bool('distributed', False, 'Start the multi-process runtime, detecting the cluster.')
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (multi-process runs).')
flags.DEFINE_integer('num_processes', None, 'Number of processes (multi-process runs).')
flags.DEFINE_integer('process_id', None, 'Index of this process (multi-process runs).')
flags.DEFINE_integer(
  'heartbeat_timeout_s', 30, 'Seconds without a heartbeat before a dead peer ends the survivors.'
)
flags.mark_flags_as_required(['config', 'workdir'])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup(FLAGS.cpu_devices)
  from jaxdist import runtime, train

  if FLAGS.coordinator_address or FLAGS.distributed:
    runtime.initialize_distributed(
      FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, FLAGS.heartbeat_timeout_s
    )
  cli.run(train.train_and_evaluate, FLAGS.config, FLAGS.workdir, fresh=FLAGS.fresh, tables=True)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
