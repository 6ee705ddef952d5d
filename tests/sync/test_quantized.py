"""quantized_allreduce: 'float32' is the dense mean, hand-computed int8 / fp8, bytes vs HLO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, netmodel, runtime, sync, testing
from jaxdist.sync import quantized

AX = runtime.AXES
W = 8
# leaves of rank 0 to 3 (like the GPT's attention kernels): 1 + 5 + 12 + 24 = 42 elements
SHAPES = {'scale': (), 'bias': (5,), 'dense': (3, 4), 'attn': (2, 3, 4)}
D = 42


def params():
  return {k: jnp.zeros(s, jnp.float32) for k, s in SHAPES.items()}


def worker_grads(seed=0, workers=W):
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal((workers, *s)).astype(np.float32) for k, s in SHAPES.items()}


def qar(format='int8', block_size=4, workers=W, collective='alltoall'):
  return sync.quantized_allreduce(
    axis_name=AX, num_workers=workers, format=format, block_size=block_size, collective=collective
  )


def ceil(a, b):
  return -(-a // b)


def flat(tree, w):
  """Worker w's leaves, flattened in leaf order (the order the transform flattens them in)."""
  return np.concatenate([np.asarray(x[w]).ravel() for x in jax.tree.leaves(tree)])


# --- the degenerate case: no quantisation is the dense all-reduce ----------------------------


