"""Delay-tolerant training and scheduling (`make results`:
experiments/results/delay_tolerant.md)."""

from jaxdist.train.config import method

VARIANTS = {
  'bsp': method('allreduce'),
  'od_sgd': method('od_sgd'),
  'ssd_sgd': method('ssd_sgd', k=5, compensation=0.04),
  'cd_sgd': method('cd_sgd', k=5),
  'tick_tock': method('tick_tock', waves=2),
  'bucketed': method('bucketed_allreduce', buckets=65536),
}
