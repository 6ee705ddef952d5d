"""Methods over real, rate-limited links (`experiments/bench_network.py`): dense first.

The digits CNN, 8 workers spread over the hosts (network namespaces) that
bench_network makes; its measured steps beside the modelled clock. The
settings are the peers' work, configs/variants/peers.py's, so `dense`,
`powersgd2` and `local4` train what the peers' DDP trains when bench_network
runs it beside them (`--torch_python`).
"""

import os

from jaxdist.train import compare
from jaxdist.train.config import compressed, method

SETTINGS = compare.load_group(os.path.join(os.path.dirname(__file__), 'peers.py')).settings
VARIANTS = {
  'dense': method('allreduce'),
  # the same numbers in DDP's layout, 25 MiB buckets; on the CPU the dense all-reduce packs its
  # leaves into one buffer per dtype as well (jd.comm.packed), so the two send alike
  'dense_bucketed': method('bucketed_allreduce', buckets=25 * 2**20),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),
  'artopk1': compressed('topk', 'allreduce', ratio=0.01),
  'powersgd2': method('powersgd', rank=2),
  'qsgd8': compressed('qsgd', levels=127),
  'local4': method('local_sgd', period=4),
  'diloco8': method('diloco', period=8),
}
