"""Shared test setup: 8 CPU devices (before JAX starts), one tfds data dir, one XLA cache."""

import importlib.util
import os
import shutil
import socket
import sys
import tempfile

import jax

from jaxdist import runtime

runtime.cpu_devices(8)  # and threads enough for their collectives

import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tests run XLA's CPU backend at LLVM -O0: a program compiles about 4x faster and runs
# about 2x slower, and the tests' runs are a few steps each, so compiling is most of their
# time (a 12-step digits run: 28 s of compiling at the default level, 6 s at -O0). Its
# fusions are emitted by the older loop emitters, not the fusion emitters (MLIR), which
# compile slower: a 4-step GPT run 9.3 s against 8.1 s, a digits run 3.0 s against 2.4 s.
# And it emits each program's code in one piece, not split for parallel codegen threads,
# which on 2 cores busy with 2 test workers only cost more: a GPT run's compiles took 9 %
# less CPU time and 6 % less wall time. Every program of a test session compiles with the
# same flags, so comparisons within the suite are unaffected. Binaries and notebook kernels
# the tests start get the same flags (`xla_flags_for_tests`). Set JAXDIST_TEST_XLA_FLAGS to
# override ('' for XLA's defaults).
TEST_XLA_FLAGS = os.environ.get(
  'JAXDIST_TEST_XLA_FLAGS',
  '--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false '
  '--xla_cpu_parallel_codegen_split_count=1',
)


def xla_flags_for_tests(inherited: str = '') -> str:
  """XLA_FLAGS with the tests' flags added (those not already in `inherited`)."""
  missing = [f for f in TEST_XLA_FLAGS.split() if f not in inherited.split()]
  return ' '.join([*inherited.split(), *missing])


os.environ['XLA_FLAGS'] = xla_flags_for_tests(os.environ.get('XLA_FLAGS', ''))  # before JAX starts

# JAX's persistent compilation cache, one per session: the xdist workers, the binaries they
# start and the notebooks' kernels (all inherit the environment) compile each program once.
# A hit returns the executable XLA built for the same program, flags and devices, so nothing
# a test computes changes; only the compile time is saved. Set JAX_COMPILATION_CACHE_DIR to
# choose the directory (kept), or to '' to compile everything afresh.
MIN_COMPILE_S = 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'
_made_cache = []


def pytest_configure(config):
  if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:  # the controller (xdist workers inherit it)
    _made_cache.append(tempfile.mkdtemp(prefix='jaxdist-xla-cache-'))  # removed at the end
    os.environ['JAX_COMPILATION_CACHE_DIR'] = _made_cache[0]
    os.environ[MIN_COMPILE_S] = '0'  # the small models' steps compile in less than 1 s
  if os.environ['JAX_COMPILATION_CACHE_DIR']:  # JAX read the environment at import: tell it
    jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
    if MIN_COMPILE_S in os.environ:
      jax.config.update(MIN_COMPILE_S.lower(), float(os.environ[MIN_COMPILE_S]))


def pytest_unconfigure(config):
  for path in _made_cache:
    shutil.rmtree(path, ignore_errors=True)


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
  env['XLA_FLAGS'] = xla_flags_for_tests()  # not the parent's (device counts are the binary's)
  return env


def binary_cmd(*args: str, script: str = 'train.py') -> list[str]:
  return [sys.executable, os.path.join(REPO, 'experiments', script), *args]


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now (for jax.distributed)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


# What a test run needs only where it tests them (`network.compute_s` 0, `noise_every` > 0):
# the one-worker measurement of the modelled clock's compute term compiles and times a
# program of its own, and Scavenger's noise step is another program to compile. A compute
# term given stands in for the measurement (the clock, its records and tables are the same).
QUICK = {'network.compute_s': 0.01, 'noise_every': 0}
QUICK_FLAGS = [f'--config.{key}={value}' for key, value in QUICK.items()]  # for the binaries


def run_digits(tmp_path, name, data_dir, monkeypatch, args='workers=3', **overrides):
  """Trains `configs/digits.py:runlocal,<args>` in tmp_path/name: (summary, records, params).

  Defaults: batch 96, 12 steps, no progress bar, and `QUICK` (a compute term
  given, no noise measured); `overrides` are config keys.
  `params` are the last checkpoint's (every worker's, leading worker axis).
  """
  from jaxdist.train import checkpoint, factory, metrics, trainer

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = factory.load_config(
    f'{REPO}/configs/digits.py:runlocal,{args}',
    **{'progress': False, 'batch_size': 96, 'steps': 12, **QUICK, **overrides},
  )
  summary = trainer.train_and_evaluate(config, str(tmp_path / name))
  records = metrics.read_jsonl(str(tmp_path / name / 'metrics.jsonl'))
  params = checkpoint.read(str(tmp_path / name / 'checkpoints'))[0]['params']
  return summary, records, params


def load_experiment(name: str):
  """experiments/<name>.py imported as a module (its functions, without running main).

  The absl flags it defines are removed again, so that scripts defining the same flag
  names (`--results`, `--steps`) can be loaded in one test session.
  """
  from absl import flags

  path = os.path.join(REPO, 'experiments', f'{name}.py')
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  before = set(flags.FLAGS)
  try:
    spec.loader.exec_module(module)
  finally:
    for flag in set(flags.FLAGS) - before:
      delattr(flags.FLAGS, flag)
  return module


class Driven:
  """A host controller (`jd.control.host.Controller`) driven step by step as the trainer
  drives it: plan step t, then observe its record with the given fields and fetched metrics."""

  def __init__(self, controller):
    self.controller, self.state, self.plans = controller, controller.init(), {}

  def step(self, t, fields, fetched):
    """Plans step t (0-based) and observes it; the fields the controller adds."""
    from jaxdist import control

    plan = self.plans[t + 1] = self.controller.plan(self.state, t)
    record = control.Record(t + 1, plan, {'step': t + 1, **fields}, fetched)
    self.state, out = self.controller.observe(self.state, record)
    return out

  @property
  def index(self):
    return self.state.index

  def candidate_of(self, step):
    return int(self.plans[step].tx_args['candidate'][0])

  def saved(self):
    """The state as a checkpoint keeps it (through JSON) and reads it back."""
    import json

    from jaxdist import control

    tree = json.loads(json.dumps(control.host.to_tree(self.state), allow_nan=False))
    return control.host.from_tree(self.controller.init(), tree)
