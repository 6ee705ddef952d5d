"""config.fault's simulated failures: a straggling worker, a worker that drops out and rejoins."""

import jax
import numpy as np
import optax
import pytest

from jaxdist import netmodel
from jaxdist.faults import inject
from jaxdist.train import config as config_lib
from jaxdist.train import factory, ledger
from jaxdist.train import step as step_lib

from conftest import REPO, run_digits

# --- parsing and bad input -------------------------------------------------------------------


def test_specs_parse_and_bad_ones_name_the_key_and_the_form():
  assert inject.parse_straggles('', 4) == ()
  assert inject.parse_drops(' 1@3 ', 4) == (inject.Drop(1, 3, None),)
  assert inject.alive(inject.parse_drops('0@2-4,2@3', 3), 3, 3).tolist() == [False, True, False]
  assert inject.alive(inject.parse_drops('0@2-4,2@3', 3), 3, 4).tolist() == [True, True, False]
  bad = [
    (inject.parse_straggles, 'straggle', '3:4@100', r"'worker:factor@start-end'"),
    (inject.parse_straggles, 'straggle', '2:4@0-5', r'names worker 2, but the run has 2 workers'),
    (inject.parse_straggles, 'straggle', '1:0.5@0-5', r'slowdown must be >= 1'),
    (inject.parse_straggles, 'straggle', '1:2@5-5', r'end must be after start'),
    (inject.parse_drops, 'drop', '1-3', r"'worker@start' or 'worker@start-end'"),
    (inject.parse_drops, 'drop', '2@4', r'names worker 2, but the run has 2 workers'),
    (inject.parse_drops, 'drop', '0@5-3', r'end must be after start'),
    (inject.parse_drops, 'drop', '0@5,1@2-9', r'leaves no worker at step 6'),
  ]
  for parse, key, text, message in bad:
    with pytest.raises(ValueError, match=rf'config.fault.{key}: .*{message}'):
      parse(text, 2)


def test_drop_needs_the_weighted_allreduce_and_fixed_batches(tmp_path):
  def build(**overrides):
    config = factory.load_config(f'{REPO}/configs/digits.py:runlocal', **overrides)
    return factory.build(config, str(tmp_path / 'w'))

  local = r"fault.drop=.*needs sync.method=allreduce, got 'local_sgd'"
  with pytest.raises(factory.ConfigError, match=local):
    build(**{'fault.drop': '1@2', 'sync.method': 'local_sgd'})
  with pytest.raises(factory.ConfigError, match=r"batching='dynamic'.*use batching='uniform'"):
    build(**{'fault.drop': '1@2', 'batching': 'dynamic', 'cluster.speeds': '1,1,1,1,1,1,1,1'})
  with pytest.raises(factory.ConfigError, match=r'config.fault.straggle: .*names worker 9'):
    build(**{'fault.straggle': '9:2@0-4'})
  assert not (tmp_path / 'w').exists()  # nothing written


# --- a straggler on the modelled clock ---------------------------------------------------------


def test_straggles_slow_one_worker_on_their_steps_and_each_rule_waits_its_way():
  # 3 workers, 1 s per step each; worker 1 is 3x slower on step 0, worker 2 3x on step 1.
  cluster = netmodel.Cluster.uniform(3, straggles=((1, 3.0, 0, 1), (2, 3.0, 1, 2)))
  assert cluster.compute_seconds(0, 1, 1.0).tolist() == [1, 3, 1]
  assert cluster.compute_seconds(1, 1, 1.0).tolist() == [1, 1, 3]
  assert cluster.compute_seconds(2, 1, 1.0).tolist() == [1, 1, 1]
  bsp = netmodel.simulate(cluster, np.ones(3), 1.0, wait='bsp')
  assert bsp.step_s.tolist() == [3, 3, 1]  # everyone waits for the slow one, twice
  asynchronous = netmodel.simulate(cluster, np.ones(3), 1.0, wait='async')
  assert asynchronous.finish_s[-1].tolist() == [3, 5, 5]  # each worker only its own delay
  assert asynchronous.total_s == 5 and bsp.total_s == 7
  with pytest.raises(ValueError, match=r'straggles\[0\] must be'):
    netmodel.Cluster.uniform(3, straggles=((3, 2.0, 0, 1),))


