"""Run a transform over N workers, step by step: for tests, doctests and notebooks.

`Run(tx, params, workers=8)` places `workers` copies of `params` on a
`runtime.layout` (by default all simulated on one device, so no device flags
are needed), and each call applies the transform's updates to every worker's
parameters:

  >>> import jax.numpy as jnp, optax
  >>> from jaxdist import runtime, sync, testing
  >>> tx = optax.chain(sync.allreduce(axis_name=runtime.AXES), optax.sgd(1.0))
  >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=4)
  >>> run({'x': jnp.arange(4.0)})['x']  # every worker steps on the mean gradient
  Array([-1.5, -1.5, -1.5, -1.5], dtype=float32)
  >>> run.history  # per step, how often each Transfer in the state ran
  [[1]]

Per-worker arrays (gradients, `run.params`, `run.state`, `run.updates`) carry
a leading axis of size `workers`. optax's extra arguments go as keywords,
`run(grads, weight=counts)`: a scalar reaches every worker, an array with a
leading `workers` axis one value each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm, runtime, sync


class Run:
  """A transform applied to every worker's parameters, step by step.

  Attributes:
    workers: the `runtime.Workers` layout.
    params: every worker's parameters, [workers, ...] per leaf.
    state: every worker's transform state, [workers, ...] per leaf.
    updates: the last step's updates, [workers, ...] per leaf.
    history: per step, the count of each `comm.Transfer` in the state (of
      worker 0), in `comm.find_transfers` order.
  """

  def __init__(
    self,
    tx: optax.GradientTransformation,
    params: Any,
    *,
    workers: int = 8,
    devices: int = 1,
  ):
    """Starts every worker from `params` (one worker's tree) and `tx.init`.

    Args:
      tx: the transform; it communicates over `runtime.AXES`.
      params: the starting parameters, the same for every worker.
      workers: how many workers.
      devices: how many devices they run on (`workers` must be a multiple).
    """
    self.workers = runtime.layout(workers, devices=devices)
    self.params = jax.tree.map(lambda x: jnp.broadcast_to(x, (workers, *jnp.shape(x))), params)
    self.state = jax.vmap(tx.init)(self.params)
    self.updates = None
    self.history: list[list[int]] = []

    def step(grads, state, params, extra):
      updates, state = tx.update(grads, state, params, **extra)
      return sync.apply_updates(params, updates, state), updates, state

    self.step = jax.jit(self.workers.map(step, in_axes=(0, 0, 0, 0)))

  def args(self, grads: Any, **extra: Any) -> list[Any]:
    """The step's arguments (gradients, state, parameters, extra), on the workers' devices.

    Args:
      grads: every worker's gradients, [workers, ...] per leaf.
      **extra: optax's extra arguments: a scalar is broadcast to every
        worker, an array has a leading `workers` axis.

    Returns:
      [grads, state, params, extra], each placed with `workers.sharding`.
    """
    n = self.workers.count
    extra = {
      k: jnp.broadcast_to(v, (n,)) if jnp.ndim(v) == 0 else jnp.asarray(v) for k, v in extra.items()
    }
    trees = (grads, self.state, self.params, extra)
    return [jax.device_put(t, self.workers.sharding) for t in trees]

  def __call__(self, grads: Any, **extra: Any) -> Any:
    """One step with every worker's `grads` ([workers, ...] per leaf); the new parameters."""
    self.params, self.updates, self.state = self.step(*self.args(grads, **extra))
    self.history.append([int(t.count[0]) for t in comm.find_transfers(self.state)])
    return self.params

  def steps(self, n: int, grads: Callable[[int], Any]) -> Any:
    """`n` steps, step t with gradients `grads(t)`; the parameters after the last.

    Args:
      n: how many steps.
      grads: gives step t's gradients, [workers, ...] per leaf.

    Returns:
      Every worker's parameters after the last step, as `run.params`.
    """
    for t in range(n):
      self(grads(t))
    return self.params

  def hlo(self, grads: Any, *, compiled: bool = True, **extra: Any) -> str:
    """The step's HLO text, after XLA's passes (`compiled`) or as lowered.

    Args:
      grads: gradients to lower the step with (their shapes and dtypes count).
      compiled: the optimised module XLA runs; False: the lowered one.
      **extra: optax's extra arguments, as for a call.

    Returns:
      The HLO module as text (`jd.comm.hlo.collectives` reads it).
    """
    lowered = self.step.lower(*self.args(grads, **extra))
    if compiled:
      return lowered.compile().as_text()
    return lowered.compiler_ir('hlo').as_hlo_text()
