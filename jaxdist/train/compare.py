"""Several variants of one experiment, side by side: one table, one plot.

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

from jaxdist.train import config as config_lib
from jaxdist.train import factory, ledger, metrics, report, resume, trials

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
  """Every variants file in `folder`, by its name less `.py`, in name order."""
  files = sorted(f for f in os.listdir(folder) if f.endswith('.py') and not f.startswith('_'))
  return {f.removesuffix('.py'): load_group(os.path.join(folder, f)) for f in files}


def known_variants(groups: Iterable[Group]) -> dict[str, Overrides]:
  """Every variant of `groups` by name: a name means one thing, in whichever file it is."""
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
  """`base` with the overrides of variant `name` (one of `variants`) applied."""
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
  """Trains each of `variants` in workdir/<name> (resuming any there); returns the table rows.

  Every variant's config, and whether its run in workdir/<name> may resume
  with it (`resume.check_resume`), is checked before any trains; with
  `fresh`, those runs are removed instead and every variant starts anew.

  Writes `compare.md` (the table in markdown, with the command, machine and
  date that produced it), `compare.json` and `compare.png` into `workdir`,
  and the markdown and the plot also to `results` and its `.png` if given
  (the docs' tables are copies of such files: `experiments/docs_tables.py`).
  """
  if not variants:
    raise factory.ConfigError('no variants to compare')
  configs = {name: variant_config(base, variants, name) for name in variants}  # checked first
  clocks = {
    name: factory.build(c, os.path.join(workdir, name)).clock for name, c in configs.items()
  }
  for name, config in configs.items():
    if not fresh:
      resume.check_resume(factory.record(config), os.path.join(workdir, name))
  runs = {}
  for name, config in configs.items():
    print(f'\n=== {name}')
    runs[name] = Run(*trials.train(config, os.path.join(workdir, name), fresh=fresh), clocks[name])
  networks = config_lib.names(base.network.profiles)
  rows = table_rows(runs, networks)
  columns = COLUMNS + tuple((f'tta@{n}', f'time to {rows[0]["target"]:.4f} @{n}') for n in networks)
  columns += tuple(c for c in OPTIONAL if any(c[0] in row for row in rows))
  if any(run.clock(1.0) is not None for run in runs.values()):  # a heterogeneous cluster
    columns += tuple((f'modelled_s@{n}', f'{base.steps} steps @{n} (s)') for n in networks)
    columns += tuple((f'cost@{n}', f'cost @{n}') for n in networks)
  text = report.table(rows, columns)
  note = 'modelled seconds = steps x one worker measured step + alpha-beta communication'
  print(f'\n{text}\n\n(times: {note})')
  markdown = report.provenance(command) + '\n\n' + report.markdown(rows, columns) + '\n'
  for path in (os.path.join(workdir, TABLE_FILE), results):
    if path:
      metrics.write_atomic(path, markdown)
  with open(os.path.join(workdir, 'compare.json'), 'w') as f:
    json.dump(rows, f, indent=2)
  figure = plot(runs, networks)
  report.save(figure, os.path.join(workdir, PLOT_FILE))
  if results:  # the docs show the plot beside its table
    report.save(figure, os.path.splitext(results)[0] + '.png')
  print(f'plot: {os.path.join(workdir, PLOT_FILE)}')
  return rows


COLUMNS = (
  ('variant', 'variant'),
  ('test_accuracy', 'test acc'),
  ('delta_pp', 'vs first (pp)'),
  ('synced', 'synced'),
  ('payload', 'payload B/worker/step'),
  ('sent', 'sent B/worker/step'),
  ('worker_step_s', 'worker step s'),
)


# shown when a run has them: Scavenger's noise, ScaDLES's buffers, data injection, and the
# fraction of steps an adaptive-compression controller compressed (ScaDLES's CNC ratio)
OPTIONAL = (
  ('gamma_normalized', 'γ/K'),
  ('buffer_peak_total', 'peak buffer (samples)'),
  ('inject_bytes_per_step', 'injected B/worker/step'),
  ('compressed_fraction', 'compressed steps'),
)


class Run(NamedTuple):
  """One variant's outcome: its summary, per-step records and clock factory."""

  summary: dict[str, Any]
  records: list[dict[str, Any]]
  clock: Any  # compute_s -> netmodel.WorkerClock | None (factory.Experiment.clock)


def table_rows(runs: dict[str, Run], networks: Sequence[str]) -> list[dict[str, Any]]:
  """One row per variant; the first variant's final accuracy is everyone's target."""
  first = next(iter(runs.values())).summary
  target = first['test_accuracy']
  rows = []
  for name, (summary, records, clock) in runs.items():
    row = {
      'variant': name,
      'test_accuracy': summary['test_accuracy'],
      'delta_pp': 100 * (summary['test_accuracy'] - target),
      'payload': summary['payload_bytes_per_step'],
      'sent': summary['sent_bytes_per_step'],
      'synced': f'{summary["sync_fraction"]:.1%}' if summary['sync_fraction'] is not None else None,
      'worker_step_s': summary['worker_step_s'],
      'target': target,
      **{key: summary[key] for key, _ in OPTIONAL if summary.get(key) is not None},
    }
    for net in networks:
      compute_s = summary['worker_step_s']
      hit = ledger.time_to_accuracy(records, target, net, compute_s, clock(compute_s))
      row[f'tta@{net}'] = f'{hit[1]:.2f}s (step {hit[0]})' if hit else 'not reached'
      row[f'modelled_s@{net}'] = summary.get(f'modelled_s@{net}')
      row[f'cost@{net}'] = summary.get(f'cost@{net}')
    rows.append(row)
  return rows


def plot(runs: dict[str, Run], networks: Sequence[str]) -> Figure:
  """Test accuracy against modelled time, one panel per network."""
  fig = Figure(figsize=(5 * len(networks), 3.8))
  axes = fig.subplots(1, len(networks), squeeze=False)
  for ax, net in zip(axes[0], networks, strict=True):
    for name, (summary, records, make_clock) in runs.items():
      compute_s = summary['worker_step_s']
      clock = dict(ledger.modelled_clock(records, net, compute_s, make_clock(compute_s)))
      evals = [r for r in records if 'test_accuracy' in r]
      ax.plot(
        [clock[r['step']] for r in evals],
        [r['test_accuracy'] for r in evals],
        'o-',
        ms=3,
        label=name,
      )
    ax.set(xlabel=f'modelled time (s) @ {net}', ylabel='test accuracy')
    report.log_scale(ax, 'x')
    ax.grid(alpha=0.3)
    ax.legend(loc='lower right')
  fig.tight_layout()
  return fig
