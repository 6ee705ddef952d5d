r"""CNN on the bundled 8x8 digits with 8 data-parallel workers (the default `make run`).

  python experiments/train.py --config=configs/digits.py --workdir=/tmp/digits
  python experiments/train.py --config=configs/digits.py:runlocal,workers=64 \
      --workdir=/tmp/d --config.batch_size=256 \
      --config.sync.method=local_sgd --config.sync.local_sgd.period=8

Every option and its default: `jaxdist/train/config.py` (`base()`).
Arguments after the colon, comma-separated: `runlocal` (a few steps, for CI,
tests and Colab), `workers=N`.
"""

import ml_collections

from jaxdist.train import config as base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = base_config.parse_arg(arg, runlocal=False, workers=8)
  config = base_config.base()
  config.dataset.name = 'digits'
  config.model.name = 'cnn'
  config.workers = arg.workers
  config.batch_size = 128  # global: each worker takes batch_size // workers
  config.steps = 400
  config.optimizer.learning_rate = 0.1
  config.optimizer.warmup_steps = 20
  # DiLoCo's outer Nesterov at momentum 0.5, not the paper's 0.9 (tuned there with an inner
  # AdamW): over this config's inner SGD with Nesterov momentum 0.9 the two momenta compound.
  # Period 8, 400 steps, test accuracy at the end (seeds 0, 1, 2): at 0.9, 0.964 / 0.964 /
  # 0.964 on 8 workers and 0.986 / NaN / 0.969 on 16, the accuracy swinging by up to 4 pp
  # after step 200; at 0.5, 0.994 / 0.992 / 0.992 and 0.992 / 0.994 / 0.994, steady.
  for family in ('diloco', 'streaming_diloco'):
    config.sync[family].outer_optimizer.momentum = 0.5

  if arg.runlocal:
    config.steps = 20
    config.eval_every = 10
    config.checkpoint_every = 10
    config.network.compute_budget_s = 0.25  # timing the compute term: 3 steps or so
    config.optimizer.warmup_steps = 2
  return config
