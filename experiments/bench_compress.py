r"""Encode+decode time and wire size of every compressor, against one memory pass.

For each vector size, every compressor's jitted encode+decode of the same
float32 vector (random normal, fixed seed; fixed PRNG key) is timed next to a
jitted `jnp.copy` of it: one read and one write of the vector, about the
least that reading x and writing the decoded vector can cost. After a compile
and warm-up call of each, the functions are timed in `--rounds` interleaved
rounds (every function once per round, in a shuffled order) and the median is
reported, which keeps a noisy machine's drift out of the ratios.

A compressor runs in several ways side by side: Top-k by each `selection`,
and QSGD / TernGrad with other coin widths (rows `coins ...`,
`jd.compress.with_rng_bits`) and with the coins replaced by rounding half up
(rows `no coins (rounded)`: biased, timed only), so that the coins' share of
their time is one minus the ratio. DGC's payload is checked, at every size,
equal to a direct formulation of its rule (`_dgc_direct`: a padded |x|
reshaped into rows, `argmax` down the rows, `jnp.nonzero`).

With `--prng` a second table times the random bits alone for n elements
(read p, write the coins), for each of JAX's key implementations and
`jd.compress.bernoulli`. With `--compaction` a third times the
sparsifiers' compaction alone (the k positions of a mask, in order) at a
threshold's shape (n positions, 1% held) and DGC's (2k bins, ~40% held):
packed into 32-bit words, as above 2^14 positions, and by binary searches
over every position's prefix sum, as below; the two are checked equal. With
`--gradient_models` a fourth table says what DGC sends on real gradients
(the flattened gradient of each model at 0, 50 and 200 steps of SGD with
momentum, batch 128, on the bundled digits for the CNN and synthetic CIFAR
shapes otherwise): the share of the k slots filled and of exact Top-k's
energy (sum of squares) kept, averaged over 3 keys.

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
  python experiments/bench_compress.py --results=experiments/results/compress_bench.md
"""

import math
import random
import statistics
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS


flags.DEFINE_list('sizes', ['1000000', '10000000'], 'Vector sizes (float32 elements).')
flags.DEFINE_integer('rounds', 20, 'Timed rounds (every function once each); median reported.')
flags.DEFINE_integer('workers', 8, 'Workers N for the per-worker wire comparison.')
flags.DEFINE_float('ratio', 0.01, 'Kept fraction for the sparsifiers.')
flags.DEFINE_float('target', 3.0, 'Approximate Top-k target: at most this many memory passes.')
flags.DEFINE_bool('keep_buffers', True, 'Keep freed buffers mapped (glibc mallopt) on Linux.')
flags.DEFINE_bool('prng', True, "Also time the random bits alone, for each of JAX's PRNGs.")
flags.DEFINE_bool(
  'compaction', True, "Also time the sparsifiers' compaction alone: packed words and positions."
)
flags.DEFINE_list(
  'gradient_models', ['cnn', 'resnet20'], "Models whose gradients show what DGC's bins send."
)
flags.DEFINE_list('gradient_steps', ['0', '50', '200'], 'Training steps at which to take them.')
flags.DEFINE_string('results', None, 'Also write the tables as markdown here, with the command.')

COPY = 'memory pass (jnp.copy)'  # the baseline row of the compressors' table


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


def _sampled_threshold(dgc, x, key):
  """(threshold, start key): DGC's sampled threshold, by `lax.top_k` of the sample."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  n, k = x.size, dgc.kept(x.size)
  sample_key, start_key = jax.random.split(key)
  s = min(n, max(dgc.min_sample, min(dgc.max_sample, int(n * dgc.sample_ratio))))
  sample = jnp.abs(x[jax.random.randint(sample_key, (s,), 0, n)])
  return lax.top_k(sample, max(1, round(s * k / n)))[0][-1], start_key


def _compact_direct(mask, k, offset=0):
  """(positions[k], valid[k]): the held positions from `offset` on, cyclically, by
  `jnp.roll` and `jnp.nonzero`; unfilled slots hold the mask's size."""
  import jax.numpy as jnp

  n = mask.size
  rolled = jnp.roll(mask, -offset)
  (pos,) = jnp.nonzero(rolled, size=k, fill_value=0)
  valid = jnp.arange(k) < jnp.sum(rolled)
  return jnp.where(valid, (pos + offset) % n, n).astype(jnp.int32), valid


