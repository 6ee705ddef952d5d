"""experiments/netns.py and bench_network.py: real rate-limited links between namespaces."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, xla_flags_for_tests

sys.path.insert(0, os.path.join(REPO, 'experiments'))
import netns

WHY = netns.available()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f'network namespaces: {WHY}')

SEND = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5555))
start = time.perf_counter()
s.sendall(b"x" * int(sys.argv[2]))
s.shutdown(socket.SHUT_WR)
s.recv(1)  # the receiver's byte: everything arrived
print(time.perf_counter() - start)
"""
RECEIVE = """
import socket
s = socket.socket()
s.bind(("0.0.0.0", 5555))
s.listen(1)
c, _ = s.accept()
while c.recv(1 << 20):
  pass
c.sendall(b"!")
"""


def transfer_s(hosts, nbytes, src=0, dst=1):
  """Seconds for host `src` to get `nbytes` to host `dst` over their links."""
  receiver = hosts.popen(dst, [sys.executable, '-c', RECEIVE])
  time.sleep(0.5)
  out = subprocess.run(
    hosts.command(src, [sys.executable, '-c', SEND, hosts.addresses[dst], str(nbytes)]),
    capture_output=True, text=True, timeout=60, check=True,
  )  # fmt: skip
  receiver.wait(timeout=30)
  return float(out.stdout)


def test_a_rate_limited_link_takes_the_time_its_bytes_need():
  with netns.Hosts(2, 20) as hosts:  # 20 Mbit/s: 2.5 MB is 1.0 s of bytes
    limited = transfer_s(hosts, 2_500_000)
    small = transfer_s(hosts, 50_000)  # 20 ms of bytes: the bucket's burst must not carry it
  with netns.Hosts(2, None) as hosts:
    free = transfer_s(hosts, 2_500_000)
  assert 0.9 < limited < 1.5, limited
  assert 0.015 < small < 0.05, small
  assert free < 0.3, free
  assert not netns.leftovers(hosts.prefix)


BUSY = """
import time
start, cpu = time.perf_counter(), time.process_time()
while time.perf_counter() - start < 1.5:
  pass
print((time.process_time() - cpu) / (time.perf_counter() - start))
"""


def test_unequal_hosts_get_their_own_link_rates_and_cpu_shares():
  """Host 0: 20 Mbit/s and a quarter core; hosts 1 and 2 unlimited. A busy loop in host 0 runs
  in its CPU group, whose quota caps it at a quarter of the 1.5 s it spins (a ceiling: under
  the suite's other tests it may get less); 2.5 MB takes 1 s from host 0, and a fraction of
  that between the unlimited hosts."""
  with netns.Hosts(3, [20, None, None], cpu=[0.25, None, None], prefix='jdtestuneq') as hosts:
    assert len(netns.leftovers('jdtestuneq')) == 4 + 3 + 1  # namespaces, /etc/netns, group
    group = hosts.groups[0]
    with open(f'{group}/cpu.cfs_quota_us') as f:
      assert int(f.read()) == 25_000  # of a 100,000 µs period
    spin = hosts.popen(0, [sys.executable, '-c', BUSY], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    with open(f'{group}/cgroup.procs') as f:
      assert str(spin.pid) in f.read().split()  # the shell that became `ip netns exec` python
    quarter = float(spin.communicate(timeout=60)[0])
    slow = transfer_s(hosts, 2_500_000, src=0, dst=1)
    fast = transfer_s(hosts, 2_500_000, src=1, dst=2)
  assert quarter < 0.35, quarter
  assert 0.9 < slow < 1.5, slow
  assert fast < 0.3, fast
  assert netns.leftovers('jdtestuneq') == []
  with pytest.raises(ValueError, match='cpu gives 2 hosts of 3'):
    netns.Hosts(3, None, cpu=[0.5, 0.5])
  with pytest.raises(ValueError, match=r'rate must be > 0 Mbit/s \(or None\), got -1'):
    netns.Hosts(2, [100, -1])


def test_an_error_inside_leaves_nothing_behind():
  with (
    pytest.raises(RuntimeError, match='boom'),
    netns.Hosts(3, 100, prefix='jdtesterr', cpu=[None, None, 0.5]) as h,
  ):
    sleeper = h.popen(2, ['sleep', '600'])  # in host 2's CPU group
    assert netns.leftovers('jdtesterr')
    raise RuntimeError('boom')
  assert netns.leftovers('jdtesterr') == []
  assert sleeper.poll() is not None  # killed


def test_ctrl_c_tears_everything_down():
  script = f"""
import sys, time
sys.path.insert(0, {os.path.join(REPO, 'experiments')!r})
import netns
with netns.Hosts(2, 100, prefix='jdtestint') as h:
  h.popen(1, ['sleep', '601'])
  print('ready', flush=True)
  time.sleep(600)
"""
  proc = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == 'ready'
    assert len(netns.leftovers('jdtestint')) == 5  # 3 namespaces, 2 /etc/netns folders
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) != 0
  finally:
    proc.kill()
  assert netns.leftovers('jdtestint') == []
  ps = subprocess.run(['pgrep', '-f', 'sleep 601'], capture_output=True, text=True)
  assert not ps.stdout.strip(), 'the host processes were not killed'


