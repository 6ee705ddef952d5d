"""Scavenger's noise meter, fitted models, searches and choice (jaxdist.control.scavenger).

Every expected number is worked by hand beside its case (Eq. 2, Eqs. 3–10 of
Tyagi & Sharma, CCGrid 2023, as research/ALGORITHMS.md §5 writes them, with
its corrections: affine fits with intercepts, the knee on the Pareto front).
Comparisons are written so that a NaN fails them.
"""

import json
import math
import warnings

import numpy as np
import pytest

from jaxdist.control import scavenger
from jaxdist.control.scavenger import (
  Model,
  Prediction,
  Profile,
  choose,
  fit,
  full_search,
  gamma,
  gamma_normalized,
  knee,
  noise_meter,
  noise_terms,
  pareto_front,
  partial_search,
  simple_noise_scale,
)

# The synthetic job: compute 0.1 + 0.01·b s, sync 0.04 + 0.025·K s, 0.003 s more per step,
# γ/K = 0.5 + 2/√B, epochs 2 + 8·γ/K.
TRUE = Model(
  c0=0.1, c1=0.01, s0=0.04, s1=0.025, other_s=0.003, g0=0.5, g1=2.0, e_star=2.0, theta=8.0
)
RUNS = [(1.0, 10.0), (0.75, 8.0)]  # (γ/K, epochs) on the line e = 2 + 8·γ/K
WORKERS = (2, 4, 8)
BATCHES = (64, 256, 1024)


def profile(k: int, b: int, model: Model = TRUE) -> Profile:
  compute = model.c0 + model.c1 * b / k
  sync = model.s0 + model.s1 * k
  return Profile(k, b, compute + sync + model.other_s, compute, sync, model.g0 + model.g1 / b**0.5)


def row(k: int, t: float, c: float, b: int = 64) -> Prediction:
  return Prediction(k, b, 1.0, 0.5, 1.0, 1.0, t, c)


# --- noise (Eq. 2) -------------------------------------------------------------------


def test_gamma_is_k_for_orthogonal_and_one_for_identical_gradients():
  meter = noise_meter()
  # [1, 0] and [0, 1]: mean ‖g_k‖² = (1 + 1)/2 = 1; ḡ = (½, ½), ‖ḡ‖² = ½; γ = 2 = K
  terms = noise_terms(np.array([[1.0, 0.0], [0.0, 1.0]]))
  np.testing.assert_allclose(terms, (1.0, 0.5), rtol=0, atol=0)
  state = meter.update(meter.init(), *terms)
  assert gamma(state) == pytest.approx(2.0)
  assert gamma_normalized(state, 2) == pytest.approx(1.0)
  assert simple_noise_scale(state, 2, 64) == math.inf  # γ = K: noise dominates at both sizes
  # identical [1, 2] twice: ‖g_k‖² = 5 = ‖ḡ‖², γ = 1, γ/K = ½, B_simple = 0
  terms = noise_terms(np.array([[1.0, 2.0], [1.0, 2.0]]))
  np.testing.assert_allclose(terms, (5.0, 5.0), rtol=0, atol=0)
  state = meter.update(meter.init(), *terms)
  assert gamma(state) == pytest.approx(1.0)
  assert gamma_normalized(state, 2) == pytest.approx(0.5)
  assert simple_noise_scale(state, 2, 64) == pytest.approx(0.0)


def test_gamma_exceeds_k_when_gradients_point_against_each_other():
  # [1, 0] and [−½, 0]: mean ‖g_k‖² = (1 + ¼)/2 = 0.625; ḡ = (¼, 0), ‖ḡ‖² = 1/16; γ = 10 > K = 2
  meter = noise_meter()
  terms = noise_terms(np.array([[1.0, 0.0], [-0.5, 0.0]]))
  np.testing.assert_allclose(terms, (0.625, 0.0625), rtol=1e-15)
  state = meter.update(meter.init(), *terms)
  assert gamma(state) == pytest.approx(10.0)
  assert gamma_normalized(state, 2) == pytest.approx(5.0)
  assert simple_noise_scale(state, 2, 64) == math.inf  # γ >= K: no finite B_simple
  # g and −g cancel: ‖ḡ‖² = 0, γ = inf
  state = meter.update(meter.init(), *noise_terms(np.array([[1.0, 2.0], [-1.0, -2.0]])))
  assert gamma(state) == math.inf


