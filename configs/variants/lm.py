"""The DiLoCo family on a language model (`make results`: experiments/results/lm.md).

A character-level GPT (`configs/shakespeare_gpt.py`, `tiny`) on the bundled
Shakespeare, 8 workers, one token budget; AdamW with a gradient all-reduce
every step (BSP) is the first row and every other row's target.
"""

from jaxdist.train.config import compressed, method

SETTINGS = {'steps': 600, 'eval_every': 50, 'checkpoint_every': 600}

VARIANTS = {
  'bsp': method('allreduce'),
  'diloco10': method('diloco', period=10),
  'diloco50': method('diloco', period=50),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),
  'powersgd2': method('powersgd', rank=2),
}
