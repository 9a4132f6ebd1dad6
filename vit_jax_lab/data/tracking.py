"""Tracking sequences (frames + one box per frame) in tf.data: training pairs of a template crop and a search crop
sampled as STARK and OSTrack sample them, and whole sequences for online evaluation.

A tracking dataset has 'frames' and 'boxes' (T, 4) float32 (x, y, w, h) in pixels: frames (T, H, W, C) uint8 of one
shape (tracking_digits), or (T,) encoded image files of any length and size (tracking_benchmarks), with 'absent'
(T,) bool, the frames without a visible target; tracking_digits also has 'distractors' (T, K, 4), the other
digits' boxes (zeros where fewer), for training crops cut around them (data.distractor_fraction).
"""

import math
import os
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax_lab import boxes
from vit_jax_lab.data import images, videos
from vit_jax_lab.data.info import TrackingInfo, split_size
from vit_jax_lab.errors import check


def dataset_info(builder: tfds.core.DatasetBuilder, data_config) -> TrackingInfo:
  features = builder.info.features
  check(
    'frames' in features and 'boxes' in features,
    f'data.name={data_config.name!r} has no frames and boxes features (it has {", ".join(features)}): the tracking '
    'task needs a tracking dataset, e.g. data.name="tracking_digits"',
  )
  check(
    data_config.distractor_fraction == 0 or 'distractors' in features,
    f"data.distractor_fraction={data_config.distractor_fraction} needs the distractors' boxes, which "
    f'data.name={data_config.name!r} does not have; set data.distractor_fraction=0',
  )
  withheld = getattr(builder.builder_config, 'withheld', ())
  for key in ('train_split', 'eval_split'):
    split = data_config[key]
    check(
      split.split('[')[0] not in withheld,
      f'data.{key}={split!r}: {data_config.name} gives the first box alone there (its server scores the rest), so it '
      'is neither trained on nor scored here; use another split (e.g. val), and write its results for the server '
      'with python -m vit_jax_lab.tools.results',
    )
  shape = features['frames'].shape
  if encoded(builder):  # Real videos: sequences of any length and frame size, frames decoded when read.
    frames, height, width, channels = None, None, None, 3
  else:
    frames, height, width, channels = shape
    check(
      None not in (frames, height, width),
      f'data.name={data_config.name!r} has sequences of varying length or frame size {shape} stored as pixels; '
      'store them as encoded frames (as tracking_benchmarks does) to track them one by one',
    )
    check(frames >= 2, f'data.name={data_config.name!r} has sequences of {frames} frame: tracking needs 2 or more')

  root = builder.frames_root() if hasattr(builder, 'frames_root') else None
  check(
    root is None or os.path.isdir(root),
    f'data.name={data_config.name!r} reads its frames from {root}, the folder it was prepared from, which is gone: '
    'put the benchmark back there',
  )
  d = data_config
  return TrackingInfo(
    channels,
    frames,
    None if height is None else (height, width),
    split_size(builder, d.train_split),
    split_size(builder, d.eval_split),
    d.template_size,
    d.search_size,
    d.template_factor,
    d.search_factor,
    tuple(d.value_range),
    root,
  )


def read_frames(frames: tf.Tensor, info: TrackingInfo) -> tf.Tensor:
  """The encoded files of `frames` (any shape): the files themselves, or read from their paths in the folder the
  dataset was prepared from (info.frames_root)."""
  return videos.read_frames(frames, info.frames_root)


def encoded(builder: tfds.core.DatasetBuilder) -> bool:
  """Whether the dataset stores its frames as encoded image files (a string per frame) rather than pixels."""
  return builder.info.features['frames'].dtype == tf.string


def crop(image: tf.Tensor, region: boxes.Region, size: int, fill: float = 0.0) -> tf.Tensor:
  """A (size, size, C) float32 crop of `image` (H, W, C, any number type) over the square `region`, bilinear, each
  crop pixel sampled at its centre (boxes.crop_sample_points); outside the image: `fill`.
  `vit_jax_lab.tasks.tracking.crop` is the same in JAX."""
  x0, y0, side = (tf.cast(v, tf.float32) for v in region)
  height, width = (tf.cast(v, tf.float32) for v in tf.unstack(tf.shape(image)[:2]))
  first_x, last_x = (boxes.crop_sample_points((x0, side), size, i) for i in (0.0, size - 1.0))
  first_y, last_y = (boxes.crop_sample_points((y0, side), size, i) for i in (0.0, size - 1.0))
  # crop_and_resize samples box corners given as fractions of (H - 1) and (W - 1).
  corners = tf.stack([first_y / (height - 1), first_x / (width - 1), last_y / (height - 1), last_x / (width - 1)])
  return tf.image.crop_and_resize(image[None], corners[None], [0], [size, size], extrapolation_value=fill)[0]


