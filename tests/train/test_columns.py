"""The console's tables: per-run and per-step columns apart, every column explained once."""

import pytest

from jaxdist.train import columns, compare, trainer
from jaxdist.train.columns import Column

from conftest import load_experiment

# Columns whose values are totals or final figures of a run, and means over steps.
PER_RUN = {'test acc', 'sent B/worker', 'time to A @NET', 'N steps @NET (s)', 'cost @NET'}
PER_STEP = {'payload B/worker/step', 'sent B/worker/step', 'worker step s', 'synced',
            'step s, all workers', 'injected B/worker/step'}  # fmt: skip

SUMMARY = {
  'sync': 'allreduce', 'workers': 8, 'steps': 4, 'test_accuracy': 0.5667,
  'samples_per_s': 524.3, 'payload_bytes_per_step': 605_224.0,
  'sent_bytes_per_step': 1_059_142.0, 'sent_bytes_per_worker': 4_236_568.0,
  'sync_fraction': 1.0, 'median_step_s': 0.05968, 'worker_step_s': 0.004912,
  'modelled_s@1gbps': 0.25, 'modelled_s@10gbps': 0.125,
}  # fmt: skip


def test_meanings_are_read_from_the_docstring():
  meanings = columns.meanings()
  assert meanings['synced'].startswith('the fraction of steps whose collectives carried')
  assert 'divided by K' in meanings['γ/K'] and '\n' not in meanings['γ/K']
  assert len(meanings) == len(set(meanings)) >= 20
  assert all(text.endswith('.') for text in meanings.values()), meanings


def test_legend_explains_each_column_once_and_refuses_an_unknown_one():
  cols = [
    Column('tta@1gbps', 'time to 0.9 @1gbps', 'time to A @NET'),
    Column('tta@10gbps', 'time to 0.9 @10gbps', 'time to A @NET'),
    Column('k', 'synced'),
  ]
  lines = columns.legend(cols).splitlines()
  assert lines[0].startswith('  time to A @NET: modelled seconds on network `NET`')
  assert sum(line.startswith('  synced: ') for line in lines) == 1
  assert sum(line.startswith('  time to A') for line in lines) == 1
  assert all(len(line) <= columns.WIDTH for line in lines)
  with pytest.raises(KeyError, match='nonesuch'):
    columns.legend([Column('x', 'nonesuch')])


def test_run_summary_is_a_per_run_table_a_per_step_table_and_a_legend():
  text = trainer.summary_tables(SUMMARY, ['1gbps', '10gbps'])
  blocks = text.split('\n\n')
  assert blocks[0] == 'Per run:' and blocks[2] == 'Per step (means over the run):'
  run_heading, _, run_row = blocks[1].splitlines()
  assert run_heading.split('  ')[0] == 'sync'
  for heading in ('test acc', 'samples/s', 'sent B/worker', '4 steps @1gbps (s)'):
    assert heading in run_heading
  assert '4,236,568' in run_row and '/step' not in run_heading
  step_heading, _, step_row = blocks[3].splitlines()
  assert '100.0%' in step_row and '1,059,142' in step_row and '605,224' in step_row
  assert all('/step' in h or ' s' in h or h == 'synced' for h in step_heading.split('  ') if h)
  legend = blocks[4]
  assert legend.startswith('Columns:\n')
  for name in ('sync', 'sent B/worker', 'N steps @NET (s)', 'synced', 'worker step s'):
    assert f'\n  {name}: ' in legend, name


def test_no_table_mixes_per_run_and_per_step_columns():
  names = lambda cols: {c.entry for c in cols}
  assert not names(trainer.RUN_COLUMNS) & PER_STEP
  assert not names(trainer.STEP_COLUMNS) & PER_RUN
  rows = [{'variant': 'a', 'target': 0.9, 'gamma_normalized': 0.4, 'inject_bytes_per_step': 8}]
  per_run, per_step = compare.table_columns(rows, ['1gbps'], 400, heterogeneous=True)
  assert names(per_run) >= {'time to A @NET', 'N steps @NET (s)', 'cost @NET', 'γ/K'}
  assert names(per_step) >= {'payload B/worker/step', 'synced', 'injected B/worker/step'}
  assert not names(per_run) & PER_STEP and not names(per_step) & PER_RUN
  assert [c.heading for c in per_run if c.key.startswith('tta')] == ['time to 0.9000 @1gbps']
  assert [c.heading for c in per_run if c.key.startswith('modelled')] == ['400 steps @1gbps (s)']
  # optional columns only where a row has them; the cluster's only with one
  plain = [{'variant': 'a', 'target': 0.9}]
  per_run, per_step = compare.table_columns(plain, ['1gbps'], 400, heterogeneous=False)
  assert names(per_run) == {'variant', 'test acc', 'vs first (pp)', 'time to A @NET'}
  assert 'injected B/worker/step' not in names(per_step)


def test_every_column_a_table_can_show_is_explained():
  known = columns.meanings()
  rows = [{'variant': 'a', 'target': 0.9, **{c.key: 1 for c in compare.OPTIONAL}}]
  shown = [*trainer.RUN_COLUMNS, *trainer.STEP_COLUMNS, *load_experiment('elastic').COLUMNS]
  for table in compare.table_columns(rows, ['1gbps'], 400, heterogeneous=True):
    shown += table
  assert {c.entry for c in shown} <= set(known)
  columns.legend(shown)  # raises on a column with no meaning
