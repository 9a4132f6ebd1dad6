"""The input ops that run inside the jitted steps, on the accelerator: pixels arrive as uint8 (a quarter of the bytes
of float32 to move from the host) and are scaled to data.value_range there, and training images get random erasing
there, where it costs nothing next to the model, instead of on the host CPU that has to feed it. With
data.augment_on='device' the flip, RandAugment and colour augmentation run here too, per example, and the host only
decodes, crops and resizes; with data.canvas as well the crop's resize runs here (`resize_windows`), and the host
only decodes and copies each crop's window into a canvas.

A batch's uint8 arrays are pixels in [0, 255] (images, clips, a video's views); every other array is left as it is.

The device ops are the host ops (augment.py, images.py: TensorFlow) written again in JAX, with the same semantics
on the same parameters (tests/test_device_augment.py compares each op with its host twin): per-example randomness
comes from fold_in(stream key, row) instead of the host's per-example seeds, so a batch's augmentation is a
function of (seed, step, row), the same after a resume and on any number of devices, but other draws than the host's.
Under vmap a per-example choice of op computes every branch; RandAugment's 14 ops are therefore folded into three
passes per layer (one lookup table: identity, autocontrast, equalize, solarize, posterize; one blend with a
degenerate image: colour, contrast, brightness, sharpness; one bilinear warp: rotate, shear, translate), each the
identity, exactly, for the ops of the other two.
"""

import math
from typing import Any

import dm_pix as pix
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax_lab.data import RECOLOR_SCALE, RECOLOR_SHIFT

# Streams of the step key, apart from the task's draws: random erasing, and the device augmentations.
ERASE_STREAM, FLIP_STREAM, RANDAUGMENT_STREAM, COLOR_STREAM = 2**30, 2**30 + 1, 2**30 + 2, 2**30 + 3
ROTATE_STREAM, RECOLOR_STREAM = 2**30 + 4, 2**30 + 5
RANDAUGMENT_OPS = (  # The RandAugment paper's 14 (augment.OPS), in the order the draws index.
  'identity',
  'autocontrast',
  'equalize',
  'rotate',
  'solarize',
  'color',
  'posterize',
  'contrast',
  'brightness',
  'sharpness',
  'shear_x',
  'shear_y',
  'translate_x',
  'translate_y',
)
FILL = 128.0  # augment.FILL: uncovered pixels of the geometric ops.


def scaled(batch: dict[str, Any], value_range: tuple[float, float]) -> dict[str, Any]:
  """`batch` with its uint8 arrays (pixels) as float32 in `value_range`: x / 255 * (high - low) + low, the host
  preprocessing's formula, so the numbers are what it gave when it scaled before the transfer."""
  low, high = value_range

  def scale(x):
    return x.astype(jnp.float32) / 255.0 * (high - low) + low if x.dtype == jnp.uint8 else x

  return {k: scale(v) for k, v in batch.items()}


def random_erase(
  images: jax.Array, key: jax.Array, prob: float, value_range: tuple[float, float], attempts: int = 10
) -> jax.Array:
  """Each image (B, H, W, C) of `images` in `value_range`, with probability `prob`, gets a rectangle of 2%-1/3 of
  its area and aspect ratio 0.3-3.3 (log-uniform) replaced by per-pixel normal noise (timm's RandomErasing, mode
  'pixel', as DeiT uses it). timm draws N(0, 1) in its normalised pixel space; here the noise has the value range's
  centre as mean and half its width as standard deviation (N(0, 1) for the default (-1, 1)). Of `attempts`
  candidate boxes the first that fits is erased; none fitting leaves the image. Image b draws from
  fold_in(key, b), so its rectangle does not depend on the batch's sharding."""
  low, high = value_range
  height, width = images.shape[-3], images.shape[-2]

  def one(image, b):
    coin, box_key, noise_key = jax.random.split(jax.random.fold_in(key, b), 3)
    u = jax.random.uniform(box_key, (attempts, 4))
    area = height * width * (0.02 + u[:, 0] * (1 / 3 - 0.02))
    log_ratio = math.log(0.3) + u[:, 1] * (math.log(1 / 0.3) - math.log(0.3))
    box_h = jnp.round(jnp.sqrt(area * jnp.exp(log_ratio)))
    box_w = jnp.round(jnp.sqrt(area / jnp.exp(log_ratio)))
    fits = (box_h < height) & (box_w < width)
    k = jnp.argmax(fits)  # The first fitting candidate.
    top = jnp.floor(u[k, 2] * (height - box_h[k] + 1))
    left = jnp.floor(u[k, 3] * (width - box_w[k] + 1))
    rows = jnp.arange(height)[:, None, None]
    cols = jnp.arange(width)[None, :, None]
    inside = (rows >= top) & (rows < top + box_h[k]) & (cols >= left) & (cols < left + box_w[k])
    erase = inside & fits[k] & (jax.random.uniform(coin) < prob)
    noise = jax.random.normal(noise_key, image.shape, jnp.float32) * ((high - low) / 2) + (low + high) / 2
    return jnp.where(erase, noise.astype(image.dtype), image)

  return jax.vmap(one)(images, jnp.arange(images.shape[0]))


