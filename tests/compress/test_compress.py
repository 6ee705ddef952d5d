"""Compressors: payload sizes, hand-computed decodes, unbiasedness, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from jaxdist import compress as C
from jaxdist.compress import sparsify
from jaxdist.compress.base import threefry2x32

N = 1000
X = jnp.asarray(np.random.default_rng(0).standard_normal(N).astype(np.float32))

ALL = [
  C.identity(),
  C.topk(ratio=0.05),
  C.topk(k=7),
  C.mstopk(ratio=0.05),
  C.dgc(ratio=0.05),
  C.randomk(ratio=0.05),
  C.threshold(tau=1.5, ratio=0.05),
  C.qsgd(levels=127),
  C.qsgd(levels=7, bucket_size=100),
  C.qsgd(levels=1, bucket_size=None),
  C.terngrad(),
  C.sign(),
  C.ef_sign(bucket_size=64),
  C.onebit(),
  C.cast('bfloat16'),
  C.cast('float16'),
  C.cast('float8_e4m3fn'),
  C.cast('float8_e5m2'),
]


@pytest.mark.parametrize('c', ALL, ids=repr)
def test_wire_bytes_is_the_real_payload_and_decode_has_the_right_shape(c):
  payload, state = jax.jit(c.encode)(X, c.init(N), jax.random.key(1))  # one program, not op by op
  assert c.wire_bytes(N) == sum(p.size * p.dtype.itemsize for p in payload)
  out = jax.jit(c.decode, static_argnums=2)(payload, state, N)
  assert out.shape == (N,) and out.dtype == jnp.float32


@pytest.mark.parametrize(
  'c, expected',
  [
    (C.topk(ratio=0.05), 50 * (4 + 4)),  # k float32 values + k int32 indices
    (C.randomk(ratio=0.05), 50 * 4),  # shared seed: values only
    (C.qsgd(levels=127), 2 * 4 + N),  # a norm per 512-bucket, 8-bit codes
    (C.qsgd(levels=7, bucket_size=100), 10 * 4 + N // 2),  # 4-bit codes
    (C.qsgd(levels=1, bucket_size=None), 4 + N // 4),  # 2-bit codes
    (C.terngrad(), 4 + N // 4),  # one scale, 2 bits each
    (C.sign(), N // 8),  # 1 bit each
    (C.ef_sign(bucket_size=64), 16 * 4 + N // 8),
    (C.onebit(), 2 * 4 + N // 8),
    (C.cast('bfloat16'), 2 * N),
    (C.cast('float8_e4m3fn'), N),
  ],
  ids=repr,
)
def test_wire_bytes_by_hand(c, expected):
  assert c.wire_bytes(N) == expected


def dense_of(c, x, key=1):
  return np.asarray(c.roundtrip(jnp.asarray(x, jnp.float32), jax.random.key(key)))


def test_topk_keeps_exactly_the_k_largest():
  x = np.array([0.1, -5.0, 3.0, -0.2, 4.0, 0.0], np.float32)
  np.testing.assert_array_equal(dense_of(C.topk(k=3), x), [0, -5, 3, 0, 4, 0])
  out = dense_of(C.topk(ratio=0.05), X)
  kept = np.flatnonzero(out)
  assert len(kept) == 50
  np.testing.assert_array_equal(np.sort(kept), np.sort(np.argsort(-np.abs(np.asarray(X)))[:50]))
  np.testing.assert_array_equal(out[kept], np.asarray(X)[kept])


def _top_k_reference(a, k):
  """NumPy's top k of a (>= 0): descending values, ties to the lower position."""
  order = np.argsort(-a, kind='stable')[:k]
  return a[order], order


def _candidate_cases():
  rng = np.random.default_rng(0)
  n = 100_000
  normal = np.abs(rng.standard_normal(n)).astype(np.float32)
  return {  # (a, k, whether the candidates hold the answer, or the fallback runs)
    'normal': (normal, 1000, True),
    'ties': (np.round(normal * 4) / 4, 1000, True),  # the k-th value shared by hundreds
    'zeros': (np.zeros(n, np.float32), 500, False),  # every element at the threshold
    'ascending': (np.arange(n, dtype=np.float32), 3000, True),
    'one hot': (np.eye(1, n, 777, dtype=np.float32)[0], 64, False),  # the sample sees 0s
    'sparse spikes': (np.where(np.arange(n) % 997 == 0, normal + 10, normal * 1e-3), 80, True),
    # 30,000 elements, the large ones in the last third: a sample of the first 16,384 misses them
    'large tail': (np.concatenate([normal[:20_000] * 1e-2, normal[20_000:30_000]]), 300, True),
  }


@pytest.mark.parametrize('case', list(_candidate_cases()))
def test_top_k_from_candidates_is_numpys_top_k(case):
  a, k, found = _candidate_cases()[case]
  assert bool(jax.jit(sparsify._candidates, static_argnums=1)(jnp.asarray(a), k)[2]) == found
  values, idx = jax.jit(sparsify._top_k_candidates, static_argnums=1)(jnp.asarray(a), k)
  want_values, want_idx = _top_k_reference(a, k)
  np.testing.assert_array_equal(np.asarray(idx), want_idx)
  np.testing.assert_array_equal(np.asarray(values), want_values)
  lax_values, lax_idx = jax.lax.top_k(jnp.asarray(a), k)  # and what it stands in for
  np.testing.assert_array_equal(np.asarray(idx), np.asarray(lax_idx))
  np.testing.assert_array_equal(np.asarray(values), np.asarray(lax_values))


