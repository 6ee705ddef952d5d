"""experiments/bench_multilevel.py: the three ways give every candidate's ‖Top-k(w)‖²."""

import numpy as np

from conftest import load_experiment


def test_single_multi_level_and_prefix_sums_by_hand():
  w = np.array([3.0, -1.0, 2.0, 0.5, -4.0], np.float32)
  # k = 3: 16 + 9 + 4 = 29; k = 2: 16 + 9 = 25; k = 1: 16
  for name, f in load_experiment('bench_multilevel').functions([3, 2, 1]):
    np.testing.assert_allclose(np.asarray(f(w)), [29.0, 25.0, 16.0], rtol=1e-6, err_msg=name)
