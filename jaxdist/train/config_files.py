"""Config files that come with jaxdist, found by name, and the `:arg` of `--config=file.py:arg`."""

from __future__ import annotations

import difflib
import os
from typing import Any

import ml_collections


def config_path(name: str = '') -> str:
  """The path of a config file that comes with jaxdist, e.g. `config_path('digits.py')`.

  The repository's configs/ folder installs with the package as
  `jaxdist/configs`; in a checkout (or an editable install) it is read where
  it lies, beside the package. `config_path()` is the folder itself,
  `config_path('variants/default.py')` a variants file.
  """
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  folder = os.path.join(package, 'configs')
  if not os.path.isdir(folder):
    folder = os.path.join(os.path.dirname(package), 'configs')
  return os.path.join(folder, name)


def find(path: str) -> str:
  """`path` where a file is there, else the config file that comes with jaxdist by that name.

  A name that is neither stays as it is, for the caller's error.
  """
  if os.path.isfile(path) or os.path.isabs(path):
    return path
  shipped = config_path(path)
  return shipped if os.path.isfile(shipped) else path


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """The `:arg` of `--config=file.py:arg`, e.g. 'runlocal,workers=16', as a ConfigDict.

  Each comma-separated item is `key=value` (converted to the type of its
  default) or a bare `flag` (True). Only keys given in `defaults` are
  allowed, so a typo is an error that lists them.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (s.strip() for s in (arg or '').split(','))):
    key, eq, value = item.partition('=')
    if key not in defaults:
      close = difflib.get_close_matches(key, list(defaults), n=1)
      hint = f' (did you mean {close[0]!r}?)' if close else ''
      raise ValueError(
        f'unknown config argument {key!r}{hint}; this config takes {sorted(defaults)}'
      )
    default = defaults[key]
    if not eq:
      out[key] = True
    elif isinstance(default, bool):
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError(f'config argument {key} takes true or false, got {value!r}')
      out[key] = value.lower() in ('true', '1')
    else:
      try:
        out[key] = type(default)(value) if default is not None else value
      except ValueError:
        raise ValueError(
          f'config argument {key} takes a {type(default).__name__}, got {value!r}'
        ) from None
  return out
