"""Less synchronisation (`make results`: experiments/results/less_sync.md)."""

from jaxdist.train.config import method

VARIANTS = {
  'bsp': method('allreduce'),
  'local4': method('local_sgd', period=4),
  'local16': method('local_sgd', period=16),
  'diloco8': method('diloco', period=8),
  'selsync': method('selsync', threshold=0.3),
  'selsync01': method('selsync', threshold=0.1),
  'ssp2': method('ssp', staleness=2),
  'async4': method('async_sgd', max_delay=4),
  'gossip_ring': method('gossip', topology='ring'),
  'sma': method('sma'),
}
