"""The README's measured tables are copies of the results files the runs wrote."""

import os
import re

from conftest import REPO


def test_readme_tables_equal_the_committed_results_files():
  with open(os.path.join(REPO, 'README.md')) as f:
    readme = f.read()
  blocks = re.findall(r'<!-- results: ([\w.-]+) -->\n(.*?)<!-- /results -->', readme, re.S)
  assert blocks, 'README.md has no generated results blocks'
  for name, body in blocks:
    path = os.path.join(REPO, 'experiments', 'results', name)
    assert os.path.exists(path), f'README.md names {name}; experiments/results/{name} is missing'
    with open(path) as f:
      want = f.read().strip() + '\n'
    assert body == want, (
      f'README.md table {name} differs from experiments/results/{name}; '
      'run python experiments/readme_tables.py'
    )


def test_every_results_file_says_its_command_machine_and_date():
  folder = os.path.join(REPO, 'experiments', 'results')
  tables = [name for name in sorted(os.listdir(folder)) if name.endswith('.md')]
  assert len(tables) >= 9
  for name in tables:
    with open(os.path.join(folder, name)) as f:
      text = f.read()
    assert re.search(
      r'Command: `python experiments/\w+\.py .*`; machine: .+; date: \d{4}-', text
    ), name


def test_every_plot_in_the_readme_exists():
  with open(os.path.join(REPO, 'README.md')) as f:
    plots = re.findall(r'!\[[^\]]*\]\(([^)]+\.png)\)', f.read())
  assert plots
  for path in plots:
    assert os.path.getsize(os.path.join(REPO, path)) > 10_000, path
