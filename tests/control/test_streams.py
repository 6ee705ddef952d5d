"""ScaDLES's streaming model (jaxdist.control.streams).

Every expected number is worked by hand beside its case, from the update
order in the module docstring: take the batch, wait for the slowest device
(W = max wait), arrivals S · (W − w + step_s), then truncate to ⌈S · interval⌉
or persist. The rate sets (Table I) and the conventional-DDL baseline come
from research/ALGORITHMS.md §6 (Tyagi & Swany, BigData 2022).
"""

import json

import numpy as np
import pytest

from jaxdist import control
from jaxdist.control import (
  RATE_SETS,
  Arrivals,
  StreamState,
  buffer_report,
  lr_scale,
  stream_rates,
  streams,
  weights,
)
from jaxdist.control.streams import BUFFERS

# --- the update order, by hand ------------------------------------------------------


def test_two_devices_three_steps_persistence():
  # S = (10, 40), [b_min, b_max] = [8, 32]: b = (clip(10), clip(40)) = (10, 32)
  model = streams([10, 40], base_batch=64, b_max=32, buffer='persistence')
  state = model.init(2)
  np.testing.assert_array_equal(state.batches, [10, 32])
  assert state.batches.dtype == np.int64
  np.testing.assert_allclose(state.queue, [0, 0])
  np.testing.assert_allclose(state.wait_s, [1.0, 0.8])  # 10/10, 32/40: empty buffers
  # step 1, 0.5 s: W = 1.0; device 0 took at 1.0 s, device 1 at 0.8 s
  # arrivals 10 · (1.0 − 1.0 + 0.5) = 5 and 40 · (1.0 − 0.8 + 0.5) = 28
  state = model.update(state, 0.5)
  np.testing.assert_allclose(state.queue, [5, 28])
  np.testing.assert_allclose(state.wait_s, [0.5, 0.1])  # (10 − 5)/10, (32 − 28)/40
  np.testing.assert_allclose(state.elapsed_s, 1.5)  # W + step_s
  # step 2, 2.0 s: W = 0.5; arrivals 10 · 2.0 = 20 and 40 · (0.5 − 0.1 + 2.0) = 96
  state = model.update(state, 2.0)
  np.testing.assert_allclose(state.queue, [20, 96])
  np.testing.assert_allclose(state.wait_s, [0, 0])
  np.testing.assert_allclose(state.elapsed_s, 4.0)
  # step 3, 1.0 s: W = 0; left over (20 − 10, 96 − 32) = (10, 64), arrivals (10, 40)
  state = model.update(state, 1.0)
  np.testing.assert_allclose(state.queue, [20, 104])
  np.testing.assert_allclose(state.peak_queue, [20, 104])
  np.testing.assert_allclose(state.queue_sum, [5 + 20 + 20, 28 + 96 + 104])
  np.testing.assert_allclose(state.arrived, [5 + 20 + 10, 28 + 96 + 40])
  np.testing.assert_allclose(state.dropped, [0, 0])
  np.testing.assert_allclose(state.elapsed_s, 5.0)
  assert state.step == 3
  np.testing.assert_array_equal(state.batches, [10, 32])


def test_two_devices_three_steps_truncation():
  # caps ⌈(10, 40) · 1 s⌉ = (10, 40)
  model = streams([10, 40], base_batch=64, b_max=32)  # truncation is the default
  state = model.update(model.init(2), 0.5)
  np.testing.assert_allclose(state.queue, [5, 28])  # under the caps: as persistence
  state = model.update(state, 2.0)
  # held (20, 96) as above, keep the newest (10, 40): 10 and 56 dropped
  np.testing.assert_allclose(state.queue, [10, 40])
  np.testing.assert_allclose(state.dropped, [10, 56])
  np.testing.assert_allclose(state.wait_s, [0, 0])
  state = model.update(state, 1.0)
  # left over (0, 8), arrivals (10, 40): held (10, 48), kept (10, 40), 8 more dropped
  np.testing.assert_allclose(state.queue, [10, 40])
  np.testing.assert_allclose(state.dropped, [10, 64])
  np.testing.assert_allclose(state.peak_queue, [10, 40])
  np.testing.assert_allclose(state.queue_sum, [5 + 10 + 10, 28 + 40 + 40])
  np.testing.assert_allclose(state.arrived, [35, 164])  # arrivals do not depend on the buffer
  np.testing.assert_allclose(state.elapsed_s, 5.0)


