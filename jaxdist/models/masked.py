"""Losses over the first `count` examples of a fixed-size batch: per-worker batches, static shapes.

With dynamic batching (or ScaDLES' stream-sized batches) worker k trains on
b_k examples, b_k changing between steps. Each worker holds b_max examples
and a traced count b_k; the loss averages over the first b_k only, so a new
b_k never recompiles the step. Pad with real examples (or zeros), not NaN:
a NaN in an unused row would still reach the gradient through 0 · NaN.
Models with batch statistics (batch norm) see the padding in training mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def count_mask(count: jax.typing.ArrayLike, size: int) -> jax.Array:
  """[size] bool: True for the first `count` positions (count is clipped to [0, size]).

  Args:
    count: how many positions are real (may be traced).
    size: the mask's length.

  Returns:
    bool [size].
  """
  return jnp.arange(size) < count


def masked_mean(values_B: jax.Array, count: jax.typing.ArrayLike) -> jax.Array:
  """Mean of the first `count` entries of `values_B` (0 when count is 0).

  Args:
    values_B: [B] per-example values (e.g. losses).
    count: how many of them are real examples (may be traced).

  Returns:
    A scalar in `values_B`'s dtype.

  Example:
    >>> masked_mean(jnp.array([1.0, 3.0, 100.0]), 2)
    Array(2., dtype=float32)
  """
  mask = count_mask(count, values_B.shape[0])
  used = jnp.maximum(jnp.sum(mask), 1).astype(values_B.dtype)
  return jnp.sum(jnp.where(mask, values_B, 0)) / used


def masked_cross_entropy(
  logits_BxC: jax.Array, labels_B: jax.Array, count: jax.typing.ArrayLike
) -> jax.Array:
  """Mean softmax cross-entropy over the first `count` examples (integer labels).

  Its gradient is that of the unmasked mean over those `count` examples;
  the examples after them contribute exactly nothing.

  Args:
    logits_BxC: the model's logits for all B held examples.
    labels_B: integer labels.
    count: how many of the B examples this worker trains on (traced int).

  Returns:
    A scalar loss.
  """
  losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, labels_B)
  return masked_mean(losses_B, count)