def test_top_k_from_candidates_under_vmap_with_one_row_in_the_fallback():
  cases = _candidate_cases()
  rows = np.stack([cases['normal'][0], cases['zeros'][0], cases['ties'][0]])
  found = jax.jit(jax.vmap(lambda a: sparsify._candidates(a, 700)[2]))(rows)
  np.testing.assert_array_equal(np.asarray(found), [True, False, True])
  values, idx = jax.jit(jax.vmap(lambda a: sparsify._top_k_candidates(a, 700)))(rows)
  for row, v, i in zip(rows, np.asarray(values), np.asarray(idx), strict=True):
    want_values, want_idx = _top_k_reference(row, 700)
    np.testing.assert_array_equal(i, want_idx)
    np.testing.assert_array_equal(v, want_values)


def test_top_k_from_candidates_ranks_nan_as_top_k_does():
  a = _candidate_cases()['normal'][0].copy()
  a[[5, 50_000]] = np.nan
  values, idx = jax.jit(sparsify._top_k_candidates, static_argnums=1)(jnp.asarray(a), 1000)
  lax_values, lax_idx = jax.lax.top_k(jnp.asarray(a), 1000)
  np.testing.assert_array_equal(np.asarray(idx), np.asarray(lax_idx))
  np.testing.assert_array_equal(np.asarray(values), np.asarray(lax_values))  # NaN == NaN here
  assert {5, 50_000} <= set(np.asarray(idx).tolist())


@pytest.mark.parametrize(
  'c',
  [
    C.topk(ratio=0.05),
    C.topk(ratio=0.05, selection='candidates'),
    C.topk(ratio=0.05, selection='bisect'),
    C.topk(ratio=0.05, selection='top_k'),
    C.mstopk(ratio=0.05),
    C.dgc(ratio=0.05),
    C.threshold(tau=1.0, ratio=0.05),
    C.threshold(tau=3.5, ratio=0.05),  # fewer pass than k: padding slots
  ],
  ids=repr,
)
def test_sparse_payloads_have_distinct_indices_and_zero_padding(c):
  """The contract compressed_allreduce's residual (w minus the values at the indices) needs."""
  n = np.asarray(X).size
  values, idx = (np.asarray(a) for a in c.encode(jnp.asarray(X), None, jax.random.key(3))[0])
  real = idx < n
  assert np.all(idx <= n) and np.unique(idx[real]).size == real.sum() > 0
  np.testing.assert_array_equal(values[~real], 0)
  np.testing.assert_array_equal(values[real], np.asarray(X)[idx[real]])


@pytest.mark.parametrize(
  'a, k, width, want',
  [
    # bins [1 3] [3 0] [5 3] [2 3]: bins 2, 0, 1 chosen; the 5 and the first two 3s
    ([1, 3, 3, 0, 5, 3, 2, 3], 3, 2, [1, 2, 4]),
    ([1, 3, 3, 0, 5, 3, 2, 3], 3, 1, [1, 2, 4]),
    ([1, 3, 3, 0, 5, 3, 2, 3], 3, None, [1, 2, 4]),
    # the largest alone in a padded last bin [7 pad pad], then zeros by position
    ([0] * 9 + [7], 3, 3, [0, 1, 9]),
    ([0] * 10, 3, 2, [0, 1, 2]),
    # NaN first, then inf, as lax.top_k ranks them
    ([0, np.nan, 1, np.inf, 1], 2, 1, [1, 3]),
    ([0, np.nan, 1, np.inf, 1, 0], 3, 2, [1, 2, 3]),
  ],
)
def test_top_k_bisect_by_hand(a, k, width, want):
  got = jax.jit(sparsify.top_k_bisect, static_argnums=(1, 2))(jnp.asarray(a, jnp.float32), k, width)
  np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize('width', [None, 1, 7])
@pytest.mark.parametrize('case', list(_candidate_cases()))
def test_top_k_bisect_is_numpys_top_k_in_position_order(case, width):
  a, k, _ = _candidate_cases()[case]
  got = jax.jit(sparsify.top_k_bisect, static_argnums=(1, 2))(jnp.asarray(a), k, width)
  np.testing.assert_array_equal(np.asarray(got), np.sort(_top_k_reference(a, k)[1]))


def test_top_k_bisect_under_vmap_and_with_nan():
  cases = _candidate_cases()
  rows = np.stack([cases['normal'][0], cases['zeros'][0], cases['ties'][0]])
  rows[0, [5, 50_000]] = np.nan
  got = jax.jit(jax.vmap(lambda a: sparsify.top_k_bisect(a, 700)))(rows)
  for row, idx in zip(rows, np.asarray(got), strict=True):
    want = np.sort(np.asarray(jax.lax.top_k(jnp.asarray(row), 700)[1]))
    np.testing.assert_array_equal(idx, want)
  assert {5, 50_000} <= set(np.asarray(got[0]).tolist())


@pytest.mark.parametrize(
  'n, width, want',
  [(10_000_008, 10, 9), (10_008, 10, 9), (12, 10, 12), (151_306, 10, 10), (1003, 10, 10)],
)
def test_bisect_moves_its_width_to_a_divisor_of_n_nearby(n, width, want):
  assert sparsify._dividing_width(n, width) == want


