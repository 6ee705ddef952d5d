"""Adaptive compression: GraVAC and ScaDLES's rule against fixed Top-k (10x, 1000x)
(`make results`: experiments/results/adaptive.md)."""

from jaxdist.train.config import compressed, method

VARIANTS = {
  'dense': method('allreduce'),
  'topk10x': compressed('topk', ratio=0.1),
  'topk1000x': compressed('topk', ratio=0.001),
  'gravac': {**compressed('topk', ratio=0.1), 'adaptive': 'gravac', 'gravac': {'window': 50}},
  'scadles_rule': {**compressed('topk', ratio=0.1), 'adaptive': 'scadles'},
}
