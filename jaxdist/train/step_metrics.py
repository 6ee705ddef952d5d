"""The train step's metrics: replicated by the step, or per worker and reduced on the host.

`make_train_step` (jaxdist/train/step.py) returns its metrics either
replicated (`replicated`: one all-gather of the per-worker figures inside the
step) or as they are (`raw`, a `RawMetrics` sharded over the workers), which
`reduce_metrics` turns into the same dict on the host after a fetch, and
`metrics_gather` replicates across processes for many steps at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import comm, probes
from jaxdist.runtime import Workers


def runs_of(runs: int, split: bool) -> list[int]:
  """Per part of the chain's state, how often each of its transfers runs per entry."""
  return [r for _, r in _parts(None, runs, split)]


def replicated(opt_state, per_worker, counts, workers: Workers, per_entry: int,
               split: bool) -> dict[str, Any]:  # fmt: skip
  """The step's metrics, replicated: its `RawMetrics` replicated by one all-gather (not one
  collective each), then reduced on the devices as `reduce_metrics` does on the host."""
  gathered = _replicated_together(raw(opt_state, per_worker, counts, split), workers.replicated)
  return _reduce(gathered, runs_of(per_entry, split), jnp)


def _parts(opt_state, runs: int, split: bool) -> list[tuple[Any, int]]:
  """(part of the optimizer state, how often each of its transfers runs per entry), in tree
  order: a device's transfer runs once per worker (`runs`), a worker's once (a split
  chain's first part)."""
  if split:
    return [(None if opt_state is None else opt_state[0], 1),
            (None if opt_state is None else opt_state[1], runs)]  # fmt: skip
  return [(opt_state, runs)]


class RawMetrics(NamedTuple):
  """A step's metrics before reduction (`make_train_step(replicated=False)`), per worker.

  Every array's leading axis is the workers' (a device's, for a transform
  that runs once per device), sharded over them.

  Attributes:
    per_worker: `loss` and, where reported, `accuracy`, each [W].
    counts: () or (the per-worker example counts [W],) with `counted`.
    wire: per part of the chain's state, each `Transfer`'s count per entry.
    probes: the chain's probes (`jaxdist.probes.metrics`), per worker.
  """

  per_worker: dict[str, Any]
  counts: tuple
  wire: list
  probes: dict[str, Any]


def raw(opt_state, per_worker, counts, split: bool) -> RawMetrics:
  """The step's `RawMetrics`: its per-worker figures as they are, nothing sent."""
  wire = [[t.count for t in comm.find_transfers(part)] for part, _ in _parts(opt_state, 1, split)]
  return RawMetrics(per_worker, tuple(counts), wire, probes.metrics(opt_state))


def reduce_metrics(raw: RawMetrics, runs: Sequence[int]) -> dict[str, Any]:
  """The metrics of a replicated step (`make_train_step`), from its per-worker figures fetched.

  Computed in NumPy in float32, as the device computes them: `loss` and
  `accuracy` averaged over workers (over examples, with counts), `wire` each
  transfer's runs summed over workers, and the probes as they are.

  Args:
    raw: the step's `RawMetrics`, on the host (NumPy arrays).
    runs: per part of the chain's state, how often its transfers run per entry (the raw
      step's `runs` attribute).

  Returns:
    The metrics dict.
  """
  return _reduce(raw, runs, np)


def _reduce(raw: RawMetrics, runs: Sequence[int], xp) -> dict[str, Any]:
  """`reduce_metrics` in `xp` (NumPy on the host, jax.numpy on the devices), in float32."""
  f32 = xp.float32
  if raw.counts:  # a mean over examples: workers weighted by their batches
    counts = xp.asarray(raw.counts[0]).astype(f32)
    w = counts / xp.maximum(xp.sum(counts), f32(1.0))
    metrics = {k: xp.sum(xp.asarray(v, f32) * w, dtype=f32) for k, v in raw.per_worker.items()}
  else:
    metrics = {k: xp.mean(xp.asarray(v, f32), dtype=f32) for k, v in raw.per_worker.items()}
  metrics['wire'] = tuple(xp.sum(c) * r for cs, r in zip(raw.wire, runs, strict=True) for c in cs)
  if xp is np:
    metrics['wire'] = tuple(int(c) for c in metrics['wire'])
  metrics.update({k: xp.asarray(v) for k, v in raw.probes.items()})
  return metrics


def metrics_gather(raws: Sequence[RawMetrics], workers: Workers) -> Callable:
  """A compiled program that replicates steps' `RawMetrics` like `raws` on every process.

  One all-gather for them all (their 32-bit figures side by side), where a
  replicated step has one of its own each.

  Args:
    raws: steps' raw metrics (or shape-dtype structs of them), as many as
      the program is to take.
    workers: the layout.

  Returns:
    The program: a list of that many `RawMetrics` -> the same, replicated.
  """
  gather = jax.jit(
    lambda trees: _replicated_together(trees, workers.replicated), out_shardings=workers.replicated
  )
  return gather.lower(list(raws)).compile()


def _replicated_together(tree, replicated):
  """`tree`'s arrays (each sharded over its leading axis) replicated, by one all-gather per
  leading size: their 32-bit words side by side in one [leading, words] array (other
  arrays, and scalars, are left to XLA).

  Reduced apart, the step's metrics were up to four collectives (the mean loss and
  accuracy, the summed transfer counts, the gathered norms and gains): XLA combines
  all-reduces, not an all-reduce with all-gathers. On the CPU each collective is a
  rendezvous of all the devices' threads: in `experiments/bench_peers.py` (8 devices on a
  2-core CPU) the digits CNN's Top-k step took 1.26x the dense step's time with the four
  collectives and 1.10x with one (`experiments/results/peers_earlier_runs.md`).
  """
  leaves, treedef = jax.tree.flatten(tree)
  groups: dict[int, list[int]] = {}
  for i, a in enumerate(leaves):
    if a.ndim and a.dtype.itemsize == 4:
      groups.setdefault(a.shape[0], []).append(i)
  out = list(leaves)
  for lead, members in groups.items():
    words = [jax.lax.bitcast_convert_type(leaves[i], jnp.uint32).reshape(lead, -1) for i in members]
    packed = jax.lax.with_sharding_constraint(jnp.concatenate(words, axis=1), replicated)
    start = 0
    for i, w in zip(members, words, strict=True):
      a = leaves[i]
      part = packed[:, start : start + w.shape[1]].reshape(a.shape)
      out[i] = jax.lax.bitcast_convert_type(part, a.dtype)
      start += w.shape[1]
  return jax.tree.unflatten(treedef, out)
