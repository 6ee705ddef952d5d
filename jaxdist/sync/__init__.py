"""Optax gradient transformations that communicate over named worker axes."""

from jaxdist.sync.allreduce import AllReduceState, allreduce

__all__ = ['AllReduceState', 'allreduce']
