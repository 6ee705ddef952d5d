"""Cutting a model into Streaming DiLoCo's fragments: whole units, balanced or strided."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

Layout = str | Callable[[Any], Any]
LAYOUTS = ('sequential', 'strided')


def fragment_labels(params: Any, fragments: int, layout: Layout = 'sequential') -> Any:
  """The fragment of every leaf of `params`: a tree of ints in [0, fragments).

  A fragment is made of whole units: the entries of the tree's top level
  (below any chain of single-entry containers, such as flax's `{'params':
  ...}`), so a transformer's `block_i`, `embed`, `ln_f` each go whole into
  one fragment, as the paper groups whole blocks. Where there are fewer units
  than fragments, every leaf is a unit. Units are ordered by name, numbers
  compared as numbers (`block_2` before `block_10`).

  - 'sequential': consecutive units, cut into `fragments` groups (none
    empty) so that the largest group's bytes, the peak a step sends, is as
    small as it can be.
  - 'strided': unit i goes to fragment i mod `fragments` (the paper's
    strided layout).
  - a function: `layout(params)` returns the fragment of each leaf, as a tree
    of ints with the structure of `params` or a prefix of it.

  Args:
    params: the parameters (shapes and dtypes are enough).
    fragments: P.
    layout: 'sequential', 'strided' or a function (above).

  Returns:
    A tree with the structure of `params`, an int per leaf.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxdist import sync
    >>> params = {f'block_{i}': jnp.zeros(4) for i in range(3)} | {'embed': jnp.zeros(2)}
    >>> sync.fragment_labels(params, 2)
    {'block_0': 0, 'block_1': 0, 'block_2': 1, 'embed': 1}
    >>> sync.fragment_labels(params, 2, 'strided')
    {'block_0': 0, 'block_1': 1, 'block_2': 0, 'embed': 1}
  """
  check_layout(layout)
  cut = Cut.of(params, fragments, layout)
  return jax.tree.unflatten(cut.treedef, list(cut.labels))


def check_layout(layout: Any) -> None:
  if not callable(layout) and layout not in LAYOUTS:
    raise ValueError(f'layout must be one of {LAYOUTS} or a function, got {layout!r}')


@dataclasses.dataclass(frozen=True)
class Cut:
  """The fragment of every leaf (in flatten order) of trees with one structure."""

  treedef: Any
  labels: tuple[int, ...]

  @classmethod
  def of(cls, params: Any, fragments: int, layout: Layout) -> Cut:
    leaves, treedef = jax.tree.flatten(params)
    if len(leaves) < fragments:
      raise ValueError(
        f'fragments must be <= the number of parameter arrays ({len(leaves)}), got {fragments}'
      )
    if callable(layout):
      labels = _called(layout, params, treedef)
    else:
      units = _units(params)
      if len(units) < fragments:
        units = [[i] for i in range(len(leaves))]
      sizes = [sum(leaves[i].size * jnp.dtype(leaves[i].dtype).itemsize for i in u) for u in units]
      of_unit = _sequential(sizes, fragments) if layout == 'sequential' else None
      labels = [0] * len(leaves)
      for k, unit in enumerate(units):
        for i in unit:
          labels[i] = of_unit[k] if of_unit else k % fragments
    empty = sorted(set(range(fragments)) - set(labels))
    if empty or any(not 0 <= x < fragments for x in labels):
      raise ValueError(
        f'every leaf needs a fragment in [0, {fragments}) and every fragment a leaf; '
        f'got labels {labels} (empty fragments: {empty})'
      )
    return cls(treedef, tuple(labels))

  def part(self, tree: Any, p: int) -> Any:
    """`tree` with the leaves of fragment p, `optax.MaskedNode` elsewhere."""
    leaves = self.treedef.flatten_up_to(tree)
    kept = [x if f == p else optax.MaskedNode() for x, f in zip(leaves, self.labels, strict=True)]
    return self.treedef.unflatten(kept)

  def merge(self, tree: Any, part: Any, p: int) -> Any:
    """`tree` with fragment p's leaves taken from `part` (as `self.part` made it)."""
    leaves = self.treedef.flatten_up_to(tree)
    new = iter(jax.tree.leaves(part))
    out = [next(new) if f == p else x for x, f in zip(leaves, self.labels, strict=True)]
    return self.treedef.unflatten(out)

  def flags(self, on: jax.Array, p: jax.Array | int) -> Any:
    """A boolean per leaf: `on` for fragment p's leaves, False elsewhere."""
    return self.treedef.unflatten([on & (p == f) for f in self.labels])


def _called(layout: Callable[[Any], Any], params: Any, treedef: Any) -> list[int]:
  """The labels `layout(params)` gives, broadcast from a prefix to every leaf."""
  given = layout(params)
  full = jax.tree.map(lambda f, sub: jax.tree.map(lambda _: f, sub), given, params)
  return [int(x) for x in treedef.flatten_up_to(full)]


def _units(params: Any) -> list[list[int]]:
  """Leaf indices of each unit (top-level entry below single-entry chains), in name order."""
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  depth = 0
  while all(len(p) > depth + 1 for p in paths) and len({p[depth] for p in paths}) == 1:
    depth += 1
  units: dict[str, list[int]] = {}
  for i, path in enumerate(paths):
    name = jax.tree_util.keystr((path[depth],)) if len(path) > depth else str(i)
    units.setdefault(name, []).append(i)
  return [units[name] for name in sorted(units, key=_natural)]


def _natural(name: str) -> list[Any]:
  """A sort key comparing the digits in `name` as numbers."""
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name)]


def _sequential(sizes: Sequence[int], fragments: int) -> list[int]:
  """Consecutive groups (none empty) with the smallest largest sum: the group of each size."""
  n = len(sizes)
  prefix = np.concatenate([[0], np.cumsum(sizes)])
  # best[k][i]: the smallest largest sum of the first i sizes in k groups; cut[k][i]: last start
  best = np.full((fragments + 1, n + 1), np.inf)
  cut = np.zeros((fragments + 1, n + 1), int)
  best[0][0] = 0
  for k in range(1, fragments + 1):
    for i in range(k, n + 1):
      for j in range(k - 1, i):
        worst = max(best[k - 1][j], prefix[i] - prefix[j])
        if worst < best[k][i]:
          best[k][i], cut[k][i] = worst, j
  groups, i = [0] * n, n
  for k in range(fragments, 0, -1):
    j = cut[k][i]
    groups[j:i] = [k - 1] * (i - j)
    i = j
  return groups
