"""The DiLoCo family on a language model (`make results-lm`: experiments/results/lm.md).

A character-level GPT (`configs/shakespeare_gpt.py`, `tiny`) on the bundled
Shakespeare, 8 workers, one token budget (2,500 steps of 64 windows of 64
characters: 50 outer steps at H = 50); AdamW with a gradient all-reduce every
step (BSP) is the first row and every other row's target. Streaming DiLoCo's
four fragments need a period that divides by 4: 48, beside DiLoCo's 50.
`diloco50_warm` starts from BSP's checkpoint at step 500 (the first 20 % of the
steps; the DiLoCo paper's warm start), `diloco50_m1` is DiLoCo with one
replica (the scaling-laws paper's M = 1) on the same global batch.
"""

from jaxdist.train.config import compressed, method

SETTINGS = {'steps': 2500, 'eval_every': 250, 'checkpoint_every': 500, 'keep_checkpoints': 5}

FP8 = {'quantized_allreduce': {'format': 'fp8'}}
# The inner AdamW of the periodic methods at 0.3x the config's rate (optimizer.lr_scale), so
# that the ratio, not a rate tuned at one size, carries to every model size: at `tiny` (1e-2)
# DiLoCo H=50's validation loss after 600 steps was 2.494 at 1e-3, 2.422 at 3e-3, 2.610 at
# 1e-2 (SparseLoCo H=50: 2.512 at 3e-3, 2.767 at 1e-2); at `small` the rule gives 3e-4.
INNER = {'optimizer': {'lr_scale': 0.3}}

VARIANTS = {
  'bsp': method('allreduce'),
  'int8_allreduce': method('quantized_allreduce', format='int8'),
  'diloco10': {**method('diloco', period=10), **INNER},
  'diloco50': {**method('diloco', period=50), **INNER},
  'streaming48_fp8': {
    'sync': {
      **method(
        'streaming_diloco',
        period=48,
        fragments=4,
        delay=1,
        alpha=0.5,
        layout='strided',
        averager='quantized_allreduce',
      )['sync'],
      **FP8,
    },
    **INNER,
  },
  'sparseloco50': {**method('sparseloco', period=50, density=0.03125, bits=2), **INNER},
  'sparseloco10': {**method('sparseloco', period=10, density=0.03125, bits=2), **INNER},
  # DeMo's sign step at 0.3x the config's rate (at `tiny`, 300 steps: validation loss 2.65 at
  # 1e-3, 2.47 at 3e-3, 2.67 at 1e-2)
  'demo': {**method('demo'), 'optimizer': {'lr_scale': 0.3}},
  # 1-bit Adam, 0/1 Adam: the variance frozen after 20 % of the steps; AdamW's betas and decay
  'onebit_adam': method('onebit_adam', warmup_steps=120, weight_decay=0.1),
  'zero_one_adam': method(
    'zero_one_adam', var_freeze_step=120, local_step_scaler=100, weight_decay=0.1
  ),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),
  'powersgd2': method('powersgd', rank=2),
}
