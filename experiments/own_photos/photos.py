"""Folders of "own photos" as a newcomer would bring them: ~100 pictures of 3 plainly different things, of many sizes
and three file formats, one folder per class. Two kinds, each drawn from a seed:

- `shapes`: a filled circle, square or triangle of any colour and size, anywhere, on a shaded, noisy background.
- `outlines`: the outline of a ring, a cross or a star, turned at random, among blobs of other colours.

python -m experiments.own_photos.photos shapes /tmp/photos 0   # make(root, kind, seed): a folder to try by hand
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.own_photos.photos')

import math
import os
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

KINDS = ('shapes', 'outlines')
CLASSES = {'shapes': ('circle', 'square', 'triangle'), 'outlines': ('ring', 'cross', 'star')}
FORMATS = (('jpg', 'JPEG'), ('png', 'PNG'), ('webp', 'WEBP'))


def _background(rng: np.random.Generator, width: int, height: int) -> Image.Image:
  """A shade from one random colour to another along a random direction, with Gaussian noise."""
  a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
  angle = rng.uniform(0, 2 * math.pi)
  y, x = np.mgrid[0:height, 0:width] / max(width, height)
  t = np.clip((x * math.cos(angle) + y * math.sin(angle) + 1) / 2, 0, 1)[..., None]
  pixels = a * (1 - t) + b * t + rng.normal(0, rng.uniform(5, 25), (height, width, 3))
  return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _colour(rng: np.random.Generator, against: np.ndarray | None = None) -> tuple[int, int, int]:
  """A random colour; with `against` (a background's mean colour), one that stands out from it, as a photographed
  thing does."""
  while True:
    colour = rng.integers(0, 256, 3)
    if against is None or np.linalg.norm(colour - against) >= 120:
      return tuple(int(v) for v in colour)


def _polygon(cx: float, cy: float, radius: float, corners: int, turn: float, inner: float = 1.0) -> list[tuple]:
  """Corners of a regular polygon (or, with `inner` < 1, a star of `corners` points) around (cx, cy)."""
  points = []
  steps = corners * (2 if inner < 1 else 1)
  for k in range(steps):
    r = radius * (inner if inner < 1 and k % 2 else 1.0)
    a = turn + 2 * math.pi * k / steps
    points.append((cx + r * math.cos(a), cy + r * math.sin(a)))
  return points


def draw(kind: str, label: int, rng: np.random.Generator) -> Image.Image:
  """One picture of class `label` of `kind`, 40-240 px on each side."""
  width, height = (int(v) for v in rng.integers(40, 241, 2))
  image = _background(rng, width, height)
  pen = ImageDraw.Draw(image)
  side = min(width, height)
  radius = rng.uniform(0.15, 0.4) * side
  cx, cy = rng.uniform(radius, width - radius), rng.uniform(radius, height - radius)
  colour = _colour(rng, np.asarray(image).reshape(-1, 3).mean(0))
  if kind == 'shapes':
    if label == 0:
      pen.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    elif label == 1:
      pen.polygon(_polygon(cx, cy, radius * math.sqrt(2), 4, math.pi / 4 + rng.uniform(-0.2, 0.2)), fill=colour)
    else:
      pen.polygon(_polygon(cx, cy, radius * 1.2, 3, rng.uniform(0, 2 * math.pi)), fill=colour)
    return image.filter(ImageFilter.GaussianBlur(rng.uniform(0, 0.8)))
  for _ in range(int(rng.integers(1, 5))):  # Blobs: other colours, no shape of the classes.
    bx, by, br = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.05, 0.15) * side
    pen.ellipse([bx - br, by - 0.6 * br, bx + br, by + 0.6 * br], fill=_colour(rng))
  line = max(2, int(radius * rng.uniform(0.12, 0.25)))
  turn = rng.uniform(0, 2 * math.pi)
  if label == 0:
    pen.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], outline=colour, width=line)
  elif label == 1:
    for a in (turn, turn + math.pi / 2):
      dx, dy = radius * math.cos(a), radius * math.sin(a)
      pen.line([(cx - dx, cy - dy), (cx + dx, cy + dy)], fill=colour, width=line)
  else:
    points = _polygon(cx, cy, radius, 5, turn, inner=0.45)
    pen.line(points + points[:1], fill=colour, width=line, joint='curve')
  return image.filter(ImageFilter.GaussianBlur(rng.uniform(0, 0.8)))


def make(root: str, kind: str, seed: int, count: int = 100) -> str:
  """`count` pictures of `kind` in root/<class>/, formats and sizes mixed, drawn from `seed`."""
  rng = np.random.default_rng([KINDS.index(kind), seed])
  for i in range(count):
    label = i % 3
    folder = os.path.join(root, CLASSES[kind][label])
    os.makedirs(folder, exist_ok=True)
    extension, fmt = FORMATS[int(rng.integers(0, 3))]
    draw(kind, label, rng).save(os.path.join(folder, f'{i:03d}.{extension}'), fmt, quality=int(rng.integers(70, 96)))
  return root


if __name__ == '__main__':
  kind, root, seed = sys.argv[1:4]
  print(make(root, kind, int(seed)))
