"""The DiLoCo family's exchange inline and on its own thread, over real rate-limited links.

  sudo python experiments/bench_network.py --config=configs/shakespeare_gpt.py \
      --variants=configs/variants/overlap_lm.py --metric=test_loss --hosts=2 \
      --workers_per_host=1 --single_thread_hosts --rates=100,unlimited --steps=300 \
      --results=experiments/results/network_overlap.md

The `tiny` GPT (206,656 parameters, 827 KB in float32), one worker a host
(`--workers_per_host=1`: an exchange runs beside the steps only with one CPU
device a process, `jaxdist.train.overlap`), each host's XLA on one thread
(`--single_thread_hosts`: the hosts share this machine's two cores). Each
pair is one algorithm run two ways, `inline` (the all-reduce in the step's
program) and `deferred` (on its own thread beside the next steps): eager
DiLoCo's losses are equal bitwise, Streaming DiLoCo's to float32 rounding
(its outer step is `merge`, a program of its own).

- Streaming DiLoCo: two fragments of about 413 KB, one sent every 3 steps
  and applied τ = 2 steps later.
- Eager DiLoCo (Kale et al. 2025): the whole model's pseudo-gradient sent
  at each outer step and read at the next, H − 1 steps later; H = 8, and
  the paper's regime H = 50, where the exchange's share of a step is small.
"""

from jaxdist.train.config import method

# lm.py's inner AdamW rate; no noise measurement (it waits for an exchange in flight)
SETTINGS = {'eval_every': 100, 'optimizer.lr_scale': 0.3, 'noise_every': 0}
STREAMING = dict(period=6, fragments=2, delay=2, alpha=0.0, layout='sequential', averager='')

VARIANTS = {
  'streaming_inline': method('streaming_diloco', **STREAMING, exchange='inline'),
  'streaming_deferred': method('streaming_diloco', **STREAMING, exchange='deferred'),
  'eager8_inline': method('diloco', period=8, eager=True, exchange='inline'),
  'eager8_deferred': method('diloco', period=8, eager=True, exchange='deferred'),
  'eager50_inline': method('diloco', period=50, eager=True, exchange='inline'),
  'eager50_deferred': method('diloco', period=50, eager=True, exchange='deferred'),
}
