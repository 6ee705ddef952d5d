"""Streaming DiLoCo's exchange, inline and on its own thread, over real rate-limited links.

  sudo python experiments/bench_network.py --config=configs/shakespeare_gpt.py \
      --variants=configs/variants/overlap_lm.py --metric=test_loss --hosts=2,4 \
      --workers_per_host=1 --rates=100,unlimited --steps=300 \
      --results=experiments/results/network_overlap.md

The `tiny` GPT (206,656 parameters, 827 KB in float32), one worker a host
(`--workers_per_host=1`: an exchange runs beside the steps only with one CPU
device a process, `jaxdist.train.overlap`). Two fragments of about 413 KB,
one sent every 2 steps and applied τ = 1 step later: at 100 Mbit/s a
fragment's ring all-reduce takes about 33 ms on 2 hosts and 50 ms on 4,
less than one inner step here. The two variants are the same algorithm
(α = 0: the same numbers, bitwise); `inline` sends in the step's program,
`deferred` on its own thread.
"""

from jaxdist.train.config import method

SETTINGS = {'eval_every': 100, 'optimizer.lr_scale': 0.3, 'noise_every': 0}
STREAMING = dict(period=4, fragments=2, delay=1, alpha=0.0, layout='sequential', averager='')

VARIANTS = {
  'streaming_inline': method('streaming_diloco', **STREAMING, exchange='inline'),
  'streaming_deferred': method('streaming_diloco', **STREAMING, exchange='deferred'),
}
