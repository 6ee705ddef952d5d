"""experiments/bench_step.py: the compressor table's model sizes, and its rows at toy size."""

import math
import os
import subprocess
import sys

import pytest

from conftest import REPO, load_experiment, xla_flags_for_tests

SCRIPT = os.path.join(REPO, 'experiments', 'bench_step.py')
METHODS = ('dense all-reduce', 'Top-k 1%, EF', 'DGC 1%, EF', 'QSGD 8-bit', 'PowerSGD rank 2')


def test_sizes_are_the_digits_cnn_widened():
  """150K is the digits CNN itself (m = 8); other targets widen every layer by m/8."""
  bench = load_experiment('bench_step')
  model, m, n = bench._sized('cnn', (8, 8, 1), 150_000)
  assert (m, n) == (8, 151_306)  # the digits CNN's count (the PyTorch DDP comparison's)
  assert (model.features, model.hidden) == ((32, 64), 128)
  for target in (2_000, 1_000_000, 10_000_000):
    _, m, n = bench._sized('cnn', (8, 8, 1), target)
    neighbours = [bench._num_params(bench._widened('cnn', k), (8, 8, 1)) for k in (m - 1, m + 1)]
    off = lambda count, target=target: abs(math.log(count / target))
    assert all(off(n) <= off(c) for c in neighbours if c > 0), (target, m, n, neighbours)
  _, m, n = bench._sized('mlp', (8, 8, 1), 1_000_000)
  assert 0.8e6 < n < 1.2e6


def _table(text: str, title: str) -> list[dict[str, str]]:
  """The markdown table after the line starting with `title`, as rows of cells by heading."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(title))
  body = []
  for line in lines[start + 2 :]:
    if not line.startswith('|'):
      break
    body.append([c.strip() for c in line.strip('|').split('|')])
  return [dict(zip(body[0], row, strict=True)) for row in body[2:]]


def bench(tmp_path, args: list[str]) -> str:
  """The results file bench_step.py writes with `args`."""
  results = tmp_path / 'results.md'
  env = {**os.environ, 'XLA_FLAGS': xla_flags_for_tests()}  # not the parent's device count
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  proc = subprocess.run(
    [sys.executable, SCRIPT, *args, f'--results={results}'],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-4000:]
  return results.read_text()


@pytest.mark.slow
def test_compressor_table_at_toy_sizes(tmp_path):
  args = ['--nolayouts', '--scaling=', '--overhead_params=2000,20000', '--steps=1', '--repeats=1']
  text = bench(tmp_path, args)
  assert text.startswith('Command: `python experiments/bench_step.py --nolayouts')
  assert 'scaling:' not in text and '| layout |' not in text  # only the table asked for
  rows = _table(text, 'compressor overhead: cnn widened, 8 workers on 8 device(s)')
  assert [(r['params'], r['method']) for r in rows] == [
    (p, m) for p in ('2,570', '21,706') for m in METHODS
  ]
  for r in rows:
    for key in ('÷ dense', 'step ms', 'compile s'):
      value = float(r[key])  # 'nan' parses: the check below fails on it
      assert math.isfinite(value) and value > 0, (key, r)
    assert r['memory/device'] != '-' and r['payload B/worker/step'] != '-', r
  dense = [r for r in rows if r['method'] == 'dense all-reduce']
  assert all(r['÷ dense'] == '1.00' for r in dense)
  # what the library says each worker sends for the 2,570-parameter model: all of it in
  # float32 dense; 1% (25 values + 25 int32 indices) for Top-k and DGC
  small = {r['method']: r['payload B/worker/step'] for r in rows if r['params'] == '2,570'}
  assert small['dense all-reduce'] == '10.04 KiB'  # 2,570 x 4 B
  assert small['Top-k 1%, EF'] == small['DGC 1%, EF'] == '200 B'


@pytest.mark.slow
def test_language_model_table_times_each_variant_against_the_first(tmp_path):
  args = ['--nolayouts', '--scaling=', '--overhead_params=', '--lm=bsp,diloco10', '--lm_steps=2',
          '--repeats=1', '--lm_config=shakespeare_gpt.py:runlocal,workers=4',
          '--lm_trainer_steps=6']  # fmt: skip
  text = bench(tmp_path, args)
  assert 'compressor overhead' not in text
  rows = _table(text, 'language model: gpt mini (')  # runlocal's GPT
  assert [(r['variant'], r['sync']) for r in rows] == [('bsp', 'allreduce'), ('diloco10', 'diloco')]
  assert rows[0]['÷ first'] == '1.000'
  for r in rows:
    for key in (
      '÷ first',
      'step ms',
      'compile s',
      "the trainer's median step ms",
      'trainer ÷ step',
    ):
      value = float(r[key])
      assert math.isfinite(value) and value > 0, (key, r)
  assert '4 workers on' in text and '64 x 32 tokens per step, windows of 2 steps' in text
