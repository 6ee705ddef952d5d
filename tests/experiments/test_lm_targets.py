"""experiments/lm_targets.py: each target's verdict from hand-made summaries."""

import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, 'experiments', 'lm_targets.py')


def write(folder, name, loss, mean, peak, **more):
  os.makedirs(folder / name)
  summary = {'test_loss': loss, 'sent_bytes_per_step': mean, 'peak_sent_bytes_per_step': peak,
             **more}  # fmt: skip
  (folder / name / 'summary.json').write_text(json.dumps(summary))


def test_verdicts_follow_the_numbers(tmp_path):
  runs = tmp_path / 'runs'
  write(runs, 'bsp', 2.00, 1000.0, 1000.0)
  write(runs, 'diloco50', 2.09, 20.0, 1000.0)  # +4.5 %, 50x fewer: holds
  # +1.5 %: holds; bytes counting BSP's 500 steps before it: (500 x 1000 + 2000 x 20) / 2500
  # = 216 a step, 1000 / 216 = 4.6x fewer
  write(runs, 'diloco50_warm', 2.03, 20.0, 1000.0, steps=2500, init_step=500,
        sent_bytes_per_worker=40_000.0, source_sent_bytes_per_worker=500_000.0)  # fmt: skip
  write(runs, 'diloco50_m1', 2.001, 0.0, 0.0, workers=1)  # +0.05 %: above BSP, fails
  write(runs, 'streaming48_fp8', 2.04, 20.0, 300.0)  # peak 0.3 > 1/4: fails
  write(runs, 'sparseloco50', 2.11, 1.0, 1.0)  # +0.96 % of DiLoCo's, 20x fewer: holds
  write(runs, 'demo', 2.11, 100.0, 100.0)  # +5.5 % of AdamW's: fails
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
  assert verdicts == ['yes', 'yes', 'no', 'no', 'yes', 'no', 'no', 'no'], lines
  text = results.read_text()
  assert 'loss +4.50 %, 50x fewer bytes' in text
  assert "loss +1.50 % (from BSP's step 500 of 2500), 4.6x fewer bytes" in text
  assert "loss +0.05 % of BSP's (1 replica)" in text
  assert "loss +5.50 % of AdamW's" in text
  assert "peak 0.300 of DiLoCo's (1/P = 0.250)" in text
  assert 'worst sparseloco50' in text


def test_missing_runs_say_so(tmp_path):
  proc = subprocess.run(
    [sys.executable, SCRIPT, f'--workdir={tmp_path}', f'--steps={tmp_path}/none.md'],
    cwd=REPO, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count('not run') == 8
