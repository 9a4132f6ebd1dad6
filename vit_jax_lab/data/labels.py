"""Labelled images, videos and token sequences (the classification task's data): what the model needs to know of
a dataset, the features read, and the preprocessing that turns an example into model inputs and its label.

A token-sequence dataset has an `inputs` feature of integer ids (variable length, 0 reserved for padding) and
declares its vocabulary in its metadata (`info.metadata['vocabulary']`: the tokens in id order), and, if it knows
it, its longest sequence (`info.metadata['max_length']`); the built-in `listops` does.
"""

from typing import Callable

import tensorflow as tf

from vit_jax_lab.data import device_canvas, images, videos
from vit_jax_lab.data.info import LabelInfo
from vit_jax_lab.errors import check


def prepare_fn(info: LabelInfo) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """Raw examples -> only the input feature and the label."""

  def prepare(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.map(lambda ex: {info.input_key: ex[info.input_key], 'label': ex['label']})

  return prepare


def preprocess_fn(data_config, info: LabelInfo, train: bool) -> Callable[[dict, tf.Tensor], dict]:
  """(example, seed) -> {'inputs': an image, a clip, or int32 token ids padded with 0 to input_shape (longer
  sequences cut), 'label': int32}; a video is evaluated on its eval_clips x eval_crops views,
  {'views': (views, T, H, W, C), 'label'}. A training crop the jitted step resizes (data.device_canvas) comes as
  its window, with the resize's parameters in 'resize'."""
  if info.input_key == 'inputs':
    (length,) = info.input_shape

    def tokens(example: dict, seed: tf.Tensor) -> dict:
      del seed  # Nothing random.
      ids = tf.cast(example['inputs'][:length], tf.int32)
      ids = tf.ensure_shape(tf.pad(ids, [[0, length - tf.shape(ids)[0]]]), [length])
      return {'inputs': ids, 'label': tf.cast(example['label'], tf.int32)}

    return tokens
  d = data_config
  check(
    info.input_key == 'image' or not (d.randaugment_layers or d.random_erasing or d.rotate90 or d.recolor),
    f'data.randaugment_layers={d.randaugment_layers}, data.random_erasing={d.random_erasing}, data.rotate90='
    f'{d.rotate90} and data.recolor={d.recolor}: these augment images, and data.name={d.name!r} has videos: unset '
    'them',
  )
  canvas = device_canvas(data_config, *info.input_shape[-3:-1], train, info.source_size)
  if info.input_key == 'video':
    inputs_fn = videos.preprocess_fn(data_config, info.input_shape, train, canvas, info.frames_root)
  else:
    inputs_fn = images.preprocess_fn(data_config, info.input_shape, train, canvas)
  key = 'views' if info.input_key == 'video' and not train else 'inputs'

  def fn(example: dict, seed: tf.Tensor) -> dict:
    inputs = inputs_fn(example[info.input_key], seed)
    if isinstance(inputs, tuple):  # A window and its resize's parameters: the jitted step resizes (data/device.py).
      return {key: inputs[0], 'resize': inputs[1], 'label': tf.cast(example['label'], tf.int32)}
    return {key: inputs, 'label': tf.cast(example['label'], tf.int32)}

  return fn
