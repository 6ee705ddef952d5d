"""The methods experiments/bench_peers.py times beside PyTorch DDP (`make bench-peers`).

`SETTINGS` are the peers' work (../shared/peers/side_by_side.sh) as overrides
of configs/digits.py: SGD lr 0.05 momentum 0.9, no Nesterov, constant, no
weight decay. configs/variants/network.py trains the same work over real links.
"""

from jaxdist.train.config import compressed, method

SETTINGS = {
  'optimizer.learning_rate': 0.05,
  'optimizer.nesterov': False,
  'optimizer.schedule': 'constant',
  'optimizer.weight_decay': 0.0,
  'optimizer.warmup_steps': 0,
  # DDP all-reduces gradients at steps 0-9 and PeriodicModelAverager(4, warmup_steps=10) averages
  # after steps 10, 14, ...: local_sgd's schedule with 11 warm-up steps (its docstring)
  'sync.local_sgd.warmup_steps': 11,
  # Scavenger's gradient noise is a diagnostic DDP does not run: not measured (its extra pass
  # every config.noise_every steps would stall the steps timed beside DDP's)
  'noise_every': 0,
}

VARIANTS = {
  'dense': method('allreduce'),
  'powersgd2': method('powersgd', rank=2),
  'local4': method('local_sgd', period=4),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),  # 'auto' = top_k at 151K
  'dgc1': compressed('dgc', ratio=0.01),  # Top-k 1% from DGC's sampled threshold
}
