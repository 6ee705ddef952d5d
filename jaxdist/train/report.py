"""End-of-run summary: a table on the console and a PNG of the curves."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt


def human_bytes(n: float) -> str:
  for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
    if abs(n) < 1024 or unit == 'TiB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.2f} {unit}'
    n /= 1024
  raise AssertionError


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
  """A plain-text table; `columns` are (key, heading) pairs."""
  cells = [[h for _, h in columns]] + [[_fmt(r.get(k)) for k, _ in columns] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  lines = [
    '  '.join(
      c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))
    )
    for row in cells
  ]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


def _fmt(v: Any) -> str:
  if v is None:
    return '-'
  if isinstance(v, float):
    return f'{v:.4g}' if abs(v) < 1e4 else f'{v:,.0f}'
  return str(v)


def plot_curves(records: Sequence[Mapping[str, Any]], path: str, title: str = '') -> None:
  """Training loss, and train/test accuracy, against step."""
  steps = [r['step'] for r in records if 'loss' in r]
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.8))
  ax_loss.plot(steps, [r['loss'] for r in records if 'loss' in r], lw=1, label='train')
  evals = [r for r in records if 'test_loss' in r]
  ax_loss.plot([r['step'] for r in evals], [r['test_loss'] for r in evals], 'o-', label='test')
  ax_loss.set_yscale('log')
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
  fig.savefig(path, dpi=120)
  plt.close(fig)


# --- the modelled clock --------------------------------------------------------


def median_step_s(records: Sequence[Mapping[str, Any]]) -> float | None:
  """Median measured step time: robust to the compile step and eval/checkpoint spikes."""
  times = [r['step_s'] for r in records if r.get('step_s')]
  return statistics.median(times) if times else None


def modelled_clock(
  records: Sequence[Mapping[str, Any]], network: str, compute_s: float
) -> list[tuple[int, float]]:
  """(step, seconds) of the modelled clock: `compute_s` per step + modelled communication.

  `compute_s` is one worker's measured step without communication
  (`trainer.measure_worker_step`); communication is the α-β time of what
  each step really sent on `network`: in full where the step waits for it,
  and only what the compute does not hide where it overlaps the next step
  (delay-tolerant methods).
  """
  clock, out = 0.0, []
  for r in records:
    hidden = r.get(f'overlap_s@{network}', 0.0)
    clock += compute_s + r.get(f'comm_s@{network}', 0.0) + max(0.0, hidden - compute_s)
    out.append((r['step'], clock))
  return out


def time_to_accuracy(
  records: Sequence[Mapping[str, Any]], target: float, network: str, compute_s: float
) -> tuple[int, float] | None:
  """(step, modelled seconds) of the first evaluation reaching `target`, or None."""
  clock = dict(modelled_clock(records, network, compute_s))
  for r in records:
    if r.get('test_accuracy') is not None and r['test_accuracy'] >= target:
      return r['step'], clock[r['step']]
  return None
