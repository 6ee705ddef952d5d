"""Several variants of one experiment, side by side: a per-run and a per-step table, one plot.

The variants come from variants files (`Group`, configs/variants/<group>.py):
`choose` reads one, `variant_config` applies a variant to the base config.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import ml_collections
from matplotlib.figure import Figure

from jaxdist.train import columns, factory, ledger, metrics, report, resume, ticks, trials
from jaxdist.train import config as config_lib
from jaxdist.train.columns import Column

TABLE_FILE = 'compare.md'
PLOT_FILE = 'compare.png'

Overrides = dict[str, Any]  # a variant: nested keys of the config, e.g. {'sync': {'method': ...}}


class Group(NamedTuple):
  """A variants file (`configs/variants/<group>.py`): what its runs share, and its variants.

  Attributes:
    path: the file.
    settings: its `SETTINGS` (optional): dotted keys of the base config,
      e.g. `{'workers': 3}`, set before the command line's `--config.*`.
    variants: its `VARIANTS`: name -> overrides, set last; in the order the
      table lists them (the first variant's final accuracy is the target).
  """

  path: str
  settings: dict[str, Any]
  variants: dict[str, Overrides]


def load_group(path: str) -> Group:
  """The variants file at `path`: a Python file, like a config file, with `VARIANTS`.

  Where no file of that path exists, a variants file that comes with jaxdist by
  that name: `load_group('variants/default.py')` (`config.config_path`).

  Args:
    path: the variants file.

  Returns:
    Its `Group`.

  Raises:
    ConfigError: if there is no such file, or it has no `VARIANTS` dict.
  """
  path = config_lib.find(path)
  if not os.path.isfile(path):
    folder = os.path.dirname(path)
    here = os.listdir(folder or '.') if os.path.isdir(folder or '.') else []
    close = difflib.get_close_matches(os.path.basename(path), here, n=1)
    hint = f'; did you mean {os.path.join(folder, close[0])}?' if close else ''
    raise factory.ConfigError(f'no variants file at {path}{hint}')
  spec = importlib.util.spec_from_file_location('_jaxdist_variants', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not isinstance(getattr(module, 'VARIANTS', None), dict):
    raise factory.ConfigError(f'{path} has no VARIANTS dict (variant name -> overrides)')
  return Group(path, dict(getattr(module, 'SETTINGS', {})), dict(module.VARIANTS))


def load_groups(folder: str) -> dict[str, Group]:
  """Every variants file in `folder`, by its name less `.py`, in name order.

  Args:
    folder: a directory of variants files (those starting with '_' are not).

  Returns:
    The `Group`s by name.
  """
  files = sorted(f for f in os.listdir(folder) if f.endswith('.py') and not f.startswith('_'))
  return {f.removesuffix('.py'): load_group(os.path.join(folder, f)) for f in files}


def known_variants(groups: Iterable[Group]) -> dict[str, Overrides]:
  """Every variant of `groups` by name: a name means one thing, in whichever file it is.

  Args:
    groups: the variants files.

  Returns:
    The overrides by variant name.

  Raises:
    ConfigError: if two files give one name different overrides.
  """
  out, where = {}, {}
  for group in groups:
    for name, overrides in group.variants.items():
      if name in out and out[name] != overrides:
        raise factory.ConfigError(
          f'variant {name!r} differs between {where[name]} and {group.path}; one name, one variant'
        )
      out.setdefault(name, overrides)
      where.setdefault(name, group.path)
  return out


def choose(
  base: ml_collections.ConfigDict,
  path: str,
  only: Sequence[str] | None = None,
  *,
  folder: str,
  keep: Collection[str] = (),
) -> tuple[ml_collections.ConfigDict, dict[str, Overrides]]:
  """`base` with the settings of the variants file at `path`, and the variants to train.

  The file's settings are set on a copy of `base`, except the keys in `keep`
  (those the command line set: they win). The variants, in order, are `only`
  (by name: the file's, or else any of the variants files in `folder`) or
  the file's own. Every name is checked before anything trains.

  Args:
    base: the config (not changed).
    path: the variants file.
    only: the variants to train, by name (None or empty: the file's).
    folder: the variants files whose variants `only` may name too.
    keep: dotted keys the file's settings must not change.

  Returns:
    (the config with the settings, the variants' overrides by name).
  """
  group = load_group(path)
  known = {**known_variants(load_groups(folder).values()), **group.variants}
  config = base.copy_and_resolve_references()
  for key, value in group.settings.items():
    if key not in keep:
      _set(config, key, value, f'{path}: SETTINGS')
  names = list(only) if only else list(group.variants)
  return config, {name: _lookup(known, name) for name in names}


def variant_config(
  base: ml_collections.ConfigDict, variants: Mapping[str, Overrides], name: str
) -> ml_collections.ConfigDict:
  """`base` with the overrides of variant `name` (one of `variants`) applied.

  Args:
    base: the config (not changed).
    variants: overrides by variant name.
    name: the variant.

  Returns:
    A new config.
  """
  config = ml_collections.ConfigDict(base.to_dict())
  _update(config, _lookup(variants, name), name)
  return config


def _lookup(variants: Mapping[str, Overrides], name: str) -> Overrides:
  if name not in variants:
    close = difflib.get_close_matches(name, list(variants), n=1)
    hint = f' (did you mean {close[0]!r}?)' if close else ''
    raise factory.ConfigError(
      f'unknown variant {name!r}{hint}; the variants files have {sorted(variants)}'
    )
  return variants[name]


def _set(config: ml_collections.ConfigDict, key: str, value: Any, where: str) -> None:
  *parents, last = key.split('.')
  node = config
  for part in parents:
    node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
  if not isinstance(node, ml_collections.ConfigDict) or last not in node:
    raise factory.ConfigError(f'{where} sets {key!r}, which the config does not have')
  node[last] = value


def _update(node: ml_collections.ConfigDict, overrides: dict[str, Any], where: str) -> None:
  for key, value in overrides.items():
    if key not in node:
      raise factory.ConfigError(f'variant {where!r} sets {key!r}, which the config does not have')
    if isinstance(value, dict):
      _update(node[key], value, f'{where}.{key}')
    else:
      node[key] = value


def run(
  base: ml_collections.ConfigDict,
  workdir: str,
  variants: Mapping[str, Overrides],
  results: str | None = None,
  command: str = '',
  *,
  fresh: bool = False,
) -> list[dict[str, Any]]:
  """Trains each of `variants` in workdir/<name> (resuming any there); returns the tables' rows.

  Every variant's config, and whether its run in workdir/<name> may resume
  with it (`resume.check_resume`), is checked before any trains; with
  `fresh`, those runs are removed instead and every variant starts anew.

  A variant whose `init_from` is another variant's name starts from that
  variant's run (`jaxdist.train.warm_start`), which is listed, and trains,
  before it.

  Writes `compare.md` (the tables in markdown, with the command, machine and
  date that produced it), `compare.json` and `compare.png` into `workdir`,
  and the markdown and the plot also to `results` and its `.png` if given
  (the docs' tables are copies of such files: `experiments/docs_tables.py`).

  Args:
    base: the config every variant overrides.
    workdir: the comparison's directory.
    variants: overrides by variant name, in the tables' order.
    results: a markdown file to write the tables to as well (None: none).
    command: the command line, for the tables' provenance.
    fresh: start every variant anew.

  Returns:
    The tables' rows (`table_rows`).
  """
  if not variants:
    raise factory.ConfigError('no variants to compare')
  configs = {name: variant_config(base, variants, name) for name in variants}  # checked first
  try:
    warm = factory.warm.sibling_sources(configs, workdir)
  except ValueError as e:
    raise factory.ConfigError(str(e)) from e
  clocks = {  # a variant warm-started from one trained before it is checked without its source
    name: factory.build(factory.warm.cold(c) if name in warm else c, os.path.join(workdir, name))
    .clock for name, c in configs.items()
  }  # fmt: skip
  for name, config in configs.items():
    if not fresh:
      resume.check_resume(factory.record(config), os.path.join(workdir, name))
  runs, width = {}, max(map(len, configs))
  for name, config in configs.items():
    where = os.path.join(workdir, name)
    runs[name] = Run(*trials.train(config, where, fresh=fresh, label=name.ljust(width)),
                     clocks[name])  # fmt: skip
  networks = config_lib.names(base.network.profiles)
  rows = table_rows(runs, networks)
  heterogeneous = any(run.clock(1.0) is not None for run in runs.values())
  per_run, per_step = table_columns(rows, networks, base.steps, heterogeneous=heterogeneous)
  tables = [('Per run:', per_run), ('Per step (means over the run):', per_step)]
  text = '\n\n'.join(f'{head}\n\n{report.table(rows, cols)}' for head, cols in tables)
  print(f'\n{text}\n\nColumns:\n{columns.legend(per_run + per_step)}\n')
  markdown = '\n\n'.join(
    [report.provenance(command)]
    + [f'{head}\n\n{report.markdown(rows, cols)}' for head, cols in tables]
  )
  for path in (os.path.join(workdir, TABLE_FILE), results):
    if path:
      metrics.write_atomic(path, markdown + '\n')
  with open(os.path.join(workdir, 'compare.json'), 'w') as f:
    json.dump(rows, f, indent=2)
  figure = plot(runs, networks, plot_title(runs))
  report.save(figure, os.path.join(workdir, PLOT_FILE))
  if results:  # the docs show the plot beside its table
    report.save(figure, os.path.splitext(results)[0] + '.png')
  print(f'table: {os.path.join(workdir, TABLE_FILE)}\nplot:  {os.path.join(workdir, PLOT_FILE)}')
  return rows


RUN_COLUMNS = (
  Column('variant', 'variant'),
  Column('test_accuracy', 'test acc'),
  Column('delta_pp', 'vs first (pp)'),
)
STEP_COLUMNS = (
  Column('variant', 'variant'),
  Column('synced', 'synced'),
  Column('payload', 'payload B/worker/step'),
  Column('sent', 'sent B/worker/step'),
  Column('worker_step_s', 'worker step s'),
)
# shown when a run has them: Scavenger's noise, ScaDLES's buffers, the fraction of steps an
# adaptive-compression controller compressed (ScaDLES's CNC ratio), and data injection
OPTIONAL_RUN = (
  Column('gamma_normalized', 'γ/K'),
  Column('buffer_peak_total', 'peak buffer (samples)'),
  Column('compressed_fraction', 'compressed steps'),
)
OPTIONAL_STEP = (Column('inject_bytes_per_step', 'injected B/worker/step'),)
OPTIONAL = OPTIONAL_RUN + OPTIONAL_STEP
# a language model's: its loss is the target (`target_metric`), and the peak bytes of a step
LOSS_RUN_COLUMNS = (
  Column('variant', 'variant'),
  Column('test_loss', 'val loss'),
  Column('test_bits', 'bits/char'),
  Column('gap_pct', 'vs first (%)'),
)
PEAK = Column('peak_sent', 'peak sent B/worker/step')


def target_metric(summary: Mapping[str, Any]) -> str:
  """What a comparison's target is: a language model's validation loss, else test accuracy.

  Args:
    summary: a run's summary.

  Returns:
    'test_loss' or 'test_accuracy'.
  """
  return 'test_loss' if summary.get('test_bits') is not None else 'test_accuracy'


def table_columns(
  rows: Sequence[Mapping[str, Any]], networks: Sequence[str], steps: int, *, heterogeneous: bool
) -> tuple[tuple[Column, ...], tuple[Column, ...]]:
  """The per-run table's columns and the per-step table's, for `rows` (`table_rows`).

  The times to the target are on each network; a heterogeneous cluster's run
  also has its modelled seconds and cost on each. Optional columns appear when
  a row has them.

  Args:
    rows: the rows.
    networks: the profile names.
    steps: the runs' steps (a heading says it).
    heterogeneous: the runs had a cluster model.

  Returns:
    (the per-run table's columns, the per-step table's).
  """
  target, loss = f'{rows[0]["target"]:.4f}', rows[0].get('metric') == 'test_loss'
  per_run = (LOSS_RUN_COLUMNS if loss else RUN_COLUMNS) + tuple(
    Column(f'tta@{n}', f'time to {target} @{n}', 'time to L @NET' if loss else 'time to A @NET')
    for n in networks
  )
  if heterogeneous:
    per_run += tuple(
      Column(f'modelled_s@{n}', f'{steps} steps @{n} (s)', 'N steps @NET (s)') for n in networks
    )
    per_run += tuple(Column(f'cost@{n}', f'cost @{n}', 'cost @NET') for n in networks)
  present = lambda cols: tuple(c for c in cols if any(c.key in row for row in rows))
  per_step = STEP_COLUMNS + ((PEAK,) if loss else ()) + present(OPTIONAL_STEP)
  return per_run + present(OPTIONAL_RUN), per_step


class Run(NamedTuple):
  """One variant's outcome: its summary, per-step records and clock factory.

  Attributes:
    summary: the run's summary.
    records: its per-step records.
    clock: `compute_s -> netmodel.WorkerClock | None` (`factory.Experiment.clock`).
  """

  summary: dict[str, Any]
  records: list[dict[str, Any]]
  clock: Any


def table_rows(runs: dict[str, Run], networks: Sequence[str]) -> list[dict[str, Any]]:
  """One row per variant; the first variant's final accuracy is everyone's target.

  A language model's target is its validation loss (`target_metric`).

  Args:
    runs: the variants' runs, by name, the first setting the target.
    networks: the profile names of the times to the target.

  Returns:
    The rows, in `runs`' order.
  """
  first = next(iter(runs.values())).summary
  metric = target_metric(first)
  target = first[metric]
  rows = []
  for name, (summary, records, clock) in runs.items():
    row = {
      'variant': name,
      'test_accuracy': summary['test_accuracy'],
      'delta_pp': 100 * (summary['test_accuracy'] - first['test_accuracy']),
      'payload': summary['payload_bytes_per_step'],
      'sent': summary['sent_bytes_per_step'],
      'synced': f'{summary["sync_fraction"]:.1%}' if summary['sync_fraction'] is not None else None,
      'worker_step_s': summary['worker_step_s'],
      'target': target,
      'metric': metric,
      **_loss_fields(summary, target, metric),
      **{c.key: summary[c.key] for c in OPTIONAL if summary.get(c.key) is not None},
    }
    for net in networks:
      compute_s = summary['worker_step_s']
      hit = ledger.time_to_accuracy(records, target, net, compute_s, clock(compute_s), metric)
      row[f'tta@{net}'] = f'{hit[1]:.2f}s (step {hit[0]})' if hit else 'not reached'
      row[f'modelled_s@{net}'] = summary.get(f'modelled_s@{net}')
      row[f'cost@{net}'] = summary.get(f'cost@{net}')
    rows.append(row)
  return rows


def _loss_fields(summary: Mapping[str, Any], target: float, metric: str) -> dict[str, Any]:
  """A language model's row entries: its loss, in bits, its gap to the target, its peak bytes."""
  if metric != 'test_loss':
    return {}
  return {
    'test_loss': summary['test_loss'],
    'test_bits': summary['test_bits'],
    'gap_pct': 100 * (summary['test_loss'] - target) / target,
    'peak_sent': summary['peak_sent_bytes_per_step'],
  }


def plot_title(runs: Mapping[str, Run]) -> str:
  """The comparison plot's title: the model, the data and the workers of `runs`.

  Args:
    runs: the variants' runs.

  Returns:
    e.g. 'cnn on digits, 8 workers' (differing values joined by '/').
  """
  summaries = [run.summary for run in runs.values()]
  values = lambda key: '/'.join(dict.fromkeys(str(s[key]) for s in summaries))
  return f'{values("model")} on {values("dataset")}, {values("workers")} workers'


def accuracy_range(finals: Sequence[float], target: float, best: float) -> tuple[float, float]:
  """y-limits that show where accuracies differ: a span below the lowest final, to the best.

  The span is the distance from the lowest of `finals` and `target` to the
  highest of `best` and `target` (at least 0.02); below goes one span under
  the lowest (not under 0), above a tenth of a span over the highest.

  Args:
    finals: the runs' final accuracies.
    target: the target accuracy.
    best: the best accuracy any evaluation reached.

  Returns:
    (bottom, top).
  """
  low, high = min(*finals, target), max(best, target)
  span = max(high - low, 0.02)
  return max(0.0, low - span), high + 0.1 * span


def plot(runs: Mapping[str, Run], networks: Sequence[str], title: str = '') -> Figure:
  """Test accuracy against modelled time, one panel per network, with the target accuracy.

  The target is the first variant's final accuracy, as in the tables; the
  accuracy axis starts below the lowest final accuracy (`accuracy_range`).
  A language model's panels show its validation loss instead (`target_metric`).

  Args:
    runs: the variants' runs, by name.
    networks: one panel per profile name.
    title: the figure's title.

  Returns:
    The `Figure`.
  """
  metric = target_metric(next(iter(runs.values())).summary)
  target = next(iter(runs.values())).summary[metric]
  finals = [run.summary[metric] for run in runs.values()]
  best = max(r[metric] for run in runs.values() for r in run.records
             if metric in r)  # fmt: skip
  fig = Figure(figsize=(5 * len(networks), 4))
  axes = fig.subplots(1, len(networks), squeeze=False)
  for ax, net in zip(axes[0], networks, strict=True):
    for name, (summary, records, make_clock) in runs.items():
      compute_s = summary['worker_step_s']
      clock = dict(ledger.modelled_clock(records, net, compute_s, make_clock(compute_s)))
      evals = [r for r in records if metric in r]
      ax.plot(
        [clock[r['step']] for r in evals],
        [r[metric] for r in evals],
        'o-',
        ms=3,
        label=name,
      )
    ax.axhline(target, color='gray', ls='--', lw=1, label=f'target {target:.4f}')
    if metric == 'test_loss':
      ax.set(xlabel=f'modelled time (s) @ {net}', ylabel='validation loss (nats/token)')
      ax.set_ylim(min(*finals, target) - 0.1, max(finals) + 0.6)
    else:
      ax.set(xlabel=f'modelled time (s) @ {net}', ylabel='test accuracy')
      ax.set_ylim(accuracy_range(finals, target, best))
    report.log_scale(ax, 'x')
    ax.grid(alpha=0.3)
    ax.legend(loc='upper right' if metric == 'test_loss' else 'lower right', fontsize='small')
  if title:
    fig.suptitle(title)
  ticks.space(fig)
  fig.tight_layout()
  return fig