def test_top_k_bisect_with_a_dividing_width_is_top_ks():
  # 10,008 floats, k = 100: sqrt(n / k) is 10, and 9 divides 10,008 (ties included)
  a = np.round(np.abs(np.random.default_rng(3).standard_normal(10_008)), 1).astype(np.float32)
  got = jax.jit(sparsify.top_k_bisect, static_argnums=1)(jnp.asarray(a), 100)
  want = np.sort(np.asarray(jax.lax.top_k(jnp.asarray(a), 100)[1]))
  np.testing.assert_array_equal(np.asarray(got), want)


def test_top_k_bisect_reads_a_short_last_bin_without_the_bin_before():
  # 1,003 floats in bins of 10: the last bin holds 1000-1002, read as the window 993-1002
  a = np.zeros(1003, np.float32)
  a[[995, 996, 1001, 5]] = [9.0, 8.0, 7.0, 6.0]  # 995 and 996 sit in bin 99, 1001 in bin 100
  got = jax.jit(sparsify.top_k_bisect, static_argnums=(1, 2))(jnp.asarray(a), 4, 10)
  np.testing.assert_array_equal(np.asarray(got), [5, 995, 996, 1001])
  got = jax.jit(sparsify.top_k_bisect, static_argnums=(1, 2))(jnp.asarray(a), 3, 10)
  np.testing.assert_array_equal(np.asarray(got), [995, 996, 1001])


@pytest.mark.parametrize('key', [0, 1, 2])
def test_dgc_sends_each_strided_bins_first_largest_including_a_short_last_row(key):
  # 1,003 floats, k = 22 bins (bins_per_k=1): bin j holds x[j], x[j + 22], ...; 45 full rows
  # (0-989) and a short last row 990-1002 (bins 0-12). Zeros but five spikes, so the sampled
  # threshold is 0, every bin passes and all 22 are sent: each bin's first largest |x|.
  x = np.zeros(1003, np.float32)
  x[[10, 1000]] = [2.0, -3.0]  # bin 10: the short last row's -3 beats row 0's 2
  x[960] = 3.0  # bin 14, row 43
  x[[3 + 22 * 7, 3 + 22 * 30]] = [1.5, -1.5]  # bin 3: a tie, the earlier row's is sent
  c = C.dgc(k=22, bins_per_k=1)
  (values, idx), _ = jax.jit(c.encode)(jnp.asarray(x), None, jax.random.key(key))
  want = sorted(set(range(22)) - {3, 10, 14} | {157, 960, 1000})
  order = np.argsort(np.asarray(idx))
  np.testing.assert_array_equal(np.asarray(idx)[order], want)
  np.testing.assert_array_equal(np.asarray(values)[order], x[want])
  residual = x.copy()
  residual[want] = 0  # what stays behind for error feedback: the 2 and the later tie
  np.testing.assert_array_equal(x - np.asarray(c.decode((values, idx), None, 1003)), residual)
  assert residual[10] == 2.0 and residual[3 + 22 * 30] == -1.5


