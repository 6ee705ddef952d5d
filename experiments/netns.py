"""Hosts on one machine: Linux network namespaces on a bridge, each link rate-limited.

`Hosts(k, rate_mbit)` makes a switch namespace holding a bridge and k host
namespaces, each joined to the bridge by a veth pair and given 10.R.S.(i+1)/24
(R.S from the process id, so two benches do not collide); with a rate, a
token bucket (`tbf`) limits each link in both directions (the host's egress
and the switch port's). Every address is inside the namespaces it made:
nothing leaves the machine. jax's gloo collectives bind the address the host
name resolves to, so each namespace gets its own /etc/netns/<name>/hosts
mapping the host name to its address (`ip netns exec` mounts it on
/etc/hosts).

As a context manager it tears everything down on exit, on error and on
SIGINT / SIGTERM: the processes it started (`popen`), then the namespaces
(their veths go with them) and their /etc/netns folders. `leftovers(prefix)`
lists what is left of a prefix, for the tests. Needs root and `ip`/`tc`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence

NETNS_ETC = '/etc/netns'


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
  """Namespaces and /etc/netns folders whose names start with `prefix`."""
  names = _ip('netns', 'list', check=False).stdout.split()
  found = [n for n in names if n.startswith(prefix)]
  if os.path.isdir(NETNS_ETC):
    found += [f'{NETNS_ETC}/{n}' for n in os.listdir(NETNS_ETC) if n.startswith(prefix)]
  return found


class Hosts:
  """k namespaces on a bridge, each link limited to `rate_mbit` (None: unlimited)."""

  def __init__(self, k: int, rate_mbit: float | None, prefix: str | None = None):
    if k < 1:
      raise ValueError(f'hosts must be >= 1, got {k}')
    if rate_mbit is not None and rate_mbit <= 0:
      raise ValueError(f'rate must be > 0 Mbit/s (or None: unlimited), got {rate_mbit}')
    pid = os.getpid()
    self.k, self.rate_mbit = k, rate_mbit
    self.prefix = prefix or f'jd{pid % 100000}'
    self.subnet = f'10.{200 + pid % 50}.{(pid // 50) % 250}'
    self.switch = f'{self.prefix}-sw'
    self.names = [f'{self.prefix}-h{i}' for i in range(k)]
    self.addresses = [f'{self.subnet}.{i + 1}' for i in range(k)]
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
      if self.rate_mbit is not None:
        self._limit(name, 'eth0')  # what the host sends
        self._limit(self.switch, port)  # what it receives
      etc = os.path.join(NETNS_ETC, name)
      os.makedirs(etc, exist_ok=True)
      with open(os.path.join(etc, 'hosts'), 'w') as f:
        f.write(f'127.0.0.1 localhost\n{address} {socket.gethostname()}\n')

  def _limit(self, netns: str, dev: str) -> None:
    """A token bucket of `rate_mbit` on `dev`'s egress: a burst of 1 ms at the rate.

    The bucket fills while the link idles, and a burst passes at once: with
    10 ms, 100 kB crossed a 100 Mbit/s link in 0.3 ms instead of 8, so the
    small exchanges of compressed methods rode free. 1 ms keeps a transfer
    within 10 % of its bytes' time at 100 Mbit/s and 1 Gbit/s (tested).
    """
    rate = self.rate_mbit * 1e6  # bit/s
    burst = max(int(rate / 8 * 1e-3), 2 * 1514)  # bytes: 1 ms, at least two full frames
    _tc(netns, 'qdisc', 'add', 'dev', dev, 'root', 'tbf', 'rate', f'{self.rate_mbit}mbit',
        'burst', str(burst), 'latency', '100ms')  # fmt: skip

  def close(self) -> None:
    """Stops the processes, then removes the namespaces and their /etc/netns folders."""
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
    for sig, handler in self._handlers.items():
      signal.signal(sig, handler)
    self._handlers = {}

  # --- running in them ---------------------------------------------------------------

  def command(self, i: int, cmd: Sequence[str]) -> list[str]:
    """`cmd` run in host i's namespace."""
    return ['ip', 'netns', 'exec', self.names[i], *cmd]

  def popen(self, i: int, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
    """Starts `cmd` in host i's namespace, in a process group `close` kills."""
    p = subprocess.Popen(self.command(i, cmd), start_new_session=True, **kwargs)
    self.procs.append(p)
    return p
