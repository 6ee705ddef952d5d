"""compressed_allreduce against references, error feedback, and the wire in the HLO."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, runtime, testing
from jaxdist import compress as C

W = 8
SHAPES = {'conv': (3, 3, 4, 8), 'dense': (32, 10), 'bias': (10,)}


def params():
  return {k: jnp.zeros(s, jnp.float32) for k, s in SHAPES.items()}


def worker_grads(seed=0, same=False):
  rng = np.random.default_rng(seed)
  out = {}
  for k, s in SHAPES.items():
    g = rng.standard_normal((1 if same else W, *s)).astype(np.float32)
    out[k] = jnp.asarray(np.broadcast_to(g, (W, *s)))
  return out


def make_run(tx, devices=8):
  """`testing.Run` of all W workers from zero parameters."""
  return testing.Run(tx, params(), workers=W, devices=devices)


def updates_of(run, grads):
  """One step of `run`; the updates (the averaged gradients), not the parameters."""
  run(grads)
  return run.updates


def lowered_collectives(run, grads):
  return comm.hlo.collectives(run.hlo(grads, compiled=False))


def averaging(compressor, collective, **kw):
  """compressed_allreduce of `compressor`, or the powersgd transform for C.powersgd(...)."""
  if isinstance(compressor, C.PowerSGD):
    assert collective == 'allreduce'
    return jd.sync.powersgd(compressor.rank, axis_name=runtime.AXES, **kw)
  return jd.sync.compressed_allreduce(
    compressor, axis_name=runtime.AXES, collective=collective, **kw
  )


def mean_of(grads):
  return jax.tree.map(lambda g: np.asarray(g).mean(0), grads)


def assert_all_workers(out, expected, atol=1e-6):
  for k in expected:
    for w in range(W):
      np.testing.assert_allclose(
        out[k][w], expected[k], atol=atol, rtol=1e-5, err_msg=f'{k} worker {w}'
      )


@pytest.mark.parametrize('devices', [8, 1, 2], ids=['8-devices', '8-simulated', '2x4'])
@pytest.mark.parametrize('collective', ['allreduce', 'allgather'])
@pytest.mark.parametrize('fused', [True, False])
def test_identity_compressor_equals_pmean(devices, collective, fused):
  tx = jd.sync.compressed_allreduce(
    C.identity(), axis_name=runtime.AXES, collective=collective, fused=fused
  )
  grads = worker_grads()
  out = updates_of(make_run(tx, devices), grads)
  assert_all_workers(out, mean_of(grads))


@pytest.mark.parametrize('leader', ['star', 'var'])
def test_artopk_with_identical_gradients_is_topk_of_it(leader):
  grads = worker_grads(same=True)
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.05), axis_name=runtime.AXES, collective='allreduce', leader=leader
  )
  out = updates_of(make_run(tx), grads)
  flat = np.concatenate([np.asarray(grads[k][0]).ravel() for k in sorted(grads)])
  expected_flat = np.asarray(C.topk(ratio=0.05).roundtrip(jnp.asarray(flat)))
  got_flat = np.concatenate([np.asarray(out[k][0]).ravel() for k in sorted(out)])
  # the fused vector is in tree-leaf order; compare as sets of (value) at kept positions
  leaves = jax.tree.leaves(grads)
  order = np.concatenate([np.asarray(x[0]).ravel() for x in leaves])
  expected_in_leaf_order = np.asarray(C.topk(ratio=0.05).roundtrip(jnp.asarray(order)))
  got_in_leaf_order = np.concatenate([np.asarray(x[0]).ravel() for x in jax.tree.leaves(out)])
  np.testing.assert_allclose(got_in_leaf_order, expected_in_leaf_order, atol=1e-7)
  assert np.count_nonzero(got_flat) == np.count_nonzero(expected_flat)


def test_artopk_uses_the_star_leaders_indices():
  grads = worker_grads(seed=3)
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.05), axis_name=runtime.AXES, collective='allreduce'
  )
  run = make_run(tx)
  leaves = lambda tree, w: np.concatenate([np.asarray(x[w]).ravel() for x in jax.tree.leaves(tree)])
  for step in range(3):  # leader = step mod N
    out = updates_of(run, grads)
    lead = leaves(grads, step % W)
    kept = np.argsort(-np.abs(lead))[: C.num_kept(lead.size, 0.05)]
    expected = np.zeros_like(lead)
    # every worker's values at the leader's indices, averaged; plus last step's residual
    if step == 0:
      expected[kept] = np.mean([leaves(grads, w)[kept] for w in range(W)], axis=0)
      np.testing.assert_allclose(leaves(out, 0), expected, atol=1e-6)
    assert np.count_nonzero(leaves(out, 0)) <= kept.size


@pytest.mark.parametrize(
  'compressor, collective',
  [
    (C.topk(ratio=0.05), 'allgather'),
    (C.topk(ratio=0.05), 'allreduce'),
    (C.dgc(ratio=0.05), 'allgather'),
    (C.mstopk(ratio=0.05), 'allgather'),
    (C.randomk(ratio=0.05), 'allreduce'),
    (C.qsgd(levels=7), 'allgather'),
    (C.ef_sign(), 'allgather'),
    (C.cast('bfloat16'), 'allreduce'),
    (C.cast('float16'), 'allreduce'),
    (C.powersgd(rank=1), 'allreduce'),
  ],
  ids=repr,
)
def test_error_feedback_conserves_mass(compressor, collective):
  """N·(mean sent) + Σ new residuals == Σ (gradient + old residual), step after step.

  Exact up to float32 rounding, except that a bf16 all-reduce rounds the sum
  itself on the wire (error no worker's residual can hold): bf16 tolerance.
  """
  tol = dict(atol=5e-2, rtol=2e-2) if isinstance(compressor, C.Cast) else dict(atol=2e-4, rtol=1e-4)
  run = make_run(averaging(compressor, collective))
  low_rank = isinstance(compressor, C.PowerSGD)
  for step in range(3):
    grads = worker_grads(seed=step)
    old = [np.asarray(r) for r in run.state.residual]
    out = updates_of(run, grads)
    new = [np.asarray(r) for r in run.state.residual]
    if low_rank:  # groups are the matrices (bias is sent dense)
      keys = ['conv', 'dense']
      g = [np.asarray(grads[k]).reshape(W, *SHAPES[k]) for k in keys]
      sent = [np.asarray(out[k][0]) for k in keys]
    else:  # one fused vector in leaf order
      flat = lambda t, w: np.concatenate([np.asarray(x[w]).ravel() for x in jax.tree.leaves(t)])
      g = [np.stack([flat(grads, w) for w in range(W)])]
      sent = [flat(out, 0)]
    for gi, si, oi, ni in zip(g, sent, old, new, strict=True):
      np.testing.assert_allclose(W * si + ni.sum(0), (gi + oi).sum(0), **tol)


def cast_step(dtype, collective, grads_WxD, **cast_kw):
  """One step of compressed_allreduce(cast(dtype)) without error feedback: (means, its HLO)."""
  tx = jd.sync.compressed_allreduce(
    C.cast(dtype, **cast_kw), axis_name=runtime.AXES, collective=collective, error_feedback=False
  )
  workers = grads_WxD.shape[0]
  run = testing.Run(tx, {'x': jnp.zeros(grads_WxD.shape[1:])}, workers=workers, devices=workers)
  grads = {'x': jnp.asarray(grads_WxD)}
  found = lowered_collectives(run, grads)
  run(grads)
  return np.asarray(run.updates['x'], np.float64), found


CAST_PATHS = [
  ('float16', 'allreduce'),
  ('float16', 'allgather'),
  ('bfloat16', 'allreduce'),
  ('bfloat16', 'allgather'),
  ('float8_e4m3fn', 'allgather'),
  ('float8_e5m2', 'allgather'),
]


@pytest.mark.parametrize('workers', [4, 6])
@pytest.mark.parametrize('dtype, collective', CAST_PATHS)
def test_cast_mean_is_finite_at_the_top_of_the_format(dtype, collective, workers):
  """Workers at the format's largest finite value, and at 16,384 and 20,000: a finite mean.

  Each input is representable; a float16 sum of four 16,384s (65,536) is not,
  nor is four of any format's largest (bfloat16's: not even in float32). The
  mean is within the format's rounding of the exact one: u of the largest
  value for each worker's cast, and on an all-reduce's wire u more for each
  of the N − 1 additions (a gather sums in float32).
  """
  top = float(jnp.finfo(dtype).max)
  u = float(jnp.finfo(dtype).eps) / 2
  columns = [top, -top, top / 3, 16384.0, 20000.0, 1.0, -0.75, 0.0]
  g = np.array([[min(c, top) if c >= 0 else max(c, -top) for c in columns]] * workers)
  g[-1, 1] /= 2  # all but one at -top, the last at -top / 2
  g = g.astype(np.float32)
  means, _ = cast_step(dtype, collective, g)
  exact = g.astype(np.float64).mean(0)
  err = np.max(np.abs(means - exact)) / top
  roundings = workers if collective == 'allreduce' else 1.001
  assert err <= roundings * u, f'mean off by {err:.2e} of the largest value: {means[0]}'


@pytest.mark.parametrize('value', [16384.0, 20000.0])
def test_fp16_allreduce_of_four_values_whose_sum_float16_cannot_hold(value):
  """4 workers each send 1,024 elements all equal to `value` (representable in float16, as is
  the mean; the sum, 65,536 or 80,000, is not): the mean is `value`, within float16's u."""
  g = np.full((4, 1024), value, np.float32)
  means, _ = cast_step('float16', 'allreduce', g)
  u = float(jnp.finfo('float16').eps) / 2
  assert np.max(np.abs(means - value)) <= u * value, means[:4]


