"""Collectives over named axes, with exact accounting of what goes on the wire.

Workers live on one or more named axes: mesh axes of `jax.shard_map` (real
devices) and `jax.vmap` axes (simulated workers). The wrappers here accept a
single name or a tuple such as `('data', 'sim')` and behave the same for both
kinds.

Every collective a transform issues is described by a `Transfer`: the HLO
collective it lowers to, the bytes each worker contributes (its operand, the
"payload"), how many times it ran this step, and, on a cluster of nodes, which
workers and link it spans (all workers, a node's, or a rail's). Kind and size are static
(pytree metadata, exact Python ints); only the count is traced, so a collective
inside a skipped `lax.cond` branch counts zero. What a transfer costs on a
network (bytes each worker sends, seconds) is `jaxdist.netmodel`'s business.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxdist.comm.packing import packed
from jaxdist.runtime import DATA, SIM

AxisName = str | tuple[str, ...]

# HLO op names, as they appear in lowered/compiled modules.
ALL_REDUCE = 'all-reduce'
ALL_GATHER = 'all-gather'
ALL_TO_ALL = 'all-to-all'
PERMUTE = 'collective-permute'
KINDS = (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, PERMUTE)
# Which workers and link a collective spans (`Transfer.link`): None, all workers over the
# run's network; 'intra', the workers of one node over the intra-node link; 'inter', the
# workers of one rail (one per node, same local rank) over the inter-node link.
INTRA = 'intra'
INTER = 'inter'
LINKS = (None, INTRA, INTER)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Transfer:
  """One collective that a transform issues per step.

  Attributes:
    kind: the HLO collective (`all-reduce`, `all-gather`, `all-to-all`,
      `collective-permute`). Static.
    nbytes: bytes each worker puts into the collective (its operand). Static.
    count: times the collective ran in the last step; 0 where a `lax.cond`
      skipped it. Per-worker int32.
    op: what the collective does when that differs from its kind, for the
      network model: 'broadcast' for an all-reduce in which only one worker
      contributes (a real system would broadcast). Static.
    overlap: the method does not wait for it: it runs behind the next step's
      compute (delay-tolerant methods), so the network model charges only
      what the compute does not hide. Static.
    link: which workers and link it spans, on a cluster of nodes: None, all
      workers over the run's network; 'intra', the m workers of one node over
      the intra-node link; 'inter', the n workers of one rail (the same local
      rank on every node) over the inter-node link, the m rails sharing the
      node's NIC (`jaxdist.netmodel.rail_network`). Static.
  """

  kind: str = dataclasses.field(metadata=dict(static=True))
  nbytes: int = dataclasses.field(metadata=dict(static=True))
  count: jax.Array
  op: str | None = dataclasses.field(default=None, metadata=dict(static=True))
  overlap: bool = dataclasses.field(default=False, metadata=dict(static=True))
  link: str | None = dataclasses.field(default=None, metadata=dict(static=True))


def transfer(
  kind: str,
  nbytes: int,
  ran: jax.typing.ArrayLike = 1,
  op: str | None = None,
  link: str | None = None,
) -> Transfer:
  """A `Transfer` of `kind` with `nbytes` payload that ran `ran` times, over `link`.

  Args:
    kind: the HLO collective, one of `KINDS`.
    nbytes: the bytes each worker puts in (its operand).
    ran: how many times it ran this step (traced; 0 in a skipped branch).
    op: what it does when that differs from `kind` (e.g. 'broadcast').
    link: which workers and link it spans, one of `LINKS` (None: all
      workers over the run's network).

  Returns:
    The `Transfer`, its count an int32 array.

  Raises:
    ValueError: if `kind` or `link` is not one of those listed.
  """
  if kind not in KINDS:
    raise ValueError(f'kind must be one of {KINDS}, got {kind!r}')
  if link not in LINKS:
    raise ValueError(f'link must be one of {LINKS}, got {link!r}')
  count = jnp.asarray(ran, jnp.int32)
  return Transfer(kind=kind, nbytes=int(nbytes), count=count, op=op, link=link)


def overlapped(tree: Any) -> Any:
  """`tree` with every `Transfer` in it marked as overlapping the next step's compute.

  Args:
    tree: a pytree holding `Transfer`s (e.g. a transform's state).

  Returns:
    The same tree, each `Transfer` with `overlap=True`.
  """
  is_t = lambda x: isinstance(x, Transfer)
  mark = lambda x: dataclasses.replace(x, overlap=True) if is_t(x) else x
  return jax.tree.map(mark, tree, is_leaf=is_t)


def ran(t: Transfer, times: jax.typing.ArrayLike) -> Transfer:
  """`t` with its count set to `times` (e.g. 0 for a collective that did not run).

  Args:
    t: a `Transfer`.
    times: how many times it ran (an int or a traced int array).

  Returns:
    A copy of `t` whose count is `times` as int32.
  """
  return dataclasses.replace(t, count=jnp.asarray(times, jnp.int32))


def tree_nbytes(tree: Any) -> int:
  """Bytes of all array leaves of `tree` (shapes and dtypes only).

  Args:
    tree: a pytree of arrays or `jax.ShapeDtypeStruct`s.

  Returns:
    The total size in bytes, a Python int.
  """
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _bound_size(name: str) -> int | None:
  """The size of axis `name` where it is bound here (a mesh or vmap axis), else None."""
  try:
    return lax.axis_size(name)
  except NameError:  # jax's "unbound axis name"
    return None


def _names(axis_name: AxisName, subgroup: bool = False) -> tuple[str, ...]:
  """`axis_name` as a tuple of names, checked to be bound and, in a `Workers` step, whole.

  Misuse is refused at trace time, in one line: a name not bound here (the
  transform's `update` called outside the map that names its workers), and
  an `axis_name` that names the devices' axis `data` but not the simulated
  workers' axis `sim` while a device holds several (the collective would
  reach the same simulated worker of every device, not every worker).
  `subgroup` lets a collective over one level of a hierarchy (e.g. the
  inter-node gather of `hitopk_allreduce`) name the device axis alone.
  """
  names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
  for name in names:
    if _bound_size(name) is None:
      raise ValueError(
        f'axis name {name!r} is not bound here: call tx.update inside workers.map(...) '
        f'(jd.runtime.Workers.map), or inside jax.shard_map / jax.vmap with that axis name'
      )
  per_device = _bound_size(SIM)
  if not subgroup and DATA in names and SIM not in names and (per_device or 1) > 1:
    raise ValueError(
      f'axis_name={axis_name!r} reaches only the devices, not the {per_device} simulated '
      f'workers on each (axis {SIM!r}): pass axis_name=workers.axis_name (jd.runtime.AXES)'
    )
  return names


def axis_size(axis_name: AxisName, *, subgroup: bool = False) -> int:
  """Number of workers on `axis_name` (static; call inside the mapped step).

  Args:
    axis_name: the worker axis, or a tuple of axes (their sizes multiply).
    subgroup: the size of one level of a hierarchy, which may name the
      device axis without the simulated one (see `_names`).

  Returns:
    The number of workers, a Python int.
  """
  return math.prod(lax.axis_size(n) for n in _names(axis_name, subgroup))


def axis_index(axis_name: AxisName, *, subgroup: bool = False) -> jax.Array:
  """This worker's index on `axis_name`, row-major over a tuple of axes.

  Args:
    axis_name: the worker axis, or a tuple of axes.
    subgroup: index within one level of a hierarchy, as in `axis_size`.

  Returns:
    A scalar int32 array, from 0 to `axis_size(axis_name)` − 1.
  """
  return lax.axis_index(_names(axis_name, subgroup))


def psum(
  tree: Any, axis_name: AxisName, *, subgroup: bool = False, pack: bool | None = None
) -> tuple[Any, Transfer]:
  """Sum of `tree` over workers: one all-reduce of the whole tree.

  Args:
    tree: this worker's pytree of arrays.
    axis_name: the worker axis, or a tuple of axes.
    subgroup: a sum over one level of a hierarchy, which may name the
      device axis without the simulated one (see `_names`).
    pack: send the tree as one buffer per dtype (`packed`; None: where the
      backend pays per operand, `packs`).

  Returns:
    (the sum, the same on every worker; its `Transfer`, an all-reduce of the
    tree's bytes).
  """
  names = _names(axis_name, subgroup)
  return packed(lambda x: lax.psum(x, names), tree, pack), transfer(ALL_REDUCE, tree_nbytes(tree))


def pmean(
  tree: Any, axis_name: AxisName, *, subgroup: bool = False, pack: bool | None = None
) -> tuple[Any, Transfer]:
  """Mean of `tree` over workers: one all-reduce of the whole tree.

  Args:
    tree: this worker's pytree of arrays.
    axis_name: the worker axis, or a tuple of axes.
    subgroup: a mean over one level of a hierarchy, as in `psum`.
    pack: as in `psum`.

  Returns:
    (the mean, in each leaf's dtype; its `Transfer`, an all-reduce of the
    tree's bytes).
  """
  total, sent = psum(tree, axis_name, subgroup=subgroup, pack=pack)
  n = axis_size(axis_name, subgroup=subgroup)
  return jax.tree.map(lambda x: (x / n).astype(x.dtype), total), sent


def pmax(
  tree: Any, axis_name: AxisName, *, subgroup: bool = False, pack: bool | None = None
) -> tuple[Any, Transfer]:
  """Elementwise maximum of `tree` over workers: one all-reduce (with `max`) of the tree.

  Args:
    tree: this worker's pytree of arrays.
    axis_name: the worker axis, or a tuple of axes.
    subgroup: a maximum over one level of a hierarchy, as in `psum`.
    pack: as in `psum`.

  Returns:
    (the maximum, the same on every worker; its `Transfer`).
  """
  names = _names(axis_name, subgroup)
  return packed(lambda x: lax.pmax(x, names), tree, pack), transfer(ALL_REDUCE, tree_nbytes(tree))


def all_gather(
  tree: Any, axis_name: AxisName, *, subgroup: bool = False, pack: bool | None = None
) -> tuple[Any, Transfer]:
  """Stacks every worker's `tree` along a new leading axis of size N.

  Row i is worker i in `axis_index` order. Over a tuple of axes the gather is
  nested innermost-first (jax cannot all-gather over a vmap and a mesh axis in
  one call); the payload is each worker's own tree either way. `subgroup`:
  a gather over one level of a hierarchy, which may name the device axis
  without the simulated one (see `_names`).

  Args:
    tree: this worker's pytree of arrays.
    axis_name: the worker axis, or a tuple of axes.
    subgroup: a gather over one level of a hierarchy (above).
    pack: as in `psum`; leaves of one width share a buffer whatever their dtypes (a
      gather moves bits: `packed(bits=True)`).

  Returns:
    (the tree with each leaf stacked to [N, *shape]; its `Transfer`, an
    all-gather of the tree's bytes).
  """
  names = _names(axis_name, subgroup)

  def gather(x):
    for name in reversed(names):
      x = lax.all_gather(x, name)
    lead = math.prod(x.shape[: len(names)])
    return x.reshape((lead, *x.shape[len(names) :]))

  return packed(gather, tree, pack, bits=True), transfer(ALL_GATHER, tree_nbytes(tree))


def all_to_all(tree: Any, axis_name: AxisName, *, subgroup: bool = False) -> tuple[Any, Transfer]:
  """Sends row j of every leaf to worker j: worker i gets every worker's row i.

  Every leaf of `tree` has a leading axis of size N (the workers on
  `axis_name`); the result has the same shapes, its row m being worker m's
  row i on worker i (rows in `axis_index` order). The transpose of the
  [worker, row] grid: the exchange of a reduce-scatter, without the sum.

  Over a tuple of axes the exchange is composed one axis at a time,
  innermost first (jax's `all_to_all` takes one axis; on a mesh × vmap
  layout only the device axis leaves the device), which is the same
  permutation of the rows. The payload is each worker's operand either way:
  the whole `tree` (a worker keeps 1/N of it and sends (N−1)/N, which is
  what `jaxdist.netmodel` charges an all-to-all).

  Args:
    tree: a pytree of arrays whose leading axes are all N.
    axis_name: the worker axis, or a tuple such as `jd.runtime.AXES`.
    subgroup: an exchange over one level of a hierarchy, which may name the
      device axis without the simulated one (see `_names`).

  Returns:
    (the exchanged tree, `Transfer(all-to-all, payload = tree's bytes)`).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdist import comm
    >>> f = lambda x: comm.all_to_all(x, 'w')[0]
    >>> jax.vmap(f, axis_name='w')(jnp.array([[0, 1], [10, 11]]))  # worker i, row j
    Array([[ 0, 10],
           [ 1, 11]], dtype=int32)
  """
  names = _names(axis_name, subgroup)
  sizes = [lax.axis_size(n) for n in names]
  n = math.prod(sizes)

  def exchange(x):
    if jnp.ndim(x) < 1 or x.shape[0] != n:
      raise ValueError(
        f'all_to_all needs leaves with a leading axis of the {n} workers on {axis_name!r}, '
        f'got shape {jnp.shape(x)}'
      )
    grid = x.reshape((*sizes, *x.shape[1:]))
    for axis in reversed(range(len(names))):
      grid = lax.all_to_all(grid, names[axis], split_axis=axis, concat_axis=axis, tiled=True)
    return grid.reshape(x.shape)

  return jax.tree.map(exchange, tree), transfer(ALL_TO_ALL, tree_nbytes(tree))


def _vmap_axes(names: tuple[str, ...]) -> tuple[str, ...]:
  """The names among `names` that are vmap axes (not axes of the enclosing mesh)."""
  mesh_axes = set(jax.sharding.get_abstract_mesh().axis_names)
  return tuple(n for n in names if n not in mesh_axes)


def agree(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """x, which every worker holds equally, as one value rather than one per worker.

  Under `vmap`, a per-worker value is batched even when all workers agree on
  it, and a `lax.cond` on a batched predicate becomes a `select` that runs
  both branches, collectives included. This reduces over the vmap axes only
  (no communication between devices), so the result is unbatched and a
  `lax.cond` on it really skips the branch not taken.

  Args:
    x: a value equal on every worker (e.g. a step count or a predicate).
    axis_name: the worker axis, or a tuple of axes.

  Returns:
    `x`, unbatched over the vmap axes of `axis_name` (their maximum; a bool
    stays a bool).
  """
  vmapped = _vmap_axes(_names(axis_name))
  if not vmapped:
    return x
  if x.dtype == jnp.bool_:
    return lax.pmax(x.astype(jnp.int32), vmapped) > 0
  return lax.pmax(x, vmapped)


def shift(tree: Any, offset: int, axis_name: AxisName) -> tuple[Any, Transfer]:
  """Every worker's `tree` from the worker `offset` places before it (cyclically).

  Worker i receives worker (i - offset) mod N's tree: one neighbour exchange
  (a collective-permute of the tree's bytes per worker). Over (devices,
  simulated) axes the shift is a roll inside each device plus, where it
  crosses devices, a permute over the device axis (two when the shift does
  not divide evenly into whole devices).

  Args:
    tree: this worker's pytree of arrays.
    offset: how many places back to receive from (negative: forward).
    axis_name: one axis, or (outer, inner) axes such as (devices, simulated).

  Returns:
    (the tree worker (i − offset) mod N sent; its `Transfer`, a
    collective-permute of the tree's bytes).

  Raises:
    ValueError: if `axis_name` names more than two axes.
  """
  names = _names(axis_name)
  sent = transfer(PERMUTE, tree_nbytes(tree))
  if len(names) == 1:
    n = lax.axis_size(names[0])
    pairs = [(i, (i + offset) % n) for i in range(n)]
    return jax.tree.map(lambda x: lax.ppermute(x, names[0], pairs), tree), sent
  if len(names) != 2:
    raise ValueError(f'shift supports one axis or (outer, inner) axes, got {names}')
  outer, inner = names
  n_out, n_in = lax.axis_size(outer), lax.axis_size(inner)
  whole, part = divmod(offset % (n_out * n_in), n_in)

  def roll(x, axis, by, size):
    if by % size == 0:
      return x
    return lax.ppermute(x, axis, [(i, (i + by) % size) for i in range(size)])

  me = lax.axis_index(inner)

  def one(x):
    near = roll(roll(x, outer, whole, n_out), inner, part, n_in)  # from (d - whole, s - part)
    if part == 0:
      return near
    far = roll(roll(x, outer, whole + 1, n_out), inner, part, n_in)  # borrow one device
    return jnp.where(me < part, far, near)

  return jax.tree.map(one, tree), sent


def total_bytes(transfers: Iterable[Transfer], counts: Sequence[int] | None = None) -> int:
  """Payload bytes of `transfers`, each weighted by its count (or `counts`).

  Args:
    transfers: `Transfer`s, e.g. from `find_transfers`.
    counts: how many times each ran (None: each one's own `count`).

  Returns:
    Σ nbytes × count, a Python int.
  """
  transfers = list(transfers)
  if counts is None:
    counts = [int(t.count) for t in transfers]
  return sum(t.nbytes * int(c) for t, c in zip(transfers, counts, strict=True))


def silence(tree: Any) -> Any:
  """`tree` with every `Transfer` in it marked as not having run (count 0).

  Args:
    tree: a pytree holding `Transfer`s.

  Returns:
    The same tree, each `Transfer`'s count zero.
  """
  is_t = lambda x: isinstance(x, Transfer)
  return jax.tree.map(
    lambda x: ran(x, jnp.zeros_like(x.count)) if is_t(x) else x, tree, is_leaf=is_t
  )


def find_transfers(tree: Any) -> list[Transfer]:
  """Every `Transfer` inside `tree` (e.g. an optimizer state), in tree order.

  Args:
    tree: any pytree.

  Returns:
    A list of the `Transfer`s found.
  """
  leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Transfer))
  return [x for x in leaves if isinstance(x, Transfer)]
