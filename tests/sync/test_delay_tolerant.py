"""Delay-tolerant SGD, pipelined-backprop compensation, tick-tock, bucketing and its plans."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_less_sync import AX, W, assert_close, bsp, grads_at, make_run

import jaxdist as jd
from jaxdist import comm, netmodel, runtime, sync
from jaxdist.train import step as step_lib

SGDM = lambda: optax.sgd(0.1, momentum=0.9)
LOCAL = lambda: optax.sgd(0.05)


# --- delay 0 is the synchronous base ---------------------------------------------------------


@pytest.mark.parametrize(
  'make',
  [
    lambda: sync.od_sgd(SGDM(), LOCAL(), axis_name=AX, delay=0),
    lambda: sync.od_sgd(SGDM(), LOCAL(), axis_name=AX, warmup_steps=100),
    lambda: sync.ssd_sgd(SGDM(), LOCAL(), 1, axis_name=AX, warmup_steps=0),
    lambda: sync.cd_sgd(SGDM(), LOCAL(), 1, axis_name=AX, warmup_steps=0, delay=0),
    lambda: optax.chain(sync.allreduce(axis_name=AX), sync.gradient_delay(0), SGDM()),
    lambda: optax.chain(
      sync.allreduce(axis_name=AX), sync.spike_compensation(0, 0.9), optax.scale(-0.1)
    ),
    lambda: optax.chain(sync.allreduce(axis_name=AX), SGDM(), sync.linear_weight_prediction(0)),
    lambda: sync.tick_tock(SGDM(), axis_name=AX, waves=1),
  ],
  ids=[
    'od_delay0',
    'od_all_warmup',
    'ssd_k1',
    'cd_k1_delay0',
    'gradient_delay0',
    'spike0',
    'lwp0',
    'tick_tock_1wave',
  ],
)
def test_delay_zero_is_the_synchronous_base(make):
  want = make_run(bsp()).steps(5, grads_at)
  assert_close(make_run(make()).steps(5, grads_at), want)


# --- pipelined backprop -------------------------------------------------------------------


@pytest.mark.parametrize(
  'delay, expected',
  [
    # undelayed SGDM (m = 0.9) moves 1, 1.9, 2.71, 3.439, ... after an impulse g = 1 at step 0;
    # with the gradient arriving D steps late, SC jumps straight onto that path at step D.
    (1, [0.0, 1.9, 2.71, 3.439, 4.0951]),
    (2, [0.0, 0.0, 2.71, 3.439, 4.0951]),
    (3, [0.0, 0.0, 0.0, 3.439, 4.0951]),
  ],
)
def test_spike_compensation_impulse_response_matches_undelayed_momentum(delay, expected):
  m = 0.9
  tx = optax.chain(sync.gradient_delay(delay), sync.spike_compensation(delay, m))
  state = tx.init(jnp.zeros(()))
  moved, path = 0.0, []
  for t in range(200):
    u, state = tx.update(jnp.asarray(1.0 if t == 0 else 0.0), state)
    moved += float(u)
    path.append(moved)
  np.testing.assert_allclose(path[:5], expected, rtol=1e-6)
  np.testing.assert_allclose(path[-1], 1 / (1 - m), rtol=1e-6)  # the undelayed total η·1/(1−m)
  # without compensation, delayed momentum has the same total but arrives D steps behind
  plain = optax.chain(sync.gradient_delay(delay), optax.trace(decay=m))
  state, total = plain.init(jnp.zeros(())), 0.0
  for t in range(delay + 1):
    u, state = plain.update(jnp.asarray(1.0 if t == 0 else 0.0), state)
    total += float(u)
  assert total == pytest.approx(1.0)  # vs 1 + 0.9 + ... undelayed by step D


def test_linear_weight_prediction_hands_out_extrapolated_weights():
  tx = optax.chain(optax.sgd(0.1, momentum=0.9), sync.linear_weight_prediction(3))
  params = jnp.array([1.0, 2.0])
  state = tx.init(params)
  true = optax.sgd(0.1, momentum=0.9)
  true_state, true_params = true.init(params), params
  for t in range(4):
    g = jnp.array([0.5, -1.0]) * (t + 1)
    u, state = tx.update(g, state, params)
    params = optax.apply_updates(params, u)
    tu, true_state = true.update(g, true_state, true_params)
    true_params = optax.apply_updates(true_params, tu)
    np.testing.assert_allclose(state[1].weights, true_params, rtol=1e-6)  # trains the true weights
    np.testing.assert_allclose(params, true_params + 3 * tu, rtol=1e-6)  # forward: w + D·u


def test_gradient_delay_per_parameter():
  tx = sync.gradient_delay({'a': 0, 'b': 2})
  state = tx.init({'a': jnp.zeros(()), 'b': jnp.zeros(())})
  outs = []
  for t in range(4):
    u, state = tx.update({'a': jnp.asarray(t + 1.0), 'b': jnp.asarray(t + 1.0)}, state)
    outs.append((float(u['a']), float(u['b'])))
  assert outs == [(1, 0), (2, 0), (3, 1), (4, 2)]


def test_stage_delays_grow_towards_the_input():
  params = jd.models.get('cnn', 10).init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))['params']
  delays = sync.stage_delays(params)
  assert [delays[k]['kernel'] for k in ('Conv_0', 'Conv_1', 'Dense_0', 'Dense_1')] == [6, 4, 2, 0]


# --- OD / SSD / CD-SGD ----------------------------------------------------------------------


def test_od_sgd_steps_from_the_previous_global_model():
  """Plain SGD globally (lr 0.1) and locally (lr 0.05): after warm-up, a worker's model is
  w_global(t−1) − 0.05·g_own(t), while w_global(t) = w_global(t−1) − 0.1·mean g(t)."""
  run = make_run(sync.od_sgd(optax.sgd(0.1), optax.sgd(0.05), axis_name=AX, warmup_steps=1))
  run(grads_at(0))  # warm-up: synchronous
  w_prev = jax.tree.map(lambda x: np.asarray(x[0]), run.state.global_params)
  g = grads_at(1)
  out = run(g)
  for k in out:
    np.testing.assert_allclose(out[k], w_prev[k] - 0.05 * np.asarray(g[k]), rtol=1e-5, atol=1e-6)
    want_global = w_prev[k] - 0.1 * np.asarray(g[k]).mean(0)
    np.testing.assert_allclose(run.state.global_params[k][0], want_global, rtol=1e-5, atol=1e-6)
  assert run.history == [[1, 0], [0, 1]]  # warm-up waits for its exchange; then it overlaps


def test_ssd_sgd_takes_the_global_model_every_k_steps():
  run = make_run(sync.ssd_sgd(SGDM(), LOCAL(), 3, axis_name=AX, warmup_steps=0))
  for t in range(6):
    out = run(grads_at(t))
    taken = (t + 1) % 3 == 0
    agree = all(np.allclose(out[k], run.state.global_params[k]) for k in out)
    assert agree == taken, t


def test_ssd_sgd_waits_for_the_exchange_of_its_pull_steps():
  """A pull step's ((t+1) % k == 0) global model is the next forward's: its all-reduce blocks.

  history per step: [all-reduce waited for, all-reduce overlapped]; warm-up 2 steps, k = 3.
  """
  run = make_run(sync.ssd_sgd(SGDM(), LOCAL(), 3, axis_name=AX, warmup_steps=2))
  run.steps(2 + 2 * 3, grads_at)
  assert [t.overlap for t in comm.find_transfers(run.state)] == [False, True]
  warmup, after = run.history[:2], run.history[2:]
  assert warmup == [[1, 0], [1, 0]]
  assert after == [[1, 0], [0, 1], [0, 1], [1, 0], [0, 1], [0, 1]]  # counts 2 and 5 pull


def numpy_cd_sgd(grads_TxNxD, lr, tau, k, warmup_steps):
  """CD-SGD without delay, by hand: every step the global SGD step on the mean of what was sent,
  and every worker takes the new global model. Sent: the dense gradient in warm-up and every
  k-th step (the residual kept), else MXNet's 2-bit code of gradient + residual (±τ or 0) with
  error feedback."""
  steps, workers, dim = grads_TxNxD.shape
  w, residual_NxD, path = np.zeros(dim), np.zeros((workers, dim)), []
  for t in range(steps):
    g_NxD = grads_TxNxD[t]
    if t < warmup_steps or t % k == 0:
      sent_NxD = g_NxD
    else:
      wanted = g_NxD + residual_NxD
      sent_NxD = np.where(wanted >= tau, tau, np.where(wanted <= -tau, -tau, 0.0))
      residual_NxD = wanted - sent_NxD
    w = w - lr * sent_NxD.mean(0)
    path.append(w)
  return path


@pytest.mark.parametrize('workers, devices', [(3, 1), (4, 4)])
def test_cd_sgd_without_delay_still_quantises_like_a_hand_simulation(workers, devices):
  """delay=0, k=3, warm-up 2: dense at counts 0, 1 (warm-up), 3, 6; 2-bit at 2, 4, 5."""
  lr, tau, k, warmup, steps = 0.5, 0.5, 3, 2, 7
  grads = np.random.default_rng(5).normal(0, 0.6, (steps, workers, 5)).astype(np.float32)
  want = numpy_cd_sgd(grads.astype(np.float64), lr, tau, k, warmup)
  tx = sync.cd_sgd(
    optax.sgd(lr), LOCAL(), k, axis_name=AX, threshold=tau, warmup_steps=warmup, delay=0
  )
  run = make_run(tx, devices=devices, params={'x': jnp.zeros(5)}, workers=workers)
  transfers = comm.find_transfers(run.state)
  for t in range(steps):
    got = run({'x': jnp.asarray(grads[t])})['x']
    np.testing.assert_allclose(got, np.broadcast_to(want[t], got.shape), atol=1e-6, err_msg=t)
    ran = {(transfers[i].kind, transfers[i].overlap) for i, c in enumerate(run.history[-1]) if c}
    dense = t < warmup or t % k == 0
    assert ran == {('all-reduce' if dense else 'all-gather', False)}, t  # no delay: waited for


def test_cd_sgd_sends_2bit_codes_and_a_dense_correction_every_k():
  run = make_run(sync.cd_sgd(SGDM(), LOCAL(), 3, axis_name=AX, warmup_steps=1, threshold=0.5))
  run.steps(7, grads_at)
  transfers = comm.find_transfers(run.state)
  kinds = [t.kind for t in transfers]
  assert kinds.count('all-gather') == 1 and kinds.count('all-reduce') == 2
  gather = transfers[kinds.index('all-gather')]
  params_bytes = 4 * (24 + 4)
  assert gather.nbytes == -(-(24 + 4) * 2 // 8)  # 2 bits per element
  assert gather.overlap
  by_step = [[kinds[i] for i, c in enumerate(h) if c] for h in run.history]
  # warm-up dense; then dense at counts 3, 6 (steps 4, 7), 2-bit otherwise
  assert by_step == [
    ['all-reduce'],
    ['all-gather'],
    ['all-gather'],
    ['all-reduce'],
    ['all-gather'],
    ['all-gather'],
    ['all-reduce'],
  ]
  text = run.hlo(grads_at(0))
  found = comm.hlo.collectives(text)
  branches = comm.hlo.conditional_branches(text)
  assert {d for c in found for d in c.dtypes} == {'u8', 'f32'}
  assert all(c.computation in branches for c in found)  # one or the other runs
  assert {c.nbytes for c in found if c.kind == 'all-reduce'} == {params_bytes}


# --- tick-tock ---------------------------------------------------------------------------------


def test_tick_tock_alternates_stale_updates_by_hand():
  """Two workers = two waves, plain SGD lr 1, constant gradients 1 (tick) and 10 (tock).

  Step 1 (both waves computed at w0 = 0): w1 = 0 − 1 = −1 (tick), w2 = −1 − 10 = −11 (tock);
  the tick worker's next forward is at w1, the tock worker's at w2. Step 2: w3 = −12, w4 = −22.
  """
  run = make_run(
    sync.tick_tock(optax.sgd(1.0), axis_name=AX), devices=1, params={'x': jnp.zeros(())}, workers=2
  )
  g = {'x': jnp.array([1.0, 10.0])}
  np.testing.assert_allclose(run(g)['x'], [-1.0, -11.0])
  np.testing.assert_allclose(run(g)['x'], [-12.0, -22.0])
  np.testing.assert_allclose(run.state.weights['x'], [-22.0, -22.0])


@pytest.mark.parametrize('tx_name', ['bsp', 'tick_tock'])
def test_staggered_system_form_changes_no_numbers(digits, tx_name):
  workers = runtime.layout(8, devices=4)  # a tick and a tock worker on each device
  model = jd.models.get('cnn', num_classes=10)

  def train(staggered):
    if tx_name == 'bsp':
      tx = optax.chain(sync.allreduce(axis_name=workers.axis_name), optax.sgd(0.1))
    else:
      tx = sync.tick_tock(optax.sgd(0.1), axis_name=workers.axis_name)
    state = step_lib.make_init(model, tx, workers, digits.image_shape)(jax.random.key(0))
    # together: both waves' activations at once (vmap; on the CPU 'auto' would loop)
    per_worker = 'auto' if staggered else 'vmap'
    step = step_lib.make_train_step(model, tx, workers, staggered=staggered, per_worker=per_worker)
    for t in range(3):
      idx = jd.data.worker_indices(
        t, seed=0, num_examples=len(digits.train), workers=8, per_worker=8
      )
      x = jax.device_put(digits.normalize(digits.train.images[idx]), workers.sharding)
      y = jax.device_put(digits.train.labels[idx], workers.sharding)
      state, _ = step(state, x, y)
    big = jnp.zeros((8, 256, *digits.image_shape)), jnp.zeros((8, 256), jnp.int32)
    big = [jax.device_put(a, workers.sharding) for a in big]
    memory = step.lower(state, *big).compile().memory_analysis().temp_size_in_bytes
    return state.params, memory

  together, mem_together = train(False)
  staggered, mem_staggered = train(True)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), staggered, together
  )
  # at 256 examples per wave, one wave's activations alive at a time: well under the two
  assert mem_staggered < 0.75 * mem_together


# --- bucketing -----------------------------------------------------------------------------


def test_bucketed_allreduce_changes_no_numbers_only_the_collectives():
  shapes = {'a': (6, 4), 'b': (4,), 'c': (4, 3), 'd': (3,)}
  params = {
    k: jnp.asarray(np.random.default_rng(0).standard_normal(s).astype(np.float32))
    for k, s in shapes.items()
  }
  buckets = [[3, 2], [1], [0]]  # leaves in tree order: a, b, c, d
  want = make_run(bsp(), params=params)
  got = make_run(optax.chain(sync.bucketed_allreduce(buckets, axis_name=AX), SGDM()), params=params)
  g = jax.tree.map(
    lambda p: jnp.asarray(
      np.random.default_rng(1).standard_normal((W, *p.shape)).astype(np.float32)
    ),
    params,
  )
  for _ in range(3):
    want(g)
    got(g)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), got.params, want.params)
  lowered = lambda run: comm.hlo.collectives(run.hlo(g, compiled=False))
  # unbucketed on the CPU, the tree's psum goes packed: one all-reduce of the whole tree (not
  # one per tensor, which jax lowers unpacked); bucketed, one per bucket
  assert sorted(c.nbytes for c in lowered(want)) == [4 * (24 + 4 + 12 + 3)]
  assert sorted(c.nbytes for c in lowered(got)) == sorted([4 * (3 + 12), 4 * 4, 4 * 24])


def test_bucketed_compression_compresses_each_bucket():
  params = {'a': jnp.zeros((40, 10)), 'b': jnp.zeros((10,))}
  averager = sync.compressed_allreduce(jd.compress.topk(ratio=0.1), axis_name=AX)
  tx = sync.bucketed_allreduce([[1], [0]], axis_name=AX, averager=averager)
  run = make_run(tx, params=params)
  g = jax.tree.map(
    lambda p: jnp.asarray(
      np.random.default_rng(2).standard_normal((W, *p.shape)).astype(np.float32)
    ),
    params,
  )
  run(g)
  sizes = sorted(t.nbytes for t in comm.find_transfers(run.state))
  assert sizes == [8 * 1, 8 * 40]  # k = 10% of each bucket: values + int32 indices


def test_threshold_buckets_fill_in_backward_order():
  assert netmodel.threshold_buckets([10, 20, 30, 40], 45) == [[3, 2], [1, 0]]
  assert netmodel.threshold_buckets([10, 20, 30, 40], 1000) == [[3, 2, 1, 0]]
  assert netmodel.threshold_buckets([10, 20, 30, 40], 1) == [[3], [2], [1], [0]]


def test_mgwfbp_merges_what_cannot_start_earlier_and_timeline_by_hand():
  """Backward times 1 s per layer, from layer 3 down; α = 0.5 s, β = 0.01 s/B, sizes 10 B.

  Layer 3 is ready at 1 s and its all-reduce (0.6 s) ends at 1.6 s, before layer 2 (2 s):
  so each layer goes alone, and per-layer WFBP ends at 4 + 0.6 = 4.6 s. With α = 2 s, a
  layer's all-reduce (2.1 s) is still running when the next layer is ready, which waits
  less than α: MG-WFBP merges.
  """
  sizes, times = [10, 10, 10, 10], [1.0, 1.0, 1.0, 1.0]
  assert netmodel.mgwfbp_buckets(sizes, times, 0.5, 0.01) == [[3], [2], [1], [0]]
  per_layer = netmodel.per_layer_buckets(range(4))
  assert netmodel.timeline(per_layer, sizes, times, 0.5, 0.01) == pytest.approx(4.6)
  assert netmodel.timeline(per_layer, sizes, times, 0.5, 0.01, overlap=False) == pytest.approx(
    4 + 4 * 0.6
  )
  merged = netmodel.mgwfbp_buckets(sizes, times, 2.0, 0.01)
  assert len(merged) < 4
  assert netmodel.timeline(merged, sizes, times, 2.0, 0.01) < netmodel.timeline(
    per_layer, sizes, times, 2.0, 0.01
  )


def test_forward_order_and_flops_of_the_cnn():
  model = jd.models.get('cnn', 10)
  params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))['params']
  fn = lambda p, x: model.apply({'params': p}, x)
  x = jnp.zeros((4, 8, 8, 1))
  paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  order = [paths[i] for i in netmodel.forward_order(fn, params, x)]
  assert order[0] == "['Conv_0']['kernel']" and order[-1] == "['Dense_1']['bias']"
  flops = dict(zip(paths, netmodel.layer_flops(fn, params, x), strict=True))
  # conv 3x3, 1 -> 32 channels, 8x8 output, batch 4: 2 * (4*8*8*32) * (3*3*1)
  assert flops["['Conv_0']['kernel']"] == 2 * (4 * 8 * 8 * 32) * 9
  assert flops["['Dense_1']['kernel']"] == 2 * (4 * 10) * 128


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: sync.od_sgd(SGDM(), axis_name=AX, delay=-1), 'delay must be >= 0, got -1'),
    (lambda: sync.od_sgd(SGDM(), axis_name=AX, delay=2), 'delay must be 0 or 1'),
    (lambda: sync.od_sgd(SGDM(), axis_name=AX, warmup_steps=-5), 'warmup_steps must be >= 0'),
    (lambda: sync.ssd_sgd(SGDM(), None, 0, axis_name=AX), 'k must be >= 1, got 0'),
    (lambda: sync.cd_sgd(SGDM(), None, 0, axis_name=AX), 'k must be >= 1, got 0'),
    (lambda: sync.cd_sgd(SGDM(), None, 3, axis_name=AX, threshold=0.0), 'threshold must be > 0'),
    (lambda: sync.spike_compensation(-1, 0.9), 'delay must be >= 0, got -1'),
    (lambda: sync.spike_compensation(2, 1.0), r'momentum must be in \[0, 1\)'),
    (lambda: sync.linear_weight_prediction(-2), 'delay must be >= 0, got -2'),
    (lambda: sync.gradient_delay({'a': 1, 'b': -3}), 'delay must be >= 0, got -3'),
    (lambda: sync.gradient_delay('layers'), "delay must be an int, a pytree of ints or 'stages'"),
    (lambda: sync.tick_tock(SGDM(), axis_name=AX, waves=0), 'waves must be >= 1'),
    (lambda: netmodel.threshold_buckets([1, 2], 0), 'bucket_bytes must be > 0, got 0'),
    (lambda: netmodel.threshold_buckets([1, 2], -8), 'bucket_bytes must be > 0, got -8'),
    (lambda: sync.bucketed_allreduce([[0], [0, 1]], axis_name=AX), 'exactly once each'),
    (lambda: sync.bucketed_allreduce([], axis_name=AX), 'non-empty'),
  ],
)
def test_bad_arguments_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_counts_of_each_kind_match_the_lowered_hlo():
  run = make_run(sync.od_sgd(SGDM(), LOCAL(), axis_name=AX, warmup_steps=0))
  found = comm.hlo.collectives(run.hlo(grads_at(0), compiled=False))
  run(grads_at(0))
  reported, lowered = collections.Counter(), collections.Counter()
  for t in comm.find_transfers(run.state):
    if int(t.count[0]):
      reported[t.kind] += t.nbytes
  for c in found:
    lowered[c.kind] += c.nbytes
  assert reported == lowered


@pytest.mark.parametrize('flush', [False, True])
def test_cd_sgd_dense_correction_keeps_or_flushes_the_residual(flush):
  tx = sync.cd_sgd(
    SGDM(), LOCAL(), 2, axis_name=AX, warmup_steps=0, threshold=0.5, flush_residual=flush
  )
  run = make_run(tx)
  run(grads_at(0))  # count 0: dense
  run(grads_at(1))  # count 1: 2-bit, leaves a residual
  (held,) = run.state.exchange[0].residual
  assert float(jnp.abs(held).max()) > 0
  run(grads_at(2))  # count 2: dense correction
  (after,) = run.state.exchange[0].residual
  if flush:
    np.testing.assert_array_equal(after, 0)
  else:
    np.testing.assert_array_equal(after, held)  # untouched by the correction
