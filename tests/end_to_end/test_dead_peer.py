"""A dead peer in a 2-process run: the survivor exits non-zero in bounded time; a rerun resumes."""

import os
import subprocess
import time

import pytest

from jaxdist.train import checkpoint, metrics

from conftest import QUICK_FLAGS, REPO, binary_cmd, binary_env, free_port

pytestmark = pytest.mark.slow

HEARTBEAT_S = 5
TIMEOUT = 240


def launch(workdir, env, kill_at: int = 0):
  """Both processes of one run; process 1 SIGKILLs itself after step `kill_at` (0: never)."""
  address = f'127.0.0.1:{free_port()}'
  config = [
    f'--config={os.path.join(REPO, "configs/digits.py")}:runlocal',
    '--config.steps=6',
    '--config.eval_every=2',
    '--config.checkpoint_every=2',
    '--config.progress=False',
    *QUICK_FLAGS,
    '--verbosity=0',  # the info lines checked below (absl's default here is warnings)
    f'--workdir={workdir}',
    '--cpu_devices=4',
    f'--coordinator_address={address}',
    '--num_processes=2',
    f'--heartbeat_timeout_s={HEARTBEAT_S}',
  ]
  fault = lambda i: [f'--config.fault.kill_at_step={kill_at}'] if i == 1 and kill_at else []
  return [
    subprocess.Popen(
      binary_cmd(*config, f'--process_id={i}', *fault(i)),
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]


def finish(procs) -> tuple[list[str], list[float]]:
  """Each process's output and the time it ended (the survivor is never left running)."""
  outputs, ended = ['', ''], [0.0, 0.0]
  start = time.monotonic()
  try:
    while any(p.poll() is None for p in procs) and time.monotonic() - start < TIMEOUT:
      for i, p in enumerate(procs):
        if p.poll() is not None and not ended[i]:
          ended[i] = time.monotonic()
      time.sleep(0.2)
    for i in range(len(procs)):
      ended[i] = ended[i] or time.monotonic()
  finally:
    for p in procs:
      p.kill()
  for i, p in enumerate(procs):
    outputs[i] = p.communicate()[0]
  return outputs, ended


def test_a_dead_peer_ends_the_survivor_and_the_rerun_resumes(tmp_path, data_dir):
  env = binary_env(data_dir)
  workdir = tmp_path / 'run'
  procs = launch(workdir, env, kill_at=3)
  outputs, ended = finish(procs)
  survivor, dead = procs
  assert dead.returncode == -9, outputs[1][-2000:]  # SIGKILLed after step 3
  assert survivor.returncode not in (0, None), outputs[0][-2000:]  # non-zero, not a hang
  # bounded: the heartbeat timeout plus JAX's polling, not the collective's own wait
  assert ended[0] - ended[1] < HEARTBEAT_S + 30, (ended, outputs[0][-2000:])
  assert 'another task died' in outputs[0], outputs[0][-2000:]  # JAX's one clear line
  # the checkpoint of step 2 is intact (written before the kill; step 4 never was)
  state, meta = checkpoint.read(os.path.join(workdir, 'checkpoints'))
  assert meta['step'] == 2 and state['params']
  # the same command again resumes from it and finishes
  procs = launch(workdir, env)
  outputs, _ = finish(procs)
  for p, out in zip(procs, outputs, strict=True):
    assert p.returncode == 0, out[-3000:]
  assert 'resumed from step 2' in outputs[0]
  records = metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in records] == list(range(1, 7))
  assert checkpoint.read(os.path.join(workdir, 'checkpoints'))[1]['step'] == 6
