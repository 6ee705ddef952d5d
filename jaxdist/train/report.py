"""What a run shows a person: a progress bar, a table on the console, and figures.

Figures are `matplotlib.figure.Figure` objects built without pyplot, so no
backend is chosen at import and a notebook displays the returned figure.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import tqdm
from matplotlib.figure import Figure

from jaxdist.control import scavenger
from jaxdist.train import metrics, ticks


def human_bytes(n: float) -> str:
  """`n` bytes in B, KiB, MiB, GiB or TiB, whichever keeps it under 1024.

  Args:
    n: bytes.

  Returns:
    e.g. '512 B' or '1.50 KiB' (TiB however large).
  """
  for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
    if abs(n) < 1024 or unit == 'TiB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.2f} {unit}'
    n /= 1024
  raise AssertionError


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Sequence[str]]) -> str:
  """A plain-text table; `columns` are (key, heading) pairs or `columns.Column`s.

  Args:
    rows: the rows, each a dict by key (a missing key shows empty).
    columns: the columns, in order.

  Returns:
    The table: a heading line, a rule, a line per row.
  """
  cells = [[c[1] for c in columns]] + [[_fmt(r.get(c[0])) for c in columns] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  lines = [
    '  '.join(
      c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))
    )
    for row in cells
  ]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


def markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[Sequence[str]]) -> str:
  """A markdown table; `columns` are (key, heading) pairs or `columns.Column`s.

  Args:
    rows: the rows, each a dict by key.
    columns: the columns, in order.

  Returns:
    The table's markdown.
  """
  lines = ['| ' + ' | '.join(c[1] for c in columns) + ' |', '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(_fmt(r.get(c[0])) for c in columns) + ' |' for r in rows]
  return '\n'.join(lines)


def provenance(command: str) -> str:
  """One line saying which command, machine and date produced a table.

  Args:
    command: the command line.

  Returns:
    'Command: `...`; machine: ...; date: YYYY-MM-DD.'
  """
  machine = f'{platform.machine()} {os.cpu_count()} cores, {jax.devices()[0].device_kind}'
  date = datetime.date.today().isoformat()
  return f'Command: `{command}`; machine: {machine}; date: {date}.'


def _fmt(v: Any) -> str:
  if v is None:
    return '-'
  if isinstance(v, float):
    return f'{v:.4g}' if abs(v) < 1e4 else f'{v:,.0f}'
  return str(v)


def log_scale(ax, axis: str = 'y') -> None:
  """A log axis whose tick labels are plain text ('0.2', '0.5', '1', '10⁻⁵') and never touch.

  Matplotlib's default log labels (`$\\mathdefault{10^{-1}}$`) go through its
  mathtext parser, which costs about 0.2 s to build in every process and a
  parse per label: most of the time of saving a run's figure. The labels are
  plain numbers (`ticks.log_labels`), measured at every draw so that none
  touches its neighbour.

  Args:
    ax: a Matplotlib axes.
    axis: 'y' or 'x'.
  """
  getattr(ax, f'set_{axis}scale')('log')
  ticks.log_labels(ax.yaxis if axis == 'y' else ax.xaxis)


def plot_curves(records: Sequence[Mapping[str, Any]], title: str = '') -> Figure:
  """Training loss, and train/test accuracy, against step.

  Args:
    records: the run's per-step records.
    title: the figure's title ('' for none).

  Returns:
    The `Figure`.
  """
  steps = [r['step'] for r in records if 'loss' in r]
  fig = Figure(figsize=(10, 3.8))
  ax_loss, ax_acc = fig.subplots(1, 2)
  ax_loss.plot(steps, [r['loss'] for r in records if 'loss' in r], lw=1, label='train')
  evals = [r for r in records if 'test_loss' in r]
  ax_loss.plot([r['step'] for r in evals], [r['test_loss'] for r in evals], 'o-', label='test')
  log_scale(ax_loss)
  ax_loss.set(xlabel='step', ylabel='loss')
  ax_acc.plot(
    steps, [r['accuracy'] for r in records if 'loss' in r], lw=1, alpha=0.6, label='train (batch)'
  )
  ax_acc.plot([r['step'] for r in evals], [r['test_accuracy'] for r in evals], 'o-', label='test')
  ax_acc.set(xlabel='step', ylabel='accuracy', ylim=(0, 1.01))
  ax_loss.legend(loc='upper right')
  ax_acc.legend(loc='lower right')
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  ticks.space(fig)
  fig.tight_layout()
  return fig


def plot_ratios(records: Sequence[Mapping[str, Any]], network: str, title: str = '') -> Figure:
  """A ratio controller's run: the kept fraction sent per step, and its communication.

  Crosses mark ADOPT's exploration steps (undone); the step's modelled
  communication on `network` is drawn against the right axis.

  Args:
    records: the run's per-step records.
    network: the profile name of the communication shown.
    title: the figure's title.

  Returns:
    The `Figure`.
  """
  fig = Figure(figsize=(10, 3.5))
  ax = fig.subplots()
  steps = [r['step'] for r in records]
  ax.step(steps, [r['ratio'] for r in records], where='post', color='C0', label='ratio sent')
  explore = [r for r in records if r.get('phase') == 'explore']
  if explore:
    ax.plot([r['step'] for r in explore], [r['ratio'] for r in explore], 'x', color='C3',
            label='exploring (undone)')  # fmt: skip
  ax.set(xlabel='step', ylabel='kept fraction', title=title)
  log_scale(ax)
  comm = ax.twinx()
  comm.plot(steps, [1e3 * r[f'comm_s@{network}'] for r in records], color='gray', alpha=0.6)
  comm.set_ylabel(f'modelled comm ms ({network})', color='gray')
  ax.legend(loc='lower left', fontsize=8)
  ax.grid(alpha=0.3)
  ticks.space(fig)
  fig.tight_layout()
  return fig


def plot_batches(records: Sequence[Mapping[str, Any]], title: str = '') -> Figure:
  """Each worker's batch and modelled compute time (with a cluster) against step.

  Workers whose series are equal share one line, labelled with all of them
  (`workers 0–2`); the lines differ in style as well as colour, so where two
  series meet for a while both stay visible.

  Args:
    records: the run's per-step records.
    title: the figure's title.

  Returns:
    The `Figure`.
  """
  with_batches = [r for r in records if 'batches' in r]
  timed = [r for r in with_batches if 'compute_s' in r]  # with a cluster model
  fig = Figure(figsize=(10, 3.6))
  ax_b, ax_t = fig.subplots(1, 2)
  _worker_lines(ax_b, [r['step'] for r in with_batches], [r['batches'] for r in with_batches],
                where='post')  # fmt: skip
  if timed:
    compute_ms = [[1e3 * s for s in r['compute_s']] for r in timed]
    _worker_lines(ax_t, [r['step'] for r in timed], compute_ms)
  ax_b.set(xlabel='step', ylabel='batch (examples)')
  ax_t.set(xlabel='step', ylabel='modelled compute (ms)')
  for ax in (ax_b, ax_t):
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(loc='best', fontsize='small')
  if title:
    fig.suptitle(title)
  ticks.space(fig)
  fig.tight_layout()
  return fig


LINE_STYLES = ('-', '--', '-.', ':')


def _worker_lines(ax, steps: Sequence[int], values: Sequence[Sequence[float]], where=None) -> None:
  """One line per distinct series of `values[t][k]` (step t, worker k), labelled by its workers."""
  groups: dict[tuple[float, ...], list[int]] = {}
  for k in range(len(values[0]) if values else 0):
    groups.setdefault(tuple(v[k] for v in values), []).append(k)
  for i, (series, workers) in enumerate(groups.items()):
    style = {'ls': LINE_STYLES[i % len(LINE_STYLES)], 'lw': 1.5, 'label': workers_label(workers)}
    if where:
      ax.step(steps, series, where=where, **style)
    else:
      ax.plot(steps, series, **style)


def workers_label(workers: Sequence[int]) -> str:
  """'worker 3', or 'workers 0–2, 5' (runs of three or more as ranges).

  Args:
    workers: worker indices, ascending.

  Returns:
    The label.
  """
  if len(workers) == 1:
    return f'worker {workers[0]}'
  runs: list[list[int]] = []
  for k in workers:
    if runs and k == runs[-1][-1] + 1:
      runs[-1].append(k)
    else:
      runs.append([k])
  parts = [f'{r[0]}–{r[-1]}' if len(r) > 2 else ', '.join(map(str, r)) for r in runs]
  return 'workers ' + ', '.join(parts)


def save(fig: Figure, path: str) -> str:
  """Writes `fig` as a PNG at `path`, its tick labels spaced (`ticks.space`); returns the path.

  Args:
    fig: the figure.
    path: the file.

  Returns:
    `path`.
  """
  ticks.space(fig)
  fig.savefig(path, dpi=120)
  return path


# Scavenger's job plan (`control.scavenger.plan_job`): its table's and its check's columns
JOB_PLAN_COLUMNS = (
  ('K', 'K'),
  ('B', 'B'),
  ('step_s', 'step s'),
  ('gamma_normalized', 'γ/K'),
  ('epochs', 'epochs'),
  ('steps', 'steps'),
  ('time_s', 'time s'),
  ('cost', 'cost'),
  ('mark', ''),
)
JOB_CHECK_COLUMNS = (
  ('what', ''),
  ('predicted', 'predicted'),
  ('actual', 'actual'),
  ('error', 'error'),
)


def write_job_plan(
  workdir: str,
  job: scavenger.JobPlan,
  about: Mapping[str, Any],
  *,
  epoch_noise: str,
  command: str = '',
) -> dict[str, Any]:
  """Shows a job plan on the console and writes plan.md, plan.json and plan.png into `workdir`.

  Args:
    workdir: the directory.
    job: the plan (`control.scavenger.plan_job`).
    about: what was planned, plan.json's first keys: search, objective,
      caps, network, price_per_hour, dataset_size, target (test accuracy).
    epoch_noise: which γ/K the epoch model was fitted on (for the header).
    command: the command line, for the provenance line of plan.md.

  Returns:
    What plan.json holds.
  """
  chosen = job.chosen
  rows = [
    {
      **_prediction(p),
      'mark': ('chosen' if p == chosen else '') + (' pareto' if p in job.front else ''),
    }
    for p in job.table
  ]
  header = (
    f'{about["search"]} search, D = {about["dataset_size"]}, price {about["price_per_hour"]}'
    f'/worker-hour, network {about["network"]}, target test accuracy {about["target"]}, epoch '
    f'model on {epoch_noise} γ/K; objective {about["objective"]}'
  )
  print(f'\n{header}\n')
  if job.model is not None:
    m = job.model
    print(
      f'fit: compute {m.c0:.3g} + {m.c1:.3g}·B/K s, sync {m.s0:.3g} + {m.s1:.3g}·K s, other '
      f'{m.other_s:.2g} s; γ/K = {m.g0:.3g} + {m.g1:.3g}/√B; epochs = {m.e_star:.3g} '
      f'{m.theta:+.3g}·γ/K\n'
    )
  print(table(rows, JOB_PLAN_COLUMNS))
  for n in job.notes:
    print(f'note: {n}')
  key = (chosen.num_workers, chosen.batch_size)
  reused = key in [(r.K, r.B) for r in job.target_runs]
  note = ' (a run to the target of step 2: its epochs were in the fit)' if reused else ''
  print(f'\nchosen K={key[0]}, B={key[1]}{note}: predicted vs actual\n')
  print(table(job.compare, JOB_CHECK_COLUMNS))
  plot_path = os.path.join(workdir, 'plan.png')
  save(plot_job_plan(job, about['network']), plot_path)
  parts = [provenance(command), header, markdown(rows, JOB_PLAN_COLUMNS)]
  parts += [f'Note: {n}' for n in job.notes]
  parts += [f'Chosen K={key[0]}, B={key[1]}{note}:', markdown(job.compare, JOB_CHECK_COLUMNS)]
  metrics.write_atomic(os.path.join(workdir, 'plan.md'), '\n\n'.join(parts) + '\n')
  out = {
    **about, 'profiles': [_measured(p) for p in job.profiles],
    'target_runs': [_measured(r) for r in job.target_runs],
    'model': job.model._asdict() if job.model else None,
    'table': [p._asdict() for p in job.table], 'chosen': chosen._asdict(),
    'actual': _measured(job.actual), 'compare': job.compare,
  }  # fmt: skip
  metrics.write_atomic(os.path.join(workdir, 'plan.json'), json.dumps(out, indent=2))
  print(f'\ntable: {os.path.join(workdir, "plan.md")}\nplot:  {plot_path}')
  return out


def _prediction(p) -> dict[str, Any]:
  return {
    'K': p.num_workers, 'B': p.batch_size, 'step_s': p.step_s,
    'gamma_normalized': p.gamma_normalized, 'epochs': p.epochs, 'steps': p.steps,
    'time_s': p.time_s, 'cost': p.cost,
  }  # fmt: skip


def _measured(m) -> dict[str, Any]:
  """A `scavenger.Measurement` as a dict, less the fields a profile leaves empty."""
  return {k: v for k, v in m._asdict().items() if v is not None}


def plot_job_plan(job: scavenger.JobPlan, network: str) -> Figure:
  """Predicted cost against time: every configuration, the Pareto front, the choice, the run.

  Args:
    job: Scavenger's plan.
    network: the profile name of the modelled clock.

  Returns:
    The `Figure`.
  """
  table, front, chosen, actual = job.table, job.front, job.chosen, job.actual
  fig = Figure(figsize=(6.4, 4.4))
  ax = fig.subplots()
  ax.plot([p.time_s for p in table], [p.cost for p in table], 'o', color='0.6', label='predicted')
  for p in table:
    ax.annotate(f'{p.num_workers}×{p.batch_size}', (p.time_s, p.cost), fontsize=7,
                xytext=(3, 3), textcoords='offset points')  # fmt: skip
  ax.plot([p.time_s for p in front], [p.cost for p in front], '-', color='C0', label='Pareto front')
  ax.plot(chosen.time_s, chosen.cost, '*', ms=14, color='C3', label='chosen (predicted)')
  ax.plot(actual.time_s, actual.cost, 'x', ms=10, mew=2, color='k', label='chosen (run)')
  ax.set(xlabel=f'modelled time to target (s) @ {network}', ylabel='cost (price × worker-hours)')
  ax.grid(alpha=0.3)
  ax.legend(loc='best', fontsize='small')
  ticks.space(fig)
  fig.tight_layout()
  return fig


class Progress(tqdm.tqdm):
  """tqdm's bar, showing the last record's loss (and accuracy, where the labels are classes)."""

  def show(self, record: Mapping[str, Any]) -> None:
    """Shows `record`'s training loss and accuracy beside the bar (drawn at its next update).

    Args:
      record: a step's record (its `accuracy` only where the labels are classes).
    """
    shown = {'loss': f'{record["loss"]:.3f}'}
    if 'accuracy' in record:
      shown['acc'] = f'{record["accuracy"]:.3f}'
    self.set_postfix(shown, refresh=False)


def progress(total: int, initial: int, enabled: bool, label: str = '') -> Progress:
  """A progress bar of training steps on stderr, where it is a terminal or a notebook.

  The bar is one line, redrawn in place and cleared when the run ends (its
  result line takes its place); on a stream that is not a terminal (a log
  file, CI) there is no bar, silent unless `enabled`.

  Args:
    total: the run's steps.
    initial: the steps already done (a resumed run).
    enabled: whether to show it at all (the first process, `config.progress`).
    label: the run's name, before the bar (default 'train').

  Returns:
    The bar: `update(n)` after steps, `show(record)`, `close()`.
  """
  shown = enabled and (sys.stderr.isatty() or 'ipykernel' in sys.modules)
  return Progress(total=total, initial=initial, disable=not shown, desc=label.rstrip() or 'train',
                  unit='step', leave=False, dynamic_ncols=True)  # fmt: skip


def result_line(label: str, summary: Mapping[str, Any]) -> str:
  """A run's one line on the console: its steps, its task's metric, its bytes and its time.

  The metric is the task's own: a language model's validation loss in nats
  and in bits per character (or byte), else the test accuracy.

  Args:
    label: the run's name (a variant's), or '' for none.
    summary: the run's summary (`trainer.train_and_evaluate`'s).

  Returns:
    e.g. `dense  400 steps  test acc 0.9861  sent 1.01 MiB/worker/step  12.4 s`.
  """
  if summary.get('test_bits') is not None:
    metric = (f'val loss {summary["test_loss"]:.4f} nats, {summary["test_bits"]:.4f} '
              f'bits/{summary.get("unit") or "token"}')  # fmt: skip
  else:
    metric = f'test acc {summary["test_accuracy"]:.4f}'
  sent = summary.get('sent_bytes_per_step')
  parts = [
    label, f'{summary["steps"]} steps', metric,
    '' if sent is None else f'sent {human_bytes(sent)}/worker/step',
    f'{summary["wall_s"]:.1f} s' + ('' if summary['steps_this_run'] else ' (already trained)'),
  ]  # fmt: skip
  return '  '.join(p for p in parts if p)