def _dgc_direct(jd):
  """DGC's rule written directly (strided bins, `argmax`, `jnp.nonzero`): the reference."""
  import jax
  import jax.numpy as jnp

  from jaxdist.compress.sparsify import _gather

  class DGCDirect(jd.compress.DGC):
    def encode(self, x, state, key):
      n, k = x.size, self.kept(x.size)
      threshold, start_key = _sampled_threshold(self, x, key)
      bins = min(n, self.bins_per_k * k)
      rows = -(-n // bins)
      a = jnp.abs(x)
      a = jnp.pad(jnp.where(jnp.isnan(a), -1.0, a), (0, rows * bins - n), constant_values=-1.0)
      a = a.reshape(rows, bins)  # bin j is column j: x[j], x[j + bins], ...
      largest, row = jnp.max(a, axis=0), jnp.argmax(a, axis=0)
      start = jax.random.randint(start_key, (), 0, bins)
      chosen, valid = _compact_direct(largest >= threshold, k, start)
      chosen = jnp.minimum(chosen, bins - 1)  # unfilled slots read a real bin; _gather drops them
      return _gather(x, row[chosen] * bins + chosen, valid), state

  return DGCDirect


def _model_gradients(jd, name: str, steps: list[int]) -> dict:
  """step -> the flattened float32 gradient of model `name` after that many SGD steps."""
  import jax
  import numpy as np
  import optax
  from jax.flatten_util import ravel_pytree

  data = jd.data.load('digits') if name in ('cnn', 'mlp') else jd.data.synthetic(train_size=1024)
  model = jd.models.get(name, data.num_classes)
  images, labels = data.normalize(data.train.images), data.train.labels
  params = model.init(jax.random.key(0), images[:2])

  def loss(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

  opt = optax.sgd(0.05, momentum=0.9)
  grad, state, rng, out = jax.jit(jax.grad(loss)), opt.init(params), np.random.default_rng(0), {}
  for step in range(max(steps) + 1):
    batch = rng.choice(len(images), 128, replace=False)
    g = grad(params, images[batch], labels[batch])
    if step in steps:
      out[step] = np.asarray(ravel_pytree(g)[0], np.float32)
    updates, state = opt.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return out


def _bins_rows(jd, models: list[str], steps: list[int]) -> list[dict]:
  """The gradients table: what DGC's strided bins send on model gradients."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  rows = []
  for name in models:
    for step, g in _model_gradients(jd, name, steps).items():
      n = g.size
      top = np.sort(np.abs(g).astype(np.float64))
      for ratio in (0.01, 0.001):
        c = jd.compress.dgc(ratio=ratio)
        k = c.kept(n)
        energy = np.sum(top[-k:] ** 2)
        encode = jax.jit(lambda v, key, c=c, n=n: c.encode(v, c.init(n), key)[0])
        filled, kept = [], []
        for seed in range(3):
          values, idx = (np.asarray(a) for a in encode(jnp.asarray(g), jax.random.key(seed)))
          filled.append(np.mean(idx < n))
          kept.append(np.sum(values.astype(np.float64) ** 2) / energy)
        rows.append(
          {
            'model': name,
            'n': f'{n:,}',
            'step': step,
            'ratio': ratio,
            'filled': f'{np.mean(filled):.0%}',
            'kept': f'{np.mean(kept):.0%}',
          }
        )
  return rows


def _candidates(jd, tau: float, ratio: float):
  """(label, compressor) pairs; the sparsifiers at `ratio`."""
  c = jd.compress
  # the same work with the coins replaced by rounding half up: what the coins cost is the rest
  rounded = lambda cls: type(f'{cls.__name__}Rounded', (cls,), {'coins': lambda _, k, p: p >= 0.5})
  return [
    ('topk (exact, lax.top_k)', c.topk(ratio=ratio, selection='top_k')),
    ('topk (exact, bisect)', c.topk(ratio=ratio, selection='bisect')),
    ('topk (exact, candidates)', c.topk(ratio=ratio, selection='candidates')),
    ('mstopk', c.mstopk(ratio=ratio)),
    ('dgc', c.dgc(ratio=ratio)),
    ('randomk', c.randomk(ratio=ratio)),
    (f'threshold (tau={tau:.3g})', c.threshold(tau=tau, ratio=ratio)),
    ('qsgd(127)', c.qsgd(levels=127)),
    ('qsgd(127) coins 8-bit', c.with_rng_bits(c.qsgd(levels=127), 8)),
    ('qsgd(127) coins 32-bit', c.with_rng_bits(c.qsgd(levels=127), 32)),
    ('qsgd(127) coins jax.random.bernoulli', c.with_rng_bits(c.qsgd(levels=127), None)),
    ('qsgd(127) no coins (rounded)', rounded(c.QSGD)(levels=127)),
    ('qsgd(7)', c.qsgd(levels=7)),
    ('terngrad', c.terngrad()),
    ('terngrad coins 8-bit', c.with_rng_bits(c.terngrad(), 8)),
    ('terngrad coins 32-bit', c.with_rng_bits(c.terngrad(), 32)),
    ('terngrad no coins (rounded)', rounded(c.TernGrad)()),
    ('sign', c.sign()),
    ('ef_sign', c.ef_sign()),
    ('onebit', c.onebit()),
    ('cast bfloat16', c.cast(dtype='bfloat16')),
    ('cast float8_e4m3fn', c.cast(dtype='float8_e4m3fn')),
    ('powersgd rank 2', c.powersgd(rank=2)),
    ('identity', c.identity()),
  ]


def _roundtrip(jd, c, n: int, x, key) -> tuple:
  """(jitted encode+decode, its args, wire bytes, summable, sparse, matrix note) of `c` on x."""
  import jax
  import jax.numpy as jnp

  if isinstance(c, jd.compress.PowerSGD):
    r, cols = _matrix_shape(n)
    pad = r * cols - n

    def low_rank(v, q):
      m = (jnp.pad(v, (0, pad)) if pad else v).reshape(r, cols)
      return c.roundtrip(m, q).reshape(-1)[:n]

    wire = sum(c.wire_bytes((r, cols)))
    return jax.jit(low_rank), (x, c.init_q((r, cols))), wire, True, False, f' [{r}x{cols}]'
  c.check(n)

  def roundtrip(v, s, k):
    payload, s = c.encode(v, s, k)
    return c.decode(payload, s, n)

  return jax.jit(roundtrip), (x, c.init(n), key), c.wire_bytes(n), c.summable, c.sparse, ''


def _compressor_functions(jd, n: int, x, tau: float, key) -> dict:
  """The compressors' table: (table, label) -> (jitted encode+decode, args, row) at size n."""
  n_workers = FLAGS.workers
  ring = 2 * (n_workers - 1) / n_workers  # per-worker bytes of a ring all-reduce, per byte
  dense = 4 * n
  out = {}
  for label, c in _candidates(jd, tau, FLAGS.ratio):
    fn, args, wire, summable, sparse, shape = _roundtrip(jd, c, n, x, key)
    sent = ring * wire if summable else (n_workers - 1) * wire
    row = {
      'name': label + shape,
      'n': f'{n:,}',
      'wire': f'{wire:,}',
      'frac': f'{wire / dense:.4g}',
      'via': 'ring AR' if summable else 'all-gather',
      'vs_ar': f'{sent / (ring * dense):.4g}x',
    }
    if sparse:
      k = c.kept(n)
      artopk = (n_workers - 1) / n_workers * 4 * k + ring * 4 * k
      row['vs_artopk'] = f'{artopk / (ring * dense):.4g}x'
    out[('compressors', label)] = (fn, args, row)
  return out


def _dgc_note(jd, n: int, x, key) -> str:
  """Whether DGC sends what its rule, written directly (`_dgc_direct`), sends."""
  import jax
  import numpy as np

  payloads = [
    jax.jit(lambda v, k, c=c: c.encode(v, c.init(n), k)[0])(x, key)
    for c in (jd.compress.dgc(ratio=FLAGS.ratio), _dgc_direct(jd)(ratio=FLAGS.ratio))
  ]
  same = all(np.array_equal(a, b) for a, b in zip(*payloads, strict=True))
  return f'n={n:,}: dgc payload equals its rule written directly: {"yes" if same else "NO"}'


# JAX's key implementations, timed drawing n 32-bit words, with what stops their use here
_PRNG_NOTES = {
  'threefry2x32': "JAX's default; on the CPU a 5-step loop over full-size temporaries",
  'threefry4x32': '',
  'philox4x32': 'mulhi fails to lower inside shard_map (jax 0.10)',
  'philox2x32': '32-bit keys',
  'rbg': 'under vmap, every key draws from the first key',
  'unsafe_rbg': 'under vmap, every key draws from the first key',
}


def _prng_draws(jd):
  """(label, function of (p, key), note): coins or bits for p's elements, each way."""
  import jax
  import jax.numpy as jnp

  def bits_with(impl):
    words = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape[0]

    def draw(p, key):
      k = (
        key
        if impl == 'threefry2x32'
        else jax.random.wrap_key_data(jax.random.bits(key, (words,), jnp.uint32), impl=impl)
      )
      return jax.random.bits(k, p.shape, jnp.uint32)

    return draw

  bernoulli = lambda p, key: jax.random.bernoulli(key, p)
  out = [('coins: jax.random.bernoulli (threefry)', bernoulli, '23-bit floats')]
  for impl, note in _PRNG_NOTES.items():
    out.append((f'bits: jax.random.bits, {impl}', bits_with(impl), note))
  for b in jd.compress.RNG_BITS:
    default = ' (default)' if b == jd.compress.qsgd.rng_bits else ''
    out.append(
      (
        f'coins: jd.compress.bernoulli {b}-bit{default}',
        lambda p, key, b=b: jd.compress.bernoulli(key, p, b),
        'threefry2x32 unrolled, 64 bits a hash',
      )
    )
  return out


def _prng_functions(jd, n: int, key) -> dict:
  """The random bits' table: (table, label) -> (jitted draw, args, row) for n elements."""
  import jax
  import numpy as np

  p = jax.device_put(np.random.default_rng(1).random(n, dtype=np.float32))
  out = {}
  for label, draw, note in _prng_draws(jd):
    row = {'name': label, 'n': f'{n:,}', 'note': note}
    out[('prng', label)] = (jax.jit(draw), (p, key), row)
  return out


def _compaction_functions(jd, n: int) -> tuple[dict, list[str]]:
  """The compaction table: (table, label) -> (jitted compaction, args, row), and its checks.

  A threshold's shape (n positions, 1% held, k = ratio·n slots) and DGC's
  (2k bins, ~40% held, k slots), each by `_compact_counted` (masks above
  2^14 packed into words) and by `_compact_by_positions` (binary searches
  over every position's prefix sum, the way for short masks); the notes say
  whether the two agree.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  sparsify = jd.compress.sparsify
  k = jd.compress.base.num_kept(n, FLAGS.ratio)
  rng = np.random.default_rng(2)
  out, notes = {}, []
  for shape, m, held in (('threshold', n, FLAGS.ratio), ('dgc bins', min(n, 2 * k), 0.4)):
    mask = jax.device_put(jnp.asarray(rng.random(m) < held))
    results = []
    for way, fn in (
      ('packed words', sparsify._compact_counted),
      ('positions', sparsify._compact_by_positions),
    ):
      label = f'{shape}: {way}'
      jitted = jax.jit(lambda a, fn=fn: fn(a, k, 7))
      row = {'name': label, 'n': f'{n:,}', 'mask': f'{mask.size:,}', 'k': f'{k:,}'}
      out[('compaction', label)] = (jitted, (mask,), row)
      results.append(jitted(mask))
    same = all(np.array_equal(a, b) for a, b in zip(*results, strict=True))
    notes.append(f'n={n:,}: compaction ({shape}) by words equals by positions: '
                 f'{"yes" if same else "NO"}')  # fmt: skip
  return out, notes


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


def _warm_up(funcs: dict, n: int, tables: dict) -> None:
  """Compiles and runs each function twice; drops those that fail, with a row saying so."""
  import jax

  failed = []
  for key, (fn, args, row) in funcs.items():
    try:
      for _ in range(2):  # the first call also compiles
        jax.block_until_ready(fn(*args))
    except Exception as e:  # a compressor that cannot run at this size: report, go on
      failed.append(key)
      print(f'n={n:,}: {key[1]} failed: {type(e).__name__}: {e}'.splitlines()[0])
      if row is not None:
        row['ms'] = f'failed ({type(e).__name__})'
        tables[key[0]].append(row)
  for key in failed:
    del funcs[key]


def _time(funcs, rounds: int, seed: int) -> dict:
  """label -> list of seconds per call: every function once per round, shuffled order."""
  import jax

  times = {label: [] for label in funcs}
  order = list(funcs)
  shuffle = random.Random(seed)
  for _ in range(rounds):
    shuffle.shuffle(order)
    for label in order:
      fn, args = funcs[label][:2]
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[label].append(time.perf_counter() - start)
  return times


def _summary(ts):
  med = statistics.median(ts)
  q1, _, q3 = statistics.quantiles(ts, n=4) if len(ts) > 1 else (med, med, med)
  return med * 1e3, (q3 - q1) / med


def _run_size(jd, n: int, tables: dict, notes: list, ms_of: dict) -> None:
  """Times every table's functions at size n, interleaved; their rows go to `tables`."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  x_np = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
  tau = float(np.percentile(np.abs(x_np), 99))
  x, key = jax.device_put(x_np), jax.random.key(0)
  # (table, label) -> (jitted function, args, row); the row is None for the baseline
  funcs = {('compressors', COPY): (jax.jit(jnp.copy), (x,), None)}
  funcs |= _compressor_functions(jd, n, x, tau, key)
  checks = [_dgc_note(jd, n, x, key)]
  if FLAGS.prng:
    funcs |= _prng_functions(jd, n, key)
  if FLAGS.compaction:
    compaction, compaction_notes = _compaction_functions(jd, n)
    funcs |= compaction
    checks += compaction_notes
  for line in checks:
    print(line)
  notes += checks

  _warm_up(funcs, n, tables)
  times = _time(funcs, FLAGS.rounds, seed=n)
  base_ms, base_spread = _summary(times[('compressors', COPY)])
  tables['compressors'].append(
    {
      'name': COPY,
      'n': f'{n:,}',
      'ms': f'{base_ms:.3f}',
      'spread': f'{100 * base_spread:.0f}%',
      'vs_copy': '1.00x',
      'wire': f'{4 * n:,}',
      'frac': '1',
      'via': '-',
    }
  )
  for (table, label), (_, _, row) in funcs.items():
    if row is None:
      continue
    ms, spread = _summary(times[(table, label)])
    if table == 'compressors':
      ms_of[(n, label)] = ms
    row.update(ms=f'{ms:.3f}', spread=f'{100 * spread:.0f}%', vs_copy=f'{ms / base_ms:.2f}x')
    tables[table].append(row)


def _columns(n_workers: int) -> dict:
  """table -> its (key, heading) columns, in the order the tables are printed."""
  return {
    'compressors': [
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
    'prng': [
      ('name', 'random bits for n elements'),
      ('n', 'n'),
      ('ms', 'ms (median)'),
      ('spread', 'IQR/median'),
      ('vs_copy', 'vs memory pass'),
      ('note', 'note'),
    ],
    'compaction': [
      ('name', 'compaction alone'),
      ('n', 'n'),
      ('mask', 'mask positions'),
      ('k', 'slots'),
      ('ms', 'ms (median)'),
      ('spread', 'IQR/median'),
      ('vs_copy', 'vs memory pass of n'),
    ],
    'bins': [
      ('model', "DGC's bins on gradients"),
      ('n', 'n'),
      ('step', 'step'),
      ('ratio', 'ratio'),
      ('filled', 'slots filled'),
      ('kept', 'top-k energy kept'),
    ],
  }


def _topk_verdict(ms_of: dict, copy_ms: float | None, largest: int) -> str:
  """Whether the faster approximate top-k (mstopk, dgc) is within `--target` memory passes."""
  found = {s: ms_of[(largest, s)] for s in ('mstopk', 'dgc') if (largest, s) in ms_of}
  if not (found and copy_ms):
    return f'target: no approximate top-k (mstopk, dgc) ran at {largest:,} -> not met'
  name = min(found, key=found.get)
  ratio = found[name] / copy_ms
  verdict = 'met' if ratio <= FLAGS.target else 'not met'
  return (
    f'target: approximate top-k within {FLAGS.target:g}x of a memory pass at {largest:,}: '
    f'{name} {ratio:.2f}x -> {verdict}'
  )


def _coins_verdict(ms_of: dict, largest: int) -> list[str]:
  """Whether the coins take under half of QSGD's and TernGrad's time (none if not timed)."""
  parts, dominant = [], False
  for name in ('qsgd(127)', 'terngrad'):
    got = [ms_of.get((largest, f'{name}{s}')) for s in ('', ' no coins (rounded)')]
    if all(got):
      share = 1 - got[1] / got[0]
      dominant |= share > 0.5
      parts.append(f'{name} {got[0]:.3g} ms, {got[1]:.3g} ms without coins: coins {share:.0%}')
  if not parts:
    return []
  return [
    f'target (random bits no longer dominant, i.e. under half the time) at {largest:,}: '
    + '; '.join(parts)
    + f' -> {"not met" if dominant else "met"}'
  ]


def _verdicts(rows: list[dict], ms_of: dict) -> list[str]:
  """The targets, judged at the largest size."""
  largest = max(int(s) for s in FLAGS.sizes)
  copy_ms = next(
    (float(r['ms']) for r in rows if r['name'] == COPY and r['n'] == f'{largest:,}'), None
  )
  return [_topk_verdict(ms_of, copy_ms, largest), *_coins_verdict(ms_of, largest)]


def _write_results(path: str, tables: dict, columns: dict, lines: list[str]) -> None:
  """The tables as markdown after the command, machine and date, then `lines` as a list."""
  from jaxdist.train import report

  command = ' '.join(['python', *sys.argv])
  text = [report.provenance(command), '']
  for name, rows in tables.items():
    if rows:
      text += [report.markdown(rows, columns[name]), '']
  text += [f'- {line}' for line in lines]
  with open(path, 'w') as f:
    f.write('\n'.join(text) + '\n')


def main(argv):
  del argv
  allocator = _keep_buffers() if FLAGS.keep_buffers else 'allocator: default'
  import jax

  import jaxdist as jd
  from jaxdist.train import report

  started = time.perf_counter()
  device = jax.devices()[0]
  print(
    f'{device.platform} device ({device.device_kind}), jax {jax.__version__}; '
    f'{FLAGS.rounds} interleaved rounds, median; wire compared for N={FLAGS.workers} workers; '
    f'{allocator}'
  )
  columns = _columns(FLAGS.workers)
  tables = {name: [] for name in columns}
  notes, ms_of = [], {}  # ms_of: (n, compressor label) -> median ms
  for n in (int(s) for s in FLAGS.sizes):
    _run_size(jd, n, tables, notes, ms_of)
  steps = [int(s) for s in FLAGS.gradient_steps]
  tables['bins'] = _bins_rows(jd, FLAGS.gradient_models, steps)
  printed = [report.table(rows, columns[name]) for name, rows in tables.items() if rows]
  print('\n\n'.join(printed))
  verdicts = _verdicts(tables['compressors'], ms_of)
  for line in verdicts:
    print(line)
  print(f'total time {time.perf_counter() - started:.0f} s')
  if FLAGS.results:
    _write_results(FLAGS.results, tables, columns, notes + verdicts)


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
