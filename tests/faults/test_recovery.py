"""CPR's bookkeeping (`jaxdist.faults.recovery.Recovery`) by hand, without training."""

import numpy as np
import pytest

from jaxdist.faults import cpr
from jaxdist.faults.recovery import Recovery

COSTS = cpr.Costs(step_s=1.0, save_s=0.5, load_s=2.0, restart_s=1.0, mttf_s=100.0)


def _recovery(strategy, times, workers_failed):
  rows = (np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32))  # 2 tables of 4 rows
  trace = cpr.Failures(np.asarray(times, float), np.asarray(workers_failed, np.int64))
  return Recovery(strategy, COSTS, trace, rows, {'w': np.zeros(1)}, workers=2, batch_size=2,
                  ssu_oversample=2.0, seed=0)  # fmt: skip


def test_partial_recovery_restores_the_failed_shard_and_charges_the_clock():
  r = _recovery(cpr.Strategy('partial', 'partial', 2), [2.5], [1])
  now = lambda v: (np.full((2, 4), v, np.float32), np.full((2, 4), -v, np.float32))
  r.stepped(np.array([[0, 1], [0, 2]]))  # batch of 2, one id per table
  assert r.next_failure(1, 10) is None and r.clock == 1.0  # the failure is at 2.5
  r.checkpoint(1, 10, lambda: pytest.fail('not due'), lambda: pytest.fail('not due'))
  r.stepped(np.array([[3, 3], [3, 3]]))
  r.checkpoint(2, 10, lambda: now(2.0), lambda: {'w': np.ones(1)})  # a full save: 0.5 s
  assert (r.clock, r.full_saves, r.rows_written, r.ckpt_step) == (2.5, 1, 8, 2)
  assert not r.counts.any()
  r.stepped(np.array([[1, 1], [1, 1]]))  # table 0 row 1 and table 1 row 1, twice each
  assert r.next_failure(3, 10) == 1 and r.next_failure(3, 10) is None
  back = r.fail(1, 3, now(3.0))
  # worker 1's shard is table 1: its 2 lookups since the save are lost, and the 2 samples
  # of the one step since it; restart 1 s + a shard's load 2 s / 2 workers
  assert (back.step, back.mlp) == (3, None)
  np.testing.assert_array_equal(back.tables, [[3.0] * 4, [2.0] * 4])
  np.testing.assert_array_equal(back.accum, [[-3.0] * 4, [-2.0] * 4])
  assert (r.lost_updates, r.lost_samples, r.recovery_s, r.clock) == (2, [2], 2.0, 5.5)
  s = r.summary(3)
  assert s['lost_updates'] == 2 / (3 * 2 * 2) and s['failures'] == 1
  assert s['total_s'] == 5.5 and s['total_overhead'] == (5.5 - 3.0) / 3.0


def test_full_recovery_goes_back_to_the_checkpoint():
  r = _recovery(cpr.Strategy('full', 'full', 2), [3.0], [0])
  for t in (1, 2, 3):
    r.stepped(np.array([[0, 0], [1, 1]]))
    r.checkpoint(t, 10, lambda: (np.ones((2, 4)), np.ones((2, 4))), lambda: {'w': np.ones(1)})
  assert r.clock == 3.5 and r.next_failure(3, 10) == 0  # saved after step 2
  back = r.fail(0, 3, (np.zeros((2, 4)), np.zeros((2, 4))))
  assert back.step == 2 and back.mlp == {'w': np.ones(1)}
  np.testing.assert_array_equal(back.tables, np.ones((2, 4)))
  assert (r.lost_s, r.recovery_s, r.clock) == (1.0, 3.0, 6.5)  # 1 step lost, restart + load


def test_no_recovery_sees_no_failures():
  r = _recovery(cpr.Strategy('none', 'none', 0), [0.5], [0])
  r.stepped(np.array([[0, 0], [0, 0]]))
  assert r.next_failure(1, 10) is None
  r.checkpoint(1, 10, lambda: pytest.fail('none saves'), lambda: pytest.fail('none saves'))
