"""The one moving average the controllers share, and ScaDLES's rule on it, by hand."""

import numpy as np
import pytest

from jaxdist import control


def test_ewma_by_hand_and_its_degenerate_decays():
  assert control.ewma(None, 2.0, 0.9) == 2.0
  assert control.ewma(1.0, 2.0, 0.75) == 1.25
  assert control.ewma(1.0, 2.0, 0.0) == 2.0  # no memory: the new value
  got = control.ewma(np.array([np.nan, 1.0, 4.0]), np.array([3.0, 3.0, 0.0]), 0.5)
  np.testing.assert_array_equal(got, [3.0, 2.0, 2.0])  # NaN: nothing seen yet


def test_scadles_votes_by_majority_on_each_workers_own_averages():
  rule = control.scadles_compression(4, delta=0.3, decay=0.5)
  sq = np.array([1.0, 1.0, 1.0, 1.0])
  state, compress = rule.update(rule.init(), sq, np.array([0.8, 0.8, 0.1, 0.1]))
  assert not compress  # two of four within δ: half is not a majority
  np.testing.assert_array_equal(state.sums[:, 1], [0.8, 0.8, 0.1, 0.1])
  state, compress = rule.update(state, sq, np.array([0.8, 0.8, 0.9, 0.1]))
  np.testing.assert_array_equal(state.sums[:, 1], [0.8, 0.8, 0.5, 0.1])
  assert not compress  # worker 2's average is 0.5: signal 0.5 > δ
  state, compress = rule.update(state, sq, np.array([0.8, 0.8, 1.0, 0.1]))
  assert state.sums[2, 1] == 0.75 and compress  # worker 2's signal 0.25: three of four


@pytest.mark.parametrize('delta, decay', [(-0.1, 0.5), (1.1, 0.5), (0.3, 1.0), (0.3, -0.1)])
def test_scadles_refuses_bad_settings(delta, decay):
  with pytest.raises(ValueError, match='must be in'):
    control.scadles_compression(2, delta=delta, decay=decay)
