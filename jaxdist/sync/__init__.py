"""Optax gradient transformations that communicate over named worker axes."""

from jaxdist.sync.allreduce import AllReduceState, allreduce
from jaxdist.sync.compressed import CompressedState, compressed_allreduce, local_clip

__all__ = ['AllReduceState', 'CompressedState', 'allreduce', 'compressed_allreduce', 'local_clip']
