"""Host-side controllers that change a running job between steps.

`dynamic_batching` (Tyagi & Sharma, ACSOS 2020): per-worker batch sizes for
heterogeneous workers, from a static throughput allocation (`allocate`) and a
proportional controller on measured iteration times.
"""

from jaxdist.control.dynamic_batching import (
  DynamicBatching,
  DynamicBatchingState,
  allocate,
  dynamic_batching,
)

__all__ = ['DynamicBatching', 'DynamicBatchingState', 'allocate', 'dynamic_batching']
