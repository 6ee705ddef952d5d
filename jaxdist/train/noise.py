"""Scavenger's gradient-noise indicator γ, measured beside training.

`make_noise_step` is the device's part (each worker's squared gradient norm
and that of the aggregated gradient, at the workers' current parameters);
`Noise` runs it every `exp.noise_every` steps, off the clock, and smooths
its ratio on the host.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from jaxdist import control
from jaxdist.runtime import DATA, Workers
from jaxdist.train.experiment import Experiment
from jaxdist.train.step import Loss, TrainState, cross_entropy, loss_fn
from jaxdist.train.steplog import Clock


def make_noise_step(
  model: nn.Module,
  workers: Workers,
  counted: bool = False,
  per_worker: str = 'auto',
  loss: Loss = cross_entropy,
) -> Callable[..., tuple[jax.Array, jax.Array]]:
  """A jitted `(state, x, y[, counts]) -> (mean_k ‖g_k‖², ‖ḡ‖²)`: Scavenger's noise ingredients.

  Each worker's gradient g_k of its loss on its batch at its own parameters
  (the gradient the train step would compute on the same batch), and the
  aggregated gradient ḡ (the mean over workers; with `counted`, weighted
  by the counts, as `weighted_allreduce` aggregates). The numerator is the
  plain mean (1/K) Σ_k ‖g_k‖², as Eq. 2 of Scavenger writes it. With equal
  weights γ = numerator / denominator ≥ 1: 1 when the workers' gradients
  agree, K when they are orthogonal, and more than K when they point
  against each other (non-IID shards do: digits with one label per worker
  gives γ/K ≈ 3).

  A measurement beside training, not part of it: it runs a forward and
  backward pass of its own and one all-reduce that the ledger does not
  count (the trainer runs it every `config.noise_every` steps, off the
  clock). With `per_worker='device'` the state holds one model per device
  (`make_init`), and each worker's gradient is taken at its device's.
  """

  def one(params, model_state, x, y, *count):
    mean = lambda p: loss_fn(model, p, model_state, x, y, True, *count, loss=loss)[0]
    grads = jax.grad(mean)(params)
    return grads, optax.tree.norm(grads, squared=True)

  def device(state: TrainState, x, y, *counts):
    replica, axis = (state.params, state.model_state), 0
    if per_worker == 'device':  # the device's one model, every worker's
      replica, axis = jax.tree.map(lambda a: a[0], replica), None
    in_axes = (axis, axis, *(0 for _ in (x, y, *counts)))
    grads, sq = jax.vmap(one, in_axes)(*replica, x, y, *counts)
    w = counts[0].astype(jnp.float32) if counts else jnp.ones(sq.shape, jnp.float32)
    weighted = jax.tree.map(lambda g: jnp.tensordot(w, g.astype(jnp.float32), axes=1), grads)
    sq_sum, w_sum, g_sum = jax.lax.psum((jnp.sum(sq), jnp.sum(w), weighted), DATA)
    mean = jax.tree.map(lambda g: g / jnp.maximum(w_sum, 1e-30), g_sum)
    return sq_sum / workers.count, optax.tree.norm(mean, squared=True)

  mapped = jax.shard_map(
    device, mesh=workers.mesh, in_specs=P(DATA), out_specs=P(), check_vma=False
  )

  def noise(state, x, y, *counts):
    if counted != bool(counts):
      raise ValueError(f'this step was made with counted={counted}: pass counts iff counted')
    return mapped(state, x, y, *counts)

  return jax.jit(noise, out_shardings=workers.replicated)


class Noise:
  """Scavenger's gradient-noise indicator γ, measured every `exp.noise_every` steps.

  `jd.train.step.make_noise_step` computes mean_k ‖g_k‖² and ‖ḡ‖² on the
  step's batch at the workers' current parameters, beside training; a host
  `jd.control.noise_meter` smooths each, and γ is their ratio (>= 1; K if orthogonal).
  """

  def __init__(self, exp: Experiment):
    self.exp, self.every = exp, exp.noise_every
    self.meter = control.noise_meter(exp.noise_decay)
    self.state = self.meter.init()
    self.step = None
    if self.every:
      self.step = make_noise_step(
        exp.model, exp.workers, counted=exp.counted, per_worker=exp.way_asked
      )

  def measure(self, t: int, state, batch: tuple[jax.Array, ...], clock: Clock) -> dict[str, float]:
    """The record's noise fields at step t (0-based), if it is measured; else {}.

    The steps before it finish on the clock; the measurement is off it. A
    measurement that is not finite (a run that diverged) is recorded but not
    smoothed in: the run goes on and its loss says what happened.
    """
    if not self.due(t):
      return {}
    jax.block_until_ready(state)
    with clock.paused():
      args = batch[: 3 if self.exp.counted else 2]
      worker_sq, mean_sq = jax.device_get(self.step(state, *args))
    if np.isfinite(worker_sq) and np.isfinite(mean_sq):
      self.state = self.meter.update(self.state, worker_sq, mean_sq)
    return {'noise_worker_sq': float(worker_sq), 'noise_mean_sq': float(mean_sq), **self.summary()}

  def due(self, t: int) -> bool:
    """Whether step t (0-based) measures the noise (a collective of its own, before the step)."""
    return bool(self.every) and t % self.every == 0

  def summary(self) -> dict[str, float]:
    if not self.state.count:
      return {}
    k = self.exp.workers.count
    gamma = control.scavenger.gamma(self.state)
    return {'gamma': gamma, 'gamma_normalized': gamma / k}
