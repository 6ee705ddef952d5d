"""Small classifiers: an MLP and a CNN, sized for digits/MNIST-scale data on CPU."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax


class MLP(nn.Module):
  """Fully connected ReLU network on flattened images.

  Attributes:
    num_classes: the output's width (logits).
    hidden: the hidden layers' widths.
  """

  num_classes: int
  hidden: Sequence[int] = (256, 128)

  @nn.compact
  def __call__(self, x_BxHxWxC: jax.Array, train: bool = False) -> jax.Array:
    del train
    x = x_BxHxWxC.reshape((x_BxHxWxC.shape[0], -1))
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
    return nn.Dense(self.num_classes)(x)


class CNN(nn.Module):
  """Two 3x3 conv layers, 2x2 average pooling, two dense layers; no normalisation.

  Attributes:
    num_classes: the output's width (logits).
    features: the conv layers' channels.
    hidden: the first dense layer's width.
  """

  num_classes: int
  features: Sequence[int] = (32, 64)
  hidden: int = 128

  @nn.compact
  def __call__(self, x_BxHxWxC: jax.Array, train: bool = False) -> jax.Array:
    del train
    x = x_BxHxWxC
    for width in self.features:
      x = nn.relu(nn.Conv(width, (3, 3))(x))
    x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(self.num_classes)(x)
