"""Tracking digits as a TFDS dataset: one target digit of `digits` followed through a sequence among moving
distractors, with its box in every frame (single-object tracking, the layout of GOT-10k: frames + boxes)."""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from vit_jax_lab.data.builders import digits

MAX_SPEED = 3.0  # Pixels per frame, per axis.
MAX_DISTRACTORS = 4
SCALES = (1.0, 2.5)  # Digit side in multiples of its 8 pixels.


@dataclasses.dataclass
class TrackingDigitsConfig(tfds.core.BuilderConfig):
  """Attributes:
  frames: frames per sequence.
  size: canvas side in pixels.
  sequences: (train, test) sequence counts.
  """

  frames: int = 48
  size: int = 64
  sequences: tuple[int, int] = (600, 60)


def scaled(image: np.ndarray, side: int) -> np.ndarray:
  """(8, 8, 1) uint8 -> (side, side, 1), nearest neighbour."""
  index = np.arange(side) * image.shape[0] // side
  return image[index][:, index]


class Walker:
  """One digit's path: position and scale wander smoothly (velocity and log-scale random walks), bouncing off
  the canvas edges so the digit stays inside."""

  def __init__(self, image: np.ndarray, size: int, rng: np.random.Generator):
    self.image, self.size, self.rng = image, size, rng
    self.log_scale = rng.uniform(*np.log(SCALES))
    side = self.side()
    self.position = rng.uniform(0, size - side, size=2)  # (x, y) of the top-left corner.
    self.velocity = rng.uniform(-MAX_SPEED, MAX_SPEED, size=2)

  def side(self) -> int:
    return int(round(8 * np.exp(self.log_scale)))

  def step(self) -> None:
    self.velocity = np.clip(self.velocity + self.rng.normal(0.0, 0.4, size=2), -MAX_SPEED, MAX_SPEED)
    self.log_scale = np.clip(self.log_scale + self.rng.normal(0.0, 0.04), *np.log(SCALES))
    room = self.size - self.side()
    self.position = self.position + self.velocity
    for k in range(2):
      if not 0 <= self.position[k] <= room:
        self.velocity[k] = -self.velocity[k]
        self.position[k] = np.clip(self.position[k], 0, room)

  def box(self) -> tuple[int, int, int, int]:
    """(x, y, w, h) in whole pixels."""
    x, y = np.round(self.position).astype(int)
    return int(x), int(y), self.side(), self.side()

  def draw(self, canvas: np.ndarray) -> None:
    """Pastes the digit's square opaquely: a digit drawn later occludes the ones below it."""
    x, y, w, h = self.box()
    canvas[y : y + h, x : x + w] = scaled(self.image, w)


def sequence(
  target: np.ndarray, others: list[np.ndarray], above: list[bool], frames: int, size: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
  """Frames (T, size, size, 1) uint8 of `target` among the `others` (drawn above it where `above`), on noise;
  its boxes (T, 4) float32 (x, y, w, h), the fraction of it that the digits above hide, per frame, and the others'
  boxes (T, MAX_DISTRACTORS, 4), zeros after the last."""
  walkers = [Walker(target, size, rng)] + [Walker(o, size, rng) for o in others]
  background = rng.uniform(0, 48) + rng.normal(0.0, 12.0, size=(size, size, 1))
  video = np.zeros((frames, size, size, 1), np.uint8)
  boxes = np.zeros((frames, 4), np.float32)
  hidden = np.zeros(frames, np.float32)
  distractors = np.zeros((frames, MAX_DISTRACTORS, 4), np.float32)
  for t in range(frames):
    canvas = background + rng.normal(0.0, 8.0, size=background.shape)
    for walker, is_above in zip(walkers[1:], above):
      if not is_above:
        walker.draw(canvas)
    walkers[0].draw(canvas)
    cover = np.zeros((size, size), bool)
    for walker, is_above in zip(walkers[1:], above):
      if is_above:
        walker.draw(canvas)
        x, y, w, h = walker.box()
        cover[y : y + h, x : x + w] = True
    x, y, w, h = walkers[0].box()
    video[t] = np.clip(canvas, 0, 255).astype(np.uint8)
    boxes[t] = x, y, w, h
    hidden[t] = cover[y : y + h, x : x + w].mean()
    distractors[t, : len(others)] = [walker.box() for walker in walkers[1:]]
    for walker in walkers:
      walker.step()
  return {'frames': video, 'boxes': boxes, 'hidden': hidden, 'distractors': distractors}


class TrackingDigits(tfds.core.GeneratorBasedBuilder):
  """Grey sequences of a target digit moving with changing velocity and scale among 2-4 moving distractor
  digits (about half of the same class), some of which pass over it and hide part of it, on a noisy background.

  Sequence j of a split draws everything from np.random.default_rng((split, j)): the target and distractors
  from the `digits` images of that split only (train sequences from train digits, test from test digits),
  each digit's start, velocity and scale, and which distractors are drawn above the target. Boxes are the
  target's square (x, y, w, h) in pixels, frame by frame, annotated when hidden too; 'hidden' is the fraction
  of the box covered by distractors above it; 'distractors' the other digits' boxes, zeros where there are fewer
  than four (training cuts search crops around them).
  """

  VERSION = tfds.core.Version('1.1.0')
  RELEASE_NOTES = {
    '1.0.0': 'Sequences from default_rng((split, index)).',
    '1.1.0': "The distractors' boxes; frames and boxes as in 1.0.0.",
  }
  BUILDER_CONFIGS = [
    TrackingDigitsConfig(name='default', description='600 train and 60 test sequences of 48 frames, 64 x 64.'),
    TrackingDigitsConfig(name='tiny', sequences=(8, 4), description='8 train and 4 test sequences, for tests.'),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    c = self.builder_config
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          'frames': tfds.features.Tensor(shape=(c.frames, c.size, c.size, 1), dtype=np.uint8, encoding='zlib'),
          'boxes': tfds.features.Tensor(shape=(c.frames, 4), dtype=np.float32),
          'hidden': tfds.features.Tensor(shape=(c.frames,), dtype=np.float32),
          'distractors': tfds.features.Tensor(shape=(c.frames, MAX_DISTRACTORS, 4), dtype=np.float32),
          'digit': tfds.features.ClassLabel(num_classes=10),
        }
      ),
      homepage='https://archive.ics.uci.edu/dataset/80',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {'train': self._generate_examples(test=False), 'test': self._generate_examples(test=True)}

  def _generate_examples(self, test: bool):
    c = self.builder_config
    pool = list(digits.examples(test))
    images = np.stack([image for _, image, _ in pool])
    labels = np.array([label for _, _, label in pool])
    for j in range(c.sequences[test]):
      rng = np.random.default_rng((int(test), j))
      target = int(rng.integers(len(pool)))
      count = int(rng.integers(2, MAX_DISTRACTORS + 1))
      same = np.flatnonzero((labels == labels[target]) & (np.arange(len(pool)) != target))
      others = [int(rng.choice(same)) if rng.random() < 0.5 else int(rng.integers(len(pool))) for _ in range(count)]
      above = [bool(rng.random() < 0.5) for _ in range(count)]
      example = sequence(images[target], [images[o] for o in others], above, c.frames, c.size, rng)
      yield j, example | {'digit': int(labels[target])}
