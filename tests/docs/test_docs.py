"""Every public transform documents itself: a runnable Example and a paper link.

The Examples themselves run under `pytest --doctest-modules` (see pyproject.toml).
"""

import inspect

import pytest

from jaxdist import sync

# Transforms whose docs another change is writing; empty once they have landed.
PENDING: set[str] = set()


def transforms() -> list[str]:
  """Names in `jaxdist.sync.__all__` of lowercase functions returning a GradientTransformation."""
  return [
    name
    for name in sync.__all__
    if name[0].islower()
    and inspect.isfunction(getattr(sync, name))
    and 'GradientTransformation' in str(inspect.signature(getattr(sync, name)).return_annotation)
  ]


def test_the_transforms_are_found():
  assert {'allreduce', 'compressed_allreduce', 'local_sgd', 'skip_nonfinite'} <= set(transforms())
  assert 'gradient_norm' not in transforms()  # returns an array


@pytest.mark.parametrize('name', sorted(set(transforms()) - PENDING))
def test_docstring_has_an_example_and_a_link(name):
  doc = inspect.getdoc(getattr(sync, name)) or ''
  assert '>>>' in doc, f'{name}: no runnable Example'
  assert 'http' in doc, f'{name}: no link to its paper'
