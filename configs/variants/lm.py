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
# Each method's rates as ratios to the config's own AdamW rate (optimizer.lr_scale), so that
# one file serves every model size (`tiny`: 1e-2, `small`: 1e-3), following the DiLoCo
# scaling-laws paper (arXiv 2503.09799), whose tuned inner rate falls with the replicas
# (fitted at 35M parameters: about 0.5x data parallelism's at M = 1, 0.27x at M = 8) and whose
# best outer rate rises with them (Nesterov 0.9: about 0.6 at M = 1, 1.0 at M = 8), whatever
# the model's size. Swept at `tiny`, 8 workers, 2,500 steps (validation loss; BSP 1.627):
#   inner x0.1 / x0.3 / x1 / x3 at outer 0.7:  -, 1.873, 1.873, 1.991
#   inner x0.1 / x0.3 at outer 1.0:            1.954, 1.848;   outer 1.5: 2.94 at step 1000
#   M = 4 (same rates as M = 8): 1.774;   M = 1 at inner x1, outer 0.7: 1.666
# The 600-step sweep before it (inner x0.1 / x0.3 / x1: 2.494, 2.422, 2.610) chose x0.3 too.
INNER = {'optimizer': {'lr_scale': 0.3}}
OUTER = {'outer_optimizer': {'learning_rate': 1.0}}  # Nesterov 0.9 (the config's), M = 8
DILOCO50 = {**method('diloco', period=50, **OUTER), **INNER}
ONE_REPLICA = {  # M = 1: one worker on the whole global batch, the M = 1 rates
  'workers': 1,
  **method('diloco', period=50, outer_optimizer={'learning_rate': 0.6}),
  'optimizer': {'lr_scale': 0.5},
}

# the order they train in: the targets' variants first
VARIANTS = {
  'bsp': method('allreduce'),
  'diloco50': DILOCO50,
  'diloco50_warm': {**DILOCO50, 'init_from': 'bsp', 'init_step': 500},  # BSP's step 500
  'diloco50_m1': ONE_REPLICA,
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
        **OUTER,
      )['sync'],
      **FP8,
    },
    **INNER,
  },
  'sparseloco50': {**method('sparseloco', period=50, density=0.03125, bits=2), **INNER},
  # DeMo's sign step at 0.3x the config's rate (at `tiny`, 300 steps: validation loss 2.65 at
  # 1e-3, 2.47 at 3e-3, 2.67 at 1e-2)
  'demo': {**method('demo'), 'optimizer': {'lr_scale': 0.3}},
  # 1-bit Adam, 0/1 Adam: the variance frozen after 20 % of the steps; AdamW's betas and decay
  'onebit_adam': method('onebit_adam', warmup_steps=500, weight_decay=0.1),
  'int8_allreduce': method('quantized_allreduce', format='int8'),
  # the config's outer 0.7 at H = 10: the paper's best outer rate rises with H
  'diloco10': {**method('diloco', period=10), **INNER},
  'sparseloco10': {**method('sparseloco', period=10, density=0.03125, bits=2), **INNER},
  'zero_one_adam': method(
    'zero_one_adam', var_freeze_step=500, local_step_scaler=100, weight_decay=0.1
  ),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),
  'powersgd2': method('powersgd', rank=2),
}
