"""The heterogeneous cluster and its per-worker modelled clock (jaxdist.netmodel.cluster).

Expected times are worked by hand in the comments beside them; the formulas
are the module docstring's. Seconds per example e = 0.01 throughout.
"""

import numpy as np
import pytest

from jaxdist import netmodel
from jaxdist.netmodel import Cluster, WorkerClock, simulate
from jaxdist.sync import mixing_matrix
from jaxdist.train import ledger

E = 0.01  # seconds per example of a speed-1 worker
# Two workers whose slowness alternates: speeds (0.5, 1) at even steps, (1, 0.5)
# at odd ones, so a batch of 10 computes for (0.2, 0.1), then (0.1, 0.2), ...
ALTERNATING = Cluster(speeds=(1.0, 1.0), phases=((1, (0.5, 1.0)), (1, (1.0, 0.5))))
# Three workers, the last one at half speed: compute (0.1, 0.1, 0.2) per step.
ONE_SLOW = Cluster(speeds=(1.0, 1.0, 0.5))


def run(cluster, steps=4, batch=10, **kw):
  return simulate(cluster, np.full(steps, batch), E, **kw)


# --- the cluster ---------------------------------------------------------------


def test_from_cores_normalises_to_the_mean_and_names_the_h_levels():
  h2 = Cluster.from_cores('h2')
  np.testing.assert_allclose(h2.speeds, np.array([9, 12, 18]) / 13)  # 39 cores = 3 x 13
  assert h2.heterogeneity == pytest.approx(2.0)
  assert Cluster.from_cores('H10').heterogeneity == pytest.approx(10.0)
  assert Cluster.from_cores((2, 17, 20), reference=20).speeds == (0.1, 0.85, 1.0)
  assert Cluster.uniform(4).speeds == (1.0,) * 4


def test_compute_seconds_is_batch_over_speed_times_per_example_time():
  c = Cluster(speeds=(0.5, 2.0))
  np.testing.assert_allclose(c.compute_seconds(0, [10, 40], E), [0.2, 0.2])
  np.testing.assert_allclose(c.compute_seconds(0, 8, E), [0.16, 0.04])  # one batch for all


def test_a_fixed_term_is_added_on_steps_with_examples_and_slowed_with_the_worker():
  c = Cluster(speeds=(0.5, 2.0), fixed_s=(0.03, 0.001))
  # 0.03 + 10 / 0.5 * 0.01 = 0.23; 0.001 + 40 / 2 * 0.01 = 0.201
  np.testing.assert_allclose(c.compute_seconds(0, [10, 40], E), [0.23, 0.201])
  np.testing.assert_allclose(c.compute_seconds(0, [0, 40], E), [0.0, 0.201])  # none: no step
  slow = Cluster(speeds=(0.5, 2.0), fixed_s=(0.03, 0.001), straggles=((0, 3.0, 0, 1),))
  np.testing.assert_allclose(slow.compute_seconds(0, [10, 40], E), [0.69, 0.201])  # 3 x 0.23
  none = Cluster(speeds=(0.5, 2.0))
  np.testing.assert_allclose(none.compute_seconds(0, [10, 40], E), [0.2, 0.2])  # () = 0
  # BSP on the clock: the slower one's 0.23 a step
  assert simulate(c, np.full((3, 2), [10, 40]), E).total_s == pytest.approx(0.69)


def test_phases_multiply_the_speeds_and_repeat():
  c = Cluster(speeds=(1.0, 2.0), phases=((2, (1.0, 1.0)), (1, (0.5, 0.25))))
  got = [tuple(c.speeds_at(t)) for t in range(6)]
  assert got == [(1, 2), (1, 2), (0.5, 0.5), (1, 2), (1, 2), (0.5, 0.5)]


def test_stragglers_are_seeded_per_step_and_have_rate_p():
  c = Cluster(speeds=(1.0,) * 3, straggler_p=0.25, straggler_slowdown=3.0, seed=7)
  late = c.stragglers(5)
  [c.stragglers(t) for t in range(5)]
  np.testing.assert_array_equal(c.stragglers(5), late)  # independent of what was drawn before
  draws = np.stack([c.stragglers(t) for t in range(4000)])
  assert draws.mean() == pytest.approx(0.25, abs=0.02)
  other = Cluster(speeds=(1.0,) * 3, straggler_p=0.25, seed=8)
  assert not np.array_equal(draws, np.stack([other.stragglers(t) for t in range(4000)]))
  slow = c.compute_seconds(5, 10, E)
  np.testing.assert_allclose(slow, np.where(late, 0.3, 0.1))  # slowdown x3 where drawn