@pytest.mark.parametrize('devices, block_size', [(1, 1), (2, 256), (8, 4)])
def test_float32_is_allreduce(devices, block_size):
  grads = worker_grads()
  got = testing.Run(qar('float32', block_size), params(), workers=W, devices=devices)
  want = testing.Run(sync.allreduce(axis_name=AX), params(), workers=W, devices=devices)
  got(grads)
  want(grads)
  for k in SHAPES:
    np.testing.assert_allclose(got.updates[k], want.updates[k], rtol=1e-6, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(  # and the NumPy mean, every worker
      got.updates[k], np.broadcast_to(grads[k].mean(0), grads[k].shape), rtol=1e-6, atol=1e-6
    )
  assert got.history == [[1, 1]]


@pytest.mark.parametrize('devices', [1, 8])
def test_float32_allgather_is_allreduce(devices):
  grads = worker_grads()
  got = testing.Run(qar('float32', 4, collective='allgather'), params(), workers=W, devices=devices)
  got(grads)
  for k in SHAPES:
    np.testing.assert_allclose(
      got.updates[k], np.broadcast_to(grads[k].mean(0), grads[k].shape), rtol=1e-6, atol=1e-6
    )
  assert got.history == [[1]]


# --- hand-computed cases: 2 workers, blocks of 4, 8 elements (one block per chunk) ----------

# int8: s = max|block| / 127, q = round-half-even(x / s)
INT8_G = np.array(
  [
    [127, 1.5, -2.5, 0.25, 0, 0, 0, 0],  # s = 1: q [127, 2, -2, 0]; a zero block: s = 1, q 0
    [0, 0.5, 3.5, -63.5, 254, -1, 3, 1],  # s = 0.5: exact; s = 2: [127, -0.5, 1.5, 0.5] ->
  ],  #                                                              [127, -0, 2, 0]
  np.float32,
)
# chunk 0: ([127, 2, -2, 0] + [0, 0.5, 3.5, -63.5]) / 2 = [63.5, 1.25, 0.75, -31.75]
#   s = 0.5: [127, 2.5, 1.5, -63.5] -> [127, 2, 2, -64] -> [63.5, 1, 1, -32]
# chunk 1: ([0, 0, 0, 0] + [254, 0, 4, 0]) / 2 = [127, 0, 2, 0], s = 1: exact
INT8_OUT = np.array([63.5, 1, 1, -32, 127, 0, 2, 0], np.float32)

# fp8 E4M3 (3 mantissa bits): s = max|block| / 448, then the round-to-nearest-even cast
FP8_G = np.array(
  [
    [448, 17, 19, -0.3, 0, 0, 0, 0],  # s = 1: 17 -> 16, 19 -> 20 (ties to even), -0.3 -> -0.3125
    [448, 0, 1, 0.001, -896, 100, 3, 0],  # 0.001 -> 2^-9 (subnormal); s = 2: [-448, 50, 1.5, 0]
  ],  #                                                                  50 -> 48 (tie, even)
  np.float32,
)
# chunk 0: ([448, 16, 20, -0.3125] + [448, 0, 1, 2^-9]) / 2 = [448, 8, 10.5, -0.155273...]
#   s = 1: 10.5 -> 10 (tie, even), -0.155273 -> -0.15625 (steps of 2^-6 in [1/8, 1/4))
# chunk 1: ([0, 0, 0, 0] + [-896, 96, 3, 0]) / 2 = [-448, 48, 1.5, 0], s = 1: exact
FP8_OUT = np.array([448, 8, 10, -0.15625, -448, 48, 1.5, 0], np.float32)


@pytest.mark.parametrize(
  'format, g, out', [('int8', INT8_G, INT8_OUT), ('fp8', FP8_G, FP8_OUT)], ids=['int8', 'fp8']
)
@pytest.mark.parametrize('devices', [1, 2])
def test_two_workers_by_hand(format, g, out, devices):
  run = testing.Run(qar(format, 4, workers=2), jnp.zeros(8), workers=2, devices=devices)
  run(jnp.asarray(g))
  for w in range(2):
    np.testing.assert_array_equal(np.asarray(run.updates[w]), out, err_msg=f'worker {w}')
  assert run.history == [[1, 1]]


# 'allgather': the mean of the workers' first roundings, not rounded again
INT8_ONCE = np.array([63.5, 1.25, 0.75, -31.75, 127, 0, 2, 0], np.float32)
FP8_ONCE = np.array([448, 8, 10.5, (-0.3125 + 2**-9) / 2, -448, 48, 1.5, 0], np.float32)


@pytest.mark.parametrize(
  'format, g, out', [('int8', INT8_G, INT8_ONCE), ('fp8', FP8_G, FP8_ONCE)], ids=['int8', 'fp8']
)
def test_two_workers_by_hand_with_one_rounding(format, g, out):
  tx = qar(format, 4, workers=2, collective='allgather')
  run = testing.Run(tx, jnp.zeros(8), workers=2, devices=2)
  run(jnp.asarray(g))
  for w in range(2):
    np.testing.assert_array_equal(np.asarray(run.updates[w]), out, err_msg=f'worker {w}')
  assert run.history == [[1]]


def test_scales_and_rounding_by_hand():
  q, s = quantized.quantize(jnp.asarray(INT8_G[1].reshape(2, 4)), 'int8')
  np.testing.assert_array_equal(s, [0.5, 2.0])
  np.testing.assert_array_equal(q, [[0, 1, 7, -127], [127, 0, 2, 0]])
  assert q.dtype == jnp.int8
  q, s = quantized.quantize(jnp.zeros((1, 4)), 'int8')  # a zero block: scale 1 (torchft)
  np.testing.assert_array_equal(s, [1.0])
  q, s = quantized.quantize(jnp.asarray(FP8_G[1].reshape(2, 4)), 'fp8')
  np.testing.assert_array_equal(s, [448 / 448, 896 / 448])
  np.testing.assert_array_equal(q.astype(np.float32), [[448, 0, 1, 2**-9], [-448, 48, 1.5, 0]])
  assert q.dtype == jnp.float8_e4m3fn


def test_a_lone_worker_gets_the_quantisation_round_trip_and_sends_nothing():
  # built for 8 workers, run on one (as the trainer times one worker's compute)
  run = testing.Run(qar('int8', 4, workers=8), jnp.zeros(8), workers=1)
  run(jnp.asarray(INT8_G[:1]))
  np.testing.assert_array_equal(np.asarray(run.updates[0]), [127, 2, -2, 0, 0, 0, 0, 0])
  assert run.history == [[0, 0]]


# --- int8 / fp8 against the exact mean -------------------------------------------------------


@pytest.mark.parametrize('format, fmax', [('int8', 127.0), ('fp8', 448.0)])
def test_error_is_within_two_roundings(format, fmax):
  """|out − mean| ≤ one rounding of each worker's block (mean of them) + one of the mean's.

  int8 rounds to within s/2; E4M3 to within 2^-4 of a normal value's magnitude, or 2^-10·s
  (half a subnormal step) below 2^-6·s: bounded here by 2^-4·max|block| for both roundings.
  """
  B = 4
  grads = worker_grads(seed=3)
  run = testing.Run(qar(format, B), params(), workers=W)
  run(grads)
  g = np.stack([flat(grads, w) for w in range(W)])  # [W, D]
  pad = ceil(D, B * W) * B * W - D
  blocks = np.pad(g, ((0, 0), (0, pad))).reshape(W, -1, B)
  amax = np.abs(blocks).max(-1, keepdims=True)  # [W, blocks, 1]
  mean = blocks.mean(0)
  step = (amax / fmax / 2) if format == 'int8' else (amax * 2.0**-4)
  first = step.mean(0)  # the mean of the workers' first roundings
  second_amax = np.abs(mean).max(-1, keepdims=True) + first
  second = second_amax / fmax / 2 if format == 'int8' else second_amax * 2.0**-4
  bound = np.broadcast_to(first + second, mean.shape).reshape(-1)[:D] * 1.0001
  out = flat(run.updates, 0)
  err = np.abs(out - mean.reshape(-1)[:D])
  assert np.all(err <= bound), (err - bound).max()
  assert err.max() > 0  # it did quantise
  for w in range(1, W):  # every worker got the same mean
    np.testing.assert_array_equal(flat(run.updates, w), out)


def test_leaf_dtypes_are_kept():
  p = {'a': jnp.zeros((2, 3), jnp.bfloat16), 'b': jnp.zeros((), jnp.float32)}
  run = testing.Run(qar('int8', 2, workers=2), p, workers=2)
  run({'a': jnp.ones((2, 2, 3), jnp.bfloat16), 'b': jnp.array([1.0, 3.0])})
  assert run.updates['a'].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(run.updates['a'], np.float32), np.ones((2, 2, 3)))
  np.testing.assert_array_equal(run.updates['b'], [2.0, 2.0])


