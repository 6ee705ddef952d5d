"""Heterogeneity-aware DiLoCo in the trainer: `batching='window'` with `sync.diloco.by_steps`.

The outer step's arithmetic is checked against NumPy in tests/sync/test_steps_diloco.py and
the window's counts by hand in tests/control/test_window.py; here, that the trainer wires
them: equal workers train as plain DiLoCo, and unequal ones sit out the steps past their
window, computing nothing.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import testing
from jaxdist.train import factory

from conftest import REPO, run_digits

DILOCO = {'sync.method': 'diloco', 'sync.diloco.period': 4, 'steps': 8}
WINDOW = {**DILOCO, 'batching': 'window', 'sync.diloco.by_steps': True}


def test_equal_workers_train_as_plain_diloco_and_unequal_ones_sit_out(
  tmp_path, data_dir, monkeypatch
):
  plain = run_digits(tmp_path, 'plain', data_dir, monkeypatch, **DILOCO)
  equal = run_digits(
    tmp_path, 'equal', data_dir, monkeypatch, **WINDOW, **{'cluster.speeds': '1,1,1'}
  )
  leaves = jax.tree.leaves(plain[2])
  assert len(leaves) == len(jax.tree.leaves(equal[2])) > 0
  for a, b in zip(leaves, jax.tree.leaves(equal[2]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=False)
  assert [r['batches'] for r in equal[1]] == [[32, 32, 32]] * 8

  # speeds 1, 0.85, 0.1 (a compute term given: 0.01 s for 32 examples at speed 1): worker 1
  # fits ⌊4 · 0.85⌋ = 3 steps of 4, worker 2 ⌊0.4⌋ -> 1; the round waits for worker 2's one
  unequal = run_digits(
    tmp_path, 'unequal', data_dir, monkeypatch, **WINDOW, **{'cluster.speeds': '1,0.85,0.1'}
  )
  rounds = [[32, 32, 32], [32, 32, 0], [32, 32, 0], [32, 0, 0]] * 2
  assert [r['batches'] for r in unequal[1]] == rounds
  assert [bool(r['synced']) for r in unequal[1]] == [False, False, False, True] * 2
  # every worker holds the anchor after the last outer step, and it is not plain DiLoCo's
  for leaf in jax.tree.leaves(unequal[2]):
    assert np.all(np.isfinite(leaf)) and np.array_equal(leaf[0], leaf[2])
  assert not np.allclose(jax.tree.leaves(unequal[2])[0], leaves[0])
  # the modelled round: worker 2's one step (0.1 s) against worker 0's four (0.04 s)
  step_s = [r['compute_s'] for r in unequal[1][:4]]
  np.testing.assert_allclose(np.sum(step_s, axis=0), [0.04, 0.03 / 0.85, 0.1], rtol=1e-6)


def test_a_worker_out_of_its_window_keeps_its_model_and_momentum(tmp_path, data_dir, monkeypatch):
  # the factory's chain: sit_out(SGD with momentum 0.9), then diloco(by_steps=True); worker 2's
  # zero gradient on a step it sits out would still move it by the momentum without sit_out
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = factory.load_config(
    f'{REPO}/configs/digits.py:runlocal,workers=3', batch_size=96,
    **{**WINDOW, 'cluster.speeds': '1,0.85,0.1', 'optimizer.momentum': 0.9},
  )  # fmt: skip
  exp = factory.build(config, str(tmp_path / 'w'))
  assert exp.counted and exp.micro_batch == 32 and exp.held == 32  # one micro-batch or none
  run = testing.Run(exp.tx, {'x': jnp.zeros(2)}, workers=3)
  run({'x': jnp.ones((3, 2))}, weight=jnp.array([32, 32, 32]))
  before = np.asarray(run.params['x'])
  run({'x': jnp.array([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])}, weight=jnp.array([32, 32, 0]))
  after = np.asarray(run.params['x'])
  np.testing.assert_array_equal(after[2], before[2])
  assert np.all(after[0] < before[0])  # the others stepped on (the first step's rate is 0)