def test_every_worker_straggling_is_a_uniform_slowdown():
  c = Cluster(speeds=(1.0, 1.0), straggler_p=1.0, straggler_slowdown=4.0)
  assert run(c, steps=2).total_s == pytest.approx(0.8)  # 2 steps x 0.1 x 4


def test_cost_is_workers_times_hours_times_price():
  c = Cluster(speeds=(1.0, 1.0, 1.0), price=2.0)
  assert c.cost(1800.0) == pytest.approx(3.0)  # 3 workers x 0.5 h x 2
  t = simulate(c, np.full(2, 100), 1.0)  # 2 steps of 100 s
  assert t.total_s == pytest.approx(200.0)
  assert t.cost == pytest.approx(3 * 200 / 3600 * 2.0)


# --- the waiting rules, by hand ------------------------------------------------


def test_bsp_waits_for_the_slowest_every_step_then_communicates():
  t = run(ALTERNATING, comm_s=0.05)
  # each step: max compute 0.2 + 0.05 of all-reduce
  np.testing.assert_allclose(t.step_s, [0.25] * 4)
  assert t.total_s == pytest.approx(1.0)
  np.testing.assert_allclose(t.wait_s, [[0, 0.1], [0.1, 0], [0, 0.1], [0.1, 0]], atol=1e-12)
  np.testing.assert_allclose(t.compute_s, [[0.2, 0.1], [0.1, 0.2], [0.2, 0.1], [0.1, 0.2]])


def test_bsp_charges_overlapped_communication_beyond_the_slowest_compute():
  c = Cluster(speeds=(1.0, 0.5))  # compute (0.1, 0.2)
  t = simulate(c, [10], E, comm_s=0.01, overlap_s=0.15)
  assert t.total_s == pytest.approx(0.21)  # step_time(0.2, 0.01, 0.15) = 0.2 + 0.01
  t = simulate(c, [10], E, comm_s=0.01, overlap_s=0.25)
  assert t.total_s == pytest.approx(0.26)  # 0.2 + 0.01 + (0.25 - 0.2)


def test_periodic_workers_run_alone_between_syncs_and_meet_at_each_sync():
  comm = [0.0, 0.05, 0.0, 0.05]  # local SGD with period 2
  t = run(ALTERNATING, comm_s=comm, wait='periodic')
  # t0 alone: (0.2, 0.1); t1 sync: max(0.2+0.1, 0.1+0.2) + 0.05 = 0.35
  # t2 alone: (0.55, 0.45); t3 sync: max(0.55+0.1, 0.45+0.2) + 0.05 = 0.70
  np.testing.assert_allclose(t.finish_s, [[0.2, 0.1], [0.35, 0.35], [0.55, 0.45], [0.7, 0.7]])
  assert t.total_s == pytest.approx(0.70)
  assert run(ALTERNATING, comm_s=comm, wait='bsp').total_s == pytest.approx(0.9)  # 4 x 0.2 + 0.1
  # an explicit synced mask overrides comm_s > 0
  never = run(ALTERNATING, comm_s=comm, wait='periodic', synced=[False] * 4)
  np.testing.assert_allclose(never.finish_s[-1], [0.7, 0.7])  # alone: 0.2+0.15+0.2+0.15 each


def test_periodic_syncing_every_step_is_bsp():
  a = run(ONE_SLOW, comm_s=0.03, wait='periodic')
  b = run(ONE_SLOW, comm_s=0.03, wait='bsp')
  np.testing.assert_allclose(a.finish_s, b.finish_s)


def test_async_never_waits():
  t = run(ONE_SLOW, wait='async')
  np.testing.assert_allclose(t.finish_s[-1], [0.4, 0.4, 0.8])  # 4 steps of 0.1, 0.1, 0.2
  assert not t.wait_s.any()
  assert run(ALTERNATING, wait='async').total_s == pytest.approx(0.6)  # vs BSP 0.8
  assert run(ALTERNATING, wait='bsp').total_s == pytest.approx(0.8)


def test_ssp_runs_at_most_s_steps_ahead_of_the_slowest():
  t = run(ONE_SLOW, wait='ssp', staleness=1)
  # start of step t = max(own finish of t-1, every worker's finish of t-2):
  # t0 (0.1, 0.1, 0.2); t1 (0.2, 0.2, 0.4); t2 the fast ones wait for step 0
  # (done at 0.2, no wait): (0.3, 0.3, 0.6); t3 they wait for step 1 (0.4).
  np.testing.assert_allclose(
    t.finish_s, [[0.1, 0.1, 0.2], [0.2, 0.2, 0.4], [0.3, 0.3, 0.6], [0.5, 0.5, 0.8]]
  )
  np.testing.assert_allclose(t.wait_s[3], [0.1, 0.1, 0.0])
  assert t.total_s == pytest.approx(0.8)