def test_three_devices_with_both_clips_and_a_batch_above_the_cap():
  # S = (2.5, 20, 2000), [8, 64]: b = (8 up from 2, 20, 64 down from 2000); caps (3, 20, 2000)
  model = streams([2.5, 20, 2000], base_batch=96, b_min=8, b_max=64)
  state = model.init(3)
  np.testing.assert_array_equal(state.batches, [8, 20, 64])
  np.testing.assert_allclose(state.wait_s, [3.2, 1.0, 0.032])  # 8/2.5, 20/20, 64/2000
  # step 1, 1 s: W = 3.2; arrivals 2.5 · 1 = 2.5, 20 · (3.2 − 1 + 1) = 64,
  # 2000 · (3.2 − 0.032 + 1) = 8336; capped to (2.5, 20, 2000)
  state = model.update(state, 1.0)
  np.testing.assert_allclose(state.queue, [2.5, 20, 2000])
  np.testing.assert_allclose(state.dropped, [0, 44, 6336])
  np.testing.assert_allclose(state.wait_s, [2.2, 0, 0])  # (8 − 2.5)/2.5
  np.testing.assert_allclose(state.elapsed_s, 4.2)
  # step 2, 0.5 s: W = 2.2; left over (0, 0, 1936); arrivals 2.5 · 0.5 = 1.25,
  # 20 · 2.7 = 54, 2000 · 2.7 = 5400; held (1.25, 54, 7336), capped (1.25, 20, 2000).
  # Device 0 trains 8 > its cap of 3: what arrives while it waits goes into the batch.
  state = model.update(state, 0.5)
  np.testing.assert_allclose(state.queue, [1.25, 20, 2000])
  np.testing.assert_allclose(state.dropped, [0, 44 + 34, 6336 + 5336])
  np.testing.assert_allclose(state.wait_s, [2.7, 0, 0])  # (8 − 1.25)/2.5
  np.testing.assert_allclose(state.elapsed_s, 6.9)

  persist = streams([2.5, 20, 2000], base_batch=96, b_min=8, b_max=64, buffer='persistence')
  state = persist.update(persist.init(3), 1.0)
  np.testing.assert_allclose(state.queue, [2.5, 64, 8336])
  state = persist.update(state, 0.5)
  # left over (0, 64 − 20, 8336 − 64) = (0, 44, 8272), arrivals (1.25, 54, 5400)
  np.testing.assert_allclose(state.queue, [1.25, 98, 13672])
  np.testing.assert_allclose(state.dropped, [0, 0, 0])


def test_interval_scales_batches_and_caps():
  # interval 0.5 s: b = ⌊(10, 40) · 0.5⌋ = (5, 20) with b_min 1; caps (5, 20)
  model = streams([10, 40], base_batch=64, b_min=1, interval_s=0.5)
  state = model.init(2)
  np.testing.assert_array_equal(state.batches, [5, 20])
  np.testing.assert_allclose(state.wait_s, [0.5, 0.5])
  # W = 0.5; arrivals 10 · 3 = 30, 40 · 3 = 120: capped to (5, 20)
  state = model.update(state, 3.0)
  np.testing.assert_allclose(state.queue, [5, 20])
  np.testing.assert_allclose(state.dropped, [25, 100])
  # fractional rates: b = ⌊37.5⌋ = 37, cap ⌈37.5⌉ = 38
  single = streams([37.5], base_batch=64)
  np.testing.assert_array_equal(single.init(1).batches, [37])
  np.testing.assert_allclose(single.update(single.init(1), 5.0).queue, [38])