def test_fault_straggle_builds_a_cluster_whose_bsp_clock_pays_it():
  config = config_lib.base()
  config.workers = 4
  config.fault.straggle = '1:5@0-2'
  cluster = factory.build_cluster(
    config.cluster, 4, inject.parse_straggles(config.fault.straggle, 4)
  )
  assert cluster.speeds == (1.0,) * 4  # equal workers: only the straggle differs
  rs = [{'step': t + 1, 'comm_s@net': 0.5} for t in range(4)]
  clock = factory.worker_clock(config, cluster, 1.0)
  # steps 1-2: 5 s (worker 1) + 0.5 s; steps 3-4: 1 s + 0.5 s
  assert [t for _, t in ledger.modelled_clock(rs, 'net', 1.0, clock)] == [5.5, 11, 12.5, 14]
  assert factory.build_cluster(config_lib.base().cluster, 4, ()) is None


# --- a worker that drops out -------------------------------------------------------------------


SGD = {
  'model.name': 'mlp',
  'optimizer.momentum': 0.0,
  'optimizer.nesterov': False,
  'optimizer.weight_decay': 0.0,
  'optimizer.schedule': 'constant',
  'optimizer.warmup_steps': 0,
  'batch_size': 48,
  'noise_every': 0,
  'eval_every': 100,
}


def reference_params(tmp_path, overrides, steps, alive):
  """One device, plain SGD on the examples of the workers `alive(t)` names, step by step."""
  config = factory.load_config(f'{REPO}/configs/digits.py:runlocal,workers=3', **overrides)
  exp = factory.build(config, str(tmp_path / 'reference'))
  ds = exp.dataset
  params, model_state = step_lib.init_params(exp.model, jax.random.key(config.seed), ds.image_shape)
  tx = optax.sgd(config.optimizer.learning_rate)
  opt_state = tx.init(params)
  step = step_lib.make_reference_step(exp.model, tx)
  for t in range(steps):
    parts = exp.sampler.indices(t, [exp.per_worker] * 3).indices
    idx = np.concatenate([parts[k] for k in range(3) if alive(t)[k]])
    x, y = ds.normalize(ds.train.images[idx]), ds.train.labels[idx]
    params, model_state, opt_state, _ = step(params, model_state, opt_state, x, y)
  return params


def test_a_dropped_worker_is_left_out_of_the_mean_and_rejoins_with_the_live_model(
  tmp_path, data_dir, monkeypatch
):
  # worker 2 is gone for steps 2-3 (after step 1 until after step 3), back for step 4
  overrides = {**SGD, 'steps': 4, 'fault.drop': '2@1-3'}
  _, records, params = run_digits(tmp_path, 'drop', data_dir, monkeypatch, **overrides)
  assert [r['batches'] for r in records] == [[16, 16, 16], [16, 16, 0], [16, 16, 0], [16] * 3]
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  want = reference_params(tmp_path, overrides, 4, lambda t: [True, True, not 1 <= t < 3])
  for got, ref in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
    assert np.all(np.isfinite(got))
    for k in range(3):  # every replica, the dropped one too, holds the reference model
      np.testing.assert_allclose(got[k], ref, rtol=2e-5, atol=2e-6)
  # against the run where nobody drops: the models differ (the drop did something)
  kept = reference_params(tmp_path, overrides, 4, lambda t: [True] * 3)
  pairs = zip(jax.tree.leaves(want), jax.tree.leaves(kept), strict=True)
  diff = max(float(np.abs(a - b).max()) for a, b in pairs)
  assert diff > 1e-4


def test_a_drop_after_the_last_step_trains_like_the_plain_allreduce(
  tmp_path, data_dir, monkeypatch
):
  plain = run_digits(tmp_path, 'plain', data_dir, monkeypatch, steps=3)
  never = run_digits(tmp_path, 'never', data_dir, monkeypatch, steps=3, **{'fault.drop': '0@50'})
  assert [r['batches'] for r in never[1]] == [[32, 32, 32]] * 3
  for a, b in zip(jax.tree.leaves(plain[2]), jax.tree.leaves(never[2]), strict=True):
    assert np.all(np.isfinite(b))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