@pytest.mark.parametrize('dtype, collective', [p for p in CAST_PATHS if p[0] != 'bfloat16'])
def test_cast_mean_keeps_values_in_the_subnormal_range(dtype, collective):
  """Gradients between the format's smallest normal and below its smallest subnormal.

  Cast as they are, these round to the subnormal grid or to zero (float16
  below 3e-8, float8_e4m3fn below 1e-3); with the shared power-of-two scale
  each keeps the format's relative precision u, and the mean is within u per
  rounding of the exact one, element by element: one for each worker's cast,
  and on an all-reduce's wire one per addition. (bfloat16 shares float32's
  exponents: its subnormals are float32's, whose arithmetic XLA's CPU
  flushes to zero.)
  """
  info = jnp.finfo(dtype)
  u = float(info.eps) / 2
  workers = 8
  steps_below = int(np.log2(float(info.smallest_normal) / float(info.smallest_subnormal))) + 2
  column = float(info.smallest_normal) * 2.0 ** -np.arange(steps_below)  # down past the bottom
  g = (column[None, :] * (1 + np.arange(workers)[:, None] / 16)).astype(np.float32)
  means, _ = cast_step(dtype, collective, g)
  exact = g.astype(np.float64).mean(0)
  err = np.max(np.abs(means - exact) / exact)
  roundings = workers if collective == 'allreduce' else 1.001
  assert err <= roundings * u, f'mean off by {err:.2e} (relative): {means[0]} vs {exact}'


@pytest.mark.parametrize(
  'dtype, collective, workers, room',
  [
    ('float16', 'allreduce', 1, 65504.0),  # alone: nothing is summed
    ('float16', 'allreduce', 8, 65504.0 / 16),  # N' = 8, and 2 for 7 roundings
    ('float16', 'allreduce', 6, 65504.0 / 16),  # N' = 8
    ('float16', 'allreduce', 1421, 65504.0 / 2048 / 4),  # (1 + 2^-11)^1420 > 2
    ('bfloat16', 'allreduce', 179, float(jnp.finfo(jnp.bfloat16).max) / 256 / 4),
    ('float16', 'allgather', 8, 65504.0),  # float32 holds 8 of them
    ('bfloat16', 'allgather', 4, 2.0**124),  # float32's top / (4 · 2), a power of two
  ],
)
def test_cast_room_by_hand(dtype, collective, workers, room):
  assert jd.sync._exchange._room(jnp.dtype(dtype), collective, workers) == room


@pytest.mark.parametrize('block_size, blocks', [(256, 4), (100, 10), (1000, 1), (None, 1)])
def test_cast_all_reduce_sends_float16_and_an_int8_exponent_per_block(block_size, blocks):
  """What crosses for float16 on an all-reduce: the payload in f16, an s8 per block first."""
  g = np.random.default_rng(0).standard_normal((8, 1000)).astype(np.float32)
  _, found = cast_step('float16', 'allreduce', g, block_size=block_size)
  assert sorted((c.kind, c.dtypes, c.nbytes) for c in found) == [
    ('all-reduce', ('f16',), 2 * 1000),
    ('all-reduce', ('s8',), blocks),
  ]


# Two workers, float16 on an all-reduce, blocks of 4: room 65,504 / 4 = 16,376 = 0.9995 · 2^14
# (`test_cast_room_by_hand`); a block's exponent e is the largest with 2^e · its max ≤ room.
HAND_WxD = np.array(
  [
    [1000, -3000, 20000, 5, 3 * 2.0**-30, 2.0**-26, -5 * 2.0**-30, 0, 0, 0, 0, 0],
    [3000, 100, -7000, 0.5, 2.0**-30, -3 * 2.0**-27, 7 * 2.0**-31, 0, 0, 0, 0, 0],
  ],
  np.float32,
)


def shared_exponents(grads_WxD, block_size, dtype='float16', collective='allreduce'):
  """`_exchange._shared_exponents` of each worker's vector under a vmap of the workers."""
  c = C.cast(dtype, block_size=block_size)
  workers = grads_WxD.shape[0]
  one = lambda w: jd.sync._exchange._shared_exponents(c, [w], collective, 'i', workers)[0]
  return np.asarray(jax.vmap(one, axis_name='i')(jnp.asarray(grads_WxD)))


