"""2 processes x 4 CPU devices on 127.0.0.1 == 1 process x 8 devices (digits, and the GPT).

Streaming DiLoCo's processes defer its exchange to a thread of their own (`exchange:
deferred`) against the single process's inline one: the same models. With one device a
process (`extended`) that thread's all-reduce runs at once with the next steps.
"""

import json
import os
import subprocess

import numpy as np
import pytest

from jaxdist.train import checkpoint, metrics

from conftest import QUICK_FLAGS, REPO, binary_cmd, binary_env, free_port

pytestmark = pytest.mark.slow

TIMEOUT = 240
STEPS = 6


def flat(tree, prefix=''):
  for key, value in sorted(tree.items()):
    if isinstance(value, dict):
      yield from flat(value, f'{prefix}{key}/')
    else:
      yield prefix + key, value


CASES = {
  # the compute term measured by process 0, and everyone's (calibrate.worker_step_s)
  'digits': ['configs/digits.py:runlocal'],
  # a language model with a method whose collectives are staggered over steps
  'lm_streaming_diloco': [
    'configs/shakespeare_gpt.py:runlocal',
    *QUICK_FLAGS,
    '--config.sync.method=streaming_diloco',
    '--config.sync.streaming_diloco.period=4',
    '--config.sync.streaming_diloco.fragments=2',
    '--config.sync.streaming_diloco.delay=1',
  ],
}


DEFERRED = '--config.sync.streaming_diloco.exchange=deferred'
# the multi-process runs' own options, and their devices a process
MULTI = {
  'digits': ([], 4),
  'lm_streaming_diloco': ([DEFERRED], 4),
  'lm_streaming_overlapped': ([DEFERRED], 1),
  'lm_eager_overlapped': (['--config.sync.diloco.exchange=deferred'], 1),
}
# the gradient noise measured every 2 steps: its collective must wait for the exchange
CASES['lm_streaming_overlapped'] = [*CASES['lm_streaming_diloco'], '--config.noise_every=2']
CASES['lm_eager_overlapped'] = [
  *CASES['lm_streaming_diloco'][:2],
  '--config.sync.method=diloco',
  '--config.sync.diloco.period=3',
  '--config.sync.diloco.eager=True',
  '--config.noise_every=2',
]
EXTENDED = ('lm_streaming_overlapped', 'lm_eager_overlapped')


@pytest.mark.parametrize(
  'case',
  [
    *sorted(set(CASES) - set(EXTENDED)),
    *(pytest.param(case, marks=pytest.mark.extended) for case in EXTENDED),
  ],
)
def test_two_processes_match_one(tmp_path, data_dir, case):
  spec, *options = CASES[case]
  multi_options, devices = MULTI[case]
  config = [
    f'--config={os.path.join(REPO, spec)}',
    *options,
    f'--config.steps={STEPS}',
    '--config.eval_every=3',
    '--config.checkpoint_every=3',
    '--config.progress=False',
    '--verbosity=0',  # the info lines checked below (absl's default here is warnings)
  ]
  env = binary_env(data_dir)
  single = tmp_path / 'single'
  subprocess.run(
    binary_cmd(*config, f'--workdir={single}', '--cpu_devices=8'),
    env=env, check=True, capture_output=True, timeout=TIMEOUT,
  )  # fmt: skip

  multi = tmp_path / 'multi'
  address = f'127.0.0.1:{free_port()}'
  procs = [
    subprocess.Popen(
      binary_cmd(
        *config,
        *multi_options,
        f'--workdir={multi}',
        f'--cpu_devices={devices}',
        f'--coordinator_address={address}',
        '--num_processes=2',
        f'--process_id={i}',
      ),
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  try:
    outputs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
  finally:
    for p in procs:  # a dead peer aborts (not raises in) the survivor: never leave one behind
      p.kill()
  for p, out in zip(procs, outputs, strict=True):
    assert p.returncode == 0, out[-3000:]
  layout = f'8 workers = {2 * devices} devices (cpu) x {4 // devices} simulated'
  assert layout in outputs[0], outputs[0][-3000:]

  want, want_meta = checkpoint.read(os.path.join(single, 'checkpoints'))
  got, got_meta = checkpoint.read(os.path.join(multi, 'checkpoints'))
  assert want_meta['step'] == got_meta['step'] == STEPS
  want, got = dict(flat(want['params'])), dict(flat(got['params']))
  assert want.keys() == got.keys()
  for key in want:
    assert got[key].shape[0] == 8  # all 8 workers, from both processes
    np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-6, err_msg=key)
  # process 0 alone writes the log, and it matches the single-process run
  want_log = metrics.read_jsonl(os.path.join(single, 'metrics.jsonl'))
  got_log = metrics.read_jsonl(os.path.join(multi, 'metrics.jsonl'))
  assert [r['step'] for r in got_log] == list(range(1, STEPS + 1))
  for a, b in zip(want_log, got_log, strict=True):
    a, b = metrics.without_timings(a), metrics.without_timings(b)
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(b)], rtol=1e-5)
  # each process times its own steps and compute term (StepLog.close); one process writes none
  assert not (single / 'hosts').exists()
  for i in range(2):
    times = json.loads((multi / 'hosts' / f'process{i}.json').read_text())
    assert times['process'] == i
    if case == 'digits':  # measured on each process (QUICK_FLAGS give the others' compute term)
      assert 0 < times['compute_s'] < 10
    else:
      assert times['compute_s'] is None
    steps, step_s, wait_s = zip(*times['steps'], strict=True)
    assert list(steps) == list(range(1, STEPS + 1))
    assert step_s[0] is None and all(0 < s < 60 for s in step_s[1:])
    assert all(0 <= w <= s for w, s in zip(wait_s[1:], step_s[1:], strict=True))
