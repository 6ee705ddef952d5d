"""experiments/hetero_report.py: bench_hetero's allocations, model of a run, times and targets.

The runs themselves need root and network namespaces (`make bench-hetero`); here the
figures they feed are checked against hand-computed values on made-up records.
"""

import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, 'experiments'))
import hetero_report

# hosts: a = 30 ms a step, 300 examples/s; two fast ones at 2 ms and 2,000 / 2,500 examples/s
LINES = [(0.03, 300.0), (0.002, 2000.0), (0.002, 2500.0)]


def test_equalising_gives_each_unit_to_the_host_it_lengthens_least():
  # G = 96 in 8s: every host 8 first (0.0567, 0.006, 0.0052 s); a unit more on the slow host
  # would make it 0.0833, so the 9 units left go to the fast two, each to the shorter step
  batches = hetero_report.equalising(LINES, 96, 8)
  assert sum(batches) == 96 and batches[0] == 8 and all(b % 8 == 0 for b in batches)
  time = [a + b / v for (a, v), b in zip(LINES, batches, strict=True)]
  assert max(time) == pytest.approx(LINES[0][0] + 8 / 300)
  assert batches == [8, 40, 48]  # 0.022 and 0.0212 s: host 2 is the faster
  equal = hetero_report.equalising([(0.0, 100.0)] * 3, 96, 1)
  assert equal == [32, 32, 32]


def test_a_host_line_through_two_batches_by_hand():
  # 8 examples in 40 ms, 128 in 160: 1 ms an example, 32 ms fixed
  a, v = hetero_report.host_line(8, 128, 0.04, 0.16)
  assert a == pytest.approx(0.032) and v == pytest.approx(1000.0)
  # 4 in 14 ms, 16 in 73: the line would cross below 0; through the origin and (16, 73 ms)
  a, v = hetero_report.host_line(4, 16, 0.014, 0.073)
  assert a == 0.0 and v == pytest.approx(16 / 0.073)


def _records(steps, batches=None, synced=None, comm=0.01):
  out = []
  for t in range(steps):
    r = {'step': t + 1, 'comm_s@x': comm, 'synced': 1 if synced is None else synced[t],
         'step_s': 0.1}  # fmt: skip
    if batches is not None:
      r['batches'] = batches
    out.append(r)
  return out


def test_the_model_of_a_bsp_run_by_hand():
  # BSP, batches 32 each: computes 0.03 + 32/300 = 0.13667, 0.002 + 0.016 = 0.018,
  # 0.002 + 0.0128 = 0.0148; every step waits for the slowest, then 0.01 of communication
  line = hetero_report.timeline(_records(4), LINES, 'comm_s@x', 32)
  np.testing.assert_allclose(line.compute_s[0], [0.03 + 32 / 300, 0.018, 0.0148])
  np.testing.assert_allclose(np.diff(line.finish_s[:, 0]), [0.03 + 32 / 300 + 0.01] * 3)
  np.testing.assert_allclose(line.wait_s[0], [0, 0.03 + 32 / 300 - 0.018, 0.03 + 32 / 300 - 0.0148])


def test_the_model_of_local_sgd_waits_only_at_the_synchronising_steps():
  synced = [0, 0, 0, 1] * 2
  line = hetero_report.timeline(_records(8, synced=synced), LINES, 'comm_s@x', 32)
  slow = 0.03 + 32 / 300
  # a fast host's first three steps are its own compute (+ the step's comm, priced on each)
  np.testing.assert_allclose(np.diff(np.r_[0, line.finish_s[:3, 1]]), [0.018 + 0.01] * 3)
  np.testing.assert_allclose(line.finish_s[3], [4 * (slow + 0.01)] * 3)  # the barrier
  # a method that communicates every step (SelSync's flags) waits for the slowest every step
  line = hetero_report.timeline(_records(8, synced=synced), LINES, 'comm_s@x', 32, True)
  np.testing.assert_allclose(line.finish_s[:, 1], [(t + 1) * (slow + 0.01) for t in range(8)])


