"""The task the steps train: a loss per example and the accuracy of integer labels.

One label per example ([B]: classification) or per position ([B, T]: a
language model's next tokens); an example's loss and accuracy are the means
over its positions. `jaxdist.train.step` takes any `Loss` of that shape.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

Loss = Callable[[jax.Array, jax.Array], jax.Array]


def cross_entropy(logits_Bx_xC: jax.Array, labels_Bx_: jax.Array) -> jax.Array:
  """Softmax cross-entropy of each example on integer labels: the steps' default `loss`.

  A label per example ([B], classification) or per position ([B, T], a
  language model's next tokens): an example's loss is the mean over its
  positions.
  """
  losses = optax.softmax_cross_entropy_with_integer_labels(logits_Bx_xC, labels_Bx_)
  return losses if losses.ndim == 1 else jnp.mean(losses.reshape(losses.shape[0], -1), axis=1)


def per_example(loss: Loss, outputs, y) -> jax.Array:
  """`loss(outputs, y)`, checked to hold one value per example (shape [B])."""
  losses_B = loss(outputs, y)
  if jnp.shape(losses_B) != (y.shape[0],):
    raise ValueError(
      f'loss must return one value per example, shape ({y.shape[0]},), got shape '
      f'{jnp.shape(losses_B)}: return the per-example losses, not their mean'
    )
  return losses_B


def classes(outputs, y) -> bool:
  """Whether `y` holds integer class labels of `outputs` (so accuracy means something)."""
  return jnp.issubdtype(y.dtype, jnp.integer) and y.shape == outputs.shape[:-1]


def correct(outputs, y) -> jax.Array:
  """Each example's fraction of positions whose argmax is its label ([B]; 0 or 1 for one label)."""
  hits = (jnp.argmax(outputs, -1) == y).astype(jnp.float32)
  return hits if hits.ndim == 1 else jnp.mean(hits.reshape(hits.shape[0], -1), axis=1)
