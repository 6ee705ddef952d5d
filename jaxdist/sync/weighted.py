"""Weighted gradient all-reduce: workers with different batch sizes (dynamic batching, ScaDLES)."""

from __future__ import annotations

from typing import Any, NamedTuple

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


def weighted_mean(tree: Any, weight: jax.Array, axis_name: comm.AxisName) -> tuple[Any, Any]:
  """Σ_k w_k x_k / Σ_k w_k over `axis_name` in one all-reduce of w_k x_k and w_k; 0 if Σ w = 0.

  Args:
    tree: this worker's x_k.
    weight: its w_k, a float32 scalar.
    axis_name: the worker axis (or tuple of axes).

  Returns:
    (the weighted mean, in each leaf's dtype; the all-reduce's `comm.Transfer`).
  """
  scaled = jax.tree.map(lambda x: x * weight.astype(x.dtype), tree)
  (total, weights), wire = comm.psum((scaled, weight), axis_name)
  safe = jnp.where(weights > 0, weights, 1.0)
  return jax.tree.map(lambda t: (t / safe.astype(t.dtype)).astype(t.dtype), total), wire


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
    mean, wire = weighted_mean(updates, b, axis_name)
    return mean, WeightedState(wire)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def sit_out(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """`inner` (an optimizer), on a step where the worker trains on no examples: nothing.

  A worker that takes fewer inner steps than the others (heterogeneity-aware
  DiLoCo, `diloco(by_steps=True)`) sits the rest out: the step's optax extra
  argument `weight` (its examples, as a counted step passes it) is 0. Then
  the update is zero and the state stays as it was, so a momentum does not
  move the model and Adam's moments and step count do not advance; with
  weight > 0, or none given, it is `inner`'s. `inner` runs either way (its
  result is dropped), so the step's program is the same for every worker.

  Args:
    inner: the optax transformation to sit out.

  Returns:
    An `optax.GradientTransformationExtraArgs`: put it where `inner` was.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> tx = sit_out(optax.sgd(1.0, momentum=0.5))
    >>> g = {'x': jnp.array(1.0)}
    >>> u, s = tx.update(g, tx.init(g), weight=3)
    >>> u0, s0 = tx.update(g, s, weight=0)  # sat out: no update, the momentum kept
    >>> float(u['x']), float(u0['x']), bool(s0[0].trace['x'] == s[0].trace['x'])
    (-1.0, 0.0, True)

  References:
    HeLoCo: heterogeneous workers in DiLoCo (the window of steps a round).
    2026. https://arxiv.org/abs/2606.00271
  """
  inner = optax.with_extra_args_support(inner)

  def update_fn(updates, state, params=None, *, weight=None, **extra_args):
    new_updates, new_state = inner.update(updates, state, params, **extra_args)
    if weight is None:
      return new_updates, new_state
    active = jnp.asarray(weight) > 0
    new_updates = jax.tree.map(lambda u: jnp.where(active, u, jnp.zeros_like(u)), new_updates)
    new_state = jax.tree.map(lambda n, o: jnp.where(active, n, o), new_state, state)
    return new_updates, new_state

  return optax.GradientTransformationExtraArgs(inner.init, update_fn)
