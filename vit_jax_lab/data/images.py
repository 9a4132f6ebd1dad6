"""Image preprocessing in tf.data. Randomness is stateless and seeded per example, so a stream can be
restarted at any example and reproduce the same augmentations. The functions on single images also work on
clips (T, H, W, C): every frame is transformed alike."""

import re
from typing import Callable

import numpy as np
import tensorflow as tf

from vit_jax_lab import console
from vit_jax_lab.data import JPEG_PNG, RECOLOR_SCALE, RECOLOR_SHIFT, augment, whole_crop

JPEG_MARGIN = 16  # Pixels decoded around a JPEG crop: its pixels then equal a whole decode's (8 was enough, measured).


def encode_jpeg(pixels: np.ndarray) -> bytes:
  """A uint8 (H, W, 3) frame as a JPEG file of quality 95, as TFDS encodes a video's frames."""
  return tf.io.encode_jpeg(pixels, quality=95).numpy()


def decode_problem(data: bytes, channels: int = 3) -> tuple[tuple[int, ...], str | None]:
  """(shape, None) of an image file as tf.io.decode_image decodes it in training, or ((), why) for one it cannot
  read or complains of. libjpeg and libpng print their complaints straight to the terminal ("Premature end of
  JPEG data": a JPEG cut short, decoded with its missing rows grey) and TensorFlow logs some of them: a test decode
  takes them off the terminal and makes the file damaged; any other line is passed on."""
  if not data.startswith(JPEG_PNG):
    return (), 'not an image file (JPEG, PNG, WebP, BMP, GIF or TIFF)'
  shape, error = (), None
  with console.captured_fd2() as lines:
    try:
      shape = tuple(tf.io.decode_image(data, channels=channels, expand_animations=False).shape)
    except tf.errors.OpError as e:  # The message without TF's op names around it.
      message = re.sub(r'\{\{.*?\}\}|\[Op:\w+\]', '', e.message).strip().splitlines()
      error = message[0][:80] if message else type(e).__name__
  complaints = [
    re.sub(r'^.*\.cc:\d+\] ', '', line.strip()) for line in lines if console.IMAGE_LIBRARY_LINES.search(line)
  ]
  for line in lines:
    if not console.IMAGE_LIBRARY_LINES.search(line):
      console.say(line)
  damaged = [c for c in complaints if not c.startswith('libpng warning')]  # E.g. a PNG's colour profile: harmless.
  if error or damaged:
    return (), f'a damaged image ({damaged[0] if damaged else error})'
  return shape, None


def decode(data: tf.Tensor, channels: int) -> tf.Tensor:
  """uint8 pixels (H, W, channels) of an encoded image file (JPEG, PNG, ...), as TFDS's Image feature decodes it;
  pixels (not a string) are returned as they are. The pipeline reads images encoded, so that its shuffle buffer
  holds files rather than pixels, and decodes them here, after the shuffle."""
  if data.dtype != tf.string:
    return data
  return tf.ensure_shape(tf.io.decode_image(data, channels=channels, expand_animations=False), [None, None, channels])


def inception_box(shape: tf.Tensor, seed: tf.Tensor, min_area: float = 0.05) -> tuple[tf.Tensor, tf.Tensor]:
  """(top-left, size), each (2,) int32, of a random crop of 5%-100% of the area and aspect ratio 3/4-4/3 (Szegedy et
  al. 2015) of an image of `shape` (height, width, ...)."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
    tf.concat([shape[:2], [1]], 0),
    tf.zeros([0, 0, 4], tf.float32),
    seed=seed,
    area_range=(min_area, 1.0),
    aspect_ratio_range=(3 / 4, 4 / 3),
    min_object_covered=0,
    use_image_if_no_bounding_boxes=True,
  )
  return begin[:2], size[:2]


def inception_crop(image: tf.Tensor, seed: tf.Tensor, min_area: float = 0.05) -> tf.Tensor:
  """`inception_box`'s crop of an image (H, W, C): the channels keep their static count."""
  begin, size = inception_box(tf.shape(image), seed, min_area)
  return image[begin[0] : begin[0] + size[0], begin[1] : begin[1] + size[1]]


