"""8 workers with dense all-reduce == one device on the global batch (plain SGD)."""

import jax
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import data, models, runtime
from jaxdist.train import step as step_lib

PER_WORKER = 4
STEPS = 5
LR = 0.5  # large enough that a wrong scale (N x the mean) shows at once


def run_workers(model, digits, workers):
  tx = optax.chain(jd.sync.allreduce(axis_name=workers.axis_name), optax.sgd(LR))
  state = step_lib.make_init(model, tx, workers, digits.image_shape)(jax.random.key(0))
  train_step = step_lib.make_train_step(model, tx, workers)
  for t in range(STEPS):
    idx = data.worker_indices(
      t, seed=1, num_examples=len(digits.train), workers=8, per_worker=PER_WORKER
    )
    x = jax.device_put(digits.normalize(digits.train.images[idx]), workers.sharding)
    y = jax.device_put(digits.train.labels[idx], workers.sharding)
    state, metrics = train_step(state, x, y)
  assert [int(c) for c in metrics['wire']] == [8]  # one all-reduce per worker per step
  return state.params


def run_single_device(model, digits):
  tx = optax.sgd(LR)
  params, model_state = step_lib.init_params(model, jax.random.key(0), digits.image_shape)
  opt_state = tx.init(params)
  reference = step_lib.make_reference_step(model, tx)
  for t in range(STEPS):
    idx = data.batch_indices(t, seed=1, num_examples=len(digits.train), batch_size=8 * PER_WORKER)
    x, y = digits.normalize(digits.train.images[idx]), digits.train.labels[idx]
    params, model_state, opt_state, _ = reference(params, model_state, opt_state, x, y)
  return params


@pytest.mark.parametrize(
  'devices', [8, 1, 2], ids=['8-devices', '8-simulated', '2-devices-x-4-simulated']
)
@pytest.mark.parametrize('model_name', ['cnn', 'mlp'])
def test_allreduce_equals_single_device_global_batch(digits, devices, model_name):
  model = models.get(model_name, num_classes=10)
  workers = runtime.layout(8, devices=devices)
  assert (workers.devices, workers.per_device) == (devices, 8 // devices)
  expected = run_single_device(model, digits)
  got = run_workers(model, digits, workers)
  initial, _ = step_lib.init_params(model, jax.random.key(0), digits.image_shape)
  moved = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(initial), strict=True)
  )
  assert moved > 1e-2  # the reference really trained
  for w in range(8):
    jax.tree.map(
      lambda g, e, w=w: np.testing.assert_allclose(g[w], e, atol=1e-5, rtol=1e-5), got, expected
    )
