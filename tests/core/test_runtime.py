"""CPU devices with threads enough for their collectives: `runtime.cpu_devices` and JAX's ways."""

import os
import subprocess
import sys

import jax
import pytest

from jaxdist import runtime

from conftest import REPO

# Steps with two collectives that do not depend on each other, dispatched without waiting: with
# XLA's default pools (one thread per device on a machine with fewer cores than devices) this
# hung in every try on a 2-core machine (40 s, then an abort).
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


# A user's script that asks for 8 CPU devices the JAX way (XLA_FLAGS before the start, or
# jax_num_cpu_devices after `import jaxdist`), then steps 16 workers, two a device, with two
# collectives that do not depend on each other. Without PJRT_NPROC from jaxdist it aborted
# after 40-60 s ("Termination timeout for all reduce ... Expected 8 threads") on 2 cores.
JAX_WAY = """
import os
import sys
import numpy as np
import jax
from jax import lax
import jaxdist as jd
if sys.argv[1] == 'jax_config':
  jax.config.update('jax_num_cpu_devices', 8)
workers = jd.runtime.layout(16)
def step(x, y):
  gathered = lax.all_gather(x, jd.runtime.DATA).sum(0)
  return x + 1e-3 * gathered, 0.5 * y + 1e-3 * lax.psum(y, workers.axis_name)
step = jax.jit(workers.map(step, in_axes=[0, 0]))
x = y = jax.device_put(np.ones((16, 1000), np.float32), workers.sharding)
for _ in range(500):
  x, y = step(x, y)
jax.block_until_ready((x, y))
print(workers.devices, workers.per_device, float(np.asarray(y).max()), os.environ['PJRT_NPROC'])
"""


@pytest.mark.parametrize('way', ['xla_flags', 'jax_config'])
def test_cpu_devices_asked_the_jax_way_do_not_hang(way):
  from conftest import xla_flags_for_tests

  env = {k: v for k, v in os.environ.items() if k != 'PJRT_NPROC'}
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  env['XLA_FLAGS'] = xla_flags_for_tests()
  if way == 'xla_flags':
    env['XLA_FLAGS'] += ' --xla_force_host_platform_device_count=8'
  done = subprocess.run(
    [sys.executable, '-c', JAX_WAY, way], env=env, capture_output=True, text=True, timeout=180
  )
  assert done.returncode == 0, done.stderr[-2000:]
  # y <- y/2 + 16e-3 y: 500 steps from 1 shrink it below float32's range; and the threads
  # were given (on a machine with many cores the default would not hang, but still differ)
  assert done.stdout.split() == ['8', '2', '0.0', str(runtime.cpu_threads(8))]


def test_layout_refuses_cpu_devices_that_started_on_default_threads(monkeypatch):
  # JAX started before jaxdist could give its CPU client threads, on a 2-core machine
  assert len(jax.devices()) == 8  # started (conftest: cpu_devices(8))
  monkeypatch.delenv('PJRT_NPROC')
  monkeypatch.setattr(runtime, '_cores', lambda: 2)
  with pytest.raises(RuntimeError) as e:
    runtime.layout(16)
  assert str(e.value).count('\n') == 0
  assert "8 CPU devices run on XLA's default of 8 threads" in str(e.value)
  assert 'jd.runtime.cpu_devices(8) before any jax op' in str(e.value)
  assert 'PJRT_NPROC=32' in str(e.value)
  monkeypatch.setattr(runtime, '_cores', lambda: 16)  # two a device: no refusal
  assert runtime.layout(16).devices == 8


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
