"""Dynamic batching's allocation and proportional controller (jaxdist.control).

Hand-worked numbers beside each case; the H-levels and the batches that
equalise them, (22, 30, 44) at H2 and (5, 42, 49) at H10 for G = 96, come from
research/ALGORITHMS.md §3 (Tyagi & Sharma, ACSOS 2020, §V: cores (9, 12, 18)
and (2, 17, 20)).
"""

import numpy as np
import pytest

from jaxdist import control
from jaxdist.control import allocate, dynamic_batching
from jaxdist.netmodel import Cluster, WorkerClock

E = 0.01  # seconds per example of a speed-1 worker


# --- static allocation -----------------------------------------------------------


def test_allocate_is_proportional_with_largest_remainder():
  # 10 · (1, 1, 2) / 4 = (2.5, 2.5, 5): floors (2, 2, 5), one left: the tie goes to worker 0
  np.testing.assert_array_equal(allocate(10, (1, 1, 2)), [3, 2, 5])
  # 96 · (9, 12, 18) / 39 = (22.15, 29.54, 44.31): floors sum to 95, worker 1 has the largest rest
  np.testing.assert_array_equal(allocate(96, (9, 12, 18)), [22, 30, 44])
  # (4.92, 41.85, 49.23): floors sum to 94; workers 0 and 1 get one each
  np.testing.assert_array_equal(allocate(96, (2, 17, 20)), [5, 42, 49])
  np.testing.assert_array_equal(allocate(8, (1, 1, 1, 1)), [2, 2, 2, 2])


def test_allocate_water_fills_the_bounds():
  # (1, 1, 10) of 12: worker 2 capped at 6, the 6 left split evenly
  np.testing.assert_array_equal(allocate(12, (1, 1, 10), b_max=6), [3, 3, 6])
  # (1, 10, 10) of 12 = (0.57, 5.71, 5.71): worker 0 raised to 3, 9 left as 4.5 + 4.5
  np.testing.assert_array_equal(allocate(12, (1, 10, 10), b_min=3), [3, 5, 4])
  # H10 with OmniLearn's bounds [16, 96]: worker 0 held at 16, 80 left as 17:20
  # = (36.76, 43.24): floors (36, 43), one more to worker 1 (rest .76 vs .24)
  np.testing.assert_array_equal(allocate(96, (2, 17, 20), b_min=16), [16, 37, 43])
  # everyone at a bound
  np.testing.assert_array_equal(allocate(9, (1, 5, 100), b_min=3, b_max=3), [3, 3, 3])


def test_allocate_keeps_the_sum_and_bounds_for_any_weights():
  rng = np.random.default_rng(0)
  for _ in range(500):
    k = int(rng.integers(1, 9))
    b_min = int(rng.integers(1, 8))
    b_max = b_min + int(rng.integers(0, 60))
    g = int(rng.integers(k * b_min, k * b_max + 1))
    b = allocate(g, rng.lognormal(0, 2, k), b_min, b_max)
    assert b.sum() == g and b.min() >= b_min and b.max() <= b_max, (g, b_min, b_max, b)


# --- the controller, by hand -------------------------------------------------------


def test_uniform_and_static_starts():
  ctl = dynamic_batching(96)
  np.testing.assert_array_equal(ctl.init(3).batches, [32, 32, 32])
  np.testing.assert_array_equal(ctl.init(3, throughputs=(2, 17, 20)).batches, [5, 42, 49])
  np.testing.assert_array_equal(dynamic_batching(10).init(3).batches, [4, 3, 3])


def test_one_adjustment_is_b_times_mean_time_over_time_rescaled_to_the_global_batch():
  ctl = dynamic_batching(12, interval=1)
  state = ctl.update(ctl.init(2), [3.0, 1.0])
  # t̄ = 2: candidates 6 · 2/3 = 4 and 6 · 2/1 = 12 (sum 16), scaled by 12/16: (3, 9)
  np.testing.assert_array_equal(state.batches, [3, 9])
  assert state.adjustments == 1 and np.isnan(state.mean_s).all() and state.observed == 0
  # throughputs 2 and 6 examples/s: both now take 1.5 s, inside the dead-band
  same = ctl.update(state, [1.5, 1.5])
  np.testing.assert_array_equal(same.batches, [3, 9])
  assert same.adjustments == 1


