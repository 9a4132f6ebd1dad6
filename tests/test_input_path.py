"""The input path at the scale of real data: images and videos are shuffled as their files and decoded after the
shuffle, a JPEG's inception crop decodes only its window, and the host memory a run's buffers need is checked
before anything runs."""

import io
import os

import jax
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import load_config
from vit_jax_lab import parallel
from vit_jax_lab.data import images, labels, pipeline


def photo_tree(root, per_class=6, classes=3) -> None:
  """JPEGs of three chroma subsamplings (4:4:4, 4:2:2, 4:2:0) and sizes, and a PNG per class, in train/ and test/."""
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for c in range(classes):
      os.makedirs(root / split / f'c{c}', exist_ok=True)
      for i in range(per_class):
        height, width = (int(n) for n in rng.integers(24, 61, 2))
        pixels = np.clip(rng.normal(128, 60, (height, width, 3)), 0, 255).astype(np.uint8)
        if i == 0:
          Image.fromarray(pixels).save(root / split / f'c{c}' / f'{i}.png')
        else:
          Image.fromarray(pixels).save(root / split / f'c{c}' / f'{i}.jpg', quality=90, subsampling=i % 3)


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
  root = tmp_path_factory.mktemp('photos')
  photo_tree(root)
  return root


def deit_like(photos, data_dir, **data):
  """The digits smoke config on the photo folder with the DeiT recipe's input settings."""
  config = load_config('configs/vit/digits.py:smoke', str(data_dir))
  config.data.update(
    dict(
      name=f'folder:{photos}',
      image_size=16,
      resize_size=18,
      inception_crop=True,
      flip=True,
      randaugment_layers=2,
      randaugment_magnitude=9.0,
      batch_size=8,
      shuffle_buffer=7,
    )
  )
  config.data.update(data)
  return config


def stream(config, start_step: int, num_batches: int) -> list[dict]:
  builder, info = pipeline.load(config.data, labels.dataset_info)
  sharding = jax.sharding.NamedSharding(parallel.make_mesh(config.mesh), parallel.BATCH)
  it = pipeline.train_iterator(
    builder,
    config.data,
    labels.preprocess_fn(config.data, info, train=True),
    sharding,
    seed=config.seed,
    start_step=start_step,
    prepare=labels.prepare_fn(info),
  )
  return [jax.device_get(next(it)) for _ in range(num_batches)]


def test_images_are_shuffled_as_files_and_decoded_after_into_the_same_batches(photos, tmp_path, monkeypatch):
  config = deit_like(photos, tmp_path)
  builder, _ = pipeline.load(config.data, labels.dataset_info)
  read = pipeline._read(builder, 'train', False, lambda ds: ds)
  assert read.element_spec['image'].dtype == tf.string  # What the shuffle buffer holds: files.
  late = stream(config, 0, 5)  # 15 training images: three epochs and more.
  monkeypatch.setattr(pipeline, 'encoded_features', lambda builder: [])  # TFDS decodes before the shuffle.
  early = stream(config, 0, 5)
  for a, b in zip(late, early):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
    np.testing.assert_array_equal(a['label'], b['label'])


def test_a_resumed_stream_of_encoded_images_equals_the_uninterrupted_one(photos, tmp_path):
  config = deit_like(photos, tmp_path, random_erasing=0.25, repeated_augment=2)
  full = stream(config, 0, 6)
  for a, b in zip(stream(config, 3, 3), full[3:]):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
    np.testing.assert_array_equal(a['label'], b['label'])


@pytest.mark.parametrize('subsampling', [0, 1, 2])
def test_a_jpeg_inception_crop_decodes_its_window_into_a_whole_decodes_pixels(subsampling):
  rng, cropped = np.random.default_rng(subsampling), 0
  for k in range(12):
    height, width = (int(n) for n in rng.integers(40, 300, 2))
    pixels = np.clip(rng.normal(128, 50, (height, width, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, 'JPEG', quality=85, subsampling=subsampling)
    data, seed = tf.constant(buffer.getvalue()), tf.constant([subsampling, k], tf.int64)
    fused = images.decode_inception_crop(data, 3, seed).numpy()
    whole = images.inception_crop(images.decode(data, 3), seed).numpy()
    np.testing.assert_array_equal(fused, whole)
    cropped += fused.shape[:2] != (height, width)
  assert cropped >= 6  # Windows inside the image, where libjpeg's cropped decoding is what is compared.
