"""α-β network cost model: what a step's communication would take on a real network.

Also the bytes each worker sends (`sent_bytes`) and gradient-bucket planning
(`threshold_buckets`, `mgwfbp_buckets`, `timeline`, from `buckets`), and a
heterogeneous cluster with a modelled clock per worker (`Cluster`,
`WorkerClock`, `simulate`, from `cluster`).
"""

from jaxdist.netmodel.buckets import (
  Buckets,
  backward_times,
  forward_order,
  layer_flops,
  mgwfbp_buckets,
  per_layer_buckets,
  threshold_buckets,
  timeline,
)
from jaxdist.netmodel.calibrate import calibrate, fit_ring
from jaxdist.netmodel.cluster import H_LEVELS, WAITS, Cluster, Timeline, WorkerClock, simulate
from jaxdist.netmodel.hierarchical import (
  Hierarchy,
  flat_time,
  hierarchical_time,
  link_time,
  rail_network,
)
from jaxdist.netmodel.model import (
  ALGORITHMS,
  PROFILES,
  Network,
  Schedule,
  adopt_c1,
  allgather,
  allreduce,
  alltoall,
  artopk,
  broadcast,
  comm_time,
  gbps,
  gossip,
  network_at,
  permute,
  profile,
  resolve,
  sent_bytes,
  step_time,
  transfer_time,
)

__all__ = [
  'ALGORITHMS',
  'H_LEVELS',
  'PROFILES',
  'WAITS',
  'Buckets',
  'Cluster',
  'Hierarchy',
  'Network',
  'Schedule',
  'Timeline',
  'WorkerClock',
  'adopt_c1',
  'allgather',
  'allreduce',
  'alltoall',
  'artopk',
  'backward_times',
  'broadcast',
  'calibrate',
  'comm_time',
  'fit_ring',
  'flat_time',
  'forward_order',
  'gbps',
  'gossip',
  'hierarchical_time',
  'layer_flops',
  'link_time',
  'mgwfbp_buckets',
  'network_at',
  'per_layer_buckets',
  'permute',
  'profile',
  'rail_network',
  'resolve',
  'sent_bytes',
  'simulate',
  'step_time',
  'threshold_buckets',
  'timeline',
  'transfer_time',
]
