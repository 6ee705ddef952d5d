r"""Every variant, a few steps, on a pinned clock: a record to compare a refactor against.

  python experiments/golden.py --workdir=/tmp/golden --out=/tmp/golden/a.json
  python experiments/golden.py --workdir=/tmp/golden --check=/tmp/golden/a.json

Trains each variant of configs/variants/ on configs/digits.py (at `runlocal`
size, 24 steps) with the settings of its group (its variants file; none if a
group without settings has it too), and the compute term pinned
(`network.compute_s`), so that nothing the runs decide depends on how fast
this machine was. It keeps every per-step record and the summary, less
the wall-clock fields (`IGNORED`). `--check` trains again and demands the
same records bit for bit: a change meant to move code, not numbers, passes.
Runs that fail record their error line, which must match too.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from typing import Any

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Scratch directory for the runs (emptied first).')
flags.DEFINE_string('out', None, 'Write the record here (JSON).')
flags.DEFINE_string('check', None, 'Compare against this record; exit 1 on any difference.')
flags.DEFINE_list('only', [], 'Run these entries only (default: all).')
flags.DEFINE_integer('steps', 24, 'Steps per run.')

IGNORED = {  # wall-clock measurements, different on every run
  'step_s',
  'wall_s',
  'samples_per_s',
  'median_step_s',
  'worker_step_s',
  'steps_this_run',
}
PINNED = {'network.compute_s': 0.002, 'progress': False}


VARIANTS_DIR = os.path.join(REPO, 'configs', 'variants')
# entries beyond one per variant: (variant, its group, overrides of the group's settings)
# under their own name; the straggle window is the Makefile's 20-120 of 400 steps, scaled
EXTRA: dict[str, tuple[str, str, dict[str, Any]]] = {
  'ssp2@stragglers': ('ssp2', 'stragglers', {}),
  'async4@straggle': ('async4', 'straggle', {'fault.straggle': '7:8@4-16'}),
  'gossip_ring@straggle': ('gossip_ring', 'straggle', {'fault.straggle': '7:8@4-16'}),
}


def group_settings(groups, name: str) -> dict[str, Any]:
  """The settings variant `name` runs with: none if a group without settings has it, else
  those of the groups that have it (which must agree)."""
  settings = [g.settings for g in groups.values() if name in g.variants]
  if {} in settings:
    return {}
  if any(s != settings[0] for s in settings):
    raise ValueError(f'variant {name!r} is in groups with different settings: {settings}')
  return dict(settings[0])


def entries(groups) -> dict[str, tuple[str, dict[str, Any]]]:
  """(variant, settings) by entry name: every variant of the variants files, then `EXTRA`."""
  names = sorted({name for g in groups.values() for name in g.variants})
  out = {name: (name, group_settings(groups, name)) for name in names}
  for entry, (name, group, overrides) in EXTRA.items():
    out[entry] = (name, {**groups[group].settings, **overrides})
  return out


def _clean(record: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in record.items() if k not in IGNORED}


def run_one(
  variant: str, overrides: dict[str, Any], variants: dict[str, Any], workdir: str
) -> dict[str, Any]:
  from jaxdist.train import compare, factory, metrics, trainer

  settings = {'steps': FLAGS.steps, 'eval_every': 12, 'checkpoint_every': 12}
  settings.update(PINNED)
  settings.update(overrides)
  try:
    base = factory.load_config(os.path.join(REPO, 'configs', 'digits.py:runlocal'), **settings)
    config = compare.variant_config(base, variants, variant)
    summary = trainer.train_and_evaluate(config, workdir, fresh=True)
  except Exception as e:  # recorded: a refactor must fail the same way
    traceback.print_exc()
    return {'error': f'{type(e).__name__}: {e}'}
  records = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
  return {'summary': _clean(summary), 'records': [_clean(r) for r in records]}


def differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
  """The entries whose records differ, each with its first difference."""
  out = []
  for name in sorted(set(want) | set(got)):
    a, b = want.get(name), got.get(name)
    if a == b:
      continue
    if a is None or b is None:
      out.append(f'{name}: only in {"the new run" if a is None else "the record"}')
      continue
    first = _first(a, b)
    out.append(f'{name}: {first}')
  return out


def _first(a: Any, b: Any, where: str = '') -> str:
  if isinstance(a, dict) and isinstance(b, dict):
    for key in sorted(set(a) | set(b), key=str):
      if a.get(key) != b.get(key):
        return _first(a.get(key), b.get(key), f'{where}.{key}')
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      return f'{where}: {len(a)} records against {len(b)}'
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
      if x != y:
        return _first(x, y, f'{where}[{i}]')
  return f'{where}: {a!r} -> {b!r}'


def main(argv: list[str]) -> None:
  del argv
  if not FLAGS.workdir or not (FLAGS.out or FLAGS.check):
    raise app.UsageError('give --workdir and --out or --check')
  from jaxdist.train import cli

  cli.setup(8)
  from jaxdist.train import compare

  groups = compare.load_groups(VARIANTS_DIR)
  variants = compare.known_variants(groups.values())
  todo = entries(groups)
  if FLAGS.only:
    unknown = sorted(set(FLAGS.only) - set(todo))
    if unknown:
      raise app.UsageError(f'unknown entries {unknown}; known: {sorted(todo)}')
    todo = {k: todo[k] for k in FLAGS.only}
  shutil.rmtree(FLAGS.workdir, ignore_errors=True)
  got = {}
  for name, (variant, overrides) in todo.items():
    print(f'=== {name}', flush=True)
    got[name] = run_one(variant, overrides, variants, os.path.join(FLAGS.workdir, name))
  if FLAGS.out:
    with open(FLAGS.out + '.tmp', 'w') as f:
      json.dump(got, f, indent=0, sort_keys=True)
    os.replace(FLAGS.out + '.tmp', FLAGS.out)
  if FLAGS.check:
    with open(FLAGS.check) as f:
      want = json.load(f)
    if FLAGS.only:
      want = {k: v for k, v in want.items() if k in got}
    diff = differences(want, got)
    print('\n'.join(diff) if diff else f'golden: {len(got)} runs equal to {FLAGS.check}')
    sys.exit(1 if diff else 0)


if __name__ == '__main__':
  app.run(main)
