r"""Encode+decode time and wire size of every compressor, against one memory pass.

For each vector size, every compressor's jitted encode+decode of the same
float32 vector (random normal, fixed seed; fixed PRNG key) is timed next to a
jitted `jnp.copy` of it: one read and one write of the vector, about the
least that reading x and writing the decoded vector can cost. After a compile
and warm-up call of each, the functions are timed in `--rounds` interleaved
rounds (every function once per round, in a shuffled order) and the median is
reported, which keeps a noisy machine's drift out of the ratios.

The earlier implementations beside the current ones, in the same rounds: rows
marked `before` run them (copied below: QSGD and
TernGrad drawing their coins with `jax.random.bernoulli`, threefry; DGC with
`lax.top_k` of the sample, an abs of x and `jnp.nonzero`, over contiguous
bins). DGC's bins are strided now, so its payload is not the `before`
one: at every size it is checked equal to a direct formulation
of its rule (`_dgc_direct`: a padded |x| reshaped into rows, `argmax` down
the rows, `jnp.nonzero`). With `--gradient_models` a fourth table says what
the two layouts send on real gradients (the flattened gradient of each model
at 0, 50 and 200 steps of SGD with momentum, batch 128, on the bundled digits
for the CNN and synthetic CIFAR shapes otherwise): the share of the k slots
filled and of exact Top-k's energy (sum of squares) kept, averaged over 3
keys. Rows `coins ...` are
the same QSGD / TernGrad with other coin widths (`jd.compress.with_rng_bits`),
and rows `no coins (rounded)` the same work with the coins replaced by
rounding half up (biased; timed only): the coins' share of QSGD's and
TernGrad's time is one minus the ratio, now and before. With `--prng` a
second table times the random bits alone for n elements (read p, write the
coins), for each of JAX's key implementations and `jd.compress.bernoulli`.
With `--compaction` a third times the sparsifiers' compaction alone (the k
positions of a mask, in order) at a threshold's shape (n positions, 1% held)
and DGC's (2k bins, ~40% held): packed into 32-bit words, as now above 2^14
positions, and by binary searches over every position's prefix sum, as
before (and still below); the two are checked equal.

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
flags.DEFINE_bool('before', True, 'Also time the earlier implementations (copied here).')
flags.DEFINE_bool('prng', True, "Also time the random bits alone, for each of JAX's PRNGs.")
flags.DEFINE_bool(
  'compaction', True, "Also time the sparsifiers' compaction alone: packed words and before."
)
flags.DEFINE_list(
  'gradient_models', ['cnn', 'resnet20'], "Models whose gradients show what DGC's bins send."
)
flags.DEFINE_list('gradient_steps', ['0', '50', '200'], 'Training steps at which to take them.')
flags.DEFINE_string('results', None, 'Also write the tables as markdown here, with the command.')


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
  """(threshold, start key): DGC's sampled threshold by `lax.top_k`, as it was."""
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
  `jnp.roll` and `jnp.nonzero` (as it was); unfilled slots hold the mask's size."""
  import jax.numpy as jnp

  n = mask.size
  rolled = jnp.roll(mask, -offset)
  (pos,) = jnp.nonzero(rolled, size=k, fill_value=0)
  valid = jnp.arange(k) < jnp.sum(rolled)
  return jnp.where(valid, (pos + offset) % n, n).astype(jnp.int32), valid


