"""jaxdist: communication-efficient data-parallel training for JAX.

Compressed collectives, less-frequent synchronisation and delay-tolerant SGD as
optax gradient transformations that communicate over named worker axes.

`import jaxdist` loads only what the transforms need (jax, optax): `comm`,
`compress`, `netmodel`, `runtime` and `sync`, and `testing` on first use;
`pip install jaxdist` installs just these. The training stack (`data`:
tensorflow-datasets; `models`: flax; `train`: orbax, matplotlib,
tensorboardX; the `train` extra) loads on first use of `jaxdist.data`,
`jaxdist.models` or `jaxdist.train`; the host-side controllers (`control`:
dynamic batching, streams, Scavenger's planner, with scipy, kneed and pymoo;
the `control` extra) on first use of `jaxdist.control`.
"""

import importlib
from types import ModuleType
from typing import Any

from jaxdist import comm, compress, netmodel, runtime, sync

__version__ = '0.1.0'

_LAZY = {'control': 'control', 'data': 'train', 'models': 'train', 'testing': '', 'train': 'train'}
__all__ = ['comm', 'compress', 'netmodel', 'runtime', 'sync', *_LAZY]


def _load(module: str, extra: str) -> ModuleType:
  """`importlib.import_module(module)`; a missing dependency names the extra that installs it."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if not extra or not e.name or e.name.partition('.')[0] == 'jaxdist':
      raise
    raise ModuleNotFoundError(
      f"{module} needs {e.name}, which jaxdist's {extra!r} extra installs: "
      f"pip install 'jaxdist[{extra}]'",
      name=e.name,
    ) from e


def __getattr__(name: str) -> Any:
  if name in _LAZY:
    return _load(f'jaxdist.{name}', _LAZY[name])
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(__all__)
