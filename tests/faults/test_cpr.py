"""CPR (Maeng et al., MLSys 2021): the hybrid DLRM layout, its formulas and its recoveries."""

import math
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxdist import runtime
from jaxdist.comm import hlo
from jaxdist.data.clicks import clicks
from jaxdist.faults import cpr, hybrid, report
from jaxdist.models import dlrm
from jaxdist.train import failures as simulation

from conftest import REPO, xla_flags_for_tests

TABLES, ROWS, DENSE = 8, 50, 4
MODEL = dlrm.DLRM(embed_dim=8, bottom=(16,), top=(16,))


def _finite_close(actual, desired, tol=1e-5):
  for a, d in zip(jax.tree.leaves(actual), jax.tree.leaves(desired), strict=True):
    a, d = np.asarray(a), np.asarray(d)
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(d)), 'NaN or inf'
    np.testing.assert_allclose(a, d, rtol=tol, atol=tol, equal_nan=False)


# --- the hybrid layout ------------------------------------------------------------------------


@pytest.mark.parametrize(
  ('devices', 'optimizer', 'lr_tables'),
  [(8, 'sgd', 20.0), (4, 'sgd', 20.0), (8, 'rowwise_adagrad', 0.1)],
)
def test_hybrid_step_equals_one_device_on_the_global_batch(devices, optimizer, lr_tables):
  # 8 tables on 8 workers (one each) or 4 (two each); a large table learning rate so that a
  # wrong scale of the tables' gradients (N x, or 1/N x, the mean) shows at once
  data = clicks(num_tables=TABLES, rows=ROWS, num_dense=DENSE, seed=1)
  mesh = runtime.layout(devices).mesh
  kwargs = dict(lr_tables=lr_tables, lr_mlp=0.5, optimizer=optimizer)
  reference = hybrid.make_reference_step(MODEL, **kwargs)
  step = hybrid.make_hybrid_step(MODEL, mesh, **kwargs)
  init = hybrid.init_state(MODEL, jax.random.key(0), num_tables=TABLES, rows=ROWS, num_dense=DENSE)
  one, many = init, jax.tree.map(jnp.copy, init)
  for t in range(4):
    b = data.batch(t, 64)
    one, loss_one = reference(one, b.dense, b.ids, b.labels)
    many, loss_many = step(many, b.dense, b.ids, b.labels)
    _finite_close(loss_many, loss_one)
  _finite_close(many, one)
  moved = np.abs(np.asarray(one.tables) - np.asarray(init.tables)).max()
  assert moved > 1e-3, 'the tables did not train: the test would prove nothing'


def _all_reduced_floats(text):
  total = 0
  for line in text.splitlines():
    if ' all-reduce(' in line or ' all-reduce-start(' in line:
      result_type = line.split('=', 1)[1].split(' all-reduce')[0]
      total += sum(math.prod(int(d) for d in dims.split(',') if d)
                   for _, dims in re.findall(r'(f32)\[([\d,]*)\]', result_type))  # fmt: skip
  return total


def test_hlo_shows_all_to_all_for_tables_and_all_reduce_for_the_mlp():
  mesh = runtime.layout(8).mesh
  step = hybrid.make_hybrid_step(MODEL, mesh, lr_tables=1.0, lr_mlp=0.1)
  state = hybrid.init_state(MODEL, jax.random.key(0), num_tables=TABLES, rows=ROWS, num_dense=DENSE)
  b = clicks(num_tables=TABLES, rows=ROWS, num_dense=DENSE).batch(0, 64)
  text = step.lower(state, b.dense, b.ids, b.labels).compile().as_text()
  found = hlo.collectives(text)
  kinds = [c.kind for c in found]
  a2a = [c for c in found if c.kind == 'all-to-all']
  # ids to the tables' owners (s32), vectors back (f32), their gradients to the owners (f32)
  assert len(a2a) == 3, kinds
  assert [set(c.dtypes) for c in a2a].count({'s32'}) == 1, a2a
  assert [set(c.dtypes) for c in a2a].count({'f32'}) == 2, a2a
  assert 'all-reduce' in kinds and 'all-gather' not in kinds, kinds
  # what is all-reduced is the MLP's gradient and the loss, never a table (a table's gradient
  # would add ROWS x embed_dim floats)
  mlp_size = sum(x.size for x in jax.tree.leaves(state.mlp))
  assert _all_reduced_floats(text) == mlp_size + 1


