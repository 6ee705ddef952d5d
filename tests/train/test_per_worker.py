"""make_train_step's per_worker strategies compute the same numbers: 'loop' == 'vmap'."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, runtime
from jaxdist.train import step as step_lib
from jaxdist.train import xla_cpu

STEPS = 3
PER_WORKER = 4
# Hand-checked: after 3 steps the two strategies differ by at most 6e-8 (CNN, allreduce), 0
# (local SGD), 4.8e-7 (counted) and 2.4e-7 (ResNet-20, batch norm; the tests now run a
# two-block ResNet) in any parameter,
# optimizer state, batch statistic or loss: float reassociation only.
TOL = {'atol': 2e-6, 'rtol': 1e-5}


def _txs(workers):
  axis = workers.axis_name
  return {
    'allreduce': optax.chain(jd.sync.allreduce(axis_name=axis), optax.sgd(0.5, momentum=0.9)),
    'local_sgd': optax.chain(optax.sgd(0.5), jd.sync.local_sgd(2, axis_name=axis)),
    'topk_ef': optax.chain(
      jd.sync.compressed_allreduce(jd.compress.topk(ratio=0.05), axis_name=axis), optax.sgd(0.5)
    ),
    'powersgd': optax.chain(jd.sync.powersgd(2, axis_name=axis), optax.sgd(0.5)),
    'topk_split': step_lib.SplitChain(
      jd.sync.compressed_allreduce(jd.compress.topk(ratio=0.05), axis_name=axis),
      optax.sgd(0.5, momentum=0.9),
    ),
    'dgc_split': step_lib.SplitChain(
      jd.sync.compressed_allreduce(
        jd.compress.dgc(ratio=0.05),
        axis_name=axis,
        momentum_correction=0.9,
        warmup_steps=2,
        warmup_stages=2,
      ),
      optax.sgd(0.5, momentum=0.9),
    ),
  }


def _model(name):
  """A model by name; 'resnet': two stages of one block (8, 16 filters): batch norm, a strided
  stage and a projection shortcut, as in ResNet-20, compiled in a fraction of its time."""
  if name == 'resnet':
    return jd.models.ResNet(num_classes=10, blocks_per_stage=1, widths=(8, 16))
  return jd.models.get(name, num_classes=10)


def _train(model, tx_name, shape, per_worker, counted=False, steps=STEPS):
  workers = runtime.layout(8, devices=2)  # 4 simulated workers on each device
  tx = _txs(workers)[tx_name]
  state = step_lib.make_init(model, tx, workers, shape, per_worker)(jax.random.key(0))
  step = step_lib.make_train_step(model, tx, workers, counted=counted, per_worker=per_worker)
  rng = np.random.default_rng(0)
  losses, wires = [], []
  for _ in range(steps):
    x = rng.standard_normal((8, PER_WORKER, *shape), dtype=np.float32)
    y = rng.integers(0, 10, (8, PER_WORKER)).astype(np.int32)
    x, y = (jax.device_put(a, workers.sharding) for a in (x, y))
    extra = [jax.device_put(np.arange(8) % PER_WORKER + 1, workers.sharding)] if counted else []
    state, metrics = step(state, x, y, *extra)
    losses.append(metrics['loss'])
    wires.append(metrics['wire'])
  _train.wires = wires  # the last run's transfer counts, step by step
  return state, np.asarray(losses)


def _zeros_batch(workers):
  """(x, y) of zeros: 2 examples for each of the 8 workers, on their devices."""
  x = jax.device_put(np.zeros((8, 2, 8, 8, 1), np.float32), workers.sharding)
  return x, jax.device_put(np.zeros((8, 2), np.int32), workers.sharding)


def _device_step(model, tx, workers):
  """(fresh state, step, x, y) of `tx` under per_worker='device', on the zero batch."""
  state = step_lib.make_init(model, tx, workers, (8, 8, 1), 'device')(jax.random.key(0))
  step = step_lib.make_train_step(model, tx, workers, per_worker='device')
  return state, step, *_zeros_batch(workers)


def _assert_same(a, b):
  for leaf in jax.tree.leaves((a, b)):
    assert np.all(np.isfinite(np.asarray(leaf, np.float32)))
  jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, **TOL), a, b)


@pytest.mark.parametrize(
  'model_name, tx_name, shape, counted',
  [
    ('cnn', 'allreduce', (8, 8, 1), False),
    ('cnn', 'local_sgd', (8, 8, 1), False),
    ('cnn', 'allreduce', (8, 8, 1), True),
    ('resnet', 'allreduce', (8, 8, 3), False),
  ],
)
def test_loop_equals_vmap(model_name, tx_name, shape, counted):
  model = _model(model_name)
  loop, loop_losses = _train(model, tx_name, shape, 'loop', counted)
  vmap, vmap_losses = _train(model, tx_name, shape, 'vmap', counted)
  _assert_same((loop, loop_losses), (vmap, vmap_losses))
  if tx_name == 'local_sgd':  # per-worker models: after an odd step the workers differ
    kernel = loop.params['Conv_0']['kernel']
    assert not np.allclose(kernel[0], kernel[1])
  if model_name == 'resnet':  # batch-norm statistics stay per worker
    mean = jax.tree.leaves(loop.model_state)[0]
    assert mean.shape[0] == 8 and not np.allclose(mean[0], mean[1])


@pytest.mark.parametrize('per_worker', ['loop', 'vmap'])
def test_local_sgd_workers_hold_one_model_bitwise_after_an_average(per_worker):
  """local_sgd(2) averages after step 2: every worker then holds the mean model, bitwise (the
  step puts in the synchronised model; w + (m - w) differs from m in some elements)."""
  state, _ = _train(_model('cnn'), 'local_sgd', (8, 8, 1), per_worker, steps=2)
  for path, leaf in jax.tree_util.tree_leaves_with_path(state.params):
    a = np.asarray(leaf)
    assert int(np.sum(a != a[0])) == 0, (jax.tree_util.keystr(path), int(np.sum(a != a[0])))
  assert int(jax.tree.leaves(state.opt_state[1].synced)[0][0]) == 1


@pytest.mark.parametrize(
  'model_name, shape, counted',
  [('cnn', (8, 8, 1), False), ('cnn', (8, 8, 1), True), ('resnet', (8, 8, 3), False)],
)
def test_shared_equals_vmap_when_the_workers_hold_one_model(model_name, shape, counted):
  model = _model(model_name)
  shared, shared_losses = _train(model, 'allreduce', shape, 'shared', counted)
  vmap, vmap_losses = _train(model, 'allreduce', shape, 'vmap', counted)
  _assert_same((shared, shared_losses), (vmap, vmap_losses))
  if model_name == 'resnet':  # batch-norm statistics stay per worker
    mean = jax.tree.leaves(shared.model_state)[0]
    assert mean.shape[0] == 8 and not np.allclose(mean[0], mean[1])


@pytest.mark.parametrize('model_name, shape', [('cnn', (8, 8, 1)), ('resnet', (8, 8, 3))])
def test_mean_equals_vmap_for_a_plain_all_reduce(model_name, shape):
  model = _model(model_name)
  mean, mean_losses = _train(model, 'allreduce', shape, 'mean')
  vmap, vmap_losses = _train(model, 'allreduce', shape, 'vmap')
  _assert_same((mean, mean_losses), (vmap, vmap_losses))
  if model_name == 'resnet':  # batch-norm statistics stay per worker
    mean_stat = jax.tree.leaves(mean.model_state)[0]
    assert mean_stat.shape[0] == 8 and not np.allclose(mean_stat[0], mean_stat[1])


def test_mean_is_exact_for_powersgd_whose_steps_see_only_the_sum_of_gradients():
  """P, Q and the approximation depend on the workers' error-fed gradients only through
  their sum, so handing each worker its device's mean trains the same model (the workers'
  residuals differ, their sum does not); Top-k's selection per worker is not linear."""
  model = jd.models.get('cnn', num_classes=10)
  mean, mean_losses = _train(model, 'powersgd', (8, 8, 1), 'mean')
  vmap, vmap_losses = _train(model, 'powersgd', (8, 8, 1), 'vmap')
  _assert_same((mean.params, mean_losses), (vmap.params, vmap_losses))
  residual = lambda s: jax.tree.leaves(s.opt_state[0].residual)[0]
  np.testing.assert_allclose(residual(mean).sum(0), residual(vmap).sum(0), atol=1e-5)
  topk_mean, _ = _train(model, 'topk_ef', (8, 8, 1), 'mean')
  topk_vmap, _ = _train(model, 'topk_ef', (8, 8, 1), 'vmap')
  a, b = topk_mean.params['Conv_0']['kernel'], topk_vmap.params['Conv_0']['kernel']
  assert np.all(np.isfinite(a)) and np.abs(a - b).max() > 1e-4


