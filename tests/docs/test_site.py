"""The docs site: its tables are the runs' files, its code runs, and it builds without a warning.

The builds need MkDocs (the `docs` extra); without it they are skipped.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest
from docs_pages import (
  BLOCK,
  DOCS,
  README,
  RESULTS,
  docs_tables,
  name,
  pages,
  python_blocks,
  read,
)

import jaxdist as jd

from conftest import REPO, xla_flags_for_tests

# Pages whose ```python blocks run, top to bottom, as one script each.
RUNNABLE = ('guides/own-loop.md', 'guides/new-method.md')
HAVE_MKDOCS = all(
  importlib.util.find_spec(m) for m in ('mkdocs', 'material', 'mkdocstrings_handlers.python')
)
needs_mkdocs = pytest.mark.skipif(
  not HAVE_MKDOCS, reason='MkDocs is not installed (pip install the docs extra)'
)


def test_every_table_in_the_pages_is_its_results_file():
  tables = docs_tables()
  blocks = [(name(p), *b) for p in pages() for b in BLOCK.findall(read(p))]
  assert len(blocks) >= 25
  for page, table, body in blocks:
    path = os.path.join(RESULTS, table)
    assert os.path.exists(path), f'{page} names {table}; experiments/results/{table} is missing'
    assert body == tables.table(table), (
      f'{page}: table {table} differs from experiments/results/{table}; '
      'run python experiments/docs_tables.py'
    )
  assert 'results: ' not in read(README), 'the measured tables live in docs/, not the README'


def test_the_copy_shows_commands_without_the_machine_s_paths():
  portable = docs_tables().portable
  line = (
    'Command: `python experiments/bench_peers.py --torch_python=/opt/torch/bin/python '
    '--results=/root/out/peers.md`; machine: m; date: 2026-01-01.'
  )
  assert portable('peers_bench.md', line) == (
    'Command: `python experiments/bench_peers.py --torch_python=$TORCH_PYTHON '
    '--results=experiments/results/peers_bench.md`; machine: m; date: 2026-01-01.'
  )
  same = 'Command: `python experiments/compare.py --results=experiments/results/x.md`; m'
  assert portable('x.md', same) == same


def test_every_results_file_says_its_command_machine_and_date():
  tables = [name for name in sorted(os.listdir(RESULTS)) if name.endswith('.md')]
  assert len(tables) >= 9
  for table in tables:
    text = read(os.path.join(RESULTS, table))
    assert re.search(
      r'Command: `python experiments/\w+\.py .*`; machine: .+; date: \d{4}-', text
    ), table


def test_every_plot_the_pages_and_the_readme_show_exists():
  shown = [
    os.path.join(RESULTS, png)
    for p in pages()
    for png in re.findall(r'!\[[^\]]*\]\((?:\.\./)*results/([\w.-]+\.png)\)', read(p))
  ]
  shown += [
    os.path.join(REPO, path) for path in re.findall(r'!\[[^\]]*\]\(([^)]+\.png)\)', read(README))
  ]
  assert len(shown) >= 10
  for path in shown:
    assert os.path.getsize(path) > 10_000, path


@pytest.mark.parametrize('path', pages(), ids=name)
def test_every_python_block_compiles(path):
  for i, code in enumerate(python_blocks(read(path))):
    compile(code, f'{name(path)}, block {i + 1}', 'exec')


@pytest.mark.slow
@pytest.mark.parametrize('page', RUNNABLE)
def test_the_guides_code_runs(page, tmp_path):
  code = '\n'.join(python_blocks(read(os.path.join(DOCS, page))))
  env = {**os.environ, 'PYTHONPATH': REPO, 'XLA_FLAGS': xla_flags_for_tests()}
  out = subprocess.run(
    [sys.executable, '-c', code], cwd=tmp_path, env=env, capture_output=True, text=True,
    timeout=900,
  )  # fmt: skip
  assert out.returncode == 0, f'{page}:\n{out.stderr[-3000:]}'


def build(root: str, site: str) -> subprocess.CompletedProcess:
  """`mkdocs build --strict` of the site whose mkdocs.yml is in `root`."""
  return subprocess.run(
    [sys.executable, '-m', 'mkdocs', 'build', '--strict', '-f', 'mkdocs.yml', '-d', site],
    cwd=root,
    env={**os.environ, 'NO_MKDOCS_2_WARNING': '1'},
    capture_output=True,
    text=True,
    timeout=900,
  )


@pytest.mark.slow
@needs_mkdocs
def test_the_site_builds_with_no_warning_and_documents_every_transform(tmp_path):
  out = build(REPO, str(tmp_path / 'site'))
  assert out.returncode == 0, out.stderr[-5000:]
  assert 'WARNING' not in out.stderr, out.stderr[-5000:]
  with open(tmp_path / 'site' / 'api' / 'sync' / 'index.html') as f:
    html = f.read()
  for public in jd.sync.__all__:
    assert f'id="jaxdist.sync.{public}"' in html, f'the API reference lacks jd.sync.{public}'
  prompts = html.count('<span class="gp">&gt;&gt;&gt; </span>')  # `Example:` rendered as code
  assert prompts > 3 * len(jd.sync.__all__) // 2, prompts
  assert (tmp_path / 'site' / 'results' / 'compression.png').exists()
  assert (tmp_path / 'site' / 'changelog' / 'index.html').exists()


@pytest.mark.slow
@needs_mkdocs
def test_a_broken_link_or_api_reference_fails_the_build(tmp_path):
  root = tmp_path / 'repo'
  shutil.copytree(DOCS, root / 'docs')
  shutil.copytree(RESULTS, root / 'experiments' / 'results', ignore=shutil.ignore_patterns('gpu'))
  for f in ('mkdocs.yml', 'CHANGELOG.md'):
    shutil.copy(os.path.join(REPO, f), root / f)
  os.symlink(os.path.join(REPO, 'jaxdist'), root / 'jaxdist')
  page = root / 'docs' / 'methods' / 'compression.md'
  with open(page, 'a') as f:
    f.write('\nSee [the missing page](no-such-page.md) and [`nothing`][jaxdist.sync.nothing].\n')
  out = build(str(root), str(tmp_path / 'broken'))
  assert out.returncode != 0
  assert "'no-such-page.md'" in out.stderr, out.stderr[-3000:]
  assert 'jaxdist.sync.nothing' in out.stderr, out.stderr[-3000:]