def decode_inception_crop(data: tf.Tensor, channels: int, seed: tf.Tensor, min_area: float = 0.05) -> tf.Tensor:
  """`inception_crop(decode(data, channels), seed)`, the same pixels, but a JPEG file decodes only the crop and a
  margin around it (libjpeg's cropped decoding, as big_vision's `decode_jpeg_and_inception_crop`): without the
  margin, chroma upsampling at the window's edges differs from a whole decode by up to 14 levels."""
  if data.dtype != tf.string:
    return inception_crop(data, seed, min_area)

  def jpeg():
    shape = tf.image.extract_jpeg_shape(data)
    begin, size = inception_box(shape, seed, min_area)
    first = tf.maximum(begin - JPEG_MARGIN, 0)
    last = tf.minimum(begin + size + JPEG_MARGIN, shape[:2])
    window = tf.image.decode_and_crop_jpeg(data, tf.concat([first, last - first], 0), channels=channels)
    offset = begin - first
    return window[offset[0] : offset[0] + size[0], offset[1] : offset[1] + size[1]]

  crop = tf.cond(tf.io.is_jpeg(data), jpeg, lambda: inception_crop(decode(data, channels), seed, min_area))
  return tf.ensure_shape(crop, [None, None, channels])


def resized_size(height, width, short: int) -> tuple:
  """(height, width) scaled so that the shorter side is `short`, rounded half up; ints or int tensors."""
  shorter = tf.minimum(height, width)
  return (height * short + shorter // 2) // shorter, (width * short + shorter // 2) // shorter


def resize_small(image: tf.Tensor, short: int, antialias: bool = True) -> tf.Tensor:
  """Float pixels resized so that the shorter side is `short`, keeping the aspect ratio."""
  shape = tf.shape(image)
  return tf.image.resize(image, resized_size(shape[-3], shape[-2], short), antialias=antialias)


def central_crop(image: tf.Tensor, height: int, width: int) -> tf.Tensor:
  top, left = (tf.shape(image)[-3] - height) // 2, (tf.shape(image)[-2] - width) // 2
  return image[..., top : top + height, left : left + width, :]


def jittered_size(size, seed: tf.Tensor, low: float, high: float, min_size: tuple[int, int]) -> tf.Tensor:
  """`size` (height, width) each scaled by a factor drawn from [low, high] (scenic's ViViT scale jitter), but never
  below `min_size`, so that a crop of that size still fits."""
  factors = tf.random.stateless_uniform([2], seed, low, high)
  return tf.maximum(tf.cast(tf.round(tf.cast(size, tf.float32) * factors), tf.int32), min_size)


def crop_offset(size, crop: tuple[int, int], seed: tf.Tensor, rank: int) -> tf.Tensor:
  """(top, left) of a random `crop` of an image of `size`, drawn as tf.image.stateless_random_crop draws it for a
  tensor of `rank` whose spatial axes are the last but one two."""
  limit = tf.concat([tf.ones([rank - 3], tf.int32), tf.cast(size, tf.int32) - crop + 1, [1]], 0)
  offset = tf.random.stateless_uniform([rank], seed, maxval=tf.int32.max, dtype=tf.int32) % limit
  return offset[rank - 3 : rank - 1]


def resized_crop(image: tf.Tensor, size, top_left, crop: tuple[int, int], antialias: bool) -> tf.Tensor:
  """float32 `crop` (height, width) at `top_left` of `image` (..., H, W, C) resized to `size`: tf.image.resize then a
  crop, to float rounding, but resampling only the window the crop keeps (a video's jittered frames are up to 1.8x
  the crop)."""
  shape = tf.shape(image)
  scale = tf.cast(size, tf.float32) / tf.cast(shape[-3:-1], tf.float32)
  out = tf.raw_ops.ScaleAndTranslate(
    images=tf.reshape(image, tf.concat([[-1], shape[-3:]], 0)),
    size=crop,
    scale=scale,
    translation=-tf.cast(top_left, tf.float32),
    kernel_type='triangle',  # tf.image.resize's bilinear.
    antialias=antialias,
  )
  return tf.reshape(out, tf.concat([shape[:-3], crop, shape[-1:]], 0))


def random_resized_crop(
  image: tf.Tensor,
  short: int,
  jitter: tuple,
  crop: tuple[int, int],
  jitter_seed,
  crop_seed,
  antialias: bool,
  canvas: tuple[int, int] | None = None,
):
  """A random `crop` of `image` (..., H, W, C) resized so that its shorter side is `short`, then each side scaled by
  a factor drawn from `jitter` (low, high) (antialiased, as scenic's ViViT); float32. With a `canvas`: the window
  the crop reads instead, for the device to resize (`window`)."""
  size = resized_size(tf.shape(image)[-3], tf.shape(image)[-2], short)
  if jitter != (1.0, 1.0):
    size, antialias = jittered_size(size, jitter_seed, *jitter, crop), True
  top_left = crop_offset(size, crop, crop_seed, len(image.shape))
  if canvas is not None:
    return window(image, size, top_left, crop, antialias, canvas)
  return resized_crop(image, size, top_left, crop, antialias)


def window_box(hw, size, top_left, crop: tuple[int, int], antialias: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """(first, last) rows and columns (each (2,) int32) of an image of `hw` (height, width) that
  `resized_crop(image, size, top_left, crop, antialias)` reads (the crop's source and the filter's reach around it),
  and the (8,) float32 parameters that resample them there (data/device.py's `resize_windows`: rows, columns, scale
  (2), shift (2), the filter's reach (2))."""
  hw, crop_t = tf.cast(hw, tf.float32), tf.constant(crop, tf.float32)
  scale = tf.cast(size, tf.float32) / hw
  reach = tf.maximum(1.0 / scale, 1.0) if antialias else tf.ones([2])  # The triangle filter's radius in the source.
  corner = tf.cast(top_left, tf.float32)
  first = tf.floor((corner + 0.5) / scale - 0.5 - reach)
  last = tf.math.ceil((corner + crop_t - 0.5) / scale - 0.5 + reach) + 1
  first = tf.cast(tf.clip_by_value(first, 0.0, hw), tf.int32)
  last = tf.cast(tf.clip_by_value(last, 0.0, hw), tf.int32)
  params = tf.concat([tf.cast(last - first, tf.float32), scale, tf.cast(first, tf.float32) * scale - corner, reach], 0)
  return first, last, params


def in_canvas(x: tf.Tensor, canvas: tuple[int, int], leading: tuple = ()) -> tf.Tensor:
  """uint8 `x` (..., h, w, C) in the top-left corner of a zero `canvas` (height, width); `leading`: the static
  sizes of its leading axes (a clip's frames, None where unknown). Padded as rows of w x C values: tf.pad of
  (H, W, C) is 3x slower (0.41 against 0.14 ms at 448)."""
  shape, channels = tf.shape(x), x.shape[-1]
  rows = tf.reshape(tf.cast(x, tf.uint8), tf.concat([shape[:-3], [shape[-3], shape[-2] * channels]], 0))
  room = [[0, canvas[0] - shape[-3]], [0, (canvas[1] - shape[-2]) * channels]]
  padded = tf.pad(rows, tf.concat([tf.zeros([len(leading), 2], tf.int32), room], 0))
  unknown = [-1 if n is None else n for n in leading]
  return tf.ensure_shape(tf.reshape(padded, [*unknown, *canvas, channels]), [*leading, *canvas, channels])


def window(
  image: tf.Tensor, size, top_left, crop: tuple[int, int], antialias: bool, canvas: tuple[int, int]
) -> tuple[tf.Tensor, tf.Tensor]:
  """`resized_crop(image, size, top_left, crop, antialias)` left to the device (data.augment_on='device'): the
  host cuts the pixels it reads (`window_box`) into the top-left corner of a zero uint8 `canvas` (height, width),
  and data/device.py's `resize_windows` resamples them there, given `window_box`'s parameters. A window larger
  than the canvas (a large photo) is resized here instead and handed over with the identity's parameters, or, in
  a canvas smaller than the crop, shrunk to it and enlarged back on the device (`whole_crop`).
  Resampling is then the device's work: a training image costs the host its decode and a copy."""
  first, last, params = window_box(tf.shape(image)[-3:-1], size, top_left, crop, antialias)
  leading = tuple(image.shape[:-3])

  def cut():
    return in_canvas(image[..., first[0] : last[0], first[1] : last[1], :], canvas, leading), params

  def resized():
    resized_pixels = pixels(resized_crop(image, size, top_left, crop, antialias))
    fits, params = whole_crop(crop, canvas)
    if fits != tuple(crop):
      resized_pixels = pixels(tf.image.resize(resized_pixels, fits, antialias=True))
    return in_canvas(resized_pixels, canvas, leading), tf.constant(params, tf.float32)

  return tf.cond(tf.reduce_all(last - first <= canvas), cut, resized)


def color_augment(image: tf.Tensor, seed: tf.Tensor, prob: float, drop: float) -> tf.Tensor:
  """Float pixels in [0, 255]: with probability `prob`, random brightness (+-32/255), saturation and contrast
  (x 0.6-1.4) and hue (+-0.2), clipped (scenic's video colour augmentation); then with probability `drop`, grey.
  One draw for the whole tensor, so all frames of a clip change alike. Grey images get brightness and contrast."""
  coins, brightness, saturation, contrast, hue = tf.unstack(tf.random.experimental.stateless_split(seed, 5))
  rgb = image.shape[-1] == 3

  def augment(x):
    x = tf.image.stateless_random_brightness(x / 255.0, 32 / 255, brightness)
    if rgb:
      x = tf.image.stateless_random_saturation(x, 0.6, 1.4, saturation)
    x = tf.image.stateless_random_contrast(x, 0.6, 1.4, contrast)
    if rgb:
      x = tf.image.stateless_random_hue(x, 0.2, hue)
    return tf.clip_by_value(x, 0.0, 1.0) * 255.0

  toss = tf.random.stateless_uniform([2], coins)
  image = tf.cond(toss[0] < prob, lambda: augment(image), lambda: image)
  if rgb and drop > 0:
    image = tf.cond(toss[1] < drop, lambda: tf.repeat(tf.image.rgb_to_grayscale(image), 3, axis=-1), lambda: image)
  return image


def rotate90(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """A square image (H, H, C) turned counter-clockwise by 0-3 quarters, drawn from `seed` (data.rotate90)."""
  return tf.image.rot90(image, tf.random.stateless_uniform([], seed, maxval=4, dtype=tf.int32))


def recolor(image: tf.Tensor, seed: tf.Tensor, prob: float) -> tf.Tensor:
  """Float pixels in [0, 255]: with probability `prob`, each channel taken from another (a random order), all
  inverted (255 - x) by a coin toss, then each scaled by RECOLOR_SCALE and shifted by +-RECOLOR_SHIFT levels, clipped
  (data.recolor): any colour for the same shape."""
  coins, order, scale, shift = tf.unstack(tf.random.experimental.stateless_split(seed, 4))
  toss, channels = tf.random.stateless_uniform([2], coins), image.shape[-1]
  shuffled = tf.gather(image, tf.argsort(tf.random.stateless_uniform([channels], order)), axis=-1)
  shuffled = tf.where(toss[1] < 0.5, 255.0 - shuffled, shuffled)
  scales = tf.random.stateless_uniform([channels], scale, *RECOLOR_SCALE)
  shifts = tf.random.stateless_uniform([channels], shift, -RECOLOR_SHIFT, RECOLOR_SHIFT)
  return tf.where(toss[0] < prob, tf.clip_by_value(shuffled * scales + shifts, 0.0, 255.0), image)


def augmentation_seeds(seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(scale jitter, colour) seeds of an example: folded in apart from the older augmentations' seeds, which
  stay what they were."""
  return tuple(tf.unstack(tf.random.experimental.stateless_split(tf.random.experimental.stateless_fold_in(seed, 1), 2)))


def color_fn(data_config) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """The configured training colour augmentation (the identity when data.color_augment and color_drop are 0)."""
  prob, drop = data_config.color_augment, data_config.color_drop
  if prob == 0 and drop == 0:
    return lambda image, seed: image
  return lambda image, seed: color_augment(image, seed, prob, drop)


def pixels(image: tf.Tensor) -> tf.Tensor:
  """Float pixels in [0, 255] rounded to uint8, what the pipeline hands to the device."""
  return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def preprocess_fn(
  data_config, shape: tuple[int, int, int], train: bool, canvas: tuple[int, int] | None = None
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor | tuple[tf.Tensor, tf.Tensor]]:
  """(uint8 image or its encoded file, seed) -> uint8 image of `shape` (height, width, channels), augmented for
  training as `data_config` asks; resized pixels are rounded to whole levels, as PIL's resize gives them. The
  jitted step scales them to data.value_range and erases at random (data/device.py), and with
  data.augment_on='device' flips, RandAugments and colour-augments them first. With a training `canvas`
  (data.device_canvas's; the classification task's batches carry the parameters): (the crop's window in it, the
  resize's parameters) instead, for the jitted step to resize (`window`)."""
  height, width, channels = shape
  short, jitter = data_config.resize_size, tuple(data_config.scale_jitter)
  color, antialias = color_fn(data_config), data_config.antialias
  randaugment = augment.randaugment_fn(data_config)
  on_host = data_config.augment_on == 'host'  # Else the flip, RandAugment and colours are the jitted step's.

  def fn(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    crop_seed, pad_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    jitter_seed, color_seed = augmentation_seeds(seed)
    if train and data_config.inception_crop:
      image = decode_inception_crop(image, channels, crop_seed, data_config.inception_min_area)
    else:
      image = decode(image, channels)
    if canvas is not None and data_config.inception_crop:
      return window(image, (height, width), (0, 0), (height, width), antialias, canvas)
    if canvas is not None:
      return random_resized_crop(image, short, jitter, (height, width), jitter_seed, crop_seed, antialias, canvas)
    if train and data_config.inception_crop:
      image = tf.image.resize(image, (height, width), antialias=antialias)
    elif short is not None and train:  # big_vision's resize_small, scale jitter and a random crop: one resampling.
      image = random_resized_crop(image, short, jitter, (height, width), jitter_seed, crop_seed, antialias)
    elif short is not None:
      image = central_crop(resize_small(image, short, antialias), height, width)
    elif data_config.image_size is not None:
      image = tf.image.resize(image, (height, width), antialias=antialias)
    image = tf.cast(image, tf.float32)
    if train and data_config.crop_padding:
      pad = data_config.crop_padding
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.stateless_random_crop(image, (height, width, channels), seed=pad_seed)
    if train and data_config.flip and on_host:
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    if train and on_host:  # RandAugment draws from a seed of its own, so the draws above stay what they were.
      image = randaugment(image, tf.random.experimental.stateless_fold_in(seed, 2))
      image = color(image, color_seed)
      if data_config.rotate90:  # Seeds of their own again.
        image = rotate90(image, tf.random.experimental.stateless_fold_in(seed, 3))
      if data_config.recolor:
        image = recolor(image, tf.random.experimental.stateless_fold_in(seed, 4), data_config.recolor)
    return tf.ensure_shape(pixels(image), (height, width, channels))

  return fn
