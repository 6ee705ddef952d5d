"""Shared test setup: 8 CPU devices (before JAX starts) and one tfds data dir."""

import os
import sys

import jax

jax.config.update('jax_num_cpu_devices', 8)

import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory) -> str:
  """A tfds data dir shared by all xdist workers (building digits is locked)."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):  # basetemp is per worker; its parent per session
    base = base.parent
  path = base / 'tfds'
  path.mkdir(exist_ok=True)
  return str(path)


@pytest.fixture(scope='session')
def digits(data_dir):
  from jaxdist import data

  return data.load('digits', data_dir=data_dir)


def binary_env(data_dir: str) -> dict[str, str]:
  """Environment for running the binary in a subprocess."""
  env = dict(os.environ)
  env['TFDS_DATA_DIR'] = data_dir
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  env.pop('XLA_FLAGS', None)
  return env


def binary_cmd(*args: str, script: str = 'train.py') -> list[str]:
  return [sys.executable, os.path.join(REPO, 'experiments', script), *args]
