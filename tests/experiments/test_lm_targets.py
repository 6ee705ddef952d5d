"""experiments/lm_targets.py: each target's verdict from hand-made summaries."""

import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, 'experiments', 'lm_targets.py')


def write(folder, name, loss, mean, peak):
  os.makedirs(folder / name)
  summary = {'test_loss': loss, 'sent_bytes_per_step': mean, 'peak_sent_bytes_per_step': peak}
  (folder / name / 'summary.json').write_text(json.dumps(summary))


def test_verdicts_follow_the_numbers(tmp_path):
  runs = tmp_path / 'runs'
  write(runs, 'bsp', 2.00, 1000.0, 1000.0)
  write(runs, 'diloco50', 2.03, 20.0, 1000.0)  # +1.5 %, 50x fewer: holds
  write(runs, 'streaming48_fp8', 2.04, 20.0, 300.0)  # peak 0.3 > 1/4: fails
  write(runs, 'sparseloco50', 2.05, 1.0, 1.0)  # +0.99 % of DiLoCo's, 20x fewer: holds
  write(runs, 'onebit_adam', 2.05, 200.0, 1000.0)  # +2.5 %: fails
  steps = tmp_path / 'step_lm.md'
  steps.write_text(
    '| variant | sync | step ms | ÷ first |\n|---|---|---|---|\n'
    '| bsp | allreduce | 10 | 1.000 |\n| diloco10 | diloco | 10.5 | 1.050 |\n'
    '| sparseloco50 | sparseloco | 12 | 1.200 |\n'
  )
  results = tmp_path / 'targets.md'
  proc = subprocess.run(
    [sys.executable, SCRIPT, f'--workdir={runs}', f'--steps={steps}', f'--results={results}'],
    cwd=REPO, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [line for line in results.read_text().splitlines() if line.startswith('| ')][1:]
  verdicts = [line.rstrip(' |').rsplit('| ', 1)[1] for line in lines]
  assert verdicts == ['yes', 'no', 'yes', 'no', 'no'], lines
  text = results.read_text()
  assert 'loss +1.50 %, 50x fewer bytes' in text
  assert "peak 0.300 of DiLoCo's (1/P = 0.250)" in text
  assert 'worst sparseloco50' in text


def test_missing_runs_say_so(tmp_path):
  proc = subprocess.run(
    [sys.executable, SCRIPT, f'--workdir={tmp_path}', f'--steps={tmp_path}/none.md'],
    cwd=REPO, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count('not run') == 5
