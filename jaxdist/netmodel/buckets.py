"""Gradient bucketing plans: WFBP / MG-WFBP / fixed-size buckets, and their timeline.

Wait-free backpropagation (WFBP) all-reduces each layer's gradient as soon
as backprop produces it, overlapping communication with the backward pass of
earlier layers; every all-reduce pays the startup latency α, so small layers
are better merged. MG-WFBP (Shi, Chu, Li 2019) merges layer l into l − 1 when
l's all-reduce could not start before l − 1's gradient is ready anyway, or
when waiting for it costs less than one α. `threshold_buckets` is the
fixed-size alternative (PyTorch DDP's 25 MB buckets).

Layers here are parameter leaves; `forward_order` finds the order the
forward pass uses them in (backward runs the other way), and
`layer_flops` the forward FLOPs each one's operation costs, from which
`backward_times` splits a measured backward time.

`jaxdist.sync.bucketed_allreduce(buckets)` then issues one all-reduce per
bucket. XLA runs the step as one program, so the overlap itself is modelled
(`timeline`), not executed, on a CPU host.

Reference: Shi, Chu, Li. MG-WFBP: Efficient Data Communication for
Distributed Synchronous SGD Algorithms. INFOCOM 2019.
https://arxiv.org/abs/1811.11141
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex

Buckets = list[list[int]]


# --- what the model looks like -----------------------------------------------------------


def _first_uses(
  fn: Callable[..., Any], params: Any, *args: Any
) -> tuple[list[int | None], list[float]]:
  """Per parameter leaf: index of the first equation using it, and its FLOPs there."""
  closed = jax.make_jaxpr(fn)(params, *args)
  jaxpr = closed.jaxpr
  n = len(jax.tree.leaves(params))
  position = {v: i for i, v in enumerate(jaxpr.invars[:n])}
  first: list[int | None] = [None] * n
  flops = [0.0] * n

  def visit(eqns, alias, base):
    for k, eqn in enumerate(eqns):
      step = base + k
      for j, var in enumerate(eqn.invars):
        leaf = alias.get(var) if not isinstance(var, jex.Literal) else None
        if leaf is None:
          continue
        if first[leaf] is None:
          first[leaf] = step
        out = math.prod(eqn.outvars[0].aval.shape) if eqn.outvars else 0
        name = eqn.primitive.name
        if name == 'dot_general':
          (lhs_contract, rhs_contract), _ = eqn.params['dimension_numbers']
          contract = rhs_contract if j == 1 else lhs_contract
          size = math.prod(eqn.invars[j].aval.shape[d] for d in contract)
          flops[leaf] += 2.0 * out * size
        elif name == 'conv_general_dilated':
          kernel = eqn.invars[1].aval.shape
          per_out = math.prod(kernel) / kernel[-1] if j == 1 else 1.0
          flops[leaf] += 2.0 * out * per_out
        else:
          flops[leaf] += float(out)
      for sub in _subjaxprs(eqn):
        inner = {
          iv: alias[ov] for iv, ov in zip(sub.invars, eqn.invars, strict=False) if ov in alias
        }
        visit(sub.eqns, inner, step)

  visit(jaxpr.eqns, position, 0)
  return first, flops


def _subjaxprs(eqn):
  for value in eqn.params.values():
    for item in value if isinstance(value, (list, tuple)) else (value,):
      if isinstance(item, jex.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jex.Jaxpr):
        yield item


def forward_order(fn: Callable[..., Any], params: Any, *args: Any) -> list[int]:
  """Leaf indices of `params` in the order `fn(params, *args)` first uses them.

  Args:
    fn: the forward pass, traced once (`jax.make_jaxpr`).
    params: its parameters (leaves in `jax.tree.leaves` order).
    *args: its other arguments (e.g. a batch of inputs).

  Returns:
    A permutation of the leaf indices; leaves never used come last.
  """
  first, _ = _first_uses(fn, params, *args)
  return sorted(range(len(first)), key=lambda i: (first[i] is None, first[i] or 0, i))


def layer_flops(fn: Callable[..., Any], params: Any, *args: Any) -> list[float]:
  """Forward FLOPs of the operations each leaf of `params` enters (matmuls, convs, adds).

  Args:
    fn: the forward pass, traced once.
    params: its parameters.
    *args: its other arguments.

  Returns:
    FLOPs per leaf, in leaf order (an element-wise operation counts one per
    output element).
  """
  return _first_uses(fn, params, *args)[1]


def backward_times(flops: Sequence[float], total_s: float) -> list[float]:
  """A measured backward time split over layers in proportion to their FLOPs.

  Args:
    flops: per layer, e.g. `layer_flops`.
    total_s: the measured backward seconds.

  Returns:
    Seconds per layer, in the same order.
  """
  total = sum(flops) or 1.0
  return [total_s * f / total for f in flops]


# --- plans -----------------------------------------------------------------------------------


def _check_sizes(nbytes, order):
  if sorted(order) != list(range(len(nbytes))):
    raise ValueError(f'order must be a permutation of the {len(nbytes)} layers')


def threshold_buckets(
  nbytes: Sequence[int], bucket_bytes: int, order: Sequence[int] | None = None
) -> Buckets:
  """Fixed-size buckets in backward order: a bucket closes once it holds `bucket_bytes`.

  Args:
    nbytes: bytes of each layer (leaf).
    bucket_bytes: the size at which a bucket closes (> 0).
    order: the forward order of the layers (None: leaf order).

  Returns:
    The buckets, lists of leaf indices, in the order backprop fills them.
  """
  if bucket_bytes <= 0:
    raise ValueError(f'bucket_bytes must be > 0, got {bucket_bytes}')
  order = list(order) if order is not None else list(range(len(nbytes)))
  _check_sizes(nbytes, order)
  buckets, current, size = [], [], 0
  for leaf in reversed(order):
    current.append(leaf)
    size += nbytes[leaf]
    if size >= bucket_bytes:
      buckets.append(current)
      current, size = [], 0
  if current:
    buckets.append(current)
  return buckets


def _ready_times(backward_s, order):
  """When each layer's gradient is ready, backward running from the last layer to the first."""
  ready, clock = {}, 0.0
  for leaf in reversed(order):
    clock += backward_s[leaf]
    ready[leaf] = clock
  return ready


