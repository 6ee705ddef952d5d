"""A dead peer over a real link (network namespaces): the survivor exits non-zero in bounded
time, the last checkpoint is intact, and the same command resumes."""

import json
import os
import subprocess
import sys
import time

import pytest

from jaxdist.train import checkpoint, metrics

from conftest import QUICK_FLAGS, REPO, binary_cmd, binary_env

sys.path.insert(0, os.path.join(REPO, 'experiments'))
import netns

WHY = netns.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=f'namespaces: {WHY}')]

HEARTBEAT_S = 5
TIMEOUT = 300
RATE_MBIT = 20  # a dense step of the digits CNN (600 KB each way) takes about 0.3 s


def launch(hosts, workdir, env):
  """The run's two processes, one in each host's namespace."""
  config = [
    f'--config={os.path.join(REPO, "configs/digits.py")}:runlocal',
    '--config.steps=12', '--config.eval_every=2', '--config.checkpoint_every=2',
    '--config.progress=False', *QUICK_FLAGS, f'--workdir={workdir}',
    '--cpu_devices=4', f'--coordinator_address={hosts.addresses[0]}:23458',
    '--num_processes=2', f'--heartbeat_timeout_s={HEARTBEAT_S}',
  ]  # fmt: skip
  return [
    hosts.popen(
      i,
      binary_cmd(*config, f'--process_id={i}'),
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]


def step_reached(workdir) -> int:
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  return json.loads(lines[-1])['step'] if lines else 0


# a killed peer is test_dead_peer.py's too (over loopback): over a link, only in `make test-all`;
# 'kill_slow': the killed peer is a slow host, a quarter of a core (unequal hosts, issue 47)
@pytest.mark.parametrize(
  'death',
  [pytest.param(d, marks=pytest.mark.extended) for d in ('kill', 'kill_slow')] + ['link_down'],
)
def test_a_dead_peer_over_a_real_link(tmp_path, data_dir, death):
  env = binary_env(data_dir)
  workdir = tmp_path / 'run'
  with netns.Hosts(2, RATE_MBIT, cpu=[None, 0.25] if death == 'kill_slow' else None) as hosts:
    procs = launch(hosts, workdir, env)
    start = time.monotonic()
    while step_reached(workdir) < 3:
      assert all(p.poll() is None for p in procs), procs[0].communicate()[0][-3000:]
      assert time.monotonic() - start < TIMEOUT, 'the run never reached step 3'
      time.sleep(0.2)
    if death.startswith('kill'):
      os.killpg(procs[1].pid, 9)
    else:
      subprocess.run(hosts.command(1, ['ip', 'link', 'set', 'eth0', 'down']), check=True)
    died = time.monotonic()
    outputs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    ended = time.monotonic()
    assert procs[0].returncode != 0, outputs[0][-2000:]  # non-zero, not a hang
    assert ended - died < HEARTBEAT_S + 60, (ended - died, outputs[0][-2000:])
  state, meta = checkpoint.read(os.path.join(workdir, 'checkpoints'))
  assert meta['step'] >= 2 and meta['step'] % 2 == 0 and state['params']
  # the same command, on links that work, resumes from it and finishes
  with netns.Hosts(2, None) as hosts:
    procs = launch(hosts, workdir, env)
    outputs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
  for p, out in zip(procs, outputs, strict=True):
    assert p.returncode == 0, out[-3000:]
  records = metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in records] == list(range(1, 13))
  assert checkpoint.read(os.path.join(workdir, 'checkpoints'))[1]['step'] == 12
