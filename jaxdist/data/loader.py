"""Image classification data from tfds, held in host memory, batched per worker.

`load('digits')` builds the bundled dataset on first use (no download: the
data ships with scikit-learn). Any other tfds name (`mnist`, `cifar10`, ...)
is read from its prepared array_record files; with `download=False` (the
default) an unprepared dataset is an error that says how to prepare it.

The order of batches is a pure function of (seed, step): epoch
`step // steps_per_epoch` is a fresh permutation seeded by (seed, epoch), so a
resumed run sees exactly the batches it would have seen. Worker w of W takes
rows [w·b, (w+1)·b) of each global batch of W·b examples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
import sys
from typing import ClassVar

import filelock
import numpy as np
import tensorflow_datasets as tfds

from jaxdist.data import digits as digits_lib
from jaxdist.data import shakespeare as shakespeare_lib

BUNDLED = ('digits', 'shakespeare')
_CHUNK = 4096  # records read per call


class DatasetError(ValueError):
  """A dataset that cannot be read as asked; the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class Split:
  """One split in host memory: `images` [n, H, W, C] as stored, `labels` [n] int32.

  Attributes:
    images: [n, H, W, C], in the dataset's dtype (uint8 for tfds images).
    labels: [n] int32 class labels.
  """

  images: np.ndarray
  labels: np.ndarray

  def __len__(self) -> int:
    return len(self.labels)


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A train and a test split, standardised per channel with train statistics.

  Attributes:
    name: the dataset's name (a tfds name, or 'synthetic').
    train: the training split.
    test: the test split.
    num_classes: the number of labels.
    mean: [C] each channel's mean over the training images.
    std: [C] each channel's standard deviation over them.
  """

  name: str
  train: Split
  test: Split
  num_classes: int
  mean: np.ndarray
  std: np.ndarray

  input_dtype: ClassVar[type] = np.float32
  tokens_per_example: ClassVar[int | None] = None  # a language model's: its context
  unit: ClassVar[str] = 'example'

  @property
  def image_shape(self) -> tuple[int, ...]:
    return tuple(self.train.images.shape[1:])

  @property
  def input_shape(self) -> tuple[int, ...]:
    """One example's input shape, as the model takes it."""
    return self.image_shape

  @property
  def example_bytes(self) -> int:
    """Bytes of one training example as stored."""
    return self.train.images[0].nbytes

  def normalize(self, images: np.ndarray) -> np.ndarray:
    """Standardised float32 images.

    Args:
      images: [..., C] images as stored.

    Returns:
      (images − mean) / std, float32, of the same shape.
    """
    return ((images.astype(np.float32) - self.mean) / self.std).astype(np.float32)

  def inputs(self, split: Split, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(model inputs, labels) of the examples `idx` (any shape) of `split`.

    Args:
      split: `train` or `test`.
      idx: example indices, any shape.

    Returns:
      (standardised images [*idx.shape, H, W, C], labels [*idx.shape]).
    """
    return self.normalize(split.images[idx]), split.labels[idx]


def synthetic(
  image_shape: tuple[int, ...] = (32, 32, 3),
  num_classes: int = 10,
  train_size: int = 2048,
  test_size: int = 512,
  seed: int = 0,
  signal: float = 0.5,
  grid: int = 4,
) -> Dataset:
  """Class prototypes plus noise: learnable in the steps a smoke run has, no files.

  For smoke tests and `runlocal` configs of datasets the machine does not
  have: same shapes and number of classes, nothing to download. Class c has
  a prototype image: a `grid` x `grid` pattern of random colours (each
  channel of each cell N(0, 1)), every cell a block of pixels. An example
  of class c is `signal` x its prototype plus N(0, 1) noise on every pixel;
  labels are drawn uniformly. The classes differ in the colours of large
  regions, which convolutions and their pooled features pick up as readily
  as dense layers: the CIFAR-shaped `runlocal` config's CNN passes 50% test
  accuracy (chance: 10%) in 16 steps (`tests/test_synthetic.py`). Lower
  `signal` makes it harder.

  Args:
    image_shape: [H, W, C] of one image.
    num_classes: how many classes (prototypes).
    train_size: examples in the train split.
    test_size: examples in the test split.
    seed: seeds the prototypes, the labels and the noise.
    signal: the prototypes' scale against the noise's (> 0): smaller is
      harder.
    grid: cells of the prototypes along each side (at most the image's).

  Returns:
    The `Dataset`, its mean and std per channel from the train split.
  """
  if min(train_size, test_size, num_classes, grid) < 1 or any(d < 1 for d in image_shape):
    raise DatasetError(
      f'synthetic data needs positive sizes, got shape {image_shape}, {num_classes} classes, '
      f'{train_size}/{test_size} examples, grid {grid}'
    )
  if not signal > 0:
    raise DatasetError(f'synthetic data needs signal > 0, got {signal}')
  rng = np.random.default_rng(seed)
  *spatial, channels = image_shape
  cells = [min(grid, d) for d in spatial]
  coarse = rng.standard_normal((num_classes, *cells, channels))
  for axis, (n, d) in enumerate(zip(cells, spatial, strict=True)):  # each cell a block of pixels
    coarse = np.take(coarse, np.arange(d) * n // d, axis=axis + 1)
  prototypes = coarse.reshape(num_classes, *image_shape)

  def split(n):
    labels = rng.integers(0, num_classes, n).astype(np.int32)
    noise = rng.standard_normal((n, *image_shape))
    return Split((signal * prototypes[labels] + noise).astype(np.float32), labels)

  train, test = split(train_size), split(test_size)
  mean, std = _channel_statistics(train.images)
  return Dataset('synthetic', train, test, num_classes, mean, std)


def _channel_statistics(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Mean and std (at least 1e-6) of each channel, the last axis, over all pixels."""
  pixels = images.reshape(-1, images.shape[-1]).astype(np.float64)
  return pixels.mean(0).astype(np.float32), np.maximum(pixels.std(0), 1e-6).astype(np.float32)


def default_data_dir() -> str:
  """Where tfds datasets are read and prepared.

  Returns:
    `$TFDS_DATA_DIR`, else ~/tensorflow_datasets.
  """
  return os.environ.get('TFDS_DATA_DIR', os.path.expanduser('~/tensorflow_datasets'))


def load(
  name: str,
  *,
  data_dir: str | None = None,
  download: bool = False,
  train_split: str = 'train',
  test_split: str = 'test',
) -> Dataset:
  """Loads a tfds image-classification dataset into memory.

  Args:
    name: `digits` (bundled, built on first use) or any tfds name prepared in
      `data_dir` as array_record.
    data_dir: tfds data directory (default `$TFDS_DATA_DIR` or
      `~/tensorflow_datasets`).
    download: let tfds download and prepare a missing dataset (needs the
      internet, and TensorFlow for most datasets).
    train_split: the train split's tfds name, slicing allowed (`train[:90%]`).
    test_split: the test split's tfds name, slicing allowed.

  Returns:
    The `Dataset`.

  Raises:
    DatasetError: unknown name, not prepared, or prepared in a format that has
      no random access.
  """
  data_dir = data_dir or default_data_dir()
  builder = prepared_builder(name, data_dir, download)
  train_source, test_source = sources(name, builder, data_dir, download, (train_split, test_split))
  image_key, label_key = builder.info.supervised_keys or ('image', 'label')
  try:
    num_classes = builder.info.features[label_key].num_classes
  except (KeyError, AttributeError) as e:
    raise DatasetError(
      f'tfds dataset {name!r} has no class label {label_key!r}: `load` reads image '
      f'classifiers; a text dataset is read with `load_text` (config.dataset.context > 0)'
    ) from e
  train = _read_split(train_source, image_key, label_key)
  test = _read_split(test_source, image_key, label_key)
  mean, std = _channel_statistics(train.images)
  return Dataset(name, train, test, num_classes, mean, std)


def prepared_builder(
  name: str, data_dir: str, download: bool, kind: str = 'image'
) -> tfds.core.DatasetBuilder:
  """The tfds builder of `name`, prepared: a bundled dataset is built on first use.

  Raises:
    DatasetError: an unknown name, or a dataset not prepared and `download` off.
  """
  absl_logger = logging.getLogger('absl')
  absl_logger.addFilter(_unbuilt_warning)
  try:
    builder = _builder(name, data_dir, kind)
    if name in BUNDLED and not builder.is_prepared():
      _build_bundled(builder, data_dir)
  finally:
    absl_logger.removeFilter(_unbuilt_warning)
  if not download and not builder.is_prepared():
    raise DatasetError(
      f'tfds dataset {name!r} is not prepared in {data_dir}. Prepare it once with '
      f'`tfds build {name} --data_dir={data_dir} --file_format=array_record` '
      f'(needs the internet and TensorFlow), or allow the download with '
      f'--config.dataset.download=True.'
    )
  return builder


def sources(
  name: str,
  builder: tfds.core.DatasetBuilder,
  data_dir: str,
  download: bool,
  splits: tuple[str, ...],
) -> list:
  """Random-access sources of `splits` (tfds names, slicing allowed) of a prepared dataset."""
  try:
    return tfds.data_source(
      name,
      split=list(splits),
      data_dir=data_dir,
      download=download,
      builder_kwargs={'file_format': 'array_record'},
    )
  except NotImplementedError as e:
    raise DatasetError(
      f'tfds dataset {name!r} in {data_dir} is stored in a format without random access '
      f'({builder.info.file_format}). Rebuild it as array_record: '
      f'`tfds build {name} --data_dir=<new dir> --file_format=array_record`.'
    ) from e
  except ValueError as e:  # an unknown split or a bad slice
    raise DatasetError(
      f'dataset {name!r}: bad split among {list(splits)} ({e}); '
      f'it has {sorted(builder.info.splits)}'
    ) from e


_BUNDLED_BUILDERS = {'digits': digits_lib.Digits, 'shakespeare': shakespeare_lib.Shakespeare}


def _unbuilt_warning(record: logging.LogRecord) -> bool:
  """False for tfds's warning that a bundled dataset's folder is not built yet (we build it)."""
  return 'has no dataset_info.json' not in record.getMessage()


def _builder(name: str, data_dir: str, kind: str = 'image') -> tfds.core.DatasetBuilder:
  if name in _BUNDLED_BUILDERS:
    return _BUNDLED_BUILDERS[name](data_dir=data_dir, file_format='array_record')
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    examples = 'mnist, cifar10' if kind == 'image' else 'lm1b, tiny_shakespeare'
    raise DatasetError(
      f'unknown dataset {name!r}: not a tfds dataset name. jaxdist bundles {BUNDLED}; '
      f'any other tfds {kind} dataset ({examples}, ...) works once prepared.'
    ) from e


def _build_bundled(builder: tfds.core.DatasetBuilder, data_dir: str) -> None:
  """Builds a bundled dataset into `data_dir`, saying so in one line instead of tfds's own."""
  os.makedirs(data_dir, exist_ok=True)
  # Several processes (pytest-xdist, multi-process runs) may build at once.
  with filelock.FileLock(os.path.join(data_dir, f'.{builder.name}.lock')):
    if not builder.is_prepared():
      print(f'preparing the bundled {builder.name} dataset in {data_dir} (once)', file=sys.stderr)
      tfds.display_progress_bar(False)
      with contextlib.redirect_stdout(io.StringIO()):  # tfds's "Downloading and preparing"
        builder.download_and_prepare(file_format='array_record')


def record_chunks(source):
  """A random-access source's records, in order, as lists of at most 4,096 (one read each)."""
  for start in range(0, len(source), _CHUNK):
    yield source.__getitems__(list(range(start, min(start + _CHUNK, len(source)))))


def _read_split(source, image_key: str, label_key: str) -> Split:
  images, labels = [], []
  for records in record_chunks(source):
    images.append(np.stack([r[image_key] for r in records]))
    labels.append(np.asarray([r[label_key] for r in records], np.int32))
  images = np.concatenate(images)
  if images.ndim == 3:
    images = images[..., None]
  return Split(images, np.concatenate(labels))


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng((seed, epoch)).permutation(n)


def batch_indices(step: int, *, seed: int, num_examples: int, batch_size: int) -> np.ndarray:
  """Example indices [batch_size] of global batch `step`; a pure function.

  Each epoch is a fresh permutation seeded by (seed, epoch); the examples left
  over after the last full batch of an epoch are skipped in that epoch.

  Args:
    step: the global batch's index (>= 0).
    seed: seeds each epoch's permutation.
    num_examples: the examples of the split.
    batch_size: the global batch.

  Returns:
    int array [batch_size] of example indices.

  Raises:
    DatasetError: if the batch is larger than the split.
  """
  per_epoch = num_examples // batch_size
  if per_epoch < 1:
    raise DatasetError(f'global batch {batch_size} is larger than the {num_examples} examples')
  epoch, i = divmod(int(step), per_epoch)
  return _permutation(seed, epoch, num_examples)[i * batch_size : (i + 1) * batch_size]


def worker_indices(
  step: int, *, seed: int, num_examples: int, workers: int, per_worker: int
) -> np.ndarray:
  """Global batch `step` as example indices [workers, per_worker]; row w is worker w's.

  Args:
    step: the global batch's index (>= 0).
    seed: seeds each epoch's permutation (as `batch_indices`).
    num_examples: the examples of the split.
    workers: K.
    per_worker: examples per worker.

  Returns:
    int array [workers, per_worker].
  """
  idx = batch_indices(step, seed=seed, num_examples=num_examples, batch_size=workers * per_worker)
  return idx.reshape(workers, per_worker)
