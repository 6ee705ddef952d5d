"""Methods over real, rate-limited links (`experiments/bench_network.py`): dense first.

The digits CNN, 8 workers spread over the hosts (network namespaces) that
bench_network makes; its measured steps beside the modelled clock.
"""

from jaxdist.train.config import compressed, method

VARIANTS = {
  'dense': method('allreduce'),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),
  'artopk1': compressed('topk', 'allreduce', ratio=0.01),
  'powersgd2': method('powersgd', rank=2),
  'qsgd8': compressed('qsgd', levels=127),
  'local4': method('local_sgd', period=4),
  'diloco8': method('diloco', period=8),
}
