"""GraVAC's host-side CF search (jaxdist.control.gravac) and the trainer's smoothed gains.

Every expected index, θ_s and T_compression is worked by hand beside its step,
from Algorithm 1 of Tyagi & Swany (CLOUD 2023) as research/ALGORITHMS.md §4.2
writes it, with the readings the module docstring states (θ_min raised with
the θ_s just scaled, θ_ideal the lower CF of the two best, the search stops).
T_compression = samples / step_s · δ of the CF sent. Comparisons are written
so that a NaN fails them; NaN is expected only in never-sent slots.
"""

import json
import math

import numpy as np
import pytest

from jaxdist import control
from jaxdist.control import ratio
from jaxdist.control.gravac import (
  DENSE,
  GraVACState,
  candidate_factors,
  choose,
  gravac,
  ratios,
)

from conftest import Driven

NAN = np.nan
EXP = (10.0, 20.0, 40.0, 160.0, 640.0, 1000.0)  # indices 0-5
GEO = (10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2000.0)  # indices 0-8
PAPER_EXP = (10.0, 20.0, 40.0, 160.0, 1000.0)  # ALGORITHMS.md §4.2's list, no 640


def run(ctl, state, steps):
  """Feeds (gain_min, gain_cand, sent, step_s, samples) tuples; returns the state after each."""
  out = []
  for gain_min, gain_cand, sent, step_s, samples in steps:
    state = ctl.update(
      state, gain_min=gain_min, gain_cand=gain_cand, sent=sent, step_s=step_s, samples=samples
    )
    out.append(state)
  return out


def where(state):
  return int(state.min_index), int(state.cand_index), float(state.scale), bool(state.searching)


# --- the grid ---------------------------------------------------------------------------


def test_candidate_factors_of_both_policies():
  # exponential: θ_s = 2, 4, 16, 256 from θ_min 10 gives the paper's 20, 40, 160, 1000 (2560
  # capped); a raise at the first check (θ_min = 4 · 10 = 40) then θ_s = 16 reaches 640
  assert candidate_factors() == EXP
  assert set(PAPER_EXP) <= set(EXP)
  # geometric ratio 2: 10 · 2^k up to 1280, then 2560 capped at 2000 (the paper's list)
  assert candidate_factors(10, 2000, 'geometric') == GEO
  # a θ_max on the lattice appears once
  assert candidate_factors(10, 1280, 'geometric') == GEO[:-1]
  # base 3, exponential: θ_s = 3, 9, 81 gives θ_c 30, 90, 810; a raise at the first check
  # (θ_min 9 · 10 = 90) gives 90 · 9 = 810 and 90 · 81 = 7290, capped at 1000
  assert candidate_factors(10, 1000, base=3) == (10.0, 30.0, 90.0, 810.0, 1000.0)
  assert candidate_factors(10, 10) == (10.0,)
  assert candidate_factors(10, 15) == (10.0, 15.0)  # 20 capped at 15
  for f in (candidate_factors(), candidate_factors(10, 2000, 'geometric', base=1.5)):
    assert all(isinstance(x, float) for x in f)
    assert np.all(np.diff(f) > 0)


def test_ratios_are_kept_fractions():
  np.testing.assert_allclose(ratios(EXP), [0.1, 0.05, 0.025, 0.00625, 0.0015625, 0.001])
  assert ratios([1]) == (1.0,)


# --- traces by hand ---------------------------------------------------------------------


def test_init_starts_at_theta_min_and_the_first_candidate():
  state = gravac(EXP).init()
  assert where(state) == (0, 1, 2.0, True)  # θ_min 10, θ_c 10 · 2 = 20
  assert (
    state.step == 0 and state.t_compression.shape == (7,) and np.isnan(state.t_compression).all()
  )
  np.testing.assert_array_equal(state.sent_steps, np.zeros(7))
  assert where(gravac(GEO, policy='geometric', base=4).init()) == (0, 2, 4.0, True)  # 40


