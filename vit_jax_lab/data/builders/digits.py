"""UCI optical handwritten digits as a TFDS dataset, built from the copy bundled with scikit-learn."""

import numpy as np
import tensorflow_datasets as tfds

TEST_EVERY = 5  # Example i of the 1,797 is in `test` when i % 5 == 0: 360 test, 1,437 train.


class Digits(tfds.core.GeneratorBasedBuilder):
  """8x8 grey images of handwritten digits 0-9 (Alpaydin & Kaynak 1998).

  scikit-learn ships the 1,797 images of the UCI test file with pixel counts 0..16; they are scaled to
  uint8 as round(count * 255 / 16). The split is fixed: example i (in scikit-learn's order) is a test
  example when i % 5 == 0, so `test` has 360 images and `train` 1,437.
  """

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Fixed split: i % 5 == 0 is test.'}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          'image': tfds.features.Image(shape=(8, 8, 1)),
          'label': tfds.features.ClassLabel(num_classes=10),
        }
      ),
      supervised_keys=('image', 'label'),
      homepage='https://archive.ics.uci.edu/dataset/80',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {'train': self._generate_examples(test=False), 'test': self._generate_examples(test=True)}

  def _generate_examples(self, test: bool):
    for i, image, label in examples(test):
      yield i, {'image': image, 'label': label}


def examples(test: bool):
  """(index, uint8 image (8, 8, 1), label) of the `test` or `train` split, in scikit-learn's order."""
  # Bundled data, no network. Imported here: scikit-learn adds 1.6 s to every start, and only a first run needs it.
  from sklearn.datasets import load_digits

  digits = load_digits()
  images = np.round(digits.images * 255.0 / 16.0).astype(np.uint8)[..., None]
  for i, (image, label) in enumerate(zip(images, digits.target)):
    if (i % TEST_EVERY == 0) == test:
      yield i, image, int(label)
