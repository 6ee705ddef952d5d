"""Gradient bucketing: one all-reduce per bucket of gradients (WFBP / MG-WFBP / DDP buckets).

Wait-free backpropagation all-reduces each bucket of gradients as soon as
backprop has produced it. The plans (which leaves go together) come from
`jaxdist.netmodel` (`threshold_buckets`, `mgwfbp_buckets`,
`per_layer_buckets`), and so does the modelled overlap (`timeline`): XLA runs
the step as one program, so the overlap is modelled, not executed, on a CPU
host. Measured (`experiments/overlap_probe.py`, 2 hosts at 100 Mbit/s): XLA's
CPU runtime does not run an all-reduce beside independent compute of the
same program (hidden -0.08 of it, against 0.78 for the same all-reduce as a
program of its own on a thread of its own), and it has no asynchronous
all-reduce; executing WFBP there would take the backward pass cut into
programs, which is not built. On a GPU, XLA's asynchronous collectives can
overlap inside one program; untested here.

Reference: Shi, Chu, Li. MG-WFBP: Efficient Data Communication for
Distributed Synchronous SGD Algorithms. INFOCOM 2019.
https://arxiv.org/abs/1811.11141
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax
from jax.flatten_util import ravel_pytree

from jaxdist import comm
from jaxdist.netmodel import Buckets
from jaxdist.sync._averaging import check_averager


def _check_buckets(buckets, num_leaves: int | None = None) -> None:
  if not buckets or any(not b for b in buckets):
    raise ValueError('buckets must be a non-empty list of non-empty lists of leaf indices')
  leaves_in = sorted(i for b in buckets for i in b)
  expected = list(range(num_leaves if num_leaves is not None else len(leaves_in)))
  if leaves_in != expected:
    raise ValueError(f'buckets must cover the leaves 0..{len(expected) - 1} exactly once each')


class BucketedState(NamedTuple):
  """State of `bucketed_allreduce`.

  Attributes:
    buckets: per bucket, the averager's state (() when dense). Per-worker.
    wire: per bucket, its dense all-reduce (() with an averager). Per-worker.
  """

  buckets: tuple
  wire: tuple


def bucketed_allreduce(
  buckets: Buckets | Callable[[Any], Buckets],
  *,
  axis_name: comm.AxisName,
  averager: optax.GradientTransformation | None = None,
) -> optax.GradientTransformation:
  """Averages gradients over workers one bucket at a time.

  Each bucket (a list of leaf indices of the gradient tree) goes as one
  all-reduce of its gradients flattened into one vector:
  mean_b = (1/N) Σ_n concat(g_n[i] for i in b). The numbers are those of one
  dense all-reduce; only the collectives' count and sizes change. With an
  `averager` (e.g. `compressed_allreduce(topk(0.01), ...)`), each bucket's
  leaves go through the averager instead, each bucket with its own averager
  state (a compressed averager then compresses each bucket on its own).

  Args:
    buckets: a partition of the leaf indices (e.g. from
      `jaxdist.netmodel.mgwfbp_buckets`), or a function of the parameters
      that returns one.
    axis_name: the worker axis (or tuple of axes).
    averager: a transform that averages over `axis_name`, applied per bucket
      (default: a dense all-reduce per bucket).

  Returns:
    An `optax.GradientTransformation`; put it before the optimizer.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.bucketed_allreduce([[1], [0]], axis_name=runtime.AXES)
    >>> run = testing.Run(tx, {'a': jnp.zeros(2), 'b': jnp.zeros(())}, workers=2)
    >>> run({'a': jnp.array([[1.0, 2.0], [3.0, 4.0]]), 'b': jnp.array([0.0, 1.0])})['b']
    Array([0.5, 0.5], dtype=float32)

  Reference:
    Shi, Chu, Li. MG-WFBP. INFOCOM 2019. https://arxiv.org/abs/1811.11141
  """
  plan = buckets if callable(buckets) else (lambda tree: buckets)
  if not callable(buckets):
    _check_buckets(buckets)
  check_averager(averager)

  def split(tree):
    leaves = jax.tree.leaves(tree)
    chosen = plan(tree)
    _check_buckets(chosen, len(leaves))
    return leaves, chosen, [[leaves[i] for i in b] for b in chosen]

  def init_fn(params):
    _, _, groups = split(params)
    if averager is not None:
      return BucketedState(tuple(averager.init(g) for g in groups), ())
    wire = tuple(comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(g), 0) for g in groups)
    return BucketedState((), wire)

  def update_fn(updates, state, params=None):
    del params
    leaves, chosen, groups = split(updates)
    out, treedef = list(leaves), jax.tree.structure(updates)
    states, wire = [], []
    for b, (bucket, group) in enumerate(zip(chosen, groups, strict=True)):
      if averager is not None:
        mean, s = averager.update(group, state.buckets[b])
        states.append(s)
      else:
        flat, unravel = ravel_pytree(group)
        total, sent = comm.pmean(flat, axis_name)
        wire.append(sent)
        mean = unravel(total)
      for i, m in zip(bucket, mean, strict=True):
        out[i] = m
    return jax.tree.unflatten(treedef, out), BucketedState(tuple(states), tuple(wire))

  return optax.GradientTransformation(init_fn, update_fn)
