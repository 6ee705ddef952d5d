r"""Encode+decode time and wire size of every compressor, against one memory pass.

For each vector size, every compressor's jitted encode+decode of the same
float32 vector (random normal, fixed seed; fixed PRNG key) is timed next to a
jitted `jnp.copy` of it: one read and one write of the vector, about the
least that reading x and writing the decoded vector can cost. After a compile
and warm-up call of each, the functions are timed in `--rounds` interleaved
rounds (every function once per round, in a shuffled order) and the median is
reported, which keeps a noisy machine's drift out of the ratios.

Wire columns: the payload's exact bytes, that as a fraction of the dense
float32 vector, and the bytes each of `--workers` workers sends, relative to
a dense ring all-reduce (2(N-1)/N · 4n): summable payloads go by ring
all-reduce (2(N-1)/N · wire), the rest by all-gather ((N-1) · wire). Sparse
(values, indices) payloads can instead use AR-Top-k: a broadcast of the k
int32 indices ((N-1)/N · 4k) and a ring all-reduce of the k float32 values
(2(N-1)/N · 4k).

On the CPU, every call writes a fresh output vector; above glibc's mmap
threshold that buffer is mapped and unmapped on each call, so at 10M elements
page faults, not bandwidth, would dominate the memory pass (a 40 MB copy takes
~18 ms that way against ~2.5 ms from reused memory) and flatter every ratio.
`--keep_buffers` (the default) therefore asks glibc (mallopt) to keep freed
buffers mapped before JAX allocates anything, so both sides are timed at
memory speed.

  python experiments/bench_compress.py
  python experiments/bench_compress.py --sizes=1000000 --rounds=30 --workers=16
"""

import math
import random
import statistics
import time

from absl import app, flags

flags.DEFINE_list('sizes', ['1000000', '10000000'], 'Vector sizes (float32 elements).')
flags.DEFINE_integer('rounds', 20, 'Timed rounds (every function once each); median reported.')
flags.DEFINE_integer('workers', 8, 'Workers N for the per-worker wire comparison.')
flags.DEFINE_float('ratio', 0.01, 'Kept fraction for the sparsifiers.')
flags.DEFINE_float('target', 3.0, 'Approximate Top-k target: at most this many memory passes.')
flags.DEFINE_bool('keep_buffers', True, 'Keep freed buffers mapped (glibc mallopt) on Linux.')
FLAGS = flags.FLAGS


