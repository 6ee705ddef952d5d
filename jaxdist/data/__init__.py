"""Datasets (the bundled `digits` as a real tfds builder) and per-worker batching."""

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

__all__ = [
  'BUNDLED',
  'Dataset',
  'DatasetError',
  'Split',
  'batch_indices',
  'default_data_dir',
  'load',
  'synthetic',
  'worker_indices',
]
