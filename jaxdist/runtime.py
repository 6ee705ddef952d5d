"""Where workers live: a mesh of real devices, and simulated workers on each.

A worker is one data-parallel replica. `Workers(count=64)` on 8 devices puts 8
simulated workers on each device: the step runs under `jax.shard_map` over the
mesh axis `data` and, inside each device, under `jax.vmap` with axis name
`sim`. Transforms address all workers as `axis_name=('data', 'sim')` and cannot
tell the two kinds apart. Per-worker arrays carry a leading axis of size
`count`, sharded over `data`.

`shard_map` runs with `check_vma=False`: jax 0.10's varying-axes checker fails
(an internal AssertionError) on collectives over a vmap axis inside shard_map.
Per-worker state enters the map sharded, never replicated, so the trap that
checker guards against (the gradient of a replicated input arriving already
summed) cannot arise; the single-device equivalence tests keep it honest.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA = 'data'
SIM = 'sim'
AXES = (DATA, SIM)


@dataclasses.dataclass(frozen=True)
class Workers:
  """`count` data-parallel workers: `mesh.size` devices × `per_device` simulated.

  Attributes:
    mesh: 1-D mesh with axis `data` over the devices that hold workers.
    per_device: simulated workers on each device (vmap axis `sim`).
  """

  mesh: Mesh
  per_device: int

  @property
  def devices(self) -> int:
    return self.mesh.size

  @property
  def count(self) -> int:
    return self.devices * self.per_device

  @property
  def axis_name(self) -> tuple[str, str]:
    """The axis names a transform must reduce over to reach every worker."""
    return AXES

  @property
  def sharding(self) -> NamedSharding:
    """Sharding of a per-worker array (leading axis of size `count`)."""
    return NamedSharding(self.mesh, P(DATA))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  def local_workers(self) -> range:
    """Indices of the workers whose data this process must provide.

    Returns:
      A contiguous range of worker indices (all of them with one process).

    Raises:
      ValueError: if this process's devices are not contiguous in the mesh.
    """
    mine = [
      i for i, d in enumerate(self.mesh.devices.flat) if d.process_index == jax.process_index()
    ]
    lo, hi = min(mine), max(mine) + 1
    if hi - lo != len(mine):
      raise ValueError('this process holds non-contiguous devices of the mesh')
    return range(lo * self.per_device, hi * self.per_device)

  def map(
    self,
    fn: Callable[..., Any],
    in_axes: Sequence[int | None],
  ) -> Callable[..., Any]:
    """Runs `fn` once per worker; outputs gain the leading worker axis.

    Args:
      fn: the per-worker function; may call collectives over `axis_name`.
      in_axes: per positional argument, 0 for a per-worker pytree (leading axis
        `count`) or None for a value every worker sees whole (replicated).

    Returns:
      A function of the stacked arguments; jit it.
    """
    in_axes = tuple(in_axes)
    vmapped = jax.vmap(fn, in_axes=in_axes, axis_name=SIM)
    in_specs = tuple(P(DATA) if a == 0 else P() for a in in_axes)
    return jax.shard_map(
      vmapped, mesh=self.mesh, in_specs=in_specs, out_specs=P(DATA), check_vma=False
    )


def layout(
  count: int, *, devices: int | None = None, device_list: Sequence[jax.Device] | None = None
) -> Workers:
  """Places `count` workers on devices.

  Args:
    count: number of data-parallel workers.
    devices: how many devices to spread them over; by default the largest
      divisor of `count` not above the number of devices available. With more
      than one process, every device of every process is used.
    device_list: the devices to use (default `jax.devices()`).

  Returns:
    The `Workers` layout.

  Raises:
    ValueError: a count the devices cannot hold.
    RuntimeError: several CPU devices on XLA's default threads, whose
      collectives can deadlock (`check_cpu_threads`).
  """
  if count < 1:
    raise ValueError(f'workers must be >= 1, got {count}')
  give_cpu_threads()  # before jax.devices() starts the CPU client
  available = list(device_list if device_list is not None else jax.devices())
  if devices is None or devices == 0:
    if jax.process_count() > 1:
      devices = len(available)
    else:
      devices = max(d for d in range(1, min(count, len(available)) + 1) if count % d == 0)
  if devices < 1 or devices > len(available):
    raise ValueError(f'devices must be in [1, {len(available)}] (devices available), got {devices}')
  if count % devices:
    raise ValueError(
      f'workers ({count}) must be a multiple of the devices they run on ({devices}); '
      f'choose workers = k * {devices}'
    )
  if jax.process_count() > 1 and devices != len(available):
    raise ValueError(
      f'with {jax.process_count()} processes every device must hold workers: '
      f'devices must be {len(available)}, got {devices}'
    )
  check_cpu_threads(available[:devices])
  mesh = Mesh(np.asarray(available[:devices]), (DATA,), axis_types=(AxisType.Auto,))
  return Workers(mesh=mesh, per_device=count // devices)


CPU_THREADS_PER_DEVICE = 4  # what jaxdist gives XLA's CPU runtime, per device
_FORCE_FLAG = re.compile(r'--xla_force_host_platform_device_count=(\d+)')


def cpu_devices(count: int) -> None:
  """Makes JAX create `count` CPU devices, with threads enough for their collectives.

  Call before JAX starts (before any jax op). Sets `jax_num_cpu_devices` and,
  unless the environment already sets it, `PJRT_NPROC` (the thread count of
  XLA's CPU client) to `cpu_threads(count)`.

  XLA sizes its CPU thread pools max(cores, devices): on a machine with fewer
  cores than devices, one thread per device, what a single collective needs
  (each device's part blocks a thread until every device arrives). Two
  collectives that do not depend on each other (a payload's all-gather and
  the metrics' all-reduce), or a step begun on some devices while others
  finish the last, can then block every thread while a device has still to
  arrive: the process aborts after 40 s ("Termination timeout for all
  reduce"). On a 2-core machine a loop of such steps dispatched without
  waiting hung in 3 tries of 3 with 8 threads, and in none with 16 or 32
  (`tests/test_runtime.py` keeps the case). The threads cost little: the
  digits CNN's dense step on those 8 devices took 14.6 ms with 32 threads
  against 14.2 ms with 8 (medians of three processes each).

  The standard JAX ways of asking for CPU devices (`jax_num_cpu_devices`,
  `XLA_FLAGS=--xla_force_host_platform_device_count=N`) get the same threads
  when jaxdist sees them before JAX starts (`give_cpu_threads`).

  Args:
    count: how many CPU devices (>= 1).
  """
  if count < 1:
    raise ValueError(f'cpu_devices must be >= 1, got {count}')
  os.environ.setdefault('PJRT_NPROC', str(cpu_threads(count)))
  jax.config.update('jax_num_cpu_devices', count)


def cpu_threads(count: int) -> int:
  """Threads for XLA's CPU client with `count` devices: 4 a device, or the usable cores if more.

  Args:
    count: how many CPU devices.

  Returns:
    The thread count, for `PJRT_NPROC`.
  """
  return max(_cores(), CPU_THREADS_PER_DEVICE * count)


def _cores() -> int:
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def requested_cpu_devices() -> int | None:
  """CPU devices asked of JAX the standard ways, or None.

  `jax_num_cpu_devices` if set, else the last
  `--xla_force_host_platform_device_count` in `XLA_FLAGS` (JAX's order).

  Returns:
    The device count asked for, or None where neither asks.
  """
  if jax.config.jax_num_cpu_devices >= 0:
    return jax.config.jax_num_cpu_devices
  counts = _FORCE_FLAG.findall(os.environ.get('XLA_FLAGS', ''))
  return int(counts[-1]) if counts else None


def _backends_started() -> bool:
  """Whether JAX has started its clients (True where this jax cannot say)."""
  try:  # no public API says whether the clients exist yet
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    return True


def give_cpu_threads() -> None:
  """Sets `PJRT_NPROC` for the CPU devices requested, before JAX starts its CPU client.

  Does nothing once JAX has started, where no devices are requested, or where
  the environment sets `PJRT_NPROC` already. Runs when jaxdist is imported
  and again in `layout`, so `XLA_FLAGS` set before the import and
  `jax_num_cpu_devices` set after it both get threads enough (`cpu_devices`).
  """
  count = requested_cpu_devices()
  if count is not None and not _backends_started():
    os.environ.setdefault('PJRT_NPROC', str(cpu_threads(count)))


def check_cpu_threads(devices: Sequence[jax.Device]) -> None:
  """Raises RuntimeError if `devices` are CPU devices whose collectives can deadlock.

  That is several CPU devices in a CPU client started with XLA's default
  threads (no `PJRT_NPROC`) on fewer than two cores a device: the case
  `cpu_devices` exists for, met when JAX started before jaxdist could give
  it threads.

  Args:
    devices: the devices that will hold workers (this process's CPU ones count).
  """
  count = sum(1 for d in devices if d.platform == 'cpu' and d.process_index == jax.process_index())
  if count < 2 or 'PJRT_NPROC' in os.environ or _cores() >= 2 * count:
    return
  raise RuntimeError(
    f"{count} CPU devices run on XLA's default of {max(_cores(), count)} threads, where "
    f'collectives that overlap deadlock: ask for them with jd.runtime.cpu_devices({count}) '
    f'before any jax op, or set PJRT_NPROC={cpu_threads(count)} before JAX starts'
  )


def initialize_distributed(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  heartbeat_timeout_s: int = 30,
) -> None:
  """Starts JAX's multi-controller runtime (one call per process, before any jax op).

  With no arguments, JAX detects the cluster (SLURM, Open MPI, TPU pods, GKE).
  For local runs pass a loopback `coordinator_address` such as
  `127.0.0.1:12345`; the coordinator then binds to loopback only instead of
  every interface.

  A process that dies (a lost machine, SIGKILL) stops sending heartbeats; after
  `heartbeat_timeout_s` (JAX's default is 100 s) the coordination service
  ends every survivor with a non-zero exit instead of leaving it waiting in a
  collective. The last checkpoint is the state to resume from: rerun the same
  command on every process.

  Args:
    coordinator_address: 'host:port' of process 0's coordinator (None: JAX
      detects the cluster).
    num_processes: how many processes (None: detected).
    process_id: this process's index, 0 to num_processes − 1 (None: detected).
    heartbeat_timeout_s: seconds without a process's heartbeat before the
      survivors are ended (>= 1).
  """
  if heartbeat_timeout_s < 1:
    raise ValueError(f'heartbeat_timeout_s must be >= 1, got {heartbeat_timeout_s}')
  bind = None
  if coordinator_address is not None:
    host, _, port = coordinator_address.rpartition(':')
    try:
      if ipaddress.ip_address(host.strip('[]')).is_loopback:
        bind = coordinator_address
    except ValueError:
      if host == 'localhost':
        bind = f'127.0.0.1:{port}'
  logging.info(
    'jax.distributed.initialize(%s, %s, %s)', coordinator_address, num_processes, process_id
  )
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    coordinator_bind_address=bind,
    heartbeat_timeout_seconds=heartbeat_timeout_s,
  )


give_cpu_threads()  # `import jaxdist` before JAX starts: XLA_FLAGS' devices get their threads
