"""Host-side controllers that change a running job between steps.

`dynamic_batching` (Tyagi & Sharma, ACSOS 2020): per-worker batch sizes for
heterogeneous workers, from a static throughput allocation (`allocate`) and a
proportional controller on measured iteration times.

`streams` (ScaDLES, Tyagi & Swany, BigData 2022): devices fed by data streams,
with stream-proportional batches, truncation or persistence buffers, and the
aggregation weights and learning-rate scale of those batches.

`scavenger` (Tyagi & Sharma, CCGrid 2023): the gradient-noise meter γ
(`noise_meter`), affine time/cost models fitted to short profiles, full and
partial searches over (K, B), the choice by time, cost or Pareto knee, and a
job planned with them, its trials given as a callable (`scavenger.plan_job`).

`adopt` (ADOPT, Tyagi & Swany, BigData 2023): the compression ratio among
compiled candidates, by NSGA-II and ASF over fitted communication time and
compression gain, with the exploration / re-solve loop of the paper. (The
name is the controller's factory; its helpers: the `jaxdist.control.adopt`
package's, e.g. `from jaxdist.control.adopt import solve`.)

`gravac` (GraVAC, Tyagi & Swany, CLOUD 2023): the compression factor among a
compiled grid (`candidate_factors`), scaled up every window while the gains
allow, θ_min raised when they agree, stopped where compression throughput
levels off. (Its helpers: `from jaxdist.control.gravac import choose, ratios`.)

`scadles_compression` (ScaDLES, §IV-D): compress or send dense, by the
workers' vote on their smoothed compression gains.

`ewma`: the moving average all of them smooth with.

The trainer runs them through one interface, `host.Controller` (`init`,
`plan(state, t) -> Plan`, `observe(state, record)`): `batches` (per-worker
batches: static, dynamic, streamed, dropped workers, and heterogeneity-aware
DiLoCo's `Window` of inner steps a round), and `gravac_control`,
`scadles_control` and `adopt_control` (`ratio`: the compression ratio of
each step), combined by `chain`.
"""

from jaxdist.control import host, scavenger
from jaxdist.control.adopt import ADOPT, AdoptState, adopt
from jaxdist.control.adopt import CANDIDATES as ADOPT_CANDIDATES
from jaxdist.control.batching import Window, batches
from jaxdist.control.dynamic_batching import (
  DynamicBatching,
  DynamicBatchingState,
  allocate,
  dynamic_batching,
)
from jaxdist.control.ewma import ewma
from jaxdist.control.gravac import GraVAC, GraVACState, candidate_factors, gravac
from jaxdist.control.host import Controller, Plan, Record, chain
from jaxdist.control.ratio import RatioState, adopt_control, gravac_control, scadles_control
from jaxdist.control.scadles import ScaDLES, ScaDLESState, scadles_compression
from jaxdist.control.scavenger import NoiseMeter, NoiseMeterState, noise_meter
from jaxdist.control.streams import (
  RATE_SETS,
  Arrivals,
  Streams,
  StreamState,
  buffer_report,
  lr_scale,
  stream_rates,
  streams,
  weights,
)

__all__ = [
  'ADOPT',
  'ADOPT_CANDIDATES',
  'RATE_SETS',
  'AdoptState',
  'Arrivals',
  'Controller',
  'DynamicBatching',
  'DynamicBatchingState',
  'GraVAC',
  'GraVACState',
  'NoiseMeter',
  'NoiseMeterState',
  'Plan',
  'RatioState',
  'Record',
  'ScaDLES',
  'ScaDLESState',
  'StreamState',
  'Streams',
  'Window',
  'adopt',
  'adopt_control',
  'allocate',
  'batches',
  'buffer_report',
  'candidate_factors',
  'chain',
  'dynamic_batching',
  'ewma',
  'gravac',
  'gravac_control',
  'host',
  'lr_scale',
  'noise_meter',
  'scadles_compression',
  'scadles_control',
  'scavenger',
  'stream_rates',
  'streams',
  'weights',
]
