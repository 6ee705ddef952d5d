"""What every absl binary does before and around the library call."""

from __future__ import annotations

import logging as pylogging
import sys
from collections.abc import Callable
from typing import Any

from absl import logging

_NOISY = ('/orbax/', '/tensorflow_datasets/', '/etils/', 'xla_bridge.py')


def _quiet_libraries(record) -> bool:
  # orbax and tfds log every checkpoint/build step at INFO; keep their warnings.
  return record.levelno >= pylogging.WARNING or not any(n in record.pathname for n in _NOISY)


def setup(cpu_devices: int) -> None:
  """Creates `cpu_devices` CPU devices (before JAX starts) and quiets library INFO logs.

  A count below 1 ends the binary with one `error:` line naming --cpu_devices, exit status 2.
  """
  from jaxdist import runtime

  try:
    runtime.cpu_devices(cpu_devices)
  except ValueError as e:
    print(f'error: --{e}', file=sys.stderr)  # "--cpu_devices must be >= 1, got 0"
    sys.exit(2)
  logging.get_absl_handler().python_handler.addFilter(_quiet_libraries)


def run(fn: Callable[..., Any], *args: Any) -> Any:
  """Calls fn; a ConfigError becomes one `error:` line on stderr and exit status 2."""
  from jaxdist.train.factory import ConfigError

  try:
    return fn(*args)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)  # plain text: no absl log prefix
    sys.exit(2)
