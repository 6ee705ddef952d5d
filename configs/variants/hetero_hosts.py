"""Unequal hosts for real (`make bench-hetero`, experiments/bench_hetero.py): one worker a host.

BSP with equal batches; dynamic batching's allocation by each host's measured throughput
(Tyagi & Sharma 2020 §III-B, `batching='static'` on the calibrated `cluster.speeds`, which
the bench fills in), with every worker computing its whole b_max masked, and with
micro-batches of 8 (only a worker's own examples computed); local SGD every 4 steps; SelSync
(δ = 0.3, less_sync.py's: every step all-reduces the workers' flags, and the parameters only
where a worker's relative gradient change reaches δ).
"""

from typing import Any

from jaxdist.train.config import method

# the speeds: equal until bench_hetero sets each host's measured one
SETTINGS = {'workers': 3, 'batch_size': 384, 'noise_every': 0, 'cluster': {'speeds': '1,1,1'}}


def by_throughput(micro_batch: int) -> dict[str, Any]:
  """Batches in proportion to the hosts' measured speeds; b_max 256, `micro_batch` (0: masked)."""
  return {'batching': 'static', 'dynamic_batching': {'b_max': 256, 'micro_batch': micro_batch}}


VARIANTS = {
  'bsp': method('allreduce'),
  'dynamic_masked': by_throughput(0),
  'dynamic_micro': by_throughput(8),
  'local4': method('local_sgd', period=4),
  'selsync': method('selsync', threshold=0.3),
}
