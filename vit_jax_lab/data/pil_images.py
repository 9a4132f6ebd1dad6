"""Image preprocessing and augmentation in NumPy and PIL, for the grain backend (grain_input.py): the steps and keys
of images.py and augment.py (tf.data), without TensorFlow. Every random op draws from the NumPy generator it is
given, which grain_input.py seeds per example, so a batch is a pure function of its step.

The same recipe, other numbers: the two backends draw their crops, flips and RandAugment ops from different
generators, so they agree in distribution, not per example. Where an op itself differs from the TF one:
- decoding: PIL's libjpeg and TF's give JPEG pixels up to a few levels apart (IDCT and chroma upsampling);
  PNG is exact.
- resizing: PIL's antialiased bilinear filter in 8-bit fixed point against tf.image.resize(antialias=True) in
  float, both rounded to uint8: at most 1 level apart, on 10-20% of pixels. data.antialias=False samples 2x2
  neighbours at half-pixel centres as TF's plain bilinear does, within 1 level, or 2 for an image that grows along
  one axis and shrinks along the other (two 8-bit passes). tests/test_grain.py checks both.
- the inception crop: timm's RandomResizedCrop sampler (10 tries, log-uniform aspect ratio, the whole image if none
  fits) instead of TF's sample_distorted_bounding_box (100 tries, uniform aspect ratio); same area and ratio range.
- RandAugment: PIL's own ops (ImageOps, ImageEnhance, Image.transform), which augment.py reimplements; the same ops,
  magnitudes and fill. The colour ops agree within a level; the geometric ones sample half a pixel apart (PIL puts
  pixel centres at +0.5): on a smooth 160x120 image at m = 9, a mean of 0.3-0.75 levels, up to 71 at edges.
"""

import io
import math
from typing import Callable

import numpy as np
import simplejpeg
from PIL import Image, ImageEnhance, ImageOps

from vit_jax_lab.data import RECOLOR_SCALE, RECOLOR_SHIFT, whole_crop
from vit_jax_lab.data.info import resized_size

FILL = 128  # Uncovered pixels of geometric ops (augment.FILL).


def _jpeg(data: bytes, channels: int) -> np.ndarray | None:
  """A JPEG's uint8 pixels (H, W, channels) by simplejpeg (libjpeg-turbo, as PIL's decoder: the same pixels on the
  ImageNet stand-in, at 1.2x PIL's images per CPU-second, experiments/rehearsal/host_limit.py); None for another
  file, a JPEG it cannot read, or a CMYK one (PIL converts those to RGB its own way, a level apart), which PIL
  decodes."""
  if not data.startswith(b'\xff\xd8'):
    return None
  try:
    space = simplejpeg.decode_jpeg_header(data)[2]
    if space not in ('YCbCr', 'Gray', 'RGB') or (channels == 1 and space != 'Gray'):  # PIL's grey: its own luma.
      return None
    return simplejpeg.decode_jpeg(data, colorspace='GRAY' if channels == 1 else 'RGB')
  except ValueError:
    return None


def decode(data: bytes | np.ndarray, channels: int) -> Image.Image:
  """An image file (JPEG, PNG, ...), or uint8 pixels (H, W, C), as a PIL image of `channels` (1: 'L', 3: 'RGB')."""
  if isinstance(data, bytes) and (pixels := _jpeg(data, channels)) is not None:
    data = pixels
  if isinstance(data, np.ndarray):
    image = Image.fromarray(data[..., 0] if data.shape[-1] == 1 else data)
  else:
    image = Image.open(io.BytesIO(data))
  return image.convert('L' if channels == 1 else 'RGB')


def inception_box(width: int, height: int, rng: np.random.Generator, min_area: float = 0.05) -> tuple[int, ...]:
  """(left, top, right, bottom) of a random crop of `min_area`-100% of the area and aspect ratio 3/4-4/3 (Szegedy et
  al. 2015), as timm's RandomResizedCrop draws it; the whole image when 10 tries do not fit."""
  area = width * height
  for _ in range(10):
    target = area * rng.uniform(min_area, 1.0)
    ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
    if 0 < w <= width and 0 < h <= height:
      left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
      return left, top, left + w, top + h
  return 0, 0, width, height


def resize(image: Image.Image, size: tuple[int, int], antialias: bool = True, box=None) -> Image.Image:
  """`image` (or its `box`) resized to `size` (width, height): PIL's bilinear filter, which widens with the
  scale when shrinking (antialiased, as tf.image.resize(antialias=True)); `antialias=False`: each output pixel
  from its 2x2 nearest input pixels, as TF's plain bilinear resize (half-pixel centres, edges clamped)."""
  if antialias:
    return image.resize(size, Image.Resampling.BILINEAR, box=box, reducing_gap=None)
  if box is not None:
    image = image.crop(box)
  grows = (size[0] >= image.width, size[1] >= image.height)
  if not all(grows):  # First the axis that grows, if one does, to the new size: PIL's filter is plain there.
    grown = (size[0] if grows[0] else image.width, size[1] if grows[1] else image.height)
    image = image.resize(grown, Image.Resampling.BILINEAR, reducing_gap=None) if any(grows) else image
    scale = (image.width / size[0], image.height / size[1])  # Pixel centres sampled, never outside the input.
    return image.transform(size, Image.Transform.AFFINE, (scale[0], 0, 0, 0, scale[1], 0), Image.Resampling.BILINEAR)
  return image.resize(size, Image.Resampling.BILINEAR, reducing_gap=None)