def test_scale_up_by_the_exponential_policy():
  ctl = gravac(EXP, window=2)
  far = (0.9, 0.8)  # |0.9 − 0.8| = 0.1 > ω · δ_min = 0.009: θ_min stays
  states = run(
    ctl,
    ctl.init(),
    [
      (*far, 1, 0.5, 64),  # T[20] = 128 · 0.8 = 102.4
      (*far, 1, 0.4, 64),  # T[20] = 160 · 0.8 = 128 (the latest); check: θ_s 4, θ_c 40
      (0.9, 0.75, 2, 0.25, 64),  # T[40] = 256 · 0.75 = 192
      (0.9, 0.75, 2, 0.25, 64),  # check: θ_s 16, θ_c 160; (192 − 128) > 1.28, no stop
      (0.9, 0.72, 3, 0.2, 64),  # T[160] = 320 · 0.72 = 230.4
      (0.9, 0.72, 3, 0.2, 64),  # check: θ_s 256, θ_c 2560 → 1000; 38.4 > 1.92
      (0.9, 0.71, 5, 0.1, 64),  # T[1000] = 640 · 0.71 = 454.4
      (0.9, 0.71, 5, 0.1, 64),  # check: θ_s 65536 → 1000 (capped), θ_c 1000
    ],
  )
  assert where(states[0]) == (0, 1, 2.0, True)  # no check between
  np.testing.assert_allclose(states[0].t_compression[1], 102.4)
  assert where(states[1]) == (0, 2, 4.0, True)
  assert where(states[3]) == (0, 3, 16.0, True)
  assert where(states[5]) == (0, 5, 256.0, True)
  assert where(states[7]) == (0, 5, 1000.0, True)
  np.testing.assert_allclose(
    states[7].t_compression, [NAN, 128.0, 192.0, 230.4, NAN, 454.4, NAN], equal_nan=True
  )
  np.testing.assert_array_equal(states[7].sent_steps, [0, 2, 2, 2, 0, 2, 0])
  assert states[7].step == 8


def test_scale_up_by_the_geometric_policy():
  ctl = gravac(GEO, window=3, policy='geometric')
  step = lambda sent, step_s: (0.9, 0.8, sent, step_s, 64)  # gains far apart
  states = run(
    ctl,
    ctl.init(),
    [step(1, 0.5)] * 3  # T[20] = 102.4; check: θ_s 4, θ_c 40
    + [step(2, 0.25)] * 3  # T[40] = 204.8; check: θ_s 8, θ_c 80
    + [step(3, 0.125)] * 3,  # T[80] = 409.6; check: θ_s 16, θ_c 160
  )
  assert where(states[1]) == (0, 1, 2.0, True)
  assert where(states[2]) == (0, 2, 4.0, True)
  assert where(states[5]) == (0, 3, 8.0, True)
  assert where(states[8]) == (0, 4, 16.0, True)
  np.testing.assert_allclose(
    states[8].t_compression, [NAN, 102.4, 204.8, 409.6] + [NAN] * 6, equal_nan=True
  )


def test_theta_min_is_raised_with_the_scaled_theta_s_when_the_gains_are_close():
  ctl = gravac(EXP, window=2)
  steps = [
    (0.9, 0.895, 1, 0.5, 64),  # |0.005| <= 0.009: close; T[20] = 128 · 0.895 = 114.56
    (0.9, 0.895, 1, 0.5, 64),  # check: θ_s 4, θ_min 4 · 10 = 40 (not 20), θ_c 40 · 4 = 160
    (0.9, 0.8, 3, 0.25, 64),  # T[160] = 256 · 0.8 = 204.8
    (0.9, 0.8, 3, 0.25, 64),  # check: θ_s 16, far: θ_min 40, θ_c 640
    (0.8, 0.7961, 4, 0.125, 64),  # |0.0039| <= 0.008: close; T[640] = 512 · 0.7961
    (0.8, 0.7961, 4, 0.125, 64),  # check: θ_s 256, θ_min 40 · 256 → 1000, θ_c 1000
    (0.8, 0.7961, 5, 0.125, 64),  # θ_min = θ_c: sending index 5 is both
  ]
  states = run(ctl, ctl.init(), steps)
  assert where(states[1]) == (2, 3, 4.0, True)
  assert where(states[3]) == (2, 4, 16.0, True)
  assert where(states[5]) == (5, 5, 256.0, True)
  np.testing.assert_allclose(
    states[6].t_compression,
    [NAN, 114.56, NAN, 204.8, 512 * 0.7961, 512 * 0.7961, NAN],
    equal_nan=True,
  )
  # the paper's coarser list rounds 640 up to 1000: θ_c index 4 at the second check
  coarse = gravac(PAPER_EXP, window=2)
  steps[4:6] = [(0.8, 0.7961, 4, 0.125, 64)] * 2
  states = run(coarse, coarse.init(), steps[:6])
  assert where(states[1]) == (2, 3, 4.0, True)
  assert where(states[3]) == (2, 4, 16.0, True)
  assert where(states[5]) == (4, 4, 256.0, True)


