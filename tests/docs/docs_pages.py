"""The docs pages and the README as the docs tests read them."""

import glob
import importlib.util
import os
import re

from conftest import REPO

DOCS = os.path.join(REPO, 'docs')
README = os.path.join(REPO, 'README.md')
RESULTS = os.path.join(REPO, 'experiments', 'results')
BLOCK = re.compile(r'<!-- results: ([\w.-]+) -->\n(.*?)<!-- /results -->', re.S)
PYTHON = re.compile(r'^```python\n(.*?)^```', re.S | re.M)


def pages() -> list[str]:
  """Every markdown page of the site."""
  return sorted(glob.glob(os.path.join(DOCS, '**', '*.md'), recursive=True))


def read(path: str) -> str:
  with open(path) as f:
    return f.read()


def name(path: str) -> str:
  return os.path.relpath(path, REPO)


def python_blocks(text: str) -> list[str]:
  """The ```python blocks of a page, in order (```py blocks are fragments)."""
  return PYTHON.findall(text)


def prose(text: str) -> str:
  """`text` without its generated results blocks (the runs' own provenance)."""
  return BLOCK.sub('', text)


def docs_tables():
  """experiments/docs_tables.py as a module."""
  spec = importlib.util.spec_from_file_location(
    'docs_tables', os.path.join(REPO, 'experiments', 'docs_tables.py')
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