# --- persistence vs truncation ------------------------------------------------------


def test_truncation_is_bounded_and_persistence_grows_linearly():
  # S = (100, 37.5), a fixed small batch b = (8, 8) (b_max 8), 1 s steps.
  # init waits (0.08, 0.21333): W = 8/37.5; step 1 arrivals (100 · 1.13333, 37.5) = (113.33, 37.5)
  # persistence then gains S − b = (92, 29.5) a step: q_50 = (113.33 + 49 · 92, 37.5 + 49 · 29.5)
  # truncation holds (100, 38) = ⌈S⌉ from step 2 on.
  rates = [100, 37.5]
  trunc = streams(rates, base_batch=16, b_min=1, b_max=8)
  persist = streams(rates, base_batch=16, b_min=1, b_max=8, buffer='persistence')
  t, p = trunc.init(2), persist.init(2)
  history = []
  for _ in range(50):
    t, p = trunc.update(t, 1.0), persist.update(p, 1.0)
    assert np.all(t.queue <= np.array([100, 38])), t.queue
    history.append(p.queue)
  np.testing.assert_allclose(history[0], [340 / 3, 37.5])
  np.testing.assert_allclose(np.diff(history, axis=0), np.tile([92, 29.5], (49, 1)))
  np.testing.assert_allclose(p.queue, [340 / 3 + 4508, 1483])
  np.testing.assert_allclose(t.queue, [100, 38])
  persisted, truncated = buffer_report(p), buffer_report(t)
  np.testing.assert_allclose(persisted['peak_total'], 340 / 3 + 4508 + 1483)
  np.testing.assert_allclose(truncated['peak_total'], 138)
  # ratio (6104.33 / 138) = 44.23; it grows with the number of steps
  np.testing.assert_allclose(persisted['peak_total'] / truncated['peak_total'], 6104.3333 / 138)
  np.testing.assert_allclose(persisted['peak_bytes'], 6104.3333 * 3072, rtol=1e-6)
  np.testing.assert_allclose(persisted['dropped_total'], 0)
  # both saw the same arrivals; truncation dropped what persistence kept beyond the cap
  np.testing.assert_allclose(
    truncated['arrived_total'], persisted['arrived_total'], equal_nan=False
  )
  np.testing.assert_allclose(
    truncated['dropped_total'], persisted['now_total'] - truncated['now_total'], equal_nan=False
  )


def test_buffer_report_by_hand():
  model = streams([10, 40], base_batch=64, b_max=32, buffer='persistence')
  state = model.update(model.update(model.init(2), 0.5), 2.0)  # queues (5, 28) then (20, 96)
  report = buffer_report(state, bytes_per_sample=2)
  assert report['steps'] == 2
  np.testing.assert_allclose(report['peak'], [20, 96])
  np.testing.assert_allclose(report['mean'], [12.5, 62])
  np.testing.assert_allclose(report['now'], [20, 96])
  np.testing.assert_allclose(report['peak_total'], 116)
  np.testing.assert_allclose(report['mean_total'], 74.5)
  np.testing.assert_allclose(report['peak_bytes'], 232)
  np.testing.assert_allclose(report['arrived_total'], 5 + 28 + 20 + 96)
  json.dumps(report)  # JSON-friendly
  empty = buffer_report(model.init(2))
  assert empty['steps'] == 0
  np.testing.assert_allclose(empty['mean'], [0, 0])


# --- the conventional-DDL baseline ---------------------------------------------------