def test_fallbacks_are_recorded_dense_at_cf_1():
  ctl = gravac(EXP, window=3, epsilon=0.7)
  steps = [
    (0.85, 0.8, 1, 0.5, 64),  # δ_c >= ε: θ_c; T[20] = 128 · 0.8 = 102.4
    (0.75, 0.6, 0, 0.6, 64),  # δ_c < ε <= δ_min: θ_min; T[10] = 106.67 · 0.75 = 80
    (0.65, 0.5, DENSE, 1.0, 64),  # both < ε: dense; T[1] = 64 · 1 = 64
    # check: θ_s 4, far (0.15 > 0.0065): θ_c 40; ct (64, 80, 102.4): 22.4 > 0.8, no stop
    (0.6, 0.5, DENSE, 1.0, 64),  # T[1] = 64
    (0.6, 0.5, DENSE, 0.5, 64),  # T[1] = 128
    (0.6, 0.5, DENSE, 0.8, 64),  # T[1] = 80, the latest; check: θ_s 16, θ_c 160;
    # ct (80, 80, 102.4): 22.4 > 0.8, no stop
  ]
  states = run(ctl, ctl.init(), steps)
  for (gain_min, gain_cand, sent, *_), before in zip(steps, [ctl.init(), *states], strict=False):
    assert choose(before, gain_min=gain_min, gain_cand=gain_cand, epsilon=0.7) == sent
  assert where(states[2]) == (0, 2, 4.0, True)
  np.testing.assert_allclose(
    states[2].t_compression, [80.0, 102.4, NAN, NAN, NAN, NAN, 64.0], equal_nan=True
  )
  np.testing.assert_allclose(states[4].t_compression[-1], 128.0)
  assert where(states[5]) == (0, 3, 16.0, True)
  np.testing.assert_allclose(
    states[5].t_compression, [80.0, 102.4, NAN, NAN, NAN, NAN, 80.0], equal_nan=True
  )
  np.testing.assert_array_equal(states[5].sent_steps, [1, 1, 0, 0, 0, 0, 4])


def test_stop_rule_takes_the_lower_cf_of_the_two_best_and_stops():
  ctl = gravac(EXP, window=2)
  states = run(
    ctl,
    ctl.init(),
    [
      (0.9, 0.5, 1, 1.0, 201),  # T[20] = 201 · 0.5 = 100.5
      (0.9, 0.5, 1, 1.0, 201),  # check: θ_s 4, θ_c 40; one CF measured, no stop
      (0.9, 0.5, 2, 1.0, 200),  # T[40] = 100
      (0.9, 0.5, 2, 1.0, 200),
      # check: θ_s 16 (θ_c would be 160), far gains; ct (100, 100.5): 0.5 <= 0.01 · 100: stop.
      # The two best are CF 20 (100.5) and CF 40 (100): θ_ideal = 20, the lower CF (Algorithm 1
      # line 38's ct[-2] and the authors' code would take 40); θ_s = 20 / 10 = 2
      (0.9, 0.9, 1, 0.1, 200),  # close gains and a far better T: the search has stopped
      (0.9, 0.9, 1, 0.1, 200),  # T[20] = 2000 · 0.9 = 1800, recorded all the same
    ],
  )
  assert where(states[1]) == (0, 2, 4.0, True)
  assert where(states[3]) == (0, 1, 2.0, False)
  assert where(states[5]) == (0, 1, 2.0, False)
  np.testing.assert_allclose(
    states[5].t_compression, [NAN, 1800.0, 100.0, NAN, NAN, NAN, NAN], equal_nan=True
  )
  assert states[5].step == 6


