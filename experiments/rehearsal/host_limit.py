"""The host's unavoidable work on the ImageNet stand-in's JPEGs, per CPU-second of one thread: decoding alone
(TensorFlow's libjpeg-turbo, PIL, simplejpeg), and the DeiT recipe's host part with data.augment_on='device' (a fused
decode of the inception crop's window, then the resize to 224, in TensorFlow): the limits the rehearsal's image rows
are measured against.

python -m experiments.rehearsal.host_limit [--scratch /tmp/rehearsal]   # after the rehearsal made the stand-in
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.rehearsal.host_limit')

import argparse
import glob
import io
import os
import time

import numpy as np
import tensorflow as tf
from PIL import Image

from vit_jax_lab.data import images

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

  rows = {
    'TensorFlow decode_jpeg': lambda f: tf.io.decode_jpeg(f, channels=3),
    'PIL decode': lambda f: np.asarray(Image.open(io.BytesIO(f)).convert('RGB')),
    'DeiT host part (crop window decode + resize 224, TF)': lambda f: crop_and_resize(tf.constant(f)),
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


if __name__ == '__main__':
  main()