def test_noise_terms_flatten_each_worker():
  # worker 0 = [[1, 1], [0, 0]], worker 1 = [[1, -1], [0, 2]]: ‖·‖² = 2 and 6, mean 4;
  # ḡ = [[1, 0], [0, 1]], ‖ḡ‖² = 2
  g = np.array([[[1.0, 1.0], [0.0, 0.0]], [[1.0, -1.0], [0.0, 2.0]]])
  np.testing.assert_allclose(noise_terms(g), (4.0, 2.0), rtol=0, atol=0)


def test_ewma_of_numerator_and_denominator_is_not_the_ewma_of_the_ratio():
  meter = noise_meter(decay=0.5)
  state = meter.update(meter.init(), 2.0, 1.0)  # γ_1 = 2
  state = meter.update(state, 4.0, 4.0)  # γ_2 = 1
  # numerator ½·2 + ½·4 = 3, denominator ½·1 + ½·4 = 2.5: γ = 1.2
  assert (state.worker_sq, state.mean_sq, state.count) == (3.0, 2.5, 2)
  assert gamma(state) == pytest.approx(1.2)
  # the EWMA of the ratios would be ½·2 + ½·1 = 1.5
  assert abs(gamma(state) - 1.5) > 0.2  # fails on NaN, as a != would not
  assert gamma_normalized(state, 4) == pytest.approx(0.3)


def test_noise_meter_decay():
  meter = noise_meter(decay=0.9)
  state = meter.update(meter.init(), 10.0, 5.0)  # the first measurement sets both
  state = meter.update(state, 0.0, 0.0)  # 0.9 · 10, 0.9 · 5
  assert (state.worker_sq, state.mean_sq) == (pytest.approx(9.0), pytest.approx(4.5))
  state = noise_meter(decay=0.0).update(state, 3.0, 1.0)  # decay 0: the last one only
  assert gamma(state) == pytest.approx(3.0)


def test_noise_meter_state_round_trips_through_json():
  meter = noise_meter(0.8)
  state = meter.update(meter.update(meter.init(), 3.0, 1.5), 2.0, 1.0)
  restored = scavenger.NoiseMeterState(**json.loads(json.dumps(state._asdict())))
  assert restored == state
  assert gamma(restored) == pytest.approx(gamma(state))


def test_simple_noise_scale_is_mccandlish_estimators_ratio():
  # K = 4, b = 32, B = 128, numerator 3, denominator 1.5 (γ = 2):
  # |G|² = (B·1.5 − b·3)/(B − b) = (192 − 96)/96 = 1; tr Σ = (3 − 1.5)/(1/32 − 1/128) = 64
  state = scavenger.NoiseMeterState(3.0, 1.5, 1)
  assert simple_noise_scale(state, 4, 128) == pytest.approx(64.0)  # = 128 · (2 − 1)/(4 − 2)
  assert math.isnan(simple_noise_scale(state, 1, 128))  # one worker: one batch size only


def test_noise_errors():
  with pytest.raises(ValueError, match=r'decay must be in \[0, 1\), got 1.0'):
    noise_meter(1.0)
  meter = noise_meter()
  with pytest.raises(ValueError, match='at least one measurement'):
    gamma(meter.init())
  with pytest.raises(ValueError, match='mean_sq must be finite and >= 0, got nan'):
    meter.update(meter.init(), 1.0, float('nan'))
  with pytest.raises(ValueError, match=r'worker_sq must be finite and >= 0, got -1\.0'):
    meter.update(meter.init(), -1.0, 1.0)
  state = meter.update(meter.init(), 1.0, 0.0)
  assert gamma(state) == math.inf
  with pytest.raises(ValueError, match='num_workers must be >= 1, got 0'):
    gamma_normalized(state, 0)


# --- fits (Eqs. 6–10) -------------------------------------------------------------


