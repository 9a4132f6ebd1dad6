"""RandAugment (Cubuk et al. 2020) for training images, as TensorFlow ops with stateless randomness: each example's
draws follow from its seed, so a resumed stream augments exactly as before. (Random erasing runs in the jitted step:
data/device.py.)

The ops take and return uint8 images (height, width, channels), with PIL's semantics as big_vision's
`pp/autoaugment.py` and timm reimplement them: blends are computed in float, clipped to [0, 255] and truncated to
uint8; geometric ops fill uncovered pixels with grey 128. Colour ops see a grey (1-channel) image as its own grey
version, so they work on any channel count.

Magnitude m (0-10, the scale of big_vision and timm; larger values extrapolate) sets every op's strength so that
distortion grows with m and m = 0 changes nothing but autocontrast and equalize (timm's "increasing" ops, which
DeiT's `rand-m9-mstd0.5-inc1` uses), with f = m / 10:
  rotate +-30 f degrees; shear x/y +-0.3 f; translate x/y +-0.45 f of the image side (big_vision's 100 px at 224);
  solarize pixels >= 256 (1 - f); posterize to 8 - floor(4 f) bits (at least 1); colour, contrast, brightness,
  sharpness by a factor 1 +- 0.9 f (at least 0). Signs are drawn at random.
big_vision's (the TF TPU) mapping differs for posterize, solarize and the four enhance ops, where strength does not
grow with m (its m = 0 solarizes every pixel and keeps 0 bits); AugReg's magnitudes were tuned with that mapping.
As in the paper and big_vision, each of the n layers applies one op drawn uniformly (always, with no probability of
skipping it, and no magnitude noise: timm's `mstd0.5` is not reproduced).
"""

import math
from typing import Callable

import tensorflow as tf

from vit_jax_lab.data.device import RANDAUGMENT_OPS

# The RandAugment paper's 14 ops (its Table 1 list; big_vision and timm add invert, cutout and solarize-add), in the
# order the draws index, shared with the device's ops.
OPS = RANDAUGMENT_OPS
FILL = 128  # Uncovered pixels of geometric ops: mid grey, as big_vision and timm fill them.
MAX_MAGNITUDE = 30.0  # Magnitudes are checked against this (AugReg's strongest is 20).


def _uint8(x: tf.Tensor) -> tf.Tensor:
  """Float pixels clipped to [0, 255] and truncated, as big_vision's blend casts them."""
  return tf.cast(tf.clip_by_value(x, 0.0, 255.0), tf.uint8)


def blend(degenerate: tf.Tensor, image: tf.Tensor, factor) -> tf.Tensor:
  """degenerate + factor * (image - degenerate): PIL's ImageEnhance; factor 1 is the image, 0 the degenerate one."""
  d = tf.cast(degenerate, tf.float32)
  return _uint8(d + factor * (tf.cast(image, tf.float32) - d))


def grey(image: tf.Tensor) -> tf.Tensor:
  """uint8 (H, W, C) -> uint8 (H, W, 1) luma (ITU-R 601, rounded as PIL's convert('L')); a grey image is itself."""
  if image.shape[-1] == 1:
    return image
  luma = tf.reduce_sum(tf.cast(image, tf.float32) * tf.constant([0.299, 0.587, 0.114]), -1, keepdims=True)
  return _uint8(tf.round(luma))


def identity(image: tf.Tensor) -> tf.Tensor:
  return image


def _per_channel_lut(image: tf.Tensor, lut: tf.Tensor) -> tf.Tensor:
  """uint8 image (H, W, C) mapped through a lookup table (C, 256) per channel: one gather, the cheap way."""
  channels = image.shape[-1]
  index = tf.cast(image, tf.int32) + tf.range(channels) * 256
  return tf.gather(tf.reshape(lut, [-1]), index)


def _histograms(image: tf.Tensor) -> tf.Tensor:
  """(C, 256) int32 pixel counts of each channel of a uint8 image, in one bincount."""
  channels = image.shape[-1]
  index = tf.reshape(tf.cast(image, tf.int32) + tf.range(channels) * 256, [-1])
  return tf.reshape(tf.math.bincount(index, minlength=256 * channels, maxlength=256 * channels), [channels, 256])


