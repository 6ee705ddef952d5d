r"""Copies the measured tables in experiments/results/*.md into the docs pages.

A page of docs/ marks each generated table with a pair of comments naming its file:

  <!-- results: compression.md -->
  ...replaced by the file's contents...
  <!-- /results -->

  python experiments/docs_tables.py           # rewrite the pages under docs/
  python experiments/docs_tables.py --check   # exit 1 if a page is stale

The results files are written by the runs themselves
(`experiments/compare.py --results=...`), never by hand. The copy shows the
command as one runs it from a clone: a `--results=` path outside the
repository (where a run on another machine wrote it) becomes the file's place
in experiments/results/, and `--torch_python=` the `$TORCH_PYTHON` of
`make bench-peers`. The plots beside the tables are not copied: the site
serves experiments/results/*.png as results/*.png (docs/_ext/results.py).
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, 'experiments', 'results')
DOCS = os.path.join(ROOT, 'docs')
BLOCK = re.compile(r'(<!-- results: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results -->)', re.S)
_RESULTS_FLAG = re.compile(r'--results=/\S*?([^/\s`]+\.md)')
_TORCH_FLAG = re.compile(r'--torch_python=/[^\s`]+')


def portable(name: str, text: str) -> str:
  """`text` of results file `name` with the paths of the machine that ran it replaced."""
  text = _RESULTS_FLAG.sub(f'--results=experiments/results/{name}', text)
  return _TORCH_FLAG.sub('--torch_python=$TORCH_PYTHON', text)


def table(name: str) -> str:
  """What a page shows between the markers of results file `name`."""
  path = os.path.join(RESULTS, name)
  if not os.path.exists(path):
    raise SystemExit(f'error: a page names {name}, which is not in {RESULTS}')
  with open(path) as f:
    return portable(name, f.read().strip()) + '\n'


def render(page: str) -> str:
  """`page` with every results block replaced by its file's contents."""
  return BLOCK.sub(lambda m: m[1] + table(m['name']) + m[4], page)


def pages() -> list[str]:
  """Every markdown page under docs/."""
  return sorted(glob.glob(os.path.join(DOCS, '**', '*.md'), recursive=True))


def main(argv: list[str]) -> int:
  stale = []
  for path in pages():
    with open(path) as f:
      page = f.read()
    fresh = render(page)
    if fresh == page:
      continue
    if '--check' in argv:
      stale.append(os.path.relpath(path, ROOT))
    else:
      with open(path, 'w') as f:
        f.write(fresh)
  if stale:
    print(f'error: {", ".join(stale)}: tables differ from experiments/results; run '
          'python experiments/docs_tables.py', file=sys.stderr)  # fmt: skip
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
