"""Local SGD, DiLoCo, SelSync, stale/async, gossip and SMA against references."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist import comm, runtime, sync, testing
from jaxdist import compress as C

W = 8
SHAPES = {'w': (6, 4), 'b': (4,)}
AX = runtime.AXES


def start():
  rng = np.random.default_rng(123)
  return {k: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()}


def grads_at(step, same=False):
  rng = np.random.default_rng(1000 + step)
  return {
    k: jnp.asarray(
      np.broadcast_to(rng.standard_normal((1 if same else W, *s)), (W, *s)).astype(np.float32)
    )
    for k, s in SHAPES.items()
  }


def make_run(tx, devices=8, params=None, workers=W):
  """`testing.Run` from `start()` on 8 devices (one worker each) unless told otherwise."""
  return testing.Run(tx, start() if params is None else params, workers=workers, devices=devices)


def assert_close(a, b, atol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=1e-5), a, b)


def bsp(lr=0.1, momentum=0.9):
  return optax.chain(sync.allreduce(axis_name=AX), optax.sgd(lr, momentum=momentum))


LAYOUTS = pytest.mark.parametrize('devices', [8, 2], ids=['8-devices', '2x4-simulated'])


# --- degenerate equivalences ------------------------------------------------------------


@LAYOUTS
def test_local_sgd_period_1_is_bsp(devices):
  want = make_run(bsp(), devices).steps(5, grads_at)
  got = make_run(
    optax.chain(optax.sgd(0.1, momentum=0.9), sync.local_sgd(1, axis_name=AX)), devices
  ).steps(5, grads_at)
  assert_close(got, want)


def test_post_local_sgd_is_bsp_during_warmup_then_local():
  tx = optax.chain(optax.sgd(0.1), sync.local_sgd(4, axis_name=AX, warmup_steps=3))
  run = make_run(tx)
  want = make_run(bsp(momentum=0.0)).steps(3, grads_at)
  assert_close(run.steps(3, grads_at), want)
  run.steps(7, grads_at)
  # warm-up (steps 0-2), then 4 local steps to each average: 3-6, 7-10
  assert [h[0] for h in run.history] == [1, 1, 1, 0, 0, 0, 1, 0, 0, 0]


@pytest.mark.parametrize(
  'period, warmup, averaged',
  [
    (4, 0, [3, 7, 11]),  # Stich: (t + 1) mod H = 0
    (4, 2, [0, 1, 5, 9, 13]),
    (3, 5, [0, 1, 2, 3, 4, 7, 10, 13]),
    (1, 2, list(range(14))),
    # PyTorch: DDP's gradient all-reduce at steps 0, 1 (start_localSGD_iter=2), then
    # PeriodicModelAverager(4, warmup_steps=2) after steps 2, 6, 10: step 2 averages after one
    # local step, a third warm-up step
    (4, 3, [0, 1, 2, 6, 10]),
  ],
)
def test_post_local_sgd_counts_its_periods_from_the_end_of_the_warmup(period, warmup, averaged):
  tx = optax.chain(optax.sgd(0.1), sync.local_sgd(period, axis_name=AX, warmup_steps=warmup))
  run = make_run(tx, devices=1)
  run.steps(14, grads_at)
  assert [t for t, (ran,) in enumerate(run.history) if ran] == averaged
  assert int(run.state[1].synced[0]) == len(averaged)


@LAYOUTS
def test_diloco_outer_sgd_lr1_period1_is_bsp(devices):
  want = make_run(bsp(momentum=0.0), devices).steps(5, grads_at)
  tx = optax.chain(optax.sgd(0.1), sync.diloco(optax.sgd(1.0), 1, axis_name=AX))
  assert_close(make_run(tx, devices).steps(5, grads_at), want)


@LAYOUTS
def test_selsync_threshold_0_averages_every_step(devices):
  want = make_run(
    optax.chain(optax.sgd(0.1, momentum=0.9), sync.local_sgd(1, axis_name=AX)), devices
  ).steps(5, grads_at)
  run = make_run(sync.selsync(optax.sgd(0.1, momentum=0.9), 0.0, axis_name=AX, window=1), devices)
  assert_close(run.steps(5, grads_at), want)
  assert int(run.state.synced[0]) == 5


@pytest.mark.parametrize(
  'make',
  [
    lambda: sync.stale_sync(0, axis_name=AX, delays='fixed'),
    lambda: sync.ssp(0, axis_name=AX),
    lambda: sync.async_sgd(0, axis_name=AX),
  ],
  ids=['fixed', 'ssp', 'async'],
)
def test_delay_0_is_synchronous(make):
  want = make_run(bsp()).steps(5, grads_at)
  assert_close(make_run(optax.chain(make(), optax.sgd(0.1, momentum=0.9))).steps(5, grads_at), want)


@LAYOUTS
@pytest.mark.parametrize('delay', [1, 3])
def test_fixed_staleness_is_allreduce_then_gradient_delay_bitwise(devices, delay):
  """What `sync.delayed(D)` was: `stale_sync(D, delays='fixed')`; it is exactly the chain."""
  want = make_run(
    optax.chain(sync.allreduce(axis_name=AX), sync.gradient_delay(delay), optax.sgd(0.1)), devices
  ).steps(6, grads_at)
  got = make_run(
    optax.chain(sync.stale_sync(delay, axis_name=AX, delays='fixed'), optax.sgd(0.1)), devices
  ).steps(6, grads_at)
  jax.tree.map(np.testing.assert_array_equal, got, want)


@LAYOUTS
def test_gossip_on_the_complete_graph_is_exact_averaging(devices):
  want = make_run(optax.chain(optax.sgd(0.1), sync.local_sgd(1, axis_name=AX)), devices).steps(
    4, grads_at
  )
  tx = optax.chain(optax.sgd(0.1), sync.gossip('complete', axis_name=AX, num_workers=W))
  assert_close(make_run(tx, devices).steps(4, grads_at), want)


def test_sma_with_zero_correction_leaves_learners_independent():
  run = make_run(optax.chain(optax.sgd(0.1), sync.sma(0.0, axis_name=AX)))
  got = run.steps(4, grads_at)
  p0 = start()
  total = jax.tree.map(lambda *gs: sum(gs), *[grads_at(t) for t in range(4)])  # [W, ...]
  want = jax.tree.map(lambda p, g: p - 0.1 * g, p0, total)  # each learner on its own
  assert_close(got, want)
  np.testing.assert_allclose(run.state[1].center['w'][0], p0['w'])  # z never moves


# --- references beyond the degenerate cases --------------------------------------------


def test_diloco_golden_trajectory_two_workers_constant_gradients():
  """Hand-computed: θ0 = 1, constant gradients 1 and 3, inner SGD lr 0.1, H = 2,
  outer SGD lr 0.5 with (heavy-ball) momentum 0.9.

  Inner steps move worker 1 by -0.1 and worker 2 by -0.3 per step, so every
  outer step sees the pseudo-gradient Δ = 0.4; the momentum trace goes 0.4,
  0.76, 1.084; the anchor 1 -> 0.8 -> 0.42 -> -0.122.
  """
  tx = optax.chain(optax.sgd(0.1), sync.diloco(optax.sgd(0.5, momentum=0.9), 2, axis_name=AX))
  run = make_run(tx, devices=2, params={'x': jnp.ones(())}, workers=2)
  g = {'x': jnp.array([1.0, 3.0])}
  want = [(0.9, 0.7), (0.8, 0.8), (0.7, 0.5), (0.42, 0.42), (0.32, 0.12), (-0.122, -0.122)]
  for step, expected in enumerate(want):
    got = run(g)['x']
    np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=f'step {step + 1}')
  assert [h[0] for h in run.history] == [0, 1, 0, 1, 0, 1]  # outer steps communicate, inner don't
  np.testing.assert_allclose(run.state[1].anchor['x'], [-0.122, -0.122], atol=1e-6)


@pytest.mark.parametrize(
  'topology, n, devices',
  [
    ('ring', 8, 8),
    ('ring', 8, 2),
    ('exponential', 8, 2),
    ('exponential', 6, 3),  # 3 offsets (1, 2, 4): weight 1/(⌈log2 6⌉ + 1) = 1/4
    ('torus', 9, 3),
    ('ring', 2, 2),
  ],
)
def test_gossip_mixes_with_the_doubly_stochastic_matrix(topology, n, devices):
  matrix = sync.mixing_matrix(topology, n)
  np.testing.assert_allclose(matrix.sum(0), 1)
  np.testing.assert_allclose(matrix.sum(1), 1)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((n, 5)).astype(np.float32))
  tx = sync.gossip(topology, axis_name=AX, num_workers=n)
  run = make_run(tx, devices=devices, params={'x': jnp.zeros(5)}, workers=n)
  run.params = {'x': x}
  got = run({'x': jnp.zeros((n, 5))})['x']  # zero local step: pure mixing
  np.testing.assert_allclose(got, matrix @ np.asarray(x), atol=1e-6)
  kinds = {t.kind for t in comm.find_transfers(run.state)}
  assert kinds == {'collective-permute'}  # neighbours only


@pytest.mark.parametrize('n, devices', [(8, 8), (8, 2), (6, 3), (2, 2)])
def test_one_peer_exponential_gossip_mixes_with_w_t_one_permute_a_step(n, devices):
  """Step t mixes with the one peer i − 2^(t mod ⌈log2 N⌉), weights 1/2: x(t+1) = W_t x(t)."""
  x = jnp.asarray(np.random.default_rng(3).standard_normal((n, 5)).astype(np.float32))
  tx = sync.gossip('one_peer_exponential', axis_name=AX, num_workers=n)
  run = make_run(tx, devices=devices, params={'x': jnp.zeros(5)}, workers=n)
  run.params = {'x': x}
  period = (n - 1).bit_length()  # ⌈log2 N⌉ offsets: 1, 2, 4, ...
  for t in range(period + 2):
    matrix = sync.mixing_matrix('one_peer_exponential', n, step=t)
    np.testing.assert_allclose(matrix.sum(0), 1)
    np.testing.assert_allclose(matrix.sum(1), 1)
    offset = 2 ** (t % period)
    from_peer = np.roll(np.eye(n), -offset, axis=1)  # row i picks worker i - offset
    np.testing.assert_array_equal(matrix, (np.eye(n) + from_peer) / 2)
    before = np.asarray(run.params['x'])
    got = run({'x': jnp.zeros((n, 5))})['x']  # zero local step: pure mixing
    np.testing.assert_allclose(got, matrix @ before, atol=1e-6, err_msg=f'step {t}')
  (sent,) = comm.find_transfers(run.state)
  assert (sent.kind, sent.nbytes) == ('collective-permute', 4 * 5)
  assert run.history == [[1]] * (period + 2)  # one permute of the model per step


@pytest.mark.parametrize('n', [2, 4, 8, 16, 6, 12])
def test_one_peer_exponential_averages_exactly_over_log2_n_steps_for_powers_of_two(n):
  """Ying et al. 2021: a period of log2 N one-peer exponential graphs multiplies to 11ᵀ/N."""
  period = (n - 1).bit_length()
  product = np.eye(n)
  for t in range(period):
    product = sync.mixing_matrix('one_peer_exponential', n, step=t) @ product
  exact = np.allclose(product, np.full((n, n), 1 / n))
  assert exact == (n & (n - 1) == 0)  # and not otherwise (6, 12)


def test_one_peer_exponential_runs_one_permute_in_a_switch_branch():
  tx = sync.gossip('one_peer_exponential', axis_name=AX, num_workers=W)
  run = make_run(tx, params={'x': jnp.zeros(5)})
  text = run.hlo({'x': jnp.zeros((W, 5))})
  found = comm.hlo.collectives(text)
  branches = comm.hlo.conditional_branches(text)
  assert [c.kind for c in found] == ['collective-permute'] * 3  # offsets 1, 2 and 4
  assert all(c.nbytes == 4 * 5 and c.computation in branches for c in found)
  assert len({c.computation for c in found}) == 3  # one per branch: only one of them runs


def test_gossip_mixing_shrinks_disagreement_but_keeps_the_mean():
  run = make_run(sync.gossip('ring', axis_name=AX, num_workers=W), params={'x': jnp.zeros(3)})
  run.params = {
    'x': jnp.asarray(np.random.default_rng(1).standard_normal((W, 3)).astype(np.float32))
  }
  mean, spread = np.asarray(run.params['x']).mean(0), np.ptp(np.asarray(run.params['x']), axis=0)
  for _ in range(20):
    run({'x': jnp.zeros((W, 3))})
  np.testing.assert_allclose(np.asarray(run.params['x']).mean(0), mean, atol=1e-5)
  assert np.all(np.ptp(np.asarray(run.params['x']), axis=0) < 0.2 * spread)


def test_ssp_respects_the_staleness_bound_and_reads_its_own_writes():
  """With all gradients 1 and lr 1/N... every worker has applied its own T gradients
  and between T - s and T of each other worker's (Ho et al.'s SSP guarantee)."""
  s, steps = 2, 7
  run = make_run(
    optax.chain(sync.ssp(s, axis_name=AX, seed=3), optax.sgd(1.0)), params={'x': jnp.zeros(())}
  )
  for _ in range(steps):
    run({'x': jnp.ones(W)})
  applied = -np.asarray(run.params['x']) * W  # gradients applied, own and others'
  others = applied - steps
  assert np.all(others >= (W - 1) * (steps - s) - 1e-4) and np.all(others <= (W - 1) * steps + 1e-4)
  assert len(set(np.round(applied, 4))) > 1  # delays differ, so workers' models differ


def test_async_applies_the_same_arrivals_everywhere_within_the_bound():
  steps, bound = 9, 4
  run = make_run(
    optax.chain(sync.async_sgd(bound, axis_name=AX, seed=1), optax.sgd(1.0)),
    params={'x': jnp.zeros(())},
  )
  for _ in range(steps):
    run({'x': jnp.ones(W)})
  applied = -np.asarray(run.params['x']) * W
  assert np.ptp(applied) < 1e-5  # one shared model
  assert W * (steps - bound) - 1e-4 <= applied[0] <= W * steps + 1e-4


# --- communication: skipped steps do not communicate ----------------------------------------


@LAYOUTS
def test_local_sgd_all_reduce_sits_in_a_conditional_branch(devices):
  run = make_run(optax.chain(optax.sgd(0.1), sync.local_sgd(4, axis_name=AX)), devices)
  text = run.hlo(grads_at(0))
  found = comm.hlo.collectives(text)
  branches = comm.hlo.conditional_branches(text)
  assert found and all(c.kind == 'all-reduce' for c in found)
  assert all(c.computation in branches for c in found), (found, branches)
  run.steps(8, grads_at)
  assert [h[0] for h in run.history] == [0, 0, 0, 1, 0, 0, 0, 1]
  assert comm.find_transfers(run.state)[0].nbytes == 4 * (24 + 4)


def test_selsync_sends_flags_every_step_and_the_model_only_when_flagged():
  tx = sync.selsync(optax.sgd(0.05), 0.5, axis_name=AX, window=2)
  run = make_run(tx)
  run.steps(6, lambda t: grads_at(t, same=True))  # identical, slowly varying gradients: few syncs
  flags, model = zip(*run.history, strict=True)
  assert all(f == 1 for f in flags)
  assert model[:2] == (1, 1) and sum(model) == int(run.state.synced[0])
  text = run.hlo(grads_at(0))
  branches = comm.hlo.conditional_branches(text)
  big = [c for c in comm.hlo.collectives(text) if c.nbytes > 4]
  assert big and all(c.computation in branches for c in big)


def test_diloco_composes_with_a_compressed_pseudo_gradient():
  dense = make_run(optax.chain(optax.sgd(0.1), sync.diloco(period=2, axis_name=AX)))
  packed = make_run(
    optax.chain(
      optax.sgd(0.1),
      sync.diloco(
        period=2,
        axis_name=AX,
        averager=sync.compressed_allreduce(
          C.topk(ratio=0.25), axis_name=AX, collective='allgather'
        ),
      ),
    )
  )
  dense.steps(4, grads_at)
  packed.steps(4, grads_at)
  dense_bytes = comm.find_transfers(dense.state)[0].nbytes
  sent = [t for t in comm.find_transfers(packed.state) if t.kind == 'all-gather']
  assert sent and sent[0].nbytes < dense_bytes / 1.5
  assert [h[0] for h in packed.history] == [0, 1, 0, 1]
  # every worker restarts from the same anchor after an outer step
  assert np.ptp(np.asarray(packed.params['w']), axis=0).max() < 1e-6


def test_local_sgd_with_compressed_sync_conserves_what_it_does_not_send():
  averager = sync.compressed_allreduce(C.topk(ratio=0.2), axis_name=AX)
  tx = optax.chain(optax.sgd(0.1), sync.local_sgd(2, axis_name=AX, averager=averager))
  run = make_run(tx)
  run.steps(2, grads_at)
  residual = run.state[1].averager.residual[0]
  assert float(jnp.abs(residual).max()) > 0  # the unsent part waits for the next sync


@pytest.mark.parametrize('method', ['local_sgd', 'diloco', 'selsync'])
def test_a_dense_averager_of_the_changes_equals_averaging_the_models(method):
  """averager=allreduce averages each worker's change since the last sync and adds it to the
  anchor: the same models as averaging them directly (up to rounding); its all-reduce runs
  only on synchronising steps."""

  def make(averager):
    if method == 'local_sgd':
      return optax.chain(optax.sgd(0.1), sync.local_sgd(3, axis_name=AX, averager=averager))
    if method == 'diloco':
      return optax.chain(optax.sgd(0.1), sync.diloco(period=3, axis_name=AX, averager=averager))
    return sync.selsync(optax.sgd(0.1), 0.5, axis_name=AX, window=2, averager=averager)

  dense, averaged = make_run(make(None), devices=2), make_run(make(sync.allreduce(axis_name=AX)))
  assert_close(averaged.steps(7, grads_at), dense.steps(7, grads_at))
  # the same steps synchronised (selsync's flag all-reduce is in the history too, in another place)
  assert [sorted(h) for h in averaged.history] == [sorted(h) for h in dense.history]
  assert 0 in [min(h) for h in dense.history]  # some steps stayed local


def test_bucketed_allreduce_with_a_dense_averager_per_bucket_is_the_dense_mean():
  buckets = [[1], [0]]
  dense = make_run(optax.chain(sync.bucketed_allreduce(buckets, axis_name=AX), optax.sgd(0.1)))
  tx = sync.bucketed_allreduce(buckets, axis_name=AX, averager=sync.allreduce(axis_name=AX))
  averaged = make_run(optax.chain(tx, optax.sgd(0.1)))
  assert_close(averaged.steps(3, grads_at), dense.steps(3, grads_at))
  assert sorted(t.nbytes for t in comm.find_transfers(averaged.state)) == [4 * 4, 4 * 24]


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: sync.local_sgd(0, axis_name=AX), 'period must be >= 1, got 0'),
    (lambda: sync.local_sgd(4, axis_name=AX, warmup_steps=-1), 'warmup_steps must be >= 0'),
    (lambda: sync.diloco(period=0, axis_name=AX), 'period must be >= 1, got 0'),
    (lambda: sync.selsync(optax.sgd(0.1), -0.1, axis_name=AX), 'threshold must be >= 0, got -0.1'),
    (
      lambda: sync.selsync(optax.sgd(0.1), 0.3, axis_name=AX, norm='l3'),
      "norm must be 'layer_sum' or 'global'",
    ),
    (lambda: sync.ssp(-1, axis_name=AX), 'max_delay \\(staleness\\) must be >= 0, got -1'),
    (lambda: sync.async_sgd(-2, axis_name=AX), 'staleness\\) must be >= 0'),
    (lambda: sync.stale_sync(2, axis_name=AX, delays='poisson'), 'delays must be one of'),
    (
      lambda: sync.gossip('torus', axis_name=AX, num_workers=8),
      'a torus needs rows dividing|has repeated neighbours',
    ),
    (
      lambda: sync.gossip('torus', axis_name=AX, num_workers=12, rows=5),
      'a torus needs rows dividing the 12 workers',
    ),
    (lambda: sync.gossip('ring', axis_name=AX, num_workers=1), 'needs at least 2 workers'),
    (lambda: sync.gossip('hypercube', axis_name=AX, num_workers=8), 'topology must be one of'),
    (lambda: sync.sma(-0.5, axis_name=AX), 'alpha must be >= 0'),
    (
      lambda: sync.local_sgd(2, axis_name=AX, averager=C.topk(ratio=0.1)),
      'averager must be None or an optax.GradientTransformation',
    ),
    (
      lambda: sync.bucketed_allreduce([[0]], axis_name=AX, averager='topk'),
      'averager must be None or an optax.GradientTransformation',
    ),
  ],
)
def test_bad_arguments_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_gossip_built_for_another_worker_count_fails_clearly():
  run_tx = sync.gossip('ring', axis_name=AX, num_workers=4)
  with pytest.raises(ValueError, match=r'gossip was built for 4 workers, but .* has 8'):
    make_run(run_tx).steps(1, grads_at)


def test_param_transforms_need_params():
  tx = sync.local_sgd(2, axis_name=AX)
  state = tx.init(start())
  with pytest.raises(ValueError, match='local_sgd needs params'):
    jax.eval_shape(lambda s: tx.update(start(), s), state)


# --- replicas: the workers that synchronised hold one model, bitwise --------------------------

N = 4096  # elements: enough that w + (m - w) != m in hundreds of them


def spread_start():
  """N elements of magnitudes 1e-3 to 10, both signs."""
  rng = np.random.default_rng(7)
  return {'w': jnp.asarray(rng.standard_normal(N) * 10.0 ** rng.uniform(-3, 1, N), jnp.float32)}


def spread_grads(t):
  """Worker n's gradient at step t: its own draw, scaled by 4 at steps 2, 3, 6, 7 (SelSync's
  relative norm change flags steps 2, 4, 6, and not 1, 3, 5, 7)."""
  rng = np.random.default_rng(100 + t)
  scale = 10.0 ** np.random.default_rng(8).uniform(-3, 1, N)  # the same every step
  g = rng.standard_normal((W, N)) * scale * (4.0 if t % 4 in (2, 3) else 1.0)
  return {'w': jnp.asarray(g, jnp.float32)}


def topk_averager():
  return sync.compressed_allreduce(C.topk(ratio=0.1), axis_name=AX, collective='allgather')


MODEL_SYNCS = {
  'local_sgd': lambda: optax.chain(optax.sgd(0.1), sync.local_sgd(2, axis_name=AX)),
  'local_sgd_allreduce': lambda: optax.chain(
    optax.sgd(0.1), sync.local_sgd(2, axis_name=AX, averager=sync.allreduce(axis_name=AX))
  ),
  'local_sgd_topk': lambda: optax.chain(
    optax.sgd(0.1), sync.local_sgd(2, axis_name=AX, averager=topk_averager())
  ),
  'post_local_sgd': lambda: optax.chain(
    optax.sgd(0.1, momentum=0.9), sync.local_sgd(3, axis_name=AX, warmup_steps=2)
  ),
  'diloco': lambda: optax.chain(optax.sgd(0.1), sync.diloco(period=2, axis_name=AX)),
  'diloco_topk': lambda: optax.chain(
    optax.sgd(0.1), sync.diloco(period=2, axis_name=AX, averager=topk_averager())
  ),
  'selsync': lambda: sync.selsync(optax.sgd(0.1), 0.5, axis_name=AX, window=1),
  'selsync_allreduce': lambda: sync.selsync(
    optax.sgd(0.1), 0.5, axis_name=AX, window=1, averager=sync.allreduce(axis_name=AX)
  ),
}


@LAYOUTS
@pytest.mark.parametrize('method', sorted(MODEL_SYNCS))
def test_workers_hold_the_same_model_bitwise_after_every_synchronisation(method, devices):
  run = testing.Run(MODEL_SYNCS[method](), spread_start(), workers=W, devices=devices)
  synced, apart = [], []
  for t in range(8):
    w = np.asarray(run(spread_grads(t))['w'])
    differ = int(np.sum(np.any(w != w[0], axis=0)))
    state = run.state if method.startswith('selsync') else run.state[1]
    if int(state.synced[0]) > len(synced):  # this step synchronised
      synced.append((t, differ))
    else:
      apart.append(differ)
  assert len(synced) >= 3 and min(apart) > N // 2, (synced, apart)  # the workers do drift apart
  assert all(differ == 0 for _, differ in synced), f'(step, elements that differ): {synced}'


def test_apply_updates_gives_the_mean_that_w_plus_the_update_rounds_away():
  """Hand-computed in float32: 0.2 and -0.1 average to 0.05 (0.1 / 2 is exact); the update
  0.05 - w gives back 0.2 + (0.05 - 0.2) = 0.049999997 and -0.1 + (0.05 + 0.1) = 0.050000004."""
  f = np.float32
  assert f(0.2) + (f(0.05) - f(0.2)) == f(0.049999997)
  assert f(-0.1) + (f(0.05) - f(-0.1)) == f(0.050000004)
  tx = optax.chain(optax.sgd(1.0), sync.local_sgd(1, axis_name=AX))
  run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
  run.params = before = {'x': jnp.array([0.2, -0.1])}
  got = run({'x': jnp.zeros(2)})['x']
  assert np.asarray(got).tolist() == [f(0.05), f(0.05)]
  plain = optax.apply_updates(before, run.updates)['x']
  assert np.asarray(plain).tolist() == [f(0.049999997), f(0.050000004)]


def test_apply_updates_is_optax_apply_updates_where_nothing_synchronised():
  params, updates = spread_start(), spread_grads(0)
  params = jax.tree.map(lambda p: jnp.broadcast_to(p, (W, N)), params)
  want = optax.apply_updates(params, updates)
  chain = optax.chain(sync.allreduce(axis_name=AX), optax.sgd(0.1))
  local = optax.chain(optax.sgd(0.1), sync.local_sgd(4, axis_name=AX))
  for state in [(), jax.vmap(chain.init)(params), jax.vmap(local.init)(params)]:
    got = jax.vmap(sync.apply_updates)(params, updates, state)
    np.testing.assert_array_equal(got['w'], want['w'])


def test_apply_updates_puts_each_groups_model_into_its_own_parameters():
  """Two parameter groups, local SGD every 2 steps on 'a' and every 3 on 'b'
  (`optax.multi_transform`), and 'b' alone under `optax.masked`: after each group's own
  averages its parameters are one model bitwise, and the other group's are left apart."""
  start = {'a': spread_start()['w'], 'b': -spread_start()['w']}
  grads = lambda t: {'a': spread_grads(t)['w'], 'b': spread_grads(t + 10)['w']}
  local = lambda period: optax.chain(optax.sgd(0.1), sync.local_sgd(period, axis_name=AX))
  groups = optax.multi_transform({'a': local(2), 'b': local(3)}, {'a': 'a', 'b': 'b'})
  masked = optax.chain(
    optax.masked(optax.sgd(0.1), {'a': True, 'b': False}),
    optax.masked(local(3), {'a': False, 'b': True}),
  )
  for tx, periods in [(groups, {'a': 2, 'b': 3}), (masked, {'b': 3})]:
    run = testing.Run(tx, start, workers=W)
    for t in range(6):
      new = run(grads(t))
      for k in ('a', 'b'):
        w = np.asarray(new[k])
        differ = int(np.sum(np.any(w != w[0], axis=0)))
        synced = k in periods and (t + 1) % periods[k] == 0
        assert (differ == 0) if synced else (differ > N // 2), (k, t, differ)


@pytest.mark.parametrize('wrap', ['accumulate', 'skip_nonfinite'])
def test_a_wrapper_that_keeps_the_state_of_a_synchronisation_leaves_that_model(wrap):
  """Steps the wrapper skips (accumulating, or a NaN gradient) apply zero updates and keep the
  inner state, which still says it synchronised: the workers keep that model, bitwise."""
  inner = optax.chain(optax.sgd(0.1), sync.local_sgd(2, axis_name=AX))
  if wrap == 'accumulate':  # local_sgd steps at calls 1 and 3 (from 0), averaging at 3
    tx, skipped, calls = sync.accumulate(inner, 2, axis_name=AX), spread_grads, 4
  else:
    tx, calls = sync.skip_nonfinite(inner, axis_name=AX), 2
    skipped = lambda t: jax.tree.map(lambda g: g.at[3, 0].set(jnp.nan), spread_grads(t))
  run = testing.Run(tx, spread_start(), workers=W)
  for t in range(calls):
    synced = np.asarray(run(spread_grads(t))['w'])
  assert [h[0] for h in run.history] == [0] * (calls - 1) + [1]  # the model all-reduce
  assert int(np.sum(synced != synced[0])) == 0
  kept = np.asarray(run(skipped(calls))['w'])
  np.testing.assert_array_equal(kept, synced)


@LAYOUTS
def test_sma_center_is_the_same_on_every_worker_bitwise(devices):
  """SMA's learners stay apart by design; its center z, computed from the all-reduced
  corrections alone, is replicated."""
  tx = optax.chain(optax.sgd(0.1), sync.sma(0.125, axis_name=AX))
  run = testing.Run(tx, spread_start(), workers=W, devices=devices)
  for t in range(4):
    w = np.asarray(run(spread_grads(t))['w'])
    center = np.asarray(run.state[1].center['w'])
    assert int(np.sum(center != center[0])) == 0 and int(np.sum(w != w[0])) > N // 2
  assert float(np.abs(center[0] - np.asarray(spread_start()['w'])).max()) > 0  # z moved
