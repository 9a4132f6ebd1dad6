"""Labelled images, videos and token sequences (the classification task's data): what the model needs to know of
a dataset, the features read, and the preprocessing that turns an example into model inputs and its label.

A token-sequence dataset has an `inputs` feature of integer ids (variable length, 0 reserved for padding) and
declares its vocabulary in its metadata (`info.metadata['vocabulary']`: the tokens in id order), and, if it knows
it, its longest sequence (`info.metadata['max_length']`); the built-in `listops` does.
"""

from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax_lab.data import images, videos
from vit_jax_lab.data.info import LabelInfo
from vit_jax_lab.errors import ConfigError, check

IMAGE_AUGMENTATIONS = (  # data.* keys that resize or augment images and videos: refused for token inputs.
  'image_size',
  'resize_size',
  'inception_crop',
  'crop_padding',
  'flip',
  'color_augment',
  'color_drop',
  'randaugment_layers',
  'random_erasing',
)


def input_key(features) -> str | None:
  """'image' or 'video', else 'inputs' (token ids): the feature the model input is made from; None when there is
  none, or both an image and a video."""
  keys = [k for k in ('image', 'video') if k in features]
  if not keys and 'inputs' in features:
    return 'inputs'
  return keys[0] if len(keys) == 1 else None


def dataset_info(builder: tfds.core.DatasetBuilder, data_config) -> LabelInfo:
  """Input shape and classes of an image or video classification dataset."""
  name, features = data_config.name, builder.info.features
  key = input_key(features)
  check(
    key is not None and 'label' in features,
    f'data.name={name!r} has features {list(features)}; classification needs "label" and one of "image", "video", '
    '"inputs" (token ids)',
  )
  if key == 'inputs':
    return _token_info(builder, data_config)
  if key == 'image':
    shape = tuple(features['image'].shape)
    if data_config.image_size is not None:
      shape = (data_config.image_size, data_config.image_size, shape[-1])
    elif data_config.resize_size is not None and None not in shape:
      shape = (*(int(n) for n in images.resized_size(shape[0], shape[1], data_config.resize_size)), shape[-1])
    check(None not in shape, f'data.name={name!r} has images of varying size {shape}: set data.image_size')
  else:
    _, height, width, channels = features['video'].shape
    check(
      data_config.image_size is not None or None not in (height, width),
      f'data.name={name!r} has frames of varying size {(height, width)}: set data.image_size',
    )
    if data_config.image_size is not None:
      height = width = data_config.image_size
    elif data_config.resize_size is not None:
      height, width = (int(n) for n in images.resized_size(height, width, data_config.resize_size))
    shape = (data_config.num_frames, height, width, channels)
  return LabelInfo(
    num_classes=features['label'].num_classes,
    input_key=key,
    input_shape=shape,
    num_train=builder.info.splits[data_config.train_split].num_examples,
    num_eval=builder.info.splits[data_config.eval_split].num_examples,
  )


def _token_info(builder: tfds.core.DatasetBuilder, data_config) -> LabelInfo:
  """A token-sequence dataset: its vocabulary from the metadata, sequences padded to data.max_input_length."""
  name, feature, metadata = data_config.name, builder.info.features['inputs'], builder.info.metadata or {}
  check(
    feature.shape == (None,) and np.issubdtype(feature.np_dtype, np.integer),
    f'data.name={name!r}: its "inputs" feature is {feature}; token classification needs integer ids of shape (None,)',
  )
  check(
    'vocabulary' in metadata,
    f"data.name={name!r} declares no vocabulary (info.metadata['vocabulary']), so the token embedding cannot be sized",
  )
  longest, length = metadata.get('max_length'), data_config.max_input_length
  check(
    longest is None or longest <= length,
    f'data.max_input_length={length} is shorter than the sequences of {name} (up to {longest} tokens): set it to '
    f'at least {longest}',
  )
  image_keys = [k for k in IMAGE_AUGMENTATIONS if data_config[k]]
  image_keys += ['scale_jitter'] if tuple(data_config.scale_jitter) != (1.0, 1.0) else []
  if image_keys:
    key = image_keys[0]
    raise ConfigError(
      f'data.{key}={data_config[key]!r} resizes or augments images, and data.name={name!r} has token sequences: '
      'unset it'
    )
  return LabelInfo(
    num_classes=builder.info.features['label'].num_classes,
    input_key='inputs',
    input_shape=(length,),
    num_train=builder.info.splits[data_config.train_split].num_examples,
    num_eval=builder.info.splits[data_config.eval_split].num_examples,
    vocab_size=len(metadata['vocabulary']),
  )


def prepare_fn(info: LabelInfo) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """Raw examples -> only the input feature and the label."""

  def prepare(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.map(lambda ex: {info.input_key: ex[info.input_key], 'label': ex['label']})

  return prepare


def preprocess_fn(data_config, info: LabelInfo, train: bool) -> Callable[[dict, tf.Tensor], dict]:
  """(example, seed) -> {'inputs': an image, a clip, or int32 token ids padded with 0 to input_shape (longer
  sequences cut), 'label': int32}; a video is evaluated on its eval_clips x eval_crops views,
  {'views': (views, T, H, W, C), 'label'}."""
  if info.input_key == 'inputs':
    (length,) = info.input_shape

    def tokens(example: dict, seed: tf.Tensor) -> dict:
      del seed  # Nothing random.
      ids = tf.cast(example['inputs'][:length], tf.int32)
      ids = tf.ensure_shape(tf.pad(ids, [[0, length - tf.shape(ids)[0]]]), [length])
      return {'inputs': ids, 'label': tf.cast(example['label'], tf.int32)}

    return tokens
  check(
    info.input_key == 'image' or (data_config.randaugment_layers == 0 and data_config.random_erasing == 0),
    f'data.randaugment_layers={data_config.randaugment_layers} and data.random_erasing={data_config.random_erasing}: '
    f'these augment images, and data.name={data_config.name!r} has videos: set both to 0',
  )
  module = videos if info.input_key == 'video' else images
  inputs_fn = module.preprocess_fn(data_config, info.input_shape, train)
  key = 'views' if info.input_key == 'video' and not train else 'inputs'

  def fn(example: dict, seed: tf.Tensor) -> dict:
    return {key: inputs_fn(example[info.input_key], seed), 'label': tf.cast(example['label'], tf.int32)}

  return fn