def _strided_bins(x: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
  """(largest |x|, first position holding it) of each strided bin, by NumPy; NaN counts as -1."""
  rows = -(-x.size // bins)
  a = np.full(rows * bins, -1.0)
  a[: x.size] = np.where(np.isnan(x), -1.0, np.abs(x))
  a = a.reshape(rows, bins)
  return a.max(axis=0), a.argmax(axis=0) * bins + np.arange(bins)


@pytest.mark.parametrize(
  'n, kw',
  [
    (10_000, dict(ratio=0.01)),  # 50 rows: one chain
    (100_003, dict(ratio=0.001)),  # 500 rows and a short one: super-rows of 8 rows
    (30_011, dict(ratio=0.0003, bins_per_k=3)),  # 1,111 rows of 27
    (12_305, dict(k=1)),  # 6,152 rows of 2 and a short one: the loop over runs of rows
    (5, dict(k=3)),  # one row
  ],
)
def test_dgc_payload_against_numpy(n, kw):
  """Every sent position is its bin's first largest, each bin at most once; below capacity,
  every bin left out is smaller than every bin sent (one threshold explains the payload)."""
  c = C.dgc(**kw)
  k = c.kept(n)
  bins = min(n, c.bins_per_k * k)
  rng = np.random.default_rng(n)
  cases = {
    'normal': rng.standard_normal(n),
    'ties': np.round(rng.standard_normal(n) * 2),
    'run': np.where(np.arange(n) // 50 == 3, 30.0, 1.0) * rng.standard_normal(n),
    'nan': np.where(np.isin(np.arange(n), [0, n // 2, n - 1]), np.nan, rng.standard_normal(n)),
  }
  encode = jax.jit(lambda v, key: c.encode(v, None, key)[0])
  for kind, x in cases.items():
    x = x.astype(np.float32)
    largest, first = _strided_bins(x, bins)
    for seed in range(2):
      values, idx = (np.asarray(a) for a in encode(jnp.asarray(x), jax.random.key(seed)))
      sent = idx[idx < n]
      # a NaN drawn into the sample makes the threshold NaN, and then nothing is sent
      assert (sent.size > 0 or kind == 'nan') and len(set(sent % bins)) == sent.size, (kind, seed)
      np.testing.assert_array_equal(sent, first[sent % bins], err_msg=f'{kind}, seed {seed}')
      np.testing.assert_array_equal(values[idx < n], x[sent])
      assert np.all(values[idx == n] == 0)
      if 0 < sent.size < k:
        left_out = np.setdiff1d(np.arange(bins), sent % bins)
        assert largest[left_out].max(initial=-1) < largest[sent % bins].min(), (kind, seed)


@pytest.mark.parametrize('n', [1, 31, 32, 33, 1025, 100_003])
def test_prefix_sum_is_numpys_cumsum(n):
  x = np.random.default_rng(n).integers(0, 3, (2, n)).astype(np.int32)
  got = jax.jit(sparsify._prefix_sum)(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(got), np.cumsum(x, axis=-1))


def test_compaction_takes_the_held_positions_cyclically_from_the_offset():
  """By hand, then against numpy: short masks, and long ones packed into words."""
  mask = jnp.asarray([0, 1, 1, 0, 1], bool)
  idx, total = jax.jit(sparsify._compact_counted, static_argnums=1)(mask, 4, 2)
  assert idx.tolist() == [2, 4, 1, 5] and int(total) == 3  # from position 2, wrapping; 5: empty
  idx, total = jax.jit(sparsify._compact_counted, static_argnums=1)(mask, 2, 3)
  assert idx.tolist() == [4, 1] and int(total) == 3
  idx, total = jax.jit(sparsify._compact_counted, static_argnums=1)(jnp.zeros(70, bool), 3)
  assert idx.tolist() == [70, 70, 70] and int(total) == 0

  def reference(row, k, offset):
    held = np.flatnonzero(row)
    first = np.searchsorted(held, offset)  # held before the offset
    return [held[(first + j) % len(held)] if j < len(held) else row.size for j in range(k)]

  rng = np.random.default_rng(3)
  compact = jax.jit(jax.vmap(sparsify._compact_counted, in_axes=(0, None, 0)), static_argnums=1)
  words = sparsify.COMPACT_BY_WORDS_FROM + 40  # packed into 32-bit words above this
  cases = [(2000, 1000, 0.4), (33, 40, 0.9), (words, words // 2, 0.4), (words, 100, 0.005)]
  cases += [(words, 10, 0.0)]  # nothing held
  for n, k, p in cases:  # by positions; by words, finding a rank's word both ways
    rows = rng.random((5, n)) < p
    offsets = np.array([0, 31, 32, n - 3, n - 1]) % n  # word boundaries, the last partial word
    idx, total = compact(jnp.asarray(rows), k, jnp.asarray(offsets))
    for row, offset, got, count in zip(rows, offsets, idx, total, strict=True):
      assert got.tolist() == reference(row, k, offset) and int(count) == row.sum(), (n, k)


def test_compaction_counts_exactly_past_float32s_integers():
  """More than 2^24 held positions: the words' running counts must not round (float32)."""
  n = 1 << 25
  rng = np.random.default_rng(0)
  mask = rng.random(n) < 0.9  # ~30M held: the running counts pass 2^24 about halfway
  held = np.flatnonzero(mask)
  offsets = np.concatenate([[0, n - 1], rng.integers(n // 2, n, 30)])
  compact = jax.vmap(sparsify._compact_counted, in_axes=(None, None, 0))
  idx, total = jax.jit(compact, static_argnums=1)(jnp.asarray(mask), 16, jnp.asarray(offsets))
  assert total.tolist() == [held.size] * offsets.size
  for offset, got in zip(offsets, np.asarray(idx), strict=True):
    first = np.searchsorted(held, offset)
    np.testing.assert_array_equal(got, np.take(held, np.arange(first, first + 16), mode='wrap'))
  counts = np.full(n // 32, 31, np.int32)  # the words' counts of a mask with 31 held a word
  got = jax.jit(sparsify._prefix_sum, static_argnames='bound')(jnp.asarray(counts), bound=n)
  np.testing.assert_array_equal(np.asarray(got), np.cumsum(counts))


def test_threshold_searches_run_per_device_in_shard_map():
  """Their loops' carries follow the input across devices (check_vma=True)."""
  mesh = jax.make_mesh((8,), ('w',), axis_types=(jax.sharding.AxisType.Explicit,))
  rows = np.abs(np.random.default_rng(2).standard_normal((8, 20_000))).astype(np.float32)
  spec = jax.sharding.PartitionSpec('w')
  x = jax.device_put(jnp.asarray(rows), jax.NamedSharding(mesh, spec))

  def each(a):  # and compactions of masks packed into words: rank by search, by histogram
    few, many = (
      sparsify._compact_counted(a[0] > t, k, 5)[0][None] for t, k in [(2, 50), (1, 9000)]
    )
    return sparsify.top_k_bisect(a[0], 40)[None], sparsify._kth_largest(a[0], 40)[None], few, many

  out = jax.jit(jax.shard_map(each, mesh=mesh, in_specs=spec, out_specs=spec))(x)
  for row, i, t, few, many in zip(rows, *(np.asarray(o) for o in out), strict=True):
    want = np.sort(np.argsort(-row, kind='stable')[:40])
    np.testing.assert_array_equal(i, want)
    assert t == np.sort(row)[-40]
    for got, held in [(few, np.flatnonzero(row > 2)), (many, np.flatnonzero(row > 1))]:
      first = np.searchsorted(held, 5)
      want = [held[(first + j) % held.size] if j < held.size else row.size for j in range(got.size)]
      np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize('k', [1, 500, 25_000, 30_000])  # 30,000 > n/2: lax.top_k's way
def test_every_topk_selection_sends_the_same_elements(k):
  x = jnp.asarray(np.random.default_rng(1).standard_normal(50_000), jnp.float32)
  x = x.at[:100].set(x[100:200])  # ties of magnitude at many positions
  encode = lambda way: jax.jit(lambda x: C.topk(k=k, selection=way).encode(x, None, None)[0])
  want_values, want_idx = (np.asarray(a) for a in encode('top_k')(x))
  np.testing.assert_array_equal(want_idx, np.asarray(jax.lax.top_k(jnp.abs(x), k)[1]))
  for way in ('auto', 'bisect', 'candidates'):
    values, idx = (np.asarray(a) for a in encode(way)(x))
    order = np.argsort(idx)
    np.testing.assert_array_equal(idx[order], np.sort(want_idx), err_msg=way)
    np.testing.assert_array_equal(values[order], want_values[np.argsort(want_idx)], err_msg=way)


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16])
def test_top_k_bisect_of_16_bit_floats_is_top_ks(dtype):
  a = jnp.abs(jnp.asarray(np.random.default_rng(3).standard_normal(20_000), dtype))  # many ties
  got = jax.jit(sparsify.top_k_bisect, static_argnums=1)(a, 300)
  np.testing.assert_array_equal(np.asarray(got), np.sort(np.asarray(jax.lax.top_k(a, 300)[1])))


def test_topk_with_candidates_sends_top_ks_payload_in_its_order():
  x = jnp.asarray(np.random.default_rng(1).standard_normal(50_000), jnp.float32)
  plain = C.topk(ratio=0.01, selection='top_k').encode(x, None, None)[0]
  from_candidates = C.topk(ratio=0.01, selection='candidates').encode(x, None, None)[0]
  for got, want in zip(from_candidates, plain, strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  encode = lambda x: C.topk(k=5, selection='candidates').encode(x, None, None)
  assert 'sort' in str(jax.make_jaxpr(encode)(x))  # the candidates' way ran
  encode = lambda x: C.topk(k=500, selection='bisect').encode(x, None, None)
  assert 'top_k' not in str(jax.make_jaxpr(encode)(x))  # and bisection runs no top_k


def test_auto_bisects_long_vectors_on_the_cpu_and_sorts_short_ones():
  encode = lambda x: C.topk(ratio=0.01).encode(x, None, None)
  long, short = jnp.ones(sparsify.BISECT_FROM), jnp.ones(sparsify.BISECT_FROM - 1)
  assert 'top_k' not in str(jax.make_jaxpr(encode)(long))
  assert 'top_k' in str(jax.make_jaxpr(encode)(short))


def test_topk_refuses_an_unknown_selection():
  with pytest.raises(ValueError, match=r"selection must be one of .*'bisect'.*got 'sort'"):
    C.topk(ratio=0.01, selection='sort')


@pytest.mark.parametrize(
  'c, min_recall', [(C.mstopk(ratio=0.05), 0.95), (C.dgc(ratio=0.05), 0.6)], ids=repr
)
def test_approximate_topk_sends_true_values_of_large_elements(c, min_recall):
  x = np.asarray(X)
  out = dense_of(c, x)
  kept = np.flatnonzero(out)
  assert 0 < len(kept) <= 50
  np.testing.assert_array_equal(out[kept], x[kept])  # values are exact where sent
  exact = set(np.argsort(-np.abs(x))[:50].tolist())
  assert len(exact & set(kept.tolist())) / 50 >= min_recall


def test_threshold_sends_what_passes_up_to_capacity():
  x = np.array([0.5, -2.0, 3.0, 1.9, -0.1, 2.5, 0.0, 2.1], np.float32)
  expected = np.array([0, -2, 3, 0, 0, 2.5, 0, 2.1], np.float32)
  np.testing.assert_array_equal(dense_of(C.threshold(tau=2.0, k=8), x), expected)
  # capacity 2: the first two by position
  np.testing.assert_array_equal(dense_of(C.threshold(tau=2.0, k=2), x), [0, -2, 3, 0, 0, 0, 0, 0])


def test_sign_family_by_hand():
  x = np.array([1.0, -3.0, 0.0, 2.0], np.float32)
  np.testing.assert_array_equal(dense_of(C.sign(), x), [1, -1, 1, 1])
  np.testing.assert_allclose(
    dense_of(C.ef_sign(), x), 1.5 * np.array([1, -1, 1, 1])
  )  # ‖x‖₁/d = 6/4
  # 1-bit: positives decode to mean(1, 0, 2) = 1, negatives to mean(-3) = -3
  np.testing.assert_allclose(dense_of(C.onebit(), x), [1, -3, 1, 1])


def test_qsgd_one_level_decodes_to_zero_or_plus_minus_norm():
  x = np.array([3.0, -4.0], np.float32)  # norm 5
  c = C.qsgd(levels=1, bucket_size=None)
  keys = jax.random.split(jax.random.key(1), 200)
  outs = np.asarray(jax.jit(jax.vmap(lambda k: c.roundtrip(jnp.asarray(x), k)))(keys))
  assert set(np.unique(outs[:, 0])) <= {0.0, 5.0} and set(np.unique(outs[:, 1])) <= {0.0, -5.0}
  np.testing.assert_allclose(outs.mean(0), x, atol=4 * 5 / np.sqrt(200))


def test_terngrad_decodes_to_zero_or_plus_minus_max():
  x = np.array([0.5, -2.0, 1.0], np.float32)
  out = dense_of(C.terngrad(), x)
  assert set(np.abs(out).tolist()) <= {0.0, 2.0}
  assert out[1] == -2.0  # the max element is always kept


def spread_and_bias(c, x, bits='own'):
  """Per element of decode(encode(x)): its exact variance, and a bound on |E - x|.

  QSGD sends step·(floor(s|x|/‖x‖) + coin) with step = ‖x‖/s per bucket and a
  coin of probability p = frac(s|x|/‖x‖): variance step²·p(1-p). TernGrad
  sends scale·coin, p = |x|/scale: scale²·p(1-p). Random-k (with
  replacement, rescaled by n/k) sends x·(n/k)·Binomial(k, 1/n):
  x²·(n/k)(1 - 1/n). The bias bound is the coin's resolution (2^-(bits+1)
  of a step; 2^-23 for `jax.random.bernoulli`'s floats) plus float32
  rounding of the decode. `bits` other than 'own': the bound of that many bits.
  """
  x = np.asarray(x, np.float64)
  n = x.size
  if isinstance(c, C.RandomK):
    k = C.num_kept(n, c.ratio)
    return x**2 * (n / k) * (1 - 1 / n), 1e-6 * np.abs(x) * n / k
  size = n if c.bucket_size is None else c.bucket_size
  b = np.pad(x, (0, -n % size)).reshape(-1, size)
  if isinstance(c, C.QSGD):
    step = np.linalg.norm(b, axis=1, keepdims=True) / c.levels
  else:
    step = np.max(np.abs(b), axis=1, keepdims=True)
  scaled = np.abs(b) / np.where(step > 0, step, 1.0)
  p = scaled - np.floor(scaled)
  step = np.broadcast_to(step, b.shape).reshape(-1)[:n]
  variance = step**2 * (p * (1 - p)).reshape(-1)[:n]
  bits = c.rng_bits if bits == 'own' else bits
  resolution = 2.0**-23 if bits is None else 2.0 ** -(bits + 1)
  return variance, step * resolution + 1e-6 * (np.abs(x) + step)


def assert_unbiased(c, x, num_keys=4000, z=5.0, bits='own'):
  """E[decode(encode(x))] == x, from `num_keys` keys, element by element and summed.

  Each element's mean over the keys must be within z standard errors (from
  the exact variance, not the sample's) plus the bias bound of x; so must the
  sum of the errors over all elements, which catches a small bias shared by
  many elements. NaN or inf anywhere fails.
  """
  keys = jax.random.split(jax.random.key(42), num_keys)
  outs = np.asarray(jax.jit(jax.vmap(lambda k: c.roundtrip(x, k)))(keys), np.float64)
  assert np.isfinite(outs).all(), 'decode(encode(x)) is not finite'
  variance, bias = spread_and_bias(c, x, bits)
  error = outs.mean(0) - np.asarray(x, np.float64)
  tol = z * np.sqrt(variance / num_keys) + bias
  bad = np.flatnonzero(~(np.abs(error) <= tol))
  assert bad.size == 0, f'elements {bad[:10]}: error {error[bad[:10]]}, tolerance {tol[bad[:10]]}'
  total_tol = z * np.sqrt(variance.sum() / num_keys) + bias.sum()
  assert abs(error.sum()) <= total_tol, f'summed error {error.sum():.3g} > {total_tol:.3g}'
  # the spread itself: the sample variance of the sum matches the exact one
  sample = outs.sum(1).var()
  assert 0.85 * variance.sum() <= sample <= 1.15 * variance.sum(), (sample, variance.sum())


@pytest.mark.parametrize(
  'c',
  [
    C.qsgd(levels=7, bucket_size=64),
    C.qsgd(levels=127),
    C.with_rng_bits(C.qsgd(levels=127), 32),
    C.with_rng_bits(C.qsgd(levels=127), None),
    C.terngrad(),
    C.with_rng_bits(C.terngrad(bucket_size=100), 8),
    C.randomk(ratio=0.2),
  ],
  ids=repr,
)
def test_stochastic_compressors_are_unbiased(c):
  assert c.unbiased
  assert_unbiased(c, X[:256])


def test_the_unbiasedness_test_catches_a_bias_of_8_bit_coins():
  """Held to 16 bits' bound, 8-bit coins fail: elements with p < 2^-9 are never sent.

  x: one large element and 255 small positive ones (p = |x|/max ~ 3e-4), so
  the 8-bit bias (-x for each of them) adds up in the summed check, while
  16-bit coins pass it.
  """
  small = 1e-3 * np.abs(np.asarray(X[:255])) + 1e-4
  x = jnp.asarray(np.concatenate([[3.0], small]), jnp.float32)
  assert_unbiased(C.terngrad(), x)
  with pytest.raises(AssertionError, match='summed error'):
    assert_unbiased(C.with_rng_bits(C.terngrad(), 8), x, bits=16)


def test_the_unbiasedness_test_fails_on_nan():
  x = X[:256].at[3].set(jnp.nan)
  with pytest.raises(AssertionError, match='not finite'):
    assert_unbiased(C.qsgd(levels=7, bucket_size=64), x, num_keys=10)


@pytest.mark.parametrize('bits', [8, 16, 32])
def test_bernoulli_is_exact_at_0_and_1_and_rounds_p_to_its_bits(bits):
  p = jnp.asarray([0.0, 1.0, 0.5, 0.3, 1e-3, 1 - 1e-7], jnp.float32)
  keys = jax.random.split(jax.random.key(7), 100_000)
  freq = np.asarray(jax.jit(jax.vmap(lambda k: C.bernoulli(k, p, bits)))(keys)).mean(0)
  assert freq[0] == 0 and freq[1] == 1
  expected = np.round(np.asarray(p, np.float64) * 2.0**bits) / 2.0**bits  # P(true)
  sem = np.sqrt(expected * (1 - expected) / len(keys))
  np.testing.assert_array_less(np.abs(freq - expected), 5 * sem + 2.0**-bits)


def test_bernoulli_rejects_other_widths():
  with pytest.raises(ValueError, match=r'bits must be one of \(8, 16, 32\), got 12'):
    C.bernoulli(jax.random.key(0), jnp.zeros(3), 12)
  with pytest.raises(ValueError, match='chunk must be >= 1 words, got 0'):
    C.bernoulli(jax.random.key(0), jnp.zeros(3), chunk=0)


def test_threefry2x32_is_jaxs_hash():
  key = jax.random.key_data(jax.random.key(11))
  x = jnp.arange(2 * 1000, dtype=jnp.uint32).reshape(2, -1)
  expected = threefry_2x32(key, x.reshape(-1)).reshape(2, -1)  # hashes (x[0][j], x[1][j])
  got = jnp.stack(threefry2x32(key[0], key[1], x[0], x[1]))
  np.testing.assert_array_equal(got, expected)


def test_bernoulli_uses_every_key_under_vmap():
  """Batched keys give the rows of the unbatched calls (rbg keys would not)."""
  p = jnp.linspace(0.0, 1.0, 300_001)  # more than one 65536-word step of the loop
  keys = jax.random.split(jax.random.key(3), 3)
  batched = np.asarray(jax.vmap(lambda k: C.bernoulli(k, p))(keys))
  np.testing.assert_array_equal(batched, np.stack([C.bernoulli(k, p) for k in keys]))
  assert (batched[0] != batched[1]).mean() > 0.2  # independent rows


@pytest.mark.parametrize('bits', [8, 16, 32])
def test_bernoulli_coins_do_not_depend_on_the_chunk(bits):
  """The CPU's loop of chunks and the GPU's one step draw the same coins."""
  p = jnp.linspace(0.0, 1.0, 70_001)
  key = jax.random.key(5)
  one_step = np.asarray(C.bernoulli(key, p, bits, chunk=1 << 30))
  for chunk in (1000, 4096, 1 << 16):
    np.testing.assert_array_equal(np.asarray(C.bernoulli(key, p, bits, chunk=chunk)), one_step)
  assert 0.45 < one_step.mean() < 0.55  # coins of p spread over [0, 1]


def test_quantisers_take_raw_and_typed_keys_and_differ_by_key():
  c = C.qsgd(levels=7, bucket_size=64)
  raw = jax.random.PRNGKey(5)
  a = c.roundtrip(X, raw)
  np.testing.assert_array_equal(a, c.roundtrip(X, jax.random.wrap_key_data(raw)))
  assert not np.array_equal(a, c.roundtrip(X, jax.random.PRNGKey(6)))


def test_topk_is_biased_so_the_property_test_can_fail():
  x = X[:256]
  outs = np.asarray(
    jax.vmap(lambda k: C.topk(ratio=0.2).roundtrip(x, k))(jax.random.split(jax.random.key(0), 10))
  )
  assert np.abs(outs.mean(0) - np.asarray(x)).max() > 0.1


def test_randomk_uses_the_key_it_is_given_for_positions():
  c = C.randomk(ratio=0.1)
  a, sa = c.encode(X, c.init(N), jax.random.key(3))
  b, sb = c.encode(X * 2, c.init(N), jax.random.key(3))
  np.testing.assert_array_equal(sa, sb)  # same key, same positions: payloads can be summed
  np.testing.assert_allclose(c.decode((a[0] + b[0],), sa, N), 3 * c.decode(a, sa, N), rtol=1e-6)


@pytest.mark.parametrize('bits', [1, 2, 4, 8])
def test_bit_packing_roundtrips(bits):
  values = np.random.default_rng(bits).integers(0, 1 << bits, 37).astype(np.uint8)
  packed = C.pack_bits(jnp.asarray(values), bits)
  assert packed.dtype == jnp.uint8 and packed.size == -(-37 * bits // 8)
  np.testing.assert_array_equal(C.unpack_bits(packed, bits, 37), values)


def test_powersgd_recovers_a_low_rank_matrix():
  rng = np.random.default_rng(0)
  m = jnp.asarray(rng.standard_normal((30, 2)) @ rng.standard_normal((2, 20)), jnp.float32)
  np.testing.assert_allclose(C.powersgd(rank=2).roundtrip(m), m, atol=1e-4)
  p = C.powersgd(rank=4)
  assert p.wire_bytes((3, 3, 8, 16)) == (4 * 72 * 4, 4 * 16 * 4)  # P [72, 4], Q [16, 4]
  assert p.rank_for((5, 2)) == 2  # capped at the smaller side
  q = np.asarray(C.orthogonalize(jnp.asarray(rng.standard_normal((10, 3)), jnp.float32)))
  np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-5)


@pytest.mark.parametrize('condition', [1e2, 1e4, 1e6])
def test_orthogonalize_is_orthonormal_for_ill_conditioned_columns(condition):
  """Columns orthonormal to float32 rounding, spanning p's, whatever p's condition number.

  p = U diag(s) V^T with s from 1 down to 1 / condition, built in float64: one
  pass of Gram–Schmidt leaves ‖Q^T Q − I‖ near float32's epsilon times the
  condition number (5e-4 at 1e4 here, 1e-2 at 1e6); a second pass brings it
  below 1e-6.
  """
  rng = np.random.default_rng(3)
  u = np.linalg.qr(rng.standard_normal((200, 8)))[0]
  v = np.linalg.qr(rng.standard_normal((8, 8)))[0]
  p = (u * np.geomspace(1.0, 1.0 / condition, 8)) @ v.T
  q = np.asarray(C.orthogonalize(jnp.asarray(p, jnp.float32)), np.float64)
  orthogonality = np.abs(q.T @ q - np.eye(8)).max()
  assert orthogonality <= 1e-6, orthogonality
  spanned = np.linalg.norm(p - q @ (q.T @ p)) / np.linalg.norm(p)  # p lies in Q's span
  assert spanned <= 1e-6, spanned


def test_warmup_ratios_follow_dgc():
  # DGC's code: ratio(e) = final ** ((e + 1) / (stages + 1)); the paper rounds these to
  # 75%, 93.75%, 98.4375%, 99.6% sparsity before the final 99.9%.
  expected = [0.001 ** (1 / 5), 0.001 ** (2 / 5), 0.001 ** (3 / 5), 0.001 ** (4 / 5), 0.001]
  np.testing.assert_allclose(C.warmup_ratios(0.001, 4), expected, rtol=1e-6)
  np.testing.assert_allclose(expected[:4], [0.25, 0.0625, 0.0156, 0.004], rtol=0.05)


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: C.topk(ratio=0.0), r'ratio must be in \(0, 1\], got 0.0'),
    (lambda: C.topk(ratio=1.5), r'ratio must be in \(0, 1\], got 1.5'),
    (lambda: C.randomk(ratio=-0.1), r'ratio must be in \(0, 1\], got -0.1'),
    (lambda: C.topk(), 'give exactly one of ratio and k'),
    (lambda: C.topk(k=0), 'k must be >= 1'),
    (lambda: C.powersgd(rank=0), 'rank must be >= 1, got 0'),
    (lambda: C.qsgd(levels=200), r'levels must be in \[1, 127\]'),
    (
      lambda: C.with_rng_bits(C.qsgd(), 12),
      r'rng_bits must be one of \(8, 16, 32\) or None, got 12',
    ),
    (lambda: C.cast('int4'), 'dtype must be one of'),
    (lambda: C.dgc(ratio=0.1, sample_ratio=2.0), r'sample_ratio must be in \(0, 1\]'),
    (lambda: C.threshold(tau=-1.0, ratio=0.1), 'tau must be >= 0'),
    (lambda: C.warmup_ratios(0.01, 0), 'stages must be >= 1'),
  ],
)
def test_bad_hyperparameters_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_k_larger_than_the_tensor():
  with pytest.raises(ValueError, match=r'k=100 is larger than the tensor \(50 elements\)'):
    C.topk(k=100).check(50)


def test_registry_is_every_public_compressor_by_its_name():
  assert all(cls.name == name for name, cls in C.REGISTRY.items())
  assert all(issubclass(cls, C.Compressor) for cls in C.REGISTRY.values())
  assert {'identity', 'topk', 'dgc', 'qsgd', 'twobit', 'cast'} <= set(C.REGISTRY)
  assert 'powersgd' not in C.REGISTRY  # a transform of its own: jd.sync.powersgd
  assert 'compressor' not in C.REGISTRY  # no base or private classes


def test_wire_bytes_traces_the_encode_once_per_compressor_and_length():
  """Host-side controllers ask every step; the payload's shapes do not change."""
  import dataclasses

  traced = []

  @dataclasses.dataclass(frozen=True)
  class Counted(C.TopK):
    def encode(self, x, state, key):
      traced.append(x.size)
      return super().encode(x, state, key)

  c = Counted(ratio=0.1)
  assert [c.wire_bytes(1000), c.wire_bytes(1000), Counted(ratio=0.1).wire_bytes(1000)] == [800] * 3
  assert c.wire_bytes(2000) == 1600 and Counted(ratio=0.2).wire_bytes(1000) == 1600
  assert traced == [1000, 2000, 1000]  # once per (compressor, length)

  @dataclasses.dataclass(frozen=True)
  class Other(Counted):  # equal fields, another class: its own entry
    pass

  assert Other(ratio=0.1).wire_bytes(1000) == 800 and traced == [1000, 2000, 1000, 1000]