def test_sharded_lookup_equals_lookup():
  mesh = runtime.layout(4).mesh
  tables = jax.random.normal(jax.random.key(0), (TABLES, ROWS, 3))
  ids = clicks(num_tables=TABLES, rows=ROWS, num_dense=DENSE).batch(0, 32).ids
  sharded = jax.jit(
    jax.shard_map(
      lambda t, i: dlrm.sharded_lookup(t, i, runtime.DATA),
      mesh=mesh,
      in_specs=(P(runtime.DATA), P(runtime.DATA)),
      out_specs=P(runtime.DATA),
      check_vma=False,
    )
  )
  np.testing.assert_array_equal(sharded(tables, ids), dlrm.lookup(tables, ids))


# --- formulas by hand -------------------------------------------------------------------------


def test_young_interval_by_hand():
  assert cpr.young_interval(2.0, 100.0) == pytest.approx(20.0)  # sqrt(2 * 2 * 100)
  assert cpr.young_interval(0.5, 200.0) == pytest.approx(math.sqrt(200.0))


def test_pls_interval_and_expected_pls_by_hand():
  assert cpr.pls_interval(0.05, 200.0, 8) == pytest.approx(160.0)  # 2 * 0.05 * 8 * 200
  assert cpr.expected_pls(160.0, 200.0, 8) == pytest.approx(0.05)
  assert cpr.pls([100, 300], num_shards=4, total_samples=1000) == pytest.approx(0.1)
  assert cpr.pls([], num_shards=4, total_samples=1000) == 0.0


def test_expected_overhead_by_hand():
  costs = cpr.Costs(step_s=1, save_s=0.5, load_s=1, restart_s=0.5, mttf_s=200)
  full = 0.5 / 14 + (14 / 2 + 1 + 0.5) / 200
  partial = 0.5 / 160 + (1 / 8 + 0.5) / 200
  assert cpr.expected_overhead('full', 14, costs, 8) == pytest.approx(full)
  assert cpr.expected_overhead('partial', 160, costs, 8) == pytest.approx(partial)


def test_priority_schedule_keeps_the_write_budget():
  full, every = cpr.priority_schedule(100.0, 0.125, 8)
  assert (full, every) == (pytest.approx(187.5), pytest.approx(187.5 / 8))
  assert 1 / full + 7 * 0.125 / full == pytest.approx(1 / 100.0)
  costs = cpr.Costs(step_s=1, mttf_s=100)
  s = cpr.strategy('partial_mfu', costs, 8, pls_target=0.05, fraction=0.125, per_full=8)
  assert (s.recovery, s.priority, s.priority_every, s.interval) == ('partial', 'mfu', 19, 152)
  assert cpr.strategy('full', costs, 8).interval == round(math.sqrt(2 * 1 * 100))
  assert cpr.strategy('partial', costs, 8, pls_target=0.05).interval == 80


# --- MFU / SSU on a tiny table ----------------------------------------------------------------


def test_mfu_picks_the_most_used_rows_of_the_shard():
  counts = np.array([[5, 0, 2, 9], [1, 1, 7, 0], [8, 8, 8, 8], [0, 0, 0, 3]])
  assert cpr.mfu_rows(counts[0], 2).tolist() == [0, 3]
  assert cpr.mfu_rows(counts[0], 10).tolist() == [0, 2, 3]  # never an unused row
  assert cpr.mfu_rows(np.array([2, 2, 2]), 2).tolist() == [0, 1]  # ties: the lower id
  mask = cpr.mfu_mask(counts, tables=range(0, 2), k=3)  # shard 0 of 2: tables 0 and 1
  assert np.argwhere(mask).tolist() == [[0, 0], [0, 3], [1, 2]]
  assert not mask[2:].any()


def test_ssu_keeps_a_bounded_sample_that_favours_hot_rows():
  s = cpr.SSUSampler(num_tables=2, rows=4, num_shards=2, capacity=2, rate=1.0, seed=0)
  s.record(np.array([[3, 1], [3, 2], [0, 3]]))
  assert np.argwhere(s.take(0)).tolist() == [[0, 0], [0, 3]]  # rows 0 and 3 of table 0
  assert np.argwhere(s.take(1)).tolist() == [[1, 1], [1, 2]]  # capacity 2: the first two
  assert not s.take(0).any()  # taken rows are forgotten
  # at a low rate the sampled rows follow the lookup frequencies: hot row 0 is nearly always in
  rng = np.random.default_rng(0)
  p = np.array([0.7, 0.2, 0.05, 0.05])
  hits = np.zeros(4)
  sampler = cpr.SSUSampler(num_tables=1, rows=4, num_shards=1, capacity=4, rate=0.05, seed=1)
  for _ in range(200):
    sampler.record(rng.choice(4, size=(20, 1), p=p))
    hits += sampler.take(0)[0]
  assert hits[0] > hits[1] > max(hits[2], hits[3])


