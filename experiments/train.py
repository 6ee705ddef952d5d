r"""Trains and evaluates a data-parallel model as a config file says.

  python experiments/train.py --config=configs/digits.py --workdir=/tmp/digits
  python experiments/train.py --config=configs/digits.py:runlocal --workdir=/tmp/d \
      --config.sync.method=allreduce --config.workers=16

Multi-process (one command per process; on a cluster, `--distributed` alone
lets JAX find its peers):

  python experiments/train.py ... --coordinator_address=127.0.0.1:12345 \
      --num_processes=2 --process_id=0 --cpu_devices=4
"""

import logging as pylogging
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/digits.py:runlocal.')
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and plots.')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_bool('distributed', False, 'Start the multi-process runtime, detecting the cluster.')
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (multi-process runs).')
flags.DEFINE_integer('num_processes', None, 'Number of processes (multi-process runs).')
flags.DEFINE_integer('process_id', None, 'Index of this process (multi-process runs).')
flags.mark_flags_as_required(['config', 'workdir'])
FLAGS = flags.FLAGS


def _quiet_libraries(record) -> bool:
  # orbax and tfds log every checkpoint/build step at INFO; keep their warnings.
  noisy = ('/orbax/', '/tensorflow_datasets/', '/etils/', 'xla_bridge.py')
  return record.levelno >= pylogging.WARNING or not any(n in record.pathname for n in noisy)


def main(argv):
  del argv
  logging.get_absl_handler().python_handler.addFilter(_quiet_libraries)
  import jax

  jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  from jaxdist import runtime, train

  if FLAGS.coordinator_address or FLAGS.distributed:
    runtime.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  try:
    train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except train.ConfigError as e:
    logging.error('%s', e)
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main)
