"""Micro-batches: a worker computes only the examples it trains on, whatever it holds.

With per-worker batches (`make_train_step(counted=True)`) every worker holds
the same static number of examples, b_max, and trains on its first count.
The masked loss (`jaxdist.models.masked`) runs the forward and backward
passes over all b_max of them and zeroes the rest: the shapes never change,
but a worker given 5 examples of 64 pays for 64. Here the held examples are
cut into micro-batches of one static size m, and each worker loops (a
`lax.while_loop`, its trip count its own traced count) over the
⌈count / m⌉ micro-batches that hold its examples, adding up the gradients of
their summed losses, then divides by the count. Under `shard_map` every
device runs its own number of trips before the step's collectives: a fast
host with a large count computes more, a slow one less, and they meet at the
all-reduce. This is what makes dynamic batching (Tyagi & Sharma 2020) save
compute on real, unequal hosts; the batch controller then allocates
multiples of m (`jd.control.dynamic_batching(multiple=m)`). With one
micro-batch (m the held examples, as heterogeneity-aware DiLoCo's window
has: B / K or nothing) the loop is a `lax.cond`: XLA hoisted much of a
one-trip loop's body out of it, so that on the GPT tiny a step of no
examples took 27 ms of a full step's 65 (one CPU thread), against 1.7 ms
under the cond.

The gradient, loss and accuracy are those of the masked pass over the first
count examples, to float32 rounding (the sums are taken micro-batch by
micro-batch). Departures: a model with batch statistics (batch norm) updates
them once per micro-batch, from that micro-batch alone (the masked pass:
once, from all held examples); a device holding several workers under
`vmap` runs as many trips as its busiest worker (the others' trips are
masked), so the saving is per device, as on real hosts with one worker each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist.train import xla_cpu


def gradients(
  one_pass: Callable[..., Any], micro_batch: int, params, model_state, x, y, count
) -> tuple[Any, Any, jax.Array, jax.Array | None]:
  """One worker's (gradient, model state, loss, accuracy) over its first `count` examples.

  Args:
    one_pass: `(params, model_state, x, y, count) -> (grads, model_state,
      loss, accuracy)`, the masked pass of one worker (accuracy may be None).
    micro_batch: m, the examples of one micro-batch; it divides the held
      examples.
    params: the worker's parameters.
    model_state: its other variables.
    x: its held inputs, [b_max, ...] (or a tree of them).
    y: its held labels, batch leading.
    count: how many of the held examples it trains on (traced int); the
      rest are never computed, bar the last micro-batch's padding.

  Returns:
    The masked pass's outputs over the first `count` examples: the gradient
    and loss of their mean, the model state after the last micro-batch, and
    the accuracy (None where `one_pass` gives none). A count of 0 gives a
    zero gradient, loss and accuracy.
  """
  held = y.shape[0]
  if micro_batch < 1 or held % micro_batch:
    raise ValueError(
      f'micro_batch must be >= 1 and divide the {held} examples a worker holds, got {micro_batch}'
    )
  trips_max = held // micro_batch
  cut = lambda a: a.reshape(trips_max, micro_batch, *a.shape[1:])
  xs, ys = jax.tree.map(cut, x), jax.tree.map(cut, y)
  count = jnp.asarray(count, jnp.int32)
  trips = jnp.clip((count + micro_batch - 1) // micro_batch, 0, trips_max)
  pick = lambda tree, i: jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, False), tree)

  def micro(i, model_state):
    used = jnp.clip(count - i * micro_batch, 0, micro_batch)
    return one_pass(params, model_state, pick(xs, i), pick(ys, i), used), used

  shapes = jax.eval_shape(lambda: micro(0, model_state)[0])
  scored = shapes[3] is not None

  def body(carry):
    i, grads, model_state, loss_sum, hit_sum = carry
    (g, model_state, loss, accuracy), used = micro(i, model_state)
    n = used.astype(jnp.float32)
    grads = jax.tree.map(lambda a, b: a + b * n.astype(b.dtype), grads, g)
    hit_sum = hit_sum + accuracy * n if scored else hit_sum
    return i + 1, grads, model_state, loss_sum + loss * n, hit_sum

  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])
  start = (jnp.int32(0), zeros, model_state, jnp.float32(0), jnp.float32(0))
  if trips_max == 1:
    _, grads, model_state, loss_sum, hit_sum = jax.lax.cond(trips > 0, body, lambda c: c, start)
  else:
    _, grads, model_state, loss_sum, hit_sum = jax.lax.while_loop(
      lambda carry: carry[0] < trips, body, start
    )
  total = jnp.maximum(count, 1).astype(jnp.float32)
  grads = jax.tree.map(lambda g: g / total.astype(g.dtype), grads)
  return grads, model_state, loss_sum / total, hit_sum / total if scored else None


def pass_of(one_pass: Callable[..., Any], micro_batch: int, on_cpu: bool) -> Callable[..., Any]:
  """A worker's pass: `one_pass` itself, or with `micro_batch` its loop over micro-batches.

  On the CPU the loop's convolutions are put in the layout XLA's CPU backend
  calls Eigen for (`xla_cpu.conv_rule`; XLA does so only outside loops).

  Args:
    one_pass: the masked pass of one worker, as `gradients` takes it.
    micro_batch: m (0: `one_pass` unchanged).
    on_cpu: whether the devices are CPUs.

  Returns:
    `(params, model_state, x, y, count) -> (grads, model_state, loss, accuracy)`.
  """
  if not micro_batch:
    return one_pass
  inner = xla_cpu.rewritten(one_pass, xla_cpu.conv_rule) if on_cpu else one_pass
  return functools.partial(gradients, inner, micro_batch)