def mgwfbp_buckets(
  nbytes: Sequence[int],
  backward_s: Sequence[float],
  alpha: float,
  beta: float,
  order: Sequence[int] | None = None,
) -> Buckets:
  """MG-WFBP's merge of layers into buckets, in backward order.

  Walks the layers from the output down; layer l joins the bucket of the
  layer before it in backprop (l − 1 in forward order) when l's all-reduce
  would not have started by the time l − 1's gradient is ready, or when the
  link would be idle for less than α between them.

  Args:
    nbytes: bytes of each layer (leaf).
    backward_s: backward seconds of each layer (`backward_times`).
    alpha: α of one all-reduce, seconds.
    beta: β of one all-reduce, seconds per byte.
    order: the forward order of the layers (None: leaf order).

  Returns:
    The buckets, lists of leaf indices, in backward order.
  """
  order = list(order) if order is not None else list(range(len(nbytes)))
  _check_sizes(nbytes, order)
  if alpha < 0 or beta < 0:
    raise ValueError(f'alpha and beta must be >= 0, got {alpha}, {beta}')
  ready = _ready_times(backward_s, order)
  backward = list(reversed(order))
  buckets = [[backward[0]]]
  link_free = 0.0
  start = ready[backward[0]]
  for leaf in backward[1:]:
    size = sum(nbytes[i] for i in buckets[-1])
    if start > ready[leaf] or ready[leaf] - start < alpha:
      buckets[-1].append(leaf)  # merge: the bucket now waits for this layer
      start = max(link_free, ready[leaf])
    else:
      link_free = start + alpha + beta * size
      buckets.append([leaf])
      start = max(link_free, ready[leaf])
  return buckets


def per_layer_buckets(order: Sequence[int]) -> Buckets:
  """WFBP without merging: every layer its own all-reduce, in backward order.

  Args:
    order: the forward order of the layers.

  Returns:
    One bucket per layer.
  """
  return [[leaf] for leaf in reversed(list(order))]


def timeline(
  buckets: Buckets,
  nbytes: Sequence[int],
  backward_s: Sequence[float],
  alpha: float,
  beta: float,
  order: Sequence[int] | None = None,
  overlap: bool = True,
) -> float:
  """Seconds from the start of backprop until the last bucket's all-reduce ends.

  With `overlap`, a bucket's all-reduce starts once all its gradients are
  ready and the link is free; without, all of them run after backprop.
  (α, β here are the per-message cost of one all-reduce, e.g. a ring's
  2(N−1)α and 2(N−1)/N·β.)

  Args:
    buckets: the plan, as the functions above give it.
    nbytes: bytes of each layer.
    backward_s: backward seconds of each layer.
    alpha: α of one all-reduce.
    beta: β of one all-reduce.
    order: the forward order of the layers (None: leaf order).
    overlap: start each all-reduce during backprop.

  Returns:
    Seconds, at least the backward pass's.
  """
  order = list(order) if order is not None else list(range(len(nbytes)))
  ready = _ready_times(backward_s, order)
  end_of_backprop = sum(backward_s)
  clock = 0.0 if overlap else end_of_backprop
  for bucket in buckets:
    cost = alpha + beta * sum(nbytes[i] for i in bucket)
    start = max(clock, max(ready[i] for i in bucket)) if overlap else clock
    clock = start + cost
  return max(clock, end_of_backprop)
