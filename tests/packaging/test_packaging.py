"""jaxdist as a user installs it: the wheel, its metadata, the lock, the core install alone.

`pip install jaxdist` brings jax, optax and numpy only; the training stack,
the controllers' solvers and the notebooks' and docs' tools are extras
(pyproject.toml). The wheel is built as `python -m build` builds it (a source
distribution, then the wheel from it), from the files a source distribution
is made of; the core install is that wheel in a fresh venv with the lock's
versions of its dependencies and nothing else.
"""

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

CORE = {'jax', 'optax', 'numpy'}
EXTRAS = {'train', 'control', 'notebooks', 'docs', 'test', 'all', 'cuda', 'tpu'}
# what the core install must not have: each extra's own packages (scipy comes with jax)
NOT_CORE = ('flax', 'orbax', 'tensorflow_datasets', 'ml_collections', 'matplotlib', 'tensorboardX',
            'sklearn', 'kneed', 'pymoo', 'mkdocs', 'pytest')  # fmt: skip
SOURCES = ('pyproject.toml', 'README.md', 'LICENSE', 'jaxdist', 'configs')
LOCK = os.path.join(REPO, 'requirements.lock')
# pip's words when the registry cannot be reached (and its cache does not have the file)
OFFLINE = re.compile(
  r'NewConnectionError|Temporary failure in name resolution|Network is unreachable|'
  r'Name or service not known|No route to host|Max retries exceeded'
)


def pyproject() -> dict:
  with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
    return tomllib.load(f)


def py_files(folder: str) -> set[str]:
  """The .py files under REPO/folder, relative to it."""
  top = os.path.join(REPO, folder)
  return {
    os.path.relpath(os.path.join(d, n), top).replace(os.sep, '/')
    for d, _, names in os.walk(top)
    for n in names
    if n.endswith('.py') and '__pycache__' not in d
  }


def test_every_package_and_config_folder_is_listed():
  packages = {os.path.dirname(f'jaxdist/{f}').replace('/', '.') for f in py_files('jaxdist')} | {
    os.path.dirname(f'jaxdist/configs/{f}').replace('/', '.') for f in py_files('configs')
  }
  assert set(pyproject()['tool']['setuptools']['packages']) == packages
  assert pyproject()['tool']['setuptools']['package-dir'] == {'jaxdist.configs': 'configs'}


def requirements(extras: list[str]) -> list[Requirement]:
  """The core requirements and those of `extras`, the extras they name followed."""
  project = pyproject()['project']
  found, todo, seen = [Requirement(r) for r in project['dependencies']], list(extras), set()
  while todo:
    extra = todo.pop()
    seen.add(extra)
    for r in map(Requirement, project['optional-dependencies'][extra]):
      if r.name == 'jaxdist':
        todo += [e for e in r.extras if e not in seen]
      else:
        found.append(r)
  return found


def test_the_core_is_jax_optax_and_numpy():
  assert {Requirement(r).name for r in pyproject()['project']['dependencies']} == CORE
  assert set(pyproject()['project']['optional-dependencies']) == EXTRAS
  everything = {r.name for r in requirements(['all'])}
  assert {'flax', 'orbax-checkpoint', 'kneed', 'pymoo', 'mkdocs', 'pytest', 'build'} <= everything


def test_the_lock_pins_every_requirement_of_the_all_extra_within_its_range():
  pins = {}
  with open(LOCK) as f:
    for line in f:
      match = re.match(r'([A-Za-z0-9_.\-]+)==([^\s;]+)', line)
      if match:
        pins[canonicalize_name(match[1])] = match[2]
  assert pins['jax'] == '0.10.2', 'the lock resolves for Python 3.11, whose last jax is 0.10'
  for r in requirements(['all']):
    name = canonicalize_name(r.name)
    assert name in pins, f'{r} is not in requirements.lock: run `make lock`'
    assert r.specifier.contains(pins[name], prereleases=True), f'{r}: the lock has {pins[name]}'


@pytest.fixture(scope='module')
def dist(tmp_path_factory):
  """(wheel, sdist) paths, built by `python -m build` from a copy of the sources."""
  src, out = tmp_path_factory.mktemp('src'), tmp_path_factory.mktemp('dist')
  for name in SOURCES:
    path = os.path.join(REPO, name)
    if os.path.isdir(path):
      shutil.copytree(path, src / name, ignore=shutil.ignore_patterns('__pycache__'))
    else:
      shutil.copy(path, src / name)
  # the build backend (setuptools) comes from the lock, as `make venv` installs it
  cmd = [sys.executable, '-m', 'build', '--no-isolation', '--outdir', str(out), str(src)]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, f'python -m build:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}'
  (wheel,) = out.glob('jaxdist-*.whl')
  (sdist,) = out.glob('jaxdist-*.tar.gz')
  return wheel, sdist


