"""experiments/bench_micro.py: one worker's step per count, masked and micro-batched (toy size)."""

import json
import math
import os
import subprocess
import sys

from conftest import REPO, load_experiment

SCRIPT = os.path.join(REPO, 'experiments', 'bench_micro.py')


def _run(*args):
  return subprocess.run(
    [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, cwd=REPO
  )


def test_a_measurement_and_its_table(tmp_path):
  found = tmp_path / 'micro.json'
  proc = _run('--model=cnn', '--held=8', '--micro=4', '--counts=0,4,8', '--repeats=2',
              f'--json={found}')  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(found.read_text())['rows']
  # masked (added as the reference) and micro-batches of 4: ⌈count / 4⌉ of them run
  assert [(r['micro'], r['count'], r['trips']) for r in rows] == [
    ('masked', 0, 'all'), ('masked', 4, 'all'), ('masked', 8, 'all'),
    (4, 0, 0), (4, 4, 1), (4, 8, 2),
  ]  # fmt: skip
  assert all(math.isfinite(r['ms']) and r['ms'] > 0 for r in rows)
  assert rows[2]['versus'] == 1.0  # masked at the full batch is the reference
  table = tmp_path / 'micro.md'
  load_experiment('bench_micro').write(json.loads(found.read_text()), str(table))
  text = table.read_text()
  assert text.startswith('Command: `python experiments/bench_micro.py --model=cnn')
  assert '| 4 | 8 | 2 |' in text and '| masked | 8 | all |' in text


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused(tmp_path):
  proc = _run('--model=cnn', '--held=8', '--micro=3', f'--json={tmp_path / "x.json"}')
  assert proc.returncode != 0
  assert '--micro: 3 must divide --held=8' in proc.stderr
  assert not (tmp_path / 'x.json').exists()