def test_cast_block_exponents_by_hand():
  """Block 0's max is 20,000 = 0.61 · 2^15: e = 14 − 15 = −1 (10,000 ≤ room < 20,000). Block
  1's is 3 · 2^-27 = 0.75 · 2^-25: e = 14 + 25 = 39 (12,288 ≤ room < 24,576). Block 2 is
  zeros: 0. Block 3 (inf and NaN left out; finite max 3 = 0.75 · 2^2): e = 12. One block for
  the vector: its max, 20,000, gives −1."""
  g = np.concatenate([HAND_WxD, [[np.inf, 1, np.nan, 0.5], [2, -3, 0, 0]]], axis=1)
  g = g.astype(np.float32)
  np.testing.assert_array_equal(shared_exponents(g, 4), [[-1, 39, 0, 12]] * 2)
  np.testing.assert_array_equal(shared_exponents(g, None), [[-1]] * 2)


def test_cast_blocks_mean_by_hand():
  """HAND_WxD scaled by 2^-1 and 2^39 per block: integers below 2^11 times powers of two, as
  are their sums, so float16 holds every one and the mean is exact. One scale for the vector
  (2^-1) leaves block 1 below half float16's smallest subnormal (3 · 2^-31 < 2^-25): zeros."""
  means, _ = cast_step('float16', 'allreduce', HAND_WxD, block_size=4)
  block_0 = [2000, -1450, 6500, 2.75]
  block_1 = [2.0**-29, -(2.0**-28), -0.75 * 2.0**-30, 0]
  np.testing.assert_array_equal(means, [[*block_0, *block_1, 0, 0, 0, 0]] * 2)
  np.testing.assert_array_equal(means, HAND_WxD.astype(np.float64).mean(0, keepdims=True)[[0, 0]])
  one_scale, _ = cast_step('float16', 'allreduce', HAND_WxD, block_size=None)
  np.testing.assert_array_equal(one_scale[:, 4:], 0.0)


@pytest.mark.parametrize('collective', ['allreduce', 'allgather'])
def test_cast_one_block_or_equal_blocks_is_one_scale_per_vector(collective):
  """A vector within one block, or of blocks with equal maxima: the blocks' exponents are the
  vector's, so the mean is bitwise what one scale per vector (block_size=None) gives."""
  rng = np.random.default_rng(1)
  short = rng.standard_normal((4, 200)).astype(np.float32) * 1000
  for_blocks, _ = cast_step('float16', collective, short)  # 200 <= 256: one block
  for_vector, _ = cast_step('float16', collective, short, block_size=None)
  np.testing.assert_array_equal(for_blocks, for_vector)
  equal = np.full((4, 1024), 20000.0, np.float32)
  equal[1::2, :] = -4000.0  # the second and fourth workers; every block's max still 20,000
  for_blocks, _ = cast_step('float16', collective, equal, block_size=128)
  for_vector, _ = cast_step('float16', collective, equal, block_size=None)
  np.testing.assert_array_equal(for_blocks, for_vector)
  np.testing.assert_array_equal(for_blocks, (20000.0 - 4000.0) / 2)  # float16 sums: exact


@pytest.mark.parametrize('workers', [4, 8])
def test_cast_tiny_block_beside_a_huge_one_keeps_float16_precision(workers):
  """1,024 elements of ±20,000 to 30,000, then 3,072 of ±1e-6 to 2e-6, float16 all-reduce.

  Every element of the mean is within N roundings of u = 2^-11 of the mean of the inputs'
  magnitudes (one cast per worker, N − 1 float16 additions): the tiny blocks get their own
  scale. One scale for the vector puts them at 2^-2 (4 workers) or 2^-3 of their size, in
  float16's subnormals (spacing 2^-24 = 6e-8), some 1e-2 off or more (checked too)."""
  rng = np.random.default_rng(7)
  big = rng.uniform(20_000, 30_000, (workers, 1024)) * rng.choice([-1, 1], (workers, 1024))
  tiny = rng.uniform(1e-6, 2e-6, (workers, 3072)) * rng.choice([-1, 1], (workers, 3072))
  g = np.concatenate([big, tiny], axis=1).astype(np.float32)
  g64 = g.astype(np.float64)
  exact, scale = g64.mean(0), np.abs(g64).mean(0)
  u = 2.0**-11
  means, _ = cast_step('float16', 'allreduce', g)
  err = np.max(np.abs(means[0] - exact) / scale)
  assert err <= workers * u, f'{err:.2e} of the mean magnitude, bound {workers * u:.2e}'
  one_scale, _ = cast_step('float16', 'allreduce', g, block_size=None)
  err_tiny = np.max(np.abs(one_scale[0, 1024:] - exact[1024:]) / scale[1024:])
  assert err_tiny >= 1e-2, f'one scale per vector: {err_tiny:.2e}'


@pytest.mark.parametrize('workers', [4, 8])
@pytest.mark.parametrize('collective', ['allreduce', 'allgather'])
def test_cast_blocks_at_the_top_of_float16_give_a_finite_mean(workers, collective):
  """Blocks of 20,000, of 65,504 (float16's largest), of −65,504, of 16,384 and of values
  within 1% of 65,504 beside a block of 1e-3: every sum of N overflows float16 unscaled. The
  mean is finite and within N roundings of u of the largest value of each block."""
  rng = np.random.default_rng(3)
  columns = [
    np.full(256, 20000.0), np.full(256, 65504.0), np.full(256, -65504.0),
    np.full(256, 16384.0), rng.uniform(0.99, 1.0, 256) * 65504.0, np.full(256, 1e-3),
  ]  # fmt: skip
  g = np.broadcast_to(np.concatenate(columns), (workers, 256 * len(columns))).astype(np.float32)
  means, _ = cast_step('float16', collective, g)
  assert np.isfinite(means).all(), np.count_nonzero(~np.isfinite(means))
  exact = g.astype(np.float64).mean(0)
  block_max = np.repeat(np.abs(exact).reshape(-1, 256).max(1), 256)
  u = 2.0**-11
  roundings = workers if collective == 'allreduce' else 1.001
  err = np.max(np.abs(means[0] - exact) / block_max)
  assert err <= roundings * u, f'{err:.2e} of the block maximum'


def test_cast_wire_of_unfused_blocks_by_hand():
  """conv 288, dense 320, bias 10 in blocks of 100: 3 + 4 + 1 exponents of one byte, in one
  all-reduce before the float16 payloads (2 bytes an element); the HLO sends the same."""
  tx = jd.sync.compressed_allreduce(
    C.cast('float16', block_size=100), axis_name=runtime.AXES, collective='allreduce',
    fused=False,
  )  # fmt: skip
  run = make_run(tx)
  assert wire_of(run) == [(AR, 3 + 4 + 1, None), (AR, 2 * 618, None)]
  found = lowered_collectives(run, worker_grads())
  assert sorted((c.kind, c.dtypes, c.nbytes) for c in found) == [
    ('all-reduce', ('f16',), 2 * (10 + 288 + 320)),  # the payload's tuple in one buffer (CPU)
    ('all-reduce', ('s8',), 8),
  ]


