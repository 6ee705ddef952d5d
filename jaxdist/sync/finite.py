"""Skip non-finite steps on every worker or on none: the flag is agreed by a 4-byte all-reduce.

`optax.apply_if_finite` decides per worker. Around a transform that
communicates, one worker with a NaN gradient skips the collective while the
others enter it: on real devices they wait for it forever (an XLA rendezvous
that never completes); with simulated workers the healthy ones receive the
NaN through the mean. `skip_nonfinite` sums every worker's "my gradient is
not finite" flag first (as SelSync sums its flags), so all workers take the
same branch of a `lax.cond`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdist import comm


class SkipNonfiniteState(NamedTuple):
  """State of `skip_nonfinite` (field names as `optax.ApplyIfFiniteState`).

  Attributes:
    notfinite_count: consecutive skipped steps. Replicated.
    last_finite: whether the last step was applied (every worker's gradient
      finite). Replicated.
    total_notfinite: skipped steps so far. Replicated.
    inner_state: the wrapped transform's state; unchanged by a skipped step,
      except that its transfers count 0. Per-worker.
    wire: the all-reduce of the 4-byte flags, every step. Per-worker.
  """

  notfinite_count: jax.Array
  last_finite: jax.Array
  total_notfinite: jax.Array
  inner_state: Any
  wire: tuple


def all_finite(tree: Any) -> jax.Array:
  """Whether every element of every leaf of `tree` is finite.

  Args:
    tree: a pytree of arrays (gradients, updates, parameters).

  Returns:
    A scalar bool array: True when no leaf holds a NaN or an infinity.
  """
  return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)], bool))


def skip_nonfinite(
  inner: optax.GradientTransformation, *, axis_name: comm.AxisName
) -> optax.GradientTransformation:
  """Applies `inner` only when every worker's gradient is finite; otherwise no worker steps.

  Each step every worker contributes f_n = [g_n has a NaN or Inf] to one
  4-byte all-reduce; with F = Σ_n f_n,

    F = 0:  (u, s) <- inner.update(g, s, params)   (its collectives run)
    F > 0:  u <- 0, s unchanged                     (no collective of inner runs)

  The predicate is agreed (`comm.agree`), so the skipped branch of the
  `lax.cond` really does not run, on every worker alike. Unlike
  `optax.apply_if_finite` there is no `max_consecutive_errors`: a step with
  a non-finite gradient anywhere is never applied.

  Safe orders: wrap the whole chain, communication included, e.g.
  `skip_nonfinite(optax.chain(allreduce(axis_name=ax), optax.sgd(0.1)),
  axis_name=ax)`. Never put `optax.apply_if_finite` (or any per-worker
  `lax.cond`) around a transform that communicates: workers then disagree
  about whether the collective runs (a deadlock on real devices).
  `optax.apply_if_finite` around the optimizer only, after the collective,
  cannot deadlock, but workers then skip alike only if the NaN reached all
  of them through the collective (a dense mean carries it; a sparsified one
  may not).

  Args:
    inner: the transform (chain) to apply; it may communicate over
      `axis_name`.
    axis_name: the worker axis (or tuple of axes).

  Returns:
    An `optax.GradientTransformation` that replaces `inner`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> ax = runtime.AXES
    >>> tx = sync.skip_nonfinite(
    ...   optax.chain(sync.allreduce(axis_name=ax), optax.sgd(1.0)), axis_name=ax
    ... )
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> run({'x': jnp.array([1.0, jnp.nan])})['x']  # one NaN: nobody steps
    Array([0., 0.], dtype=float32)
    >>> run({'x': jnp.array([1.0, 3.0])})['x']  # all finite: the chain's step
    Array([-2., -2.], dtype=float32)
    >>> run.history  # flags every step; the gradient all-reduce only in step 2
    [[0, 1], [1, 1]]

  Reference:
    The flags all-reduce follows SelSync's 4-byte flags: Tyagi & Swany.
    Accelerating Distributed ML Training via Selective Synchronization. IEEE
    CLUSTER 2023. https://arxiv.org/abs/2307.07950 (the skip itself is
    optax's `apply_if_finite`, https://optax.readthedocs.io).

  (Longer than 80 lines only for its documentation; the steps are helpers.)
  """

  def init_fn(params):
    return SkipNonfiniteState(
      notfinite_count=jnp.zeros([], jnp.int32),
      last_finite=jnp.array(True),
      total_notfinite=jnp.zeros([], jnp.int32),
      inner_state=inner.init(params),
      wire=(comm.transfer(comm.ALL_REDUCE, 4, 0),),
    )

  def update_fn(updates, state, params=None):
    bad = (~all_finite(updates)).astype(jnp.int32)
    total, flag_wire = comm.psum(bad, axis_name)
    finite = comm.agree(total == 0, axis_name)

    def apply(updates, inner_state):
      return inner.update(updates, inner_state, params)

    def skip(updates, inner_state):
      return optax.tree.zeros_like(updates), comm.silence(inner_state)

    updates, inner_state = lax.cond(finite, apply, skip, updates, state.inner_state)
    notfinite = jnp.where(finite, 0, optax.safe_increment(state.notfinite_count))
    new = SkipNonfiniteState(
      notfinite_count=notfinite,
      last_finite=finite,
      total_notfinite=state.total_notfinite + (~finite).astype(jnp.int32),
      inner_state=inner_state,
      wire=(flag_wire,),
    )
    return updates, new

  return optax.GradientTransformation(init_fn, update_fn)
