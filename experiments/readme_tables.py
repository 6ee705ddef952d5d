r"""Copies the measured tables in experiments/results/*.md into README.md.

The README marks each generated table with a pair of comments naming its file:

  <!-- results: compression.md -->
  ...replaced by the file's contents...
  <!-- /results -->

  python experiments/readme_tables.py           # rewrite README.md
  python experiments/readme_tables.py --check   # exit 1 if README.md is stale

The results files are written by the runs themselves
(`experiments/compare.py --results=...`), never by hand.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, 'experiments', 'results')
BLOCK = re.compile(r'(<!-- results: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results -->)', re.S)


def render(readme: str) -> str:
  """`readme` with every results block replaced by its file's contents."""

  def fill(m: re.Match) -> str:
    path = os.path.join(RESULTS, m['name'])
    if not os.path.exists(path):
      raise SystemExit(f'error: README.md names {m["name"]}, which is not in {RESULTS}')
    with open(path) as f:
      body = f.read().strip() + '\n'
    return m[1] + body + m[4]

  return BLOCK.sub(fill, readme)


def main(argv: list[str]) -> int:
  path = os.path.join(ROOT, 'README.md')
  with open(path) as f:
    readme = f.read()
  fresh = render(readme)
  if '--check' in argv:
    if fresh != readme:
      print('error: README.md tables differ from experiments/results; run '
            'python experiments/readme_tables.py', file=sys.stderr)  # fmt: skip
      return 1
    return 0
  with open(path, 'w') as f:
    f.write(fresh)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
