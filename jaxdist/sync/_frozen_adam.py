"""Pieces shared by 1-bit Adam and 0/1 Adam: Adam's moments and step, with a frozen variance."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm
from jaxdist.sync import _checks
from jaxdist.sync.onebit_allreduce import chunk_sizes


def check_common(learning_rate, num_workers, b1, b2, eps, weight_decay, clip) -> None:
  if not callable(learning_rate):
    _checks.check('learning_rate', learning_rate, lambda v: v >= 0, '>= 0')
  _checks.check('num_workers', num_workers, lambda v: v >= 1, '>= 1')
  _checks.check('b1', b1, lambda v: 0 <= v < 1, 'in [0, 1)')
  _checks.check('b2', b2, lambda v: 0 <= v < 1, 'in [0, 1)')
  _checks.check('eps', eps, lambda v: v > 0, '> 0')
  _checks.check('weight_decay', weight_decay, lambda v: v >= 0, '>= 0')
  _checks.check('clip', clip, lambda v: v >= 0, '>= 0 (0: no bound)')


def workers(name: str, axis_name: comm.AxisName, num_workers: int) -> int:
  """N, checked against `num_workers`; one worker (nothing to compress) is accepted too, as
  the trainer's calibration runs the method's step on one worker to time its compute."""
  n = comm.axis_size(axis_name)
  if n not in (1, num_workers):
    raise ValueError(f'{name} was built for num_workers={num_workers}, but {axis_name} has {n}')
  return n


def rate(learning_rate: optax.ScalarOrSchedule, count: jax.Array) -> jax.Array:
  """The learning rate of the step after `count` steps (optax's convention)."""
  value = learning_rate(count) if callable(learning_rate) else learning_rate
  return jnp.asarray(value, jnp.float32)


def errors(params: Any, n: int) -> tuple[Any, jax.Array]:
  """Zero worker error (like params, float32) and server error ([Σ_l c_l], float32)."""
  worker = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
  return worker, jnp.zeros(sum(chunk_sizes(params, n)), jnp.float32)


def masked(tree: Any, nu: Any) -> Any:
  """`tree` zeroed where v = 0: entries that never had a gradient (1 bit cannot send 0).

  DeepSpeed's user-supplied `exp_avg_mask`, read off the variance: sgn(0) = +1 would give
  such an entry ±scale, and with √v + ε = ε its step would be η·scale/ε.
  """
  return jax.tree.map(lambda x, v: jnp.where(v > 0, x, jnp.zeros_like(x)), tree, nu)


class Adam:
  """Adam's moment updates and step, as optax writes them (optax.adamw bitwise).

  With a frozen (or stale) variance the direction m̂/(√v̂ + ε) is `bounded`:
  zero where v = 0 (an entry that had no gradient while v was estimated) and
  clipped to [−clip, clip] (0: not clipped). Adam's own direction is about 1
  at most per entry; with v frozen, an entry whose v was tiny (a unit nearly
  silent in the warm-up, or one that gets the tensor's 1-bit scale) would
  move by η·|m|/√v, orders of magnitude more.
  """

  def __init__(self, b1, b2, eps, weight_decay, bias_correction, clip):
    self.b1, self.b2, self.eps, self.wd = b1, b2, eps, weight_decay
    self.bc, self.clip = bias_correction, clip

  def momentum(self, g, mu):
    return optax.tree.update_moment(g, mu, self.b1, 1)

  def variance(self, g, nu):
    return optax.tree.update_moment_per_elem_norm(g, nu, self.b2, 2)

  def denominator(self, nu, var_count):
    """√v̂ + ε, v̂ = v/(1 − β2^k) with k the variance updates so far (or v without correction)."""
    if self.bc:
      nu = optax.tree.bias_correction(nu, self.b2, var_count)
    return jax.tree.map(lambda v: jnp.sqrt(v + 0.0) + self.eps, nu)

  def unbiased(self, mu, count):
    return optax.tree.bias_correction(mu, self.b1, count) if self.bc else mu

  def bounded(self, direction, nu):
    """`direction` zeroed where v = 0 and clipped to [−clip, clip] (the frozen-v safeguard)."""
    direction = masked(direction, nu)
    if self.clip:
      direction = jax.tree.map(lambda d: jnp.clip(d, -self.clip, self.clip), direction)
    return direction

  def direction(self, mu, denom, count, params, nu=None):
    """m̂/(√v̂ + ε) + λθ: the update before the learning rate; `bounded` when `nu` (frozen v)."""
    u = jax.tree.map(jnp.divide, self.unbiased(mu, count), denom)
    if nu is not None:
      u = self.bounded(u, nu)
    if self.wd:
      u = jax.tree.map(lambda g, p: g + self.wd * p, u, params)
    return u

  def step(self, mu, denom, count, params, rate, nu=None):
    """−η·(m̂/(√v̂ + ε) + λθ); the direction `bounded` when `nu` (frozen v) is given."""
    d = self.direction(mu, denom, count, params, nu)
    return jax.tree.map(lambda g: g * (-rate).astype(g.dtype), d)
