"""Image preprocessing in tf.data. Randomness is stateless and seeded per example, so a stream can be
restarted at any example and reproduce the same augmentations."""

from typing import Callable

import tensorflow as tf


def inception_crop(image: tf.Tensor, seed: tf.Tensor, min_area: float = 0.05) -> tf.Tensor:
  """A random crop of 5%-100% of the area and aspect ratio 3/4-4/3 (Szegedy et al. 2015)."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
    tf.shape(image),
    tf.zeros([0, 0, 4], tf.float32),
    seed=seed,
    area_range=(min_area, 1.0),
    aspect_ratio_range=(3 / 4, 4 / 3),
    min_object_covered=0,
    use_image_if_no_bounding_boxes=True,
  )
  return tf.slice(image, begin, size)


def preprocess_fn(data_config, shape: tuple[int, int, int], train: bool) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """(uint8 image, seed) -> float32 image of `shape` (height, width, channels) in data.value_range, augmented
  for training as `data_config` asks."""
  height, width, channels = shape
  low, high = data_config.value_range

  def fn(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    crop_seed, pad_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    if train and data_config.inception_crop:
      image = inception_crop(image, crop_seed)
    image = tf.cast(image, tf.float32)
    if data_config.image_size is not None or (train and data_config.inception_crop):
      image = tf.image.resize(image, (height, width), antialias=True)
    if train and data_config.crop_padding:
      pad = data_config.crop_padding
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.stateless_random_crop(image, (height, width, channels), seed=pad_seed)
    if train and data_config.flip:
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    image = image / 255.0 * (high - low) + low
    return tf.ensure_shape(image, (height, width, channels))

  return fn
