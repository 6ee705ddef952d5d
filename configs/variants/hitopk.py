"""Hierarchical Top-k on 2 nodes of 8 workers (the devices are the nodes) against flat
collectives (`make results`: experiments/results/hitopk.md)."""

from jaxdist.train.config import compressed, method

SETTINGS = {'workers': 16, 'devices': 2, 'network.profiles': '10gbps,25gbps@25us'}
VARIANTS = {
  'dense': method('allreduce'),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),  # 'auto' = top_k at 151K
  'artopk1': compressed('topk', 'allreduce', ratio=0.01),
  'hitopk': {**compressed('topk', ratio=0.01), 'sync': {'method': 'hitopk_allreduce'}},
}