def test_fixed_policy_trains_base_batch_over_k_everywhere():
  # 64 // 3 = 21 each, whatever the rates; not clipped up to b_min
  model = streams([10, 40, 90], base_batch=64, b_min=50, b_max=64, policy='fixed')
  state = model.init(3)
  np.testing.assert_array_equal(state.batches, [21, 21, 21])
  np.testing.assert_array_equal(
    streams([1, 2, 3], base_batch=100, policy='fixed').init(3).batches, [33, 33, 33]
  )
  # persistence, as the paper's baseline: waits (2.1, 0.525, 0.2333); W = 2.1, 1 s step
  # arrivals 10 · 1 = 10, 40 · (2.1 − 0.525 + 1) = 103, 90 · (2.1 − 21/90 + 1) = 258
  base = streams([10, 40, 90], base_batch=64, policy='fixed', buffer='persistence')
  state = base.init(3)
  np.testing.assert_allclose(state.wait_s, [2.1, 0.525, 21 / 90])
  state = base.update(state, 1.0)
  np.testing.assert_allclose(state.queue, [10, 103, 258])
  np.testing.assert_allclose(state.wait_s, [1.1, 0, 0])  # (21 − 10)/10
  np.testing.assert_array_equal(state.batches, [21, 21, 21])
  np.testing.assert_allclose(lr_scale(state.batches, 64), 63 / 64)


# --- weights and the learning-rate scale ---------------------------------------------


def test_equal_rates_give_equal_batches_and_weights():
  state = streams([50, 50, 50, 50], base_batch=128).init(4)
  np.testing.assert_array_equal(state.batches, [50, 50, 50, 50])
  np.testing.assert_allclose(weights(state.batches), [0.25, 0.25, 0.25, 0.25])
  np.testing.assert_allclose(lr_scale(state.batches, 128), 200 / 128)


def test_weights_and_lr_scale_by_hand():
  np.testing.assert_allclose(weights([8, 20, 64]), [8 / 92, 20 / 92, 64 / 92])
  np.testing.assert_allclose(weights([0, 3]), [0, 1])
  np.testing.assert_allclose(lr_scale([8, 20, 64], 64), 92 / 64)
  np.testing.assert_allclose(lr_scale([10, 32], 64), 42 / 64)


# --- rate sets ---------------------------------------------------------------------


def test_rate_sets_are_table_one():
  assert RATE_SETS == {
    'S1': ('uniform', 38, 24),
    'S2': ('uniform', 300, 112),
    'S10': ('normal', 64, 24),
    'S20': ('normal', 256, 28),
  }


def test_named_sets_are_seeded():
  for name in RATE_SETS:
    np.testing.assert_array_equal(stream_rates(name, 16, seed=3), stream_rates(name, 16, seed=3))
    assert np.all(stream_rates(name, 16, seed=3) >= 1.0)  # finite, clipped to min_rate
    assert not np.array_equal(stream_rates(name, 16, seed=3), stream_rates(name, 16, seed=4))
    assert stream_rates(name, 16).shape == (16,)


@pytest.mark.parametrize(
  'name, mean, sd, lo, hi',
  [
    ('S2', 300, 112, 300 - 193.99, 300 + 193.99),  # √3 · 112 = 193.99
    ('S10', 64, 24, 1, np.inf),  # 0.4% below 1 (z < −2.63), clipped: the moments barely move
    ('S20', 256, 28, 1, np.inf),
  ],
)
def test_named_sets_have_the_table_moments(name, mean, sd, lo, hi):
  s = stream_rates(name, 200_000, seed=0)
  np.testing.assert_allclose(s.mean(), mean, rtol=0.01)
  np.testing.assert_allclose(s.std(), sd, rtol=0.02)
  assert lo <= s.min() and s.max() <= hi


def test_s1_is_clipped_to_min_rate():
  # U[38 − 41.57, 38 + 41.57] = U[−3.57, 79.57]: (1 + 3.57) / 83.14 = 5.5% of draws below 1
  s = stream_rates('S1', 200_000, seed=0)
  np.testing.assert_allclose(s.min(), 1.0)
  assert s.max() <= 79.57
  np.testing.assert_allclose(np.mean(s == 1.0), 4.5692 / 83.1384, atol=0.003)
  raw = stream_rates('S1', 200_000, seed=0, min_rate=1e-9)  # near the unclipped draw
  np.testing.assert_allclose(np.mean(raw <= 1e-9), 3.5692 / 83.1384, atol=0.003)
  np.testing.assert_allclose(stream_rates('S1', 1000, min_rate=5.0).min(), 5.0)


