r"""Does an exchange dispatched on its own run beside the next steps' compute, across processes?

The question under executed overlap (issue 46), asked of the runtime alone: two
hosts (network namespaces, `experiments/netns.py`, each link at `--rate` Mbit/s),
one process each with `--devices` CPU devices, a program that only all-reduces
`--floats` floats (the exchange) and a program that only computes (`--steps`
chained steps of matrix products). Timed, medians of `--repeats`:

- compute: the steps alone; exchange: the all-reduce alone;
- serial: the exchange, waited for, then the steps;
- same thread: the exchange dispatched (not waited for), then the steps, from
  one Python thread;
- own thread: the exchange dispatched and waited for on a second Python thread
  while the first dispatches the steps;
- one program: the steps (a loop) and the exchange, independent of each
  other, in one program, so that only the runtime's scheduler of that
  program (on the CPU, XLA's thunk executor) can run them at once: a
  bucket's all-reduce beside the rest of backward needs that.

hidden = 1 - (both - compute) / exchange, the fraction of the exchange that
did not add to the steps' time (1 where the steps take longer than the
exchange and it ran entirely beside them). Also the process's CPU time over
the exchange alone (all its threads): near its wall time, the exchange
keeps a core busy while it waits for the link. Needs root (`ip netns`, `tc`).

  python experiments/overlap_probe.py --rate=100 --steps=40 --devices=1
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

from absl import app, flags

flags.DEFINE_string('rate', '100', "Each link's rate in Mbit/s, or 'unlimited'.")
flags.DEFINE_integer('floats', 1_000_000, 'Floats the exchange all-reduces (per process).')
flags.DEFINE_integer('steps', 40, 'Compute steps dispatched beside one exchange.')
flags.DEFINE_integer('devices', 1, 'CPU devices per process.')
flags.DEFINE_integer('repeats', 5, 'Timings of each case; medians are printed.')
flags.DEFINE_string('worker', '', 'Internal: "coordinator,process_id" of a worker process.')
FLAGS = flags.FLAGS


def worker(coordinator: str, pid: int) -> None:
  """One host's process: builds the two programs, times the five cases, prints on process 0."""
  import jax

  jax.config.update('jax_num_cpu_devices', FLAGS.devices)
  jax.distributed.initialize(coordinator, 2, pid)
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()), ('w',))
  place = lambda a: jax.make_array_from_process_local_data(NamedSharding(mesh, P('w')), a)
  d = FLAGS.devices
  x = place(np.ones((d, FLAGS.floats // d), np.float32))
  m0 = place(np.random.default_rng(pid).standard_normal((d, 256, 256)).astype(np.float32) * 0.06)
  per_worker = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P('w'), out_specs=P('w')))
  exchange = per_worker(lambda a: jax.lax.psum(a, 'w'))

  def body(m):
    for _ in range(40):
      m = jnp.tanh(m @ m)
    return m

  step = per_worker(body)
  steps_in_loop = lambda m: jax.lax.fori_loop(0, FLAGS.steps, lambda _, m: body(m), m)
  one_program = per_worker(lambda m, a: (steps_in_loop(m), jax.lax.psum(a, 'w')))

  def steps():
    m = m0
    for _ in range(FLAGS.steps):
      m = step(m)
    return m

  def own_thread():
    t = threading.Thread(target=lambda: jax.block_until_ready(exchange(x)))
    t.start()
    m = jax.block_until_ready(steps())
    t.join()
    return m

  cases = {
    'compute': steps,
    'exchange': lambda: exchange(x),
    'serial': lambda: (jax.block_until_ready(exchange(x)), steps()),
    'same thread': lambda: (exchange(x), steps()),
    'own thread': own_thread,
    'one program': lambda: one_program(m0, x),
  }
  for f in cases.values():  # compile and warm
    jax.block_until_ready(f())
  times = {k: [] for k in cases}
  cpu = []  # the process's CPU seconds over the exchange alone
  for _ in range(FLAGS.repeats):
    for k, f in cases.items():
      t0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(f())
      times[k].append(time.perf_counter() - t0)
      if k == 'exchange':
        cpu.append(time.process_time() - c0)
  if pid == 0:
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    hidden = {
      k: 1 - (ms[k] - ms['compute']) / ms['exchange']
      for k in ('same thread', 'own thread', 'one program')
    }
    print(
      f'rate {FLAGS.rate} Mbit/s, {d} device(s) a process, {FLAGS.floats:,} floats, '
      f'{FLAGS.steps} steps: ' + ', '.join(f'{k} {v:.0f} ms' for k, v in ms.items()),
      flush=True,
    )
    print('hidden: ' + ', '.join(f'{k} {v:.2f}' for k, v in hidden.items()), flush=True)
    print(f'CPU over the exchange alone: {1e3 * statistics.median(cpu):.0f} ms', flush=True)
  jax.distributed.shutdown()


def main(argv):
  del argv
  if FLAGS.worker:
    coordinator, pid = FLAGS.worker.split(',')
    return worker(coordinator, int(pid))
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import netns

  try:
    rate = None if FLAGS.rate == 'unlimited' else float(FLAGS.rate)
  except ValueError:
    raise app.UsageError(f"--rate={FLAGS.rate}: a rate in Mbit/s, or 'unlimited'") from None
  if FLAGS.devices < 1 or FLAGS.floats < FLAGS.devices:
    raise app.UsageError('--devices must be >= 1 and --floats at least --devices')
  args = [f'--{k}={getattr(FLAGS, k)}' for k in ('rate', 'floats', 'steps', 'devices', 'repeats')]
  with netns.Hosts(2, rate) as hosts:
    coordinator = f'{hosts.addresses[0]}:23456'
    procs = [
      hosts.popen(i, [sys.executable, os.path.abspath(__file__), f'--worker={coordinator},{i}',
                      *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)
    ]  # fmt: skip
    for p in procs:
      out, _ = p.communicate(timeout=600)
      if p.returncode:
        raise SystemExit(f'a worker failed (exit {p.returncode}):\n{out[-3000:]}')
      keep = ('rate', 'hidden', 'CPU')
      print('\n'.join(line for line in out.splitlines() if line.startswith(keep)))


if __name__ == '__main__':
  app.run(main)
