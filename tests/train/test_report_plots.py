"""The figures a run writes: compare.png's title, target line and accuracy range; the curves'
titles; the heterogeneous batches plot, where no worker's line hides another's; and every
figure's tick labels, plain and apart, at every scale and size."""

import itertools
import re
import types

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from jaxdist.faults import report as faults_report
from jaxdist.train import compare, report, ticks, trainer

from conftest import load_experiment


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


# --- tick labels: plain text, apart from one another, at every scale and size ------------------
#
# Each figure is drawn on an Agg canvas at save's dpi, then every drawn, non-empty tick label's
# window extent is compared with every other of its axis: side by side they must be
# `MIN_GAP_PX` apart, more than not overlapping (3 px apart, '10000' and '12500' read as
# '1000012500'); one above the other, as lines of text are, `MIN_LINE_GAP_PX`. The spans and
# sizes are those where the labels used to collide: a log axis over less than a decade (the
# 1 Gbit/s panel of compare.png, issue 43: `2e-013e-014e-016e-01`), over one and over several
# decades, in panels from narrow to wide.

SPANS = (0.15, 0.5, 1.0, 4.5)  # decades of data on the log axis
STARTS = (0.21, 37.0, 4e-4)  # where the data begin
# compare.plot at every span from every start, in 1, 2 and 3 panels in turn; the other plots at
# every span, from each start in turn (each case is drawn at three sizes)
COMPARE_SCALES = [
  (decades, start, 1 + i % 3) for i, (decades, start) in enumerate(itertools.product(SPANS, STARTS))
]
SCALES = [(decades, STARTS[i % len(STARTS)]) for i, decades in enumerate(SPANS)]
MIN_GAP_PX = 4.0
MIN_LINE_GAP_PX = 1.0
# A log axis's labels: a plain decimal ('0.2', '300', '0.0005') or a power of ten in Unicode
# superscripts ('10⁻⁵', '2×10⁶'), never '2e-01' nor mathtext ('$10^{-1}$').
PLAIN = re.compile(r'^−?(\d+(\.\d+)?|(\d(\.\d+)?×)?10⁻?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)$')


def drawn_tick_labels(fig, dpi=120):
  """{(axes index, 'x' or 'y'): (scale, [(text, extent)])}: the labels an Agg draw at `dpi` shows.

  An axis's labels are those of its major and minor ticks inside the view (the ticks drawn),
  visible and not empty; invisible axes (a twin's x) are left out.
  """
  canvas = FigureCanvasAgg(fig)
  fig.set_dpi(dpi)
  canvas.draw()
  renderer = canvas.get_renderer()
  out = {}
  for i, ax in enumerate(fig.axes):
    for name, axis in (('x', ax.xaxis), ('y', ax.yaxis)):
      if not axis.get_visible():
        continue
      scale = axis.get_transform()
      low, high = sorted(scale.transform(np.asarray(axis.get_view_interval())))
      slack = 1e-9 * (high - low)
      ticks = [*axis.get_major_ticks(len(axis.get_majorticklocs())),
               *axis.get_minor_ticks(len(axis.get_minorticklocs()))]  # fmt: skip
      labels = []
      for tick in ticks:
        if not (
          tick.get_visible() and low - slack <= scale.transform(tick.get_loc()) <= high + slack
        ):
          continue
        for label in (tick.label1, tick.label2):
          if label.get_visible() and label.get_text():
            assert label.get_rotation() == 0, label  # else its box is larger than its text
            labels.append((label.get_text(), label.get_window_extent(renderer)))
      out[i, name] = (axis.get_scale(), labels)
  return out


def assert_tick_labels_apart(fig, what):
  """Drawn tick labels of an axis are apart (`MIN_GAP_PX` side by side, `MIN_LINE_GAP_PX` one
  above the other), at least two, horizontal, and a log axis's in plain text."""
  drawn = drawn_tick_labels(fig)
  assert drawn, what
  for (i, name), (scale, labels) in drawn.items():
    where = f'{what}: axes {i} {name} ({scale})'
    texts = [t for t, _ in labels]
    assert len(labels) >= 2, f'{where}: labels {texts}'
    for a, (text_a, box_a) in enumerate(labels):
      for text_b, box_b in labels[a + 1 :]:
        # the gap between the boxes across x and across y; negative: they overlap that way
        gap_x = max(box_a.x0, box_b.x0) - min(box_a.x1, box_b.x1)
        gap_y = max(box_a.y0, box_b.y0) - min(box_a.y1, box_b.y1)
        assert gap_x >= MIN_GAP_PX or gap_y >= MIN_LINE_GAP_PX, (
          f'{where}: {text_a!r} and {text_b!r} are {gap_x:.1f} px apart across, {gap_y:.1f} px '
          f'down; labels {texts}'
        )
    if scale == 'log':
      assert all(PLAIN.match(t) for t in texts), f'{where}: labels {texts}'


