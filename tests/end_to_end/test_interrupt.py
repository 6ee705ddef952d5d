"""Ctrl-C from outside, and preemption of one process of two: nothing trained is lost.

The binary's SIGTERM at a chosen step, resumed and compared with a run never
stopped, is `test_binary.py`'s; here the signal comes from another process
at whatever step the run has reached, and in a 2-process run only process 1
is told to stop: both must save the same step and resume from it.
"""

import os
import re
import signal
import subprocess
import time

import pytest

from jaxdist.train import checkpoint, metrics

from conftest import QUICK_FLAGS, REPO, binary_cmd, binary_env, free_port

pytestmark = pytest.mark.slow

TIMEOUT = 240
LINE = re.compile(
  r'^interrupted at step (\d+); checkpoint saved; rerun the same command to resume$', re.M
)
CONFIG = [
  f'--config={os.path.join(REPO, "configs/digits.py")}:runlocal',
  '--config.eval_every=100',  # only at the end
  '--config.checkpoint_every=100',  # no periodic checkpoint: the one saved is the stop's
  '--config.progress=False',
  *QUICK_FLAGS,
]


def logged_steps(workdir) -> list[int]:
  return [r['step'] for r in metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))]


def stopped_at(output: str) -> int:
  """The step of the one `interrupted at step N; ...` line in `output` (a process's stderr)."""
  lines = LINE.findall(output)
  assert len(lines) == 1, output[-3000:]
  assert 'Traceback' not in output, output[-3000:]
  return int(lines[0])


def test_ctrl_c_saves_the_step_reached_and_the_rerun_goes_on_from_it(tmp_path, data_dir):
  workdir, env = tmp_path / 'run', binary_env(data_dir)
  command = binary_cmd(*CONFIG, '--config.steps=400', f'--workdir={workdir}')
  proc = subprocess.Popen(
    command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  try:
    records = workdir / 'metrics.jsonl'  # written in blocks of 8 KiB: some 25 steps in
    deadline = time.monotonic() + TIMEOUT
    while not (records.exists() and records.stat().st_size) and proc.poll() is None:
      assert time.monotonic() < deadline, 'the run logged no step'
      time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends
    _, err = proc.communicate(timeout=TIMEOUT)
  finally:
    proc.kill()
  assert proc.returncode == 130, err[-3000:]
  step = stopped_at(err)
  assert 0 < step < 400, err[-3000:]
  assert checkpoint.latest_step(str(workdir / 'checkpoints')) == step
  assert logged_steps(workdir) == list(range(1, step + 1))

  # the rerun: 12 steps past the stop, then it finishes (steps may change on a resume)
  proc = subprocess.run(
    binary_cmd(*CONFIG, f'--config.steps={step + 12}', f'--workdir={workdir}'),
    env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'resumed from step {step} of {step + 12}' in proc.stdout, proc.stdout[-2000:]
  assert logged_steps(workdir) == list(range(1, step + 13))  # no gap, no step twice


def launch(workdir, env, *extra: str, signal_at: int = 0) -> list[subprocess.Popen]:
  """Both processes of a 2-process run; process 1 sends itself SIGTERM after `signal_at`."""
  address = f'127.0.0.1:{free_port()}'
  common = [
    *CONFIG, '--config.steps=10', f'--workdir={workdir}', '--cpu_devices=4',
    f'--coordinator_address={address}', '--num_processes=2', '--heartbeat_timeout_s=10', *extra,
  ]  # fmt: skip
  fault = ['--config.fault.signal=SIGTERM', f'--config.fault.kill_at_step={signal_at}']
  return [
    subprocess.Popen(
      binary_cmd(*common, f'--process_id={i}', *(fault if i == 1 and signal_at else [])),
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]


def finish(procs) -> list[tuple[int, str, str]]:
  """Each process's (exit status, stdout, stderr); none is left running."""
  try:
    outputs = [p.communicate(timeout=TIMEOUT) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
  finally:
    for p in procs:
      p.kill()


def test_one_process_preempted_both_save_the_same_step_and_resume(tmp_path, data_dir):
  workdir, env = tmp_path / 'run', binary_env(data_dir)
  outputs = finish(launch(workdir, env, signal_at=3))
  assert [code for code, _, _ in outputs] == [143, 143], [err[-2000:] for _, _, err in outputs]
  steps = [stopped_at(err) for _, _, err in outputs]
  assert steps[0] == steps[1] >= 3, steps  # the same step on both
  assert checkpoint.latest_step(str(workdir / 'checkpoints')) == steps[0]
  assert logged_steps(workdir) == list(range(1, steps[0] + 1))

  outputs = finish(launch(workdir, env))
  assert [code for code, _, _ in outputs] == [0, 0], [err[-2000:] for _, _, err in outputs]
  assert f'resumed from step {steps[0]} of 10' in outputs[0][1], outputs[0][2][-3000:]
  assert logged_steps(workdir) == list(range(1, 11))