@pytest.mark.parametrize('size', [0, -4, 2.5, True, '256'])
def test_cast_block_size_must_be_a_positive_int_or_none(size):
  with pytest.raises(ValueError, match=f'block_size must be an int >= 1 or None, got {size!r}'):
    C.cast('float16', block_size=size)


def test_topk_residual_is_what_was_not_sent():
  grads = worker_grads(seed=5)
  tx = jd.sync.compressed_allreduce(C.topk(ratio=0.05), axis_name=runtime.AXES)
  run = make_run(tx)
  run(grads)
  (residual,) = run.state.residual
  for w in range(W):
    g = np.concatenate([np.asarray(x[w]).ravel() for x in jax.tree.leaves(grads)])
    sent = np.asarray(C.topk(ratio=0.05).roundtrip(jnp.asarray(g)))
    np.testing.assert_allclose(np.asarray(residual[w]), g - sent, atol=1e-7)


def numpy_powersgd(grads_w, steps, rank, q0):
  """epfml/powersgd's algorithm for one matrix over W workers, in NumPy."""

  def orth(p):
    p = p.copy()
    for i in range(p.shape[1]):
      p[:, i] /= np.linalg.norm(p[:, i]) + 1e-8
      for j in range(i + 1, p.shape[1]):
        p[:, j] -= np.sum(p[:, i] * p[:, j]) * p[:, i]
    return p

  memory = np.zeros_like(grads_w[0])
  q, outs = q0.copy(), []
  for step in range(steps):
    m = grads_w[step] + memory  # [W, rows, cols]
    p_hat = orth(np.mean([mw @ q for mw in m], axis=0))
    q = np.mean([mw.T @ p_hat for mw in m], axis=0)
    approx = p_hat @ q.T
    memory = m - approx
    outs.append(approx)
  return outs


def test_powersgd_matches_a_numpy_reference():
  rank, steps = 2, 3
  run = make_run(jd.sync.powersgd(rank, axis_name=runtime.AXES))
  q0 = [np.asarray(q[0]) for q in run.state.qs]  # per matrix, in leaf order
  all_grads = [worker_grads(seed=s) for s in range(steps)]
  outs = [updates_of(run, g) for g in all_grads]
  for j, key in enumerate(['conv', 'dense']):  # matrices in leaf order (bias stays dense)
    rows = int(np.prod(SHAPES[key][:-1]))
    gw = [
      np.asarray(g[key]).reshape(W, rows, SHAPES[key][-1]).astype(np.float64) for g in all_grads
    ]
    expected = numpy_powersgd(gw, steps, rank, q0[j].astype(np.float64))
    for step in range(steps):
      got = np.asarray(outs[step][key][0]).reshape(rows, -1)
      np.testing.assert_allclose(
        got, expected[step], atol=2e-4, rtol=1e-3, err_msg=f'{key} step {step}'
      )
  for step in range(steps):  # 1-D bias: exact mean
    np.testing.assert_allclose(outs[step]['bias'][3], mean_of(all_grads[step])['bias'], atol=1e-6)


def float64_powersgd(grads_TxWxRxC, q0):
  """PowerSGD with error feedback and warm start in float64, each basis from NumPy's QR.

  Per step: M_n = g_n + e_n; P = mean_n M_n Q with Q's columns made
  orthonormal first; P^ = an orthonormal basis of P's columns; Q = mean_n
  M_n^T P^; the mean is P^ Q^T and e_n = M_n − P^ Q^T. (Q's basis leaves
  the result unchanged in exact arithmetic.) Returns per step (mean, e).
  """
  basis = lambda a: np.linalg.qr(a)[0]
  memory = np.zeros_like(grads_TxWxRxC[0])
  q, out = q0, []
  for g in grads_TxWxRxC:
    m = g + memory
    p_hat = basis(np.mean(m @ basis(q), axis=0))
    q = np.mean(np.swapaxes(m, 1, 2) @ p_hat, axis=0)
    memory = m - p_hat @ q.T
    out.append((p_hat @ q.T, memory))
  return out


def relative(a, b):
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize('rank', [4, 6, 8])
def test_powersgd_at_higher_ranks_stays_at_float32_accuracy(rank):
  """Ten warm-started steps stay within float32's reach of float64: mean and memory.

  The gradients share a decaying spectrum (σ_k ∝ (k + 1)^-3) plus per-worker
  noise, as real gradients do. A warm-started Q carries M's leading singular
  values; used without orthogonalising it, M Q has a condition number near
  (σ_1 / σ_r)², and the same run is off float64 by up to 7e-5 (rank 4) to
  7e-4 (rank 8) in the mean, 3.5e-4 to 6.3e-3 in the memory. Here: at most
  1.2e-6 and 5.1e-6. The memory M − P^ Q^T is smaller than M by the
  spectrum's tail, so float32's rounding of M weighs more in it (its bound).
  """
  rows, cols, steps = 96, 64, 10
  rng = np.random.default_rng(1)
  u = np.linalg.qr(rng.standard_normal((rows, cols)))[0]
  v = np.linalg.qr(rng.standard_normal((cols, cols)))[0]
  sigma = (1.0 + np.arange(cols)) ** -3.0
  grads = []
  for _ in range(steps):
    shared = (u * sigma * (1 + 0.1 * rng.standard_normal(cols))) @ v.T
    noise = 1e-3 * rng.standard_normal((W, rows, cols))
    grads.append((shared + noise).astype(np.float32))
  run = testing.Run(
    jd.sync.powersgd(rank, axis_name=runtime.AXES), {'w': jnp.zeros((rows, cols))}, workers=W
  )
  q0 = np.asarray(run.state.qs[0][0], np.float64)
  expected = float64_powersgd([g.astype(np.float64) for g in grads], q0)
  for step, (g, (mean, memory)) in enumerate(zip(grads, expected, strict=True)):
    run({'w': jnp.asarray(g)})
    err_mean = relative(np.asarray(run.updates['w'][0]), mean)
    err_memory = relative(np.asarray(run.state.residual[0]), memory)
    assert err_mean <= 3e-6, f'step {step}: mean off float64 by {err_mean:.2e}'
    assert err_memory <= 1.5e-5, f'step {step}: memory off float64 by {err_memory:.2e}'


def bytes_by_kind(records):
  total = collections.Counter()
  for kind, nbytes in records:
    total[kind] += nbytes
  return dict(total)


