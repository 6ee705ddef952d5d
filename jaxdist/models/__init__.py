"""Flax models, by name: `get('cnn', num_classes=10)`."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn

from jaxdist.models.resnet import ResNet, resnet20
from jaxdist.models.simple import CNN, MLP

MODELS: dict[str, Callable[..., nn.Module]] = {
  'mlp': MLP,
  'cnn': CNN,
  'resnet20': resnet20,
}


def get(name: str, num_classes: int, **kwargs) -> nn.Module:
  """The model called `name` with a `num_classes`-way output."""
  if name not in MODELS:
    raise ValueError(f'unknown model {name!r}; choose one of {sorted(MODELS)}')
  return MODELS[name](num_classes=num_classes, **kwargs)


__all__ = ['CNN', 'MLP', 'MODELS', 'ResNet', 'get', 'resnet20']