def test_three_workers_by_hand():
  ctl = dynamic_batching(30, interval=1)
  # b = (10, 10, 10), t = (1, 2, 4): X = (10, 5, 2.5), 30 · X / 17.5 = (17.14, 8.57, 4.29)
  # floors (17, 8, 4) = 29; the largest rest is worker 1's (.57)
  state = ctl.update(ctl.init(3), [1.0, 2.0, 4.0])
  np.testing.assert_array_equal(state.batches, [17, 9, 4])


def test_dead_band():
  ctl = dynamic_batching(12, interval=1, deadband=0.05)
  start = ctl.init(2)
  # t̄ = 1.02, |t - t̄| / t̄ = 0.0196 <= 0.05: nothing changes
  inside = ctl.update(start, [1.0, 1.04])
  np.testing.assert_array_equal(inside.batches, [6, 6])
  assert inside.adjustments == 0 and inside.observed == 0
  # t̄ = 1.1, 0.0909 > 0.05: X = (6, 5), 12 · X / 11 = (6.55, 5.45): (7, 5)
  outside = ctl.update(start, [1.0, 1.2])
  np.testing.assert_array_equal(outside.batches, [7, 5])
  # a wider band holds it
  wide = dynamic_batching(12, interval=1, deadband=0.1).update(start, [1.0, 1.2])
  np.testing.assert_array_equal(wide.batches, [6, 6])


def test_ewma_and_interval():
  ctl = dynamic_batching(12, interval=3, decay=0.5)
  state = ctl.init(2)
  state = ctl.update(state, [1.0, 1.0])  # µ = t at the first observation
  state = ctl.update(state, [2.0, 1.0])  # 0.5 · 1 + 0.5 · 2 = 1.5
  np.testing.assert_allclose(state.mean_s, [1.5, 1.0])
  assert state.observed == 2
  np.testing.assert_array_equal(state.batches, [6, 6])  # no decision before `interval`
  state = ctl.update(state, [4.0, 1.0])  # µ = 0.75 + 2 = 2.75; decide on (2.75, 1)
  # X = (6/2.75, 6) = (2.18, 6): 12 · X / 8.18 = (3.2, 8.8): floors (3, 8), worker 1's rest .8
  np.testing.assert_array_equal(state.batches, [3, 9])
  assert state.adjustments == 1


def test_bounds_stop_the_controller():
  ctl = dynamic_batching(12, b_min=5, b_max=7, interval=1)
  state = ctl.update(ctl.init(2), [3.0, 1.0])  # wants (3, 9); the bounds allow (5, 7)
  np.testing.assert_array_equal(state.batches, [5, 7])
  again = ctl.update(state, [2.5, 7 / 6])  # still unequal, but (5, 7) is as far as it goes
  np.testing.assert_array_equal(again.batches, [5, 7])
  assert again.adjustments == 1 and not np.isnan(again.mean_s).any()


def test_sum_and_bounds_hold_after_every_adjustment_under_noise():
  rng = np.random.default_rng(1)
  ctl = dynamic_batching(64, b_min=4, b_max=40, interval=2, deadband=0.02)
  speeds = np.array([0.3, 1.0, 1.7, 2.5])
  state = ctl.init(4)
  for _ in range(200):
    times = state.batches / speeds * rng.lognormal(0, 0.2, 4) + 0.01
    state = ctl.update(state, times)
    assert state.batches.sum() == 64
    assert state.batches.min() >= 4 and state.batches.max() <= 40
  assert state.adjustments > 2


# --- simulated H2 and H10 clusters -----------------------------------------------


@pytest.mark.parametrize(
  'level, want', [('h2', [22, 30, 44]), ('h10', [5, 42, 49])], ids=['H2', 'H10']
)
def test_iteration_times_equalise_in_one_adjustment_without_fixed_cost(level, want):
  cluster = Cluster.from_cores(level)
  ctl = dynamic_batching(96, interval=1)
  state = ctl.update(ctl.init(3), cluster.compute_seconds(0, [32, 32, 32], E))
  np.testing.assert_array_equal(state.batches, want)
  t = cluster.compute_seconds(1, state.batches, E)
  assert np.abs(t - t.mean()).max() <= 0.05 * t.mean()


