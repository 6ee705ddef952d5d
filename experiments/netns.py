"""Hosts on one machine: Linux network namespaces on a bridge, each link rate-limited.

`Hosts(k, rate_mbit)` makes a switch namespace holding a bridge and k host
namespaces, each joined to the bridge by a veth pair and given 10.R.S.(i+1)/24
(R.S from the process id, so two benches do not collide); with a rate, a
token bucket (`tbf`) limits each link in both directions (the host's egress
and the switch port's). Hosts may differ: `rate_mbit` may give each link its
own rate, and `cpu` each host its own CPU time, in cores (a cgroup v1 `cpu`
group per host, its `cfs_quota_us` that share of `cfs_period_us`; what a
host's processes start inside it stays there). Every address is inside the namespaces it made:
nothing leaves the machine. jax's gloo collectives bind the address the host
name resolves to, so each namespace gets its own /etc/netns/<name>/hosts
mapping the host name to its address (`ip netns exec` mounts it on
/etc/hosts).

As a context manager it tears everything down on exit, on error and on
SIGINT / SIGTERM: the processes it started (`popen`), then the namespaces
(their veths go with them), their /etc/netns folders and CPU groups. `leftovers(prefix)`
lists what is left of a prefix, for the tests. Needs root and `ip`/`tc`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

NETNS_ETC = '/etc/netns'
CPU_CGROUP = '/sys/fs/cgroup/cpu'  # cgroup v1's cpu controller
PERIOD_US = 100_000


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
  cmd = ['ip', *(['netns', 'exec', netns, 'ip'] if netns else []), *args]
  return subprocess.run(cmd, capture_output=True, text=True, check=check)


def _tc(netns: str, *args: str) -> None:
  subprocess.run(['ip', 'netns', 'exec', netns, 'tc', *args], capture_output=True, text=True,
                 check=True)  # fmt: skip


def available() -> str:
  """'' where namespaces, veth pairs and tbf can be made here, else why not."""
  if os.geteuid() != 0:
    return 'needs root (ip netns, veth, tc)'
  if not shutil.which('ip') or not shutil.which('tc'):
    return 'needs the ip and tc commands (iproute2)'
  probe = f'jdprobe{os.getpid() % 100000}'
  try:
    _ip('netns', 'add', probe)
  except subprocess.CalledProcessError as e:
    return f'cannot make a network namespace: {e.stderr.strip()}'
  _ip('netns', 'del', probe, check=False)
  return ''


def leftovers(prefix: str) -> list[str]:
  """Namespaces, /etc/netns folders and CPU groups whose names start with `prefix`."""
  names = _ip('netns', 'list', check=False).stdout.split()
  found = [n for n in names if n.startswith(prefix)]
  if os.path.isdir(NETNS_ETC):
    found += [f'{NETNS_ETC}/{n}' for n in os.listdir(NETNS_ETC) if n.startswith(prefix)]
  if os.path.isdir(CPU_CGROUP):
    found += [f'{CPU_CGROUP}/{n}' for n in os.listdir(CPU_CGROUP) if n.startswith(prefix)]
  return found


def _per_host(name: str, value, k: int, ok, allowed: str) -> list:
  """`value` for every one of k hosts: one value, or a sequence of k, each ok or None."""
  values = list(value) if isinstance(value, (list, tuple)) else [value] * k
  if len(values) != k:
    raise ValueError(f'{name} gives {len(values)} hosts of {k}: give one value or {k}')
  for v in values:
    if v is not None and not ok(v):
      raise ValueError(f'{name} must be {allowed} (or None), got {v}')
  return values


class Hosts:
  """k namespaces on a bridge, each link limited to `rate_mbit` (None: unlimited).

  Args:
    k: how many hosts.
    rate_mbit: every link's rate in Mbit/s, or one per host (None: unlimited).
    prefix: the names' prefix (default from the process id).
    cpu: None, or each host's CPU time in cores (e.g. 0.25: a quarter of one
      core; None: no limit), or one share for all.
    period_us: the CPU groups' period (µs, >= 1000): a host runs at most its
      share of each. A short one spreads a small share evenly over a step
      (0.1 core of 100 ms: 10 ms of work, then 90 ms stopped).
  """

  def __init__(self, k: int, rate_mbit, prefix: str | None = None, cpu=None, period_us=PERIOD_US):
    if k < 1:
      raise ValueError(f'hosts must be >= 1, got {k}')
    self.rates = _per_host('rate', rate_mbit, k, lambda r: r > 0, '> 0 Mbit/s')
    self.cpu = _per_host('cpu', cpu, k, lambda c: 0.01 <= c <= os.cpu_count(),
                         f'a share of cores in [0.01, {os.cpu_count()}]')  # fmt: skip
    if not 1000 <= period_us <= 1_000_000:
      raise ValueError(f'period_us must be in [1000, 1000000] µs, got {period_us}')
    self.period_us = int(period_us)
    if any(c is not None for c in self.cpu) and not os.access(CPU_CGROUP, os.W_OK):
      raise ValueError(f'cpu shares need cgroup v1 cpu at {CPU_CGROUP}, writable (root)')
    pid = os.getpid()
    self.k = k
    self.prefix = prefix or f'jd{pid % 100000}'
    self.subnet = f'10.{200 + pid % 50}.{(pid // 50) % 250}'
    self.switch = f'{self.prefix}-sw'
    self.names = [f'{self.prefix}-h{i}' for i in range(k)]
    self.addresses = [f'{self.subnet}.{i + 1}' for i in range(k)]
    self.groups = [
      None if c is None else f'{CPU_CGROUP}/{n}' for c, n in zip(self.cpu, self.names, strict=True)
    ]
    self.procs: list[subprocess.Popen] = []
    self._handlers: dict[int, object] = {}

  # --- setup and teardown ------------------------------------------------------------

  def __enter__(self) -> Hosts:
    for sig in (signal.SIGINT, signal.SIGTERM):
      self._handlers[sig] = signal.signal(sig, self._on_signal)
    try:
      self._build()
    except BaseException:
      self.close()
      raise
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _on_signal(self, signum, frame):
    raise KeyboardInterrupt(f'signal {signum}')

  def _build(self) -> None:
    _ip('netns', 'add', self.switch)
    _ip('link', 'add', 'br0', 'type', 'bridge', netns=self.switch)
    _ip('link', 'set', 'br0', 'up', netns=self.switch)
    _ip('link', 'set', 'lo', 'up', netns=self.switch)
    for i, (name, address) in enumerate(zip(self.names, self.addresses, strict=True)):
      _ip('netns', 'add', name)
      host_end, port = f'{self.prefix}h{i}', f'{self.prefix}p{i}'
      _ip('link', 'add', host_end, 'type', 'veth', 'peer', 'name', port)
      _ip('link', 'set', host_end, 'netns', name)
      _ip('link', 'set', port, 'netns', self.switch)
      _ip('link', 'set', host_end, 'name', 'eth0', netns=name)
      _ip('addr', 'add', f'{address}/24', 'dev', 'eth0', netns=name)
      _ip('link', 'set', 'eth0', 'up', netns=name)
      _ip('link', 'set', 'lo', 'up', netns=name)
      _ip('link', 'set', port, 'master', 'br0', netns=self.switch)
      _ip('link', 'set', port, 'up', netns=self.switch)
      if self.rates[i] is not None:
        self._limit(name, 'eth0', self.rates[i])  # what the host sends
        self._limit(self.switch, port, self.rates[i])  # what it receives
      etc = os.path.join(NETNS_ETC, name)
      os.makedirs(etc, exist_ok=True)
      with open(os.path.join(etc, 'hosts'), 'w') as f:
        f.write(f'127.0.0.1 localhost\n{address} {socket.gethostname()}\n')
    for group, share in zip(self.groups, self.cpu, strict=True):
      if group is not None:
        os.makedirs(group)
        _write(f'{group}/cpu.cfs_period_us', self.period_us)
        _write(f'{group}/cpu.cfs_quota_us', int(share * self.period_us))

  def _limit(self, netns: str, dev: str, rate_mbit: float) -> None:
    """A token bucket of `rate_mbit` on `dev`'s egress: a burst of 1 ms at the rate.

    The bucket fills while the link idles, and a burst passes at once: with
    10 ms, 100 kB crossed a 100 Mbit/s link in 0.3 ms instead of 8, so the
    small exchanges of compressed methods rode free. 1 ms keeps a transfer
    within 10 % of its bytes' time at 100 Mbit/s and 1 Gbit/s (tested).
    """
    rate = rate_mbit * 1e6  # bit/s
    burst = max(int(rate / 8 * 1e-3), 2 * 1514)  # bytes: 1 ms, at least two full frames
    _tc(netns, 'qdisc', 'add', 'dev', dev, 'root', 'tbf', 'rate', f'{rate_mbit}mbit',
        'burst', str(burst), 'latency', '100ms')  # fmt: skip

  def close(self) -> None:
    """Stops the processes, then removes the namespaces, /etc/netns folders and CPU groups."""
    for p in self.procs:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    for p in self.procs:
      with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)
    self.procs = []
    for name in [*self.names, self.switch]:
      _ip('netns', 'del', name, check=False)
      shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
    for group in filter(None, self.groups):
      _remove_group(group)
    for sig, handler in self._handlers.items():
      signal.signal(sig, handler)
    self._handlers = {}

  # --- running in them ---------------------------------------------------------------

  def command(self, i: int, cmd: Sequence[str]) -> list[str]:
    """`cmd` run in host i's namespace (and CPU group, if it has a share)."""
    cmd = ['ip', 'netns', 'exec', self.names[i], *cmd]
    group = self.groups[i]
    if group is not None:  # the shell joins the group, then becomes `cmd` (outside the
      # namespace: `ip netns exec` mounts a sysfs of its own, without the cgroups)
      cmd = ['sh', '-c', f'echo $$ > {group}/cgroup.procs && exec "$@"', 'sh', *cmd]
    return cmd

  def popen(self, i: int, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
    """Starts `cmd` in host i's namespace, in a process group `close` kills."""
    p = subprocess.Popen(self.command(i, cmd), start_new_session=True, **kwargs)
    self.procs.append(p)
    return p

  def launch(
    self, commands: list[list[str] | None], logdir: str, env: dict, timeout_s: float
  ) -> None:
    """Runs commands[i] in host i, each writing `logdir/process<i>.log`; raises if one fails.

    Args:
      commands: one command per host (None: that host runs nothing).
      logdir: where the logs go (made if missing).
      env: the processes' environment.
      timeout_s: the most all of them may take together
        (`subprocess.TimeoutExpired` after it; `close` kills what is left).
    """
    os.makedirs(logdir, exist_ok=True)
    running = [i for i, cmd in enumerate(commands) if cmd is not None]
    logs = {i: open(os.path.join(logdir, f'process{i}.log'), 'w') for i in running}  # noqa: SIM115
    deadline = time.perf_counter() + timeout_s
    try:
      procs = {
        i: self.popen(i, commands[i], env=env, stdout=logs[i], stderr=subprocess.STDOUT)
        for i in running
      }
      for p in procs.values():
        p.wait(timeout=max(1.0, deadline - time.perf_counter()))
    finally:
      for f in logs.values():
        f.close()
    failed = [i for i, p in procs.items() if p.returncode != 0]
    if failed:
      with open(os.path.join(logdir, f'process{failed[0]}.log')) as f:
        tail = f.read()[-3000:]
      raise RuntimeError(f'{logdir}: process {failed[0]} exited non-zero:\n{tail}')

  def fit_link(self, devices: int, folder: str, env: dict, timeout_s: float) -> dict:
    """α and β fitted to all-reduces across the hosts, `devices` workers on each.

    `experiments/calibrate_link.py` in every host (logs in `folder`/calibrate):
    the ring of all the workers, as a run of that layout prices it.

    Returns:
      Process 0's fit (latency s, bandwidth B/s), with 'profile', its
      network spec ('<gbps>gbps@<us>us') for `config.network.profiles`.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    base = [sys.executable, os.path.join(here, 'calibrate_link.py'),
            f'--coordinator_address={self.addresses[0]}:23457', f'--num_processes={self.k}',
            f'--cpu_devices={devices}']  # fmt: skip
    logdir = os.path.join(folder, 'calibrate')
    self.launch([[*base, f'--process_id={i}'] for i in range(self.k)], logdir, env, timeout_s)
    import peer_ddp  # beside this file: the last JSON line of a process's output

    with open(os.path.join(logdir, 'process0.log')) as f:
      fitted = peer_ddp.parse_peer_output(f.read())
    spec = f'{fitted["bandwidth"] * 8 / 1e9:.4g}gbps@{fitted["latency"] * 1e6:.4g}us'
    return fitted | {'profile': spec}


SINGLE_THREAD = '--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'


def run_env(root: str, single_thread: bool) -> dict:
  """This environment for the hosts' runs: the checkout at `root` first on PYTHONPATH, and with
  `single_thread` one XLA thread a process (a host's CPU share is then what it computes with)."""
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get('PYTHONPATH', ''))
  if single_thread:
    env['XLA_FLAGS'] = f'{env.get("XLA_FLAGS", "")} {SINGLE_THREAD}'.strip()
  return env


def flags_of(overrides: dict, prefix: str = 'config') -> list[str]:
  """A variant's nested overrides as `--config.a.b=value` flags, for the runs on the hosts."""
  out = []
  for key, value in overrides.items():
    if isinstance(value, dict):
      out += flags_of(value, f'{prefix}.{key}')
    else:
      out.append(f'--{prefix}.{key}={value}')
  return out


def _write(path: str, value) -> None:
  with open(path, 'w') as f:
    f.write(str(value))


def _remove_group(group: str) -> None:
  """Removes a CPU group, first moving what is left in it (a process not yet reaped) out."""
  if not os.path.isdir(group):
    return
  for _ in range(50):
    with contextlib.suppress(OSError):
      with open(f'{group}/cgroup.procs') as f:
        for pid in f.read().split():
          with contextlib.suppress(OSError):
            _write(f'{CPU_CGROUP}/cgroup.procs', pid)
      os.rmdir(group)
      return
    time.sleep(0.1)
