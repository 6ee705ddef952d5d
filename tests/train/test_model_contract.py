"""The steps' model contract: models with or without `train`, and a loss of the user's choosing.

Each run is checked against a hand-written single-device step (plain SGD on the mean loss of
the global batch), not against the library's own reference step.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import runtime
from jaxdist.train import step as step_lib

WORKERS, PER_WORKER, FEATURES, OUTPUTS = 8, 4, 6, 3
STEPS = 4
LR = 0.5


class PlainMLP(nn.Module):
  """A Flax MLP as a user writes it: `__call__(x)`, no `train` argument."""

  @nn.compact
  def __call__(self, x_BxD):
    return nn.Dense(OUTPUTS)(jnp.tanh(nn.Dense(16)(x_BxD)))


def squared_error(out_BxO, target_BxO):
  """Per-example mean squared error."""
  return jnp.mean((out_BxO - target_BxO) ** 2, axis=-1)


def batches(targets: str):
  """STEPS global batches [W, B, ...] of random inputs and integer or regression targets."""
  rng = np.random.default_rng(0)
  for _ in range(STEPS):
    x = rng.standard_normal((WORKERS, PER_WORKER, FEATURES)).astype(np.float32)
    if targets == 'classes':
      y = rng.integers(0, OUTPUTS, (WORKERS, PER_WORKER)).astype(np.int32)
    else:
      y = rng.standard_normal((WORKERS, PER_WORKER, OUTPUTS)).astype(np.float32)
    yield x, y


def hand_reference(params, targets: str):
  """Plain SGD on one device, the loss written out: (params, losses) after STEPS steps."""
  model = PlainMLP()

  def mean_loss(p, x, y):
    out = model.apply({'params': p}, x)
    if targets == 'classes':
      log_p = jax.nn.log_softmax(out)
      return -jnp.mean(jnp.take_along_axis(log_p, y[:, None], axis=1))
    return jnp.mean((out - y) ** 2)

  losses = []
  for x, y in batches(targets):
    x, y = (
      x.reshape(WORKERS * PER_WORKER, *x.shape[2:]),
      y.reshape(WORKERS * PER_WORKER, *y.shape[2:]),
    )
    loss, g = jax.value_and_grad(mean_loss)(params, x, y)
    params = jax.tree.map(lambda p, g: p - LR * g, params, g)
    losses.append(float(loss))
  return params, losses


def run_workers(workers, targets: str, **loss):
  model = PlainMLP()
  tx = optax.chain(jd.sync.allreduce(axis_name=workers.axis_name), optax.sgd(LR))
  state = step_lib.make_init(model, tx, workers, (FEATURES,))(jax.random.key(0))
  train_step = step_lib.make_train_step(model, tx, workers, **loss)
  losses, keys = [], set()
  for x, y in batches(targets):
    put = lambda a: jax.device_put(a, workers.sharding)
    state, metrics = train_step(state, put(x), put(y))
    losses.append(float(metrics['loss']))
    keys |= set(metrics)
  return state, losses, keys


def max_error(got_W, expected) -> float:
  """Largest |difference| of every worker's params from the reference's."""
  errors = jax.tree.map(
    lambda g, e: float(np.max(np.abs(np.asarray(g) - e[None]))), got_W, expected
  )
  return max(jax.tree.leaves(errors))


@pytest.mark.parametrize('devices', [8, 2], ids=['8-devices', '2-devices-x-4-simulated'])
def test_a_model_without_train_trains_as_by_hand(devices):
  workers = runtime.layout(WORKERS, devices=devices)
  state, losses, keys = run_workers(workers, 'classes')
  initial = step_lib.init_params(PlainMLP(), jax.random.key(0), (FEATURES,))[0]
  expected, expected_losses = hand_reference(initial, 'classes')
  assert max_error(initial, expected) > 1e-2  # the reference really trained
  assert max_error(state.params, expected) <= 1e-5
  assert max(abs(a - b) for a, b in zip(losses, expected_losses, strict=True)) <= 1e-5
  assert 'accuracy' in keys


@pytest.mark.parametrize('devices', [8, 2], ids=['8-devices', '2-devices-x-4-simulated'])
def test_a_user_loss_on_regression_targets_trains_as_by_hand(devices):
  workers = runtime.layout(WORKERS, devices=devices)
  state, losses, keys = run_workers(workers, 'regression', loss=squared_error)
  initial = step_lib.init_params(PlainMLP(), jax.random.key(0), (FEATURES,))[0]
  expected, expected_losses = hand_reference(initial, 'regression')
  assert max_error(initial, expected) > 1e-2
  assert max_error(state.params, expected) <= 1e-5
  assert max(abs(a - b) for a, b in zip(losses, expected_losses, strict=True)) <= 1e-5
  assert 'accuracy' not in keys  # no classes to be accurate about


def test_a_mean_loss_is_refused_with_one_line():
  workers = runtime.layout(WORKERS, devices=8)
  mean_loss = lambda out, y: jnp.mean(squared_error(out, y))
  with pytest.raises(ValueError, match=r'loss must return one value per example'):
    run_workers(workers, 'regression', loss=mean_loss)


def test_eval_and_reference_steps_take_the_model_and_loss():
  workers = runtime.layout(WORKERS, devices=8)
  model = PlainMLP()
  tx = optax.chain(jd.sync.allreduce(axis_name=workers.axis_name), optax.sgd(LR))
  state = step_lib.make_init(model, tx, workers, (FEATURES,))(jax.random.key(0))
  x, y = next(batches('regression'))
  x, y = x.reshape(-1, FEATURES), y.reshape(-1, OUTPUTS)
  mask = np.ones(len(x), np.float32)
  sums = step_lib.make_eval_step(model, workers, loss=squared_error)(state, x, y, mask)
  params = jax.tree.map(lambda p: p[0], state.params)
  out = np.asarray(model.apply({'params': params}, x), np.float64)
  by_hand = float(np.sum(np.mean((out - y) ** 2, axis=-1)))
  assert abs(float(sums['loss']) - by_hand) <= 1e-4 * by_hand
  assert 'correct' not in sums
  reference = step_lib.make_reference_step(model, optax.sgd(LR), loss=squared_error)
  params = jax.tree.map(jnp.copy, params)
  _, _, _, loss = reference(params, {}, optax.sgd(LR).init(params), x, y)
  assert abs(float(loss) - by_hand / len(x)) <= 1e-5
