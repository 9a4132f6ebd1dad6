"""The built-in digit_scenes captioning data: sizes, captions, slots that are the named digits of the split."""

import collections

import numpy as np
import pytest
import tensorflow_datasets as tfds

from vit_jax_lab.data.builders import digit_scenes

WORDS = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine')


@pytest.fixture(scope='module')
def builder(tmp_path_factory):
  builder = tfds.builder('digit_scenes', data_dir=str(tmp_path_factory.mktemp('digit_scenes')))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder


@pytest.fixture(scope='module')
def splits(builder):
  return {
    split: tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1, shuffle_files=False))
    for split in ('train', 'test')
  }


@pytest.fixture(scope='module')
def digit_images():
  """split -> label -> set of 8x8 image bytes, from scikit-learn directly (test when i % 5 == 0)."""
  from sklearn.datasets import load_digits

  digits = load_digits()
  images = np.round(digits.images * 255 / 16).astype(np.uint8)
  by_split = {'train': collections.defaultdict(set), 'test': collections.defaultdict(set)}
  for i, (image, label) in enumerate(zip(images, digits.target)):
    by_split['test' if i % 5 == 0 else 'train'][int(label)].add(image.tobytes())
  return by_split


def captions(data) -> list[list[str]]:
  return [c.decode().split(' ') for c in data['caption']]


def test_sizes_features_and_constants(builder, splits):
  assert digit_scenes.WORDS == WORDS and digit_scenes.MAX_DIGITS == 3
  assert digit_scenes.SIZES == {'train': 6000, 'test': 1000}
  assert builder.info.supervised_keys == ('image', 'caption')
  assert str(builder.info.version) == '1.0.0'
  for split, n in (('train', 6000), ('test', 1000)):
    assert builder.info.splits[split].num_examples == n
    assert splits[split]['image'].shape == (n, 8, 24, 1) and splits[split]['image'].dtype == np.uint8
    assert len(splits[split]['caption']) == n


def test_captions_are_one_to_three_digit_words_and_all_counts_occur(splits):
  for split, data in splits.items():
    words = captions(data)
    assert all(1 <= len(w) <= 3 and set(w) <= set(WORDS) for w in words), split
    counts = collections.Counter(len(w) for w in words)
    assert set(counts) == {1, 2, 3}, (split, counts)
    n = len(words)
    assert all(0.25 * n < counts[k] < 0.42 * n for k in (1, 2, 3)), (split, counts)  # Uniform over 1..3.
    assert set(w for ws in words for w in ws) == set(WORDS), split  # Every digit appears.


def test_slots_are_the_named_digits_of_the_same_split_and_empty_slots_are_zero(splits, digit_images):
  for split, data in splits.items():
    for image, words in zip(data['image'], captions(data)):
      slots = [image[:, 8 * s : 8 * (s + 1), 0] for s in range(3)]
      for slot, word in zip(slots, words):
        assert slot.tobytes() in digit_images[split][WORDS.index(word)], (split, words)
      for slot in slots[len(words) :]:
        assert not slot.any(), (split, words)


def test_scenes_are_deterministic_and_match_the_dataset(splits):
  first, second = list(digit_scenes.scenes(test=True)), list(digit_scenes.scenes(test=True))
  assert [k for k, _, _ in first] == list(range(1000))
  assert all(a[2] == b[2] and np.array_equal(a[1], b[1]) for a, b in zip(first, second))
  data = splits['test']
  got = collections.Counter(zip(map(bytes, data['image']), data['caption'].tolist()))
  assert got == collections.Counter((image.tobytes(), caption.encode()) for _, image, caption in first)