@pytest.mark.parametrize(
  'model_name, tx_name, shape',
  [('cnn', 'allreduce', (8, 8, 1)), ('resnet', 'allreduce', (8, 8, 3)),
   ('cnn', 'powersgd', (8, 8, 1))],
)  # fmt: skip
def test_device_holds_one_model_per_device_and_trains_the_per_worker_run(
  model_name, tx_name, shape
):
  """8 workers on 2 devices: the state holds 2 models, not 8; each is what every one of its
  device's workers holds in 'vmap' (weights, momentum, PowerSGD's Q). A device's batch-norm
  statistics and PowerSGD residual are the mean of its workers' (both are linear in the
  workers' own values); losses, transfer counts and the evaluated model are the same."""
  model = _model(model_name)
  device, device_losses = _train(model, tx_name, shape, 'device')
  device_wires = _train.wires
  vmap, vmap_losses = _train(model, tx_name, shape, 'vmap')
  for leaf in jax.tree.leaves((device.params, device.opt_state)):
    assert leaf.shape[0] == 2
  per_worker = lambda t: jax.tree.map(lambda a: np.repeat(np.asarray(a), PER_WORKER, axis=0), t)
  _assert_same((per_worker(device.params), device_losses), (vmap.params, vmap_losses))
  device_mean = lambda a: np.asarray(a).reshape(2, PER_WORKER, *a.shape[1:]).mean(1)
  _assert_same(
    (device.model_state, device.opt_state),
    jax.tree.map(device_mean, (vmap.model_state, vmap.opt_state)),
  )
  if tx_name == 'allreduce':  # momentum: the same in every worker, so the mean says nothing new
    _assert_same(per_worker(device.opt_state), vmap.opt_state)
  assert [tuple(map(int, w)) for w in device_wires] == [tuple(map(int, w)) for w in _train.wires]
  workers = runtime.layout(8, devices=2)
  evaluate = step_lib.make_eval_step(model, workers)
  x = jax.device_put(np.random.default_rng(1).standard_normal((16, *shape), dtype=np.float32))
  y, mask = jnp.arange(16) % 10, jnp.ones(16)
  _assert_same(evaluate(device, x, y, mask), evaluate(vmap, x, y, mask))


