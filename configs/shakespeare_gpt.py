r"""A character-level GPT on the bundled complete works of Shakespeare, 8 workers.

  python experiments/train.py --config=configs/shakespeare_gpt.py --workdir=/tmp/gpt
  python experiments/train.py --config=configs/shakespeare_gpt.py:small --workdir=/tmp/gpt \
      --config.sync.method=diloco --config.sync.diloco.period=50

The `tiny` model (4 blocks × 64, context 64) trains on a 2-core CPU in
minutes; `small` is nanoGPT's `shakespeare_char` model (6 × 384, context
256, ≈10.7M parameters) with its batch of 64 × 256 tokens, for a GPU;
`runlocal` trains `mini` (2 blocks × 64) for a few steps. The
validation loss is reported in nats (`test_loss`) and bits per character
(`test_bits`). Every option and its default: `jaxdist/train/config.py`.
Arguments after the colon, comma-separated: `runlocal` (a few steps, for
CI, tests and Colab), `small`, `workers=N`.
"""

import ml_collections

from jaxdist.train import config as base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = base_config.parse_arg(arg, runlocal=False, small=False, workers=8)
  config = base_config.base()
  config.dataset.name = 'shakespeare'
  config.dataset.level = 'char'
  config.dataset.test_split = 'validation'
  config.model.name = 'gpt'
  config.model.size = 'small' if arg.small else 'tiny'
  config.dataset.context = 256 if arg.small else 64
  config.workers = arg.workers
  config.batch_size = 64  # windows, global: batch_size // workers each
  config.steps = 5000 if arg.small else 1000
  # nanoGPT's 1e-3 for `small`; the 64-wide `tiny` learns faster at 1e-2 (600 steps, 8 workers:
  # validation loss 2.33 at 1e-3, 2.02 at 3e-3, 1.91 at 1e-2)
  config.optimizer = base_config.optimizer(
    'adamw', 1e-3 if arg.small else 1e-2, weight_decay=0.1, schedule='cosine',
    warmup_steps=100 if arg.small else 50,
  )  # fmt: skip
  config.eval_every = 250 if arg.small else 100
  config.eval_batch_size = 512
  config.checkpoint_every = 1000 if arg.small else 500

  if arg.runlocal:
    config.model.size = 'mini'  # 2 blocks of 64, every part of `tiny`: half its compile time
    config.steps = 20
    config.eval_every = 10
    config.checkpoint_every = 10
    config.dataset.context = 32
    # validate on the first 512 windows (16K characters) of the first of the four validation
    # plays (Troilus and Cressida): evaluating all 505K took most of a few-dozen-step run on a
    # CPU, and its 137K characters still 2 s an evaluation
    config.dataset.test_split = 'validation[:1]'
    config.eval_examples = 512
    config.network.compute_budget_s = 0.25
    config.optimizer.warmup_steps = 2
  return config
