"""CNN on the bundled 8x8 digits with 8 data-parallel workers (the default `make run`).

  python experiments/train.py --config=configs/digits.py --workdir=/tmp/digits
  python experiments/train.py --config=configs/digits.py:runlocal --workdir=/tmp/d \
      --config.workers=64 --config.batch_size=256

Variants (the part after the colon): `runlocal` (a few steps, for CI, tests
and Colab).
"""

import ml_collections

from jaxdist.train import defaults


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = 'digits'  # or any tfds image dataset prepared as array_record
  config.dataset.data_dir = ''  # '' = $TFDS_DATA_DIR or ~/tensorflow_datasets
  config.dataset.download = False
  config.dataset.train_split = 'train'
  config.dataset.test_split = 'test'

  config.model = ml_collections.ConfigDict()
  config.model.name = 'cnn'  # mlp | cnn | resnet20

  config.workers = 8  # data-parallel workers in all
  config.devices = 0  # devices they run on; 0 = as many as divide `workers`
  config.batch_size = 128  # global: each worker takes batch_size // workers
  config.steps = 400

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = 'sgd'  # sgd | adam | adamw
  config.optimizer.learning_rate = 0.1
  config.optimizer.momentum = 0.9
  config.optimizer.nesterov = True
  config.optimizer.weight_decay = 1e-4
  config.optimizer.schedule = 'cosine'  # cosine (with warm-up) | constant
  config.optimizer.warmup_steps = 20

  config.sync = defaults.sync()  # every option: jaxdist/train/defaults.py
  config.network = defaults.network()

  config.eval_every = 20
  config.eval_batch_size = 1024
  config.checkpoint_every = 100
  config.keep_checkpoints = 2
  config.progress = True

  # Fault injection for recovery experiments: SIGKILL the process after this
  # step is logged, losing the steps since the last checkpoint (0 = never).
  config.fault = ml_collections.ConfigDict()
  config.fault.kill_at_step = 0

  # Named variants (overrides of the fields above) for experiments/compare.py;
  # `compare` lists the ones it trains.
  config.variants = defaults.variants()
  config.compare = 'dense,topk1_ef,artopk1,powersgd2'

  if arg == 'runlocal':
    config.steps = 20
    config.eval_every = 10
    config.checkpoint_every = 10
    config.optimizer.warmup_steps = 2
  elif arg:
    raise ValueError(f"unknown variant {arg!r} of configs/digits.py; choose 'runlocal' or none")
  return config