def geometric(start, decades, n):
  """`n` values from `start` to `start` · 10^`decades`, evenly spaced on a log axis."""
  return [start * 10 ** (decades * k / (n - 1)) for k in range(n)]


def resized(fig, size):
  """`fig` at `size` (inches), laid out again; None keeps its own size."""
  if size is not None:
    fig.set_size_inches(*size)
    fig.tight_layout()
  return fig


NETWORKS = ('1gbps', '10gbps', '100gbps')
COMM_PER_COMPUTE = {'1gbps': 2.0, '10gbps': 0.2, '100gbps': 0.02}


def timed_run(times_s, accuracies):
  """A Run evaluated at every step, its steps ending at `times_s` (scaled up by each network's
  communication, `COMM_PER_COMPUTE`)."""
  records, previous = [], 0.0
  for step, (t, accuracy) in enumerate(zip(times_s, accuracies, strict=True), 1):
    compute_s = t - previous
    comm = {f'comm_s@{n}': f * compute_s for n, f in COMM_PER_COMPUTE.items()}
    records.append({'step': step, 'step_compute_s': compute_s, 'test_accuracy': accuracy, **comm})
    previous = t
  summary = {'test_accuracy': accuracies[-1], 'worker_step_s': 1.0, 'model': 'cnn',
             'dataset': 'digits', 'workers': 8}  # fmt: skip
  return compare.Run(summary, records, lambda compute_s: None)


ACCURACIES = [0.5, 0.7, 0.8, 0.85, 0.9, 0.92, 0.93]


@pytest.mark.parametrize('decades, start, panels', COMPARE_SCALES)
def test_compare_plot_tick_labels_are_plain_and_apart(decades, start, panels):
  variants = (('dense', 1.0, 0.95), ('topk1_ef', 1.02, 0.96), ('powersgd', 1.04, 0.94))
  runs = {
    name: timed_run(geometric(start * slower, decades, 8), [*ACCURACIES, final])
    for name, slower, final in variants
  }
  for size in (None, (2.6 * panels, 3.0), (8.0 * panels, 4.5)):
    fig = resized(compare.plot(runs, NETWORKS[:panels], compare.plot_title(runs)), size)
    assert_tick_labels_apart(fig, f'compare.plot, {decades} decades from {start}, size {size}')


def test_compare_plot_at_the_issue_scale_labels_the_minor_ticks_in_plain_decimals():
  # the 1 Gbit/s panel of issue 43: 0.22 s to 0.62 s, under half a decade
  runs = {
    'dense': timed_run(geometric(0.22 / 3, 0.45, 8), [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.95])
  }
  drawn = drawn_tick_labels(compare.plot(runs, ['1gbps']))
  texts = [t for t, _ in drawn[0, 'x'][1]]
  assert set(texts) >= {'0.3', '0.5'} and set(texts) <= {f'0.{d}' for d in range(2, 10)}, texts


@pytest.mark.parametrize('decades, start', SCALES)
def test_curves_plot_tick_labels_are_plain_and_apart(decades, start):
  steps = np.linspace(1, 20_000, 60).round().astype(int)
  losses = geometric(start * 10**decades, -decades, len(steps))
  records = [
    {'step': int(s), 'loss': loss, 'accuracy': 0.5} for s, loss in zip(steps, losses, strict=True)
  ]
  for r in records[9::10]:
    r.update(test_loss=1.05 * r['loss'], test_accuracy=0.9)
  for size in (None, (4.5, 2.4), (16.0, 6.0)):
    fig = resized(report.plot_curves(records, 'topk1_ef: compressed_allreduce'), size)
    assert_tick_labels_apart(fig, f'plot_curves, {decades} decades from {start}, size {size}')


@pytest.mark.parametrize('decades, start', SCALES)
def test_ratios_plot_tick_labels_are_plain_and_apart(decades, start):
  top = min(1.0, start * 10**decades)  # a kept fraction is at most 1
  ratios = geometric(top / 10**decades, decades, 40)
  records = [
    {'step': s, 'ratio': r, 'comm_s@adopt_c1@5': 0.01 * r,
     'phase': 'explore' if s % 7 == 0 else 'exploit'}
    for s, r in enumerate(ratios, 1)
  ]  # fmt: skip
  for size in (None, (4.5, 2.4), (16.0, 6.0)):
    fig = resized(report.plot_ratios(records, 'adopt_c1@5', 'ADOPT'), size)
    assert_tick_labels_apart(fig, f'plot_ratios, {decades} decades from {start}, size {size}')