def test_fit_recovers_known_affine_coefficients():
  profiles = [profile(k, b) for k in WORKERS for b in BATCHES]
  model = fit(profiles, RUNS)
  np.testing.assert_allclose(tuple(model), tuple(TRUE), rtol=1e-9, atol=1e-12)
  # the minimal set: three extreme points span two K, two B/K and two B
  extremes = [profile(2, 64), profile(2, 1024), profile(8, 1024)]
  np.testing.assert_allclose(tuple(fit(extremes, RUNS)), tuple(TRUE), rtol=1e-9, atol=1e-12)


def test_fit_is_least_squares_with_intercepts():
  # sync 0.1, 0.3, 0.2 at K = 1, 2, 3: mean K 2, mean sync 0.2, slope Σ(dK·dy)/Σ dK² = 0.2/2 = 0.05,
  # intercept 0.2 − 0.05 · 2 = 0.1
  # compute 1.0 at every b = 64, 128, 128: c0 = 1, c1 = 0
  profiles = [
    Profile(1, 64, 1.0 + 0.1, 1.0, 0.1, 0.8),
    Profile(2, 256, 1.0 + 0.3, 1.0, 0.3, 0.7),
    Profile(3, 384, 1.0 + 0.2, 1.0, 0.2, 0.6),
  ]
  model = fit(profiles, RUNS)
  assert (model.s0, model.s1) == (pytest.approx(0.1), pytest.approx(0.05))
  assert (model.c0, model.c1) == (pytest.approx(1.0), pytest.approx(0.0, abs=1e-12))
  assert model.other_s == pytest.approx(0.0, abs=1e-12)


def test_predict_by_hand():
  # K = 4, B = 256: compute 0.1 + 0.01·64 = 0.74, sync 0.04 + 0.1 = 0.14, other 0.003: τ = 0.883 s;
  # γ/K = 0.5 + 2/16 = 0.625; e = 2 + 8·0.625 = 7; n = 7 · 12800/256 = 350 steps;
  # T = 350 · 0.883 = 309.05 s; C = 309.05/3600 h · 4 · 0.36 /h = 0.12362
  p = TRUE.predict(4, 256, dataset_size=12800, price_per_hour=0.36)
  np.testing.assert_allclose(
    (p.step_s, p.gamma_normalized, p.epochs, p.steps, p.time_s, p.cost),
    (0.883, 0.625, 7.0, 350.0, 309.05, 0.12362),
    rtol=1e-12,
  )
  assert (p.num_workers, p.batch_size) == (4, 256)


# --- searches ---------------------------------------------------------------------


def test_full_search_uses_the_measurements_and_averages_repeats():
  # (2, 64) profiled twice with step 0.5 and 0.7 s and γ/K 0.8 and 0.9: τ = 0.6, γ/K = 0.85;
  # e = 2 + 8·0.85 = 8.8; n = 8.8 · 6400/64 = 880; T = 528 s; C = 528/3600 · 2 · 1.0
  profiles = [
    Profile(2, 64, 0.5, 0.3, 0.2, 0.8),
    Profile(2, 64, 0.7, 0.4, 0.3, 0.9),
    Profile(4, 128, 0.4, 0.2, 0.2, 0.75),  # e = 8, n = 400, T = 160 s, C = 160/3600 · 4
  ]
  table = full_search(profiles, RUNS, dataset_size=6400, price_per_hour=1.0)
  assert [(p.num_workers, p.batch_size) for p in table] == [(2, 64), (4, 128)]
  np.testing.assert_allclose(
    [(p.step_s, p.gamma_normalized, p.epochs, p.steps, p.time_s, p.cost) for p in table],
    [(0.6, 0.85, 8.8, 880.0, 528.0, 528 / 1800), (0.4, 0.75, 8.0, 400.0, 160.0, 160 / 900)],
    rtol=1e-12,
  )