def _op(name: str) -> int:
  return RANDAUGMENT_OPS.index(name)


def _uint8(x: jax.Array) -> jax.Array:
  """Float pixels clipped to [0, 255] and truncated (augment._uint8)."""
  return jnp.clip(x, 0.0, 255.0).astype(jnp.uint8)


def grey(image: jax.Array) -> jax.Array:
  """uint8 (H, W, C) -> uint8 (H, W, 1) luma, rounded (augment.grey); a grey image is itself."""
  if image.shape[-1] == 1:
    return image
  return _uint8(jnp.round(jnp.sum(image.astype(jnp.float32) * jnp.array([0.299, 0.587, 0.114]), -1, keepdims=True)))


def histograms(image: jax.Array) -> jax.Array:
  """(C, 256) int32 pixel counts of each channel of a uint8 image (H, W, C)."""
  channels = image.shape[-1]
  index = (image.astype(jnp.int32) + jnp.arange(channels) * 256).reshape(-1)
  return jnp.zeros(256 * channels, jnp.int32).at[index].add(1).reshape(channels, 256)


def autocontrast_lut(hist: jax.Array) -> jax.Array:
  """(C, 256) uint8: each channel stretched so its darkest level is 0 and its brightest 255 (augment.autocontrast).
  Exact integer arithmetic, where PIL and TensorFlow compute in float64 and truncate: 0.14% of the (low, high, level)
  entries come a level higher here, where the exact value is a whole number that float64 puts just below."""
  levels = jnp.arange(256)
  occupied = hist > 0
  lo = jnp.argmax(occupied, axis=1)[:, None]
  hi = 255 - jnp.argmax(occupied[:, ::-1], axis=1)[:, None]
  stretched = jnp.clip((levels - lo) * 255 // jnp.maximum(hi - lo, 1), 0, 255)
  return jnp.where(hi > lo, stretched, levels).astype(jnp.uint8)


def equalize_lut(hist: jax.Array) -> jax.Array:
  """(C, 256) uint8: each channel's histogram equalised as PIL's ImageOps.equalize (augment.equalize)."""
  highest = jnp.take_along_axis(hist, (255 - jnp.argmax(hist[:, ::-1] > 0, axis=1))[:, None], axis=1)[:, 0]
  step = ((jnp.sum(hist, 1) - highest) // 255)[:, None]
  below = jnp.cumsum(hist, axis=1) - hist
  lut = jnp.minimum((below + step // 2) // jnp.maximum(step, 1), 255)
  return jnp.where(step > 0, lut, jnp.arange(256)[None]).astype(jnp.uint8)


def lookup(image: jax.Array, lut: jax.Array) -> jax.Array:
  """uint8 image (H, W, C) mapped through a table (C, 256) per channel."""
  return jnp.take_along_axis(lut.T, image.astype(jnp.int32).reshape(-1, image.shape[-1]), axis=0).reshape(image.shape)


def smooth(image: jax.Array) -> jax.Array:
  """Float (H, W, C): PIL's SMOOTH filter ([[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13) inside, rounded, the border pixels
  kept (augment.sharpness's degenerate image)."""
  x = image.astype(jnp.float32)
  h, w = x.shape[:2]
  if h < 3 or w < 3:
    return x
  total = sum(x[1 + dy : h - 1 + dy, 1 + dx : w - 1 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1))
  inner = jnp.round(jnp.clip((total + 4.0 * x[1:-1, 1:-1]) / 13.0, 0.0, 255.0)).astype(jnp.uint8)
  return x.at[1:-1, 1:-1].set(inner.astype(jnp.float32))


def blend(degenerate: jax.Array, image: jax.Array, factor) -> jax.Array:
  """degenerate + factor * (image - degenerate), clipped and truncated to uint8 (augment.blend)."""
  d = degenerate.astype(jnp.float32)
  return _uint8(d + factor * (image.astype(jnp.float32) - d))


def warp(image: jax.Array, matrix: jax.Array) -> jax.Array:
  """uint8 (H, W, C): output pixel (x, y) samples the input at (a0 x + a1 y + a2, b0 x + b1 y + b2), bilinearly,
  pixel centres at integers, each of the 4 neighbours outside the input reading FILL; rounded (augment._transform,
  TensorFlow's ImageProjectiveTransformV3). dm-pix's affine_transform fills differently at the border (whole samples
  outside the image, not neighbours): up to 99 levels apart from TensorFlow there, so it is not used here."""
  h, w = image.shape[:2]
  ys, xs = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing='ij')
  sx = matrix[0] * xs + matrix[1] * ys + matrix[2]
  sy = matrix[3] * xs + matrix[4] * ys + matrix[5]
  x0, y0 = jnp.floor(sx), jnp.floor(sy)
  fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
  pixels = image.astype(jnp.float32)

  def read(y, x):
    inside = ((y >= 0) & (y <= h - 1) & (x >= 0) & (x <= w - 1))[..., None]
    return jnp.where(
      inside, pixels[jnp.clip(y, 0, h - 1).astype(jnp.int32), jnp.clip(x, 0, w - 1).astype(jnp.int32)], FILL
    )

  top = (1 - fx) * read(y0, x0) + fx * read(y0, x0 + 1)
  bottom = (1 - fx) * read(y0 + 1, x0) + fx * read(y0 + 1, x0 + 1)
  return _uint8(jnp.round((1 - fy) * top + fy * bottom))


def op_parameters(magnitude: float, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  """(warps (ops, 2, 6), blend factors (ops, 2)) float32 of every op at `magnitude`, for sign -1 and +1: the warp of
  the geometric ops (augment.rotate, shear_x/y, translate_x/y), the factor of the blends (colour, contrast,
  brightness, sharpness); the identity elsewhere. Worked out here, not in the step: constants are the same numbers in
  every compiled program, where XLA's cos and sin may differ in the last bit between a program of 8 rows and one of
  64 (and a pixel rounded apart grows in the ops after it)."""
  f = np.float32(magnitude / 10.0)
  warps = np.tile(np.array([1, 0, 0, 0, 1, 0], np.float32), (len(RANDAUGMENT_OPS), 2, 1))
  factors = np.ones((len(RANDAUGMENT_OPS), 2), np.float32)
  cy, cx = np.float32((height - 1) / 2), np.float32((width - 1) / 2)
  for i, sign in enumerate((np.float32(-1.0), np.float32(1.0))):
    theta = sign * np.float32(30.0) * f * np.float32(math.pi / 180.0)
    cos, sin = np.cos(theta), np.sin(theta)
    shear = sign * np.float32(0.3) * f
    warps[_op('rotate'), i] = (cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy)
    warps[_op('shear_x'), i, 1] = shear
    warps[_op('shear_y'), i, 3] = shear
    warps[_op('translate_x'), i, 2] = -sign * np.float32(0.45) * f * np.float32(width)
    warps[_op('translate_y'), i, 5] = -sign * np.float32(0.45) * f * np.float32(height)
    for name in ('color', 'contrast', 'brightness', 'sharpness'):
      factors[_op(name), i] = max(np.float32(0.0), np.float32(1.0) + sign * np.float32(0.9) * f)
  return warps, factors


def randaugment_layer(image: jax.Array, op: jax.Array, sign: jax.Array, magnitude: float) -> jax.Array:
  """uint8 image (H, W, C) after RandAugment op `op` (an index of RANDAUGMENT_OPS) at `magnitude`, signed ones with
  `sign` (+-1.0): augment.randaugment's layer, as a lookup table, a blend and a warp."""
  f = magnitude / 10.0
  levels = jnp.arange(256)
  bits = min(8, max(1, 8 - math.floor(4 * f)))
  threshold = min(256.0, max(0.0, 256.0 * (1.0 - f)))
  hist = histograms(image)
  tables = {
    'autocontrast': autocontrast_lut(hist),
    'equalize': equalize_lut(hist),
    'solarize': jnp.where(levels < threshold, levels, 255 - levels).astype(jnp.uint8),
    'posterize': ((levels >> (8 - bits)) << (8 - bits)).astype(jnp.uint8),
  }
  lut = jnp.broadcast_to(levels.astype(jnp.uint8), hist.shape)
  for name, table in tables.items():
    lut = jnp.where(op == _op(name), table, lut)
  image = lookup(image, lut)

  x = image.astype(jnp.float32)
  g = grey(image)
  pixels = g.size
  mean = (2 * jnp.sum(g.astype(jnp.int32)) + pixels) // (2 * pixels)  # Rounded, in integers: the same everywhere.
  degenerates = {
    'color': jnp.broadcast_to(g.astype(jnp.float32), x.shape),
    'contrast': jnp.full(x.shape, mean.astype(jnp.float32)),
    'brightness': jnp.zeros_like(x),
    'sharpness': smooth(image),
  }
  degenerate = x
  for name, d in degenerates.items():
    degenerate = jnp.where(op == _op(name), d, degenerate)
  warps, factors = op_parameters(magnitude, *image.shape[:2])
  side = (sign > 0).astype(jnp.int32)
  image = blend(degenerate, image, jnp.asarray(factors)[op, side])
  return warp(image, jnp.asarray(warps)[op, side])


def randaugment(images: jax.Array, key: jax.Array, layers: int, magnitude: float) -> jax.Array:
  """uint8 images (B, H, W, C) after `layers` RandAugment ops each, each drawn uniformly from RANDAUGMENT_OPS with a
  random sign; image b's layer l draws from fold_in(fold_in(key, b), l)."""

  def one(image, b):
    for layer in range(layers):
      op_key, sign_key = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, b), layer))
      op = jax.random.randint(op_key, (), 0, len(RANDAUGMENT_OPS))
      sign = jnp.where(jax.random.uniform(sign_key) < 0.5, -1.0, 1.0)
      image = randaugment_layer(image, op, sign, magnitude)
    return image

  return jax.vmap(one)(images, jnp.arange(images.shape[0]))


def flip(x: jax.Array, key: jax.Array) -> jax.Array:
  """Each image (B, H, W, C) or clip (B, T, H, W, C), with probability 1/2, mirrored left to right (a clip's frames
  alike); example b draws from fold_in(key, b)."""
  coins = jax.vmap(lambda b: jax.random.uniform(jax.random.fold_in(key, b)))(jnp.arange(x.shape[0]))
  return jnp.where((coins < 0.5).reshape(-1, *[1] * (x.ndim - 1)), pix.flip_left_right(x), x)


def color_jitter(x: jax.Array, brightness, saturation, contrast, hue) -> jax.Array:
  """Float pixels in [0, 255] (..., H, W, C) after images.color_augment's changes with these parameters: brightness
  +delta (of 1), saturation and contrast x factor, hue +delta (of a turn), clipped; dm-pix's ops, which follow
  tf.image's. Grey images get brightness and contrast."""
  rgb = x.shape[-1] == 3
  x = pix.adjust_brightness(x / 255.0, brightness)
  if rgb:
    x = pix.adjust_saturation(x, saturation)
  x = pix.adjust_contrast(x, contrast)
  if rgb:
    x = pix.adjust_hue(x, hue)
  return jnp.clip(x, 0.0, 1.0) * 255.0


def color_augment(x: jax.Array, key: jax.Array, prob: float, drop: float) -> jax.Array:
  """uint8 images or clips (B, [T,] H, W, C) after images.color_augment: with probability `prob` colour jitter (one
  draw per example, for all frames of a clip), then with probability `drop` grey; example b draws from
  fold_in(key, b). Rounded back to uint8, as the host hands them over."""

  def one(example, b):
    coins, brightness, saturation, contrast, hue = jax.random.split(jax.random.fold_in(key, b), 5)
    toss = jax.random.uniform(coins, (2,))
    pixels = example.astype(jnp.float32)
    jittered = color_jitter(
      pixels,
      jax.random.uniform(brightness, (), minval=-32 / 255, maxval=32 / 255),
      jax.random.uniform(saturation, (), minval=0.6, maxval=1.4),
      jax.random.uniform(contrast, (), minval=0.6, maxval=1.4),
      jax.random.uniform(hue, (), minval=-0.2, maxval=0.2),
    )
    pixels = jnp.where(toss[0] < prob, jittered, pixels)
    if example.shape[-1] == 3 and drop > 0:
      pixels = jnp.where(toss[1] < drop, pix.rgb_to_grayscale(pixels, keep_dims=True), pixels)
    return jnp.clip(jnp.round(pixels), 0.0, 255.0).astype(jnp.uint8)

  return jax.vmap(one)(x, jnp.arange(x.shape[0]))


def window_weights(out: int, size: int, valid: jax.Array, scale: jax.Array, shift: jax.Array, reach: jax.Array):
  """(out, size) weights of tf.raw_ops.ScaleAndTranslate's triangle filter (tf.image.resize's bilinear) sampling
  the first `valid` of `size` pixels: output i reads source (i + 0.5 - shift) / scale - 0.5, the filter `reach`
  source pixels wide (1 / scale when shrinking antialiased, else 1), each row normalised over the valid pixels,
  zero outside them."""
  sample = (jnp.arange(out) + 0.5 - shift) / scale - 0.5
  source = jnp.arange(size)
  weights = jnp.maximum(0.0, 1.0 - jnp.abs(source[None, :] - sample[:, None]) / reach)
  weights = jnp.where(source[None, :] < valid, weights, 0.0)
  total = weights.sum(1, keepdims=True)
  weights = jnp.where(jnp.abs(total) >= 1000 * np.finfo(np.float32).tiny, weights / total, 0.0)
  return jnp.where(((sample >= -0.5) & (sample <= valid - 0.5))[:, None], weights, 0.0)


# resize_windows' fixed point: weights in 1/2^10 (each row summing to 2^10 exactly), the pass between in 1/2^6 of a
# level; every product and sum of the two passes is then an integer below 2^24, exact in float32.
WEIGHT_UNITS, CARRY_UNITS = 2**10, 2**6


def fixed_weights(weights: jax.Array) -> jax.Array:
  """`weights` (rows summing to 1, or 0) as whole multiples of 1 / WEIGHT_UNITS summing to exactly WEIGHT_UNITS,
  the rounding's remainder given to each row's largest weight (float32 integers)."""
  units = jnp.round(weights * WEIGHT_UNITS)
  remainder = jnp.where(units.sum(1) > 0, WEIGHT_UNITS - units.sum(1), 0.0)
  largest = jax.nn.one_hot(jnp.argmax(units, 1), units.shape[1], dtype=units.dtype)
  return units + largest * remainder[:, None]


def resize_windows(x: jax.Array, params: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """uint8 windows (B, [T,] H', W', C) in their canvases, resampled to `shape` (height, width) as the host's
  images.resized_crop does it (tf.image.resize's bilinear weights): `params` (B, 8) are each window's rows,
  columns, and its scale, shift and filter reach (each (rows, columns)) (images.window). Two matrix products per
  image in fixed point (as PIL resizes), whose every sum is exact in float32: a pixel is then the same whatever the
  batch's sharding (a float dot's summation order follows it, and a pixel rounded the other way changes what
  RandAugment's discrete ops make of the image); a level at most from TensorFlow's float resize."""
  highest = jax.lax.Precision.HIGHEST  # Exact float32 products: TF32 would round the pass between.

  def one(window, p):
    rows = fixed_weights(window_weights(shape[0], window.shape[-3], p[0], p[2], p[4], p[6]))
    cols = fixed_weights(window_weights(shape[1], window.shape[-2], p[1], p[3], p[5], p[7]))
    y = jnp.einsum('oh,...hwc->...owc', rows, window.astype(jnp.float32), precision=highest)
    y = jnp.floor((y + WEIGHT_UNITS // CARRY_UNITS // 2) / (WEIGHT_UNITS // CARRY_UNITS))  # In 1/2^6 levels.
    y = jnp.einsum('pw,...owc->...opc', cols, y, precision=highest)
    units = WEIGHT_UNITS * CARRY_UNITS
    return jnp.clip(jnp.floor((y + units // 2) / units), 0, 255).astype(jnp.uint8)

  return jax.vmap(one)(x, params)


def rotate90(x: jax.Array, key: jax.Array) -> jax.Array:
  """Square images (B, H, H, C), each turned counter-clockwise by 0-3 quarters as images.rotate90; example b draws
  from fold_in(key, b)."""
  turns = jax.vmap(lambda b: jax.random.randint(jax.random.fold_in(key, b), (), 0, 4))(jnp.arange(x.shape[0]))
  out = x
  for k in (1, 2, 3):
    out = jnp.where((turns == k).reshape(-1, 1, 1, 1), jnp.rot90(x, k, axes=(1, 2)), out)
  return out


def recolor(x: jax.Array, key: jax.Array, prob: float) -> jax.Array:
  """uint8 images (B, H, W, C) after images.recolor: with probability `prob`, the channels in a random order,
  inverted by a coin toss, scaled and shifted each, rounded; example b draws from fold_in(key, b)."""
  low, high = RECOLOR_SCALE

  def one(image, b):
    coins, order, scale, shift = jax.random.split(jax.random.fold_in(key, b), 4)
    toss, channels = jax.random.uniform(coins, (2,)), image.shape[-1]
    shuffled = jnp.take(image, jax.random.permutation(order, channels), axis=-1).astype(jnp.float32)
    shuffled = jnp.where(toss[1] < 0.5, 255.0 - shuffled, shuffled)
    shifts = jax.random.uniform(shift, (channels,), minval=-RECOLOR_SHIFT, maxval=RECOLOR_SHIFT)
    mapped = jnp.clip(
      jnp.round(shuffled * jax.random.uniform(scale, (channels,), minval=low, maxval=high) + shifts), 0, 255
    )
    return jnp.where(toss[0] < prob, mapped.astype(jnp.uint8), image)

  return jax.vmap(one)(x, jnp.arange(x.shape[0]))


def augment(batch: dict[str, Any], data_config, key: jax.Array) -> dict[str, Any]:
  """The training batch's uint8 'inputs' (images or clips) after the host's last augmentations, run here when
  data.augment_on='device': the resize of the host's windows (a batch with 'resize'), flip, RandAugment (images),
  colour, quarter turns and recolouring (images); in the host's order, each from its own stream."""
  x = batch.get('inputs')
  d = data_config
  if d.augment_on != 'device' or x is None or x.dtype != jnp.uint8 or x.ndim not in (4, 5):
    return batch
  if 'resize' in batch:
    x = resize_windows(x, batch['resize'], (d.image_size, d.image_size))
    batch = {k: v for k, v in batch.items() if k != 'resize'}
  if d.flip:
    x = flip(x, jax.random.fold_in(key, FLIP_STREAM))
  if d.randaugment_layers and x.ndim == 4:
    ra_key, magnitude = jax.random.fold_in(key, RANDAUGMENT_STREAM), float(d.randaugment_magnitude)
    x = randaugment(x, ra_key, d.randaugment_layers, magnitude)
  if d.color_augment or d.color_drop:
    color_key = jax.random.fold_in(key, COLOR_STREAM)
    x = color_augment(x, color_key, d.color_augment, d.color_drop)
  if d.rotate90 and x.ndim == 4:
    x = rotate90(x, jax.random.fold_in(key, ROTATE_STREAM))
  if d.recolor and x.ndim == 4:
    x = recolor(x, jax.random.fold_in(key, RECOLOR_STREAM), d.recolor)
  return batch | {'inputs': x}


def train_inputs(batch: dict[str, Any], data_config, key: jax.Array) -> dict[str, Any]:
  """A training batch as the model takes it: augmented here with data.augment_on='device', pixels scaled, and images
  (the 'inputs' of rank 4) randomly erased when data.random_erasing is set, with draws from `key`."""
  batch = scaled(augment(batch, data_config, key), tuple(data_config.value_range))
  x = batch.get('inputs')
  if data_config.random_erasing > 0 and x is not None and x.ndim == 4 and jnp.issubdtype(x.dtype, jnp.floating):
    erased = random_erase(x, jax.random.fold_in(key, ERASE_STREAM), data_config.random_erasing, data_config.value_range)
    batch = batch | {'inputs': erased}
  return batch


def eval_inputs(batch: dict[str, Any], data_config) -> dict[str, Any]:
  """An evaluation or prediction batch as the model takes it: pixels scaled."""
  return scaled(batch, tuple(data_config.value_range))
