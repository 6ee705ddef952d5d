"""What every absl binary does before and around the library call.

A binary passes `parse_flags` to `app.run` and calls the library through
`run`: a bad flag, config file, `:arg` or key, and a bad config, end it with
one plain `error:` line on stderr and exit status 2, before anything is
written. Logging is at warning level unless the command line asks for more
(`--verbosity=0` or `-v 0` for absl's info lines, `--verbosity=1` for debug).
"""

from __future__ import annotations

import difflib
import logging as pylogging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import ml_collections
from absl import flags, logging
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from jaxdist.train import config as config_lib

_NOISY = ('/orbax/', '/tensorflow_datasets/', '/etils/', 'xla_bridge.py')
_EXCEPTION_PREFIX = re.compile(r'^(?:[\w.]+(?:Error|Exception)): ')
KEYS_LISTED = 20  # a section's keys named in full when a key is unknown, at most


def _quiet_libraries(record) -> bool:
  # orbax and tfds log every checkpoint/build step at INFO; keep their warnings.
  return record.levelno >= pylogging.WARNING or not any(n in record.pathname for n in _NOISY)


def fail(message: str) -> NoReturn:
  """Ends the binary: `error: message` on stderr (plain text, no absl prefix), exit status 2."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def setup(cpu_devices: int) -> None:
  """Creates `cpu_devices` CPU devices (before JAX starts) and quiets library INFO logs.

  Logging stays at warning level unless the command line set `--verbosity`
  (`warnings_unless_asked`, for binaries that parse their flags with absl's
  parser). A count below 1 ends the binary with one `error:` line naming
  --cpu_devices, exit status 2.
  """
  warnings_unless_asked()
  from jaxdist import runtime

  try:
    runtime.cpu_devices(cpu_devices)
  except ValueError as e:
    fail(f'--{e}')  # "--cpu_devices must be >= 1, got 0"
  logging.get_absl_handler().python_handler.addFilter(_quiet_libraries)


def warnings_unless_asked() -> None:
  """Sets absl's verbosity to warning unless `--verbosity`/`-v` is on the command line.

  `app.run` raises an unset verbosity to info once the flags are parsed; set
  here, it stays, and a run's console shows its tables, not `I1126 ...` lines.
  """
  if not flags.FLAGS['verbosity'].present:
    flags.FLAGS.verbosity = logging.WARNING


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
  """Calls fn; a ConfigError or an interruption ends the binary with one line on stderr.

  A ConfigError: `error: ...`, exit status 2. A run stopped by SIGINT or
  SIGTERM (`interrupt.Interrupted`, its checkpoint saved): `interrupted at
  step N; ...`, exit status 130 or 143, as the shell gives a process the
  signal ended. Ctrl-C anywhere else (before or between runs): one line and
  status 130, no traceback.

  Args:
    fn: the library call the binary makes.
    *args: its positional arguments.
    **kwargs: its keyword arguments.

  Returns:
    What `fn` returns.
  """
  from jaxdist.train.factory import ConfigError
  from jaxdist.train.interrupt import Interrupted

  try:
    return fn(*args, **kwargs)
  except ConfigError as e:
    fail(str(e))
  except Interrupted as e:
    print(e.message(), file=sys.stderr)
    sys.exit(e.exit_status)
  except KeyboardInterrupt:
    print('interrupted; rerun the same command to resume', file=sys.stderr)
    sys.exit(128 + signal.SIGINT)


def integers(name: str) -> None:
  """Makes the list flag `name` (`flags.DEFINE_list`) take comma-separated integers only."""
  flags.register_validator(
    name,
    lambda v: v is None or all(re.fullmatch(r'\s*-?\d+\s*', s) for s in v),
    message='takes comma-separated integers',
  )


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing for `app.run(main, flags_parser=cli.parse_flags)`, errors in one line.

  An unknown or missing flag, a bad value, a config file that does not load,
  a bad `:arg` after it and a `--config.<key>` the config does not have end
  the binary with one `error:` line and exit status 2 (`fail`), with the
  closest names where there are some: `--config.sync.local_sgd.perod:
  config.sync.local_sgd has no key 'perod'; did you mean 'period'?`.
  Anything else a config file raises (a bug in it) keeps its traceback.
  A config file that comes with jaxdist may be named from anywhere:
  `--config=digits.py:runlocal` (`config.config_path`).
  """
  argv = _shipped_configs(argv)
  try:
    rest = flags.FLAGS(argv)
    for name in _config_flags():
      flags.FLAGS[name].value.keys  # noqa: B018 - a file that failed to load raises OSError here
  except flags.Error as e:
    fail(_one_line(str(e)))
  except OSError as e:
    fail(_unloadable(argv, e))
  except (AttributeError, KeyError, TypeError, ValueError):  # what a bad override raises
    message = _unknown_key(argv)
    if message is None:
      raise
    fail(message)
  warnings_unless_asked()
  return rest