# --- failures ---------------------------------------------------------------------------------


def test_failure_trace_statistics():
  f = cpr.sample_failures(mttf_s=10.0, horizon_s=100_000.0, num_workers=8, seed=0)
  gaps = np.diff(np.concatenate([[0.0], f.times_s]))
  assert len(gaps) == pytest.approx(10_000, rel=0.05)
  assert gaps.mean() == pytest.approx(10.0, rel=0.03)  # std of the mean ~ 1%
  assert gaps.std() == pytest.approx(10.0, rel=0.05)  # exponential: std = mean
  counts = np.bincount(f.workers, minlength=8)
  assert counts.min() > 0.9 * len(gaps) / 8 and counts.max() < 1.1 * len(gaps) / 8
  again = cpr.sample_failures(10.0, 100_000.0, 8, seed=0)
  np.testing.assert_array_equal(again.times_s, f.times_s)
  assert not np.array_equal(cpr.sample_failures(10.0, 1000.0, 8, seed=1).times_s, f.times_s[:5])


# --- checkpoints and recovery -----------------------------------------------------------------


def test_partial_restore_resets_exactly_the_failed_shards_rows():
  rng = np.random.default_rng(0)
  tables, accum = rng.standard_normal((4, 6, 3)), rng.random((4, 6))
  ckpt = cpr.RowCheckpoint(tables, accum)
  now_tables, now_accum = tables + 1, accum + 1
  shard = cpr.shard_tables(1, num_tables=4, num_shards=2)
  assert list(shard) == [2, 3]
  back_tables, back_accum = ckpt.restore([now_tables, now_accum], shard)
  np.testing.assert_array_equal(back_tables[2:], tables[2:])
  np.testing.assert_array_equal(back_accum[2:], accum[2:])
  np.testing.assert_array_equal(back_tables[:2], now_tables[:2])  # the others untouched
  np.testing.assert_array_equal(back_accum[:2], now_accum[:2])
  np.testing.assert_array_equal(now_tables, tables + 1)  # restore copies, never mutates
  # a prioritised save writes only its rows
  mask = np.zeros((4, 6), bool)
  mask[3, [0, 5]] = True
  assert ckpt.save([now_tables, now_accum], step=7, mask_TxR=mask) == 2
  np.testing.assert_array_equal(ckpt.values[0][3, [0, 5]], now_tables[3, [0, 5]])
  np.testing.assert_array_equal(ckpt.values[0][3, 1:5], tables[3, 1:5])
  assert ckpt.saved_at[3, 0] == 7 and ckpt.saved_at[3, 1] == 0


def _run(strategy, failures, steps, costs, **kwargs):
  data = clicks(num_tables=TABLES, rows=ROWS, num_dense=DENSE, seed=2)
  return simulation.train_with_failures(
    data, strategy, costs, mesh=runtime.layout(8).mesh, steps=steps, batch_size=64,
    model=MODEL, failures=failures, test_size=256, **kwargs,
  )  # fmt: skip


COSTS = cpr.Costs(step_s=1.0, save_s=0.5, load_s=2.0, restart_s=1.0, mttf_s=100.0)


def test_full_recovery_resumes_from_the_checkpoint():
  steps = 8
  free = _run(cpr.Strategy('none', 'none', 0), None, steps, COSTS)
  # checkpoints after steps 3 and 6; clock: 1 2 3 (+0.5) 4.5 5.5 -> a failure at 5.2 is seen
  # after step 5 and rolls back to step 3: steps 4 and 5 run again
  trace = cpr.Failures(np.array([5.2]), np.array([6]))
  full = _run(cpr.Strategy('full', 'full', 3), trace, steps, COSTS)
  assert full['failures'] == 1 and full['executed_steps'] == steps + 2
  assert full['lost_s'] == 2.0 and full['recovery_s'] == 1.0 + 2.0  # restart + full load
  assert full['checkpoint_s'] == 2 * 0.5  # after steps 3 and 6 (step 3 is not saved again)
  _finite_close(full['state'], free['state'], tol=0)  # the same steps on the same batches
  assert full['total_s'] == pytest.approx(steps + full['checkpoint_s'] + 2.0 + 3.0)
  assert full['test_loss'] == free['test_loss']