def test_a_nan_poisons_its_block_only():
  g = np.zeros((2, 8), np.float32)
  g[0, 1] = np.nan
  g[:, 4:] = 1.0
  run = testing.Run(qar('int8', 4, workers=2), jnp.zeros(8), workers=2)
  run(jnp.asarray(g))
  out = np.asarray(run.updates[1])
  assert np.isnan(out[:4]).all()
  np.testing.assert_array_equal(out[4:], np.ones(4))


# --- the wire --------------------------------------------------------------------------------


def wire_bytes(format, B, n=D, workers=W):
  """(all-to-all payload, all-gather payload) by hand: K = ⌈⌈n/B⌉/N⌉ blocks of B·b + 4 bytes."""
  b, scale = {'int8': (1, 4), 'fp8': (1, 4), 'float32': (4, 0)}[format]
  K = ceil(ceil(n, B), workers)
  return workers * K * (B * b + scale), K * (B * b + scale)


@pytest.mark.parametrize('format', ['int8', 'fp8', 'float32'])
def test_allgather_bytes_are_the_hlo_operand(format):
  # 42 elements, blocks of 4: 11 blocks, not padded to the workers
  b, scale = {'int8': (1, 4), 'fp8': (1, 4), 'float32': (4, 0)}[format]
  run = testing.Run(qar(format, 4, collective='allgather'), params(), workers=W, devices=8)
  (ag,) = comm.find_transfers(run.state)
  assert (ag.kind, ag.nbytes) == ('all-gather', 11 * (4 * b + scale))
  found = comm.hlo.collectives(run.hlo(worker_grads()))
  assert {c.kind for c in found} == {'all-gather'}
  assert sum(c.nbytes for c in found) == ag.nbytes


@pytest.mark.parametrize('format', ['int8', 'fp8', 'float32'])
def test_bytes_are_the_hlo_operands(format):
  # 42 elements, blocks of 4: 11 blocks, 2 a chunk on 8 workers; int8 rows of 4 + 4 bytes
  assert wire_bytes('int8', 4) == (8 * 2 * 8, 2 * 8)
  run = testing.Run(qar(format, 4), params(), workers=W, devices=8)
  a2a, ag = comm.find_transfers(run.state)
  assert (a2a.kind, a2a.nbytes) == ('all-to-all', wire_bytes(format, 4)[0])
  assert (ag.kind, ag.nbytes) == ('all-gather', wire_bytes(format, 4)[1])
  found = comm.hlo.collectives(run.hlo(worker_grads()))
  dtype = 'f32' if format == 'float32' else 'u8'
  for kind, t in (('all-to-all', a2a), ('all-gather', ag)):  # XLA may split an operand
    assert sum(c.nbytes for c in found if c.kind == kind) == t.nbytes, kind
  assert {c.kind for c in found} == {'all-to-all', 'all-gather'}
  assert {d for c in found for d in c.dtypes} == {dtype}


