"""Weighted aggregation (jaxdist.sync.weighted) and the masked loss (jaxdist.models.masked).

Reference equivalences: equal counts == `allreduce`; unequal counts == a NumPy
weighted mean; masked per-worker batches + weighted all-reduce == one device's
gradient on all the examples the workers really trained on. Wire: the
lowered HLO holds one all-reduce of the gradient's bytes + the 4-byte count.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, models, runtime, testing
from jaxdist.models.masked import count_mask, masked_cross_entropy, masked_mean
from jaxdist.sync.weighted import COUNT_BYTES, weighted_allreduce

W = 4
SHAPES = {'w': (5, 3), 'b': (3,), 's': ()}


def params():
  return {k: jnp.zeros(s, jnp.float32) for k, s in SHAPES.items()}


def worker_grads(seed=0):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(rng.standard_normal((W, *s)), jnp.float32) for k, s in SHAPES.items()}


def with_counts(tx, counts):
  """`tx` with each worker's count passed as optax's extra argument `weight`."""
  counts = jnp.asarray(counts)

  def update(updates, state, params=None):
    return tx.update(updates, state, params, weight=counts[comm.axis_index(runtime.AXES)])

  return optax.GradientTransformation(tx.init, update)


def averaged(tx, grads, devices=1):
  run = testing.Run(tx, params(), workers=W, devices=devices)
  run(grads)
  return run


def weighted_run(counts, grads, devices=1):
  tx = optax.chain(weighted_allreduce(axis_name=runtime.AXES), optax.sgd(1.0))
  return averaged(with_counts(tx, counts), grads, devices)


@pytest.mark.parametrize('b', [1, 4, 32])
def test_equal_power_of_two_counts_are_allreduce_bitwise(b):
  grads = worker_grads()
  dense = averaged(optax.chain(jd.sync.allreduce(axis_name=runtime.AXES), optax.sgd(1.0)), grads)
  got = weighted_run([b] * W, grads)
  jax.tree.map(np.testing.assert_array_equal, got.updates, dense.updates)


@pytest.mark.parametrize('b', [3, 7, 25])
def test_equal_counts_are_allreduce(b):
  grads = worker_grads(1)
  dense = averaged(optax.chain(jd.sync.allreduce(axis_name=runtime.AXES), optax.sgd(1.0)), grads)
  got = weighted_run([b] * W, grads)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), got.updates, dense.updates
  )


@pytest.mark.parametrize('devices', [1, 2, 4])
def test_unequal_counts_give_the_weighted_mean(devices):
  counts = np.array([5, 42, 49, 0])  # H10's batches, and a worker that trained on nothing
  grads = worker_grads(2)
  run = weighted_run(counts, grads, devices)
  for k, g in grads.items():
    g = np.asarray(g, np.float64)
    want = np.tensordot(counts, g, axes=1) / counts.sum()  # Σ b_k g_k / Σ b_k
    for worker in range(W):  # every worker gets the same mean; sgd(1) negates it
      np.testing.assert_allclose(-run.updates[k][worker], want, rtol=1e-6, atol=1e-7)


def test_zero_counts_everywhere_give_zero_not_nan():
  run = weighted_run([0] * W, worker_grads())
  for u in jax.tree.leaves(run.updates):
    np.testing.assert_array_equal(u, 0)


def test_wire_is_one_allreduce_of_the_gradient_and_the_count():
  grads = worker_grads()
  tx = with_counts(weighted_allreduce(axis_name=runtime.AXES), [1, 2, 3, 4])
  run = averaged(tx, grads, devices=W)  # one worker per device: the all-reduce is in the HLO
  [wire] = comm.find_transfers(run.state)
  assert wire.kind == comm.ALL_REDUCE
  assert wire.nbytes == comm.tree_nbytes(params()) + COUNT_BYTES == 4 * (15 + 3 + 1) + 4
  assert run.history == [[1]]
  for compiled in (False, True):
    found = comm.hlo.collectives(run.hlo(grads, compiled=compiled))
    assert {c.kind for c in found} == {comm.ALL_REDUCE}
    assert sum(c.nbytes for c in found) == wire.nbytes, (compiled, found)
    assert all(set(c.dtypes) == {'f32'} for c in found)


def test_missing_or_bad_weight_is_an_error():
  tx = weighted_allreduce(axis_name='w')
  g = {'x': jnp.ones((2, 3))}
  with pytest.raises(ValueError, match="needs each worker's example count"):
    jax.vmap(lambda g: tx.update(g, tx.init(g)), axis_name='w')(g)
  with pytest.raises(ValueError, match=r'weight must be a scalar per worker, got shape \(2,\)'):
    jax.vmap(lambda g: tx.update(g, tx.init(g), weight=jnp.ones(2)), axis_name='w')(g)


def test_init_does_not_communicate():
  tx = weighted_allreduce(axis_name='nowhere')
  state = jax.eval_shape(tx.init, params())
  assert state.wire.nbytes == comm.tree_nbytes(params()) + COUNT_BYTES


# --- masked loss ---------------------------------------------------------------------


def test_masked_mean_and_mask():
  np.testing.assert_array_equal(count_mask(2, 4), [True, True, False, False])
  v = jnp.array([1.0, 2.0, 6.0, 1e6])
  assert float(masked_mean(v, 3)) == 3.0
  assert float(masked_mean(v, 0)) == 0.0
  assert float(masked_mean(v, 9)) == pytest.approx(float(v.mean()))  # count clipped to B


def model_and_data(seed=0, n=8):
  model = models.get('mlp', num_classes=5, hidden=(16,))
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((n, 4, 4, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 5, n), jnp.int32)
  p = model.init(jax.random.key(seed), x[:1])['params']
  return model, p, x, y


def test_masked_batch_has_the_gradient_of_the_unmasked_examples():
  model, p, x, y = model_and_data()
  traces = []

  @jax.jit
  def masked_grad(p, x, count):
    traces.append(1)
    return jax.grad(lambda p: masked_cross_entropy(model.apply({'params': p}, x), y, count))(p)

  @jax.jit
  def plain_grad(p, x, y):  # the mean over all of x: its shape is the count
    ce = optax.softmax_cross_entropy_with_integer_labels
    return jax.grad(lambda p: ce(model.apply({'params': p}, x), y).mean())(p)

  for n in (1, 3, 8):
    got, want = masked_grad(p, x, jnp.int32(n)), plain_grad(p, x[:n], y[:n])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got, want)
  # the padding contributes nothing: other padding, the same gradient
  x_other = x.at[3:].set(123.0)
  jax.tree.map(
    np.testing.assert_array_equal,
    masked_grad(p, x_other, jnp.int32(3)),
    masked_grad(p, x, jnp.int32(3)),
  )
  for leaf in jax.tree.leaves(masked_grad(p, x, jnp.int32(0))):
    np.testing.assert_array_equal(leaf, 0)
  assert len(traces) == 1  # a new count does not recompile


def test_masked_workers_with_weighted_allreduce_equal_one_device_on_their_examples():
  """3 workers hold 6 examples each and train on (2, 5, 1) of them: one global batch of 8."""
  model, p, _, _ = model_and_data()
  counts = jnp.array([2, 5, 1])
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((3, 6, 4, 4, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 5, (3, 6)), jnp.int32)
  tx = weighted_allreduce(axis_name='workers')

  def worker(x, y, count):
    loss = lambda p: masked_cross_entropy(model.apply({'params': p}, x), y, count)
    g = jax.grad(loss)(p)
    return tx.update(g, tx.init(g), weight=count)[0]

  got = jax.jit(jax.vmap(worker, axis_name='workers'))(x, y, counts)
  used_x = jnp.concatenate([x[k, :b] for k, b in enumerate([2, 5, 1])])
  used_y = jnp.concatenate([y[k, :b] for k, b in enumerate([2, 5, 1])])
  ce = optax.softmax_cross_entropy_with_integer_labels
  want = jax.jit(jax.grad(lambda p: ce(model.apply({'params': p}, used_x), used_y).mean()))(p)
  for k in range(3):
    mine = jax.tree.map(lambda a, k=k: a[k], got)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), mine, want)
