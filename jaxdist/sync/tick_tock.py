"""Wavelet's tick-tock: two waves of workers, the tock wave half an iteration behind.

The algorithmic form. Workers split into `waves` waves by index (worker i is
in wave i mod waves, so with two simulated workers per device each device
hosts a tick and a tock worker). There is one shared model; in every
iteration it takes one update per wave, in turn, each from that wave's mean
gradient. A wave computes its gradient on the model as it stood when the
wave started its forward pass, which is before the other wave's latest
update landed: every update is one update stale, the staleness the
half-iteration stagger implies. One wave is plain synchronous SGD.

The system form (one jitted step that runs the waves' passes one after the
other under rematerialisation, so only one wave's activations are alive at
a time) is the trainer's `make_train_step(staggered=True)`
(`config.sync.staggered`).

Wavelet's code and full text were not available; how its two waves merge
updates is not described in what was. This form (one model, alternating
updates, staleness one) is this library's reading, not the paper's
implementation.

Reference: Wang, Wang, Jiang, Li, Stoica. Wavelet: Efficient DNN Training
with Tick-Tock Scheduling. MLSys 2021.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm
from jaxdist.sync import _checks


class TickTockState(NamedTuple):
  """State of `tick_tock`.

  Attributes:
    weights: the shared model after the last wave's update. Replicated.
    inner: the optimizer's state (shared by the waves). Replicated.
    wire: the all-reduce of the waves' gradients. Per-worker.
  """

  weights: Any
  inner: Any
  wire: tuple


def tick_tock(
  optimizer: optax.GradientTransformation, *, axis_name: comm.AxisName, waves: int = 2
) -> optax.GradientTransformation:
  """Alternating updates of a shared model by `waves` staggered waves of workers.

  Wraps the optimizer. Per step, each wave's mean gradient updates the shared
  model in turn (tick, then tock); each worker's next forward pass uses the
  model right after its own wave's update:

    for k = 0..waves−1:  w <- w + opt(ḡ_k),  ḡ_k = mean of wave k's gradients;
    worker n (in wave k = n mod waves) continues from w after update k.

  The waves' gradients travel in one all-reduce of `waves` × the model (each
  worker contributes to its own wave's slot).

  Args:
    optimizer: the optimizer of the shared model.
    axis_name: the worker axis (or tuple of axes).
    waves: number of waves (1 = synchronous SGD; Wavelet uses 2).

  Returns:
    An `optax.GradientTransformation` that replaces the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.tick_tock(optax.sgd(1.0), axis_name=runtime.AXES)
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)  # worker 0 ticks, 1 tocks
    >>> run({'x': jnp.array([1.0, 10.0])})['x']  # tick: 0 - 1; tock: -1 - 10
    Array([ -1., -11.], dtype=float32)

  Reference:
    Wang, Wang, Jiang, Li, Stoica. Wavelet: Efficient DNN Training with
    Tick-Tock Scheduling. MLSys 2021.
    https://proceedings.mlsys.org/paper_files/paper/2021/hash/099268c3121d49937a67a052c51f865d-Abstract.html
    (this form is the library's reading; see the module docstring.)
  """
  if waves < 1:
    raise ValueError(f'waves must be >= 1, got {waves}')

  def init_fn(params):
    stacked = waves * comm.tree_nbytes(params)
    return TickTockState(
      params, optimizer.init(params), (comm.transfer(comm.ALL_REDUCE, stacked, 0),)
    )

  def update_fn(grads, state, params=None):
    _checks.needs_params('tick_tock', params)
    n = comm.axis_size(axis_name)
    if n % waves and n > 1:
      raise ValueError(f'{n} workers do not split into {waves} waves')
    groups = waves if n > 1 else 1  # a lone worker (e.g. timing one worker's step) is one wave
    wave = comm.axis_index(axis_name) % groups
    slots = jax.tree.map(
      lambda g: jnp.stack([jnp.where(wave == k, g, 0) for k in range(waves)]), grads
    )
    sums, sent = comm.psum(slots, axis_name)
    weights, inner, after = state.weights, state.inner, []
    for k in range(groups):
      mean = jax.tree.map(lambda s, k=k: s[k] / (n // groups), sums)
      updates, inner = optimizer.update(mean, inner, weights)
      weights = optax.apply_updates(weights, updates)
      after.append(weights)
    mine = jax.tree.map(lambda *ws: jnp.stack(ws)[wave], *after)
    return optax.tree.sub(mine, params), TickTockState(weights, inner, (sent,))

  return optax.GradientTransformation(init_fn, update_fn)