@pytest.mark.parametrize(
  'first, ideal',
  [
    ((0.6, 0.5, DENSE, 1.0, 100), 'dense'),  # T[1] = 100
    ((0.8, 0.6, 0, 1.0, 125), 'CF 10'),  # T[10] = 125 · 0.8 = 100
  ],
)
def test_an_ideal_below_theta_min_is_read_as_theta_min(first, ideal):
  ctl = gravac(EXP, window=2)
  (_, state) = run(
    ctl,
    ctl.init(),
    [
      first,
      (0.905, 0.9, 1, 0.9, 100),  # T[20] = 111.1 · 0.9 = 100; |0.005| <= 0.00905: close
      # check, Algorithm 1's order: θ_s 4; raise θ_min to 40; then the two best (100, 100) are
      # within ω and θ_ideal (CF 1 or 10) < θ_min = 40: θ_c = θ_min, θ_s = 1
    ],
  )
  assert where(state) == (2, 2, 1.0, False), ideal


def test_reachable_cfs_are_on_the_closure_grid_exactly():
  # random gains and sends: every θ_min and θ_c is min(product, θ_max) with no rounding up
  rng = np.random.default_rng(0)
  for policy, grid in (('exponential', EXP), ('geometric', GEO)):
    ctl = gravac(grid, window=1, policy=policy, omega=0.5)
    for _ in range(50):
      state = ctl.init()
      for _ in range(12):
        low, scale = state.min_index, state.scale
        gain_min, gain_cand = rng.uniform(0.3, 1.0, 2)
        sent = choose(state, gain_min=gain_min, gain_cand=gain_cand)
        step_s = float(rng.uniform(0.1, 1.0))
        new = ctl.update(
          state, gain_min=gain_min, gain_cand=gain_cand, sent=sent, step_s=step_s, samples=64
        )
        if state.searching and new.searching:  # a check that did not stop
          scaled = min(scale**2 if policy == 'exponential' else 2 * scale, grid[-1])
          np.testing.assert_allclose(new.scale, scaled)
          assert new.min_index in (low, grid.index(min(grid[low] * scaled, grid[-1])))
          target = min(grid[new.min_index] * scaled, grid[-1])
          np.testing.assert_allclose(grid[new.cand_index], target)  # on the grid, not rounded up
        assert 0 <= new.min_index <= new.cand_index < len(grid)
        state = new


# --- purity and checkpoints -------------------------------------------------------------


def test_update_is_pure_and_the_state_round_trips_through_json():
  ctl = gravac(EXP, window=2)
  state = run(ctl, ctl.init(), [(0.9, 0.895, 1, 0.5, 64)])[-1]
  before = [np.copy(x) for x in state]
  step = dict(gain_min=0.9, gain_cand=0.895, sent=1, step_s=0.5, samples=64)
  a, b = ctl.update(state, **step), ctl.update(state, **step)
  for x, y in zip(before, state, strict=True):
    np.testing.assert_array_equal(x, y)  # the input is not changed (NaN slots equal)
  assert where(a) == (2, 3, 4.0, True)  # the check ran
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x, y)
  # plain JSON (NaN as NaN) and the trainer's (NaN as null), then the same next step
  plain = json.loads(json.dumps({k: np.asarray(v).tolist() for k, v in state._asdict().items()}))
  nulls = lambda v: [None if math.isnan(x) else x for x in v]
  strict = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in state._asdict().items()}
  strict['t_compression'] = nulls(strict['t_compression'])
  strict = json.loads(json.dumps(strict, allow_nan=False))
  for saved in (plain, strict):
    loaded = GraVACState(
      **{
        k: np.asarray(v, now.dtype) if isinstance(now, np.ndarray) else type(now)(v)
        for (k, v), now in zip(saved.items(), state, strict=True)
      }
    )
    for x, y in zip(loaded, state, strict=True):
      np.testing.assert_array_equal(x, y)
      assert type(x) is type(y)
    for x, y in zip(ctl.update(loaded, **step), a, strict=True):
      np.testing.assert_array_equal(x, y)