def _shipped_configs(argv: Sequence[str]) -> list[str]:
  """argv, each config-file flag's file that is not there named by its shipped path (`find`)."""
  argv = list(argv)
  for i, arg in enumerate(argv):
    for name in _config_flags():
      match = re.fullmatch(rf'(--?{name}=)([^:]*)(.*)', arg, re.DOTALL)
      if match:
        argv[i] = match[1] + config_lib.find(match[2]) + match[3]
      elif re.fullmatch(rf'--?{name}', arg) and i + 1 < len(argv):
        path, colon, rest = argv[i + 1].partition(':')
        argv[i + 1] = config_lib.find(path) + colon + rest
  return argv


def _config_flags() -> list[str]:
  """The names of the config-file flags defined (`config_flags.DEFINE_config_file`)."""
  return [n for n in flags.FLAGS if isinstance(flags.FLAGS[n].parser, ConfigFileFlagParser)]


def _one_line(message: str) -> str:
  """absl's message, less its 'flag ' and any traceback a config file's get_config() left in it.

  `flag --config=c.py:runlokal: Error whilst parsing config file: <traceback> ValueError: m`
  becomes `--config=c.py:runlokal: m`.
  """
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  head = lines[0].removeprefix('flag ')
  if len(lines) == 1:
    return head
  head = head.split(' Error whilst parsing config file:')[0].rstrip(':')
  return f'{head}: {_EXCEPTION_PREFIX.sub("", lines[-1])}'


def _argv_value(argv: Sequence[str], name: str) -> str:
  """The value `argv` gives flag `name` (the last one), or the flag's default."""
  value = flags.FLAGS[name].default_as_str or ''
  value = value.strip("'")
  for i, arg in enumerate(argv):
    if re.fullmatch(rf'--?{name}', arg) and i + 1 < len(argv):
      value = argv[i + 1]
    elif re.match(rf'--?{name}=', arg):
      value = arg.split('=', 1)[1]
  return value


def _unloadable(argv: Sequence[str], error: OSError) -> str:
  """The one line for a config file that does not load: the file, what failed, a near name."""
  for name in _config_flags():
    value = _argv_value(argv, name)
    path = value.split(':', 1)[0]
    if os.path.isfile(path):
      continue
    folder = os.path.dirname(path)
    here = os.listdir(folder or '.') if os.path.isdir(folder or '.') else []
    close = difflib.get_close_matches(os.path.basename(path), [f for f in here if '.py' in f], 1)
    hint = f'; did you mean {os.path.join(folder, close[0])}?' if close else ''
    return f'--{name}={value}: no such config file {path}{hint}'
  last = [line.strip() for line in str(error).splitlines() if line.strip()]
  return f'the config file does not load: {last[-1] if last else error}'


def _unknown_key(argv: Sequence[str]) -> str | None:
  """The one line for the first `--<config>.<key>` in argv that its config does not have."""
  for name in _config_flags():
    config = flags.FLAGS[name].parser.parse(_argv_value(argv, name))
    for arg in argv:
      match = re.match(rf'--?(?:no)?{name}\.([^=]+)', arg)
      problem = match and _missing(config, match.group(1), name)
      if problem:
        return f'{arg.split("=", 1)[0]}: {problem}'
  return None


def _missing(config: ml_collections.ConfigDict, path: str, name: str) -> str | None:
  """What is wrong with `path` in `config` (named `name`), or None if it is there."""
  node, where = config, name
  for key in path.split('.'):
    if not isinstance(node, ml_collections.ConfigDict):
      return f'{where} is a value, not a section with keys'
    if key not in node:
      keys = sorted(node.keys())
      close = difflib.get_close_matches(key, keys, n=3)
      if close:
        return f'{where} has no key {key!r}; did you mean {" or ".join(map(repr, close))}?'
      listed = ', '.join(keys[:KEYS_LISTED]) + (', ...' if len(keys) > KEYS_LISTED else '')
      return f'{where} has no key {key!r}; its keys: {listed}'
    node, where = node[key], f'{where}.{key}'
  return None
