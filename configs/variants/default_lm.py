r"""The variants `make run-lm` compares: the tiny GPT on Shakespeare, three ways to synchronise.

  python experiments/compare.py --config=configs/shakespeare_gpt.py --workdir=/tmp/lm \
      --variants=configs/variants/default_lm.py

AdamW with a gradient all-reduce every step (BSP, the target), the same with
the gradient sent as block-scaled int8 (a quarter of the bytes), and DiLoCo
averaging the workers' models every 10 steps (a tenth of the synchronisations).
600 steps of 64 windows of 64 characters, 8 workers on the CPU: about a minute
a variant on 2 cores. Each is a variant of the DiLoCo family's table
(configs/variants/lm.py, `make results-lm`), under the same name.
"""

from jaxdist.train.config import method

SETTINGS = {'steps': 600, 'eval_every': 100, 'checkpoint_every': 200}

VARIANTS = {
  'bsp': method('allreduce'),
  'int8_allreduce': method('quantized_allreduce', format='int8'),
  # the inner AdamW at its own learning rate, as in configs/variants/lm.py
  'diloco10': {**method('diloco', period=10), 'optimizer': {'lr_scale': 0.3}},
}
