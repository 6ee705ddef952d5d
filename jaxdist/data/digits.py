"""`digits`: scikit-learn's bundled 8x8 handwritten digits as a tfds dataset.

1,797 greyscale 8x8 images (pixel values 0..16) of the digits 0-9, from the
UCI ML hand-written digits data that scikit-learn ships inside its wheel, so
building it needs no download. The split is fixed: every fifth example (index
0, 5, 10, ...) is `test` (360 examples), the rest `train` (1,437).

Images are stored as raw uint8 tensors rather than PNG so that building and
reading need no TensorFlow; the files are array_record, read with
`tfds.data_source`.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds

TEST_EVERY = 5


class Digits(tfds.core.GeneratorBasedBuilder):
  """scikit-learn's 8x8 digits, with a fixed train/test split."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES: ClassVar[dict[str, str]] = {
    '1.0.0': "Every fifth example is test; records in scikit-learn's order."
  }

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          'image': tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
          'label': tfds.features.ClassLabel(num_classes=10),
        }
      ),
      supervised_keys=('image', 'label'),
      disable_shuffling=True,  # keep scikit-learn's order
      homepage='https://scikit-learn.org/stable/datasets/toy_dataset.html#digits-dataset',
      citation=(
        'Alpaydin & Kaynak, "Optical Recognition of Handwritten Digits", UCI ML Repository, 1998.'
      ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # bundled with scikit-learn: nothing to download
    return {
      'train': self._generate_examples(test=False),
      'test': self._generate_examples(test=True),
    }

  def _generate_examples(self, test: bool):
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
      if (i % TEST_EVERY == 0) == test:
        yield i, {'image': image.astype(np.uint8)[..., None], 'label': int(label)}