def test_the_network_model_prices_a_quarter_of_a_dense_all_reduce():
  n, B = 100_000, 256
  p = jnp.zeros(n)
  dense = comm.find_transfers(testing.Run(sync.allreduce(axis_name=AX), p, workers=W).state)
  quant = comm.find_transfers(testing.Run(qar('int8', B), p, workers=W).state)
  sent = lambda ts: sum(netmodel.sent_bytes(t, W) for t in ts)
  K = ceil(ceil(n, B), W)  # 391 blocks, 49 a chunk
  assert sent(quant) == pytest.approx(2 * (W - 1) * K * (B + 4))  # all-to-all + all-gather
  assert sent(dense) == pytest.approx(2 * (W - 1) / W * 4 * n)
  assert sent(quant) / sent(dense) == pytest.approx(0.2549, abs=1e-3)
  f32 = comm.find_transfers(testing.Run(qar('float32', B), p, workers=W).state)
  assert sent(f32) == pytest.approx(2 * (W - 1) * K * B * 4)  # = dense, up to the padding
  net = netmodel.gbps(10, 1e-5)
  times = [netmodel.transfer_time(t, W, net) for t in quant]
  assert times[0] == pytest.approx((W - 1) * 1e-5 + (W - 1) * K * (B + 4) * 8 / 10e9)


# --- as DiLoCo's averager --------------------------------------------------------------------


def diloco(averager):
  return optax.chain(optax.sgd(0.1), sync.diloco(period=2, axis_name=AX, averager=averager))


def grads_at(t):
  return worker_grads(seed=100 + t)


def test_diloco_with_a_float32_averager_is_diloco():
  plain = testing.Run(diloco(None), params(), workers=W, devices=2)
  averaged = testing.Run(diloco(qar('float32', 8)), params(), workers=W, devices=2)
  got, want = averaged.steps(4, grads_at), plain.steps(4, grads_at)
  for k in SHAPES:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
  assert averaged.history == [[0, 0], [1, 1]] * 2  # it communicates on the outer steps only


def test_diloco_with_an_int8_averager_is_close_to_diloco():
  plain = testing.Run(diloco(None), params(), workers=W)
  averaged = testing.Run(diloco(qar('int8', 8)), params(), workers=W)
  got, want = averaged.steps(4, grads_at), plain.steps(4, grads_at)
  for k in SHAPES:
    err = np.abs(np.asarray(got[k]) - np.asarray(want[k])).max()
    assert 0 < err <= 0.01 * np.abs(np.asarray(want[k])).max(), k


# --- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'kw, message',
  [
    (dict(format='int4'), r"format must be one of \('int8', 'fp8', 'float32'\), got 'int4'"),
    (dict(block_size=0), 'block_size must be an int >= 1, got 0'),
    (dict(collective='ring'), r"collective must be one of \('alltoall', 'allgather'\), got 'ring'"),
    (dict(block_size=2.5), 'block_size must be an int >= 1, got 2.5'),
    (dict(num_workers=0), 'num_workers must be an int >= 1, got 0'),
  ],
)
def test_bad_arguments_fail_at_construction(kw, message):
  with pytest.raises(ValueError, match=message):
    jd.sync.quantized_allreduce(**{'axis_name': AX, 'num_workers': 8, **kw})


def test_another_number_of_workers_fails_at_trace_time():
  run = testing.Run(qar('int8', 4, workers=8), jnp.zeros(8), workers=4)
  with pytest.raises(ValueError, match=r'holds 4 workers, but num_workers=8'):
    run(jnp.zeros((4, 8)))


# --- the trainer builds it by name -----------------------------------------------------------


def test_the_trainer_builds_it_as_a_method_and_as_diloco_s_averager():
  from jaxdist.train import config as config_lib
  from jaxdist.train import factory

  def chain(method, **section):
    config = config_lib.base()
    config.sync.method, config.steps = method, 10
    config.sync.quantized_allreduce.update(format='float32', block_size=8)
    config.sync.diloco.update(period=2, **section)
    return factory.build_chain(config, runtime.layout(W))[0]

  run = testing.Run(chain('quantized_allreduce'), params(), workers=W)
  want = testing.Run(chain('allreduce'), params(), workers=W)
  got, ref = run.steps(2, grads_at), want.steps(2, grads_at)
  for k in SHAPES:
    np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, atol=1e-6, err_msg=k)
  run = testing.Run(chain('diloco', averager='quantized_allreduce'), params(), workers=W)
  want = testing.Run(chain('diloco'), params(), workers=W)
  got, ref = run.steps(4, grads_at), want.steps(4, grads_at)
  for k in SHAPES:
    np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, atol=1e-6, err_msg=k)
  a2a, ag = comm.find_transfers(run.state)  # the averager's, not the dense all-reduce
  assert (a2a.kind, ag.kind) == ('all-to-all', 'all-gather')
  assert run.history == [[0, 0], [1, 1]] * 2
