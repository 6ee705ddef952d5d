"""ResNet-20, the CIFAR-style residual network of He et al. (2016), §4.2.

Three stages of 3 basic blocks (16, 32, 64 filters), 3x3 convolutions, batch
norm, identity shortcuts with a strided 1x1 projection where the shape changes
(option B of the paper; option A, zero padding, is the other common choice).
0.27M parameters. Batch-norm statistics are per worker (no cross-worker sync),
as in PyTorch DDP without SyncBatchNorm.

Reference: He, Zhang, Ren, Sun. Deep Residual Learning for Image Recognition.
CVPR 2016. https://arxiv.org/abs/1512.03385
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax


class BasicBlock(nn.Module):
  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
    conv = functools.partial(nn.Conv, use_bias=False)
    y = conv(self.features, (3, 3), strides=self.strides)(x)
    y = nn.relu(norm()(y))
    y = conv(self.features, (3, 3))(y)
    y = norm(scale_init=nn.initializers.zeros)(y)
    if x.shape != y.shape:
      x = norm()(conv(self.features, (1, 1), strides=self.strides)(x))
    return nn.relu(x + y)


class ResNet(nn.Module):
  """CIFAR-style ResNet with 6n+2 layers.

  Attributes:
    num_classes: the output's width (logits).
    blocks_per_stage: n, basic blocks per stage.
    widths: channels of each stage; every stage after the first halves the
      resolution.
  """

  num_classes: int
  blocks_per_stage: int = 3
  widths: tuple[int, ...] = (16, 32, 64)

  @nn.compact
  def __call__(self, x_BxHxWxC: jax.Array, train: bool = False) -> jax.Array:
    x = nn.Conv(self.widths[0], (3, 3), use_bias=False)(x_BxHxWxC)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
    for stage, width in enumerate(self.widths):
      for block in range(self.blocks_per_stage):
        strides = 2 if stage > 0 and block == 0 else 1
        x = BasicBlock(width, strides)(x, train)
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes)(x)


def resnet20(num_classes: int) -> ResNet:
  """ResNet-20: three stages of three blocks, 16, 32 and 64 channels.

  Args:
    num_classes: the output's width.

  Returns:
    The `ResNet`.
  """
  return ResNet(num_classes=num_classes, blocks_per_stage=3)
