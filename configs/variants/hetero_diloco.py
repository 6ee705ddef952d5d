"""Heterogeneity-aware DiLoCo on unequal hosts (`make bench-hetero`'s language-model run).

  sudo python experiments/bench_hetero.py --config=configs/shakespeare_gpt.py \
      --variants=configs/variants/hetero_diloco.py --metric=test_loss --steps=200

The `tiny` GPT, one worker a host (16 windows of 64 characters each), validated on the
first validation play's first 256 windows. BSP (AdamW, an all-reduce every step) sets the
target, its final validation loss; DiLoCo (inner AdamW at lm.py's 0.3x rate, outer Nesterov,
H = 10) waits for the slowest host every step of a round; heterogeneity-aware DiLoCo gives
each host the inner steps of a round that fit the fastest host's ten (`batching='window'`,
from the calibrated hosts: bench_hetero sets `cluster.speeds` and `fixed_s`) and weights the
outer mean by the steps taken (`sync.diloco.by_steps`). The DiLoCo runs train 600 steps:
on this model both reach BSP's loss at 200 steps only after about 300 (a single-process
trial); at 400 steps heterogeneity-aware DiLoCo, which trains on 19 of a round's 30
worker-steps, ended 0.007 above it.
"""

from jaxdist.train.config import method

SETTINGS = {
  'workers': 3,
  'batch_size': 48,
  'noise_every': 0,
  'eval_every': 25,
  'eval_examples': 256,
  'dataset': {'test_split': 'validation[:1]'},
  'cluster': {'speeds': '1,1,1'},
}
INNER = {'optimizer': {'lr_scale': 0.3}, 'steps': 600}  # lm.py's inner AdamW

VARIANTS = {
  'bsp': method('allreduce'),
  'diloco': {**method('diloco', period=10), **INNER},
  'window': {
    **method('diloco', period=10, by_steps=True),
    **INNER,
    'batching': 'window',
  },
}
