"""Collectives over named worker axes and exact bytes-on-the-wire accounting."""

from jaxdist.comm import hlo
from jaxdist.comm.collectives import (
  ALL_GATHER,
  ALL_REDUCE,
  ALL_TO_ALL,
  KINDS,
  PERMUTE,
  AxisName,
  Transfer,
  all_gather,
  axis_index,
  axis_size,
  find_transfers,
  pmean,
  psum,
  ran,
  total_bytes,
  transfer,
  tree_nbytes,
)

__all__ = [
  'ALL_GATHER',
  'ALL_REDUCE',
  'ALL_TO_ALL',
  'KINDS',
  'PERMUTE',
  'AxisName',
  'Transfer',
  'all_gather',
  'axis_index',
  'axis_size',
  'find_transfers',
  'hlo',
  'pmean',
  'psum',
  'ran',
  'total_bytes',
  'transfer',
  'tree_nbytes',
]
