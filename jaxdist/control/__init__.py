"""Host-side controllers that change a running job between steps.

`dynamic_batching` (Tyagi & Sharma, ACSOS 2020): per-worker batch sizes for
heterogeneous workers, from a static throughput allocation (`allocate`) and a
proportional controller on measured iteration times.

`streams` (ScaDLES, Tyagi & Swany, BigData 2022): devices fed by data streams,
with stream-proportional batches, truncation or persistence buffers, and the
aggregation weights and learning-rate scale of those batches.
"""

from jaxdist.control.dynamic_batching import (
  DynamicBatching,
  DynamicBatchingState,
  allocate,
  dynamic_batching,
)
from jaxdist.control.streams import (
  RATE_SETS,
  Streams,
  StreamState,
  buffer_report,
  lr_scale,
  stream_rates,
  streams,
  weights,
)

__all__ = [
  'RATE_SETS',
  'DynamicBatching',
  'DynamicBatchingState',
  'StreamState',
  'Streams',
  'allocate',
  'buffer_report',
  'dynamic_batching',
  'lr_scale',
  'stream_rates',
  'streams',
  'weights',
]
