"""The package's layers, read from its source (no imports run).

1. The experiment config (an `ml_collections.ConfigDict`) is read by the
   factory and the binaries' helpers only: everything below them is given
   plain values.
2. The library's lower layers (`sync`, `compress`, `comm`, `netmodel`,
   `data`, `models`, `faults`, `control`) never import `jaxdist.train`.
3. The training step knows no particular transform: `train/step.py` imports
   nothing from `jaxdist.sync`.
4. No public callable of `jaxdist.control` takes a `config`.

`EXCEPTIONS` lists what broke a rule when it came in, with its count; like
test_sizes' allowlist it may only shrink.
"""

import ast
import importlib
import inspect
import os

import pytest

from conftest import REPO

CONFIG_READERS = (  # rule 1: may read the config (files, or folders ending in /)
  'jaxdist/train/config.py',
  'jaxdist/train/config_files.py',  # the :arg of a config file, as a ConfigDict
  'jaxdist/train/factory/',
  'jaxdist/train/cli.py',
  'jaxdist/train/compare.py',
  'jaxdist/train/trials.py',  # a trial sets K, B and steps; the job plan reads the price
)
LOWER = ('sync', 'compress', 'comm', 'netmodel', 'data', 'models', 'faults', 'control')

EXCEPTIONS = {
  'config reads': {},
  'imports jaxdist.train': {},
  'step imports jaxdist.sync': {},
}


def modules():
  for folder, _, names in os.walk(os.path.join(REPO, 'jaxdist')):
    for name in sorted(names):
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        with open(path) as f:
          yield os.path.relpath(path, REPO).replace(os.sep, '/'), ast.parse(f.read())


def config_reads(tree: ast.AST) -> int:
  """`config.x`, `cfg.x` and `<anything>.config`, leaving out `jax.config`."""
  reads = 0
  for node in ast.walk(tree):
    if not isinstance(node, ast.Attribute):
      continue
    named = isinstance(node.value, ast.Name) and node.value.id in ('config', 'cfg')
    attribute = node.attr == 'config' and not (
      isinstance(node.value, ast.Name) and node.value.id == 'jax'
    )
    reads += named or attribute
  return reads


def imported(tree: ast.AST) -> list[str]:
  """One dotted name per name imported (`from a.b import c` gives `a.b.c`)."""
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names += [f'{node.module}.{a.name}' for a in node.names]
    elif isinstance(node, ast.Import):
      names += [a.name for a in node.names]
  return names


def counts() -> dict[str, dict[str, int]]:
  found = {rule: {} for rule in EXCEPTIONS}
  for rel, tree in modules():
    names = imported(tree)
    reads = config_reads(tree) + any(n.startswith('ml_collections') for n in names)
    if reads and not rel.startswith(CONFIG_READERS):
      found['config reads'][rel] = reads
    if rel.split('/')[1] in LOWER:
      up = sum(n == 'jaxdist.train' or n.startswith('jaxdist.train.') for n in names)
      if up:
        found['imports jaxdist.train'][rel] = up
    if rel == 'jaxdist/train/step.py':
      sync = sum(n == 'jaxdist.sync' or n.startswith('jaxdist.sync.') for n in names)
      if sync:
        found['step imports jaxdist.sync'][rel] = sync
  return found


@pytest.mark.parametrize('rule', sorted(EXCEPTIONS))
def test_rule(rule):
  allowed = EXCEPTIONS[rule]
  found = counts()[rule]
  broken = [f'{rel}: {n}' for rel, n in sorted(found.items()) if n > allowed.get(rel, 0)]
  assert not broken, f'{rule} (tests/lint/test_layers.py):\n' + '\n'.join(broken)
  shrunk = [f'{rel}: {found.get(rel, 0)} (allowed {n})' for rel, n in allowed.items()
            if found.get(rel, 0) < n]  # fmt: skip
  assert not shrunk, f'{rule}: lower the exception to what is left:\n' + '\n'.join(shrunk)


def test_control_takes_no_config():
  control = importlib.import_module('jaxdist.control')
  takes = []
  for name in getattr(control, '__all__', dir(control)):
    obj = getattr(control, name)
    if name.startswith('_') or not callable(obj):
      continue
    try:
      params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
      continue
    if 'config' in params or 'cfg' in params:
      takes.append(name)
  assert not takes, f'jaxdist.control callables take a config: {takes}'


def test_the_reads_are_found():
  tree = ast.parse('config.a\ncfg.b.c\nexp.config\njax.config.update(1)\nx.configs\n')
  assert config_reads(tree) == 3
  tree = ast.parse('from jaxdist.train import metrics\nimport jaxdist.train.step\nimport jax\n')
  assert [n for n in imported(tree) if n.startswith('jaxdist.train')] == [
    'jaxdist.train.metrics',
    'jaxdist.train.step',
  ]