def test_ssp_with_staleness_zero_ends_with_bsp_and_large_staleness_is_async():
  c = Cluster(speeds=(1.0, 0.7, 1.3), straggler_p=0.3, straggler_slowdown=3.0, seed=1)
  bsp = run(c, steps=30, comm_s=0.02, wait='bsp')
  ssp0 = run(c, steps=30, comm_s=0.02, wait='ssp', staleness=0)
  np.testing.assert_allclose(ssp0.step_s, bsp.step_s)
  ssp_big = run(c, steps=30, comm_s=0.02, wait='ssp', staleness=30)
  asy = run(c, steps=30, comm_s=0.02, wait='async')
  np.testing.assert_allclose(ssp_big.finish_s, asy.finish_s)
  # equal speeds, stragglers: waiting less is faster
  c = Cluster.uniform(3, straggler_p=0.3, straggler_slowdown=3.0, seed=1)
  times = [run(c, steps=30, comm_s=0.02, wait='ssp', staleness=s).total_s for s in (0, 1, 2, 30)]
  assert times == sorted(times, reverse=True) and times[0] > 1.2 * times[-1]


def test_neighbours_wait_only_for_the_models_they_receive():
  c = Cluster(speeds=(1.0, 1.0, 1.0, 0.5))  # compute (0.1, 0.1, 0.1, 0.2)
  # ring of 4: worker k waits for k-1 and k+1
  # t0: ready (0.1, 0.1, 0.1, 0.2) -> (0.2, 0.1, 0.2, 0.2)
  # t1: ready (0.3, 0.2, 0.3, 0.4) -> (0.4, 0.3, 0.4, 0.4)
  want = [[0.2, 0.1, 0.2, 0.2], [0.4, 0.3, 0.4, 0.4]]
  for neighbours in (mixing_matrix('ring', 4), [1, 3]):
    t = run(c, steps=2, wait='neighbours', neighbours=neighbours)
    np.testing.assert_allclose(t.finish_s, want)
  # one-way exponential (offsets 1, 2): worker k waits for k-1 and k-2
  # t0: (0.2, 0.2, 0.1, 0.2); t1: ready (0.3, 0.3, 0.2, 0.4) -> (0.4, 0.4, 0.3, 0.4)
  t = run(c, steps=2, wait='neighbours', neighbours=mixing_matrix('exponential', 4))
  np.testing.assert_allclose(t.finish_s, [[0.2, 0.2, 0.1, 0.2], [0.4, 0.4, 0.3, 0.4]])
  # a topology that changes every step: one peer, 4 workers: from k - 1, then k - 2, ...
  # t0 (from k-1): ready (0.1, 0.1, 0.1, 0.2) -> (0.2, 0.1, 0.1, 0.2)
  # t1 (from k-2): ready (0.3, 0.2, 0.2, 0.4) -> (0.3, 0.4, 0.3, 0.4)
  one_peer = lambda t: mixing_matrix('one_peer_exponential', 4, step=t)
  t = run(c, steps=2, wait='neighbours', neighbours=one_peer)
  np.testing.assert_allclose(t.finish_s, [[0.2, 0.1, 0.1, 0.2], [0.3, 0.4, 0.3, 0.4]])
  complete = run(c, steps=3, wait='neighbours', neighbours=mixing_matrix('complete', 4))
  np.testing.assert_allclose(complete.finish_s, run(c, steps=3).finish_s)  # == BSP


def test_the_clock_can_be_advanced_step_by_step():
  clock = WorkerClock(ONE_SLOW, E, wait='ssp', staleness=1)
  whole = run(ONE_SLOW, wait='ssp', staleness=1)
  for t in range(4):
    np.testing.assert_allclose(clock.advance(10), whole.compute_s[t])
    np.testing.assert_allclose(clock.finish_s, whole.finish_s[t])
  assert clock.total_s == pytest.approx(whole.total_s) and clock.step == 4


def test_start_step_keeps_phases_and_stragglers_in_step():
  c = Cluster(speeds=(1.0, 2.0), straggler_p=0.5, phases=((3, (1, 1)), (2, (0.5, 1))), seed=3)
  whole = run(c, steps=10, wait='async')
  resumed = WorkerClock(c, E, wait='async', start_step=6)
  for t in range(6, 10):
    np.testing.assert_allclose(resumed.advance(10), whole.compute_s[t])


# --- equal speeds: today's clock -------------------------------------------------


