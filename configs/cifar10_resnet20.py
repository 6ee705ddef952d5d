r"""ResNet-20 on CIFAR-10 with 8 data-parallel workers (for users who have CIFAR-10 prepared).

  tfds build cifar10 --file_format=array_record     # once, needs TensorFlow + internet
  python experiments/train.py --config=configs/cifar10_resnet20.py --workdir=/tmp/c10 \
      --config.sync.method=local_sgd --config.sync.local_sgd.period=8

Builds on the base config (`jaxdist/train/config.py`). Arguments after the
colon: `runlocal` trains a few steps on synthetic data of CIFAR-10's shapes
(32x32x3, 10 classes), so it runs anywhere (CI, Colab) without the dataset;
`workers=N`. Hyper-parameters follow He et al. (2016): SGD momentum 0.9, lr
0.1 at batch 128 (scaled linearly here), weight decay 1e-4, 160 epochs.
"""

import ml_collections

from jaxdist.train import config as base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = base_config.parse_arg(arg, runlocal=False, workers=8)
  config = base_config.base()
  config.dataset.name = 'cifar10'
  config.model.name = 'resnet20'
  config.workers = arg.workers
  config.batch_size = 256  # global: 32 per worker
  config.steps = 31_250  # 160 epochs of 50,000 images
  config.optimizer.learning_rate = 0.2  # 0.1 per 128 examples
  config.optimizer.nesterov = False
  config.optimizer.warmup_steps = 500
  config.eval_every = 1000
  config.eval_batch_size = 1000
  config.checkpoint_every = 2000

  if arg.runlocal:
    config.dataset.name = 'synthetic'
    config.batch_size = 64
    config.steps = 6
    config.eval_every = 3
    config.checkpoint_every = 3
    config.network.compute_budget_s = 0.25  # timing the compute term: 3 steps or so
    config.optimizer.warmup_steps = 1
    config.optimizer.learning_rate = 0.05
  return config
