"""Optax gradient transformations that communicate over named worker axes."""

from jaxdist.sync.allreduce import AllReduceState, allreduce
from jaxdist.sync.bucketing import (
  BucketedState,
  bucketed_allreduce,
  mgwfbp_buckets,
  threshold_buckets,
  timeline,
)
from jaxdist.sync.compressed import CompressedState, compressed_allreduce, local_clip
from jaxdist.sync.delay_tolerant import DelayedState, cd_sgd, od_sgd, ssd_sgd
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
from jaxdist.sync.pipeline import (
  GradientDelayState,
  PredictionState,
  SpikeState,
  gradient_delay,
  linear_weight_prediction,
  spike_compensation,
  stage_delays,
)
from jaxdist.sync.stale import StaleState, async_sgd, delayed, ssp, stale_sync
from jaxdist.sync.wavelet import TickTockState, tick_tock

__all__ = [
  'AllReduceState',
  'BucketedState',
  'CompressedState',
  'DelayedState',
  'DiLoCoState',
  'GossipState',
  'GradientDelayState',
  'LocalSGDState',
  'PredictionState',
  'SMAState',
  'SelSyncState',
  'SpikeState',
  'StaleState',
  'TickTockState',
  'allreduce',
  'async_sgd',
  'bucketed_allreduce',
  'cd_sgd',
  'compressed_allreduce',
  'delayed',
  'diloco',
  'gossip',
  'gradient_delay',
  'gradient_norm',
  'linear_weight_prediction',
  'local_clip',
  'local_sgd',
  'mgwfbp_buckets',
  'mixing_matrix',
  'od_sgd',
  'selsync',
  'sma',
  'spike_compensation',
  'ssd_sgd',
  'ssp',
  'stage_delays',
  'stale_sync',
  'threshold_buckets',
  'tick_tock',
  'timeline',
]