def _before_classes(jd):
  """QSGD, TernGrad and DGC as they were, for side-by-side rows."""
  import jax
  import jax.numpy as jnp

  c = jd.compress
  from jaxdist.compress.sparsify import _gather

  def unbucket(b, n):
    return b.reshape(-1)[:n]

  class QSGDBefore(c.QSGD):
    def coins(self, key, p):
      return jax.random.bernoulli(key, p)

    def encode(self, x, state, key):
      b = c.buckets(x, self.bucket_size)
      norm = jnp.linalg.norm(b, axis=1)
      scaled = self.levels * jnp.abs(b) / jnp.where(norm > 0, norm, 1.0)[:, None]
      floor = jnp.floor(scaled)
      level = floor + self.coins(key, scaled - floor)
      code = (jnp.sign(b) * level + self.levels).astype(jnp.uint8)
      return (norm, c.pack_bits(unbucket(code, x.size), self.bits)), state

    def decode(self, payload, state, n):
      norm, packed = payload
      code = c.unpack_bits(packed, self.bits, n).astype(jnp.float32) - self.levels
      return unbucket(c.buckets(code, self.bucket_size) * norm[:, None] / self.levels, n)

  class TernGradBefore(c.TernGrad):
    def coins(self, key, p):
      return jax.random.bernoulli(key, p)

    def encode(self, x, state, key):
      b = c.buckets(x, self.bucket_size)
      scale = jnp.max(jnp.abs(b), axis=1)
      keep = self.coins(key, jnp.abs(b) / jnp.where(scale > 0, scale, 1.0)[:, None])
      code = (jnp.sign(b) * keep + 1).astype(jnp.uint8)
      return (scale, c.pack_bits(unbucket(code, x.size), 2)), state

    def decode(self, payload, state, n):
      scale, packed = payload
      code = c.unpack_bits(packed, 2, n).astype(jnp.float32) - 1
      return unbucket(c.buckets(code, self.bucket_size) * scale[:, None], n)

  class DGCBefore(c.DGC):
    def encode(self, x, state, key):
      n, k = x.size, self.kept(x.size)
      threshold, start_key = _sampled_threshold(self, x, key)
      bins = min(n, self.bins_per_k * k)
      width = -(-n // bins)
      a = jnp.pad(jnp.abs(x), (0, bins * width - n), constant_values=-1.0).reshape(bins, width)
      largest = jnp.max(a, axis=1)
      start = jax.random.randint(start_key, (), 0, bins)
      chosen, valid = _compact_direct(largest >= threshold, k, start)
      rows = a.at[chosen].get(mode='fill', fill_value=-1.0)
      top = largest.at[chosen].get(mode='fill', fill_value=-2.0)
      at = jnp.min(
        jnp.where(rows == top[:, None], jnp.arange(width, dtype=jnp.int32), width), axis=1
      )
      return _gather(x, chosen * width + at, valid), state

  return QSGDBefore, TernGradBefore, DGCBefore


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
  """What DGC sends on model gradients, strided bins (now) against contiguous (before)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  _, _, dgc_before = _before_classes(jd)
  rows = []
  for name in models:
    for step, g in _model_gradients(jd, name, steps).items():
      n = g.size
      top = np.sort(np.abs(g).astype(np.float64))
      for ratio in (0.01, 0.001):
        row = {'model': name, 'n': f'{n:,}', 'step': step, 'ratio': ratio}
        for label, c in (
          ('now', jd.compress.dgc(ratio=ratio)),
          ('before', dgc_before(ratio=ratio)),
        ):
          k = c.kept(n)
          energy = np.sum(top[-k:] ** 2)
          encode = jax.jit(lambda v, key, c=c, n=n: c.encode(v, c.init(n), key)[0])
          filled, kept = [], []
          for seed in range(3):
            values, idx = (np.asarray(a) for a in encode(jnp.asarray(g), jax.random.key(seed)))
            filled.append(np.mean(idx < n))
            kept.append(np.sum(values.astype(np.float64) ** 2) / energy)
          row[f'filled_{label}'] = f'{np.mean(filled):.0%}'
          row[f'kept_{label}'] = f'{np.mean(kept):.0%}'
        rows.append(row)
  return rows


def _candidates(jd, tau: float, ratio: float, before: bool):
  """(label, compressor) pairs; the sparsifiers at `ratio`; `before` rows after their own."""
  c = jd.compress
  qsgd_before, terngrad_before, dgc_before = _before_classes(jd)
  # the same work with the coins replaced by rounding half up: what the coins cost is the rest
  rounded = lambda cls: type(f'{cls.__name__}Rounded', (cls,), {'coins': lambda _, k, p: p >= 0.5})
  out = [
    ('topk (exact, lax.top_k)', c.topk(ratio=ratio, selection='top_k')),
    ('topk (exact, bisect)', c.topk(ratio=ratio, selection='bisect')),
    ('topk (exact, candidates)', c.topk(ratio=ratio, selection='candidates')),
    ('mstopk', c.mstopk(ratio=ratio)),
    ('dgc', c.dgc(ratio=ratio)),
    ('dgc before', dgc_before(ratio=ratio)),
    ('randomk', c.randomk(ratio=ratio)),
    (f'threshold (tau={tau:.3g})', c.threshold(tau=tau, ratio=ratio)),
    ('qsgd(127)', c.qsgd(levels=127)),
    ('qsgd(127) before', qsgd_before(levels=127)),
    ('qsgd(127) coins 8-bit', c.with_rng_bits(c.qsgd(levels=127), 8)),
    ('qsgd(127) coins 32-bit', c.with_rng_bits(c.qsgd(levels=127), 32)),
    ('qsgd(127) coins jax.random.bernoulli', c.with_rng_bits(c.qsgd(levels=127), None)),
    ('qsgd(127) no coins (rounded)', rounded(c.QSGD)(levels=127)),
    ('qsgd(127) before, no coins (rounded)', rounded(qsgd_before)(levels=127)),
    ('qsgd(7)', c.qsgd(levels=7)),
    ('qsgd(7) before', qsgd_before(levels=7)),
    ('terngrad', c.terngrad()),
    ('terngrad before', terngrad_before()),
    ('terngrad coins 8-bit', c.with_rng_bits(c.terngrad(), 8)),
    ('terngrad coins 32-bit', c.with_rng_bits(c.terngrad(), 32)),
    ('terngrad no coins (rounded)', rounded(c.TernGrad)()),
    ('terngrad before, no coins (rounded)', rounded(terngrad_before)()),
    ('sign', c.sign()),
    ('ef_sign', c.ef_sign()),
    ('onebit', c.onebit()),
    ('cast bfloat16', c.cast(dtype='bfloat16')),
    ('cast float8_e4m3fn', c.cast(dtype='float8_e4m3fn')),
    ('powersgd rank 2', c.powersgd(rank=2)),
    ('identity', c.identity()),
  ]
  if not before:
    out = [(label, comp) for label, comp in out if 'before' not in label and 'coins' not in label]
  return out


# JAX's key implementations, timed drawing n 32-bit words, with what stops their use here
_PRNG_NOTES = {
  'threefry2x32': "JAX's default; on the CPU a 5-step loop over full-size temporaries",
  'threefry4x32': '',
  'philox4x32': 'mulhi fails to lower inside shard_map (jax 0.10)',
  'philox2x32': '32-bit keys',
  'rbg': 'under vmap, every key draws from the first key',
  'unsafe_rbg': 'under vmap, every key draws from the first key',
}


def _prng_functions(jd, n: int):
  """(label, function of (p, key), note): coins or bits for n elements, each way."""
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

  before = lambda p, key: jax.random.bernoulli(key, p)
  out = [('coins: jax.random.bernoulli (threefry; before)', before, '23-bit floats')]
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


def _compaction_functions(jd, n: int, ratio: float):
  """(label, function, mask, k) for the compaction alone at two shapes of a size-n vector.

  A threshold's (n positions, 1% held, k = ratio·n slots) and DGC's (2k bins,
  ~40% held, k slots), each by `_compact_counted` (masks above 2^14 packed
  into words) and by `_compact_by_positions` (binary searches over every
  position's prefix sum: the way before, and still the way for short masks).
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  sparsify = jd.compress.sparsify
  k = jd.compress.base.num_kept(n, ratio)
  rng = np.random.default_rng(2)
  out = []
  for shape, m, held in (('threshold', n, ratio), ('dgc bins', min(n, 2 * k), 0.4)):
    mask = jax.device_put(jnp.asarray(rng.random(m) < held))
    for way, fn in (
      ('packed words', sparsify._compact_counted),
      ('positions', sparsify._compact_by_positions),
    ):
      out.append((f'{shape}: {way}', jax.jit(lambda a, fn=fn: fn(a, k, 7)), mask, k))
  return out


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


def _rows_for(label: str, rows: list, prng_rows: list, compact_rows: list) -> list:
  """The table a timed function's row goes to, by its label's prefix."""
  if label.startswith('prng: '):
    return prng_rows
  return compact_rows if label.startswith('compact: ') else rows


def _summary(ts):
  med = statistics.median(ts)
  q1, _, q3 = statistics.quantiles(ts, n=4) if len(ts) > 1 else (med, med, med)
  return med * 1e3, (q3 - q1) / med


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

  rows, prng_rows, compact_rows, notes = [], [], [], []
  ms_of = {}  # (n, label) -> median ms
  for n in (int(s) for s in FLAGS.sizes):
    x_np = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    tau = float(np.percentile(np.abs(x_np), 99))
    x = jax.device_put(x_np)
    dense = 4 * n

    # name -> (jitted function, args, row); the row is None for the baseline
    funcs = {'memory pass (jnp.copy)': (jax.jit(jnp.copy), (x,), None)}
    for label, c in _candidates(jd, tau, FLAGS.ratio, FLAGS.before):
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

    # DGC must send what its rule, written directly, sends
    payloads = [
      jax.jit(lambda v, k, c=c, n=n: c.encode(v, c.init(n), k)[0])(x, key)
      for c in (jd.compress.dgc(ratio=FLAGS.ratio), _dgc_direct(jd)(ratio=FLAGS.ratio))
    ]
    same = all(np.array_equal(a, b) for a, b in zip(*payloads, strict=True))
    notes.append(
      f'n={n:,}: dgc payload equals its rule written directly: {"yes" if same else "NO"}'
    )
    print(notes[-1])

    if FLAGS.prng:
      p = jax.device_put(np.random.default_rng(1).random(n, dtype=np.float32))
      for label, draw, note in _prng_functions(jd, n):
        row = {'name': label, 'n': f'{n:,}', 'note': note}
        funcs[f'prng: {label}'] = (jax.jit(draw), (p, key), row)

    if FLAGS.compaction:
      results = {}
      for label, fn, mask, k in _compaction_functions(jd, n, FLAGS.ratio):
        row = {'name': label, 'n': f'{n:,}', 'mask': f'{mask.size:,}', 'k': f'{k:,}'}
        funcs[f'compact: {label}'] = (fn, (mask,), row)
        results.setdefault(label.split(':')[0], []).append(fn(mask))
      for shape, (words, positions) in results.items():
        same = all(np.array_equal(a, b) for a, b in zip(words, positions, strict=True))
        notes.append(f'n={n:,}: compaction ({shape}) by words equals by positions: '
                     f'{"yes" if same else "NO"}')  # fmt: skip
        print(notes[-1])

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
          _rows_for(label, rows, prng_rows, compact_rows).append(row)
    for label in failed:
      del funcs[label]

    times = _time(funcs, FLAGS.rounds, seed=n)
    base_ms, base_spread = _summary(times['memory pass (jnp.copy)'])
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
      ms, spread = _summary(times[label])
      ms_of[(n, label)] = ms
      row.update(ms=f'{ms:.3f}', spread=f'{100 * spread:.0f}%', vs_copy=f'{ms / base_ms:.2f}x')
      _rows_for(label, rows, prng_rows, compact_rows).append(row)

  columns = [
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
  ]
  prng_columns = [
    ('name', 'random bits for n elements'),
    ('n', 'n'),
    ('ms', 'ms (median)'),
    ('spread', 'IQR/median'),
    ('vs_copy', 'vs memory pass'),
    ('note', 'note'),
  ]
  compact_columns = [
    ('name', 'compaction alone'),
    ('n', 'n'),
    ('mask', 'mask positions'),
    ('k', 'slots'),
    ('ms', 'ms (median)'),
    ('spread', 'IQR/median'),
    ('vs_copy', 'vs memory pass of n'),
  ]
  print(report.table(rows, columns))
  if prng_rows:
    print()
    print(report.table(prng_rows, prng_columns))
  if compact_rows:
    print()
    print(report.table(compact_rows, compact_columns))
  bins_rows = _bins_rows(jd, FLAGS.gradient_models, [int(s) for s in FLAGS.gradient_steps])
  bins_columns = [
    ('model', "DGC's bins on gradients"),
    ('n', 'n'),
    ('step', 'step'),
    ('ratio', 'ratio'),
    ('filled_now', 'slots filled (strided)'),
    ('filled_before', 'slots filled (contiguous, before)'),
    ('kept_now', 'top-k energy kept (strided)'),
    ('kept_before', 'top-k energy kept (contiguous, before)'),
  ]
  if bins_rows:
    print()
    print(report.table(bins_rows, bins_columns))

  largest = max(int(s) for s in FLAGS.sizes)
  verdicts = []
  found = {s: ms_of[(largest, s)] for s in ('mstopk', 'dgc') if (largest, s) in ms_of}
  copy_ms = next(
    (float(r['ms']) for r in rows if r['name'].startswith('memory') and r['n'] == f'{largest:,}'),
    None,
  )
  if found and copy_ms:
    name = min(found, key=found.get)
    ratio = found[name] / copy_ms
    verdict = 'met' if ratio <= FLAGS.target else 'not met'
    line = (
      f'target: approximate top-k within {FLAGS.target:g}x of a memory pass at {largest:,}: '
      f'{name} {ratio:.2f}x -> {verdict}'
    )
    if (largest, 'dgc before') in ms_of:
      line += f' (dgc before: {ms_of[(largest, "dgc before")] / copy_ms:.2f}x)'
  else:
    line = f'target: no approximate top-k (mstopk, dgc) ran at {largest:,} -> not met'
  verdicts.append(line)
  parts, dominant = [], False
  for name in ('qsgd(127)', 'terngrad'):
    got = [ms_of.get((largest, f'{name}{s}')) for s in ('', ' no coins (rounded)')]
    was = [ms_of.get((largest, f'{name}{s}')) for s in (' before', ' before, no coins (rounded)')]
    if all(got + was):
      share, share_was = 1 - got[1] / got[0], 1 - was[1] / was[0]
      dominant |= share > 0.5
      parts.append(
        f'{name} {got[0]:.3g} ms, {got[1]:.3g} ms without coins: coins {share:.0%} '
        f'(before {was[0]:.3g} ms, {was[1]:.3g} ms without: {share_was:.0%})'
      )
  if parts:
    verdicts.append(
      f'target (random bits no longer dominant, i.e. under half the time) at {largest:,}: '
      + '; '.join(parts)
      + f' -> {"not met" if dominant else "met"}'
    )
  for line in verdicts:
    print(line)
  print(f'total time {time.perf_counter() - started:.0f} s')

  if FLAGS.results:
    command = ' '.join(['python', *sys.argv])
    text = [report.provenance(command), '', report.markdown(rows, columns), '']
    if prng_rows:
      text += [report.markdown(prng_rows, prng_columns), '']
    if compact_rows:
      text += [report.markdown(compact_rows, compact_columns), '']
    if bins_rows:
      text += [report.markdown(bins_rows, bins_columns), '']
    text += [f'- {line}' for line in notes + verdicts]
    with open(FLAGS.results, 'w') as f:
      f.write('\n'.join(text) + '\n')


if __name__ == '__main__':
  app.run(main)
