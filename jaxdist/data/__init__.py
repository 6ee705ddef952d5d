"""Datasets (the bundled `digits` as a real tfds builder), per-worker batching and partitions."""

from jaxdist.data.loader import (
  BUNDLED,
  Dataset,
  DatasetError,
  Split,
  batch_indices,
  default_data_dir,
  load,
  synthetic,
  worker_indices,
)
from jaxdist.data.partition import KINDS, Batch, Partition, Sampler, make_sampler

__all__ = [
  'BUNDLED',
  'KINDS',
  'Batch',
  'Dataset',
  'DatasetError',
  'Partition',
  'Sampler',
  'Split',
  'batch_indices',
  'default_data_dir',
  'load',
  'make_sampler',
  'synthetic',
  'worker_indices',
]
