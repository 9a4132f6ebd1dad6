"""Digit scenes as a TFDS dataset: 1 to 3 digits of `digits` side by side, captioned in English words.

A built-in, no-network image-captioning task, small enough to train the ViT-encoder seq2seq model on a CPU.
"""

import numpy as np
import tensorflow_datasets as tfds

from vit_jax_lab.data.builders import digits

WORDS = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine')  # Digit d -> WORDS[d].
SIZES = {'train': 6000, 'test': 1000}  # Scenes per split.
SEEDS = {'train': 0, 'test': 1}  # np.random.default_rng seed per split.
MAX_DIGITS = 3  # Slots per scene; each slot is one 8x8 digit.
SLOT = 8  # Columns per slot.


def scenes(test: bool):
  """(key, uint8 image (8, 24, 1), caption) of the `test` or `train` split; digit images only from that split.

  Scene k draws its number of digits n uniformly from 1..MAX_DIGITS, then n digit images uniformly with
  replacement from the split, placed left-aligned in slots 0..n-1; the rest of the canvas is 0. The caption
  names the digits left to right ("seven one four"). Every digit image has a non-zero pixel and no image
  appears under two labels, so the caption is determined by the image.
  """
  split = 'test' if test else 'train'
  _, images, labels = zip(*digits.examples(test))
  images, labels = np.stack(images), np.array(labels)
  rng = np.random.default_rng(SEEDS[split])
  for key in range(SIZES[split]):
    n = int(rng.integers(1, MAX_DIGITS + 1))
    picks = rng.integers(0, len(images), size=n)
    canvas = np.zeros((SLOT, SLOT * MAX_DIGITS, images.shape[-1]), np.uint8)
    for slot, pick in enumerate(picks):
      canvas[:, slot * SLOT : (slot + 1) * SLOT] = images[pick]
    yield key, canvas, ' '.join(WORDS[labels[pick]] for pick in picks)


class DigitScenes(tfds.core.GeneratorBasedBuilder):
  """8x24 grey scenes of 1 to 3 handwritten digits, left-aligned in 8-column slots, and their caption.

  Train scenes use only `digits` train images and test scenes only test images, so test digits are unseen.
  Sizes and seeds are fixed: 6,000 train scenes from default_rng(0), 1,000 test scenes from default_rng(1).
  """

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': '6,000 / 1,000 scenes of 1-3 digits from the digits split; fixed seeds 0 / 1.'}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          'image': tfds.features.Image(shape=(SLOT, SLOT * MAX_DIGITS, 1)),
          'caption': tfds.features.Text(),
        }
      ),
      supervised_keys=('image', 'caption'),
      homepage='https://archive.ics.uci.edu/dataset/80',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {'train': self._generate_examples(test=False), 'test': self._generate_examples(test=True)}

  def _generate_examples(self, test: bool):
    for key, image, caption in scenes(test):
      yield key, {'image': image, 'caption': caption}
