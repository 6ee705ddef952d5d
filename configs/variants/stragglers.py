"""Random stragglers on a priced cluster (`make results`: experiments/results/stragglers.md).

Each step each worker straggles with probability 0.1, computing 4x slower; a
worker-hour costs 1.
"""

from jaxdist.train.config import method

SETTINGS = {
  'cluster.straggler_p': 0.1,
  'cluster.straggler_slowdown': 4.0,
  'cluster.price': 1.0,
}
VARIANTS = {
  'bsp': method('allreduce'),
  'local4': method('local_sgd', period=4),
  'ssp2': method('ssp', staleness=2),
  'async4': method('async_sgd', max_delay=4),
  'gossip_ring': method('gossip', topology='ring'),
}