@pytest.mark.slow
def test_two_hosts_train_over_the_link_beside_ddp(tmp_path, data_dir):
  results = tmp_path / 'network.md'
  peers = tmp_path / 'peers'
  peers.mkdir()
  shutil.copy(os.path.join(os.path.dirname(__file__), 'fake_ddp_peer.py'),
              peers / 'torch_ddp_digits.py')  # fmt: skip
  env = dict(os.environ, TFDS_DATA_DIR=data_dir, XLA_FLAGS=xla_flags_for_tests())
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, 'experiments', 'bench_network.py'), '--hosts=2',
     '--rates=unlimited', '--only=dense', '--steps=6', '--skip=2',
     f'--workdir={tmp_path}', f'--results={results}', f'--torch_python={sys.executable}',
     f'--peers_dir={peers}'],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-4000:]
  text = results.read_text()
  rows = [
    line for line in text.splitlines() if line.startswith(('| 2 | dense |', '| 2 | local4 |'))
  ]
  assert len(rows) == 1 and rows[0].startswith('| 2 | dense |'), text  # what --only named
  measured = float(rows[0].split('|')[7])
  assert 0 < measured < 60, rows[0]
  # the (fake) peers' DDP on the same hosts, beside jaxdist's runs of the same names
  ddp = [line.split('|')[1:-1] for line in text.split('PyTorch DDP')[1].splitlines()[4:7]]
  assert [[c.strip() for c in row[:4]] for row in ddp] == [
    ['2', 'unlimited', 'dense', '12.5'], ['2', 'unlimited', 'powersgd2', '12.5'],
    ['2', 'unlimited', 'local4', '12.5'],
  ], text  # fmt: skip
  jd_dense = float(rows[0].split('|')[7]) * 1e3
  assert float(ddp[0][4]) == pytest.approx(jd_dense, abs=0.051), text
  for row in ddp[1:]:  # no jaxdist powersgd2 or local4 run
    assert row[4].strip() == '-' and row[5].strip() == '-', text
  # the tables come from the workdir alone: --tables_only remakes them, no root, no training
  again = tmp_path / 'again.md'
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, 'experiments', 'bench_network.py'), '--hosts=2',
     '--rates=unlimited', '--only=dense', '--steps=6', '--skip=2', '--tables_only',
     f'--workdir={tmp_path}', f'--results={again}'],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-4000:]
  first, *rest = again.read_text().split('\n')
  assert first.endswith('Tables redone from its runs by the same command with `--tables_only`.')
  assert first.startswith(text.split('\n')[0].removesuffix('.'))  # the command that trained
  assert rest == text.split('\n')[1:]


def test_tables_only_names_what_the_workdir_lacks(tmp_path):
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, 'experiments', 'bench_network.py'), '--hosts=2',
     '--rates=100', '--only=dense', '--tables_only', f'--workdir={tmp_path}'],
    cwd=REPO, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode != 0
  assert f'--workdir={tmp_path} has no run of 2 hosts at 100' in proc.stderr
  assert 'no link.json, dense/metrics.jsonl' in proc.stderr
  assert 'Traceback' not in proc.stderr
