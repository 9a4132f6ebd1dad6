"""Image preprocessing in tf.data. Randomness is stateless and seeded per example, so a stream can be
restarted at any example and reproduce the same augmentations."""

import dataclasses
from typing import Callable

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What a model and a task need to know about the data before anything is built."""
  num_classes: int
  input_key: str  # The raw feature the model input is made from: 'image' or 'video'.
  input_shape: tuple[int, ...]  # One preprocessed example: (height, width, channels) or (frames, h, w, c).
  num_train: int  # Examples in the train split (all shards).
  num_eval: int  # Examples in the eval split (all shards).


def inception_crop(image: tf.Tensor, seed: tf.Tensor, min_area: float = 0.05) -> tf.Tensor:
  """A random crop of 5%-100% of the area and aspect ratio 3/4-4/3 (Szegedy et al. 2015)."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), tf.zeros([0, 0, 4], tf.float32), seed=seed, area_range=(min_area, 1.0),
      aspect_ratio_range=(3 / 4, 4 / 3), min_object_covered=0, use_image_if_no_bounding_boxes=True)
  return tf.slice(image, begin, size)


def preprocess_fn(data_config, info: DatasetInfo, train: bool) -> Callable[[dict, tf.Tensor], dict]:
  """(example, seed) -> {'inputs': float32 in data.value_range, 'label': int32}."""
  height, width, channels = info.input_shape
  low, high = data_config.value_range

  def fn(example: dict, seed: tf.Tensor) -> dict:
    crop_seed, pad_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    image = example['image']
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
    return {'inputs': tf.ensure_shape(image, (height, width, channels)), 'label': tf.cast(example['label'], tf.int32)}

  return fn
