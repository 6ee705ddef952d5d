"""Heterogeneity-aware DiLoCo's window (`jd.control.Window`, `batches(mode='window')`).

Hand-worked numbers beside each case: h_k = clip(⌊H · min_j t_j / t_k⌋, 1, H).
"""

import numpy as np
import pytest

from jaxdist import control
from jaxdist.netmodel import Cluster


def test_steps_by_hand():
  w = control.Window(4)
  # times 1, 1/0.85, 10: 4·1 = 4; 4·0.85 = 3.4 -> 3; 4·0.1 = 0.4 -> 0, clipped to 1
  np.testing.assert_array_equal(w.steps([1.0, 1 / 0.85, 10.0]), [4, 3, 1])
  # equal workers take every step: plain DiLoCo
  np.testing.assert_array_equal(w.steps([0.3, 0.3, 0.3]), [4, 4, 4])
  # H = 10, times 2, 3, 5 s: 10·2/3 = 6.67 -> 6; 10·2/5 = 4
  np.testing.assert_array_equal(control.Window(10).steps([2.0, 3.0, 5.0]), [10, 6, 4])
  # H = 1: every worker takes the round's one step
  np.testing.assert_array_equal(control.Window(1).steps([1.0, 100.0]), [1, 1])


def test_counts_by_slot():
  w, uniform = control.Window(4), np.full(3, 32)
  times = [1.0, 1 / 0.85, 10.0]
  got = [w.counts(t, times, uniform).tolist() for t in range(8)]
  slots = [[32, 32, 32], [32, 32, 0], [32, 32, 0], [32, 0, 0]]
  assert got == slots * 2


@pytest.mark.parametrize(
  'times', [[1.0, 0.0], [1.0, -2.0], [1.0, float('nan')], [[1.0, 2.0]]], ids=str
)
def test_bad_times(times):
  with pytest.raises(ValueError, match='times must be'):
    control.Window(4).steps(times)


def test_bad_period():
  with pytest.raises(ValueError, match='period must be >= 1'):
    control.Window(0)


def test_batches_plans_each_round_from_its_first_step():
  # speeds 1, 0.5, 0.25 at 0.01 s an example and 8 examples: t = 0.08, 0.16, 0.32;
  # H = 4: h = 4, 2, 1. A straggle slows worker 0 by 8x on steps 4..5 (0.64 s): the round
  # starting at step 4 is planned from it, h = ⌊4·0.16/0.64⌋ = 1 -> 1, 4, ⌊4·0.16/0.32⌋ = 2
  cluster = Cluster((1.0, 0.5, 0.25), straggles=((0, 8.0, 4, 6),))
  ctl = control.batches(
    control.Window(4), 'window', num_workers=3, global_batch=24, cluster=cluster,
    per_example_s=0.01, comm_s=lambda t: 0.0,
  )  # fmt: skip
  state = ctl.init()
  counts = [ctl.plan(state, t).counts.tolist() for t in range(8)]
  first = [[8, 8, 8], [8, 8, 0], [8, 0, 0], [8, 0, 0]]
  second = [[8, 8, 8], [0, 8, 8], [0, 8, 0], [0, 8, 0]]
  assert counts == first + second
  plan = ctl.plan(state, 1)
  assert plan.batches is None and not plan.needs_last  # every worker holds B / K
  _, fields = ctl.observe(state, control.Record(step=2, plan=plan, fields={}, fetched={}))
  assert fields['batches'] == [8, 8, 0]
  np.testing.assert_allclose(fields['compute_s'], [0.08, 0.16, 0.0], equal_nan=False)


def test_batches_window_needs_a_cluster():
  with pytest.raises(ValueError, match=r"batching='window'.*give a cluster"):
    control.batches(
      control.Window(4), 'window', num_workers=2, global_batch=8, cluster=None,
      per_example_s=0.01, comm_s=lambda t: 0.0,
    )  # fmt: skip
