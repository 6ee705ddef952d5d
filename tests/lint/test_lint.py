"""ruff, as configured in pyproject.toml, finds nothing to change."""

import subprocess
import sys

from conftest import REPO


def ruff(*args):
  return subprocess.run(
    [sys.executable, '-m', 'ruff', *args], cwd=REPO, capture_output=True, text=True
  )


def test_ruff_check():
  proc = ruff('check', '.')
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format():
  proc = ruff('format', '--check', '.')
  assert proc.returncode == 0, f'run `make format`:\n{proc.stdout}{proc.stderr}'