def decode_for_crop(data: tf.Tensor, region: boxes.Region, size: int, channels: int) -> tuple[tf.Tensor, tuple]:
  """(frame or the part of it the crop samples, region in its pixels) that a crop of `size` over `region` samples: a
  JPEG decoded at the smallest of libjpeg's DCT scales (1, 1/2, 1/4, 1/8) that leaves the region at least `size`
  pixels wide, so that a crop that shrinks its region 2x or more decodes a quarter of the pixels or fewer (each the
  mean of the pixels it covers, where a full decode would be sampled 2x2 by the crop), and only the rows and columns
  the crop reads, with images.JPEG_MARGIN pixels around them (which makes them a whole decode's pixels); any other
  file, or pixels, whole."""
  x0, y0, side = (tf.cast(v, tf.float32) for v in region)
  if data.dtype != tf.string:
    return data, (x0, y0, side)

  def jpeg():
    index = tf.cast(tf.clip_by_value(tf.floor(tf.math.log(side / size) / math.log(2.0)), 0.0, 3.0), tf.int32)
    r = tf.cast(tf.bitwise.left_shift(1, index), tf.float32)  # Scaled pixel k covers source pixels k r to (k + 1) r.
    scaled = tf.math.ceil(tf.cast(tf.io.extract_jpeg_shape(data)[:2], tf.float32) / r)  # libjpeg rounds up.
    start = tf.stack([y0, x0]) / r
    margin = 1.0 + images.JPEG_MARGIN  # Bilinear sampling reads the pixel after a sample point too.
    # At least 2 pixels a side (the crop divides by the side - 1): a region past an edge keeps the edge's 2.
    first = tf.clip_by_value(tf.floor(start) - margin, 0.0, tf.maximum(scaled - 2.0, 0.0))
    last = tf.clip_by_value(tf.math.ceil(start + side / r) + margin, 0.0, scaled)
    window = tf.cast(tf.concat([first, tf.minimum(tf.maximum(last - first, 2.0), scaled - first)], 0), tf.int32)
    branches = [lambda r=r: tf.io.decode_and_crop_jpeg(data, window, channels=channels, ratio=r) for r in (1, 2, 4, 8)]
    frame = tf.ensure_shape(tf.switch_case(index, branches), [None, None, channels])
    return frame, (x0 / r - first[1], y0 / r - first[0], side / r)

  frame, region = tf.cond(tf.io.is_jpeg(data), jpeg, lambda: (images.decode(data, channels), (x0, y0, side)))
  return frame, region


def _jittered(box: boxes.Box, seed: tf.Tensor, centre_jitter: float, size_jitter: float) -> boxes.Box:
  """OSTrack's search-region jitter: the box's sides scaled by exp(N(0, size_jitter)) each, its centre moved by
  up to +-centre_jitter / 2 times the square root of the jittered area along each axis."""
  size_seed, centre_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  x, y, w, h = box
  sw, sh = tf.unstack(tf.exp(tf.random.stateless_normal([2], size_seed) * size_jitter))
  w, h = w * sw, h * sh
  dx, dy = tf.unstack((tf.random.stateless_uniform([2], centre_seed) - 0.5) * centre_jitter * tf.sqrt(w * h))
  cx, cy, _, _ = boxes.to_centre(box)
  return boxes.from_centre((cx + dx, cy + dy, w, h))


def _away(box: boxes.Box, seed: tf.Tensor, factor: float) -> boxes.Box:
  """A box of the same size whose search region (at `factor`) does not overlap `box`: its centre moved by at
  least half the region plus half the box along a random direction, in the L-infinity sense."""
  x, y, w, h = box
  side = factor * tf.sqrt(w * h)
  angle = tf.random.stateless_uniform([], seed, 0.0, 2 * math.pi)
  direction = tf.stack([tf.cos(angle), tf.sin(angle)])
  reach = (side / 2 + tf.maximum(w, h) / 2) * 1.1 / tf.reduce_max(tf.abs(direction))
  return x + reach * direction[0], y + reach * direction[1], w, h


def _nearest(distractors: tf.Tensor, box: boxes.Box) -> tuple[boxes.Box, tf.Tensor]:
  """The box among `distractors` (K, 4) whose centre is nearest `box`'s, ignoring empty ones (zero width), and
  whether there was any."""
  real = distractors[:, 2] > 0
  cx, cy, _, _ = boxes.to_centre(box)
  dcx, dcy, _, _ = boxes.to_centre(tuple(tf.unstack(distractors, axis=1)))
  distance = tf.where(real, tf.math.squared_difference(dcx, cx) + tf.math.squared_difference(dcy, cy), float('inf'))
  return tuple(tf.unstack(distractors[tf.argmin(distance)])), tf.reduce_any(real)


