"""Dense gradient all-reduce: bulk-synchronous data parallelism (BSP)."""

from __future__ import annotations

from typing import NamedTuple

import optax

from jaxdist import comm


class AllReduceState(NamedTuple):
  """State of `allreduce`.

  Attributes:
    wire: the all-reduce of the last step (payload = the gradient's bytes).
      Per-worker.
  """

  wire: comm.Transfer


def allreduce(*, axis_name: comm.AxisName) -> optax.GradientTransformation:
  """Replaces each worker's gradient by the mean over `axis_name`.

  The data-parallel baseline (BSP, as PyTorch DDP does): one all-reduce of the
  whole gradient per step,

    g_n <- (1/N) Σ_m g_m   for every worker n.

  With N workers each on a batch of b examples, this is the gradient of the
  mean loss over the global batch of N·b.

  Args:
    axis_name: the worker axis (or tuple of axes) to average over.

  Returns:
    An `optax.GradientTransformation`; place it before the optimizer:
    `optax.chain(jd.sync.allreduce(axis_name=workers.axis_name), optax.sgd(0.1))`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = optax.chain(sync.allreduce(axis_name=runtime.AXES), optax.sgd(1.0))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=4)
    >>> run({'x': jnp.arange(4.0)})['x']  # every worker steps on the mean, 1.5
    Array([-1.5, -1.5, -1.5, -1.5], dtype=float32)

  References:
    Li et al. PyTorch Distributed: Experiences on Accelerating Data Parallel
    Training. VLDB 2020. https://arxiv.org/abs/2006.15704
    Goyal et al. Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour.
    2017. https://arxiv.org/abs/1706.02677
  """

  def init_fn(params):
    return AllReduceState(comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0))

  def update_fn(updates, state, params=None):
    del params, state
    updates, wire = comm.pmean(updates, axis_name)
    return updates, AllReduceState(wire)

  return optax.GradientTransformation(init_fn, update_fn)