@pytest.mark.parametrize(
  'compressor, collective, kw, dtypes',
  [
    (C.identity(), 'allreduce', {}, {'f32'}),
    # a gather's values and positions go as one buffer of their width (`jd.comm.packed(bits=True)`)
    (C.topk(ratio=0.05), 'allgather', {}, {'u32'}),
    (C.topk(ratio=0.05), 'allreduce', {}, {'f32', 's32'}),
    (C.topk(ratio=0.05), 'allreduce', {'leader': 'var'}, {'f32', 's32'}),
    (C.dgc(ratio=0.05), 'allgather', {}, {'u32'}),
    (C.randomk(ratio=0.05), 'allreduce', {}, {'f32'}),
    (C.qsgd(levels=127), 'allgather', {}, {'f32', 'u8'}),
    (C.qsgd(levels=7), 'allgather', {'fused': False}, {'u32', 'u8'}),
    (C.terngrad(), 'allgather', {}, {'f32', 'u8'}),
    (C.sign(), 'allgather', {}, {'u8'}),
    (C.onebit(), 'allgather', {}, {'f32', 'u8'}),
    (C.cast('bfloat16'), 'allreduce', {}, {'bf16', 's8'}),  # s8: the blocks' shared exponents
    (C.cast('float16'), 'allreduce', {}, {'f16', 's8'}),
    (C.cast('float16'), 'allreduce', {'fused': False}, {'f16', 's8'}),
    (C.cast('float16', block_size=100), 'allreduce', {'fused': False}, {'f16', 's8'}),
    (C.cast('float16', block_size=None), 'allreduce', {}, {'f16', 's8'}),
    (C.cast('float16'), 'allreduce', {'min_size': 10**6}, {'f32'}),  # all dense: no scale
    (C.cast('float16'), 'allreduce', {'min_size': 100}, {'f16', 's8', 'f32'}),
    (C.cast('float8_e4m3fn'), 'allgather', {}, {'f8e4m3fn', 's8'}),
    (C.cast('float8_e5m2', block_size=64), 'allgather', {}, {'f8e5m2', 's8'}),
    (C.powersgd(rank=2), 'allreduce', {}, {'f32'}),
    (C.topk(ratio=0.05), 'allgather', {'min_size': 50}, {'f32', 'u32'}),  # f32: dense leaves
  ],
  ids=lambda v: repr(v) if not isinstance(v, set) else '',
)
def test_lowered_hlo_sends_what_the_transform_reports(compressor, collective, kw, dtypes):
  run = make_run(averaging(compressor, collective, **kw))
  grads = worker_grads()
  found = lowered_collectives(run, grads)
  run(grads)
  reported = [t for t in comm.find_transfers(run.state) if int(t.count[0])]
  assert bytes_by_kind((c.kind, c.nbytes) for c in found) == bytes_by_kind(
    (t.kind, t.nbytes) for t in reported
  )
  assert {d for c in found for d in c.dtypes} == dtypes
  dense = 4 * sum(np.prod(s) for s in SHAPES.values())
  if not isinstance(compressor, C.Identity | C.Cast):
    assert sum(t.nbytes for t in reported) < dense / 2  # it really compresses


def test_lowered_hlo_of_warmup_holds_every_stage_but_only_one_runs():
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.01), axis_name=runtime.AXES, warmup_steps=8, warmup_stages=4
  )
  run = make_run(tx)
  grads = worker_grads()
  found = lowered_collectives(run, grads)
  planned = comm.find_transfers(run.state)
  assert len(planned) == 5
  gathered = sorted(c.nbytes for c in found)
  for t in planned:  # each stage's payload: values and indices gathered as one buffer
    assert gathered.count(t.nbytes) >= 1
  ran = []
  for _ in range(10):
    run(grads)
    ran.append([int(t.count[0]) for t in comm.find_transfers(run.state)])
  assert all(sum(r) == 1 for r in ran)
  assert [r.index(1) for r in ran] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
  assert planned[0].nbytes > planned[-1].nbytes


@pytest.mark.parametrize(
  'network, ratio, expected',
  [
    ('1gbps@10ms', 0.001, 'all-gather'),  # latency-bound: AG's log N messages win
    ('1gbps@0us', 0.05, 'all-reduce'),  # bandwidth-bound: AR-Top-k's k values win
  ],
)
def test_auto_picks_the_cheaper_collective(network, ratio, expected):
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=ratio), axis_name=runtime.AXES, collective='auto', network=network
  )
  run = make_run(tx)
  run(worker_grads())
  transfers = [jax.tree.map(lambda c: c[0], t) for t in comm.find_transfers(run.state)]
  assert {t.kind for t in transfers if int(t.count)} == {expected}
  # and it is the cheaper one under the model it was given
  net = jd.netmodel.profile(network)
  gather = [t for t in transfers if t.kind == 'all-gather']
  reduce = [t for t in transfers if t.kind == 'all-reduce']
  cost = lambda ts: jd.netmodel.comm_time(ts, W, net, counts=[1] * len(ts))
  assert (cost(gather) < cost(reduce)) == (expected == 'all-gather')


