"""Misuse the library can see is refused at trace time, in one line that names the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, runtime, testing
from jaxdist import compress as C

PARAMS = {'w': jnp.zeros((4,))}
GRADS = {'w': jnp.arange(32.0).reshape(8, 4)}  # 8 workers' gradients

TRANSFORMS = {
  'allreduce': lambda ax: jd.sync.allreduce(axis_name=ax),
  'compressed': lambda ax: jd.sync.compressed_allreduce(C.topk(ratio=0.5), axis_name=ax),
  'powersgd': lambda ax: jd.sync.powersgd(1, axis_name=ax, min_size=0),
  'local_sgd': lambda ax: jd.sync.local_sgd(1, axis_name=ax),
  'gossip': lambda ax: jd.sync.gossip(axis_name=ax, num_workers=8),
}


@pytest.mark.parametrize('name', sorted(TRANSFORMS))
def test_the_device_axis_alone_with_simulated_workers_is_refused(name):
  tx = optax.chain(optax.sgd(1.0), TRANSFORMS[name](runtime.DATA))
  run = testing.Run(tx, PARAMS, workers=8, devices=2)  # 4 simulated workers a device
  with pytest.raises(ValueError, match=r'reaches only the devices, not the 4 simulated workers'):
    run(GRADS)


def test_the_device_axis_alone_is_fine_with_one_worker_a_device():
  tx = optax.chain(jd.sync.allreduce(axis_name=runtime.DATA), optax.sgd(1.0))
  params = testing.Run(tx, PARAMS, workers=8, devices=8)(GRADS)
  expected = -np.mean(np.asarray(GRADS['w']), axis=0)
  assert float(np.max(np.abs(np.asarray(params['w']) - expected))) <= 1e-6


def test_an_average_inside_each_device_is_left_alone():
  tx = optax.chain(jd.sync.allreduce(axis_name=runtime.SIM), optax.sgd(1.0))
  params = testing.Run(tx, PARAMS, workers=8, devices=2)(GRADS)
  by_device = -np.asarray(GRADS['w']).reshape(2, 4, 4).mean(axis=1)  # mean of each device's 4
  expected = np.repeat(by_device, 4, axis=0)
  assert float(np.max(np.abs(np.asarray(params['w']) - expected))) <= 1e-6


@pytest.mark.parametrize('name', sorted(TRANSFORMS))
def test_update_outside_a_map_names_the_axis_and_the_fix(name):
  tx = optax.chain(optax.sgd(1.0), TRANSFORMS[name](runtime.AXES))
  state = tx.init(PARAMS)
  grads = {'w': jnp.ones((4,))}
  with pytest.raises(
    ValueError, match=r"axis name 'data' is not bound here: call tx.update inside"
  ):
    tx.update(grads, state, PARAMS)
  with pytest.raises(ValueError, match=r'workers.map\(...\) \(jd.runtime.Workers.map\)'):
    jax.jit(tx.update)(grads, state, PARAMS)


def test_collectives_check_their_axes():
  workers = runtime.layout(8, devices=2)

  def per_worker(x):
    return comm.psum(x, runtime.DATA)[0]

  with pytest.raises(ValueError, match=r'pass axis_name=workers.axis_name \(jd.runtime.AXES\)'):
    jax.jit(workers.map(per_worker, in_axes=(0,)))(jnp.ones((8, 2)))
  with pytest.raises(ValueError, match=r"axis name 'data' is not bound here"):
    comm.pmean(jnp.ones(2), runtime.AXES)


def test_a_level_of_a_hierarchy_may_name_the_device_axis_alone():
  """Asked for as a subgroup, the device axis's size, index, sum, maximum and mean are allowed
  with 4 simulated workers a device: worker (d, s) gets those over the devices' worker s."""
  workers = runtime.layout(8, devices=2)

  def fn(x):
    size = comm.axis_size(runtime.DATA, subgroup=True)
    index = comm.axis_index(runtime.DATA, subgroup=True)
    total, _ = comm.psum(x, runtime.DATA, subgroup=True)
    most, _ = comm.pmax(x, runtime.DATA, subgroup=True)
    mean, _ = comm.pmean(x, runtime.DATA, subgroup=True)
    return jnp.stack([size + 0 * x, index + 0 * x, total, most, mean])

  x = jnp.arange(8.0)
  got = np.asarray(jax.jit(workers.map(fn, in_axes=[0]))(jax.device_put(x, workers.sharding)))
  by_sim = np.arange(8.0).reshape(2, 4)  # [device, simulated worker]
  want = np.stack(
    [
      np.full(8, 2.0),
      np.repeat([0.0, 1.0], 4),
      np.tile(by_sim.sum(0), 2),
      np.tile(by_sim.max(0), 2),
      np.tile(by_sim.mean(0), 2),
    ],
    axis=1,
  )
  assert float(np.max(np.abs(got - want))) <= 0, (got, want)
