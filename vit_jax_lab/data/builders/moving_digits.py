"""Moving digits as a TFDS dataset: the UCI digits of `digits` sliding in one of four directions, the label."""

import numpy as np
import tensorflow_datasets as tfds

from vit_jax_lab.data.builders import digits

DIRECTIONS = ('right', 'left', 'down', 'up')  # Label order.
VELOCITIES = ((0, 1), (0, -1), (1, 0), (-1, 0))  # (row, col) pixels per frame, one per direction.
FRAMES = 9  # Odd: the middle frame t = 4 is where the digit sits at the group's centre.
SIZE = 20  # Canvas side: an 8x8 digit with its corner at 4..8 +- 4 stays inside.


def video(image: np.ndarray, centre: tuple[int, int], velocity: tuple[int, int]) -> np.ndarray:
  """(FRAMES, SIZE, SIZE, C) uint8: `image` on a black canvas, its top-left corner at centre + v * (t - 4)."""
  h, w, c = image.shape
  frames = np.zeros((FRAMES, SIZE, SIZE, c), np.uint8)
  for t in range(FRAMES):
    row, col = (centre[k] + velocity[k] * (t - FRAMES // 2) for k in range(2))
    frames[t, row : row + h, col : col + w] = image
  return frames


class MovingDigits(tfds.core.GeneratorBasedBuilder):
  """9-frame 20x20 grey videos of a digit moving 1 pixel per frame: right, left, down or up (the label).

  Digit image i of `digits` (same images, same uint8 scaling, same split: test when i % 5 == 0) gives a
  group of 4 videos, one per direction, all passing through the same centre c at the middle frame t = 4;
  c is drawn uniformly from [4, 8] x [4, 8] by np.random.default_rng(i). So `train` has 1,437 * 4 = 5,748
  videos and `test` 360 * 4 = 1,440, each label a quarter of a split.

  Only motion tells the labels apart: the middle frames of a group are identical under all 4 labels, and
  'left' is 'right' played backwards (likewise 'up' and 'down'), so every frame also appears under the
  opposite label. No single frame determines the label: where the digit is (far off the centre) can give
  away the axis of motion, never its direction. The 'digit' feature is the digit's class, for analysis.
  """

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Fixed split as digits; centre from default_rng(i).'}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          'video': tfds.features.Video(shape=(FRAMES, SIZE, SIZE, 1)),
          'label': tfds.features.ClassLabel(names=DIRECTIONS),
          'digit': tfds.features.ClassLabel(num_classes=10),
        }
      ),
      supervised_keys=('video', 'label'),
      homepage='https://archive.ics.uci.edu/dataset/80',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {'train': self._generate_examples(test=False), 'test': self._generate_examples(test=True)}

  def _generate_examples(self, test: bool):
    for i, image, digit in digits.examples(test):
      centre = tuple(int(x) for x in np.random.default_rng(i).integers(4, 9, size=2))
      for label, (name, velocity) in enumerate(zip(DIRECTIONS, VELOCITIES)):
        yield f'{i}-{name}', {'video': video(image, centre, velocity), 'label': label, 'digit': int(digit)}
