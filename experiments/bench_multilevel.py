r"""GraVAC's multi-level compression against compressing each candidate on its own.

GraVAC (Tyagi & Swany, CLOUD 2023) needs the gain of two factors every step:
θ_min and the candidate θ_c. Single-level compression runs Top-k on the whole
gradient once per factor; multi-level compresses θ_min's output again by
θ_c/θ_min (Top-k of the k_min survivors), since the largest k_c of the
largest k_min are the largest k_c. jaxdist goes one step further: one top-k
at the largest kept fraction and prefix sums of its squared values give
every candidate's ‖Top-k(w)‖² (`compressed_allreduce(ratios=...)`'s gains).

Each row times, side by side in interleaved rounds (median of `--rounds`):

- single-level: `lax.top_k(w, k_i)` for every candidate i;
- multi-level: `lax.top_k(w, k_min)`, then `lax.top_k` of those k_min
  values for every other candidate;
- prefix sums: `lax.top_k(w², k_max)` and a cumulative sum (jaxdist's gains);

all returning every candidate's ‖Top-k(w)‖², checked equal before timing.

  python experiments/bench_multilevel.py
  python experiments/bench_multilevel.py --sizes=1000000 --factors=10,100,1000
  python experiments/bench_multilevel.py --results=experiments/results/multilevel.md
"""

import random
import statistics
import time

from absl import app, flags

flags.DEFINE_list('sizes', ['1000000', '10000000'], 'Gradient sizes (float32 elements).')
flags.DEFINE_list('factors', ['10', '20', '40', '80', '160', '320', '640', '1000'],
                  "Compression factors (kept fraction 1/factor); GraVAC's grid.")  # fmt: skip
flags.DEFINE_integer('rounds', 10, 'Timed rounds (every function once each); median reported.')
flags.DEFINE_string('results', None, 'Also write the table as markdown here, with the command.')
FLAGS = flags.FLAGS


def functions(ks):
  """(name, jitted w -> [len(ks)] ‖Top-k_i(w)‖²) for the three ways; ks descending."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  def single(w):
    return jnp.stack([jnp.sum(lax.top_k(jnp.abs(w), k)[0] ** 2) for k in ks])

  def multi(w):
    first = lax.top_k(jnp.abs(w), ks[0])[0]
    rest = [jnp.sum(lax.top_k(first, k)[0] ** 2) for k in ks[1:]]
    return jnp.stack([jnp.sum(first**2), *rest])

  def prefix(w):
    top = jnp.cumsum(lax.top_k(w * w, ks[0])[0])
    return jnp.stack([top[k - 1] for k in ks])

  return [
    ('single-level', jax.jit(single)),
    ('multi-level', jax.jit(multi)),
    ('prefix sums', jax.jit(prefix)),
  ]


def main(argv):
  del argv
  import jax
  import numpy as np

  from jaxdist.train import report

  factors = sorted({int(f) for f in FLAGS.factors})
  print(f'{jax.devices()[0].platform} device, factors {factors}, median of {FLAGS.rounds} rounds')
  rows = []
  for n in map(int, FLAGS.sizes):
    ks = [max(1, n // f) for f in factors]  # descending
    w = jax.device_put(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    fns = functions(ks)
    outs = [np.asarray(f(w)) for _, f in fns]  # compile, warm up, and agree
    for (name, _), out in zip(fns[1:], outs[1:], strict=True):
      np.testing.assert_allclose(out, outs[0], rtol=1e-4, err_msg=name)
    times = {name: [] for name, _ in fns}
    for _ in range(FLAGS.rounds):
      order = list(fns)
      random.shuffle(order)
      for name, f in order:
        start = time.perf_counter()
        jax.block_until_ready(f(w))
        times[name].append(time.perf_counter() - start)
    single = statistics.median(times['single-level'])
    for name, _ in fns:
      t = statistics.median(times[name])
      rows.append({'size': f'{n:,}', 'candidates': len(ks), 'method': name,
                   'ms': f'{t * 1e3:.2f}', 'vs single': f'{single / t:.2f}x'})  # fmt: skip
  columns = [(k, k) for k in ('size', 'candidates', 'method', 'ms', 'vs single')]
  print(report.table(rows, columns))
  if FLAGS.results:
    import sys

    command = ' '.join(['python', *sys.argv])
    with open(FLAGS.results, 'w') as f:
      f.write(report.provenance(command) + '\n\n' + report.markdown(rows, columns) + '\n')


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
