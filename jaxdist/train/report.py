"""What a run shows a person: a progress bar, a table on the console, and figures.

Figures are `matplotlib.figure.Figure` objects built without pyplot, so no
backend is chosen at import and a notebook displays the returned figure.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import tqdm
from matplotlib import ticker
from matplotlib.figure import Figure


def human_bytes(n: float) -> str:
  for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
    if abs(n) < 1024 or unit == 'TiB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.2f} {unit}'
    n /= 1024
  raise AssertionError


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Sequence[str]]) -> str:
  """A plain-text table; `columns` are (key, heading) pairs or `columns.Column`s."""
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
  """A markdown table; `columns` are (key, heading) pairs or `columns.Column`s."""
  lines = ['| ' + ' | '.join(c[1] for c in columns) + ' |', '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(_fmt(r.get(c[0])) for c in columns) + ' |' for r in rows]
  return '\n'.join(lines)


def provenance(command: str) -> str:
  """One line saying which command, machine and date produced a table."""
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
  """A log axis whose tick labels are plain text ('0.5', '1', '2'), not mathtext.

  Matplotlib's default log labels (`$\\mathdefault{10^{-1}}$`) go through its
  mathtext parser, which costs about 0.2 s to build in every process and a
  parse per label: most of the time of saving a run's figure.
  """
  getattr(ax, f'set_{axis}scale')('log')
  target = ax.yaxis if axis == 'y' else ax.xaxis
  target.set_major_formatter(ticker.LogFormatter())
  target.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))


def plot_curves(records: Sequence[Mapping[str, Any]], title: str = '') -> Figure:
  """Training loss, and train/test accuracy, against step."""
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
  fig.tight_layout()
  return fig


def plot_ratios(records: Sequence[Mapping[str, Any]], network: str, title: str = '') -> Figure:
  """A ratio controller's run: the kept fraction sent per step (crosses: ADOPT's
  exploration steps, undone) against the step's modelled communication on `network`."""
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
  fig.tight_layout()
  return fig


def plot_batches(records: Sequence[Mapping[str, Any]], title: str = '') -> Figure:
  """Each worker's batch and modelled compute time (with a cluster) against step.

  Workers whose series are equal share one line, labelled with all of them
  (`workers 0–2`); the lines differ in style as well as colour, so where two
  series meet for a while both stay visible.
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
  """'worker 3', or 'workers 0–2, 5' (runs of three or more as ranges)."""
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
  """Writes `fig` as a PNG at `path`; returns the path."""
  fig.savefig(path, dpi=120)
  return path


class Progress(tqdm.tqdm):
  """tqdm's bar, showing the last record's loss and accuracy."""

  def show(self, record: Mapping[str, Any]) -> None:
    self.set_postfix(loss=f'{record["loss"]:.3f}', acc=f'{record["accuracy"]:.3f}', refresh=False)


def progress(total: int, initial: int, enabled: bool) -> Progress:
  """A progress bar of training steps (silent unless `enabled`)."""
  return Progress(total=total, initial=initial, disable=not enabled, desc='train', unit='step')
