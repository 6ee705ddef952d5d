"""α-β network cost model: what a step's communication would take on a real network."""

from jaxdist.netmodel.calibrate import calibrate
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
  permute,
  profile,
  transfer_time,
)

__all__ = [
  'ALGORITHMS',
  'PROFILES',
  'Network',
  'Schedule',
  'adopt_c1',
  'allgather',
  'allreduce',
  'alltoall',
  'artopk',
  'broadcast',
  'calibrate',
  'comm_time',
  'gbps',
  'permute',
  'profile',
  'transfer_time',
]