def test_auto_chooses_the_collective_for_each_warmup_stage():
  """Top-k 0.1% of 20,000 values, 8 workers, a 1 Gbit/s 25 µs ring, DGC's
  warm-up over 8 steps in 4 stages (25%, 6.3%, 1.6%, 0.4%, then 0.1% kept). Every step runs the
  collective the α-β model prices lower for the ratio then in force: AR-Top-k early, the
  all-gather from the final ratio on (84 µs against 428 µs)."""
  n, net = 20_000, jd.netmodel.gbps(1, 25e-6)
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.001), axis_name=runtime.AXES, collective='auto', network=net, warmup_steps=8
  )
  run = testing.Run(tx, {'x': jnp.zeros(n)}, workers=W, devices=1)
  kinds = [t.kind for t in comm.find_transfers(run.state)]
  g = {'x': jnp.asarray(np.random.default_rng(0).standard_normal((W, n)).astype(np.float32))}
  ratios = C.warmup_ratios(0.001, 4)
  picks = []
  for step in range(12):
    run(g)
    k = C.topk(ratio=ratios[min(step // 2, 4)]).kept(n)
    gather = jd.netmodel.allgather(8 * k, W, net)  # k float32 values and k int32 indices
    artopk = jd.netmodel.artopk(4 * k, W, net)  # the leader's indices, then everybody's values
    picks.append('all-gather' if gather < artopk else 'all-reduce')
    ran = {kinds[i] for i, c in enumerate(run.history[-1]) if c}
    assert ran == {picks[-1]}, f'step {step}: ran {ran}, model {gather=:.2e} {artopk=:.2e}'
  assert picks[0] == 'all-reduce' and picks[-1] == 'all-gather'  # the choice really changes
  assert (gather, artopk) == pytest.approx((84e-6, 428e-6), abs=1e-6)


def test_dgc_momentum_correction_masks_sent_momentum():
  grads = worker_grads(seed=7)
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.05), axis_name=runtime.AXES, momentum_correction=0.9
  )
  run = make_run(tx)
  run(grads)
  (u,) = run.state.momentum
  (residual,) = run.state.residual
  for w in range(W):
    g = np.concatenate([np.asarray(x[w]).ravel() for x in jax.tree.leaves(grads)])
    sent = np.flatnonzero(np.asarray(C.topk(ratio=0.05).roundtrip(jnp.asarray(g))))
    expected_u = g.copy()  # u = 0.9 * 0 + g
    expected_u[sent] = 0.0
    np.testing.assert_allclose(np.asarray(u[w]), expected_u, atol=1e-7)
    np.testing.assert_allclose(np.asarray(residual[w])[sent], 0.0)
  run(grads)  # second step: u = 0.9 u + g where not masked
  (u2,) = run.state.momentum
  assert np.all(np.isfinite(np.asarray(u2)))


def test_local_clip_scales_to_max_norm_over_sqrt_n():
  tx = jd.sync.local_clip(4.0, axis_name=runtime.AXES)
  out = updates_of(make_run(tx), jax.tree.map(lambda g: 100 * g, worker_grads()))
  for w in range(W):
    norm = np.sqrt(sum(float(np.sum(np.asarray(x[w]) ** 2)) for x in jax.tree.leaves(out)))
    np.testing.assert_allclose(norm, 4.0 / np.sqrt(W), rtol=1e-5)


@pytest.mark.parametrize(
  'make, message',
  [
    (
      lambda: jd.sync.compressed_allreduce(C.topk(ratio=0.1), axis_name='data', collective='ring'),
      'collective must be one of',
    ),
    (
      lambda: jd.sync.compressed_allreduce(C.qsgd(), axis_name='data', collective='allreduce'),
      'qsgd payloads cannot be summed',
    ),
    (
      lambda: jd.sync.compressed_allreduce(C.powersgd(), axis_name='data'),
      'compressed_allreduce does not take PowerSGD.*use jd.sync.powersgd',
    ),
    (
      lambda: jd.sync.compressed_allreduce(C.topk(ratio=0.1), axis_name='data', leader='max'),
      'leader must be one of',
    ),
    (
      lambda: jd.sync.compressed_allreduce(C.qsgd(), axis_name='data', momentum_correction=0.9),
      'momentum_correction needs a sparsifier',
    ),
    (
      lambda: jd.sync.compressed_allreduce(
        C.topk(ratio=0.1), axis_name='data', momentum_correction=1.5
      ),
      r'momentum_correction must be in \[0, 1\)',
    ),
    (
      lambda: jd.sync.compressed_allreduce(C.sign(), axis_name='data', warmup_steps=10),
      'warm-up needs a compressor with a ratio',
    ),
    (
      lambda: jd.sync.compressed_allreduce(
        C.topk(ratio=0.1), axis_name='data', network='3 tin cans'
      ),
      'unknown network profile',
    ),
    (
      lambda: jd.sync.compressed_allreduce('topk', axis_name='data'),
      'compressor must be a jaxdist.compress compressor',
    ),
    (lambda: jd.sync.local_clip(0.0, axis_name='data'), 'max_norm must be > 0'),
  ],
)
def test_bad_arguments_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_k_larger_than_the_model_fails_at_init():
  tx = jd.sync.compressed_allreduce(C.topk(k=10**6), axis_name='data')
  with pytest.raises(ValueError, match=r'k=1000000 is larger than the tensor \(\d+ elements\)'):
    jax.eval_shape(tx.init, params())


def test_in_a_chain_the_optimizer_sees_the_compressed_mean():
  tx = optax.chain(
    jd.sync.compressed_allreduce(C.identity(), axis_name=runtime.AXES), optax.sgd(0.5)
  )
  grads = worker_grads()
  out = updates_of(make_run(tx), grads)
  assert_all_workers(out, jax.tree.map(lambda g: -0.5 * g, mean_of(grads)))


# --- PowerSGD as its own transform -------------------------------------------------------


def test_powersgd_start_step_is_dense_then_compresses_from_a_zero_residual():
  """PyTorch's start_powerSGD_iter: two dense steps (the exact mean, one all-reduce of the
  whole gradient), then PowerSGD from zero error memory and the initial Q, i.e. the first
  compressed step equals a start_step=0 transform's first step."""
  start = 2
  run = make_run(jd.sync.powersgd(2, axis_name=runtime.AXES, start_step=start))
  fresh = make_run(jd.sync.powersgd(2, axis_name=runtime.AXES))
  q0 = [np.asarray(q) for q in run.state.qs]
  for t in range(start):
    grads = worker_grads(seed=t)
    out = updates_of(run, grads)
    assert_all_workers(out, mean_of(grads))
    for r in run.state.residual:
      np.testing.assert_array_equal(r, 0)
  grads = worker_grads(seed=start)
  got, want = updates_of(run, grads), updates_of(fresh, grads)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  moved = [not np.array_equal(q, p) for q, p in zip(q0, run.state.qs, strict=True)]
  assert all(moved)  # Q stayed the initial draw through the dense steps
  # wire: P with the dense 1-D tensors, Q, whole-gradient warm-up all-reduce
  dense_model = 4 * sum(np.prod(s) for s in SHAPES.values())
  assert comm.find_transfers(run.state)[-1].nbytes == dense_model
  assert run.history == [[0, 0, 1], [0, 0, 1], [1, 1, 0]]


def test_powersgd_warmup_branch_really_skips_the_compressed_collectives():
  run = make_run(jd.sync.powersgd(2, axis_name=runtime.AXES, start_step=3))
  text = run.hlo(worker_grads())
  branches = comm.hlo.conditional_branches(text)
  found = comm.hlo.collectives(text)
  assert found and all(c.computation in branches for c in found)


def test_powersgd_is_two_flat_all_reduces_and_the_ledger_counts_only_those_that_run():
  run = make_run(jd.sync.powersgd(2, axis_name=runtime.AXES))
  found = lowered_collectives(run, worker_grads())
  # P of conv [36, 2] and dense [32, 2] with the bias (10), then Q of both [8, 2] and [10, 2]
  assert sorted((c.kind, c.nbytes) for c in found) == [
    ('all-reduce', 4 * (8 * 2 + 10 * 2)),
    ('all-reduce', 4 * (36 * 2 + 32 * 2 + 10)),
  ]
  # no matrix big enough to compress: the dense tensors' all-reduce alone, and no Q
  run = make_run(jd.sync.powersgd(2, axis_name=runtime.AXES, min_size=10**6))
  found = lowered_collectives(run, worker_grads())
  run(worker_grads())
  assert [int(t.count[0]) for t in comm.find_transfers(run.state)] == [1, 0]
  assert [(c.kind, c.nbytes) for c in found] == [('all-reduce', 4 * (288 + 320 + 10))]


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: jd.sync.powersgd(0, axis_name='data'), 'rank must be >= 1, got 0'),
    (lambda: jd.sync.powersgd(axis_name='data', start_step=-1), 'start_step must be >= 0'),
    (lambda: jd.sync.powersgd(axis_name='data', min_size=-1), 'min_size must be >= 0'),
  ],
)
def test_powersgd_bad_arguments_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


@pytest.mark.parametrize('devices', [8, 1], ids=['8-devices', '8-simulated'])
def test_warmup_stages_are_real_branches_on_simulated_workers_too(devices):
  # Under vmap a per-worker stage index would turn the switch into a select that runs
  # every stage's collectives; the index is agreed across workers, so each stays a branch.
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.01), axis_name=runtime.AXES, warmup_steps=8, warmup_stages=4
  )
  text = make_run(tx, devices=devices).hlo(worker_grads())
  branches = comm.hlo.conditional_branches(text)
  found = comm.hlo.collectives(text)
  assert found and all(c.computation in branches for c in found)


