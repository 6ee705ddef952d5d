"""The bundled digits dataset, batch order, and dataset errors."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from jaxdist import data


def test_digits_is_a_real_tfds_dataset_with_a_fixed_split(digits, data_dir):
  import tensorflow_datasets as tfds

  assert (len(digits.train), len(digits.test)) == (1437, 360)
  assert digits.image_shape == (8, 8, 1) and digits.num_classes == 10
  source = tfds.data_source('digits', split='test', data_dir=data_dir, download=False)
  assert len(source) == 360
  reference = load_digits()
  # every fifth example is test, in order
  np.testing.assert_array_equal(digits.test.images[:, :, :, 0], reference.images[::5])
  np.testing.assert_array_equal(digits.test.labels, reference.target[::5])
  np.testing.assert_array_equal(
    np.sort(digits.train.labels), np.sort(np.delete(reference.target, np.s_[::5]))
  )


def test_normalize_uses_train_statistics(digits):
  x = digits.normalize(digits.train.images)
  assert x.dtype == np.float32
  assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3


def test_batch_order_is_a_pure_function_of_seed_and_step():
  kw = dict(seed=3, num_examples=100, batch_size=32)
  assert np.array_equal(data.batch_indices(7, **kw), data.batch_indices(7, **kw))
  assert not np.array_equal(data.batch_indices(7, **kw), data.batch_indices(7, **{**kw, 'seed': 4}))
  epoch = np.concatenate([data.batch_indices(t, **kw) for t in range(3)])  # 3 full batches
  assert len(set(epoch.tolist())) == 96  # no repeats within an epoch
  assert not np.array_equal(data.batch_indices(0, **kw), data.batch_indices(3, **kw))  # reshuffled


def test_workers_split_the_global_batch_in_order():
  idx = data.worker_indices(5, seed=0, num_examples=1000, workers=8, per_worker=4)
  assert idx.shape == (8, 4)
  np.testing.assert_array_equal(
    idx.reshape(-1), data.batch_indices(5, seed=0, num_examples=1000, batch_size=32)
  )


def test_batch_larger_than_dataset_is_an_error():
  with pytest.raises(data.DatasetError, match='larger than the 10 examples'):
    data.batch_indices(0, seed=0, num_examples=10, batch_size=16)


def test_unknown_and_unprepared_datasets_say_what_to_do(tmp_path):
  with pytest.raises(data.DatasetError, match="unknown dataset 'no_such_data'"):
    data.load('no_such_data', data_dir=str(tmp_path))
  with pytest.raises(data.DatasetError, match=r'not prepared .*tfds build mnist'):
    data.load('mnist', data_dir=str(tmp_path))


def test_bad_split_names_the_splits(data_dir):
  with pytest.raises(data.DatasetError, match=r"bad split .*'validation'.*\['test', 'train'\]"):
    data.load('digits', data_dir=data_dir, test_split='validation')


def test_split_slices(data_dir):
  half = data.load('digits', data_dir=data_dir, train_split='train[:50%]')
  assert len(half.train) == 718
