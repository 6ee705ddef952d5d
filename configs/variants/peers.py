"""The methods experiments/bench_peers.py times beside PyTorch DDP (`make bench-peers`)."""

from jaxdist.train.config import compressed, method

VARIANTS = {
  'dense': method('allreduce'),
  'powersgd2': method('powersgd', rank=2),
  'local4': method('local_sgd', period=4),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),  # 'auto' = top_k at 151K
  'dgc1': compressed('dgc', ratio=0.01),  # Top-k 1% from DGC's sampled threshold
}