def random_crop(image: Image.Image, height: int, width: int, rng: np.random.Generator) -> Image.Image:
  top, left = int(rng.integers(0, image.height - height + 1)), int(rng.integers(0, image.width - width + 1))
  return image.crop((left, top, left + width, top + height))


def central_crop(image: Image.Image, height: int, width: int) -> Image.Image:
  top, left = (image.height - height) // 2, (image.width - width) // 2
  return image.crop((left, top, left + width, top + height))


def _fill(image: Image.Image):
  return FILL if image.mode == 'L' else (FILL,) * 3


def _affine(image: Image.Image, matrix: tuple[float, ...]) -> Image.Image:
  """Output pixel (x, y) samples the input at (a x + b y + c, d x + e y + f), bilinearly; outside: FILL."""
  return image.transform(image.size, Image.Transform.AFFINE, matrix, Image.Resampling.BILINEAR, fillcolor=_fill(image))


def _ops(magnitude: float, sign: float) -> dict[str, Callable[[Image.Image], Image.Image]]:
  """RandAugment's ops at `magnitude`, signed ones with `sign` (+-1): augment.py's mapping (its docstring)."""
  f = magnitude / 10.0
  enhance = max(0.0, 1.0 + sign * 0.9 * f)
  bits = min(8, max(1, 8 - math.floor(4 * f)))
  threshold = min(256, max(0, round(256 * (1.0 - f))))
  return {
    'identity': lambda x: x,
    'autocontrast': ImageOps.autocontrast,
    'equalize': ImageOps.equalize,
    'rotate': lambda x: x.rotate(sign * 30.0 * f, Image.Resampling.BILINEAR, fillcolor=_fill(x)),
    'solarize': lambda x: ImageOps.solarize(x, threshold),
    'color': lambda x: ImageEnhance.Color(x).enhance(enhance),
    'posterize': lambda x: ImageOps.posterize(x, bits),
    'contrast': lambda x: ImageEnhance.Contrast(x).enhance(enhance),
    'brightness': lambda x: ImageEnhance.Brightness(x).enhance(enhance),
    'sharpness': lambda x: ImageEnhance.Sharpness(x).enhance(enhance),
    'shear_x': lambda x: _affine(x, (1.0, sign * 0.3 * f, 0.0, 0.0, 1.0, 0.0)),
    'shear_y': lambda x: _affine(x, (1.0, 0.0, 0.0, sign * 0.3 * f, 1.0, 0.0)),
    'translate_x': lambda x: _affine(x, (1.0, 0.0, -sign * 0.45 * f * x.width, 0.0, 1.0, 0.0)),
    'translate_y': lambda x: _affine(x, (1.0, 0.0, 0.0, 0.0, 1.0, -sign * 0.45 * f * x.height)),
  }


OPS = tuple(_ops(0.0, 1.0))  # The RandAugment paper's 14, in augment.OPS's order.


def randaugment(image: Image.Image, rng: np.random.Generator, layers: int, magnitude: float) -> Image.Image:
  """`layers` ops in a row, each drawn uniformly from OPS with a random sign (augment.randaugment)."""
  for _ in range(layers):
    op, sign = OPS[int(rng.integers(len(OPS)))], (-1.0 if rng.random() < 0.5 else 1.0)
    image = _ops(magnitude, sign)[op](image)
  return image


def pixels_of(data: bytes | np.ndarray, channels: int) -> np.ndarray:
  """uint8 (H, W, channels) of an image file or pixels, as `decode` gives them, without a PIL image for a JPEG."""
  if isinstance(data, bytes) and (pixels := _jpeg(data, channels)) is not None:
    return pixels
  image = np.asarray(decode(data, channels), np.uint8)
  return image.reshape(*image.shape[:2], channels)


