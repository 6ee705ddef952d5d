"""CPR runs as a table and a figure: quality against PLS, overhead per strategy.

The figure is a `matplotlib.figure.Figure` built without pyplot, as
`jaxdist.train.report` builds its figures, so a notebook displays it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

COLUMNS = (
  ('label', 'strategy'),
  ('interval', 'ckpt every (steps)'),
  ('failures', 'failures'),
  ('pls_target', 'PLS target'),
  ('pls', 'PLS'),
  ('lost_updates', 'lost updates'),
  ('test_loss', 'test log-loss'),
  ('test_accuracy', 'test accuracy'),
  ('test_auc', 'test AUC'),
  ('checkpoint_pct', 'checkpoint %'),
  ('lost_pct', 'lost work %'),
  ('recovery_pct', 'recovery %'),
  ('total_pct', 'total overhead %'),
  ('expected_pct', 'first-order model %'),
)


def label(summary: Mapping[str, Any]) -> str:
  """'partial_mfu @ 0.05' and the like: the strategy, and the PLS target of a partial one.

  Args:
    summary: a run's summary.

  Returns:
    The label.
  """
  if summary['recovery'] == 'partial':
    return f'{summary["strategy"]} @ {summary["pls_target"]:g}'
  return summary['strategy']


def rows(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """One table row per run (`COLUMNS` keys), overheads in % of the failure-free time.

  Args:
    summaries: the runs' summaries.

  Returns:
    A list of dicts.
  """
  out = []
  for s in summaries:
    every = str(s['interval_steps'])
    if s['priority']:
      every += f' (+{s["priority"].upper()} every {s["priority_every"]})'
    out.append({
      'label': label(s),
      'interval': every if s['recovery'] != 'none' else '-',
      'failures': s['failures'],
      'pls_target': s['pls_target'],
      'pls': round(s['pls'], 4),
      'lost_updates': round(s['lost_updates'], 4),
      'test_loss': round(s['test_loss'], 4),
      'test_accuracy': round(s['test_accuracy'], 4),
      'test_auc': round(s['test_auc'], 4),
      'checkpoint_pct': round(100 * s['checkpoint_overhead'], 2),
      'lost_pct': round(100 * s['lost_overhead'], 2),
      'recovery_pct': round(100 * s['recovery_overhead'], 2),
      'total_pct': round(100 * s['total_overhead'], 2),
      'expected_pct': (
        round(100 * s['expected_overhead'], 2) if s.get('expected_overhead') is not None else None
      ),
    })  # fmt: skip
  return out


def plot(summaries: Sequence[Mapping[str, Any]], title: str = '') -> Figure:
  """Left: test log-loss against PLS. Right: overhead per strategy (% of failure-free time).

  Args:
    summaries: the runs' summaries.
    title: the figure's title ('' for none).

  Returns:
    The `Figure`.
  """
  fig = Figure(figsize=(11, 4))
  ax_q, ax_o = fig.subplots(1, 2)
  plain = sorted(
    (s for s in summaries if s['recovery'] == 'partial' and not s['priority']),
    key=lambda s: s['pls'],
  )
  if plain:
    ax_q.plot(
      [s['pls'] for s in plain], [s['test_loss'] for s in plain], 'o-', label='partial (PLS sweep)'
    )
    for s in plain:
      ax_q.annotate(f'{s["pls_target"]:g}', (s['pls'], s['test_loss']), fontsize=7,
                    textcoords='offset points', xytext=(3, 3))  # fmt: skip
  markers = {'mfu': 's', 'ssu': '^'}
  for s in summaries:
    if s['priority']:
      ax_q.plot(s['pls'], s['test_loss'], markers[s['priority']], ms=8, label=label(s))
  for s, style in ((s, '--') for s in summaries if s['recovery'] in ('none', 'full')):
    ax_q.axhline(s['test_loss'], ls=style if s['recovery'] == 'full' else ':', color='gray',
                 label=f'{s["strategy"]} (PLS 0)')  # fmt: skip
  ax_q.set(xlabel='portion of lost samples (PLS)', ylabel='test log-loss')
  ax_q.legend(fontsize=7)
  ax_q.grid(alpha=0.3)

  shown = [s for s in summaries if s['recovery'] != 'none']
  names = [label(s) for s in shown]
  left = [0.0] * len(shown)
  for key, part in (
    ('checkpoint_overhead', 'checkpoints'),
    ('lost_overhead', 'lost work'),
    ('recovery_overhead', 'restart + load'),
  ):
    values = [100 * s[key] for s in shown]
    ax_o.barh(names, values, left=left, label=part)
    left = [b + v for b, v in zip(left, values, strict=True)]
  for i, total in enumerate(left):
    ax_o.annotate(f' {total:.2f}%', (total, i), ha='left', va='center', fontsize=7)
  # horizontal bars: the strategies' names read level and stay apart however narrow the panel
  ax_o.invert_yaxis()  # the first strategy on top
  ax_o.set(xlabel='overhead, % of failure-free time')
  ax_o.set_xlim(0, 1.25 * max(left, default=0) or 1)  # room for the totals
  ax_o.tick_params(axis='y', labelsize=7)
  ax_o.legend(fontsize=7, loc='lower center', bbox_to_anchor=(0.5, 1), ncols=3, frameon=False)
  ax_o.grid(alpha=0.3, axis='x')
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return fig
