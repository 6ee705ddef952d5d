"""Each notebook stands alone on Colab: its badge opens it from the repository, and its
install cell, run in a fresh venv, leaves `import jaxdist` working in the same process.

The install cell (one, the same in every notebook) is run as Colab runs it, in one
Python process with no jaxdist, with the wheel `make wheel` builds beside it (built here
from a copy of this checkout); then the config the notebooks name (`digits.py`) loads
from the installed package. Without a wheel or `JAXDIST_SOURCE` it stops with a message
saying how to get one. The venv sees the test environment's packages (jaxdist's
dependencies, pip, setuptools; not jaxdist itself) through a folder of links, so pip
builds and installs jaxdist alone: no dependencies, no index, no build isolation,
nothing downloaded.
"""

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import jupytext
import pytest

from conftest import REPO

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, 'notebooks', '*.ipynb')))
BADGE = 'https://colab.research.google.com/github/jaxdist/jaxdist/blob/main/notebooks/{}'
TIMEOUT = 300


def code_cells(path):
  return [c.source for c in jupytext.read(path).cells if c.cell_type == 'code']


def install_cell(path):
  (cell,) = [c for c in code_cells(path) if 'JAXDIST_SOURCE' in c]
  return cell


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_stands_alone(path):
  notebook = jupytext.read(path)
  intro = notebook.cells[0].source
  assert f'<a href="{BADGE.format(os.path.basename(path))}">' in intro
  assert code_cells(path)[0] == install_cell(path), 'the install cell comes first'
  assert install_cell(path) == install_cell(NOTEBOOKS[0]), 'one install cell for every notebook'
  text = '\n'.join(c.source for c in notebook.cells)
  assert '../' not in text and 'os.chdir' not in text, 'nothing from the repository around it'
  code = [line for line in install_cell(path).splitlines() if not line.lstrip().startswith('#')]
  assert not any('git+' in line for line in code), 'no install from a repository not yet public'
  assert "glob.glob('jaxdist-*.whl')" in install_cell(path) and 'make wheel' in install_cell(path)
  assert 'os.system' not in text and ' -e ' not in text


def links_to_dependencies(folder):
  """A folder of links to the test environment's packages, less jaxdist (and .pth files)."""
  os.makedirs(folder)
  paths = sysconfig.get_paths()
  roots = [os.path.dirname(os.path.dirname(importlib.util.find_spec(m).origin))
           for m in ('setuptools', 'pip')]  # fmt: skip
  for root in dict.fromkeys([*roots, paths['purelib'], paths['platlib']]):
    for name in os.listdir(root):
      target = os.path.join(folder, name)
      if name.startswith(('jaxdist', '__editable__')) or name.endswith('.pth'):
        continue
      if not os.path.lexists(target):  # the first root's wins
        os.symlink(os.path.join(root, name), target)
  return folder


def fresh_venv(tmp_path):
  """(python, site-packages) of a new venv that sees the dependencies but not jaxdist."""
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
  python = str(venv / 'bin' / 'python')
  site_packages = subprocess.run(
    [python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
    check=True, capture_output=True, text=True, env=clean_env(),
  ).stdout.strip()  # fmt: skip
  deps = links_to_dependencies(str(tmp_path / 'deps'))
  with open(os.path.join(site_packages, '_test_dependencies.pth'), 'w') as f:
    f.write(deps + '\n')
  return python, site_packages


def source_copy(tmp_path):
  """What a clone of the repository gives pip to build: the package, configs, metadata."""
  src = tmp_path / 'src'
  src.mkdir()
  skip = shutil.ignore_patterns('__pycache__', '*.egg-info', 'build')
  for name in ('jaxdist', 'configs'):
    shutil.copytree(os.path.join(REPO, name), src / name, ignore=skip)
  for name in ('pyproject.toml', 'README.md', 'LICENSE', 'CHANGELOG.md'):
    if os.path.exists(os.path.join(REPO, name)):
      shutil.copy(os.path.join(REPO, name), src / name)
  return src


def clean_env(**extra):
  env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'PIP_', 'VIRTUAL'))}
  return {**env, **extra}


def run_in_venv(tmp_path, script, **env):
  """Runs `script` in a fresh venv's Python in `tmp_path`, pip offline, no dependencies."""
  python, site_packages = fresh_venv(tmp_path)
  env = clean_env(
    PIP_NO_DEPS='1',
    PIP_NO_INDEX='1',
    PIP_NO_BUILD_ISOLATION='0',  # pip's inverted spelling: build with the installed setuptools
    PIP_DISABLE_PIP_VERSION_CHECK='1',
    PIP_CACHE_DIR=str(tmp_path / 'pip-cache'),
    **env,
  )
  proc = subprocess.run(
    [python, '-c', script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=TIMEOUT
  )
  return proc, site_packages


def build_wheel(tmp_path) -> str:
  """jaxdist's wheel, built from a copy of this checkout (what `make wheel` builds)."""
  out = tmp_path / 'dist'
  proc = subprocess.run(
    [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--no-index',
     '--wheel-dir', str(out), str(source_copy(tmp_path))],
    capture_output=True, text=True, timeout=TIMEOUT, env=clean_env(),
  )  # fmt: skip
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  (wheel,) = out.glob('jaxdist-*.whl')
  return str(wheel)


CHECK = """
import json
print('RESULT ' + json.dumps({'missing_before': MISSING, 'file': jd.__file__,
                              'compressed_allreduce': callable(jd.sync.compressed_allreduce),
                              'steps': jd.train.load_config('digits.py:runlocal').steps}))
"""


def test_install_cell_installs_the_wheel_beside_it_into_the_running_process(tmp_path):
  shutil.copy(build_wheel(tmp_path), tmp_path)  # uploaded beside the notebook
  before = 'import importlib.util\nMISSING = importlib.util.find_spec("jaxdist") is None\n'
  proc, site_packages = run_in_venv(tmp_path, before + install_cell(NOTEBOOKS[0]) + CHECK)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  (line,) = re.findall(r'^RESULT (.*)$', proc.stdout, re.M)
  result = json.loads(line)
  assert result['missing_before'], 'jaxdist was importable before the cell: not a fresh venv'
  # installed, not editable: the package's files are in the venv's site-packages
  assert result['file'] == os.path.join(site_packages, 'jaxdist', '__init__.py')
  assert result['compressed_allreduce']
  assert result['steps'] == 20, 'the config the notebooks name comes with the installed package'


def test_install_cell_without_a_wheel_says_how_to_get_one(tmp_path):
  proc, _ = run_in_venv(tmp_path, install_cell(NOTEBOOKS[0]))
  assert proc.returncode != 0
  assert 'RuntimeError: jaxdist is not installed. Build its wheel in a clone (`make wheel`)' in (
    proc.stderr
  ), proc.stderr[-3000:]


def test_an_editable_install_in_the_running_process_is_what_fails(tmp_path):
  """The harness can fail: the cell Colab had (`pip install -e`, then import) does here."""
  old_cell = (
    'import os, subprocess, sys\n'
    "source = os.environ['JAXDIST_SOURCE'].removeprefix('file://')\n"
    "subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '-e', source], check=True)\n"
    'import jaxdist\n'
  )
  proc, _ = run_in_venv(tmp_path, old_cell, JAXDIST_SOURCE=source_copy(tmp_path).as_uri())
  assert proc.returncode != 0
  assert "ModuleNotFoundError: No module named 'jaxdist'" in proc.stderr, proc.stderr[-3000:]
