"""Optax gradient transformations that communicate over named worker axes.

One module per method: `allreduce`, `compressed` (`compressed_allreduce`; DGC's
`local_clip` is in `clip`), `powersgd`, `bucketing` (`bucketed_allreduce`),
`quantized` (`quantized_allreduce`, block-scaled int8 / fp8), `local_sgd`, `diloco`,
`streaming_diloco` (and its `fragment_labels`; it and `diloco(eager=True)` take their
exchange out of the step with `deferred`'s `DeferredExchange`: `streaming_exchange`,
`diloco_exchange`), `sparseloco` and `demo` (both on `chunked`:
`chunked_allgather`, error-fed Top-k per tile, all-gathered), `onebit_adam` and
`zero_one_adam` (whole optimizers, on `onebit_allreduce`), `selsync`, `sma`, `gossip`,
`stale` (`stale_sync`, `ssp`, `async_sgd`), `delay_tolerant` (`od_sgd`, `ssd_sgd`,
`cd_sgd`), `pipeline` (gradient delay and its compensations) and `tick_tock`. Wrappers
that keep workers in step: `finite` (`skip_nonfinite`) and `accumulate` (gradient
accumulation). Bucket planning lives in `jaxdist.netmodel`. `apply_updates` applies a
chain's updates and gives the workers that synchronised their model exactly.
"""

from jaxdist.probes import apply_updates
from jaxdist.sync._fragments import fragment_labels
from jaxdist.sync.accumulate import AccumulateState, accumulate
from jaxdist.sync.allreduce import AllReduceState, allreduce
from jaxdist.sync.bucketing import BucketedState, bucketed_allreduce
from jaxdist.sync.chunked import ChunkedState, chunked_allgather
from jaxdist.sync.clip import local_clip
from jaxdist.sync.compressed import CompressedState, compressed_allreduce
from jaxdist.sync.deferred import DeferredExchange
from jaxdist.sync.delay_tolerant import DelayedState, cd_sgd, od_sgd, ssd_sgd
from jaxdist.sync.demo import DeMoState, demo
from jaxdist.sync.diloco import (
  DiLoCoState,
  EagerDiLoCoState,
  StepsDiLoCoState,
  diloco,
  diloco_exchange,
)
from jaxdist.sync.finite import SkipNonfiniteState, all_finite, skip_nonfinite
from jaxdist.sync.gossip import GossipState, gossip, mixing_matrix
from jaxdist.sync.hitopk import HiTopKState, hitopk_allreduce
from jaxdist.sync.local_sgd import LocalSGDState, local_sgd
from jaxdist.sync.onebit_adam import OneBitAdamState, onebit_adam
from jaxdist.sync.onebit_allreduce import onebit_allreduce
from jaxdist.sync.pipeline import (
  GradientDelayState,
  PredictionState,
  SpikeState,
  gradient_delay,
  linear_weight_prediction,
  spike_compensation,
  stage_delays,
)
from jaxdist.sync.powersgd import PowerSGDState, powersgd
from jaxdist.sync.quantized import QuantizedState, quantized_allreduce
from jaxdist.sync.selsync import SelSyncState, gradient_norm, selsync
from jaxdist.sync.sma import SMAState, sma
from jaxdist.sync.sparseloco import sparseloco
from jaxdist.sync.stale import StaleState, async_sgd, ssp, stale_sync
from jaxdist.sync.streaming_diloco import (
  StreamingDiLoCoState,
  streaming_diloco,
  streaming_exchange,
)
from jaxdist.sync.tick_tock import TickTockState, tick_tock
from jaxdist.sync.weighted import WeightedState, sit_out, weighted_allreduce
from jaxdist.sync.zero_one_adam import ZeroOneAdamState, zero_one_adam

__all__ = [
  'AccumulateState',
  'AllReduceState',
  'BucketedState',
  'ChunkedState',
  'CompressedState',
  'DeMoState',
  'DeferredExchange',
  'DelayedState',
  'DiLoCoState',
  'EagerDiLoCoState',
  'GossipState',
  'GradientDelayState',
  'HiTopKState',
  'LocalSGDState',
  'OneBitAdamState',
  'PowerSGDState',
  'PredictionState',
  'QuantizedState',
  'SMAState',
  'SelSyncState',
  'SkipNonfiniteState',
  'SpikeState',
  'StaleState',
  'StepsDiLoCoState',
  'StreamingDiLoCoState',
  'TickTockState',
  'WeightedState',
  'ZeroOneAdamState',
  'accumulate',
  'all_finite',
  'allreduce',
  'apply_updates',
  'async_sgd',
  'bucketed_allreduce',
  'cd_sgd',
  'chunked_allgather',
  'compressed_allreduce',
  'demo',
  'diloco',
  'diloco_exchange',
  'fragment_labels',
  'gossip',
  'gradient_delay',
  'gradient_norm',
  'hitopk_allreduce',
  'linear_weight_prediction',
  'local_clip',
  'local_sgd',
  'mixing_matrix',
  'od_sgd',
  'onebit_adam',
  'onebit_allreduce',
  'powersgd',
  'quantized_allreduce',
  'selsync',
  'sit_out',
  'skip_nonfinite',
  'sma',
  'sparseloco',
  'spike_compensation',
  'ssd_sgd',
  'ssp',
  'stage_delays',
  'stale_sync',
  'streaming_diloco',
  'streaming_exchange',
  'tick_tock',
  'weighted_allreduce',
  'zero_one_adam',
]