def test_the_model_of_a_streamed_run_waits_for_data_then_for_the_slowest_by_hand():
  # streams of 100, 400, 400 a second, B / K = 32 each, truncation at 0.2 s (20, 80, 80)
  from jaxdist.train import factory

  config = factory.record(
    factory.load_config(
      f'{REPO}/configs/digits.py:runlocal,workers=3',
      batch_size=96,
      **{'cluster.stream_rates': '100,400,400', 'streams.interval_s': 0.2},
    )
  )  # the run's config.json
  line = hetero_report.stream_timeline(_records(2), LINES, 'comm_s@x', config)
  slow = 0.03 + 32 / 300
  # step 1: empty buffers, 32 / 100 s for the slow stream; then the slowest host and 10 ms
  np.testing.assert_allclose(line.finish_s[0], [0.32 + slow + 0.01] * 3)
  np.testing.assert_allclose(line.compute_s[0], [slow, 0.018, 0.0148])
  np.testing.assert_allclose(line.wait_s[0], [0.32, 0.32 + slow - 0.018, 0.32 + slow - 0.0148])
  # step 2: 100 · (slow + 0.01) arrived on stream 0 during step 1, the others are full (80)
  wait = (32 - 100 * (slow + 0.01)) / 100
  np.testing.assert_allclose(line.finish_s[1], [0.32 + 2 * (slow + 0.01) + wait] * 3)
  np.testing.assert_allclose(line.wait_s[1][0], wait)
  # ScaDLES's batches: 0.2 s of each stream (20, 80, 80), so the slow host computes 20
  line = hetero_report.stream_timeline(
    _records(1), LINES, 'comm_s@x', {**config, 'batching': 'stream'}
  )
  np.testing.assert_allclose(line.compute_s[0], [0.03 + 20 / 300, 0.002 + 0.04, 0.002 + 0.032])
  np.testing.assert_allclose(line.finish_s[0], [0.2 + 0.03 + 20 / 300 + 0.01] * 3)  # still host 0


def test_time_to_target_sums_the_steps_after_the_warm_up_an_evaluation_counting_as_the_median():
  records = _records(8)
  records[0]['step_s'] = 5.0  # a warm-up compile: left out
  records[3]['test_accuracy'], records[7]['test_accuracy'] = 0.5, 0.95
  records[3]['step_s'] = 9.0  # its time holds the evaluation: the median instead
  records[4]['step_s'] = 0.7  # and the step after it too
  records[5]['step_s'] = 0.3
  seconds, step = hetero_report.time_to(records, 0.9, skip=1)
  # steps 2..8: 0.1 + 0.1 + median + median + 0.3 + 0.1 + median, median of steps 2..8 = 0.1
  assert step == 8 and seconds == pytest.approx(0.9)
  assert hetero_report.time_to(records, 0.99, skip=1) == (None, None)
  # a loss is reached from above: 2.5 at step 4 misses 2.4, 2.3 at step 8 reaches it
  records[3]['test_loss'], records[7]['test_loss'] = 2.5, 2.3
  assert hetero_report.time_to(records, 2.4, 1, 'test_loss') == (pytest.approx(0.9), 8)
  assert hetero_report.time_to(records, 2.2, 1, 'test_loss') == (None, None)


def test_timed_steps_leave_out_the_first_and_the_evaluations():
  records = _records(12)
  records[7]['test_accuracy'] = 0.5
  assert hetero_report.timed_steps(records, 5) == [6, 7, 10, 11, 12]  # not 8, nor 9 after it


def test_targets_hold_or_not_by_the_figures():
  def result(measured, modelled):
    return {'measured': measured, 'modelled': modelled}

  results = {'bsp': result([1.1, 1.0], [1.0, 1.0]), 'dynamic_micro': result([1.2, 1.0], [1.0, 1.0])}
  runs = [
    {'variant': 'bsp', 'seconds': 10.0, 'final': 0.96},
    {'variant': 'dynamic_micro', 'seconds': 5.5, 'final': 0.962},
  ]
  rows = hetero_report.target_rows(results, runs, ('bsp', 'dynamic_micro', 'local4'))
  got = {r['target'].split(':')[0]: (r['figure'], r['holds']) for r in rows}
  assert got['bsp'] == ('worst 10.0%', 'holds')
  assert got['dynamic_micro'] == ('worst 20.0%', 'not')
  assert got['dynamic batching (micro-batches)'] == ('0.55x', 'holds')
  assert got['dynamic batching'] == ('0.20 pp', 'holds')
  assert not math.isnan(float(got['dynamic batching'][0].split()[0]))


@pytest.mark.parametrize(
  'args, message',
  [
    (['--cpu=1,0.5'], r"--cpu names 2 hosts: the variants' settings must give 2 workers"),
    (['--rates=100,unlimited'], r"--rates: give one value or one per host \(3\), got \['100'"),
    (['--cpu=1,fast,1'], r"--cpu: give numbers > 0 or 'none', got \['1', 'fast', '1'\]"),
    (['--rates=0'], r"--rates: give numbers > 0 or 'unlimited', got \['0'\]"),
  ],
)
def test_bad_flags_stop_the_bench_before_it_builds_anything(tmp_path, args, message):
  run = subprocess.run(
    [sys.executable, os.path.join(REPO, 'experiments', 'bench_hetero.py'), *args,
     f'--workdir={tmp_path}', '--tables_only'],
    capture_output=True, text=True, timeout=120, cwd=REPO,
  )  # fmt: skip
  assert run.returncode != 0
  assert re.search(message, run.stderr + run.stdout), run.stderr[-2000:]
  assert not os.listdir(tmp_path)  # nothing written
