"""Optax gradient transformations that communicate over named worker axes."""

from jaxdist.sync.allreduce import AllReduceState, allreduce
from jaxdist.sync.compressed import CompressedState, compressed_allreduce, local_clip
from jaxdist.sync.gossip import GossipState, gossip, mixing_matrix
from jaxdist.sync.periodic import (
  DiLoCoState,
  LocalSGDState,
  SelSyncState,
  SMAState,
  diloco,
  gradient_norm,
  local_sgd,
  selsync,
  sma,
)
from jaxdist.sync.stale import StaleState, async_sgd, delayed, ssp, stale_sync

__all__ = [
  'AllReduceState',
  'CompressedState',
  'DiLoCoState',
  'GossipState',
  'LocalSGDState',
  'SMAState',
  'SelSyncState',
  'StaleState',
  'allreduce',
  'async_sgd',
  'compressed_allreduce',
  'delayed',
  'diloco',
  'gossip',
  'gradient_norm',
  'local_clip',
  'local_sgd',
  'mixing_matrix',
  'selsync',
  'sma',
  'ssp',
  'stale_sync',
]
