"""jaxdist: communication-efficient data-parallel training for JAX.

Compressed collectives, less-frequent synchronisation and delay-tolerant SGD as
optax gradient transformations that communicate over named worker axes.
"""

from jaxdist import comm, compress, data, models, netmodel, runtime, sync, train

__version__ = '0.1.0'

__all__ = ['comm', 'compress', 'data', 'models', 'netmodel', 'runtime', 'sync', 'train']
