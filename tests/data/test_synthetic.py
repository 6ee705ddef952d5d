"""The synthetic stand-in (`data.synthetic`) is learnt: by a classifier written out, and in a
`runlocal` run of the CIFAR-shaped config."""

import numpy as np
import pytest

from jaxdist import data
from jaxdist.train import factory, trainer

from conftest import REPO

CHANCE = 0.1  # 10 classes, drawn uniformly


def test_nearest_class_mean_of_the_train_split_classifies_the_test_split():
  ds = data.synthetic()
  assert ds.image_shape == (32, 32, 3) and ds.num_classes == 10
  assert (len(ds.train), len(ds.test)) == (2048, 512)
  x = ds.normalize(ds.train.images).reshape(len(ds.train), -1).astype(np.float64)
  assert abs(float(x.mean())) <= 1e-4 and abs(float(x.std()) - 1) <= 1e-3  # train statistics
  means = np.stack([x[ds.train.labels == c].mean(0) for c in range(10)])
  test = ds.normalize(ds.test.images).reshape(len(ds.test), -1).astype(np.float64)
  nearest = np.argmin(((test[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
  assert float(np.mean(nearest == ds.test.labels)) >= 0.95


def test_the_stand_in_is_the_same_for_the_same_seed_and_checks_its_arguments():
  a, b = data.synthetic((8, 8, 1), 3, 16, 4, seed=1), data.synthetic((8, 8, 1), 3, 16, 4, seed=1)
  np.testing.assert_array_equal(a.train.images, b.train.images)
  np.testing.assert_array_equal(a.test.labels, b.test.labels)
  with pytest.raises(data.DatasetError, match=r'synthetic data needs signal > 0, got 0'):
    data.synthetic(signal=0)


def test_a_small_conv_net_learns_the_cifar_shaped_runlocal_stand_in(tmp_path):
  config = factory.load_config(
    f'{REPO}/configs/cifar10_resnet20.py:runlocal',
    **{
      'model.name': 'cnn', 'steps': 16, 'eval_every': 16, 'checkpoint_every': 16,
      'noise_every': 0, 'network.compute_s': 0.05, 'progress': False,
    },
  )  # fmt: skip
  summary = trainer.train_and_evaluate(config, str(tmp_path))
  assert summary['dataset'] == 'synthetic'
  assert summary['test_accuracy'] >= CHANCE + 0.4  # chance is 0.1