# --- candidate ratios chosen per step (GraVAC, ADOPT) ------------------------------------------

RATIOS = (0.1, 0.01, 0.001)


def candidates(**kw):
  return jd.sync.compressed_allreduce(
    C.topk(ratio=0.5), axis_name=runtime.AXES, ratios=RATIOS, **kw
  )


def test_a_pinned_candidate_reproduces_the_fixed_ratio_run_exactly():
  grads = lambda t: worker_grads(seed=t)
  for i, ratio in enumerate(RATIOS):
    fixed = make_run(jd.sync.compressed_allreduce(C.topk(ratio=ratio), axis_name=runtime.AXES))
    pinned = make_run(candidates())
    for t in range(3):
      fixed(grads(t))
      pinned(grads(t), candidate=i)
    for a, b in zip(jax.tree.leaves(fixed.params), jax.tree.leaves(pinned.params), strict=True):
      np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fixed.state.residual[0], pinned.state.residual[0])
    assert all(h[i] == 1 and sum(h) == 1 for h in pinned.history)  # one collective per step


def test_the_dense_candidate_sends_everything_and_empties_the_residual():
  run = make_run(candidates())
  run(worker_grads(seed=0), candidate=0)  # leaves a residual
  assert float(jnp.abs(run.state.residual[0]).sum()) > 0
  before = np.asarray(run.state.residual[0])
  grads = worker_grads(seed=1)
  run(grads, candidate=len(RATIOS))
  flat = lambda g: np.concatenate([np.asarray(g[k]).reshape(W, -1) for k in sorted(g)], axis=1)
  # everyone gets the mean of gradient + residual, and nothing is kept back
  expected = (flat(grads) + before).mean(0)
  got = flat(run.updates)
  for w in range(W):
    np.testing.assert_allclose(got[w], expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(run.state.residual[0]), 0.0)
  assert run.history[-1][-1] == 1 and sum(run.history[-1]) == 1


def test_error_feedback_carries_across_ratio_changes():
  # e_n + Σ sent = Σ gradients, whatever ratio each step used
  run = make_run(candidates())
  total = 0.0
  sent = 0.0
  for t, i in enumerate([0, 2, 1, 2, 0]):
    g = worker_grads(seed=t)
    flat = np.concatenate([np.asarray(g[k]).reshape(W, -1) for k in sorted(g)], axis=1)
    total = total + flat
    run(g, candidate=i)
    sent = sent + np.concatenate(
      [np.asarray(run.updates[k]).reshape(W, -1) for k in sorted(g)], axis=1
    ).mean(0)
  np.testing.assert_allclose(
    sent * W + np.asarray(run.state.residual[0]).sum(0), total.sum(0), rtol=1e-4, atol=1e-4
  )


def test_the_gain_ingredients_are_the_norms_by_hand():
  # one worker's w = g (no residual yet): ‖w‖², and ‖Top-k(w)‖² of its largest |entries|
  run = make_run(candidates())
  g = worker_grads(seed=3)
  run(g, candidate=1)
  flat = np.concatenate([np.asarray(g[k]).reshape(W, -1) for k in sorted(g)], axis=1)
  assert flat.shape[1] == 618
  k = 6  # floor(0.01 · 618)
  top = np.sort(flat**2, axis=1)[:, -k:].sum(1)
  np.testing.assert_allclose(np.asarray(run.state.norms)[:, 0], (flat**2).sum(1), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(run.state.norms)[:, 1], top, rtol=1e-5)


@pytest.mark.parametrize('devices', [8, 1], ids=['8-devices', '8-simulated'])
def test_candidates_are_real_branches_and_changing_them_never_recompiles(devices):
  run = make_run(candidates(), devices=devices)
  text = run.hlo(worker_grads(), candidate=0)
  branches = comm.hlo.conditional_branches(text)
  found = comm.hlo.collectives(text)
  assert found and all(c.computation in branches for c in found)
  assert len(branches) >= len(RATIOS) + 1
  for i in (0, 3, 1, 2):
    run(worker_grads(), candidate=i)
  assert run.step._cache_size() == 1
  assert [h.index(1) for h in run.history] == [0, 3, 1, 2]


def test_a_pinned_ratio_and_collective_reproduce_the_fixed_run_exactly():
  # ratios with collective='auto': every (ratio, collective) pair is a branch; via picks the
  # collective (0 all-gather, 1 AR-Top-k) and a pinned pair is the fixed transform, bitwise
  grads = lambda t: worker_grads(seed=t)
  pairs = [(i, j) for i in range(len(RATIOS)) for j in range(2)]
  for i, j in pairs:
    col = ('allgather', 'allreduce')[j]
    fixed = make_run(
      jd.sync.compressed_allreduce(C.topk(ratio=RATIOS[i]), axis_name=runtime.AXES, collective=col)
    )
    pinned = make_run(candidates(collective='auto'))
    for t in range(3):
      fixed(grads(t))
      pinned(grads(t), candidate=i, via=j)
    for a, b in zip(jax.tree.leaves(fixed.params), jax.tree.leaves(pinned.params), strict=True):
      np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fixed.state.residual[0], pinned.state.residual[0])
    # one branch's collectives ran per step: AG has one transfer, AR-Top-k two (indices, values)
    assert all(sum(h) == (1 if j == 0 else 2) for h in pinned.history)
    assert all(h == pinned.history[0] for h in pinned.history)


def test_sent_gains_skip_the_other_candidates_and_change_nothing_else():
  every, sent = make_run(candidates()), make_run(candidates(gains='sent'))
  for t, i in enumerate([0, 2, 3]):  # 3: dense
    every(worker_grads(seed=t), candidate=i)
    sent(worker_grads(seed=t), candidate=i)
    norms = np.asarray(sent.state.norms)
    want = np.zeros((W, len(RATIOS)))
    if i < len(RATIOS):  # ‖C(w)‖² / ‖w‖² of what was sent, by hand from the norms
      want[:, i] = norms[:, 1] / norms[:, 0]
      np.testing.assert_allclose(want[:, i], np.asarray(every.state.gains)[:, i], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sent.state.gains), want, rtol=1e-6, atol=0)
  for a, b in zip(jax.tree.leaves(every.params), jax.tree.leaves(sent.params), strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="gains must be 'all' or 'sent'"):
    candidates(gains='some')