def test_explicit_rates_pass_through():
  np.testing.assert_array_equal(stream_rates([0.5, 40], 2), [0.5, 40])  # not clipped
  np.testing.assert_array_equal(stream_rates(np.array([3.0]), 1), [3.0])


# --- purity and checkpoints -------------------------------------------------------------


def test_update_is_pure_and_the_state_round_trips_through_json():
  model = streams([10, 40, 7], base_batch=64, b_max=32, buffer='persistence')
  state = model.update(model.init(3), 0.5)
  before = [np.copy(x) for x in state]
  a = model.update(state, 1.25)
  b = model.update(state, 1.25)
  for x, y in zip(before, state, strict=True):
    np.testing.assert_array_equal(x, y)  # the input is not changed
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x, y)
    assert np.all(np.isfinite(x))  # array_equal alone would pass NaN == NaN
  saved = json.dumps({k: np.asarray(v).tolist() for k, v in state._asdict().items()})
  loaded = StreamState(**{k: np.asarray(v) for k, v in json.loads(saved).items()})
  for x, y in zip(model.update(loaded, 1.25), a, strict=True):
    np.testing.assert_array_equal(x, y)


def test_exports():
  for name in (
    'RATE_SETS',
    'StreamState',
    'Streams',
    'streams',
    'stream_rates',
    'weights',
    'Arrivals',
  ):
    assert name in control.__all__


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(b_min=64, b_max=32), 'b_min must be <= b_max, got b_min=64 > b_max=32'),
    (dict(b_min=0), 'b_min must be >= 1'),
    (dict(base_batch=0), 'base_batch must be >= 1'),
    (dict(buffer='lossy'), r"buffer must be one of \('persistence', 'truncation'\), got 'lossy'"),
    (dict(policy='greedy'), r"policy must be one of \('proportional', 'fixed'\), got 'greedy'"),
    (dict(interval_s=0.0), 'interval_s must be finite and > 0'),
    (dict(base_batch=1, policy='fixed'), r'base_batch // K = 1 // 2 = 0 .* change base_batch'),
    (dict(base_batch=64, b_max=16, policy='fixed'), r'must be in \[1, b_max\] = \[1, 16\]'),
  ],
)
def test_bad_arguments(kwargs, match):
  kwargs = {'base_batch': 64, **kwargs}
  with pytest.raises(ValueError, match=match):
    streams([10, 40], **kwargs)


def test_bad_rates():
  with pytest.raises(
    ValueError, match=r'rates must all be finite and > 0 samples/s, got \[10.0, 0.0\]'
  ):
    streams([10, 0], base_batch=64)
  with pytest.raises(ValueError, match='rates must be a non-empty vector'):
    streams([], base_batch=64)
  with pytest.raises(ValueError, match='name_or_rates must all be finite and > 0'):
    stream_rates([10, -1], 2)
  with pytest.raises(ValueError, match=r"unknown rate set 'S3'; use one of \['S1', 'S10'"):
    stream_rates('S3', 4)
  with pytest.raises(ValueError, match=r'one rate per device \(2\), got 3; pass num_workers'):
    stream_rates([1, 2, 3], 2)
  with pytest.raises(ValueError, match='num_workers must be >= 1'):
    stream_rates('S1', 0)
  with pytest.raises(ValueError, match='min_rate must be finite and > 0'):
    stream_rates('S1', 4, min_rate=0.0)


def test_bad_state_and_steps():
  model = streams([10, 40], base_batch=64)
  with pytest.raises(ValueError, match=r'num_workers must equal the number of rates \(2\), got 3'):
    model.init(3)
  with pytest.raises(ValueError, match='state must be for 2 devices'):
    model.update(streams([1, 2, 3], base_batch=64).init(3), 1.0)
  for bad in (-1.0, float('nan'), float('inf')):
    with pytest.raises(ValueError, match='step_s must be finite and >= 0 seconds'):
      model.update(model.init(2), bad)
  with pytest.raises(ValueError, match='batches must be finite, >= 0 and not all 0'):
    weights([0, 0])
  with pytest.raises(ValueError, match='base_batch must be >= 1'):
    lr_scale([8, 8], 0)