def _matrix_shape(n: int) -> tuple[int, int]:
  """(rows, cols) of a near-square matrix of n elements (rows * cols >= n; == n if it can)."""
  root = math.isqrt(n)
  rows = min(
    (d for d in range(max(1, root // 2), root + 1) if n % d == 0),
    key=lambda d: abs(d - math.sqrt(n)),
    default=None,
  )
  if rows is None:  # no divisor near sqrt(n): zero-pad to a power-of-two number of rows
    rows = 2 ** round(math.log2(math.sqrt(n)))
    return rows, -(-n // rows)
  return min((rows, n // rows), (n // rows, rows), key=lambda s: abs(s[0] - math.sqrt(n)))


def _candidates(jd, n: int, tau: float, ratio: float):
  """(label, compressor) pairs; the sparsifiers at `ratio`."""
  c = jd.compress
  return [
    ('topk (exact)', c.topk(ratio=ratio)),
    ('mstopk', c.mstopk(ratio=ratio)),
    ('dgc', c.dgc(ratio=ratio)),
    ('randomk', c.randomk(ratio=ratio)),
    (f'threshold (tau={tau:.3g})', c.threshold(tau=tau, ratio=ratio)),
    ('qsgd(127)', c.qsgd(levels=127)),
    ('qsgd(7)', c.qsgd(levels=7)),
    ('terngrad', c.terngrad()),
    ('sign', c.sign()),
    ('ef_sign', c.ef_sign()),
    ('onebit', c.onebit()),
    ('cast bfloat16', c.cast(dtype='bfloat16')),
    ('cast float8_e4m3fn', c.cast(dtype='float8_e4m3fn')),
    ('powersgd rank 2', c.powersgd(rank=2)),
    ('identity', c.identity()),
  ]


def _keep_buffers() -> str:
  """Stops glibc from unmapping large freed buffers (so no page faults per call)."""
  import ctypes

  try:
    libc = ctypes.CDLL('libc.so.6')
  except OSError:
    return 'allocator: default (no glibc)'
  m_trim_threshold, m_mmap_threshold = -1, -3
  libc.mallopt(m_mmap_threshold, 1 << 30)
  libc.mallopt(m_trim_threshold, (1 << 31) - 1)
  return 'allocator: freed buffers kept mapped (mallopt)'


def main(argv):
  del argv
  allocator = _keep_buffers() if FLAGS.keep_buffers else 'allocator: default'
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jaxdist as jd
  from jaxdist.train import report

  started = time.perf_counter()
  n_workers = FLAGS.workers
  ring = 2 * (n_workers - 1) / n_workers  # per-worker bytes of a ring all-reduce, per byte
  key = jax.random.key(0)
  device = jax.devices()[0]
  print(
    f'{device.platform} device ({device.device_kind}), jax {jax.__version__}; '
    f'{FLAGS.rounds} interleaved rounds, median; wire compared for N={n_workers} workers; '
    f'{allocator}'
  )

  rows = []
  approx_ratio = {}
  for n in (int(s) for s in FLAGS.sizes):
    x_np = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    tau = float(np.percentile(np.abs(x_np), 99))
    x = jax.device_put(x_np)
    dense = 4 * n

    # name -> (jitted function, args, row); the row is None for the baseline
    funcs = {'memory pass (jnp.copy)': (jax.jit(jnp.copy), (x,), None)}
    for label, c in _candidates(jd, n, tau, FLAGS.ratio):
      row = {'name': label, 'n': f'{n:,}'}
      if isinstance(c, jd.compress.PowerSGD):
        r, cols = _matrix_shape(n)
        pad = r * cols - n

        def roundtrip(v, q, c=c, r=r, cols=cols, pad=pad, n=n):
          m = (jnp.pad(v, (0, pad)) if pad else v).reshape(r, cols)
          return c.roundtrip(m, q).reshape(-1)[:n]

        fn, args = jax.jit(roundtrip), (x, c.init_q((r, cols)))
        wire = sum(c.wire_bytes((r, cols)))
        row['name'] = f'{label} [{r}x{cols}]'
        summable, sparse = True, False
      else:
        c.check(n)

        def roundtrip(v, s, k, c=c, n=n):
          payload, s = c.encode(v, s, k)
          return c.decode(payload, s, n)

        fn, args = jax.jit(roundtrip), (x, c.init(n), key)
        wire = c.wire_bytes(n)
        summable, sparse = c.summable, c.sparse
      sent = ring * wire if summable else (n_workers - 1) * wire
      row.update(
        wire=f'{wire:,}',
        frac=f'{wire / dense:.4g}',
        via='ring AR' if summable else 'all-gather',
        vs_ar=f'{sent / (ring * dense):.4g}x',
      )
      if sparse:
        k = c.kept(n)
        artopk = (n_workers - 1) / n_workers * 4 * k + ring * 4 * k
        row['vs_artopk'] = f'{artopk / (ring * dense):.4g}x'
      funcs[label] = (fn, args, row)

    # Compile and warm up (twice: the first call also compiles).
    failed = []
    for label, (fn, args, row) in funcs.items():
      try:
        for _ in range(2):
          jax.block_until_ready(fn(*args))
      except Exception as e:  # a compressor that cannot run at this size: report, go on
        failed.append(label)
        print(f'n={n:,}: {label} failed: {type(e).__name__}: {e}'.splitlines()[0])
        if row is not None:
          row['ms'] = f'failed ({type(e).__name__})'
          rows.append(row)
    for label in failed:
      del funcs[label]

    times = {label: [] for label in funcs}
    order = list(funcs)
    shuffle = random.Random(n)
    for _ in range(FLAGS.rounds):
      shuffle.shuffle(order)
      for label in order:
        fn, args, _ = funcs[label]
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times[label].append(time.perf_counter() - start)

    def summary(ts):
      med = statistics.median(ts)
      q1, _, q3 = statistics.quantiles(ts, n=4) if len(ts) > 1 else (med, med, med)
      return med * 1e3, (q3 - q1) / med

    base_ms, base_spread = summary(times['memory pass (jnp.copy)'])
    rows.append(
      {
        'name': 'memory pass (jnp.copy)',
        'n': f'{n:,}',
        'ms': f'{base_ms:.3f}',
        'spread': f'{100 * base_spread:.0f}%',
        'vs_copy': '1.00x',
        'wire': f'{dense:,}',
        'frac': '1',
        'via': '-',
      }
    )
    for label, (_, _, row) in funcs.items():
      if row is None:
        continue
      ms, spread = summary(times[label])
      row.update(ms=f'{ms:.3f}', spread=f'{100 * spread:.0f}%', vs_copy=f'{ms / base_ms:.2f}x')
      rows.append(row)
      if label in ('mstopk', 'dgc'):
        approx_ratio[(n, label)] = ms / base_ms

  print(
    report.table(
      rows,
      [
        ('name', 'compressor'),
        ('n', 'n'),
        ('ms', 'ms (median)'),
        ('spread', 'IQR/median'),
        ('vs_copy', 'vs memory pass'),
        ('wire', 'wire bytes'),
        ('frac', 'of dense'),
        ('via', 'sent by'),
        ('vs_ar', f'vs dense ring AR (N={n_workers})'),
        ('vs_artopk', 'AR-Top-k vs dense ring AR'),
      ],
    )
  )

  largest = max(int(s) for s in FLAGS.sizes)
  found = {name: r for (n, name), r in approx_ratio.items() if n == largest}
  if found:
    name = min(found, key=found.get)
    verdict = 'met' if found[name] <= FLAGS.target else 'not met'
    print(
      f'target: approximate top-k within {FLAGS.target:g}x of a memory pass at {largest:,}: '
      f'{name} {found[name]:.2f}x -> {verdict}'
    )
  else:
    print(f'target: no approximate top-k (mstopk, dgc) ran at {largest:,} -> not met')
  print(f'total time {time.perf_counter() - started:.0f} s')


if __name__ == '__main__':
  app.run(main)