def test_exports():
  for name in ('GraVAC', 'GraVACState', 'candidate_factors', 'gravac'):
    assert name in control.__all__


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(epsilon=0.0), 'epsilon must be in'),
    (dict(epsilon=1.5), 'epsilon must be in'),
    (dict(epsilon=NAN), 'epsilon must be in'),
    (dict(omega=0.0), 'omega must be in'),
    (dict(omega=-0.1), 'omega must be in'),
    (dict(omega=2.0), 'omega must be in'),
    (dict(window=0), 'window must be >= 1'),
    (dict(policy='linear'), 'policy must be one of'),
    (dict(base=1.0), 'base must be'),
  ],
)
def test_bad_settings(kwargs, match):
  with pytest.raises(ValueError, match=match):
    gravac(EXP, **kwargs)


@pytest.mark.parametrize(
  'factors, match',
  [
    ([], 'non-empty'),
    ([[10, 20]], 'non-empty vector'),
    ([10, 5], 'strictly ascending'),
    ([10, 10], 'strictly ascending'),
    ([0.5, 10], '>= 1'),
    ([10, NAN], 'finite'),
  ],
)
def test_bad_factors(factors, match):
  with pytest.raises(ValueError, match=match):
    gravac(factors)
  with pytest.raises(ValueError, match=match):
    ratios(factors)


def test_bad_candidate_factors():
  with pytest.raises(ValueError, match='theta_min must be'):
    candidate_factors(0.5)
  with pytest.raises(ValueError, match='theta_max must be'):
    candidate_factors(10, 5)
  with pytest.raises(ValueError, match='policy must be one of'):
    candidate_factors(policy='linear')
  with pytest.raises(ValueError, match='base must be'):
    candidate_factors(base=0.5)


@pytest.mark.parametrize(
  'change, match',
  [
    (dict(sent=3), 'sent must be'),  # neither θ_min (0) nor θ_c (1) nor dense
    (dict(sent=-2), 'sent must be'),
    (dict(step_s=0.0), 'step_s must be'),
    (dict(step_s=NAN), 'step_s must be'),
    (dict(samples=0), 'samples must be'),
    (dict(gain_min=-0.1), 'gain_min must be'),
    (dict(gain_cand=NAN), 'gain_cand must be'),
  ],
)
def test_bad_updates(change, match):
  ctl = gravac(EXP)
  step = dict(gain_min=0.9, gain_cand=0.8, sent=1, step_s=0.5, samples=64) | change
  with pytest.raises(ValueError, match=match):
    ctl.update(ctl.init(), **step)


def test_a_state_of_another_grid_is_refused():
  with pytest.raises(ValueError, match='grid of 5 CFs'):
    gravac(PAPER_EXP).update(
      gravac(EXP).init(), gain_min=0.9, gain_cand=0.8, sent=1, step_s=0.5, samples=64
    )


# --- the trainer's smoothing (jaxdist.control.ratio.gravac_control) ------------------------


def _trainer_control(policy, window=2, decay=0.9, workers=2):
  from jaxdist.train import config as config_lib
  from jaxdist.train.factory import controls

  config = config_lib.base()
  config.sync.method, config.adaptive = 'compressed_allreduce', 'gravac'
  theta_max = 2000.0 if policy == 'geometric' else 1000.0
  config.gravac.update(policy=policy, theta_min=10.0, theta_max=theta_max, window=window,
                       decay=decay, epsilon=0.7, omega=0.01)  # fmt: skip
  return Driven(controls.build(config, workers, {'1gbps': None}))


