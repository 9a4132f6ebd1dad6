"""The host's unavoidable work on the ImageNet stand-in's JPEGs, per CPU-second of one thread: decoding alone
(TensorFlow's libjpeg-turbo, PIL, simplejpeg), and the DeiT recipe's host part (a fused decode of the inception
crop's window, then the resize to 224 in TensorFlow, or with data.augment_on='device' the window put in its canvas
for the jitted step to resize): the limits the rehearsal's image rows are measured against. Then the device's side
of that resize (data/device.py's resize_windows): XLA's FLOP and byte counts per example and its time on this CPU,
for a 224-pixel image from its 448-pixel canvas and a 32-frame clip from 280-pixel canvases (Kinetics).

python -m experiments.rehearsal.host_limit [--scratch /tmp/rehearsal]   # after the rehearsal made the stand-in
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.rehearsal.host_limit')

import argparse
import glob
import io
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf
from PIL import Image

from vit_jax_lab.data import device, images

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


def rate(fn, files: list[bytes]) -> float:
  """Files per CPU-second of this process (user + system), after one untimed pass."""
  for f in files[:20]:
    fn(f)
  start = time.process_time()
  for f in files:
    fn(f)
  return len(files) / (time.process_time() - start)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--scratch', default='/tmp/rehearsal')
  args = parser.parse_args()
  paths = sorted(glob.glob(os.path.join(args.scratch, 'standins', 'imagenet', 'train', '*', '*.JPEG')))
  paths = paths or sorted(glob.glob(os.path.join(args.scratch, 'standins', 'imagenet', '**', '*.*'), recursive=True))
  files = [open(p, 'rb').read() for p in paths if p.lower().endswith(('.jpeg', '.jpg'))][:400]
  if not files:
    raise SystemExit(f'no stand-in JPEGs under {args.scratch}: run python -m experiments.rehearsal.run first')
  seed = tf.constant([0, 1], tf.int64)

  @tf.function
  def crop_and_resize(data):
    crop = images.decode_inception_crop(data, 3, seed)
    return images.pixels(tf.image.resize(tf.cast(crop, tf.float32), (224, 224), antialias=True))

  @tf.function
  def crop_window(data):
    crop = images.decode_inception_crop(data, 3, seed)
    return images.window(crop, (224, 224), (0, 0), (224, 224), True, (448, 448))

  rows = {
    'TensorFlow decode_jpeg': lambda f: tf.io.decode_jpeg(f, channels=3),
    'PIL decode': lambda f: np.asarray(Image.open(io.BytesIO(f)).convert('RGB')),
    'DeiT host part (crop window decode + resize 224, TF)': lambda f: crop_and_resize(tf.constant(f)),
    'DeiT host part, resized on the device (crop window decode + canvas, TF)': lambda f: crop_window(tf.constant(f)),
  }
  try:
    import simplejpeg

    rows['simplejpeg decode'] = lambda f: simplejpeg.decode_jpeg(f, colorspace='RGB')
  except ImportError:
    pass
  sizes = [Image.open(io.BytesIO(f)).size for f in files[:50]]
  print(f'{len(files)} stand-in JPEGs, ~{np.mean([s[0] for s in sizes]):.0f}x{np.mean([s[1] for s in sizes]):.0f}')
  for name, fn in rows.items():
    print(f'{name}: {rate(fn, files):,.0f} images per CPU-second (one thread)')
  for name, canvas in (('image 448 -> 224', (32, 448, 448, 3)), ('clip 32 x 280 -> 224', (4, 32, 280, 280, 3))):
    flops, traffic, seconds = device_cost(canvas)
    print(
      f'device resize, {name}: {flops / 1e6:,.0f} MFLOP, {traffic / 1e6:,.1f} MB per example (XLA); '
      f'{seconds * 1e3:.2f} ms per example on this CPU'
    )


def device_cost(canvas: tuple[int, ...]) -> tuple[float, float, float]:
  """(FLOPs, bytes accessed, CPU seconds) per example of resize_windows on a batch of `canvas` windows that shrink
  by 2 (a 448-pixel image's whole crop) or 1.25, to 224."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.integers(0, 256, canvas, dtype=np.uint8))
  side = canvas[-2]
  params = jnp.tile(
    jnp.array([side, side, 224 / side, 224 / side, 0, 0, side / 224, side / 224], jnp.float32), (canvas[0], 1)
  )
  fn = jax.jit(lambda x, p: device.resize_windows(x, p, (224, 224)))
  cost = fn.lower(x, params).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  fn(x, params).block_until_ready()
  start = time.perf_counter()
  for _ in range(3):
    fn(x, params).block_until_ready()
  per = (time.perf_counter() - start) / 3 / canvas[0]
  return cost['flops'] / canvas[0], cost['bytes accessed'] / canvas[0], per


if __name__ == '__main__':
  main()
