"""One factory call per config section: the section's keys are the factory's arguments."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def call(factory: Callable[..., Any], where: str, section: Any, **supplied: Any) -> Any:
  """`factory(**section, **supplied)`; errors name the config section `where`.

  Args:
    factory: a jaxdist factory (transform or compressor).
    where: the section's dotted config path, e.g. 'sync.local_sgd'.
    section: its keys and values (the factory's argument names).
    **supplied: arguments the trainer provides (axis_name, optimizers...).

  Returns:
    What the factory returns.
  """
  kwargs = dict(section or {})
  allowed = set(inspect.signature(factory).parameters) - set(supplied)
  unknown = sorted(set(kwargs) - allowed)
  if unknown:
    raise ValueError(
      f'config.{where} has {unknown}, which {factory.__name__} does not take; '
      f'its arguments: {sorted(allowed - {"axis_name"})}'
    )
  try:
    return factory(**kwargs, **supplied)
  except (ValueError, TypeError) as e:
    raise ValueError(f'config.{where}: {e}') from e