# --- the streams in wall-clock (Arrivals) ------------------------------------------------------


def test_arrivals_by_hand():
  """S = (10, 40), caps (10, 40), b = (10, 32): the module's worked example in real seconds."""
  streams_in = Arrivals([10.0, 40.0], [10.0, 40.0])
  np.testing.assert_allclose(streams_in.take([10, 32], now_s=100.0), [1.0, 0.8])  # empty
  # device 0 held its batch at 101.0, device 1 at 100.8; the step ended at 101.5
  np.testing.assert_allclose(streams_in.take([10, 32], now_s=101.5), [0.5, 0.1])
  np.testing.assert_allclose(streams_in.queue, [0.0, 0.0])
  # took at 102.0 and 101.6; 2 s later 20 and 96 arrived, truncated to 10 and 40: no wait
  np.testing.assert_allclose(streams_in.take([10, 32], now_s=104.0), [0.0, 0.0])
  np.testing.assert_allclose(streams_in.dropped, [10.0, 56.0])
  np.testing.assert_allclose(streams_in.queue, [0.0, 8.0])  # device 1 kept 40 - 32
  # a take before anything more arrived: device 1 has 8 of 32 (24 / 40 s), device 0 none
  np.testing.assert_allclose(streams_in.take([10, 32], now_s=104.0), [1.0, 0.6])


def test_arrivals_persistence_keeps_everything():
  streams_in = Arrivals([10.0], [np.inf])
  streams_in.take([5], now_s=0.0)  # waits 0.5 s
  np.testing.assert_allclose(streams_in.take([5], now_s=10.5), [0.0])  # 100 arrived, 5 taken
  np.testing.assert_allclose(streams_in.queue, [95.0])
  np.testing.assert_allclose(streams_in.dropped, [0.0])


@pytest.mark.parametrize('buffer', BUFFERS)
def test_arrivals_on_the_models_times_are_the_model(buffer):
  """Taking at the model's step boundaries (its elapsed time) gives the model's waits."""
  model = streams([7.0, 55.0, 130.0], base_batch=96, b_min=8, b_max=64, buffer=buffer,
                  interval_s=0.5)  # fmt: skip
  state, streams_in = model.init(3), model.arrivals([0, 1, 2])
  for step_s in np.random.default_rng(0).uniform(0.0, 1.5, 40):
    waits = streams_in.take(state.batches, now_s=state.elapsed_s)
    np.testing.assert_allclose(waits, state.wait_s, atol=1e-9)  # NaN fails
    state = model.update(state, step_s)
  streams_in.take(state.batches, now_s=state.elapsed_s)  # what the last step's arrivals left
  np.testing.assert_allclose(streams_in.dropped, state.dropped, rtol=1e-9)


def test_arrivals_of_some_workers_are_theirs():
  model = streams([10.0, 40.0, 80.0], base_batch=64, b_max=32)
  streams_in = model.arrivals([1, 2])  # a process feeding workers 1 and 2
  np.testing.assert_allclose(streams_in.rates, [40.0, 80.0])
  np.testing.assert_allclose(streams_in.take([32, 32], now_s=0.0), [0.8, 0.4])


def test_arrivals_bad_input():
  with pytest.raises(ValueError, match='cap must be'):
    Arrivals([10.0], [0.0])
  with pytest.raises(ValueError, match='cap must be'):
    Arrivals([10.0], [np.nan])
  with pytest.raises(ValueError, match='rates must'):
    Arrivals([-1.0], [1.0])
  with pytest.raises(ValueError, match='batches must be'):
    Arrivals([10.0], [10.0]).take([1, 2], now_s=0.0)