def test_partial_recovery_reloads_only_the_failed_shard_and_goes_on():
  steps, failed_after, worker = 6, 4, 5
  trace = cpr.Failures(np.array([failed_after - 0.5]), np.array([worker]))
  strategy = cpr.Strategy('partial', 'partial', 100)  # no checkpoint but the initial state
  run = _run(strategy, trace, steps, COSTS, optimizer='sgd', lr_tables=20.0, lr_mlp=0.5)
  assert run['failures'] == 1 and run['executed_steps'] == steps and run['lost_s'] == 0
  assert run['recovery_s'] == 1.0 + 2.0 / 8  # restart + 1/N of the load
  # by hand: the same steps, the failed worker's table set back to its initial rows after step 4
  data = clicks(num_tables=TABLES, rows=ROWS, num_dense=DENSE, seed=2)
  step = hybrid.make_hybrid_step(MODEL, runtime.layout(8).mesh, lr_tables=20.0, lr_mlp=0.5)
  init = hybrid.init_state(MODEL, jax.random.key(0), num_tables=TABLES, rows=ROWS, num_dense=DENSE)
  state = jax.tree.map(jnp.copy, init)
  for t in range(steps):
    b = data.batch(t, 64)
    state, _ = step(state, b.dense, b.ids, b.labels)
    if t + 1 == failed_after:
      before = np.asarray(state.tables)
      tables = before.copy()
      tables[worker] = np.asarray(init.tables)[worker]
      state = hybrid.DLRMState(jnp.asarray(tables), state.mlp, state.accum)
  _finite_close(run['state'], jax.device_get(state), tol=0)
  assert not np.array_equal(before[worker], np.asarray(init.tables)[worker])  # it had moved
  # one lost shard of 8, 4 steps of samples: PLS = 4 * 64 / (8 * 6 * 64) = lost updates
  assert run['pls'] == pytest.approx(4 / (8 * 6))
  assert run['lost_updates'] == pytest.approx(run['pls'])


def test_no_recovery_is_the_failure_free_baseline_without_checkpoints():
  # Young's interval √(2 · 0.5 s · 49 s) = 7 s = 7 steps of 1 s. Without failures, 20 steps:
  # 'full' saves after steps 7 and 14 (never after the last): 20 + 2 · 0.5 = 21 s. 'none' is
  # the baseline the overheads are fractions of: no failures, no checkpoints, 20 steps = 20 s.
  costs = cpr.Costs(step_s=1.0, save_s=0.5, load_s=1.0, restart_s=0.5, mttf_s=49.0)
  none, full = cpr.strategy('none', costs, 8), cpr.strategy('full', costs, 8)
  assert (none.recovery, none.interval) == ('none', 0)  # never checkpoints
  assert (full.recovery, full.interval) == ('full', 7)
  no_failures = cpr.Failures(np.zeros(0), np.zeros(0, np.int64))
  free = _run(none, None, 20, costs)  # its sampled failures are not injected
  saved = _run(full, no_failures, 20, costs)
  assert (free['failures'], free['full_saves'], free['interval_steps']) == (0, 0, 0)
  assert free['checkpoint_s'] == 0.0 and free['total_s'] == pytest.approx(20.0, abs=1e-12)
  assert free['total_overhead'] == 0.0 and free['failure_free_s'] == 20.0
  assert (saved['failures'], saved['full_saves'], saved['interval_steps']) == (0, 2, 7)
  assert saved['checkpoint_s'] == pytest.approx(1.0, abs=1e-12)
  assert saved['total_s'] == pytest.approx(21.0, abs=1e-12)
  assert saved['checkpoint_overhead'] == pytest.approx(1.0 / 20.0, abs=1e-12)
  _finite_close(saved['state'], free['state'], tol=0)  # saving changes nothing else


