"""Pipelined backpropagation's delay compensation, and a delayed-gradient simulator.

In fine-grained pipeline parallelism (Kosson et al. 2021) the gradient of a
stage arrives D steps after the weights it was computed on. Two optimizer
modifications correct for it:

- `spike_compensation(delay, momentum)`: with momentum m, an undelayed
  gradient would already have moved the weights by (1 − m^D)/(1 − m) times
  itself when the delayed one arrives; SC applies that at once and scales
  the momentum path by m^D, so the total impulse response equals undelayed
  momentum SGD's: update = m^D·v + (1 − m^D)/(1 − m)·g with v <- m·v + g.
- `linear_weight_prediction(delay)`: the forward pass runs on weights
  extrapolated D steps along the current update, ŵ = w + D·u (for SGDM,
  w − ηDv), so the gradient is computed near the weights it will be applied
  to.

`gradient_delay(delay)` simulates the staleness on one worker: each
gradient is applied D steps after it was computed (D per parameter if given
as a pytree), i.e. on weights D steps newer than those it was computed on.
It does not simulate the forward/backward weight inconsistency of a real
pipeline.

The paper's full text was not available; the formulas follow the research
notes (`[UNVERIFIED]` there) and are checked here by their defining
property (SC's impulse response) rather than against published numbers.

Reference: Kosson, Chiley, Venigalla, Hestness, Köster. Pipelined
Backpropagation at Scale: Training Large Models without Batches. MLSys 2021.
https://arxiv.org/abs/2003.11666
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdist.sync import _checks


def _delays(delay, tree) -> Any:
  """`delay` (an int, 'stages', or a pytree of ints matching `tree`) as a pytree of ints."""
  if isinstance(delay, str):
    if delay != 'stages':
      raise ValueError(f"delay must be an int, a pytree of ints or 'stages', got {delay!r}")
    return stage_delays(tree)
  if isinstance(delay, int):
    _check_delay(delay)
    return jax.tree.map(lambda _: delay, tree)
  delays = jax.tree.map(int, delay)
  for d in jax.tree.leaves(delays):
    _check_delay(d)
  return delays


def _check_delay(d: int) -> None:
  if d < 0:
    raise ValueError(f'delay must be >= 0, got {d}')


def _validate(delay) -> None:
  if isinstance(delay, str):
    _delays(delay, {})
    return
  for d in jax.tree.leaves(delay):
    _check_delay(int(d))


class SpikeState(NamedTuple):
  """State of `spike_compensation`.

  Attributes:
    velocity: the momentum buffer v. Per-worker.
  """

  velocity: Any


def spike_compensation(delay: int | Any, momentum: float) -> optax.GradientTransformation:
  """Momentum whose impulse response matches undelayed momentum SGD under delay D.

  Returns the direction m^D·v + (1 − m^D)/(1 − m)·g with v <- m·v + g; chain
  it with the learning rate: `optax.chain(spike_compensation(2, 0.9),
  optax.scale(-lr))` replaces `optax.sgd(lr, momentum=0.9)`. D = 0 is plain
  momentum.

  Args:
    delay: D: an int, a pytree of ints (per parameter), or 'stages' (one
      pipeline stage per top-level layer, see `stage_delays`).
    momentum: m in [0, 1).

  Returns:
    An `optax.GradientTransformation`; chain it with `optax.scale(-lr)`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import sync, testing
    >>> tx = optax.chain(sync.spike_compensation(2, 0.5), optax.scale(-1.0))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=1)
    >>> run({'x': jnp.ones(1)})['x']  # the spike: 0.5²·1 + (1 − 0.5²)/(1 − 0.5)·1
    Array([-1.75], dtype=float32)
    >>> run.steps(30, lambda t: {'x': jnp.zeros(1)})['x'].round(4)  # total 1/(1 − m)
    Array([-2.], dtype=float32)

  Reference:
    Kosson, Chiley, Venigalla, Hestness, Köster. Pipelined Backpropagation
    at Scale: Training Large Models without Batches. MLSys 2021.
    https://arxiv.org/abs/2003.11666
  """
  _validate(delay)
  _checks.check('momentum', momentum, lambda m: 0 <= m < 1, 'in [0, 1)')

  def init_fn(params):
    return SpikeState(jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    delays = _delays(delay, updates)
    velocity = jax.tree.map(lambda v, g: momentum * v + g, state.velocity, updates)

    def direction(v, g, d):  # m = 0: 0^0 = 1, so b = 1 - 0^d = [d > 0]
      return momentum**d * v + (1 - momentum**d) / (1 - momentum) * g

    return jax.tree.map(direction, velocity, updates, delays), SpikeState(velocity)

  return optax.GradientTransformation(init_fn, update_fn)


class PredictionState(NamedTuple):
  """State of `linear_weight_prediction`.

  Attributes:
    weights: the true (unpredicted) weights. Per-worker.
  """

  TRAINED = 'weights'  # what evaluation reads (`jaxdist.probes`)

  weights: Any


def linear_weight_prediction(delay: int | Any) -> optax.GradientTransformation:
  """Keeps the true weights in its state and hands out ŵ = w + D·u for the next forward.

  Put it after the optimizer: `optax.chain(optax.sgd(lr, momentum=m),
  linear_weight_prediction(D))`; u is the optimizer's update (−ηv for SGDM).
  The parameters the model sees are the predictions; `state.weights` are the
  weights being trained. D = 0 changes nothing.

  Args:
    delay: D, an int or a pytree of ints (per parameter).

  Returns:
    An `optax.GradientTransformation`; put it after the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import sync, testing
    >>> tx = optax.chain(optax.sgd(1.0), sync.linear_weight_prediction(1))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=1)
    >>> run({'x': jnp.ones(1)})['x']  # ŵ = w + D·u = −1 + 1·(−1)
    Array([-2.], dtype=float32)
    >>> run.state[1].weights['x']  # the true weights w
    Array([-1.], dtype=float32)

  Reference:
    Kosson, Chiley, Venigalla, Hestness, Köster. Pipelined Backpropagation
    at Scale: Training Large Models without Batches. MLSys 2021.
    https://arxiv.org/abs/2003.11666
  """
  _validate(delay)

  def init_fn(params):
    return PredictionState(params)

  def update_fn(updates, state, params=None):
    _checks.needs_params('linear_weight_prediction', params)
    delays = _delays(delay, updates)
    weights = optax.apply_updates(state.weights, updates)
    predicted = jax.tree.map(lambda w, u, d: w + d * u, weights, updates, delays)
    return optax.tree.sub(predicted, params), PredictionState(weights)

  return optax.GradientTransformation(init_fn, update_fn)


class GradientDelayState(NamedTuple):
  """State of `gradient_delay`.

  Attributes:
    queue: per parameter, its last D gradients, oldest first ([D, ...]). Per-worker.
  """

  queue: Any


def gradient_delay(delay: int | Any) -> optax.GradientTransformation:
  """Passes on each gradient D steps late (zeros while the pipeline fills).

  u(t) = g(t − D) for t ≥ D, 0 before. Put it before the optimizer to train
  as if every gradient were computed on weights D steps old. D may differ
  per parameter (a pytree of ints), as in a pipeline where stages nearer the
  input wait longer.

  Args:
    delay: D, an int or a pytree of ints (per parameter).

  Returns:
    An `optax.GradientTransformation`; put it before the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import sync, testing
    >>> tx = optax.chain(sync.gradient_delay(1), optax.sgd(1.0))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=1)
    >>> run({'x': jnp.array([1.0])})['x']  # the pipeline fills
    Array([0.], dtype=float32)
    >>> run({'x': jnp.array([2.0])})['x']  # step 1's gradient arrives
    Array([-1.], dtype=float32)

  Reference:
    Kosson, Chiley, Venigalla, Hestness, Köster. Pipelined Backpropagation
    at Scale: Training Large Models without Batches. MLSys 2021.
    https://arxiv.org/abs/2003.11666
  """
  _validate(delay)

  def init_fn(params):
    delays = _delays(delay, params)
    return GradientDelayState(
      jax.tree.map(lambda p, d: jnp.zeros((d, *p.shape), p.dtype), params, delays)
    )

  def update_fn(updates, state, params=None):
    del params

    def shift(queue, g):
      if queue.shape[0] == 0:
        return g, queue
      return queue[0], jnp.concatenate([queue[1:], g[None]])

    pairs = jax.tree.map(shift, state.queue, updates)
    is_pair = lambda x: isinstance(x, tuple)
    out = jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair)
    queue = jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)
    return out, GradientDelayState(queue)

  return optax.GradientTransformation(init_fn, update_fn)


def stage_delays(params: Any, stages: int | None = None) -> Any:
  """Per-parameter delays of a pipeline with one stage per top-level layer.

  Layers in the order flax names them (`Conv_0`, `Conv_1`, `Dense_0`, ...;
  a model's own order where names sort the same way); a layer k of L waits
  2(L − 1 − k) steps in a fill-drain-free pipeline (forward and backward
  each pass the later stages), the last layer none.

  Args:
    params: the model's parameters, a dict of top-level layers.
    stages: L, the number of stages (None: one per top-level layer); layers
      from the L-th on wait none.

  Returns:
    A pytree of ints shaped like `params`: each leaf its layer's delay in
    steps, as `gradient_delay(delay=...)` and the others here take it.
  """
  names = list(params)
  order = sorted(names, key=_layer_key)
  total = len(order) if stages is None else stages
  delay_of = {name: 2 * max(total - 1 - i, 0) for i, name in enumerate(order)}
  return {name: jax.tree.map(lambda _, d=delay_of[name]: d, params[name]) for name in names}


def _layer_key(name: str) -> tuple[int, str, int]:
  kind, _, index = name.rpartition('_')
  rank = {'Conv': 0, 'BatchNorm': 0, 'Dense': 1}.get(kind, 0)
  return (rank, kind, int(index) if index.isdigit() else 0)