def autocontrast(image: tf.Tensor) -> tf.Tensor:
  """Each channel stretched linearly so its darkest pixel is 0 and its brightest 255 (a flat channel is kept)."""
  levels = tf.range(256, dtype=tf.float64)  # PIL's arithmetic (Python floats), so the truncation agrees at integers.
  lo = tf.cast(tf.reduce_min(image, axis=(0, 1)), tf.float64)[:, None]
  hi = tf.cast(tf.reduce_max(image, axis=(0, 1)), tf.float64)[:, None]
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  stretched = tf.clip_by_value(levels * scale - lo * scale, 0.0, 255.0)
  return _per_channel_lut(image, tf.cast(tf.where(hi > lo, stretched, levels), tf.uint8))


def equalize(image: tf.Tensor) -> tf.Tensor:
  """Each channel's histogram equalised (PIL's ImageOps.equalize): level v maps to (pixels below v + step / 2) //
  step, with step = (pixels - those at the highest occupied level) // 255; step 0 (e.g. two levels) keeps it."""
  hist = _histograms(image)
  highest = tf.gather(hist, 255 - tf.argmax(tf.reverse(hist, [1]) > 0, axis=1, output_type=tf.int32), batch_dims=1)
  step = (tf.reduce_sum(hist, 1) - highest)[:, None] // 255
  lut = tf.minimum((tf.cumsum(hist, axis=1, exclusive=True) + step // 2) // tf.maximum(step, 1), 255)
  lut = tf.where(step > 0, lut, tf.range(256)[None])
  return _per_channel_lut(image, tf.cast(lut, tf.uint8))


def _transform(image: tf.Tensor, matrix) -> tf.Tensor:
  """Output pixel (x, y) samples the input at (a0 x + a1 y + a2, b0 x + b1 y + b2), bilinearly, pixel centres at
  integer coordinates; outside the input: FILL."""
  a0, a1, a2, b0, b1, b2 = (tf.cast(v, tf.float32) for v in matrix)
  transform = tf.reshape(tf.stack([a0, a1, a2, b0, b1, b2, 0.0, 0.0]), [1, 8])
  out = tf.raw_ops.ImageProjectiveTransformV3(
    images=tf.cast(image, tf.float32)[None],
    transforms=transform,
    output_shape=tf.shape(image)[:2],
    fill_value=float(FILL),
    interpolation='BILINEAR',
    fill_mode='CONSTANT',
  )[0]
  return _uint8(tf.round(out))


def rotate(image: tf.Tensor, degrees) -> tf.Tensor:
  """Rotated counterclockwise (as displayed) by `degrees` about the image centre."""
  theta = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  cos, sin = tf.cos(theta), tf.sin(theta)
  shape = tf.cast(tf.shape(image), tf.float32)
  cy, cx = (shape[0] - 1) / 2, (shape[1] - 1) / 2
  return _transform(image, (cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy))


def shear_x(image: tf.Tensor, level) -> tf.Tensor:
  """Row y shifted left by level * y (PIL's affine (1, level, 0, 0, 1, 0), about the top-left corner)."""
  return _transform(image, (1.0, level, 0.0, 0.0, 1.0, 0.0))


def shear_y(image: tf.Tensor, level) -> tf.Tensor:
  return _transform(image, (1.0, 0.0, 0.0, level, 1.0, 0.0))


def translate_x(image: tf.Tensor, pixels) -> tf.Tensor:
  """Content moved right by `pixels` (left if negative)."""
  return _transform(image, (1.0, 0.0, -tf.cast(pixels, tf.float32), 0.0, 1.0, 0.0))


def translate_y(image: tf.Tensor, pixels) -> tf.Tensor:
  """Content moved down by `pixels`."""
  return _transform(image, (1.0, 0.0, 0.0, 0.0, 1.0, -tf.cast(pixels, tf.float32)))


def solarize(image: tf.Tensor, threshold) -> tf.Tensor:
  """Pixels >= threshold inverted (255 - x)."""
  return tf.where(tf.cast(image, tf.float32) < tf.cast(threshold, tf.float32), image, 255 - image)


def posterize(image: tf.Tensor, bits) -> tf.Tensor:
  """Only the `bits` (1-8) most significant bits of each pixel kept."""
  shift = tf.cast(8 - bits, tf.uint8)
  return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def color(image: tf.Tensor, factor) -> tf.Tensor:
  """Saturation: blended with the image's grey version (factor 0: grey)."""
  return blend(tf.broadcast_to(grey(image), tf.shape(image)), image, factor)


def contrast(image: tf.Tensor, factor) -> tf.Tensor:
  """Blended with a flat image of the grey version's mean, rounded (PIL's ImageEnhance.Contrast; big_vision's copy
  takes the pixel count / 256 for that mean)."""
  mean = tf.round(tf.reduce_mean(tf.cast(grey(image), tf.float32)))
  return blend(tf.fill(tf.shape(image), mean), image, factor)


def brightness(image: tf.Tensor, factor) -> tf.Tensor:
  """Blended with black."""
  return blend(tf.zeros_like(image), image, factor)


def sharpness(image: tf.Tensor, factor) -> tf.Tensor:
  """Blended with a smoothed version (PIL's SMOOTH kernel [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13 inside, the border
  pixels kept): factor 0 blurs, above 1 sharpens."""
  channels = image.shape[-1]
  kernel = tf.constant([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, channels, 1])
  x = tf.cast(image, tf.float32)
  smooth = tf.nn.depthwise_conv2d(x[None], kernel, [1, 1, 1, 1], 'VALID')[0]
  smooth = tf.cast(_uint8(tf.round(smooth)), tf.float32)  # PIL rounds its filters.
  inside = tf.pad(tf.ones_like(smooth, tf.bool), [[1, 1], [1, 1], [0, 0]])
  degenerate = tf.where(inside, tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), x)
  return blend(degenerate, image, factor)


def _op_fns(magnitude: float, sign: tf.Tensor) -> list[Callable[[tf.Tensor], tf.Tensor]]:
  """The ops of OPS, in order, at `magnitude` (see the module docstring), signed ones with `sign` (+-1.0)."""
  f = magnitude / 10.0
  enhance = tf.maximum(0.0, 1.0 + sign * 0.9 * f)
  bits = min(8, max(1, 8 - math.floor(4 * f)))
  threshold = min(256.0, max(0.0, 256.0 * (1.0 - f)))

  def translate(image, axis):
    return sign * 0.45 * f * tf.cast(tf.shape(image)[axis], tf.float32)

  return [
    identity,
    autocontrast,
    equalize,
    lambda x: rotate(x, sign * 30.0 * f),
    lambda x: solarize(x, threshold),
    lambda x: color(x, enhance),
    lambda x: posterize(x, bits),
    lambda x: contrast(x, enhance),
    lambda x: brightness(x, enhance),
    lambda x: sharpness(x, enhance),
    lambda x: shear_x(x, sign * 0.3 * f),
    lambda x: shear_y(x, sign * 0.3 * f),
    lambda x: translate_x(x, translate(x, 1)),
    lambda x: translate_y(x, translate(x, 0)),
  ]


def randaugment(image: tf.Tensor, seed: tf.Tensor, layers: int, magnitude: float) -> tf.Tensor:
  """uint8 image -> uint8 image after `layers` ops, each drawn uniformly from OPS and its sign at random, by
  `seed` alone (layer l draws from fold_in(seed, l))."""
  for layer in range(layers):
    layer_seed = tf.random.experimental.stateless_fold_in(seed, layer)
    op_seed, sign_seed = tf.unstack(tf.random.experimental.stateless_split(layer_seed, 2))
    op = tf.random.stateless_uniform([], op_seed, 0, len(OPS), dtype=tf.int32)
    sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, -1.0, 1.0)
    image = tf.switch_case(op, [lambda fn=fn: fn(image) for fn in _op_fns(magnitude, sign)])
  return image


def randaugment_fn(data_config) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """The configured RandAugment on float pixels in [0, 255] (rounded to uint8 for the ops, as they expect), or the
  identity when data.randaugment_layers is 0."""
  layers, magnitude = data_config.randaugment_layers, float(data_config.randaugment_magnitude)
  if layers == 0:
    return lambda image, seed: image

  def fn(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    return tf.cast(randaugment(_uint8(tf.round(image)), seed, layers, magnitude), tf.float32)

  return fn
