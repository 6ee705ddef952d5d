"""Datasets (the bundled `digits` and `shakespeare` as tfds builders), batching, partitions."""

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
from jaxdist.data.text import Text, load_text

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
  'Text',
  'Windows',
  'batch_indices',
  'default_data_dir',
  'load',
  'load_text',
  'make_sampler',
  'sequences',
  'synthetic',
  'worker_indices',
]