def test_partial_search_on_affine_data_equals_the_full_search():
  kwargs = dict(dataset_size=12800, price_per_hour=0.36)
  full = full_search([profile(k, b) for k in WORKERS for b in BATCHES], RUNS, **kwargs)
  extremes = [profile(2, 64), profile(2, 1024), profile(8, 1024)]
  partial = partial_search(extremes, RUNS, workers=WORKERS, batches=BATCHES, **kwargs)
  assert [(p.num_workers, p.batch_size) for p in partial] == [
    (k, b) for k in WORKERS for b in BATCHES
  ]
  np.testing.assert_allclose(
    [tuple(p) for p in partial], [tuple(p) for p in full], rtol=1e-9, atol=1e-12
  )
  # and each row is the true model's prediction
  np.testing.assert_allclose(
    tuple(partial[4]), tuple(TRUE.predict(4, 256, **kwargs)), rtol=1e-9, atol=1e-12
  )


def test_partial_search_skips_batches_smaller_than_k():
  extremes = [profile(2, 64), profile(2, 1024), profile(8, 1024)]
  table = partial_search(
    extremes, RUNS, workers=(2, 8), batches=(4, 64), dataset_size=640, price_per_hour=1.0
  )
  assert [(p.num_workers, p.batch_size) for p in table] == [(2, 4), (2, 64), (8, 64)]


# --- choice -----------------------------------------------------------------------

# A convex decreasing cost–time curve T = 1..5, C = 10, 4, 2, 1.5, 1.2, and two dominated points.
CURVE = [row(16, 1.0, 10.0), row(8, 2.0, 4.0), row(4, 3.0, 2.0), row(2, 4.0, 1.5), row(1, 5.0, 1.2)]
DOMINATED = [row(12, 2.5, 4.5), row(3, 4.5, 1.5)]  # (2, 4) beats the first, (4, 1.5) the second


def test_pareto_front():
  front = pareto_front(DOMINATED + CURVE[::-1])
  assert [(p.time_s, p.cost) for p in front] == [
    (1.0, 10.0),
    (2.0, 4.0),
    (3.0, 2.0),
    (4.0, 1.5),
    (5.0, 1.2),
  ]
  # equal (T, C): one kept, the lower K
  assert [p.num_workers for p in pareto_front([row(4, 1.0, 1.0), row(2, 1.0, 1.0)])] == [2]


def test_knee_of_a_convex_curve_by_hand():
  # Kneedle: x = (T − 1)/4 = (0, .25, .5, .75, 1); y = (C − 1.2)/8.8 = (1, .3182, .0909, .0341, 0)
  # difference D = (1 − y) − x = (0, .4318, .4091, .2159, 0): the local maximum is at T = 2,
  # its threshold .4318 − 1 · .25 (mean x-spacing) = .1818, and D falls to 0 < .1818 at T = 5.
  p = choose(DOMINATED + CURVE, 'knee')
  assert (p.time_s, p.cost, p.num_workers) == (2.0, 4.0, 8)
  assert knee(CURVE).num_workers == 8
  # the cost cap removes K = 16 and 8: front T = 3, 4, 5, C = 2, 1.5, 1.2: x = (0, .5, 1),
  # y = (1, .375, 0), D = (0, .125, 0): maximum at T = 4, threshold .125 − .5 < 0 is never
  # crossed, so kneed finds none and the argmax of D is taken
  with pytest.warns(UserWarning, match='kneed found no knee'):
    p = choose(CURVE, 'knee', max_cost=3.0)
  assert p.num_workers == 2


def test_knee_of_two_points_is_the_faster_with_a_warning():
  with pytest.warns(UserWarning, match='kneed found no knee on a Pareto front of 2 points'):
    p = knee([row(8, 1.0, 2.0), row(4, 2.0, 1.0)])  # D = (0, 0): a tie, the faster
  assert p.num_workers == 8
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert knee([row(8, 1.0, 2.0)]).num_workers == 8  # one point: no warning