def _observe(ctl, t, step_s, sq_norm, gains_by_index):
  """Step t (0-based) on 2 workers with ‖w‖² = sq_norm and the same gain per grid index."""
  gains = np.full((2, 9), 0.2)  # the grid's 9 factors
  for i, g in gains_by_index.items():
    gains[:, i] = g
  norms = np.full((2, 2), sq_norm)
  ctl.step(t, {'modelled_s@1gbps': step_s}, {'norms': norms, 'gains': gains})


def _gains(ctl):
  return ratio.smoothed_gains(ctl.state.inner.ewma)


def _check(ctl):
  return ctl.state.inner.gravac


def test_the_trainer_continues_one_delta_c_across_candidate_changes():
  # Geometric policy, decay 0.9, window 2, ε 0.7; grid GEO (10, 20, 40, 80, … at 0, 1, 2, 3).
  # Gains per CF, every step: 10x 0.9, 20x 0.8, 40x 0.5, 80x 0.3; ‖w‖² = 1, 2, 2, 2, 2.
  # Algorithm 1's one δ_c: E‖C_θc(w)‖² is one EWMA, fed whichever θ_c is in force.
  ctl = _trainer_control('geometric')
  assert ctl.plans == {} and ctl.index == 0  # the first step sends θ_min
  gains = {0: 0.9, 1: 0.8, 2: 0.5, 3: 0.3}
  # step 1 (θ_c 20): E‖w‖² 1, E‖C_20‖² 0.8: δ_c 0.8 ≥ ε, the next step sends θ_c (index 1)
  _observe(ctl, 0, 0.5, 1.0, gains)
  assert _gains(ctl) == pytest.approx((0.9, 0.8), rel=1e-12) and ctl.index == 1
  # step 2: E‖w‖² 0.9·1 + 0.1·2 = 1.1, E‖C_20‖² 0.9·0.8 + 0.1·1.6 = 0.88: δ_c 0.8. The check:
  # θ_s 4, |0.9 − 0.8| > 0.009 (no raise), θ_c = 40 (index 2); T 10x 0.9·N/t, 20x 0.8·N/t are
  # 12.5% apart (no stop). The next step is decided on δ_c 0.8 (θ_c 40's own EWMA would be 0.5,
  # below ε, and send θ_min): it sends 40x.
  _observe(ctl, 1, 0.5, 2.0, gains)
  assert (_check(ctl).min_index, _check(ctl).cand_index, _check(ctl).scale) == (0, 2, 4.0)
  assert _gains(ctl) == pytest.approx((0.9, 0.8), rel=1e-12) and ctl.index == 2
  # step 3 (θ_c 40): E‖w‖² 0.9·1.1 + 0.2 = 1.19, E‖C‖² 0.9·0.88 + 0.1·(0.5·2) = 0.892
  _observe(ctl, 2, 0.5, 2.0, gains)
  assert _gains(ctl)[1] == pytest.approx(0.892 / 1.19, rel=1e-12)  # 0.7496 ≥ ε: 40x again
  assert _gains(ctl)[0] == pytest.approx(0.9, rel=1e-12) and ctl.index == 2
  # step 4: E‖w‖² 0.9·1.19 + 0.2 = 1.271, E‖C‖² 0.9·0.892 + 0.1 = 0.9028: δ_c 0.7103. The
  # check: θ_s 8, θ_c 80 (index 3), decided on δ_c 0.7103 ≥ ε: sends 80x
  _observe(ctl, 3, 0.5, 2.0, gains)
  assert _gains(ctl)[1] == pytest.approx(0.9028 / 1.271, rel=1e-12)
  assert (_check(ctl).cand_index, _check(ctl).scale, ctl.index) == (3, 8.0, 3)
  # step 5 (θ_c 80): E‖w‖² 0.9·1.271 + 0.2 = 1.3439, E‖C‖² 0.9·0.9028 + 0.1·0.6 = 0.87252:
  # δ_c 0.6492 < ε, δ_min 0.9: θ_min next
  _observe(ctl, 4, 0.5, 2.0, gains)
  assert _gains(ctl)[1] == pytest.approx(0.87252 / 1.3439, rel=1e-12) and ctl.index == 0
  assert [ctl.candidate_of(t) for t in range(1, 6)] == [0, 1, 2, 2, 3]


