r"""Every variant, a few steps, on a pinned clock: a record to compare a refactor against.

  python experiments/golden.py --workdir=/tmp/golden --out=/tmp/golden/a.json
  python experiments/golden.py --workdir=/tmp/golden --check=/tmp/golden/a.json

Trains each variant of configs/digits.py (at `runlocal` size, 24 steps) with
the overrides of the `make results` group that runs it, and the compute term
pinned (`network.compute_s`), so that nothing the runs decide depends on how
fast this machine was. It keeps every per-step record and the summary, less
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


# the Makefile's `results` groups' overrides, by the variants they apply to
def _group(names: str, **overrides: Any) -> dict[str, dict[str, Any]]:
  return {name: dict(overrides) for name in names.split()}


GROUPS: dict[str, dict[str, Any]] = {
  **_group('uniform_h2 dynamic_h2 uniform_h10 dynamic_h10', workers=3, batch_size=96),
  **_group(
    'iid seldp labels1 labels1_inject10 labels1_inject50 selsync_labels1_inject50 '
    'selsync005_labels1_inject50',
    workers=10,
    batch_size=160,
  ),
  **_group(
    'fixed10x fixed30x fixed90x fixed270x fixed833x adopt adopt_lazy',
    **{'network.profiles': 'adopt_c1@25,1gbps'},
  ),
  **_group('hitopk', workers=16, devices=2, **{'network.profiles': '10gbps,25gbps@25us'}),
}
# entries beyond the variants: (variant, overrides) under their own name
EXTRA: dict[str, tuple[str, dict[str, Any]]] = {
  'ssp2@stragglers': (
    'ssp2',
    {'cluster.straggler_p': 0.1, 'cluster.straggler_slowdown': 4.0, 'cluster.price': 1.0},
  ),
  'async4@straggle': ('async4', {'fault.straggle': '7:8@4-16'}),
  'gossip_ring@straggle': ('gossip_ring', {'fault.straggle': '7:8@4-16'}),
}


def entries(base_variants) -> dict[str, tuple[str, dict[str, Any]]]:
  out = {name: (name, GROUPS.get(name, {})) for name in sorted(base_variants)}
  out.update(EXTRA)
  return out


def _clean(record: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in record.items() if k not in IGNORED}


def run_one(variant: str, overrides: dict[str, Any], workdir: str) -> dict[str, Any]:
  from jaxdist.train import compare, factory, metrics, trainer

  settings = {'steps': FLAGS.steps, 'eval_every': 12, 'checkpoint_every': 12}
  settings.update(PINNED)
  settings.update(overrides)
  try:
    base = factory.load_config(os.path.join(REPO, 'configs', 'digits.py:runlocal'), **settings)
    config = compare.variant_config(base, variant)
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
  from jaxdist.train import config as config_lib

  todo = entries(config_lib.variants())
  if FLAGS.only:
    unknown = sorted(set(FLAGS.only) - set(todo))
    if unknown:
      raise app.UsageError(f'unknown entries {unknown}; known: {sorted(todo)}')
    todo = {k: todo[k] for k in FLAGS.only}
  shutil.rmtree(FLAGS.workdir, ignore_errors=True)
  got = {}
  for name, (variant, overrides) in todo.items():
    print(f'=== {name}', flush=True)
    got[name] = run_one(variant, overrides, os.path.join(FLAGS.workdir, name))
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
