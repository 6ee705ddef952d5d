"""The DiLoCo family over real, rate-limited links: the language model on bench_network.

  sudo python experiments/bench_network.py --config=configs/shakespeare_gpt.py \
      --variants=configs/variants/network_lm.py --metric=test_loss --hosts=2 \
      --rates=100,unlimited --steps=200 --results=experiments/results/network_lm.md

The `tiny` GPT (206,656 parameters) of `make results-lm` (configs/variants/lm.py),
8 workers spread over the hosts; AdamW with an all-reduce every step first.
The periodic methods sync every 10 steps (Streaming DiLoCo: every 12, its 4
fragments 3 steps apart) so that a short run holds several outer steps; their
inner learning rate is lm.py's.
"""

from jaxdist.train.config import method

SETTINGS = {'eval_every': 50}
INNER = {'optimizer': {'lr_scale': 0.3}}  # lm.py's inner AdamW: 0.3x the config's rate
STREAMING = method(
  'streaming_diloco', period=12, fragments=4, delay=1, alpha=0.5, layout='strided',
  averager='quantized_allreduce',
)  # fmt: skip

VARIANTS = {
  'bsp': method('allreduce'),
  # the same numbers in DDP's layout, 25 MiB buckets; on the CPU the dense all-reduce packs its
  # leaves into one buffer per dtype as well (jd.comm.packed), so the two send alike
  'bsp_bucketed': method('bucketed_allreduce', buckets=25 * 2**20),
  'int8_allreduce': method('quantized_allreduce', format='int8'),
  'diloco10': {**method('diloco', period=10), **INNER},
  'streaming12_fp8': {
    'sync': {**STREAMING['sync'], 'quantized_allreduce': {'format': 'fp8'}},
    **INNER,
  },
  'sparseloco10': {**method('sparseloco', period=10, density=0.03125, bits=2), **INNER},
  'demo': {**method('demo'), **INNER},
}