def test_the_wheel_holds_the_package_its_configs_and_the_license(dist):
  wheel, sdist = dist
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    info = next(n.split('/')[0] for n in names if n.endswith('.dist-info/METADATA'))
    metadata = email.parser.Parser().parsestr(z.read(f'{info}/METADATA').decode())
    license_text = z.read(f'{info}/licenses/LICENSE').decode()
  assert {f'jaxdist/{f}' for f in py_files('jaxdist')} <= names
  assert {f'jaxdist/configs/{f}' for f in py_files('configs')} <= names
  assert 'jaxdist/configs/digits.py' in names and 'jaxdist/configs/variants/default.py' in names
  with open(os.path.join(REPO, 'LICENSE')) as f:
    assert license_text == f.read()
  assert 'Apache License' in license_text and 'Version 2.0, January 2004' in license_text
  assert metadata['License-Expression'] == 'Apache-2.0'
  assert metadata['License-File'] == 'LICENSE'
  requires = [Requirement(r) for r in metadata.get_all('Requires-Dist')]
  assert {r.name for r in requires if r.marker is None} == CORE
  assert set(metadata.get_all('Provides-Extra')) == EXTRAS
  urls = dict(u.split(', ', 1) for u in metadata.get_all('Project-URL'))
  assert set(urls) == {'Homepage', 'Repository', 'Documentation', 'Changelog'}
  assert all(u.startswith('https://') for u in urls.values())
  with subprocess.Popen(['tar', 'tzf', str(sdist)], stdout=subprocess.PIPE, text=True) as tar:
    listed = tar.stdout.read().split()
  assert {n.split('/', 1)[1] for n in listed if '/' in n} >= {'LICENSE', 'configs/digits.py'}


# Run in the core venv, outside the repository: the installed jaxdist, none of the extras'
# packages, and every doctest of the modules the core install is for, per docstring.
CORE_CHECK = """
import doctest, importlib, importlib.resources, importlib.util, json, pathlib, pkgutil, sys
import jaxdist as jd

modules = ['jaxdist', 'jaxdist.runtime', 'jaxdist.testing', 'jaxdist.probes', 'jaxdist.timing']
for pkg in ('comm', 'compress', 'netmodel', 'sync'):
  path = importlib.import_module('jaxdist.' + pkg).__path__
  modules += ['jaxdist.' + pkg] + [m.name for m in pkgutil.walk_packages(path, f'jaxdist.{pkg}.')]
finder, runner, ran = doctest.DocTestFinder(), doctest.DocTestRunner(), {}
for name in modules:
  importlib.import_module(name)
  for test in finder.find(sys.modules[name], name):
    if test.examples:
      ran[test.name] = runner.run(test)._asdict()
try:
  jd.train.train_and_evaluate
  needs = None
except ModuleNotFoundError as e:
  needs = str(e)
configs = pathlib.Path(str(importlib.resources.files('jaxdist') / 'configs'))
print(json.dumps({
  'file': jd.__file__, 'prefix': sys.prefix, 'ran': ran, 'train': needs,
  'present': [m for m in sys.argv[1:] if importlib.util.find_spec(m)],
  'sync': sorted(jd.sync.__all__), 'configs': sorted(
    str(p.relative_to(configs)) for p in configs.rglob('*.py') if '__pycache__' not in p.parts),
}))
"""
# With ml-collections added (the configs' one import): the configs load from the install.
CONFIG_CHECK = """
import importlib.util, json
from jaxdist.train import config
path = config.config_path('digits.py')
spec = importlib.util.spec_from_file_location('digits', path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
c = module.get_config('runlocal,workers=4')
print(json.dumps({'path': path, 'found': config.find('variants/default.py'),
                  'workers': c.workers, 'steps': c.steps}))
"""


def pip(venv_python: str, *args: str) -> subprocess.CompletedProcess:
  """pip (this interpreter's) installing into the venv, the lock's versions only."""
  cmd = [sys.executable, '-m', 'pip', '--python', venv_python, 'install', '--quiet']
  cmd += ['--retries', '2', '--constraint', LOCK, *args]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def run_in(venv_python: str, code: str, *args: str, cwd) -> dict:
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  proc = subprocess.run(
    [venv_python, '-c', code, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_the_core_install_alone_runs_the_transforms_doctests(dist, tmp_path):
  wheel, _ = dist
  venv = tmp_path / 'core'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
  python = str(venv / 'bin' / 'python')
  proc = pip(python, str(wheel))
  if proc.returncode and OFFLINE.search(proc.stdout + proc.stderr):
    pytest.skip('the package registry is out of reach and pip has no copy of the core wheels')
  assert proc.returncode == 0, proc.stderr[-4000:]

  out = run_in(python, CORE_CHECK, *NOT_CORE, cwd=tmp_path)
  assert out['file'].startswith(out['prefix']), f'not the installed jaxdist: {out["file"]}'
  assert out['present'] == [], f'the core install has {out["present"]}'
  failed = {name: r for name, r in out['ran'].items() if r['failed']}
  assert not failed, f'doctests failed in the core install: {failed}'
  for name in ('jaxdist.sync.compressed.compressed_allreduce', 'jaxdist.sync.diloco.diloco'):
    assert out['ran'][name]['attempted'] >= 3, (name, out['ran'].get(name))
  assert sum(r['attempted'] for r in out['ran'].values()) >= 150  # 193 when written
  assert {'compressed_allreduce', 'diloco', 'local_sgd', 'powersgd'} <= set(out['sync'])
  assert "pip install 'jaxdist[train]'" in out['train'], out['train']
  assert set(out['configs']) == py_files('configs')

  assert pip(python, 'ml-collections').returncode == 0
  out = run_in(python, CONFIG_CHECK, cwd=tmp_path)
  site = os.path.join('site-packages', 'jaxdist', 'configs')
  assert out['path'].endswith(os.path.join(site, 'digits.py')) and str(venv) in out['path']
  assert out['found'].endswith(os.path.join(site, 'variants', 'default.py'))
  assert (out['workers'], out['steps']) == (4, 20)