@pytest.mark.parametrize('decades, start', SCALES)
def test_network_report_plot_tick_labels_are_plain_and_apart(decades, start, tmp_path):
  network_report = load_experiment('network_report')
  nominal = geometric(start / 1e3, decades, 6)
  rows = [
    {'rate': rate, 'variant': f'v{k}', 'nominal': str(s * f), 'comm': str(1.3 * s * f)}
    for rate, f in (('20mbit', 1.0), ('100mbit', 1.1))
    for k, s in enumerate(nominal)
  ]
  for size in (None, (3.0, 2.8), (10.0, 9.0)):
    fig = resized(network_report.figure(rows), size)
    assert_tick_labels_apart(fig, f'network_report, {decades} decades from {start}, size {size}')
  path = str(tmp_path / 'network.png')
  network_report.plot(rows, path)
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('size', [None, (4.5, 2.4), (16.0, 6.0)])
def test_linear_plots_tick_labels_apart(size, tmp_path):
  records = [{'step': s, 'batches': [32, 32, 8 + s % 24, 32], 'compute_s': [0.03, 0.03, 0.1, 0.03]}
             for s in range(1, 250_000, 2_500)]  # fmt: skip
  fig = resized(report.plot_batches(records, 'dynamic batching'), size)
  assert_tick_labels_apart(fig, f'plot_batches, size {size}')
  point = lambda k, b, t, c: types.SimpleNamespace(num_workers=k, batch_size=b, time_s=t, cost=c)
  table = [
    point(k, b, 3600 * 8 / k + 20 * b, 0.02 * k + b / 1e3)
    for k in (1, 2, 4, 8, 16)
    for b in (64, 256)
  ]
  job = types.SimpleNamespace(
    table=table, front=table[::3], chosen=table[3], actual=point(2, 256, 17_000, 0.3)
  )
  fig = resized(report.plot_job_plan(job, '1gbps'), size)
  assert_tick_labels_apart(fig, f'plot_job_plan, size {size}')
  fake = lambda strategy, recovery, pls, priority='': {
    'strategy': strategy, 'recovery': recovery, 'pls': pls, 'pls_target': pls, 'priority': priority,
    'test_loss': 0.45 + pls, 'checkpoint_overhead': 0.01, 'lost_overhead': 0.02 * pls,
    'recovery_overhead': 0.005,
  }  # fmt: skip
  summaries = [
    fake('none', 'none', 0.0),
    fake('full', 'full', 0.0),
    *(fake('partial', 'partial', p) for p in (0.01, 0.02, 0.05, 0.1, 0.2)),
    fake('partial_mfu', 'partial', 0.05, 'mfu'),
    fake('partial_ssu', 'partial', 0.05, 'ssu'),
  ]
  fig = resized(faults_report.plot(summaries, 'CPR'), size)
  report.save(fig, str(tmp_path / 'cpr.png'))  # as experiments/cpr.py saves it
  assert_tick_labels_apart(fig, f'faults plot, size {size}')


@pytest.mark.parametrize(
  'x, label',
  [
    (0.2, '0.2'),
    (0.30000000000000004, '0.3'),
    (0.25, '0.25'),
    (1.0, '1'),
    (20_000.0, '20000'),
    (0.001, '0.001'),
    (0.0005, '5×10⁻⁴'),
    (1e-5, '10⁻⁵'),
    (2.5e6, '2.5×10⁶'),
    (99_999.99999999, '100000'),
    (9.9999999999e-5, '10⁻⁴'),
    (-0.5, '−0.5'),
    (0.0, '0'),
  ],
)
def test_plain_number(x, label):
  assert ticks.plain_number(x) == label


def test_space_wraps_each_numeric_axis_once_and_keeps_its_offset():
  fig = report.plot_batches(batch_records())
  before = [ax.xaxis.get_major_formatter() for ax in fig.axes]
  ticks.space(fig)
  assert [ax.xaxis.get_major_formatter() for ax in fig.axes] == before
  assert all(isinstance(f, ticks.SpacedLabels) for f in before)
  ax = fig.axes[0]
  ax.set_ylim(1e6, 1e6 + 10)  # ScalarFormatter writes an offset: '+1e6'
  drawn_tick_labels(fig)
  assert ax.yaxis.get_offset_text().get_text() == ax.yaxis.get_major_formatter().inner.get_offset()
  assert ax.yaxis.get_offset_text().get_text()
