"""ResNet-20 on CIFAR-10 with 8 data-parallel workers (for users who have CIFAR-10 prepared).

  tfds build cifar10 --file_format=array_record     # once, needs TensorFlow + internet
  python experiments/train.py --config=configs/cifar10_resnet20.py --workdir=/tmp/c10 \
      --config.sync.method=local_sgd --config.sync.period=8

Variants: `runlocal` trains a few steps on synthetic data of CIFAR-10's shapes
(32x32x3, 10 classes), so it runs anywhere (CI, Colab) without the dataset.
Hyper-parameters follow He et al. (2016): SGD momentum 0.9, lr 0.1 at batch
128 (scaled linearly here), weight decay 1e-4, 160 epochs.
"""

import ml_collections

from jaxdist.train import defaults


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = 'cifar10'
  config.dataset.data_dir = ''
  config.dataset.download = False
  config.dataset.train_split = 'train'
  config.dataset.test_split = 'test'
  # used when name == 'synthetic'
  config.dataset.image_shape = '32,32,3'
  config.dataset.num_classes = 10
  config.dataset.train_size = 2048
  config.dataset.test_size = 512

  config.model = ml_collections.ConfigDict()
  config.model.name = 'resnet20'

  config.workers = 8
  config.devices = 0
  config.batch_size = 256  # global: 32 per worker
  config.steps = 31_250  # 160 epochs of 50,000 images

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = 'sgd'
  config.optimizer.learning_rate = 0.2  # 0.1 per 128 examples
  config.optimizer.momentum = 0.9
  config.optimizer.nesterov = False
  config.optimizer.weight_decay = 1e-4
  config.optimizer.schedule = 'cosine'
  config.optimizer.warmup_steps = 500

  config.sync = defaults.sync()  # every option: jaxdist/train/defaults.py
  config.network = defaults.network()

  config.eval_every = 1000
  config.eval_batch_size = 1000
  config.checkpoint_every = 2000
  config.keep_checkpoints = 2
  config.progress = True

  config.fault = ml_collections.ConfigDict()
  config.fault.kill_at_step = 0

  # Named variants (overrides of the fields above) for experiments/compare.py;
  # `compare` lists the ones it trains.
  config.variants = defaults.variants()
  config.compare = 'dense,topk1_ef,artopk1,powersgd2'

  if arg == 'runlocal':
    config.dataset.name = 'synthetic'
    config.batch_size = 64
    config.steps = 6
    config.eval_every = 3
    config.checkpoint_every = 3
    config.optimizer.warmup_steps = 1
    config.optimizer.learning_rate = 0.05
  elif arg:
    raise ValueError(
      f"unknown variant {arg!r} of configs/cifar10_resnet20.py; choose 'runlocal' or none"
    )
  return config
