"""The README: short, its example runs, its links lead somewhere, no development history."""

import os
import re
import subprocess
import sys

import pytest
from docs_pages import README, name, pages, prose, python_blocks, read

from conftest import REPO, xla_flags_for_tests

LINK = re.compile(r'\]\(([^)\s]+)\)')
# development history: issue numbers, commit hashes, paths of the machine that ran something
HISTORY = re.compile(
  r'\bissue \d+|\b(?:commit|at) (?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b|/root/|/work/|\.\./shared/|'
  r'what changed since',
  re.I,
)


def test_the_readme_is_at_most_200_lines():
  assert len(read(README).splitlines()) <= 200


def slug(heading: str) -> str:
  """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
  text = re.sub(r'[^\w\s-]', '', heading.strip().lower())
  return re.sub(r'[-\s]+', '-', text).strip('-')


def anchors(path: str) -> set[str]:
  text = re.sub(r'^```.*?^```', '', read(path), flags=re.S | re.M)
  return {slug(h) for h in re.findall(r'^#{1,6} (.+)$', text, re.M)}


def test_the_readme_links_lead_to_files_and_headings_of_the_repository():
  links = [u for u in LINK.findall(read(README)) if '://' not in u]
  assert any(u.startswith('docs/') for u in links)
  for url in links:
    path, _, anchor = url.partition('#')
    target = os.path.join(REPO, path)
    if path != 'LICENSE':  # the packaging's file, beside this one
      assert os.path.exists(target), f'README.md links {url}: no {path}'
    if anchor:
      assert anchor in anchors(target), f'README.md links {url}: {path} has no such heading'


@pytest.mark.parametrize('path', [README, *pages()], ids=name)
def test_no_development_history_in_the_prose(path):
  if name(path) == os.path.join('docs', 'changelog.md'):
    return  # the changelog is where history goes
  found = HISTORY.findall(prose(read(path)))
  assert not found, f'{name(path)}: {found} (history goes to CHANGELOG.md)'


@pytest.mark.slow
def test_the_readme_example_runs_and_learns(tmp_path):
  (code,) = python_blocks(read(README))
  assert 'jd.runtime.layout' in code and 'workers.map' in code and 'make_init' in code
  assert 'compressed_allreduce' in code and 'diloco' in code
  env = {**os.environ, 'PYTHONPATH': REPO, 'XLA_FLAGS': xla_flags_for_tests()}
  out = subprocess.run(
    [sys.executable, '-c', code], cwd=tmp_path, env=env, capture_output=True, text=True,
    timeout=600,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-3000:]
  loss = float(re.search(r'loss after 200 steps: ([\d.]+)', out.stdout)[1])
  assert loss < 0.8 * 2.303, f'the loss of 10 classes barely fell from ln 10: {loss}'