def test_every_strategy_runs_and_its_overheads_add_up():
  costs = cpr.Costs(step_s=1.0, save_s=0.5, load_s=1.0, restart_s=0.5, mttf_s=6.0)
  runs = []
  for name in ('none', 'full', 'partial', 'partial_mfu', 'partial_ssu'):
    strategy = cpr.strategy(name, costs, 8, pls_target=0.05, fraction=0.25, per_full=4)
    s = _run(strategy, None, 40, costs, failure_seed=3)
    runs.append(s)
    assert s['total_s'] == pytest.approx(
      s['failure_free_s'] + s['checkpoint_s'] + s['lost_s'] + s['recovery_s']
    )
    assert np.isfinite(s['test_loss']) and 0 <= s['test_auc'] <= 1
  none, full, partial, mfu, ssu = runs
  assert none['failures'] == 0 and none['total_overhead'] == 0
  assert full['failures'] > 0 and full['pls'] == 0 and full['lost_s'] > 0
  assert partial['lost_s'] == 0 and partial['pls'] > 0
  assert partial['lost_updates'] == pytest.approx(partial['pls'])
  for s in (mfu, ssu):
    assert s['priority_saves'] > 0 and s['lost_updates'] < s['pls']
  table = report.rows(runs)
  assert [r['label'] for r in table][:3] == ['none', 'full', 'partial @ 0.05']
  assert report.plot(runs).axes


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ('call', 'message'),
  [
    (lambda: cpr.Costs(mttf_s=0), 'mttf_s must be > 0, got 0'),
    (lambda: cpr.Costs(save_s=-1), 'save_s must be > 0'),
    (lambda: cpr.Costs(load_s=-1), 'load_s must be >= 0'),
    (lambda: cpr.young_interval(1.0, -5.0), 'mttf_s must be > 0, got -5.0'),
    (lambda: cpr.pls_interval(1.5, 100.0, 8), r'pls_target must be in \(0, 1\), got 1.5'),
    (lambda: cpr.pls_interval(0.0, 100.0, 8), r'pls_target must be in \(0, 1\), got 0.0'),
    (lambda: cpr.sample_failures(0.0, 10.0, 8, 0), 'mttf_s must be > 0'),
    (lambda: cpr.strategy('bogus', cpr.Costs(), 8), "unknown strategy 'bogus'"),
    (lambda: cpr.strategy('partial_mfu', cpr.Costs(), 8, fraction=1.0), 'fraction must be in'),
    (lambda: cpr.Strategy('x', 'full', 10, priority='mfu'), 'needs partial recovery'),
    (lambda: cpr.Strategy('x', 'full', 0), 'interval must be >= 1'),
    (lambda: cpr.Strategy('x', 'none', 7), "recovery 'none' never checkpoints: interval must "
     'be 0, got 7'),
    (lambda: cpr.shard_tables(0, 6, 4), r'num_tables \(6\) must be a multiple'),
    (lambda: clicks(rows=0), 'must be >= 1'),
    (lambda: hybrid.make_reference_step(MODEL, lr_tables=1, lr_mlp=1, optimizer='adam'),
     'optimizer must be one of'),
  ],
)  # fmt: skip
def test_bad_input_is_a_clear_error(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_bad_layout_is_a_clear_error():
  with pytest.raises(ValueError, match=r'batch_size \(60\) must be a multiple of the workers'):
    simulation.train_with_failures(
      clicks(num_tables=TABLES, rows=ROWS, num_dense=DENSE), cpr.Strategy('none', 'none', 0),
      COSTS, mesh=runtime.layout(8).mesh, steps=2, batch_size=60, model=MODEL,
    )  # fmt: skip
  with pytest.raises(ValueError, match='failed workers must be in'):
    _run(cpr.Strategy('p', 'partial', 5), cpr.Failures(np.array([1.0]), np.array([8])), 2, COSTS)


# --- the binary -------------------------------------------------------------------------------


@pytest.mark.slow
def test_binary_writes_the_table_the_figure_and_the_metrics(tmp_path):
  results = tmp_path / 'cpr.md'
  env = {**os.environ, 'XLA_FLAGS': xla_flags_for_tests()}  # not the parent's device count
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, 'experiments', 'cpr.py'), '--workers=4', '--tables=4',
     '--rows=50', '--steps=30', '--batch_size=32', '--test_size=256', '--mttf_s=8',
     '--strategies=none,full,partial,partial_mfu', '--pls_sweep=0.2', f'--results={results}',
     f'--workdir={tmp_path / "runs"}'],
    env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert 'test accuracy' in proc.stdout
  text = results.read_text()
  assert text.startswith('Command: `python ') and '| partial_mfu @ 0.05 |' in text
  assert '| partial @ 0.2 |' in text and (tmp_path / 'cpr.png').stat().st_size > 0
  runs = sorted(p.name for p in (tmp_path / 'runs').iterdir())
  assert runs == ['full', 'none', 'partial_0.05', 'partial_0.2', 'partial_mfu']
  assert all((tmp_path / 'runs' / r / 'metrics.jsonl').stat().st_size > 0 for r in runs)
