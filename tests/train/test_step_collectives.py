"""The trainer's step on the CPU sends what its method sends, packed, and nothing of its own.

Compiled for the digits CNN (8 leaves) on 8 CPU devices, one worker each: the HLO's
collectives per step, against the method's own `Transfer`s (kind and bytes).
"""

import jax
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, runtime
from jaxdist.train import step as step_lib
from jaxdist.train import step_metrics

SHAPE = (8, 8, 1)


def _compiled(tx_of, replicated=False):
  workers = runtime.layout(8, devices=8)
  model = jd.models.get('cnn', num_classes=10)
  tx = tx_of(workers.axis_name)
  state = step_lib.make_init(model, tx, workers, SHAPE)(jax.random.key(0))
  step = step_lib.make_train_step(model, tx, workers, replicated=replicated)
  x = jax.device_put(np.zeros((8, 2, *SHAPE), np.float32), workers.sharding)
  y = jax.device_put(np.zeros((8, 2), np.int32), workers.sharding)
  lowered = jax.jit(lambda s, a, b: step(s, a, b)).lower(state, x, y)
  found = comm.hlo.collectives(lowered.compile().as_text())
  return found, comm.find_transfers(state.opt_state), state


def _params_bytes(state):
  return comm.tree_nbytes(jax.tree.map(lambda p: p[0], state.params))


def test_dense_is_one_all_reduce_of_the_whole_gradient_and_no_metrics_collective():
  found, transfers, state = _compiled(
    lambda ax: optax.chain(jd.sync.allreduce(axis_name=ax), optax.sgd(0.1))
  )
  (t,) = transfers
  # conv 3x3x1x32 + 32, conv 3x3x32x64 + 64, dense 1024x128 + 128, dense 128x10 + 10, float32
  assert t.nbytes == _params_bytes(state) == 4 * (320 + 18_496 + 131_200 + 1_290)
  assert [(c.kind, c.dtypes, c.nbytes) for c in found] == [('all-reduce', ('f32',), t.nbytes)]


def test_a_replicated_step_adds_one_all_gather_of_the_metrics():
  found, _, _ = _compiled(
    lambda ax: optax.chain(jd.sync.allreduce(axis_name=ax), optax.sgd(0.1)), replicated=True
  )
  kinds = sorted(c.kind for c in found)
  assert kinds == ['all-gather', 'all-reduce'], found


def test_local_sgd_averages_in_one_all_reduce_inside_the_sync_branch_only():
  found, transfers, state = _compiled(
    lambda ax: optax.chain(optax.sgd(0.1), jd.sync.local_sgd(4, axis_name=ax))
  )
  (t,) = transfers
  assert t.nbytes == _params_bytes(state)
  assert len(found) == 1 and found[0].kind == 'all-reduce' and found[0].dtypes == ('f32',)
  assert found[0].nbytes == t.nbytes
  assert 'main' not in found[0].computation  # in a conditional's branch, not every step's


def test_powersgd_sends_p_and_q_as_one_all_reduce_each():
  """P (with the uncompressed vectors beside it) and Q: two all-reduces of one operand each,
  the bytes of the method's two transfers."""
  found, transfers, _ = _compiled(
    lambda ax: optax.chain(jd.sync.powersgd(2, axis_name=ax), optax.sgd(0.1))
  )
  want = sorted((t.kind, t.nbytes) for t in transfers)
  assert len(want) == 2
  assert sorted((c.kind, c.nbytes) for c in found) == want
  assert all(c.dtypes == ('f32',) for c in found), found


@pytest.mark.parametrize('counted', [False, True])
def test_the_host_reduces_per_worker_metrics_as_the_step_does(counted):
  loss = np.array([1.0, 2.0, 3.0, 6.0], np.float32)
  acc = np.array([0.5, 0.25, 1.0, 0.0], np.float32)
  counts = (np.array([1, 1, 2, 4], np.int32),) if counted else ()
  raw = step_metrics.RawMetrics(
    {'loss': loss, 'accuracy': acc},
    counts,
    [[np.array([1, 1, 1, 1], np.int32), np.zeros(4, np.int32)]],
    {},
  )
  got = step_metrics.reduce_metrics(raw, [1])
  if counted:  # weighted by examples: (1 + 2 + 6 + 24) / 8, (0.5 + 0.25 + 2 + 0) / 8
    assert got['loss'] == pytest.approx(33 / 8) and got['accuracy'] == pytest.approx(2.75 / 8)
  else:
    assert got['loss'] == pytest.approx(3.0) and got['accuracy'] == pytest.approx(0.4375)
  assert got['wire'] == (4, 0)
