"""One injected straggler (`make results`: experiments/results/straggle.md).

Worker 7 computes 8x slower on steps 21-120 (`config.fault.straggle`).
"""

from jaxdist.train.config import method

SETTINGS = {'fault.straggle': '7:8@20-120'}
VARIANTS = {
  'bsp': method('allreduce'),
  'local4': method('local_sgd', period=4),
  'ssp2': method('ssp', staleness=2),
  'async4': method('async_sgd', max_delay=4),
  'gossip_ring': method('gossip', topology='ring'),
}