def test_choose_time_and_cost_and_caps():
  table = DOMINATED + CURVE
  assert choose(table, 'time').num_workers == 16  # T = 1
  assert choose(table, 'cost').num_workers == 1  # C = 1.2
  assert choose(table, 'time', max_cost=3.0).num_workers == 4  # T = 3, C = 2
  assert choose(table, 'cost', max_time_s=2.5).num_workers == 8  # C = 4 (K = 12 costs 4.5)
  assert choose(table, 'time', max_workers=4).num_workers == 4
  assert choose(table, 'cost', min_workers=4).num_workers == 4
  assert choose([row(8, 1.0, 2.0, b=512), row(4, 2.0, 1.0, b=128)], max_batch=256).batch_size == 128
  # ties: the same time, the cheaper; the same cost, the faster
  assert choose([row(2, 1.0, 2.0), row(4, 1.0, 1.0)], 'time').num_workers == 4
  assert choose([row(2, 3.0, 1.0), row(4, 2.0, 1.0)], 'cost').num_workers == 4


def test_choose_errors():
  with pytest.raises(
    ValueError, match=r'no configuration satisfies max_cost=1\.0, max_time_s=1\.5'
  ):
    choose(CURVE, max_cost=1.0, max_time_s=1.5)
  with pytest.raises(ValueError, match=r'no configuration satisfies max_batch=32'):
    choose(CURVE, max_batch=32)
  with pytest.raises(ValueError, match=r"objective must be one of .*, got 'fast'"):
    choose(CURVE, 'fast')
  with pytest.raises(ValueError, match='non-finite'):
    choose([row(2, float('nan'), 1.0)])
  with pytest.raises(ValueError, match='table is empty'):
    choose([])


# --- errors -----------------------------------------------------------------------


def test_fit_errors():
  one_k = [profile(4, 64), profile(4, 256)]
  with pytest.raises(ValueError, match=r'sync_s = s0 \+ s1·K.*profile at least two K'):
    fit(one_k, RUNS)
  one_b_per_worker = [profile(2, 64), profile(4, 128)]  # B/K = 32 in both
  with pytest.raises(ValueError, match='profile at least two per-worker batches B/K'):
    fit(one_b_per_worker, RUNS)
  one_b = [profile(2, 256), profile(4, 256)]
  with pytest.raises(ValueError, match='profile at least two global batches B'):
    fit(one_b, RUNS)
  extremes = [profile(2, 64), profile(2, 1024), profile(8, 1024)]
  with pytest.raises(ValueError, match='at least two configurations with different γ/K'):
    fit(extremes, [(0.8, 9.0), (0.8, 10.0)])
  with pytest.raises(ValueError, match='epochs > 0'):
    fit(extremes, [(0.8, 9.0), (0.9, float('nan'))])
  with pytest.raises(ValueError, match='profiles is empty'):
    fit([], RUNS)
  with pytest.raises(ValueError, match='a profile needs finite times'):
    fit([*extremes, Profile(2, 64, float('inf'), 0.1, 0.1, 0.5)], RUNS)
  with pytest.raises(ValueError, match='batch_size must be >= num_workers'):
    fit([*extremes, Profile(8, 4, 0.3, 0.1, 0.1, 0.5)], RUNS)


def test_predict_errors():
  with pytest.raises(ValueError, match='dataset_size must be >= 1'):
    TRUE.predict(4, 256, dataset_size=0, price_per_hour=1.0)
  with pytest.raises(ValueError, match='price_per_hour must be finite'):
    TRUE.predict(4, 256, dataset_size=10, price_per_hour=-1.0)
  bad = TRUE._replace(e_star=-10.0)  # e = −10 + 8·0.625 < 0
  with pytest.raises(ValueError, match=r'predicted epochs at K=4, B=256 must be finite and > 0'):
    bad.predict(4, 256, dataset_size=10, price_per_hour=1.0)
  with pytest.raises(ValueError, match=r'the grid .* is empty'):
    partial_search(
      [profile(2, 64), profile(2, 1024), profile(8, 1024)],
      RUNS,
      workers=(8,),
      batches=(4,),
      dataset_size=10,
      price_per_hour=1.0,
    )


# --- the pipeline (plan_job) -----------------------------------------------------------

D = 6400  # examples per epoch of the synthetic job


def true_measure(calls: list):
  """A `measure` of the synthetic job: every trial gives TRUE's step, γ/K and epochs exactly."""

  def measure(kind: str, k: int, b: int, steps: int) -> scavenger.Measurement:
    calls.append((kind, k, b, steps))
    out = scavenger.Measurement(k, b, *profile(k, b)[2:])
    if kind != 'target':
      return out
    n = TRUE.epochs(out.gamma_normalized) * D / b  # e·D/B steps of τ seconds
    return out._replace(steps=n, time_s=n * out.step_s)

  return measure


