"""The figures a run writes: compare.png's title, target line and accuracy range; the curves'
titles; the heterogeneous batches plot, where no worker's line hides another's."""

import pytest

from jaxdist.train import compare, report, trainer


def fake_run(finals, summary=None):
  """A Run whose evaluations are `finals` at steps 10, 20, ...; 0.1 s per step, no network."""
  records = []
  for i, accuracy in enumerate(finals):
    for step in range(10 * i + 1, 10 * i + 11):
      records.append({'step': step, 'comm_s@1gbps': 0.0})
    records[-1]['test_accuracy'] = accuracy
  summary = {'test_accuracy': finals[-1], 'worker_step_s': 0.1, 'model': 'cnn',
             'dataset': 'digits', 'workers': 8, **(summary or {})}  # fmt: skip
  return compare.Run(summary, records, lambda compute_s: None)


SUMMARY_FIELDS = {'payload_bytes_per_step': 8.0, 'sent_bytes_per_step': 14.0,
                  'sync_fraction': 0.5, 'gamma_normalized': 0.4}  # fmt: skip
EVALUATIONS = {
  'dense': [0.60, 0.90, 0.95],  # the target: 0.95
  'topk1_ef': [0.50, 0.93, 0.97],  # the best evaluation: 0.97
  'topk1_noef': [0.40, 0.85, 0.90],  # the lowest final: 0.90
}
RUNS = {name: fake_run(accuracies) for name, accuracies in EVALUATIONS.items()}


def test_accuracy_range_by_hand():
  # lowest of finals and target 0.90, highest of best and target 0.97: span 0.07
  assert compare.accuracy_range([0.95, 0.97, 0.90], 0.95, 0.97) == pytest.approx((0.83, 0.977))
  # all equal: the span is at least 0.02
  assert compare.accuracy_range([0.99, 0.99], 0.99, 0.99) == pytest.approx((0.97, 0.992))
  # a run that failed: the range goes down to it, not below 0
  assert compare.accuracy_range([0.98, 0.1], 0.98, 0.99) == pytest.approx((0.0, 1.079))


def test_compare_plot_has_a_title_the_target_line_and_a_range_that_shows_the_differences():
  fig = compare.plot(RUNS, ['1gbps', '10gbps'], compare.plot_title(RUNS))
  assert fig._suptitle.get_text() == 'cnn on digits, 8 workers'
  assert len(fig.axes) == 2
  for ax in fig.axes:
    lines = {line.get_label(): line for line in ax.get_lines()}
    target = lines['target 0.9500']
    assert list(target.get_ydata()) == [0.95, 0.95]  # axhline: the first variant's final
    assert list(target.get_xdata()) == [0, 1]  # spans the axes
    assert ax.get_ylim() == pytest.approx((0.83, 0.977))
    assert ax.get_legend() is not None
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
      'dense',
      'topk1_ef',
      'topk1_noef',
      'target 0.9500',
    ]
    # every variant's final evaluation is inside the range, its first below it
    for name in RUNS:
      ys = lines[name].get_ydata()
      assert ax.get_ylim()[0] < ys[-1] < ax.get_ylim()[1] and ys[0] < ax.get_ylim()[0], name
  # time on x: 10 steps of 0.1 s per evaluation
  assert list(fig.axes[0].get_lines()[0].get_xdata()) == pytest.approx([1.0, 2.0, 3.0])


def test_table_rows_time_each_variant_to_the_first_ones_final_accuracy():
  runs = {name: fake_run(accuracies, SUMMARY_FIELDS) for name, accuracies in EVALUATIONS.items()}
  rows = compare.table_rows(runs, ['1gbps'])
  assert [r['variant'] for r in rows] == ['dense', 'topk1_ef', 'topk1_noef']
  assert [r['target'] for r in rows] == [0.95] * 3
  assert [r['delta_pp'] for r in rows] == pytest.approx([0, 2, -5])
  # 0.95 reached at the third evaluation (step 30, 3 s), the second's 0.93 falls short
  assert [r['tta@1gbps'] for r in rows] == ['3.00s (step 30)', '3.00s (step 30)', 'not reached']
  assert rows[0]['gamma_normalized'] == 0.4 and rows[0]['synced'] == '50.0%'


def test_plot_title_names_what_the_variants_differ_in():
  runs = {'a': fake_run([0.9]), 'b': fake_run([0.9], {'workers': 16})}
  assert compare.plot_title(runs) == 'cnn on digits, 8/16 workers'


def test_curves_titles_differ_for_variants_of_one_method():
  summary = {'sync': 'compressed_allreduce', 'model': 'cnn', 'dataset': 'digits', 'workers': 8}
  titles = [trainer.curves_title(name, summary) for name in ('topk1_ef', 'artopk1')]
  assert titles == [
    'topk1_ef: compressed_allreduce, cnn on digits, 8 workers',
    'artopk1: compressed_allreduce, cnn on digits, 8 workers',
  ]
  fig = report.plot_curves(fake_run([0.5, 0.9]).records, titles[0])
  assert fig._suptitle.get_text() == titles[0]


def batch_records():
  """Four workers, three alike (0, 1, 3) and worker 2 slow: its batch shrinks at step 3."""
  records = []
  for step, slow in ((1, 32), (2, 32), (3, 8), (4, 8)):
    batches = [32, 32, slow, 32]
    compute_s = [b * 1e-3 * (4 if k == 2 else 1) for k, b in enumerate(batches)]
    records.append({'step': step, 'batches': batches, 'compute_s': compute_s})
  return records


def test_batches_plot_draws_equal_workers_once_with_every_name():
  fig = report.plot_batches(batch_records(), 'dynamic batching on a 4:1 cluster')
  ax_b, ax_t = fig.axes
  labels = [line.get_label() for line in ax_b.get_lines()]
  assert labels == ['workers 0, 1, 3', 'worker 2']
  assert [t.get_text() for t in ax_b.get_legend().get_texts()] == labels
  assert list(ax_b.get_lines()[1].get_ydata()) == [32, 32, 8, 8]
  # compute: worker 2 takes 4 ms per 32 examples ... 32 x 1e-3 x 4 = 128 ms, then 32 ms
  assert [line.get_label() for line in ax_t.get_lines()] == ['workers 0, 1, 3', 'worker 2']
  assert list(ax_t.get_lines()[1].get_ydata()) == pytest.approx([128, 128, 32, 32])
  # the lines differ in style, so where two meet (steps 1-2 here: 32 and 32) both show
  assert ax_b.get_lines()[0].get_linestyle() != ax_b.get_lines()[1].get_linestyle()
  assert fig._suptitle.get_text() == 'dynamic batching on a 4:1 cluster'


def test_batches_plot_styles_every_distinct_series_apart():
  records = [{'step': s, 'batches': [s, 2 * s, 3 * s, 4 * s, 5 * s]} for s in (1, 2)]
  ax_b, _ = report.plot_batches(records).axes
  lines = ax_b.get_lines()
  assert [line.get_label() for line in lines] == [f'worker {k}' for k in range(5)]
  styles = [(line.get_linestyle(), line.get_color()) for line in lines]
  assert len(set(styles)) == 5


@pytest.mark.parametrize(
  'workers, label',
  [
    ([3], 'worker 3'),
    ([0, 1], 'workers 0, 1'),
    ([0, 1, 2], 'workers 0–2'),
    ([0, 1, 2, 5, 7, 8, 9, 10], 'workers 0–2, 5, 7–10'),
  ],
)
def test_workers_label(workers, label):
  assert report.workers_label(workers) == label