@pytest.mark.parametrize('level', ['h2', 'h10'], ids=['H2', 'H10'])
def test_iteration_times_equalise_within_two_adjustments_on_the_modelled_clock(level):
  """Times = a fixed 20 ms per iteration + batch / speed · e; BSP waits for the slowest."""
  cluster = Cluster.from_cores(level)
  ctl = dynamic_batching(96, interval=5, decay=0.5)
  steps = 40
  clocks = {'uniform': WorkerClock(cluster, E), 'dynamic': WorkerClock(cluster, E)}
  state, spread, adjusted_at = ctl.init(3), [], []
  for t in range(steps):
    clocks['uniform'].advance([32, 32, 32], comm_s=0.02)
    times = clocks['dynamic'].advance(state.batches, comm_s=0.02) + 0.02
    spread.append(np.abs(times - times.mean()).max() / times.mean())
    before = state.adjustments
    state = ctl.update(state, times)
    if state.adjustments > before:
      adjusted_at.append(t)
  assert 1 <= len(adjusted_at) <= 2, adjusted_at
  assert max(spread[adjusted_at[-1] + 1 :]) <= 0.05  # equal within the dead-band ever after
  assert spread[0] > 0.3
  # the dynamic run's modelled clock is ahead: the slowest no longer holds everyone back
  speedup = clocks['uniform'].total_s / clocks['dynamic'].total_s
  assert speedup > {'h2': 1.2, 'h10': 2.5}[level], speedup


# --- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(global_batch=0), 'global_batch must be >= 1'),
    (dict(global_batch=32, b_min=0), 'b_min must be >= 1'),
    (dict(global_batch=32, b_min=16, b_max=8), 'b_min must be <= b_max, got b_min=16 > b_max=8'),
    (dict(global_batch=32, deadband=1.0), r'deadband must be in \[0, 1\), got 1.0'),
    (dict(global_batch=32, decay=-0.1), r'decay must be in \[0, 1\)'),
    (dict(global_batch=32, interval=0), 'interval must be >= 1'),
  ],
)
def test_bad_controller_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    dynamic_batching(**kwargs)


def test_bad_allocation_and_observations():
  with pytest.raises(ValueError, match=r'cannot be split over 3 workers within \[b_min, b_max\]'):
    dynamic_batching(32, b_min=16).init(3)
  with pytest.raises(ValueError, match='cannot be split over 2 workers'):
    allocate(100, (1, 1), b_max=40)
  with pytest.raises(ValueError, match='weights must all be finite and > 0'):
    allocate(10, (1, 0))
  ctl = dynamic_batching(32)
  with pytest.raises(ValueError, match=r'throughputs must have one value per worker \(3\)'):
    ctl.init(3, throughputs=(1, 2))
  with pytest.raises(ValueError, match=r'times must have one value per worker \(2\)'):
    ctl.update(ctl.init(2), [1.0, 2.0, 3.0])
  with pytest.raises(ValueError, match='times must all be finite and > 0'):
    ctl.update(ctl.init(2), [1.0, 0.0])
  assert control.DynamicBatchingState._fields == ('batches', 'mean_s', 'observed', 'adjustments')


def test_micro_batch_multiples_by_hand():
  # H10's cores (2, 17, 20) over 96 / 8 = 12 micro-batches: 12 · w / 39 = 0.62, 5.23, 6.15;
  # floors 0, 5, 6 (0 raised to b_min = 1 unit), then 12 - 12 = 0 left: (1, 5, 6) units
  np.testing.assert_array_equal(allocate(96, (2, 17, 20), multiple=8), [8, 40, 48])
  # b_min = 9 examples rounds up to 2 units of 8; b_max = 30 down to 3
  np.testing.assert_array_equal(
    allocate(48, (1, 10, 10), b_min=9, b_max=30, multiple=8), [16, 16, 16]
  )
  ctl = dynamic_batching(96, multiple=8, interval=1)
  state = ctl.update(ctl.init(3), [1.0, 0.25, 0.25])  # X ∝ (32, 128, 128) -> 12 · X / ΣX
  # 1.33, 5.33, 5.33 units: floors 1, 5, 5; the unit left to the lowest of equal remainders
  np.testing.assert_array_equal(state.batches, [16, 40, 40])
  assert all(b % 8 == 0 for b in state.batches) and state.batches.sum() == 96


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(multiple=7), 'global batch 96 must be a multiple of multiple=7'),
    (dict(multiple=0), 'must be a multiple of multiple=0'),
    (dict(multiple=8, b_max=4), 'b_max=4 holds no whole micro-batch of multiple=8'),
  ],
)
def test_bad_multiples(kwargs, match):
  with pytest.raises(ValueError, match=match):
    dynamic_batching(96, **kwargs)