def test_device_refuses_what_it_cannot_run_once_per_device():
  model = jd.models.get('cnn', num_classes=10)
  workers = runtime.layout(8, devices=2)
  tx = _txs(workers)['allreduce']
  with pytest.raises(ValueError, match="per_worker='device' hands every worker one mean"):
    step_lib.make_train_step(model, tx, workers, counted=True, per_worker='device')
  with pytest.raises(ValueError, match='staggered'):
    step_lib.make_train_step(model, tx, workers, staggered=True, per_worker='device')
  state, step, x, y = _device_step(model, tx, workers)
  with pytest.raises(ValueError, match=r'once per device: no per-worker arguments \(candidate\)'):
    step(state, x, y, candidate=jax.device_put(np.zeros(8, np.int32), workers.sharding))


@pytest.mark.parametrize(
  'model_name, tx_name, shape, against',
  [('cnn', 'topk_split', (8, 8, 1), 'vmap'), ('cnn', 'dgc_split', (8, 8, 1), 'loop'),
   ('resnet', 'topk_split', (8, 8, 3), 'loop')],
)  # fmt: skip
def test_device_splits_compressed_allreduce_at_the_collective(model_name, tx_name, shape, against):
  """8 workers on 2 devices, error feedback (Top-k; DGC: sampled, with momentum correction
  and warm-up stages) and SGD momentum: the
  state holds 2 models and 2 momenta, but 8 residuals; each worker compresses its own
  gradient, taken at its device's model, so the run is the per-worker one ('loop', whose
  gradients are computed the same way, or 'vmap': a Top-k selection may flip on a near tie
  where the gradients differ by float reassociation, as ResNet-20's do)."""
  model = _model(model_name)
  device, device_losses = _train(model, tx_name, shape, 'device')
  device_wires = _train.wires
  other, other_losses = _train(model, tx_name, shape, against)
  worker_state, device_state = device.opt_state
  for leaf in jax.tree.leaves((device.params, device.model_state, device_state)):
    assert leaf.shape[0] == 2
  for leaf in jax.tree.leaves(worker_state):
    assert leaf.shape[0] == 8
  residual = np.asarray(worker_state.residual[0])
  assert residual.shape == (8, sum(p.size for p in jax.tree.leaves(device.params)) // 2)
  assert np.all(np.isfinite(residual)) and not np.allclose(residual[0], residual[1])
  per_worker = lambda t: jax.tree.map(lambda a: np.repeat(np.asarray(a), PER_WORKER, axis=0), t)
  _assert_same(
    (per_worker(device.params), device_losses, worker_state, per_worker(device_state)),
    (other.params, other_losses, *other.opt_state),
  )
  device_mean = lambda a: np.asarray(a).reshape(2, PER_WORKER, *a.shape[1:]).mean(1)
  _assert_same(device.model_state, jax.tree.map(device_mean, other.model_state))
  # every worker's all-gather (of this step's warm-up stage) ran once a step, counted per
  # worker as in the per-worker run
  counts = [tuple(map(int, w)) for w in device_wires]
  assert counts == [tuple(map(int, w)) for w in _train.wires]
  assert [sum(c) for c in counts] == [8] * STEPS


def test_a_split_chain_refuses_counted_batches_and_a_communicating_device_part():
  model = jd.models.get('cnn', num_classes=10)
  workers = runtime.layout(8, devices=2)
  split = _txs(workers)['topk_split']
  with pytest.raises(ValueError, match='SplitChain takes uniform batches: not with counted'):
    step_lib.make_train_step(model, split, workers, counted=True, per_worker='device')
  talks = step_lib.SplitChain(split.workers, _txs(workers)['allreduce'])
  state, step, x, y = _device_step(model, talks, workers)
  with pytest.raises(ValueError, match='device part runs once per device: it must not'):
    step(state, x, y)


@pytest.mark.parametrize('tx_name', ['topk_ef', 'powersgd'])
def test_shared_is_exact_for_compressed_one_model_methods(tx_name):
  """Error feedback keeps a residual per worker, but every worker applies the same update:
  the workers' weights stay identical, so reading the first copy changes nothing."""
  model = jd.models.get('cnn', num_classes=10)
  shared, shared_losses = _train(model, tx_name, (8, 8, 1), 'shared')
  vmap, vmap_losses = _train(model, tx_name, (8, 8, 1), 'vmap')
  for kernel in jax.tree.leaves(vmap.params):
    np.testing.assert_array_equal(kernel, np.broadcast_to(kernel[:1], kernel.shape))
  _assert_same((shared.params, shared_losses), (vmap.params, vmap_losses))


def test_shared_trains_the_first_workers_model_so_local_sgd_must_not_use_it():
  """The check above can fail: where the workers' weights differ, 'shared' is not 'vmap'."""
  model = jd.models.get('cnn', num_classes=10)
  shared, _ = _train(model, 'local_sgd', (8, 8, 1), 'shared')
  vmap, _ = _train(model, 'local_sgd', (8, 8, 1), 'vmap')
  a, b = shared.params['Conv_0']['kernel'], vmap.params['Conv_0']['kernel']
  assert np.all(np.isfinite(a)) and np.abs(a - b).max() > 1e-4


def test_shared_keeps_only_the_weight_gradients_grouped():
  model = jd.models.get('resnet20', num_classes=10)  # 21 convolutions: 19 3x3 and 2 shortcuts
  workers = runtime.layout(8, devices=2)
  tx = _txs(workers)['allreduce']
  state = step_lib.make_init(model, tx, workers, (8, 8, 3))(jax.random.key(0))
  x = jax.device_put(jnp.zeros((8, PER_WORKER, 8, 8, 3)), workers.sharding)
  y = jax.device_put(jnp.zeros((8, PER_WORKER), jnp.int32), workers.sharding)
  grouped = {}
  for per_worker in ('vmap', 'shared', 'mean'):
    step = step_lib.make_train_step(model, tx, workers, per_worker=per_worker)
    text = step.lower(state, x, y).as_text()
    counts = [
      int(c) for c in re.findall(r'stablehlo.convolution.*?feature_group_count = (\d+)', text)
    ]
    assert len(counts) == 21 + 20 + 21  # forward, input gradient (not the image's), weight
    grouped[per_worker] = sum(c > 1 for c in counts)
  assert grouped == {'vmap': 62, 'shared': 21, 'mean': 0}


def test_auto_is_loop_on_the_cpu_and_its_convolutions_are_eigen_layout():
  # CIFAR shapes: with 2x2 feature maps (8x8 inputs) XLA swaps some convolutions' operands
  # (a reversed window, never Eigen's), cheap at that size but not what this test checks.
  model = jd.models.get('resnet20', num_classes=10)  # strided convolutions, 1x1 shortcuts
  workers = runtime.layout(8, devices=2)
  tx = _txs(workers)['allreduce']
  state = step_lib.make_init(model, tx, workers, (32, 32, 3))(jax.random.key(0))
  x = jax.device_put(jnp.zeros((8, 2, 32, 32, 3)), workers.sharding)
  y = jax.device_put(jnp.zeros((8, 2), jnp.int32), workers.sharding)

  def lowered(per_worker):
    return step_lib.make_train_step(model, tx, workers, per_worker=per_worker).lower(state, x, y)

  assert lowered('auto').as_text() == lowered('loop').as_text()
  text = lowered('auto').compile().as_text()
  assert ' while(' in text  # one loop body, whatever the number of workers
  labels = re.findall(r'convolution\(.*?dim_labels=(\S+?),', text)
  assert len(labels) == 62  # ResNet-20: 21 forward, 21 weight-gradient, 20 input-gradient
  assert set(labels) == {'b01f_01io->b01f'}
  assert 'feature_group_count' not in text and 'batch_group_count' not in text


def test_one_worker_per_device_stays_vmap_and_bad_arguments_are_refused():
  model = jd.models.get('mlp', num_classes=10)
  workers = runtime.layout(8, devices=8)
  tx = _txs(workers)['allreduce']
  state = step_lib.make_init(model, tx, workers, (8, 8, 1))(jax.random.key(0))
  x = jax.device_put(jnp.zeros((8, PER_WORKER, 8, 8, 1)), workers.sharding)
  y = jax.device_put(jnp.zeros((8, PER_WORKER), jnp.int32), workers.sharding)
  step = step_lib.make_train_step(model, tx, workers)
  assert 'stablehlo.while' not in step.lower(state, x, y).as_text()  # no loop over workers
  looped = step_lib.make_train_step(model, tx, workers, per_worker='loop')
  assert 'stablehlo.while' in looped.lower(state, x, y).as_text()  # what one would look like
  with pytest.raises(
    ValueError, match="per_worker must be 'auto', 'vmap', 'loop', 'shared', 'mean' or 'device'"
  ):
    step_lib.make_train_step(model, tx, workers, per_worker='scan')
  for per_worker in ('vmap', 'shared', 'mean'):
    with pytest.raises(ValueError, match=f"staggered.*per_worker='{per_worker}' contradicts"):
      step_lib.make_train_step(model, tx, workers, staggered=True, per_worker=per_worker)
  with pytest.raises(ValueError, match="per_worker='mean' hands every worker one mean gradient"):
    step_lib.make_train_step(model, tx, workers, counted=True, per_worker='mean')


def test_sums_over_few_long_rows_become_dots():
  vmapped_psum = jax.vmap(lambda g: jax.lax.psum(g, 'sim'), axis_name='sim')
  rewritten = xla_cpu.rewritten(vmapped_psum, xla_cpu.sum_rule)
  rng = np.random.default_rng(0)
  for shape, dot in (((8, 5000), True), ((8, 100), False), ((500, 16), False)):
    x = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
    np.testing.assert_allclose(rewritten(x), vmapped_psum(x), rtol=1e-5, atol=1e-5)
    text = jax.jit(rewritten).lower(x).as_text()
    assert ('stablehlo.dot_general' in text) == dot
    assert ('stablehlo.reduce' in text) != dot


def test_eval_step_evaluates_the_mean_of_the_workers_weights():
  """The eval step's mean over workers (a dot with ones on the CPU) against NumPy's."""
  model = jd.models.get('cnn', num_classes=10)
  workers = runtime.layout(64, devices=8)
  tx = _txs(workers)['local_sgd']
  state = step_lib.make_init(model, tx, workers, (8, 8, 1))(jax.random.key(0))
  rng = np.random.default_rng(1)
  params = jax.tree.map(  # workers' weights that differ, as after local steps
    lambda p: p + 0.1 * rng.standard_normal(p.shape).astype(np.float32),
    jax.device_get(state.params),
  )
  state = state._replace(params=jax.device_put(params, workers.sharding))
  sharding = jax.NamedSharding(workers.mesh, jax.sharding.PartitionSpec(runtime.DATA))
  x = rng.standard_normal((64, 8, 8, 1)).astype(np.float32)
  y = rng.integers(0, 10, 64).astype(np.int32)
  mask = np.ones(64, np.float32)
  got = step_lib.make_eval_step(model, workers)(
    state, *(jax.device_put(a, sharding) for a in (x, y, mask))
  )
  mean = jax.tree.map(
    lambda p: np.mean(np.asarray(p, np.float64), axis=0).astype(np.float32), params
  )
  logits = model.apply({'params': mean}, x, train=False)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
  assert np.isfinite(float(got['loss']))
  np.testing.assert_allclose(float(got['loss']), float(np.sum(loss)), rtol=1e-5)
  assert float(got['correct']) == float(np.sum(np.argmax(logits, -1) == y))


@pytest.mark.parametrize('tx_name, words', [('allreduce', 3), ('topk_ef', 6)])
def test_the_metrics_cross_devices_in_one_gather_beside_the_chains_own_collectives(tx_name, words):
  # words per worker: loss, accuracy and one count per transfer (one here); Top-k's chain adds
  # its probes, norms (2) and gains (1)
  model = jd.models.get('mlp', num_classes=10)
  workers = runtime.layout(8, devices=8)
  tx = _txs(workers)[tx_name]
  state = step_lib.make_init(model, tx, workers, (8, 8, 1))(jax.random.key(0))
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, PER_WORKER, 8, 8, 1), dtype=np.float32)
  y = rng.integers(0, 10, (8, PER_WORKER)).astype(np.int32)
  one = lambda p, ms, x, y: step_lib.loss_fn(model, p, ms, x, y, True)
  losses, (logits, _) = jax.vmap(one)(state.params, state.model_state, x, y)
  accuracy = np.mean(np.argmax(np.asarray(logits), -1) == y)
  x, y = (jax.device_put(a, workers.sharding) for a in (x, y))
  step = step_lib.make_train_step(model, tx, workers)
  found = comm.hlo.collectives(step.lower(state, x, y).compile().as_text())
  state, metrics = step(state, x, y)

  # the metrics' gather: `words` 32-bit words; Top-k's own gather is of 32-bit words as well
  (ran,) = comm.find_transfers(state.opt_state)  # the chain's: nothing else crosses a device
  assert ran.nbytes != 4 * words  # the two are told apart by their sizes
  (metric_gather,) = [c for c in found if c.dtypes == ('u32',) and c.nbytes == 4 * words]
  assert metric_gather.kind == 'all-gather'
  chain = [c for c in found if c is not metric_gather]
  assert {c.kind for c in chain} == {ran.kind}  # Top-k: values and indices, one gather
  assert sum(c.nbytes for c in chain) == ran.nbytes
  # the numbers are the per-worker ones, unpacked: hand-computed loss and accuracy, exact counts
  np.testing.assert_allclose(metrics['loss'], np.mean(np.asarray(losses)), rtol=1e-6)
  np.testing.assert_allclose(metrics['accuracy'], accuracy, rtol=1e-6)
  assert [int(w) for w in metrics['wire']] == [8]  # each of the 8 workers ran it once
  if tx_name == 'topk_ef':
    (probed,) = [s for s in state.opt_state if isinstance(s, jd.sync.CompressedState)]
    np.testing.assert_array_equal(metrics['norms'], np.asarray(probed.norms))
    np.testing.assert_array_equal(metrics['gains'], np.asarray(probed.gains))
    assert np.all(np.asarray(probed.norms) > 0)
