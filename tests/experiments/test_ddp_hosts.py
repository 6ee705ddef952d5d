"""experiments/ddp_hosts.py: the peers' DDP ranks spread over hosts, with a fake peer script."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = os.path.join(REPO, 'experiments', 'ddp_hosts.py')

FAKE_PEER = os.path.join(os.path.dirname(__file__), 'fake_ddp_peer.py')


@pytest.fixture
def peers_dir(tmp_path):
  path = tmp_path / 'peers'
  path.mkdir()
  shutil.copy(FAKE_PEER, path / 'torch_ddp_digits.py')
  return path


def start(host, hosts, store, peers_dir, *peer_args, env=None):
  env = dict(os.environ, JAXDIST_PEERS_DIR=str(peers_dir), **(env or {}))
  cmd = [sys.executable, SCRIPT, f'--host={host}', f'--hosts={hosts}', f'--store={store}',
         '--ifname=lo', '--', *peer_args]  # fmt: skip
  return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_hosts_start_their_halves_of_the_world_in_one_store(tmp_path, peers_dir):
  store = tmp_path / 'store'
  procs = [
    start(h, 2, store, peers_dir, '--world_size', '8', '--hook', 'powersgd2') for h in (0, 1)
  ]
  outs = [p.communicate(timeout=120) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  line = json.loads(outs[0][0].strip().splitlines()[-1])
  assert line == {'hook': 'powersgd2', 'world_size': 8, 'median_step_ms': 12.5, 'test_acc': 0.5}
  # every rank of the world, each told the whole world's size, in the one store
  assert sorted(os.listdir(tmp_path)) == ['peers'] + [f'store.rank{r}' for r in range(8)]
  assert all((tmp_path / f'store.rank{r}').read_text() == '8' for r in range(8))


def test_a_failed_rank_on_another_host_fails_that_host(tmp_path, peers_dir):
  store = tmp_path / 'store'
  procs = [
    start(0, 2, store, peers_dir, '--world_size', '4'),
    start(1, 2, store, peers_dir, '--world_size', '4', env={'FAKE_LAUNCH_ERROR': 'worker died'}),
  ]  # fmt: skip
  for p in procs:
    p.communicate(timeout=120)
  assert [p.returncode for p in procs] == [0, 1]


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (['--host=2', '--hosts=2'], '--host must be in 0 … 1, got 2'),
    (['--host=0', '--hosts=2', '--store={store}'], None),  # the store exists already
  ],
)
def test_bad_arguments_are_refused_with_the_fix(tmp_path, peers_dir, args, message):
  store = tmp_path / 'old_store'
  store.write_text('')
  args = [a.format(store=store) for a in args]
  if '--store' not in ' '.join(args):
    args.append(f'--store={tmp_path / "new"}')
  env = dict(os.environ, JAXDIST_PEERS_DIR=str(peers_dir))
  proc = subprocess.run([sys.executable, SCRIPT, *args, '--', '--world_size', '2'], env=env,
                        capture_output=True, text=True, timeout=60)  # fmt: skip
  assert proc.returncode == 2
  expected = message or f'--store {store} exists: give every run a fresh path'
  assert expected in proc.stderr
