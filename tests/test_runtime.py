"""`runtime.cpu_devices`: CPU devices with threads enough for their collectives."""

import os
import subprocess
import sys

import pytest

from jaxdist import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Steps with two collectives that do not depend on each other, dispatched without waiting: with
# XLA's default pools (one thread per device on a machine with fewer cores than devices) this
# hung in every try on the 2-core machine of issue 14 (40 s, then an abort).
STEPS = """
import os
import numpy as np
from jaxdist import runtime
runtime.cpu_devices(8)
import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ('w',))
def step(x, y):
  return x + 1e-3 * lax.all_gather(x, 'w').sum(0), 0.5 * y + 1e-3 * lax.psum(y, 'w')
step = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P('w'), out_specs=P('w'), check_vma=False))
x = y = jax.device_put(np.ones(8 * 1000, np.float32), NamedSharding(mesh, P('w')))
for _ in range(500):
  x, y = step(x, y)
jax.block_until_ready((x, y))
print(os.environ['PJRT_NPROC'], float(np.asarray(y).max()))
"""


def test_independent_collectives_in_flight_do_not_hang():
  env = {k: v for k, v in os.environ.items() if k != 'PJRT_NPROC'}
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  done = subprocess.run(
    [sys.executable, '-c', STEPS], env=env, capture_output=True, text=True, timeout=180
  )
  assert done.returncode == 0, done.stderr[-2000:]
  threads, y = done.stdout.split()
  assert int(threads) >= runtime.CPU_THREADS_PER_DEVICE * 8
  # y <- y/2 + 8e-3 y (all workers equal): 500 steps from 1 shrink it below float32's range
  assert float(y) == 0.0


def test_cpu_devices_keeps_a_thread_count_the_user_set(monkeypatch):
  monkeypatch.setenv('PJRT_NPROC', '3')
  calls = []
  monkeypatch.setattr(runtime.jax.config, 'update', lambda *a: calls.append(a))
  runtime.cpu_devices(4)
  assert os.environ['PJRT_NPROC'] == '3'
  assert calls == [('jax_num_cpu_devices', 4)]


def test_cpu_devices_refuses_no_devices():
  with pytest.raises(ValueError, match='cpu_devices must be >= 1, got 0'):
    runtime.cpu_devices(0)
