"""Datasets (the bundled `digits` as a real tfds builder), per-worker batching and partitions."""

from jaxdist.data import sequences
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
from jaxdist.data.sequences import Sequences, Windows

__all__ = [
  'BUNDLED',
  'KINDS',
  'Batch',
  'Dataset',
  'DatasetError',
  'Partition',
  'Sampler',
  'Sequences',
  'Split',
  'Windows',
  'batch_indices',
  'default_data_dir',
  'load',
  'make_sampler',
  'sequences',
  'synthetic',
  'worker_indices',
]
