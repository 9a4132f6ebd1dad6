"""Video preprocessing in tf.data: clips of `data.num_frames` frames `data.frame_stride` apart, every frame
of a clip cropped and flipped alike. Randomness is stateless and seeded per example, as for images."""

import os
from typing import Callable

import tensorflow as tf

from vit_jax_lab.data import images
from vit_jax_lab.data.images import inception_crop


def clip_starts(length, span: int, clips: int) -> tf.Tensor:
  """(clips,) first frames evenly spaced over [0, max(length - span, 0)], rounded half up; one clip: the centre."""
  last = tf.maximum(length - span, 0)
  if clips == 1:
    return tf.reshape((last + 1) // 2, [1])
  return (2 * tf.range(clips) * last + clips - 1) // (2 * (clips - 1))


def frame_indices(starts: tf.Tensor, num_frames: int, stride: int, length) -> tf.Tensor:
  """(clips, num_frames) frames of the clips at `starts`; a video shorter than a clip loops."""
  return (starts[:, None] + stride * tf.range(num_frames)) % length


def crop_offsets(height, width, crop_height: int, crop_width: int, crops: int) -> tf.Tensor:
  """(crops, 2) top-left corners: 1: the centre; 3: start, centre and end of the longer side (the width
  when square), centred on the other."""
  room = tf.stack([height - crop_height, width - crop_width])
  if crops == 1:
    return (room // 2)[None]
  along = tf.range(3)[:, None] * room // 2
  return tf.where(tf.stack([height > width, height <= width]), along, room // 2)


def read_frames(frames: tf.Tensor, root: str | None) -> tf.Tensor:
  """The encoded files of `frames` (any shape): the files themselves, or, with a `root`, read from their paths
  relative to it (a dataset that keeps its frames as files, so that a clip reads only the frames it takes)."""
  if root is None:
    return frames
  paths = tf.strings.join([root, frames], os.sep)
  return tf.map_fn(tf.io.read_file, paths) if frames.shape.rank else tf.io.read_file(paths)


def decode_frames(frames: tf.Tensor, channels: int) -> tf.Tensor:
  """uint8 frames (T, H, W, C) of encoded frame files (T,) (as the pipeline reads videos: only the frames a clip
  takes are decoded), or the frames as they are."""
  if frames.dtype != tf.string:
    return frames
  spec = tf.TensorSpec([None, None, channels], tf.uint8)
  return tf.map_fn(lambda f: images.decode(f, channels), frames, fn_output_signature=spec)


def _inception_crop(frames: tf.Tensor, seed: tf.Tensor, min_area: float) -> tf.Tensor:
  """One images.inception_crop box for all frames: they lie side by side on the channel axis."""
  shape = tf.shape(frames)
  stacked = tf.reshape(tf.transpose(frames, [1, 2, 0, 3]), [shape[1], shape[2], -1])
  crop = inception_crop(stacked, seed, min_area)
  crop = tf.reshape(crop, [tf.shape(crop)[0], tf.shape(crop)[1], shape[0], shape[3]])
  return tf.transpose(crop, [2, 0, 1, 3])


def preprocess_fn(
  data_config,
  shape: tuple[int, int, int, int],
  train: bool,
  canvas: tuple[int, int] | None = None,
  frames_root: str | None = None,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor | tuple[tf.Tensor, tf.Tensor]]:
  """(uint8 video, its encoded frames or, with `frames_root`, their paths, seed) -> one clip of `shape` (T, H, W, C)
  for training, or for evaluation its (eval_clips * eval_crops, T, H, W, C) views, clip-major; uint8
  (images.preprocess_fn), scaled on the device. With a training `canvas`: the clip's window in it and the parameters
  of its resize, as images.preprocess_fn's."""
  num_frames, height, width, channels = shape
  stride = data_config.frame_stride
  span = (num_frames - 1) * stride + 1
  short = data_config.resize_size or data_config.image_size
  clips, crops = (1, 1) if train else (data_config.eval_clips, data_config.eval_crops)
  jitter, color, antialias = tuple(data_config.scale_jitter), images.color_fn(data_config), data_config.antialias

  def fn(video: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    time_seed, box_seed, crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 4))
    jitter_seed, color_seed = images.augmentation_seeds(seed)
    length = tf.shape(video)[0]
    if train:
      starts = tf.random.stateless_uniform([1], time_seed, 0, tf.maximum(length - span, 0) + 1, tf.int32)
    else:
      starts = clip_starts(length, span, clips)
    frames = tf.gather(video, tf.reshape(frame_indices(starts, num_frames, stride, length), [-1]))
    frames = decode_frames(read_frames(frames, frames_root), channels)  # (clips * T, H, W, C)
    cropped = train and short is not None and not data_config.inception_crop and not data_config.crop_padding
    crop = (height, width)
    if canvas is not None and data_config.inception_crop:
      return images.window(
        _inception_crop(frames, box_seed, data_config.inception_min_area), crop, (0, 0), crop, antialias, canvas
      )
    if canvas is not None:
      return images.random_resized_crop(frames, short, jitter, crop, jitter_seed, crop_seed, antialias, canvas)
    if cropped:  # Resized, jittered and cropped in one resampling of the window the crop keeps.
      frames = images.random_resized_crop(frames, short, jitter, crop, jitter_seed, crop_seed, antialias)
    elif train and data_config.inception_crop:
      frames = tf.image.resize(
        _inception_crop(frames, box_seed, data_config.inception_min_area), crop, antialias=antialias
      )
    elif short is not None:
      frames = images.resize_small(frames, short, antialias)
      if train and jitter != (1.0, 1.0):
        size = images.jittered_size(tf.shape(frames)[1:3], jitter_seed, *jitter, (height, width))
        frames = tf.image.resize(frames, size, antialias=True)
    frames = tf.cast(frames, tf.float32)
    if train:
      if data_config.crop_padding:
        pad = data_config.crop_padding
        frames = tf.pad(frames, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
      if not cropped:
        frames = tf.image.stateless_random_crop(frames, (num_frames, height, width, channels), seed=crop_seed)
      if data_config.augment_on == 'host':  # Else the jitted step flips and colours (data/device.py).
        if data_config.flip:
          frames = tf.where(tf.random.stateless_uniform([], flip_seed) < 0.5, tf.reverse(frames, [2]), frames)
        frames = color(frames, color_seed)
      out_shape = shape
    else:
      offsets = crop_offsets(tf.shape(frames)[1], tf.shape(frames)[2], height, width, crops)
      frames = tf.reshape(frames, tf.concat([[clips, num_frames], tf.shape(frames)[1:]], 0))
      views = [frames[:, :, o[0] : o[0] + height, o[1] : o[1] + width] for o in tf.unstack(offsets, num=crops)]
      out_shape = (clips * crops, *shape)
      frames = tf.reshape(tf.stack(views, 1), out_shape)
    return tf.ensure_shape(images.pixels(frames), out_shape)

  return fn
