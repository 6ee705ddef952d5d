"""Flax models, by name: `get('cnn', num_classes=10)`, `get('gpt', num_classes=65, size='tiny')`."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn

from jaxdist.models.resnet import ResNet, resnet20
from jaxdist.models.simple import CNN, MLP
from jaxdist.models.transformer import GPT, gpt

MODELS: dict[str, Callable[..., nn.Module]] = {
  'mlp': MLP,
  'cnn': CNN,
  'resnet20': resnet20,
  'gpt': gpt,
}
SEQUENCE_MODELS = ('gpt',)  # take token windows (config.dataset.context > 0)


def get(name: str, num_classes: int, **kwargs) -> nn.Module:
  """The model called `name` with a `num_classes`-way output.

  Args:
    name: a key of `MODELS`: 'mlp', 'cnn', 'resnet20' or 'gpt'.
    num_classes: the output's width (for 'gpt', the vocabulary).
    **kwargs: the model's other fields (e.g. `size` for 'gpt').

  Returns:
    The Flax module.
  """
  if name not in MODELS:
    raise ValueError(f'unknown model {name!r}; choose one of {sorted(MODELS)}')
  return MODELS[name](num_classes=num_classes, **kwargs)


__all__ = ['CNN', 'GPT', 'MLP', 'MODELS', 'SEQUENCE_MODELS', 'ResNet', 'get', 'gpt', 'resnet20']