def test_ratio_and_collective_pairs_are_branches_and_never_recompile():
  run = make_run(candidates(collective='auto'))
  text = run.hlo(worker_grads(), candidate=0, via=1)
  branches = comm.hlo.conditional_branches(text)
  found = comm.hlo.collectives(text)
  assert found and all(c.computation in branches for c in found)
  assert len(branches) >= 2 * len(RATIOS) + 1
  runs = [(0, 0), (2, 1), (3, 0), (1, 1), (1, 0)]
  for i, j in runs:
    run(worker_grads(), candidate=i, via=j)
  assert run.step._cache_size() == 1
  ran = {tuple(h) for h in run.history}
  assert len(ran) == len(runs)  # five distinct branches ran, each alone
  assert run.history[2][-1] == 1 and sum(run.history[2]) == 1  # index 3: the dense all-reduce
  with pytest.raises(ValueError, match=r"via= .* only with ratios and collective='auto'"):
    make_run(candidates())(worker_grads(), candidate=0, via=0)


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: candidates(warmup_steps=10), 'ratios and warmup_steps'),
    (lambda: jd.sync.compressed_allreduce(C.topk(ratio=0.5), axis_name="w", ratios=(0.1, 1.5)),
     r'ratios must all be in \(0, 1\]'),
    (lambda: jd.sync.compressed_allreduce(C.topk(ratio=0.5), axis_name="w", ratios=(0.1, 0.1)),
     'ratios must be distinct'),
    (lambda: jd.sync.compressed_allreduce(C.qsgd(), axis_name='w', ratios=(0.1,)),
     'ratios needs a compressor with a ratio'),
  ],
)  # fmt: skip
def test_bad_candidates_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_candidates_need_the_index_and_only_then():
  with pytest.raises(ValueError, match='needs the extra argument candidate='):
    make_run(candidates())(worker_grads())
  plain = jd.sync.compressed_allreduce(C.topk(ratio=0.1), axis_name=runtime.AXES)
  with pytest.raises(ValueError, match='without ratios takes none'):
    make_run(plain)(worker_grads(), candidate=0)


def test_every_candidate_s_gain_by_hand_whichever_was_sent():
  run = make_run(candidates())
  g = worker_grads(seed=4)
  run(g, candidate=len(RATIOS))  # dense: the gains are still measured
  flat = np.concatenate([np.asarray(g[k]).reshape(W, -1) for k in sorted(g)], axis=1) ** 2
  top = np.sort(flat, axis=1)[:, ::-1].cumsum(1)
  for i, k in enumerate((61, 6, 1)):  # floor(r · 618) for r = 0.1, 0.01, 0.001
    np.testing.assert_allclose(
      np.asarray(run.state.gains)[:, i], top[:, k - 1] / flat.sum(1), rtol=1e-5
    )
  assert np.all(np.diff(np.asarray(run.state.gains), axis=1) < 0)  # fewer kept, less gain


def test_an_index_out_of_range_sends_dense():
  for index in (-1, len(RATIOS) + 3):
    run = make_run(candidates())
    run(worker_grads(), candidate=index)
    assert run.history[-1][-1] == 1 and sum(run.history[-1]) == 1


# --- the wire tuple: every exchange's transfers, in branch order -----------------------
# Written out by hand from the rule: for each stage (candidate ratio or warm-up stage), its
# transfers with each collective in turn (so branch `index × collectives + way`), then, with
# ratios, the dense all-reduce of the compressed groups, then the small leaves' all-reduce.
# The model: conv 288 + dense 320 + bias 10 = 618 floats; Top-k keeps k = max(1, ⌊r·n⌋) and
# sends 8k bytes (float32 values, int32 indices); AR-Top-k all-reduces 4k bytes of the
# leader's indices (a broadcast), then 4k of values; VAR's leader costs a 4-byte all-gather.
AG, AR, BC = comm.ALL_GATHER, comm.ALL_REDUCE, 'broadcast'


def wire_of(run):
  return [(t.kind, t.nbytes, t.op) for t in comm.find_transfers(run.state)]


def ran(wire, entries):
  return [int(i in entries) for i in range(len(wire))]


def test_wire_of_ratio_and_collective_pairs_then_dense_by_hand():
  run = make_run(candidates(collective='auto'))  # RATIOS 0.1, 0.01, 0.001: k = 61, 6, 1
  want = [
    (AG, 8 * 61, None), (AR, 4 * 61, BC), (AR, 4 * 61, None),  # 0.1: via 0, via 1
    (AG, 8 * 6, None), (AR, 4 * 6, BC), (AR, 4 * 6, None),  # 0.01
    (AG, 8 * 1, None), (AR, 4 * 1, BC), (AR, 4 * 1, None),  # 0.001
    (AR, 4 * 618, None),  # dense
  ]  # fmt: skip
  assert wire_of(run) == want
  # branch i·2 + j; AG is one transfer, AR-Top-k two; candidate 3 (out of range too): dense
  runs = {(0, 1): {1, 2}, (2, 0): {6}, (1, 1): {4, 5}, (3, 0): {9}, (0, 0): {0}, (-1, 1): {9}}
  for (i, j), entries in runs.items():
    run(worker_grads(), candidate=i, via=j)
    assert run.history[-1] == ran(want, entries), (i, j)


def test_wire_of_unfused_candidates_then_dense_then_the_small_leaves_by_hand():
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.5), axis_name=runtime.AXES, ratios=RATIOS, fused=False, min_size=20
  )
  run = make_run(tx)  # groups conv 288 and dense 320 (k 28 + 32, 2 + 3, 1 + 1); bias 10 alone
  want = [(AG, 8 * 60, None), (AG, 8 * 5, None), (AG, 8 * 2, None), (AR, 4 * 608, None)]
  want.append((AR, 4 * 10, None))
  assert wire_of(run) == want
  for i, entries in [(1, {1, 4}), (3, {3, 4}), (0, {0, 4}), (2, {2, 4})]:
    run(worker_grads(), candidate=i)
    assert run.history[-1] == ran(want, entries), i


def test_wire_of_warmup_stages_by_hand():
  # topk 0.01 in 2 stages of 4 // 2 = 2 steps: ratios 0.01^(1/3), 0.01^(2/3), then 0.01
  tx = jd.sync.compressed_allreduce(
    C.topk(ratio=0.01), axis_name=runtime.AXES, collective='allreduce', leader='var',
    warmup_steps=4, warmup_stages=2,
  )  # fmt: skip
  run = make_run(tx)
  want = [
    (AG, 4, None), (AR, 4 * 133, BC), (AR, 4 * 133, None),  # ⌊618 · 0.2154⌋
    (AG, 4, None), (AR, 4 * 28, BC), (AR, 4 * 28, None),  # ⌊618 · 0.0464⌋
    (AG, 4, None), (AR, 4 * 6, BC), (AR, 4 * 6, None),
  ]  # fmt: skip
  assert wire_of(run) == want
  for step, stage in enumerate([0, 0, 1, 1, 2, 2]):
    run(worker_grads(seed=step))
    assert run.history[-1] == ran(want, {3 * stage, 3 * stage + 1, 3 * stage + 2}), step


def test_wire_of_auto_for_a_summable_cast_by_hand():
  tx = jd.sync.compressed_allreduce(
    C.cast(dtype='float16'), axis_name=runtime.AXES, collective='auto'
  )
  run = make_run(tx)  # summable: all-reduce first; each after the all-reduce of its exponents,
  want = [(AR, 3, None), (AR, 2 * 618, None), (AR, 3, None), (AG, 2 * 618, None)]  # ⌈618/256⌉
  assert wire_of(run) == want
  run(worker_grads())
  assert run.history[-1] in (ran(want, {0, 1}), ran(want, {2, 3}))
