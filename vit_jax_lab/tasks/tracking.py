"""Single-object tracking: trained on (template, search) crop pairs with L1 + generalised IoU on the box and binary
cross-entropy on the class token's logit; evaluated by tracking whole sequences online from the first frame's box,
scored as the OTB, GOT-10k and TrackingNet toolkits score (`sequence_metrics`)."""

from __future__ import annotations

import dataclasses
import itertools
import time
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vit_jax_lab import boxes
from vit_jax_lab.data.info import TrackingInfo
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tasks.base import Batch, Preprocess, Task

if TYPE_CHECKING:
  pass

SUCCESS_THRESHOLDS = np.linspace(0.0, 1.0, 21)  # OTB's overlap thresholds 0, 0.05, ..., 1.
NORM_PRECISION_THRESHOLDS = np.linspace(0.0, 0.5, 51)  # TrackingNet's normalised centre-error thresholds.
PRECISION_PIXELS = 20.0  # OTB's precision: centre error within 20 pixels.
OTB = ('auc', 'precision', 'norm_precision')  # Scored per sequence, then averaged over sequences.
POOLED = ('ao', 'sr50', 'sr75')  # GOT-10k's scores: means over the frames of all sequences together.


def _data() -> types.SimpleNamespace:
  """TensorFlow and vit_jax_lab.data.tracking, imported at their first use, never with this module: they take 5.6 s
  (`python -X importtime`), and a config file naming this task loads without them (1.5 s), so a mistake in the
  config is reported at once."""
  import tensorflow as tf

  from vit_jax_lab.data import tracking

  return types.SimpleNamespace(tf=tf, tracking=tracking)


