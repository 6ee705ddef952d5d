"""The variants experiments/elastic.py restores on other workers (`make results`:
experiments/results/elastic.md)."""

from jaxdist.train.config import compressed, method

VARIANTS = {
  'dense': method('allreduce'),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),  # 'auto' = top_k at 151K
  'local4': method('local_sgd', period=4),
  'diloco8': method('diloco', period=8),
}
