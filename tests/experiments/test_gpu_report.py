"""experiments/gpu_report.py reads the stored GPU logs and gpu.md is what it writes (no GPU)."""

import os
import subprocess
import sys

from conftest import REPO, load_experiment

SCRIPT = os.path.join(REPO, 'experiments', 'gpu_report.py')


def test_text_tables_reads_what_report_table_prints():
  from jaxdist.train import report

  rows = [{'name': 'ab', 'n': 1, 'ms': '2.5'}, {'name': 'c d', 'n': 10, 'ms': '30'}]
  printed = report.table(rows, [('name', 'name'), ('n', 'n'), ('ms', 'ms (median)')])
  ((line, parsed),) = load_experiment('gpu_report').text_tables(f'before\n{printed}\n\nafter')
  assert line == 2
  assert parsed == [
    {'name': 'ab', 'n': '1', 'ms (median)': '2.5'},
    {'name': 'c d', 'n': '10', 'ms (median)': '30'},
  ]


def test_every_log_parses_into_the_section():
  text = load_experiment('gpu_report').render()
  for row in (
    '| single device, plain jit | 1 | 1 × - |',
    '| simulated, allreduce | 256 | 1 × 256 |',
    '| memory pass (jnp.copy) | 1 |',
    '| dgc | 0.02 |',
    '| powersgd2 |',
  ):
    assert row in text, row
  assert text.count('Command: `python experiments/') == 4
  assert 'H100' in text


def test_gpu_md_is_what_the_logs_give():
  proc = subprocess.run(
    [sys.executable, SCRIPT, '--check'], cwd=REPO, capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr
