"""The input ops that run inside the jitted steps, on the accelerator: pixels arrive as uint8 (a quarter of the bytes
of float32 to move from the host) and are scaled to data.value_range there, and training images get random erasing
there, where it costs nothing next to the model, instead of on the host CPU that has to feed it.

A batch's uint8 arrays are pixels in [0, 255] (images, clips, a video's views); every other array is left as it is.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

ERASE_STREAM = 2**30  # Random erasing draws from fold_in(step key, this), apart from the task's draws.


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


def train_inputs(batch: dict[str, Any], data_config, key: jax.Array) -> dict[str, Any]:
  """A training batch as the model takes it: pixels scaled, and images (the 'inputs' of rank 4) randomly erased
  when data.random_erasing is set, with draws from `key`."""
  batch = scaled(batch, tuple(data_config.value_range))
  x = batch.get('inputs')
  if data_config.random_erasing > 0 and x is not None and x.ndim == 4 and jnp.issubdtype(x.dtype, jnp.floating):
    erased = random_erase(x, jax.random.fold_in(key, ERASE_STREAM), data_config.random_erasing, data_config.value_range)
    batch = batch | {'inputs': erased}
  return batch


def eval_inputs(batch: dict[str, Any], data_config) -> dict[str, Any]:
  """An evaluation or prediction batch as the model takes it: pixels scaled."""
  return scaled(batch, tuple(data_config.value_range))
