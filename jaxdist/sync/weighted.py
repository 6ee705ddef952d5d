"""Weighted gradient all-reduce: workers with different batch sizes (dynamic batching, ScaDLES)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm

COUNT_BYTES = 4  # the count travels as one float32 beside the gradient


class WeightedState(NamedTuple):
  """State of `weighted_allreduce`.

  Attributes:
    wire: the all-reduce of the last step (payload = the gradient's bytes + 4
      for the count). Per-worker.
  """

  wire: comm.Transfer


def weighted_allreduce(*, axis_name: comm.AxisName) -> optax.GradientTransformationExtraArgs:
  """Replaces each worker's gradient by the count-weighted mean over `axis_name`.

  Worker k's gradient g_k is the mean over its b_k examples; the result is

    ḡ = Σ_k b_k g_k / Σ_k b_k = Σ_k λ_k g_k,   λ_k = b_k / Σ_i b_i,

  the gradient of the mean loss over all Σ_k b_k examples (Eqs. 2–3 of Tyagi
  & Sharma, 2020; Eq. 4 of ScaDLES). One all-reduce carries b_k g_k and b_k
  together (the gradient's bytes + 4), so no worker needs Σ b in advance.
  With equal counts it is `allreduce`. A step whose counts are all 0 gives 0.

  The count reaches the transform as optax's extra argument `weight`:
  `tx.update(grads, state, params, weight=b_k)` (`optax.chain` forwards it to
  the transforms that take it), a scalar per worker, traced, so changing the
  batches never recompiles.

  Args:
    axis_name: the worker axis (or tuple of axes) to average over.

  Returns:
    An `optax.GradientTransformationExtraArgs`; place it before the optimizer:
    `optax.chain(weighted_allreduce(axis_name=workers.axis_name), optax.sgd(0.1))`.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> tx = weighted_allreduce(axis_name='w')
    >>> grads, counts = {'x': jnp.array([1.0, 4.0])}, jnp.array([3, 1])
    >>> step = lambda g, b: tx.update(g, tx.init(g), weight=b)[0]
    >>> jax.vmap(step, axis_name='w')(grads, counts)['x']  # (3·1 + 1·4) / 4
    Array([1.75, 1.75], dtype=float32)

  References:
    Tyagi & Sharma. Taming Resource Heterogeneity In Distributed ML Training
    With Dynamic Batching. IEEE ACSOS 2020.
    https://sahiltyagi4.github.io/files/resource_taming.pdf
  """

  def init_fn(params):
    return WeightedState(comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params) + COUNT_BYTES, 0))

  def update_fn(updates, state, params=None, *, weight=None, **extra_args):
    del state, params, extra_args
    if weight is None:
      raise ValueError(
        "weighted_allreduce needs each worker's example count: "
        'call update(updates, state, params, weight=b_k)'
      )
    b = jnp.asarray(weight, jnp.float32)
    if b.ndim:
      raise ValueError(f'weight must be a scalar per worker, got shape {b.shape}')
    scaled = jax.tree.map(lambda g: g * b.astype(g.dtype), updates)
    (total, count), wire = comm.psum((scaled, b), axis_name)  # one all-reduce: b_k g_k and b_k
    safe = jnp.where(count > 0, count, 1.0)
    mean = jax.tree.map(lambda s: (s / safe.astype(s.dtype)).astype(s.dtype), total)
    return mean, WeightedState(wire)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