@pytest.mark.parametrize(
  'kw',
  [
    dict(wait='bsp'),
    dict(wait='periodic'),
    dict(wait='ssp', staleness=0),
    dict(wait='ssp', staleness=3),
    dict(wait='async'),
    dict(wait='neighbours', neighbours=[1, 4]),
    dict(wait='neighbours', neighbours=mixing_matrix('exponential', 5)),
  ],
  ids=lambda kw: '-'.join(str(v) for v in kw.values() if not hasattr(v, 'shape')),
)
def test_equal_speeds_without_stragglers_give_todays_clock(kw):
  rng = np.random.default_rng(0)
  steps, batch = 20, 16
  comm = rng.uniform(0, 0.05, steps) * (rng.random(steps) < 0.5)  # some steps communicate
  hidden = rng.uniform(0, 0.3, steps) * (rng.random(steps) < 0.3)  # some overlap the compute
  t = simulate(Cluster.uniform(5), np.full(steps, batch), E, comm, hidden, **kw)
  compute_s = batch * E
  want = [netmodel.step_time(compute_s, m, h) for m, h in zip(comm, hidden, strict=True)]
  np.testing.assert_allclose(t.step_s, want, rtol=1e-12)
  records = [
    {'step': i + 1, 'comm_s@net': m, 'overlap_s@net': h}
    for i, (m, h) in enumerate(zip(comm, hidden, strict=True))
  ]
  assert t.total_s == pytest.approx(ledger.modelled_clock(records, 'net', compute_s)[-1][1])
  assert not t.wait_s.any()


# --- bad input -------------------------------------------------------------------


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(speeds=(1.0, 0.0)), 'speeds must all be > 0'),
    (dict(speeds=(1.0, -2.0)), 'speeds must all be > 0'),
    (dict(speeds=()), 'speeds must name at least one worker'),
    (dict(speeds='fast'), 'speeds must be a sequence of numbers'),
    (dict(speeds=(1.0,), straggler_p=1.5), r'straggler_p must be in \[0, 1\], got 1.5'),
    (dict(speeds=(1.0,), straggler_p=-0.1), r'straggler_p must be in \[0, 1\]'),
    (dict(speeds=(1.0,), straggler_slowdown=0.5), 'straggler_slowdown must be >= 1'),
    (dict(speeds=(1.0,), price=-1), 'price must be >= 0'),
    (dict(speeds=(1.0, 1.0), stream_rates=(5.0,)), 'stream_rates has 1 workers, but speeds has 2'),
    (dict(speeds=(1.0,), stream_rates=(-5.0,)), 'stream_rates must all be >= 0'),
    (dict(speeds=(1.0, 1.0), fixed_s=(0.1,)), 'fixed_s has 1 workers, but speeds has 2'),
    (dict(speeds=(1.0,), fixed_s=(-0.1,)), 'fixed_s must all be >= 0 s'),
    (dict(speeds=(1.0, 1.0), phases=((5, (1.0,)),)), r'phases\[0\] has 1 speed factors'),
    (dict(speeds=(1.0,), phases=((0, (1.0,)),)), r'phases\[0\] must last >= 1 step'),
    (dict(speeds=(1.0,), phases=((2, (0.0,)),)), r'phases\[0\] speed factors must all be > 0'),
    (dict(speeds=(1.0,), phases=(3,)), r'phases\[0\] must be a \(steps, factors\) pair'),
  ],
)
def test_bad_cluster_is_an_error_naming_the_argument(kwargs, match):
  with pytest.raises(ValueError, match=match):
    Cluster(**kwargs)


def test_bad_clock_input_is_an_error_naming_the_argument():
  with pytest.raises(ValueError, match='cores must all be > 0'):
    Cluster.from_cores((4, 0))
  with pytest.raises(ValueError, match='cores must be numbers or one of'):
    Cluster.from_cores('h3')
  with pytest.raises(ValueError, match=r'describes 3 workers .* but the run has 8'):
    ONE_SLOW.check_workers(8)
  with pytest.raises(ValueError, match='wait must be one of'):
    WorkerClock(ONE_SLOW, E, wait='bulk')
  with pytest.raises(ValueError, match='staleness must be an integer >= 0'):
    WorkerClock(ONE_SLOW, E, wait='ssp', staleness=-1)
  with pytest.raises(ValueError, match='needs neighbours'):
    WorkerClock(ONE_SLOW, E, wait='neighbours')
  with pytest.raises(ValueError, match=r'neighbours must be a \[3, 3\] mixing matrix'):
    WorkerClock(ONE_SLOW, E, wait='neighbours', neighbours=np.ones((4, 4)))
  with pytest.raises(ValueError, match=r'batches must be \[steps, 3\]'):
    simulate(ONE_SLOW, np.ones((4, 2)), E)
  with pytest.raises(ValueError, match=r'comm_s must have one value per step \(4\)'):
    simulate(ONE_SLOW, np.ones(4), E, comm_s=[0.1, 0.2])
