"""Compressors: payload sizes, hand-computed decodes, unbiasedness, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist import compress as C

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
  payload, state = c.encode(X, c.init(N), jax.random.key(1))
  assert c.wire_bytes(N) == sum(p.size * p.dtype.itemsize for p in payload)
  out = c.decode(payload, state, N)
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
  outs = np.stack([dense_of(C.qsgd(levels=1, bucket_size=None), x, key=k) for k in range(200)])
  assert set(np.unique(outs[:, 0])) <= {0.0, 5.0} and set(np.unique(outs[:, 1])) <= {0.0, -5.0}
  np.testing.assert_allclose(outs.mean(0), x, atol=4 * 5 / np.sqrt(200))


def test_terngrad_decodes_to_zero_or_plus_minus_max():
  x = np.array([0.5, -2.0, 1.0], np.float32)
  out = dense_of(C.terngrad(), x)
  assert set(np.abs(out).tolist()) <= {0.0, 2.0}
  assert out[1] == -2.0  # the max element is always kept


@pytest.mark.parametrize(
  'c',
  [C.qsgd(levels=7, bucket_size=64), C.qsgd(levels=127), C.terngrad(), C.randomk(ratio=0.2)],
  ids=repr,
)
def test_stochastic_compressors_are_unbiased(c):
  """The mean over many keys is within 5 standard errors of x, element by element.

  The small absolute term covers elements kept with probability ~1, whose
  sample standard error can be 0 in a finite sample.
  """
  x = X[:256]
  keys = jax.random.split(jax.random.key(42), 4000)
  outs = np.asarray(jax.jit(jax.vmap(lambda k: c.roundtrip(x, k)))(keys))
  mean, sem = outs.mean(0), outs.std(0) / np.sqrt(len(keys))
  assert c.unbiased
  np.testing.assert_array_less(
    np.abs(mean - np.asarray(x)), 5 * sem + 1e-3 * float(jnp.max(jnp.abs(x)))
  )


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