def scale(frame: tf.Tensor, value_range: tuple[float, float]) -> tf.Tensor:
  """uint8 pixels -> float32 in `value_range`."""
  low, high = value_range
  return tf.cast(frame, tf.float32) / 255.0 * (high - low) + low


def decoded_frames(frames, info: TrackingInfo) -> Iterator[np.ndarray]:
  """The frames of a sequence, encoded files (T,) or pixels (T, H, W, C), one at a time as (H, W, C) float32 in
  data.value_range: what online evaluation of real videos reads (a whole long video would not fit in memory)."""
  for frame in frames:
    pixels = images.decode(tf.constant(frame), info.channels) if isinstance(frame, bytes) else frame
    yield scale(pixels, info.value_range).numpy()


def preprocess_fn(data_config, info: TrackingInfo, train: bool) -> Callable[[dict, tf.Tensor], dict]:
  """A sequence -> for training, one pair: 'template' (S_t, S_t, C) and 'search' (S_s, S_s, C) crops in
  data.value_range, 'box' the target in the search crop (x, y, w, h in crop units; past [0, 1] where the target
  leaves the crop: the tracker learns its whole box, not the part inside, which would pull its answers inward) and
  'present' 1 (0 for a negative search crop: cut away from the target, or around a distractor with the target's
  centre outside it); for evaluation the whole sequence: 'frames' (T, H, W, C) in data.value_range, 'boxes'
  (T, 4) in pixels and 'absent' (T,), the frames without the target (not scored)."""
  d = data_config

  def fn(example: dict, seed: tf.Tensor) -> dict:
    frames, sequence_boxes = example['frames'], example['boxes']
    if not train:
      frames = videos.decode_frames(frames, info.channels)
      return {'frames': scale(frames, d.value_range), 'boxes': sequence_boxes, 'absent': example['absent']}
    template_seed, gap_seed, jitter_seed, negative_seed, away_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 5)
    )
    # Pairs come from frames where the target is visible; the gap counts those frames.
    visible = tf.where(~example['absent'])[:, 0]
    length = tf.shape(visible)[0]
    i = tf.random.stateless_uniform([], template_seed, 0, length, tf.int32)
    gap = tf.random.stateless_uniform([], gap_seed, -d.max_gap, d.max_gap + 1, tf.int32)
    t, s = visible[i], visible[tf.clip_by_value(i + gap, 0, length - 1)]
    template_box, search_box = tuple(tf.unstack(sequence_boxes[t])), tuple(tf.unstack(sequence_boxes[s]))
    # The crops are cut from the uint8 frames and scaled after (not the whole frames), with the pixels outside a
    # frame at the level that scales to 0 in data.value_range, as in online evaluation. A JPEG frame is decoded
    # at the DCT scale its crop allows.
    low, high = d.value_range
    fill = -low / (high - low) * 255.0

    def scaled_crop(k, region, size):
      frame, region = decode_for_crop(read_frames(frames[k], info), region, size, info.channels)
      return scale(crop(frame, region, size, fill), d.value_range)

    template = scaled_crop(t, boxes.region(template_box, d.template_factor), d.template_size)
    around = _jittered(search_box, jitter_seed, d.centre_jitter, d.size_jitter)  # The box the crop is cut around.
    present = tf.random.stateless_uniform([], negative_seed) >= d.negative_fraction
    if d.distractor_fraction > 0:
      which_seed, distractor_jitter_seed = tf.unstack(
        tf.random.experimental.stateless_split(tf.random.experimental.stateless_fold_in(seed, 5), 2)
      )
      nearest, any_distractor = _nearest(example['distractors'][s], search_box)
      on_distractor = any_distractor & (tf.random.stateless_uniform([], which_seed) < d.distractor_fraction)
      around = tf.cond(
        on_distractor,
        lambda: _jittered(nearest, distractor_jitter_seed, d.centre_jitter, d.size_jitter),
        lambda: around,
      )
    around = tf.cond(present, lambda: around, lambda: _away(search_box, away_seed, d.search_factor))
    region = boxes.region(around, d.search_factor)
    search = scaled_crop(s, region, d.search_size)
    in_crop = boxes.to_crop(search_box, region)
    if d.distractor_fraction > 0:  # A crop around a distractor holds the target if the target's centre is in it.
      cx, cy, _, _ = boxes.to_centre(in_crop)
      present &= ~on_distractor | ((cx >= 0) & (cx <= 1) & (cy >= 0) & (cy <= 1))
    return {
      'template': template,
      'search': search,
      'box': tf.stack(in_crop),
      'present': tf.cast(present, tf.float32),
    }

  return fn
