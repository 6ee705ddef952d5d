"""Argument checks shared by the transforms of `jaxdist.sync`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def concrete(value: Any) -> bool:
  """Whether `value` is known now, so a factory can check it in Python.

  `optax.inject_hyperparams` passes numeric arguments as arrays, and inside a
  traced `update` they are tracers: factories check only what is concrete (an
  injected value is checked where `init` builds the transform from it).
  """
  return not isinstance(value, jax.core.Tracer)


def check(name: str, value: Any, ok: Callable[[Any], Any], allowed: str) -> None:
  """Raises `ValueError('{name} must be {allowed}, got {value}')` unless ok(value).

  Skipped when `value` is traced (see `concrete`).
  """
  if concrete(value) and not ok(value):
    raise ValueError(f'{name} must be {allowed}, got {value}')


def needs_params(name: str, params: Any) -> None:
  """Raises ValueError if a transform that needs `params` was called without them."""
  if params is None:
    raise ValueError(f'{name} needs params: call update(updates, state, params)')