def window(
  pixels: np.ndarray,
  box: tuple,
  crop: tuple[int, int],
  antialias: bool,
  canvas: tuple[int, int],
  out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """`resize(image, crop[::-1], antialias, box)` of an image's `pixels` (H, W, C) left to the device, as
  images.window does it: the pixels PIL's filter reads for it (the box and the filter's reach around it, within the
  image) in the top-left corner of a zero uint8 `canvas` (height, width), and (rows, columns, scale (2), shift (2),
  reach (2)) float32 for data/device.py's `resize_windows`, which samples where PIL's box resize does; a window
  larger than the canvas is resized here (and shrunk to a canvas smaller than the crop, `whole_crop`). `out`: the
  zero canvas to fill (a row of the batch), else a new one."""
  left, top, right, bottom = box
  scale = np.array([crop[0] / (bottom - top), crop[1] / (right - left)])
  corner, size = np.array([top, left]) * scale, np.array(pixels.shape[:2])
  reach = np.maximum(1.0 / scale, 1.0) if antialias else np.ones(2)
  first = np.clip(np.floor((corner + 0.5) / scale - 0.5 - reach), 0, size).astype(int)
  last = np.clip(np.ceil((corner + np.array(crop) - 0.5) / scale - 0.5 + reach) + 1, 0, size).astype(int)
  extent = last - first
  out = np.zeros((*canvas, pixels.shape[-1]), np.uint8) if out is None else out
  if np.all(extent <= canvas):
    out[: extent[0], : extent[1]] = pixels[first[0] : last[0], first[1] : last[1]]
    return out, np.concatenate([extent, scale, first * scale - corner, reach]).astype(np.float32)
  resized = resize(decode(pixels, pixels.shape[-1]), crop[::-1], antialias, box)
  fits, params = whole_crop(crop, canvas)
  if fits != tuple(crop):
    resized = resize(resized, fits[::-1])
  out[: fits[0], : fits[1]] = np.asarray(resized, np.uint8).reshape(*fits, -1)
  return out, np.array(params, np.float32)


def preprocess_fn(
  data_config, shape: tuple[int, int, int], train: bool, canvas: tuple[int, int] | None = None
) -> Callable:
  """(image file or uint8 pixels, generator) -> uint8 (height, width, channels), augmented for training as
  `data_config` asks: images.preprocess_fn's steps in its order. Random erasing and the scaling to
  data.value_range happen in the jitted step, as on tf.data, and with data.augment_on='device' the flip, RandAugment
  and colour augmentation too, and with a training `canvas` (data.device_canvas's) the crop's resize: then (its
  window in the canvas, the resize's parameters) (`window`)."""
  height, width, channels = shape
  short, antialias, d = data_config.resize_size, data_config.antialias, data_config
  on_host = d.augment_on == 'host'  # Else the flip and RandAugment are the jitted step's (data/device.py).

  def cut(pixels: np.ndarray, rng: np.random.Generator, out: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The crop's window in its canvas (`out`, or a new one): of an inception box, or of the short-side resize's
    random crop."""
    rows, cols = pixels.shape[:2]
    if d.inception_crop:
      box = inception_box(cols, rows, rng, d.inception_min_area)
      if not antialias:  # `resize`'s plain bilinear samples the crop alone.
        pixels, box = pixels[box[1] : box[3], box[0] : box[2]], (0, 0, box[2] - box[0], box[3] - box[1])
      return window(pixels, box, (height, width), antialias, canvas, out)
    resized = resized_size(rows, cols, short)
    top, left = int(rng.integers(0, resized[0] - height + 1)), int(rng.integers(0, resized[1] - width + 1))
    ys, xs = rows / resized[0], cols / resized[1]
    box = (left * xs, top * ys, (left + width) * xs, (top + height) * ys)
    return window(pixels, box, (height, width), antialias, canvas, out)

  def fn(data, rng: np.random.Generator | None, out=None) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    if canvas is not None:
      return cut(pixels_of(data, channels), rng, out)
    image = decode(data, channels)
    if train and d.inception_crop:
      image = resize(
        image, (width, height), antialias, box=inception_box(image.width, image.height, rng, d.inception_min_area)
      )
    elif short is not None:
      image = resize(image, resized_size(image.height, image.width, short)[::-1], antialias)
      image = random_crop(image, height, width, rng) if train else central_crop(image, height, width)
    elif d.image_size is not None and image.size != (width, height):
      image = resize(image, (width, height), antialias)
    if train and d.crop_padding:
      p = d.crop_padding
      padded = Image.new(image.mode, (image.width + 2 * p, image.height + 2 * p), 0)
      padded.paste(image, (p, p))
      image = random_crop(padded, height, width, rng)
    if train and d.flip and on_host and rng.random() < 0.5:
      image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if train and d.randaugment_layers and on_host:
      image = randaugment(image, rng, d.randaugment_layers, float(d.randaugment_magnitude))
    pixels = np.asarray(image, np.uint8).reshape(height, width, channels)
    if train and d.rotate90 and on_host:
      pixels = np.rot90(pixels, int(rng.integers(4)))
    if train and d.recolor and on_host and rng.random() < d.recolor:  # images.recolor.
      shuffled = pixels[..., rng.permutation(channels)].astype(np.float32)
      shuffled = 255 - shuffled if rng.random() < 0.5 else shuffled
      mapped = shuffled * rng.uniform(*RECOLOR_SCALE, channels) + rng.uniform(-RECOLOR_SHIFT, RECOLOR_SHIFT, channels)
      pixels = np.clip(np.round(mapped), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(pixels)

  fn.canvas = None if canvas is None else (*canvas, channels)  # The shape grain_input fills in place.
  return fn
