"""Micro-batched counted steps: the masked step's numbers, computing only the counted examples."""

import re

import jax
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import runtime
from jaxdist.train import step as step_lib

HELD, MICRO, STEPS = 12, 4, 3
COUNTS = np.array([12, 0, 3, 5, 1, 8, 4, 9], np.int32)  # full, none, part of one, ...
TOL = {'rtol': 2e-5, 'atol': 2e-6, 'equal_nan': False}


def _tx(workers):
  axis = workers.axis_name
  return optax.chain(jd.sync.weighted_allreduce(axis_name=axis), optax.sgd(0.3))


def _batches(shape):
  rng = np.random.default_rng(0)
  for _ in range(STEPS):
    x = rng.standard_normal((8, HELD, *shape), dtype=np.float32)
    yield x, rng.integers(0, 10, (8, HELD)).astype(np.int32)


def _train(model, devices, shape, micro_batch):
  workers = runtime.layout(8, devices=devices)
  tx = _tx(workers)
  state = step_lib.make_init(model, tx, workers, shape)(jax.random.key(0))
  step = step_lib.make_train_step(model, tx, workers, counted=True, micro_batch=micro_batch)
  losses = []
  for x, y in _batches(shape):
    args = (jax.device_put(a, workers.sharding) for a in (x, y, COUNTS))
    state, metrics = step(state, *args)
    losses.append((metrics['loss'], metrics['accuracy']))
  return jax.device_get(state.params), np.asarray(losses)


@pytest.mark.parametrize(
  'model_name, devices, shape',
  [('mlp', 8, (8, 8, 1)), ('cnn', 2, (8, 8, 1))],  # one worker a device (vmap); four (loop)
)
def test_micro_batches_equal_the_masked_pass_on_the_same_counts(model_name, devices, shape):
  model = jd.models.get(model_name, num_classes=10)
  masked = _train(model, devices, shape, 0)
  micro = _train(model, devices, shape, MICRO)
  for leaf in jax.tree.leaves(masked):
    assert np.all(np.isfinite(leaf))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), micro, masked)


def test_one_step_is_sgd_on_every_counted_example_at_once():
  """The reference: one device, plain SGD on the mean loss of all Σ counts examples."""
  model = jd.models.get('mlp', num_classes=10)
  shape = (8, 8, 1)
  workers = runtime.layout(8, devices=8)
  tx = _tx(workers)
  state = step_lib.make_init(model, tx, workers, shape)(jax.random.key(0))
  step = step_lib.make_train_step(model, tx, workers, counted=True, micro_batch=MICRO)
  x, y = next(_batches(shape))
  params0 = jax.tree.map(lambda a: np.asarray(a[0]), jax.device_get(state.params))
  state, _ = step(state, *(jax.device_put(a, workers.sharding) for a in (x, y, COUNTS)))
  xs = np.concatenate([x[k, :c] for k, c in enumerate(COUNTS)])
  ys = np.concatenate([y[k, :c] for k, c in enumerate(COUNTS)])

  def loss(p):
    logits = model.apply({'params': p}, xs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, ys).mean()

  want = jax.tree.map(lambda p, g: p - 0.3 * g, params0, jax.grad(loss)(params0))
  got = jax.device_get(state.params)
  every = jax.tree.map(lambda w: np.broadcast_to(w, (8, *w.shape)), want)  # one model for all
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), got, every)


def _lowered_args(model_name):
  """(model, workers, chain, fresh state, one step's [x, y, counts]) on 8 devices."""
  model = jd.models.get(model_name, num_classes=10)
  workers = runtime.layout(8, devices=8)
  tx = _tx(workers)
  state = step_lib.make_init(model, tx, workers, (8, 8, 1))(jax.random.key(0))
  x, y = next(_batches((8, 8, 1)))
  return model, workers, tx, state, [jax.device_put(a, workers.sharding) for a in (x, y, COUNTS)]


def test_each_device_loops_over_its_own_count_of_micro_batches():
  """The compiled step holds a while loop, its trip count the worker's count (not b_max / m)."""
  model, workers, tx, state, args = _lowered_args('mlp')
  lower = lambda m: step_lib.make_train_step(model, tx, workers, counted=True, micro_batch=m)
  micro = lower(MICRO).lower(state, *args).compile().as_text()
  masked = lower(0).lower(state, *args).compile().as_text()
  counted_loops = lambda text: [
    line for line in text.splitlines() if ' while(' in line and 'known_trip_count' not in line
  ]  # loops whose trips are known only at run time
  assert len(counted_loops(micro)) == 1 and not counted_loops(masked)
  # the micro-batch's forward pass: [4, 64] inputs into the first dense layer, not [12, 64]
  assert 'f32[4,64]' in micro and 'f32[12,64]' in masked


def test_bad_micro_batches_are_refused():
  model = jd.models.get('mlp', num_classes=10)
  workers = runtime.layout(8, devices=8)
  tx = _tx(workers)
  with pytest.raises(ValueError, match='micro-batches cut a counted step'):
    step_lib.make_train_step(model, tx, workers, micro_batch=4)
  with pytest.raises(ValueError, match='micro-batches cut a counted step'):
    step_lib.make_train_step(model, tx, workers, counted=True, micro_batch=-1)
  _, _, _, state, args = _lowered_args('mlp')
  step = step_lib.make_train_step(model, tx, workers, counted=True, micro_batch=5)
  with pytest.raises(ValueError, match='divide the 12 examples a worker holds, got 5'):
    step(state, *args)


def test_the_loop_s_convolutions_are_in_the_layout_xla_cpu_calls_eigen_for():
  """XLA's CPU backend canonicalises convolutions only outside loops: in the micro-batch loop
  they are rewritten (`xla_cpu.conv_rule`), else they ran 10x slower (naive loops)."""
  model, workers, tx, state, args = _lowered_args('cnn')
  step = step_lib.make_train_step(model, tx, workers, counted=True, micro_batch=MICRO)
  text = step.lower(state, *args).compile().as_text()
  labels = re.findall(r'convolution\(.*?dim_labels=(\S+?),', text)
  assert len(labels) == 5  # the CNN's 2 forward, 2 weight-gradient, 1 input-gradient
  assert set(labels) == {'b01f_01io->b01f'}
