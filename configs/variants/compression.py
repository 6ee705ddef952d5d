"""Compression (`make results`: experiments/results/compression.md)."""

from jaxdist.train.config import compressed, method

noef = compressed('topk', ratio=0.01)
noef['sync']['compressed_allreduce']['error_feedback'] = False

VARIANTS = {
  'dense': method('allreduce'),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),  # 'auto' = top_k at 151K
  'artopk1': compressed('topk', 'allreduce', ratio=0.01),
  'powersgd2': method('powersgd', rank=2),
  'qsgd8': compressed('qsgd', levels=127),
  'topk1_noef': noef,
}