def test_plan_job_profiles_the_corners_fits_chooses_and_checks():
  calls = []
  job = scavenger.plan_job(
    true_measure(calls), workers=WORKERS, batches=BATCHES, targets=[(2, 64), (8, 1024)],
    profile_steps=10, max_steps=50, dataset_size=D, price=0.9, objective='time',
  )  # fmt: skip
  corners = [('profile', k, b, 10) for k, b in [(2, 64), (2, 1024), (8, 64), (8, 1024)]]
  assert calls[:6] == [*corners, ('target', 2, 64, 50), ('target', 8, 1024, 50)]
  np.testing.assert_allclose(job.model, TRUE, rtol=1e-9, atol=1e-12)
  assert [(p.num_workers, p.batch_size) for p in job.table] == [
    (k, b) for k in WORKERS for b in BATCHES
  ]
  assert job.chosen == choose(job.table, 'time') and job.front == pareto_front(job.table)
  # γ/K = 0.5 + 2/√64 = 0.75: e = 2 + 8·0.75 = 8 epochs = 8·6400/64 = 800 steps
  assert job.target_runs[0].epochs == pytest.approx(8.0) and job.target_runs[0].steps == 800
  key = (job.chosen.num_workers, job.chosen.batch_size)
  assert key == (job.actual.K, job.actual.B)
  assert len(calls) == 6 + (key not in [(2, 64), (8, 1024)])  # the choice trained if new
  for run in (*job.target_runs, job.actual):  # cost = T / 3600 h · K · p
    assert run.cost == pytest.approx(run.time_s / 3600 * run.K * 0.9)
  assert [c['what'] for c in job.compare] == list(scavenger.pipeline.COMPARED)
  for c in job.compare:  # the models are exact: predicted == actual
    assert c['predicted'] == pytest.approx(c['actual']) and c['error'] in ('+0.0%', '-0.0%'), c
  assert job.notes == []


def test_plan_job_reuses_a_run_to_the_target_and_fits_on_predicted_noise():
  calls = []
  job = scavenger.plan_job(
    true_measure(calls), workers=WORKERS, batches=BATCHES, targets=[(2, 64), (8, 1024)],
    profile_steps=10, max_steps=50, dataset_size=D, price=0.9, search='full',
    epoch_noise='predicted', objective='time', caps={'max_workers': 2, 'max_batch': 64},
  )  # fmt: skip
  assert job.model is None and len(job.table) == len(WORKERS) * len(BATCHES)
  assert (job.chosen.num_workers, job.chosen.batch_size) == (2, 64)
  assert job.actual == job.target_runs[0] and len(calls) == 9 + 2  # no trial for the choice


def test_plan_job_errors():
  calls = []
  kwargs = dict(profile_steps=10, max_steps=50, dataset_size=D, price=0.9)
  with pytest.raises(ValueError, match=r'every batch must be a multiple of every K.*\(8, 100\)'):
    scavenger.plan_job(true_measure(calls), workers=WORKERS, batches=(100,), targets=[], **kwargs)
  with pytest.raises(ValueError, match='targets must be two'):
    scavenger.plan_job(
      true_measure(calls), workers=WORKERS, batches=BATCHES, targets=[(2, 64)], **kwargs
    )
  assert calls == []  # checked before any trial
  # γ/K depends on B only: two runs at one B cannot fit e = e* + θ·γ/K
  with pytest.raises(scavenger.PlanError, match='different γ/K'):
    scavenger.plan_job(
      true_measure(calls), workers=WORKERS, batches=BATCHES, targets=[(2, 64), (4, 64)], **kwargs
    )
  with pytest.raises(scavenger.PlanError, match='no configuration satisfies max_cost'):
    scavenger.plan_job(
      true_measure([]), workers=WORKERS, batches=BATCHES, targets=[(2, 64), (8, 1024)],
      caps={'max_cost': 1e-9}, **kwargs,
    )  # fmt: skip