def test_the_trainer_continues_one_delta_min_across_a_raise():
  # Exponential policy, decay 0.9, window 2; grid EXP (10, 20, 40, 160 at 0, 1, 2, 3).
  # Gains: 10x 0.9, 20x 0.895, 40x 0.6, 160x 0.5; ‖w‖² = 1. Step 1 sends θ_min (t 1 s),
  # step 2 θ_c (δ_c 0.895 ≥ ε; t 0.5 s): T 10x 0.9·N, 20x 1.79·N, no stop.
  ctl = _trainer_control('exponential')
  gains = {0: 0.9, 1: 0.895, 2: 0.6, 3: 0.5}
  _observe(ctl, 0, 1.0, 1.0, gains)
  _observe(ctl, 1, 0.5, 1.0, gains)
  # the check: θ_s 4, |0.9 − 0.895| ≤ 0.009: θ_min 40 (index 2), θ_c 160 (index 3). δ_min and
  # δ_c carry on from 10x's and 20x's (0.9, 0.895): 160x is sent (its own 0.5 and 40x's 0.6
  # are both below ε, which would send dense)
  assert (_check(ctl).min_index, _check(ctl).cand_index, _check(ctl).scale) == (2, 3, 4.0)
  assert _gains(ctl) == pytest.approx((0.9, 0.895), rel=1e-12) and ctl.index == 3
  # step 3: δ_min 0.9·0.9 + 0.1·0.6 = 0.87, δ_c 0.9·0.895 + 0.1·0.5 = 0.8555
  _observe(ctl, 2, 0.5, 1.0, gains)
  assert _gains(ctl) == pytest.approx((0.87, 0.8555), rel=1e-12) and ctl.index == 3


def test_the_trainer_smoothing_resumes_from_checkpoint_json():
  ctl = _trainer_control('geometric')
  gains = {0: 0.9, 1: 0.8, 2: 0.5, 3: 0.3}
  for t, sq_norm in enumerate((1.0, 2.0, 2.0)):
    _observe(ctl, t, 0.5, sq_norm, gains)
  back = _trainer_control('geometric')
  back.state = ctl.saved()
  assert _gains(back) == _gains(ctl) and back.index == ctl.index == 2
  for c in (ctl, back):
    _observe(c, 3, 0.5, 2.0, gains)
  assert _gains(back) == _gains(ctl) == pytest.approx((0.9, 0.9028 / 1.271), rel=1e-12)
  assert back.index == ctl.index == 3


def test_a_checkpoint_from_before_the_control_item_restores(tmp_path):
  # It kept the controller in its metadata, and an EWMA of each candidate's ‖C_r(w)‖² (9 grid
  # CFs), then of ‖w‖² ('sums'): θ_min's and θ_c's carry on.
  from jaxdist.train import checkpoint

  ctl = _trainer_control('geometric')
  for t, sq_norm in enumerate((1.0, 2.0)):
    _observe(ctl, t, 0.5, sq_norm, {0: 0.9, 1: 0.8, 2: 0.5, 3: 0.3})
  assert (_check(ctl).min_index, _check(ctl).cand_index) == (0, 2)
  old = {
    'index': ctl.index, 'compressed': 2, 'steps': 2,
    'gravac': control.host.to_tree(_check(ctl)),
    'sums': [0.99, 0.88, 0.55, 0.33, 0.22, 0.22, 0.22, 0.22, 0.22, 1.1],
  }  # fmt: skip
  (tmp_path / '20' / 'meta').mkdir(parents=True)
  (tmp_path / '20' / 'meta' / 'metadata').write_text(json.dumps({'step': 20, 'adaptive': old}))
  saved = checkpoint.read_control(str(tmp_path), 20)
  back = _trainer_control('geometric')
  back.state = control.host.from_tree(back.state, saved['adaptive'])
  assert _gains(back) == pytest.approx((0.99 / 1.1, 0.55 / 1.1), rel=1e-12)  # θ_min 10x, θ_c 40x
  assert back.index == ctl.index
  assert json.dumps(control.host.to_tree(_check(back))) == json.dumps(old['gravac'])
