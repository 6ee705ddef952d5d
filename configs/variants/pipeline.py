"""Delayed gradients (pipeline staleness) at a learning rate they survive, with and without
Kosson et al.'s fixes (`make results`: experiments/results/pipeline.md)."""

from typing import Any

SLOW = {'learning_rate': 0.05, 'nesterov': False}
SC, LWP = 'spike_compensation', 'linear_weight_prediction'


def delayed(delay: int, *fixes: str) -> dict[str, Any]:
  """Every gradient `delay` steps late (`gradient_delay`), with `fixes`, at the slow rate."""
  sync = {'method': 'gradient_delay', 'gradient_delay': {'delay': str(delay)}}
  return {'optimizer': SLOW, 'sync': {**sync, 'compensation': ','.join(fixes)}}


VARIANTS = {
  'bsp_lr05': {'optimizer': SLOW},
  'delay2': delayed(2),
  'delay2_sc': delayed(2, SC),
  'delay4': delayed(4),
  'delay4_sc': delayed(4, SC),
  'delay4_lwp': delayed(4, LWP),
  'delay4_sc_lwp': delayed(4, SC, LWP),
}