def iou_giou(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  """IoU and generalised IoU (Rezatofighi et al. 2019) of boxes (..., 4) as (x, y, w, h); 0 for empty unions."""
  ax1, ay1, ax2, ay2 = boxes.to_corners(jnp.unstack(a, axis=-1))
  bx1, by1, bx2, by2 = boxes.to_corners(jnp.unstack(b, axis=-1))
  inter = jnp.clip(jnp.minimum(ax2, bx2) - jnp.maximum(ax1, bx1), 0) * jnp.clip(
    jnp.minimum(ay2, by2) - jnp.maximum(ay1, by1), 0
  )
  union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
  hull = (jnp.maximum(ax2, bx2) - jnp.minimum(ax1, bx1)) * (jnp.maximum(ay2, by2) - jnp.minimum(ay1, by1))
  iou = jnp.where(union > 0, inter / jnp.where(union > 0, union, 1), 0.0)
  giou = iou - jnp.where(hull > 0, (hull - union) / jnp.where(hull > 0, hull, 1), 0.0)
  return iou, giou


def cell_shares(box: jax.Array, grid: tuple[int, int]) -> jax.Array:
  """Each cell's share of the part of boxes (B, 4) as (x, y, w, h) in crop units that lies inside the crop, over a
  `grid` (gh, gw) of equal cells: (B, gh * gw) summing to 1, row by row (0 everywhere for a box outside)."""

  def overlap(start, extent, n):  # (B, n): the box's length inside each of n cells along one axis.
    edges = jnp.arange(n + 1) / n
    return jnp.clip(jnp.minimum(edges[1:], (start + extent)[:, None]) - jnp.maximum(edges[:-1], start[:, None]), 0)

  x, y, w, h = jnp.unstack(box.astype(jnp.float32), axis=-1)
  area = (overlap(y, h, grid[0])[:, :, None] * overlap(x, w, grid[1])[:, None, :]).reshape(box.shape[0], -1)
  return area / jnp.maximum(area.sum(-1, keepdims=True), 1e-12)


def crop(image: jax.Array, region: boxes.Region, size: int) -> jax.Array:
  """`data.tracking.crop` in JAX: a (size, size, C) bilinear crop of `image` (H, W, C) over the square `region`,
  each crop pixel sampled at its centre, as tf.image.crop_and_resize samples (0 where a sample falls outside)."""
  x0, y0, side = region
  index = jnp.arange(size, dtype=jnp.float32)

  def axis(start, extent):
    at = boxes.crop_sample_points((start, side), size, index)
    low = jnp.floor(at)
    inside = (at >= 0) & (at <= extent - 1)
    low_i = jnp.clip(low, 0, extent - 1).astype(jnp.int32)
    return low_i, jnp.minimum(low_i + 1, extent - 1), at - low, inside

  top, bottom, wy, inside_y = axis(y0, image.shape[0])
  left, right, wx, inside_x = axis(x0, image.shape[1])
  rows_top, rows_bottom = image[top], image[bottom]  # (size, W, C)

  def across(rows):
    return rows[:, left] * (1 - wx)[None, :, None] + rows[:, right] * wx[None, :, None]

  out = across(rows_top) * (1 - wy)[:, None, None] + across(rows_bottom) * wy[:, None, None]
  return jnp.where((inside_y[:, None] & inside_x[None, :])[..., None], out, 0.0).astype(image.dtype)


_crop = jax.jit(crop, static_argnames='size')


def crops(images: jax.Array, region: boxes.Region, size: int) -> jax.Array:
  """`crop` of each image of a batch (B, H, W, C) over its own region (each coordinate a (B,) array)."""
  return jax.vmap(lambda image, r: crop(image, r, size))(images, region)


def clip_to_frame(box: boxes.Box, height: int, width: int) -> boxes.Box:
  """A predicted box kept trackable: its centre inside the frame, its sides between 1 pixel and the frame's."""
  cx, cy, w, h = boxes.to_centre(box)
  return boxes.from_centre(
    (jnp.clip(cx, 0, width), jnp.clip(cy, 0, height), jnp.clip(w, 1, width), jnp.clip(h, 1, height))
  )


@dataclasses.dataclass(frozen=True)
class Online:
  """How online tracking carries its box from one frame to the next (task.size_rate, task.motion_rate,
  task.velocity_smoothing). Frame t's search region is cut around box t - 1 moved `motion_rate` of the tracked
  velocity ahead, that velocity an exponential average of the centres' steps (a constant-velocity prior, as a
  Kalman filter predicts: a fast target stays nearer the crop's centre). The new box takes the predicted centre
  and its sides moved `size_rate` of the way to the predicted ones (SiamFC's and SiamRPN's damped scale)."""

  size_rate: float = 1.0  # 1: the predicted sides; 0: the first box's held.
  motion_rate: float = 0.0  # 0: the region around the previous box; 1: a whole frame's velocity ahead.
  velocity_smoothing: float = 0.0  # The share of the velocity kept at each step (0: the last step alone).

  def ahead(self, box: boxes.Box, velocity: tuple[Any, Any]) -> boxes.Box:
    """The box the next search region is cut around: `box` moved `motion_rate` times `velocity` (vx, vy)."""
    x, y, w, h = box
    return x + self.motion_rate * velocity[0], y + self.motion_rate * velocity[1], w, h

  def moved(self, velocity: tuple[Any, Any], box: boxes.Box, new: boxes.Box) -> tuple[Any, Any]:
    """The velocity after the centre stepped from `box`'s to `new`'s."""
    (cx, cy, _, _), (nx, ny, _, _), keep = boxes.to_centre(box), boxes.to_centre(new), self.velocity_smoothing
    return keep * velocity[0] + (1 - keep) * (nx - cx), keep * velocity[1] + (1 - keep) * (ny - cy)

  def advance(
    self, box: boxes.Box, velocity: tuple[Any, Any], predicted: boxes.Box, region: boxes.Region, frame_size
  ) -> tuple[boxes.Box, tuple[Any, Any]]:
    """(the next box, the next velocity) from the previous ones and the prediction (crop units) in the search
    crop of `region`; the box kept in the frame of `frame_size` (height, width)."""
    cx, cy, w, h = boxes.to_centre(boxes.from_crop(predicted, region))
    w, h = box[2] + self.size_rate * (w - box[2]), box[3] + self.size_rate * (h - box[3])
    new = clip_to_frame(boxes.from_centre((cx, cy, w, h)), *frame_size)
    return new, self.moved(velocity, box, new)

  def searched(self, tracked: np.ndarray) -> np.ndarray:
    """The boxes (T, 4) the search regions were cut around when online tracking gave `tracked` (T, 4); frame 0's
    is its own box."""
    out, velocity = [tracked[0]], (0.0, 0.0)
    for box, new in zip(tracked[:-1], tracked[1:]):
      out.append(np.stack(self.ahead(tuple(box), velocity)))
      velocity = self.moved(velocity, tuple(box), tuple(new))
    return np.stack(out).astype(np.float32)


def track(
  model: nnx.Module,
  frames: jax.Array,
  first_box: jax.Array,
  geometry: TrackingInfo,
  online: Online = Online(),
) -> tuple[jax.Array, jax.Array]:
  """Online tracking of a batch of sequences (B, T, H, W, C) from their first boxes (B, 4): the template is cut from
  frame 0, then each frame's search crop around the previous box, led by its velocity as `online` says. (boxes
  (B, T, 4) in pixels, the first being `first_box`; class logits (B, T), the first 0)."""
  g = geometry
  frame_size = frames.shape[2:4]
  first_box = first_box.astype(jnp.float32)  # Boxes stay float32 whatever the frames' dtype.
  first = tuple(jnp.unstack(first_box, axis=-1))
  template = crops(frames[:, 0], boxes.region(first, g.template_factor), g.template_size)

  def step(carry, frame):
    box, velocity = carry
    region = boxes.region(online.ahead(box, velocity), g.search_factor)
    logit, predicted = model(template, crops(frame, region, g.search_size), train=False)
    predicted = tuple(jnp.unstack(predicted.astype(jnp.float32), axis=-1))
    new, velocity = online.advance(box, velocity, predicted, region, frame_size)
    return (new, velocity), (jnp.stack(new, -1), logit.astype(jnp.float32))

  still = (jnp.zeros_like(first[0]), jnp.zeros_like(first[0]))
  _, (predicted, logits) = jax.lax.scan(step, (first, still), jnp.swapaxes(frames[:, 1:], 0, 1))
  predicted = jnp.concatenate([first_box[:, None], jnp.swapaxes(predicted, 0, 1)], 1)
  return predicted, jnp.concatenate([jnp.zeros_like(logits[:1]), logits], 0).T


def track_frames(
  predict: Callable[[np.ndarray, np.ndarray], tuple[Any, Any]],
  frames: Iterator[np.ndarray],
  first_box: np.ndarray,
  geometry: TrackingInfo,
  online: Online = Online(),
) -> tuple[np.ndarray, np.ndarray]:
  """`track` of one sequence of any length and frame size, a frame at a time driven by the host: the same crops
  (compiled once per frame size), `predict(template (1, S, S, C), search (1, S, S, C))` -> (logit (1,), box (1, 4))
  compiled once for all sequences. (boxes (T, 4), logits (T,)), as `track` returns for one."""
  g = geometry
  first = next(frames)
  box, velocity = tuple(np.asarray(first_box, np.float32)), (np.float32(0), np.float32(0))
  template = _crop(first, tuple(np.float32(v) for v in boxes.region(box, g.template_factor)), g.template_size)[None]
  out, logits = [np.asarray(box)], [0.0]
  for frame in frames:
    region = tuple(np.float32(v) for v in boxes.region(online.ahead(box, velocity), g.search_factor))
    logit, predicted = jax.device_get(predict(template, _crop(frame, region, g.search_size)[None]))
    box, velocity = online.advance(box, velocity, tuple(predicted[0]), region, first.shape[:2])
    box, velocity = tuple(np.float32(v) for v in box), tuple(np.float32(v) for v in velocity)
    out.append(np.asarray(box))
    logits.append(float(logit[0]))
  return np.stack(out), np.asarray(logits, np.float32)


def bounded(box: jax.Array, height: int, width: int) -> jax.Array:
  """Boxes (..., 4) bounded by the frame as the GOT-10k toolkit bounds both boxes before its IoU: the top-left
  corner clipped into the frame, then the sides to what is left of the frame past it."""
  x, y = jnp.clip(box[..., 0], 0, width), jnp.clip(box[..., 1], 0, height)
  return jnp.stack([x, y, jnp.clip(box[..., 2], 0, width - x), jnp.clip(box[..., 3], 0, height - y)], -1)


def sequence_metrics(
  predicted: jax.Array,
  truth: jax.Array,
  visible: jax.Array | None = None,
  frame_size: tuple[int, int] | None = None,
) -> dict[str, jax.Array]:
  """Per-sequence scores of predicted boxes (B, T, 4) against the truth where the target is `visible` (B, T) (all
  frames if None), as the toolkits define them.

  Over every frame, the given first one included, as the OTB toolkit scores: 'auc' the success AUC, the mean over
  overlap thresholds 0, 0.05, ..., 1 of the fraction of frames whose IoU exceeds it; 'precision' the frames whose
  centre error is at most 20 pixels; 'norm_precision' TrackingNet's, the mean over thresholds 0, 0.01, ..., 0.5 of
  the fraction of frames whose centre error in units of the true box's sides is at most it.

  Over frames 1.., both boxes `bounded` by the frame (`frame_size` (height, width); not bounded if None), as the
  GOT-10k toolkit scores: 'ao' the average overlap (mean IoU), 'sr50' and 'sr75' the success rates, frames with
  IoU above 0.5 and 0.75. GOT-10k pools these over the frames of all sequences: 'scored_frames' counts each
  sequence's, for `metric_sums`."""
  predicted, truth = jnp.asarray(predicted, jnp.float32), jnp.nan_to_num(jnp.asarray(truth, jnp.float32))
  every = jnp.ones(truth.shape[:2]) if visible is None else jnp.asarray(visible, jnp.float32)
  later = every.at[:, 0].set(0.0)

  def mean(x, weight):  # Over the weighted frames (and the thresholds of a trailing axis).
    x = x.mean(-1) if x.ndim == 3 else x
    return (x * weight).sum(1) / jnp.maximum(weight.sum(1), 1.0)

  iou, _ = iou_giou(predicted, truth)
  pcx, pcy, _, _ = boxes.to_centre(jnp.unstack(predicted, axis=-1))
  tcx, tcy, tw, th = boxes.to_centre(jnp.unstack(truth, axis=-1))
  error = jnp.hypot(pcx - tcx, pcy - tcy)
  norm_error = jnp.hypot((pcx - tcx) / jnp.maximum(tw, 1e-6), (pcy - tcy) / jnp.maximum(th, 1e-6))
  got_iou = iou if frame_size is None else iou_giou(bounded(predicted, *frame_size), bounded(truth, *frame_size))[0]
  return {
    'auc': mean(iou[..., None] > SUCCESS_THRESHOLDS, every),
    'precision': mean(error <= PRECISION_PIXELS, every),
    'norm_precision': mean(norm_error[..., None] <= NORM_PRECISION_THRESHOLDS, every),
    'ao': mean(got_iou, later),
    'sr50': mean(got_iou > 0.5, later),
    'sr75': mean(got_iou > 0.75, later),
    'scored_frames': later.sum(1),
  }


def metric_sums(metrics: dict[str, jax.Array], weight: jax.Array | None = None) -> dict[str, jax.Array]:
  """Sums over sequences of their `sequence_metrics`, each sequence weighted by `weight` (B,) (1: a real one):
  the OTB scores as they are, GOT-10k's times the sequence's scored frames; with 'count', the sequences, and
  'scored_frames'. Sums of splits add up; `metric_means` turns the whole split's into scores."""
  weight = jnp.ones_like(metrics['scored_frames']) if weight is None else jnp.asarray(weight, jnp.float32)
  frames = metrics['scored_frames'] * weight
  sums = {k: (v * (frames if k in POOLED else weight)).sum() for k, v in metrics.items() if k != 'scored_frames'}
  return sums | {'count': weight.sum(), 'scored_frames': frames.sum()}


def metric_means(sums: dict[str, Any]) -> dict[str, float]:
  """The split's scores from its `metric_sums`: OTB's means over sequences, GOT-10k's over frames."""
  count, frames = max(float(sums['count']), 1.0), max(float(sums['scored_frames']), 1.0)
  return {k: float(sums[k]) / (frames if k in POOLED else count) for k in (*OTB, *POOLED)}


class Tracking(Task):
  """Attributes:
  l1_weight: weight of the L1 distance between predicted and true box corners (crop units; STARK/OSTrack: 5).
  giou_weight: weight of 1 - generalised IoU (STARK/OSTrack: 2).
  class_weight: weight of the class token's binary cross-entropy (target present or not).
  attention_weight: weight of the cross-entropy from each search patch's share of the target box (`cell_shares`) to
    the regression token's attention over the search patches in the last block, heads averaged and renormalised
    (positive pairs; 0: off). It teaches the token where to look, which the MLP box head must learn through that
    attention alone; needs model.scan=False.
  size_rate: online tracking: how far each frame's box size moves from the previous one to the predicted one (1:
    the prediction; 0: the first box's size held; SiamRPN's scale learning rate).
  motion_rate: online tracking: how far ahead of the previous box, in units of its tracked velocity, each search
    region is cut (0: around the previous box; 1: one frame's motion ahead).
  velocity_smoothing: online tracking: the share of the tracked velocity kept at each frame, the rest the last step
    of the box's centre (0: the last step alone).
  """

  float32_keys = ('box', 'boxes')  # The training pairs' and the evaluated sequences' true boxes.
  predicts = 'boxes'

  def __init__(
    self,
    *,
    l1_weight: float = 5.0,
    giou_weight: float = 2.0,
    class_weight: float = 1.0,
    attention_weight: float = 0.0,
    size_rate: float = 1.0,
    motion_rate: float = 0.0,
    velocity_smoothing: float = 0.0,
  ):
    weights = dict(
      l1_weight=l1_weight, giou_weight=giou_weight, class_weight=class_weight, attention_weight=attention_weight
    )
    for key, value in weights.items():
      if value < 0:
        raise ConfigError(f'task.{key}={value} must be >= 0')
    if not 0.0 <= size_rate <= 1.0:
      raise ConfigError(f"task.size_rate={size_rate} must be in [0, 1] (1: the predicted size, 0: the first box's)")
    if not 0.0 <= motion_rate <= 1.0:
      raise ConfigError(
        f'task.motion_rate={motion_rate} must be in [0, 1] (0: search around the previous box, 1: a frame ahead)'
      )
    if not 0.0 <= velocity_smoothing < 1.0:
      raise ConfigError(
        f'task.velocity_smoothing={velocity_smoothing} must be in [0, 1) (the share of the velocity kept each frame)'
      )
    self.l1_weight, self.giou_weight, self.class_weight = l1_weight, giou_weight, class_weight
    self.attention_weight = attention_weight
    self.online = Online(size_rate, motion_rate, velocity_smoothing)
    self.geometry: TrackingInfo | None = None  # Set by dataset_info; online evaluation crops by it.

  def dataset_info(self, builder, data_config, workdir: str | None) -> TrackingInfo:
    del workdir  # Nothing is derived from the data.
    self.geometry = _data().tracking.dataset_info(builder, data_config)
    return self.geometry

  def model_kwargs(self, info: TrackingInfo) -> dict[str, Any]:
    return dict(template_size=info.template_size, search_size=info.search_size, channels=info.channels)

  def prepare(self, info: TrackingInfo, train: bool) -> Callable:
    tf = _data().tf

    def select(ex):
      absent = ex['absent'] if 'absent' in ex else tf.zeros(tf.shape(ex['boxes'])[:1], tf.bool)
      others = {'distractors': ex['distractors']} if train and 'distractors' in ex else {}
      # Training reads the two frames a pair takes (data/tracking.py); evaluation tracks every frame.
      frames = ex['frames'] if train else _data().tracking.read_frames(ex['frames'], info)
      return {'frames': frames, 'boxes': ex['boxes'], 'absent': absent} | others

    return lambda ds: ds.map(select)

  def preprocess(self, data_config, info: TrackingInfo, train: bool) -> Preprocess:
    return _data().tracking.preprocess_fn(data_config, info, train)

  def loss(self, model: nnx.Module, batch: Batch, rng: jax.Array, step: jax.Array) -> tuple[jax.Array, dict]:
    del step  # No schedule of its own.
    inputs, rngs = (batch['template'], batch['search']), nnx.Rngs(dropout=rng)
    metrics = {}
    present = batch['present']
    positives = jnp.maximum(present.sum(), 1.0)

    def over_positives(x):  # The mean over the pairs whose search crop holds the target.
      return (x * present).sum() / positives

    if self.attention_weight:
      logit, box, attention = model.with_attention(*inputs, train=True, rngs=rngs)
      looked = attention.astype(jnp.float32).mean(1)
      looked = looked / jnp.maximum(looked.sum(-1, keepdims=True), 1e-12)
      shares = cell_shares(batch['box'], model.search_grid)
      cross_entropy = -(shares * jnp.log(jnp.maximum(looked, 1e-12))).sum(-1)
      metrics['attention_ce'] = over_positives(cross_entropy)
    else:
      logit, box = model(*inputs, train=True, rngs=rngs)
    logit, box = logit.astype(jnp.float32), box.astype(jnp.float32)
    l1 = jnp.abs(
      jnp.stack(boxes.to_corners(jnp.unstack(box, axis=-1)), -1)
      - jnp.stack(boxes.to_corners(jnp.unstack(batch['box'], axis=-1)), -1)
    ).sum(-1)
    iou, giou = iou_giou(box, batch['box'])
    l1, giou_loss, iou = (over_positives(x) for x in (l1, 1.0 - giou, iou))
    bce = optax.sigmoid_binary_cross_entropy(logit, present).mean()
    loss = self.l1_weight * l1 + self.giou_weight * giou_loss + self.class_weight * bce
    loss += self.attention_weight * metrics.get('attention_ce', 0.0)
    accuracy = ((logit > 0) == (present > 0)).mean()
    metrics |= {'loss': loss, 'l1': l1, 'giou_loss': giou_loss, 'bce': bce, 'iou': iou, 'class_accuracy': accuracy}
    return loss, metrics

  def eval_sums(self, model: nnx.Module, batch: Batch) -> dict[str, jax.Array]:
    """`metric_sums` of the real (mask = 1) sequences."""
    predicted, _ = track(model, batch['frames'], batch['boxes'][:, 0], self.geometry, self.online)
    metrics = sequence_metrics(predicted, batch['boxes'], ~batch['absent'], batch['frames'].shape[2:4])
    return metric_sums(metrics, batch['mask'])

  def sequential(self, info: TrackingInfo) -> bool:
    return info.frames is None  # Real videos of any length and size: tracked one by one on the host.

  def sequential_sums(self, predict: Callable, examples: Iterator[dict]) -> dict[str, np.ndarray]:
    """`metric_sums` over sequences stored as encoded frames, each tracked by `track_frames`, and 'frames' tracked
    in 'seconds' (wall time, decoding and the first compiles included) for `summarize`'s frames per second."""
    sums = {'frames': np.float64(0), 'seconds': np.float64(0)}
    for example in examples:
      start = time.perf_counter()
      frames = _data().tracking.decoded_frames(example['frames'], self.geometry)
      first = next(frames)  # Its size bounds the boxes GOT-10k scores.
      predicted, _ = track_frames(
        predict, itertools.chain([first], frames), example['boxes'][0], self.geometry, self.online
      )
      sums['seconds'] += time.perf_counter() - start
      sums['frames'] += len(predicted) - 1
      visible = ~example['absent'][None]
      metrics = sequence_metrics(predicted[None], example['boxes'][None], visible, first.shape[:2])
      for k, v in jax.device_get(metric_sums(metrics)).items():
        sums[k] = sums.get(k, 0) + np.float64(v)
    return sums

  def summarize(self, sums: dict[str, Any]) -> dict[str, float]:
    timing = {}
    if 'seconds' in sums:  # Online evaluation on the host: its speed over all frames tracked.
      timing = {'fps': float(sums['frames']) / max(float(sums['seconds']), 1e-9)}
    return metric_means(sums) | timing | {'sequences': float(sums['count'])}
