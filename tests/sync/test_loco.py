"""SparseLoCo and DeMo (chunked_allgather) against references, hand-computed cases and the HLO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist import comm, runtime, sync, testing

W = 8
AX = runtime.AXES
SHAPES = {'w': (8, 6), 'k': (2, 4, 6), 'b': (5,), 's': ()}


def start():
  rng = np.random.default_rng(7)
  return {k: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()}


def grads_at(step, workers=W):
  rng = np.random.default_rng(100 + step)
  return {
    k: jnp.asarray(rng.standard_normal((workers, *s)).astype(np.float32) + 0.1)
    for k, s in SHAPES.items()
  }


def assert_close(a, b, atol=1e-6):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=1e-6), a, b)


# --- SparseLoCo -----------------------------------------------------------------------------


@pytest.mark.parametrize('devices', [1, 2])
def test_sparseloco_dense_without_quantisation_is_diloco_with_outer_sgd(devices):
  """density 1, no quantiser: everything is sent, e = 0 after each sync: DiLoCo, outer SGD."""
  inner = optax.adam(0.05)
  tx = sync.sparseloco(2, axis_name=AX, density=1.0, bits=32, chunk=4, outer_learning_rate=0.7)
  ref = sync.diloco(optax.sgd(0.7), 2, axis_name=AX)
  got = testing.Run(optax.chain(inner, tx), start(), workers=W, devices=devices)
  want = testing.Run(optax.chain(inner, ref), start(), workers=W, devices=devices)
  assert_close(got.steps(6, grads_at), want.steps(6, grads_at))
  jax.tree.map(lambda e: np.testing.assert_array_equal(e, 0.0), got.state[1].averager.error)


@pytest.mark.parametrize(
  'average, first', [('selected', [3.0, 3.0, 2.0, 0.0]), ('all', [3, 1.5, 1, 0])]
)
def test_sparseloco_error_feedback_by_hand(average, first):
  # inner SGD lr 1, H = 1: Δ_n = g_n; one 4-long tile, k = 2, β = 0.5, α = 1, no quantiser.
  # step 1: worker 0 sends 4 (0), 2 (2), keeps e0 = [0, -1, 0, .5];
  #         worker 1 sends 3 (1), 2 (0), keeps e1 = [0, 0, -.5, 1];
  #         selected: [(4 + 2)/2, 3, 2, 0]; all: [6/2, 3/2, 2/2, 0]
  # step 2: e0 = .5·e0 + g0 = [4, -1.5, 2, .75] sends 4 (0), 2 (2) -> e0 = [0, -1.5, 0, .75]
  #         e1 = .5·e1 + g1 = [2, 3, -.75, 1.5] sends 3 (1), 2 (0) -> e1 = [0, 0, -.75, 1.5]
  g = {'x': jnp.array([[4.0, -1.0, 2.0, 0.5], [2.0, 3.0, -0.5, 1.0]])}
  tx = sync.sparseloco(1, axis_name=AX, density=0.5, bits=32, chunk=4, error_decay=0.5,
                       average=average)  # fmt: skip
  run = testing.Run(optax.chain(optax.sgd(1.0), tx), {'x': jnp.zeros(4)}, workers=2)
  np.testing.assert_allclose(run(g)['x'], -np.array([first, first]), atol=1e-6)
  np.testing.assert_allclose(run.state[1].averager.error['x'], [[0, -1, 0, 0.5], [0, 0, -0.5, 1]])
  np.testing.assert_allclose(run(g)['x'], -2 * np.array([first, first]), atol=1e-6)
  np.testing.assert_allclose(
    run.state[1].averager.error['x'], [[0, -1.5, 0, 0.75], [0, 0, -0.75, 1.5]]
  )


def test_sparseloco_2bit_error_feedback_conserves_what_it_did_not_send():
  """One worker: the outer step is −α·s; e_new + s == β·e_old + Δ, s has k per tile, 4 values."""
  shapes = {'w': (16, 12), 'b': (12,)}
  rng = np.random.default_rng(3)
  tx = sync.sparseloco(1, axis_name=AX, density=0.25, chunk=4, error_decay=0.9,
                       outer_learning_rate=0.5)  # fmt: skip
  zeros = {k: jnp.zeros(s) for k, s in shapes.items()}
  run = testing.Run(optax.chain(optax.sgd(1.0), tx), zeros, workers=1)
  for _ in range(3):
    g = {k: jnp.asarray(rng.standard_normal((1, *s)).astype(np.float32)) for k, s in shapes.items()}
    before, e_old = run.params, run.state[1].averager.error
    after = run(g)
    for k in shapes:
      sent = (np.asarray(before[k]) - np.asarray(after[k])) / 0.5
      np.testing.assert_allclose(
        run.state[1].averager.error[k] + sent, 0.9 * np.asarray(e_old[k]) + g[k], atol=1e-5
      )
      assert len(np.unique(np.round(sent[sent != 0], 4))) <= 4  # 2-bit: four codes a tensor
      per_tile = (sent[0] != 0).reshape(-1, 4) if k == 'b' else None
      if per_tile is not None:
        assert per_tile.sum(axis=1).max() <= 1  # 4-long segments keep round(4 · 0.25) = 1


def test_sparseloco_sends_one_allgather_of_the_payload_on_sync_steps_only():
  # w (128, 96), chunk 64 -> 4 tiles of 64 x 48 = 3072, k = round(3072/32) = 96, 384 kept:
  #   positions 12 bits: 3 · 192 = 576 B; codes 2 bits: 96 B; lookup + shift 5 floats: 20 B
  # b (10,) -> one 1 x 10 tile, k = max(1, round(10/32)) = 1: 3 + 1 + 20 B
  params = {'w': jnp.zeros((128, 96)), 'b': jnp.zeros((10,))}
  tx = optax.chain(optax.sgd(0.1), sync.sparseloco(2, axis_name=AX, density=1 / 32))
  run = testing.Run(tx, params, workers=2, devices=2)
  g = {'w': jnp.ones((2, 128, 96)), 'b': jnp.ones((2, 10))}
  run(g), run(g)
  assert run.history == [[0], [1]]
  (t,) = comm.find_transfers(run.state)
  assert (t.kind, t.nbytes) == ('all-gather', 716)
  found = comm.hlo.collectives(run.hlo(g, compiled=False))
  gathers = [c for c in found if c.kind == 'all-gather']
  assert [c.dtypes for c in gathers] == [('u8',)]
  assert sum(c.nbytes for c in gathers) == 716
  assert all(c.kind == 'all-gather' for c in found if c.nbytes > 8)


def test_sparseloco_float_values_payload_bytes():
  # without a quantiser: w 576 B positions + 4 · 384 B values; b 3 + 4 B
  tx = sync.sparseloco(2, axis_name=AX, density=1 / 32, bits=32)
  state = tx.init({'w': jnp.zeros((128, 96)), 'b': jnp.zeros((10,))})
  assert comm.find_transfers(state)[0].nbytes == 576 + 4 * 384 + 3 + 4


def test_sparseloco_workers_hold_the_anchor_bitwise_after_a_sync():
  tx = optax.chain(optax.adam(0.05), sync.sparseloco(2, axis_name=AX, density=0.25, chunk=4))
  run = testing.Run(tx, start(), workers=W, devices=2)
  params = run.steps(4, grads_at)
  for k in SHAPES:
    np.testing.assert_array_equal(np.ptp(np.asarray(params[k]), axis=0), 0.0)
    np.testing.assert_array_equal(params[k][0], run.state[1].anchor[k][0])


# --- DeMo -----------------------------------------------------------------------------------


@pytest.mark.parametrize('devices', [1, 2])
@pytest.mark.parametrize('sign', [True, False])
def test_demo_keeping_every_coefficient_is_sign_sgd_on_the_mean_gradient(sign, devices):
  """topk >= tile size: m = η·g is all sent, so θ <- θ − η·sign(mean g) (η²·mean g unsigned)."""
  lr = 0.05
  tx = sync.demo(lr, axis_name=AX, topk=64, chunk=8, sign=sign, momentum_decay=0.9)
  mean = sync.allreduce(axis_name=AX)
  if sign:
    ref = optax.chain(mean, optax.scale_by_sign(), optax.sgd(lr))
  else:
    ref = optax.chain(mean, optax.sgd(lr * lr))
  got = testing.Run(tx, start(), workers=W, devices=devices)
  want = testing.Run(ref, start(), workers=W, devices=devices)
  assert_close(got.steps(4, grads_at), want.steps(4, grads_at))
  jax.tree.map(lambda m: np.testing.assert_allclose(m, 0.0, atol=1e-6), got.state.exchange.error)


def test_demo_by_hand_two_workers_one_dct_coefficient_each():
  # η = 0.5, one 1x4 tile, k = 1. m0 = η·[1, 2, 3, 4]: DCT = η·[5, −2.23, 0, −0.159] -> DC η·5
  # m1 = η·[1, 0, 0, −1]: DCT = η·[0, 1.30656, 0, 0.541196] -> X1 = η·1.30656
  # mean over senders: C = η·[5, 1.30656, 0, 0]; Q = IDCT(C) = η·(2.5 + 0.92388·cos(π(2i+1)/8))
  #   = η·[3.353553, 2.853553, 2.146447, 1.646447];  θ = −η·Q (sign off)
  # momentum left: m0 = η·([1, 2, 3, 4] − 2.5); m1 = η·([1, 0, 0, −1] − 0.92388·cos(...))
  g = {'x': jnp.array([[1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 0.0, -1.0]])}
  tx = sync.demo(0.5, axis_name=AX, topk=1, chunk=4, sign=False)
  run = testing.Run(tx, {'x': jnp.zeros(4)}, workers=2)
  q = np.array([3.353553, 2.853553, 2.146447, 1.646447])
  np.testing.assert_allclose(run(g)['x'], -0.25 * np.stack([q, q]), atol=1e-6)
  m = [[-0.75, -0.25, 0.25, 0.75], [0.0732233, -0.1767767, 0.1767767, -0.0732233]]
  np.testing.assert_allclose(run.state.exchange.error['x'], m, atol=1e-6)
  signed = testing.Run(
    sync.demo(0.5, axis_name=AX, topk=1, chunk=4), {'x': jnp.zeros(4)}, workers=2
  )
  np.testing.assert_allclose(signed(g)['x'], -0.5 * np.ones((2, 4)), atol=0)


def test_demo_weight_decay_is_decoupled():
  # zero gradients: nothing to send, sign(0) = 0, θ <- (1 − η·λ)·θ
  tx = sync.demo(0.1, axis_name=AX, weight_decay=0.5)
  run = testing.Run(tx, start(), workers=2)
  zeros = jax.tree.map(lambda x: jnp.zeros((2, *x.shape)), start())
  assert_close(run(zeros), jax.tree.map(lambda x: np.stack([0.95 * x] * 2), start()))


def test_demo_with_a_schedule_and_bitwise_equal_workers():
  tx = sync.demo(optax.linear_schedule(0.01, 0.001, 4), axis_name=AX, topk=3, chunk=4)
  run = testing.Run(tx, start(), workers=W, devices=2)
  params = run.steps(3, grads_at)
  for k in SHAPES:
    np.testing.assert_array_equal(np.ptp(np.asarray(params[k]), axis=0), 0.0)
  assert int(run.state.count[0]) == 3
  moved = np.abs(np.asarray(params['w'][0]) - np.asarray(start()['w']))
  assert moved.max() <= 0.01 + 0.0095 + 0.009 + 1e-6  # each step at most η_t per entry


def test_demo_payload_bytes_in_the_hlo():
  # w (128, 96): 4 tiles of 3072, k = 32: 128 kept: 3 · 64 = 192 B positions + 512 B values
  # b (10,): one tile of 10, k = 10: 15 B positions + 40 B values
  params = {'w': jnp.zeros((128, 96)), 'b': jnp.zeros((10,))}
  run = testing.Run(sync.demo(1e-3, axis_name=AX), params, workers=2, devices=2)
  g = {'w': jnp.ones((2, 128, 96)), 'b': jnp.ones((2, 10))}
  (t,) = comm.find_transfers(run.state)
  assert (t.kind, t.nbytes) == ('all-gather', 192 + 512 + 15 + 40)
  found = comm.hlo.collectives(run.hlo(g, compiled=False))
  assert [(c.kind, c.dtypes, c.nbytes) for c in found] == [('all-gather', ('u8',), 759)]
  run(g)
  assert run.history == [[1]]


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: sync.sparseloco(0, axis_name=AX), 'period must be >= 1, got 0'),
    (lambda: sync.sparseloco(axis_name=AX, density=0.0), r'density must be in \(0, 1\], got 0.0'),
    (lambda: sync.sparseloco(axis_name=AX, bits=3), r'bits must be one of \(1, 2, 4, 8, 32\)'),
    (lambda: sync.sparseloco(axis_name=AX, error_decay=1.5), 'error_decay must be in'),
    (lambda: sync.sparseloco(axis_name=AX, chunk=0), 'chunk must be an int >= 1, got 0'),
    (lambda: sync.sparseloco(axis_name=AX, average='sum'), 'average must be one of'),
    (lambda: sync.sparseloco(axis_name=AX, outer_learning_rate=0), 'outer_learning_rate must'),
    (
      lambda: sync.demo(1e-3, axis_name=AX, momentum_decay=1.0),
      r'momentum_decay must be in \[0, 1\)',
    ),
    (lambda: sync.demo(1e-3, axis_name=AX, topk=0), 'topk must be an int >= 1, got 0'),
    (lambda: sync.demo(-1.0, axis_name=AX), 'learning_rate must be > 0'),
    (lambda: sync.chunked_allgather(axis_name=AX), 'give one of density and topk'),
  ],
)
def test_bad_arguments_are_refused(make, message):
  with pytest.raises(ValueError, match=message):
    make()


@pytest.mark.parametrize('make', [
  lambda ax: optax.chain(optax.sgd(1.0), sync.sparseloco(1, axis_name=ax, density=0.5, chunk=4)),
  lambda ax: sync.demo(0.1, axis_name=ax, topk=2, chunk=4),
], ids=['sparseloco', 'demo'])  # fmt: skip
def test_init_is_silent_and_the_device_axis_alone_is_refused(make):
  params = {'w': jnp.zeros((4, 4)), 'b': jnp.zeros(())}
  state = jax.eval_shape(make(AX).init, params)  # no mesh, no axis: init does not communicate
  assert comm.find_transfers(state)[0].kind == 'all-gather'
  run = testing.Run(make(runtime.DATA), params, workers=4, devices=2)
  grads = {'w': jnp.ones((4, 4, 4)), 'b': jnp.ones((4,))}
  with pytest.raises(ValueError, match='reaches only the devices, not the 2 simulated workers'):
    run(grads)
