"""jaxdist: communication-efficient data-parallel training for JAX.

Compressed collectives, less-frequent synchronisation and delay-tolerant SGD as
optax gradient transformations that communicate over named worker axes.

`import jaxdist` loads only what the transforms need (jax, optax): `comm`,
`compress`, `netmodel`, `runtime` and `sync`. The training stack (`data`:
tensorflow-datasets; `models`: flax; `train`: orbax, matplotlib,
tensorboardX) loads on first use of `jaxdist.data`, `jaxdist.models` or
`jaxdist.train`; the host-side controllers (`control`: dynamic batching,
streams, Scavenger's planner, with scipy and kneed) on first use of
`jaxdist.control`.
"""

import importlib
from typing import Any

from jaxdist import comm, compress, netmodel, runtime, sync

__version__ = '0.1.0'

_LAZY = ('control', 'data', 'models', 'testing', 'train')
__all__ = ['comm', 'compress', 'netmodel', 'runtime', 'sync', *_LAZY]


def __getattr__(name: str) -> Any:
  if name in _LAZY:
    return importlib.import_module(f'jaxdist.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(__all__)
