"""The tracking ViT: box geometry and GIoU by hand, the crop -> predict -> map-back chain, the toolkit metrics on
hand-made sequences, online tracking on 1 and 8 devices, exact resume, and the config's one-line errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from flax import nnx
from PIL import Image

from conftest import build_builtin, load_config
from test_train import crash_after_logging, read_metrics, run_steps
from vit_jax_lab import boxes, config as config_lib, train
from vit_jax_lab.data import info as info_lib, tracking as data_tracking
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import layers, tracker
from vit_jax_lab.tasks import tracking
from vit_jax_lab.tools import track

SMOKE = 'configs/tracking/digits.py:mlp,smoke'


@pytest.fixture(scope='module')
def tracking_dir(tmp_path_factory) -> str:
  return build_builtin('tracking_digits/tiny', str(tmp_path_factory.mktemp('tensorflow_datasets')))


def test_box_conversions_and_giou_by_hand():
  box = (2.0, 3.0, 4.0, 6.0)
  assert boxes.to_corners(box) == (2.0, 3.0, 6.0, 9.0)
  assert boxes.from_corners((2.0, 3.0, 6.0, 9.0)) == box
  assert boxes.to_centre(box) == (4.0, 6.0, 4.0, 6.0)
  assert boxes.from_centre((4.0, 6.0, 4.0, 6.0)) == box
  # A search region at factor 2 of a 4 x 9 box: side 2 * 6 = 12, centred on (4, 7.5).
  assert boxes.region((2.0, 3.0, 4.0, 9.0), 2.0) == (-2.0, 1.5, 12.0)
  # [0, 2] x [0, 2] against [1, 3] x [0, 2]: intersection 2, union 6, hull 3 x 2 = 6 -> IoU = GIoU = 1/3.
  # Against [3, 4] x [0, 1]: no overlap, union 4 + 1 = 5, hull 4 x 2 = 8 -> IoU 0, GIoU = 0 - 3/8.
  a = jnp.array([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 0.0, 0.0]])
  b = jnp.array([[1.0, 0.0, 2.0, 2.0], [3.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
  iou, giou = tracking.iou_giou(a, b)
  np.testing.assert_allclose(iou, [1 / 3, 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(giou, [1 / 3, -3 / 8, 0.0], rtol=1e-6)  # Empty boxes: 0, not NaN.


def test_cell_shares_by_hand():
  shares = tracking.cell_shares(
    jnp.array(
      [
        [0.0, 0.0, 0.5, 0.5],  # Exactly the top-left cell of a 2 x 2 grid.
        [0.25, 0.25, 0.5, 0.5],  # A quarter in each cell.
        [0.5, 0.0, 1.0, 0.5],  # Half past the crop's right edge: the inside part is the top-right cell.
        [1.5, 1.5, 0.2, 0.2],  # Outside the crop.
      ]
    ),
    (2, 2),
  )
  np.testing.assert_allclose(shares, [[1, 0, 0, 0], [0.25] * 4, [0, 1, 0, 0], [0] * 4], atol=1e-6)
  # On 2 x 3 cells, [0, 0.75] x [0.25, 0.75] covers 1/3, 1/3 and 1/12 of the columns and 1/4 of each row.
  shares = tracking.cell_shares(jnp.array([[0.0, 0.25, 0.75, 0.5]]), (2, 3))
  np.testing.assert_allclose(shares, [[2 / 9, 2 / 9, 1 / 18] * 2], rtol=1e-5)


def test_crops_in_tensorflow_and_jax_sample_the_same_pixels():
  rng = np.random.default_rng(0)
  image = rng.uniform(0, 255, (23, 31, 3)).astype(np.float32)
  # Inside, across every edge, larger than the image, and a sub-pixel region.
  for region in [(3.0, 4.0, 10.0), (-5.5, -3.0, 12.0), (25.0, 18.0, 9.0), (-10.0, -10.0, 60.0), (7.2, 5.9, 0.8)]:
    for size in (8, 13):
      expected = data_tracking.crop(tf.constant(image), region, size).numpy()
      got = np.asarray(tracking.crop(jnp.asarray(image), tuple(map(jnp.float32, region)), size))
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3, err_msg=str((region, size)))
  # A crop at the image's own grid is the image.
  np.testing.assert_allclose(tracking.crop(jnp.asarray(image[:20, :20]), (0.0, 0.0, 20.0), 20), image[:20, :20])


class Oracle:
  """A perfect tracker that sees only the search crop: the frames' channels hold each pixel's own x and y and the
  true box, so it reads where the crop lies in the frame and the box there, and answers in crop units."""

  def __call__(self, template, search, train=False):
    del template, train
    size = search.shape[1]
    mid = size // 2
    centre, right, below = search[:, mid, mid], search[:, mid, mid + 1], search[:, mid + 1, mid]
    step_x, step_y = right[:, 0] - centre[:, 0], below[:, 1] - centre[:, 1]  # Frame pixels per crop pixel.
    # Crop pixel u samples frame pixel coordinate X(u); as a continuous coordinate the crop's left edge is at
    # X(mid) + 0.5 - (mid + 0.5) * step.
    x0, y0 = centre[:, 0] + 0.5 - (mid + 0.5) * step_x, centre[:, 1] + 0.5 - (mid + 0.5) * step_y
    x, y, w, h = (centre[:, 2 + k] for k in range(4))
    box = jnp.stack([(x - x0) / (step_x * size), (y - y0) / (step_y * size), w / (step_x * size), h / (step_y * size)])
    return jnp.zeros(search.shape[0]), box.T


def oracle_frames(truth: np.ndarray, height: int, width: int) -> np.ndarray:
  """(B, T, H, W, 6): x, y of each pixel, then the frame's true box."""
  ys, xs = np.mgrid[:height, :width].astype(np.float32)
  coords = np.broadcast_to(np.stack([xs, ys], -1), (*truth.shape[:2], height, width, 2))
  box = np.broadcast_to(truth[:, :, None, None, :], (*truth.shape[:2], height, width, 4))
  return np.concatenate([coords, box], -1).astype(np.float32)


def test_perfect_predictions_track_exactly_even_at_frame_edges():
  height, width = 40, 50
  # Two sequences: one wandering inside, one touching and crossing the edges (centres stay inside the frame).
  truth = np.array(
    [
      [[10, 12, 8, 6], [13, 11, 8, 7], [17, 14, 9, 7], [20, 18, 10, 8], [24, 20, 9, 9]],
      [[0, 0, 6, 6], [-2, 5, 6, 8], [44, 0, 6, 5], [42, 30, 8, 10], [0, 30, 4, 10]],
    ],
    np.float32,
  )
  geometry = info_lib.TrackingInfo(6, 5, (height, width), 2, 2, 16, 32, 2.0, 4.0)
  predicted, logits = jax.jit(lambda f, b: tracking.track(Oracle(), f, b, geometry))(
    oracle_frames(truth, height, width), truth[:, 0]
  )
  np.testing.assert_allclose(predicted, truth, atol=2e-4)
  assert logits.shape == (2, 5)
  metrics = tracking.sequence_metrics(predicted, truth)
  np.testing.assert_allclose(metrics['ao'], 1.0, atol=1e-4)
  np.testing.assert_allclose(metrics['auc'], 20 / 21)  # IoU 1 exceeds every threshold but 1 itself.


class Where(Oracle):
  """The oracle, its logit the x (axis 0) or y (axis 1) of the centre of the region its search crop was cut from:
  the mean of a coordinate over the crop's sample points (bilinear sampling keeps a linear field exact)."""

  def __init__(self, axis: int):
    self.axis = axis

  def __call__(self, template, search, train=False):
    _, box = super().__call__(template, search, train)
    return search[..., self.axis].mean((1, 2)) + 0.5, box


def test_search_regions_are_led_by_the_tracked_velocity():
  """With task.motion_rate=1, frame t's search region is centred a smoothed velocity ahead of box t - 1: on a target
  moving at a constant v, smoothing^(t - 1) v behind the target's centre (v itself at frame 1, before any step is
  seen; on it from frame 2 with no smoothing). `track`, `track_frames` and `Online.searched` cut the same regions."""
  velocity = np.array([3.0, -2.0])
  path = np.array([20.0, 50.0]) + np.arange(8)[:, None] * velocity
  truth = np.concatenate([path, np.full((8, 2), 8.0)], 1)[None].astype(np.float32)
  height, width = 80, 90
  geometry = info_lib.TrackingInfo(6, 8, (height, width), 2, 2, 16, 32, 2.0, 2.0)
  frames = oracle_frames(truth, height, width)
  lag = np.arange(8)[:, None] > 0
  for smoothing in (0.0, 0.5):
    online = tracking.Online(motion_rate=1.0, velocity_smoothing=smoothing)
    expected = truth[0, :, :2] + 4.0 - lag * smoothing ** np.maximum(np.arange(8) - 1, 0)[:, None] * velocity
    searched = online.searched(truth[0])
    np.testing.assert_allclose(searched[:, :2] + searched[:, 2:] / 2, expected, atol=1e-5)
    for axis in (0, 1):
      model = Where(axis)
      predicted, logits = jax.jit(lambda f, b, m=model, o=online: tracking.track(m, f, b, geometry, o))(
        frames, truth[:, 0]
      )
      np.testing.assert_allclose(predicted[0], truth[0], atol=2e-4)
      np.testing.assert_allclose(logits[0, 1:], expected[1:, axis], atol=1e-3)
      host, host_logits = tracking.track_frames(model, iter(frames[0]), truth[0, 0], geometry, online)
      np.testing.assert_allclose(host, truth[0], atol=2e-4)
      np.testing.assert_allclose(host_logits[1:], expected[1:, axis], atol=1e-3)
  # Without motion (the default), every region is centred on the previous box.
  _, logits = jax.jit(lambda f, b: tracking.track(Where(0), f, b, geometry))(frames, truth[:, 0])
  np.testing.assert_allclose(logits[0, 1:], truth[0, :-1, 0] + 4.0, atol=1e-3)


def test_tracking_in_bfloat16_keeps_float32_boxes():
  """Under compute_dtype=bfloat16 the trainer casts the batch's crops and frames but not its true boxes (bfloat16
  would move an edge at 1,000.7 px to 1,000), and the boxes carried from frame to frame stay float32 even from
  a bfloat16 first box."""
  bf16 = config_lib.base_config()
  bf16.compute_dtype = 'bfloat16'
  batch = {'search': np.ones((1, 8, 8, 1), np.float32), 'box': np.full((1, 4), 0.3001, np.float32)}
  batch |= {'frames': np.ones((1, 2, 8, 8, 1), np.float32), 'boxes': np.full((1, 2, 4), 1000.7, np.float32)}
  cast = train.in_compute_dtype(batch, bf16, tracking.Tracking.float32_keys)
  assert cast['search'].dtype == cast['frames'].dtype == jnp.bfloat16
  for key in ('box', 'boxes'):
    np.testing.assert_array_equal(cast[key], batch[key])
  truth = np.array([[[10, 12, 8, 6], [13, 11, 8, 7], [17, 14, 9, 7]]], np.float32)
  geometry = info_lib.TrackingInfo(3, 1, (40, 50), 2, 2, 16, 32, 2.0, 4.0)
  frames, first = (jnp.asarray(x, jnp.bfloat16) for x in (oracle_frames(truth, 40, 50), truth[:, 0]))
  predicted, _ = jax.jit(lambda f, b: tracking.track(Oracle(), f, b, geometry))(frames, first)
  assert predicted.dtype == jnp.float32
  np.testing.assert_allclose(predicted, truth, atol=1.0)  # The oracle reads bfloat16 pixel coordinates.


def test_evaluation_leaves_out_the_frames_without_the_target():
  """An evaluation batch carries the frames without the target ('absent', true box NaN), and those are not
  scored: the oracle's boxes on the others score AO 1."""
  truth = np.array([[10, 12, 8, 6], [13, 11, 8, 7], [17, 14, 9, 7], [20, 18, 10, 8]], np.float32)
  frames = oracle_frames(truth[None], 40, 50)[0]
  absent = np.array([False, False, True, False])
  example = {'frames': frames, 'boxes': np.where(absent[:, None], np.nan, truth), 'absent': absent}
  data_config = config_lib.base_config().data
  data_config.value_range = (0.0, 255.0)  # Frames scaled by 1: the oracle's coordinates kept.
  geometry = info_lib.TrackingInfo(6, 4, (40, 50), 2, 2, 16, 32, 2.0, 4.0, (0.0, 255.0))
  evaluated = data_tracking.preprocess_fn(data_config, geometry, train=False)(example, tf.constant([0, 0], tf.int64))
  np.testing.assert_array_equal(evaluated['absent'], absent)
  task = tracking.Tracking()
  task.geometry = geometry
  batch = {k: jnp.asarray(np.asarray(v))[None] for k, v in evaluated.items()} | {'mask': jnp.ones(1)}
  sums = jax.jit(lambda b: task.eval_sums(Oracle(), b))(batch)
  assert task.summarize(sums)['ao'] == pytest.approx(1.0, abs=1e-4) and float(sums['scored_frames']) == 2


def test_metrics_on_hand_made_sequences():
  truth = np.tile(np.array([10.0, 10.0, 10.0, 10.0], np.float32), (1, 5, 1))
  predicted = truth.copy()  # Frame 0: the given box, IoU 1.
  predicted[0, 1] = [15, 10, 10, 10]  # Half a box to the right: IoU 50 / 150 = 1/3, centre error 5 px.
  predicted[0, 2] = [10, 10, 10, 5]  # The top half: IoU 1/2, centre error 2.5 px.
  predicted[0, 3] = [40, 10, 10, 10]  # Off: IoU 0, centre error 30 px (beyond 20).
  predicted[0, 4] = truth[0, 4]  # Exact: IoU 1.
  m = {k: float(v[0]) for k, v in tracking.sequence_metrics(predicted, truth).items()}
  # GOT-10k's scores leave out frame 0.
  ious = np.array([1 / 3, 1 / 2, 0.0, 1.0])
  assert m['ao'] == pytest.approx(ious.mean(), abs=1e-6) and m['scored_frames'] == 4
  assert m['sr50'] == pytest.approx(0.25)  # Only IoU 1 exceeds 0.5 (1/2 does not).
  assert m['sr75'] == pytest.approx(0.25)
  # OTB's keep it, as its toolkit does (the tracker's box there is the given one).
  ious = np.array([1.0, 1 / 3, 1 / 2, 0.0, 1.0])
  thresholds = np.linspace(0, 1, 21)
  assert m['auc'] == pytest.approx(np.mean([(ious > t).mean() for t in thresholds]), abs=1e-6)
  assert m['precision'] == pytest.approx(0.8)
  # Centre errors in box sides: 0, 0.5, 0.25, 3, 0 -> at most t for t in 0, 0.01, ..., 0.5.
  norm = np.array([0.0, 0.5, 0.25, 3.0, 0.0])
  expected = np.mean([(norm <= t).mean() for t in np.linspace(0, 0.5, 51)])
  assert m['norm_precision'] == pytest.approx(expected, abs=1e-6)
  # The toolkits score visible frames only: frame 3 (the miss) left out, and a NaN box where absent.
  truth[0, 3] = np.nan
  visible = np.array([[True, True, True, False, True]])
  m = {k: float(v[0]) for k, v in tracking.sequence_metrics(predicted, truth, visible).items()}
  assert m['ao'] == pytest.approx(np.mean([1 / 3, 1 / 2, 1.0]), abs=1e-6) and m['precision'] == pytest.approx(1.0)


def test_got10k_scores_pool_frames_and_otb_scores_average_sequences():
  """Two sequences, 4 and 1 scored frames: AO is the mean over the 5 frames (as GOT-10k's toolkit concatenates
  every sequence's IoUs), the success AUC the mean of the two sequences' (as OTB's averages their curves)."""
  truth = np.tile(np.array([10.0, 10.0, 10.0, 10.0], np.float32), (2, 5, 1))
  predicted = truth.copy()
  predicted[1, 1:] = [40, 40, 10, 10]  # The second sequence misses every frame it is scored on.
  visible = np.array([[True] * 5, [True, True, False, False, False]])
  sums = tracking.metric_sums(tracking.sequence_metrics(predicted, truth, visible))
  means = tracking.metric_means(sums)
  assert float(sums['count']) == 2 and float(sums['scored_frames']) == 5
  assert means['ao'] == pytest.approx(4 / 5) and means['sr50'] == pytest.approx(4 / 5)
  assert means['auc'] == pytest.approx((20 / 21 + 10 / 21) / 2)  # The second: IoU 1 on frame 0, 0 on frame 1.
  # Sums of two parts add up to the whole's (evaluation sums batches and processes).
  halves = [
    tracking.metric_sums(tracking.sequence_metrics(predicted[i : i + 1], truth[i : i + 1], visible[i : i + 1]))
    for i in (0, 1)
  ]
  assert tracking.metric_means({k: halves[0][k] + halves[1][k] for k in sums}) == pytest.approx(means)


def test_got10k_bounds_both_boxes_by_the_frame():
  """As the GOT-10k toolkit's rect_iou(..., bound=(width, height)): the top-left corner clipped into the frame,
  then the sides to the frame's rest (a box past the left edge keeps its width)."""
  bounded = tracking.bounded(jnp.array([[-4.0, 2, 10, 6], [15, 5, 10, 10], [3, 4, 5, 2]]), 10, 20)
  np.testing.assert_allclose(bounded, [[0, 2, 10, 6], [15, 5, 5, 5], [3, 4, 5, 2]])
  truth = np.array([[[5.0, 5, 10, 10], [15, 5, 10, 10]]], np.float32)  # Frame 1's box leaves the 20 x 10 frame.
  predicted = np.array([[[5.0, 5, 10, 10], [15, 5, 5, 5]]], np.float32)  # The part inside.
  assert float(tracking.sequence_metrics(predicted, truth)['ao'][0]) == pytest.approx(0.25)
  assert float(tracking.sequence_metrics(predicted, truth, frame_size=(10, 20))['ao'][0]) == pytest.approx(1.0)


def assert_strokes_inside(search: np.ndarray, box: np.ndarray) -> None:
  """The search crop's pixels under `box` (crop units) hold digit strokes, its brightest pixels."""
  x, y, w, h = np.round(box * search.shape[0]).astype(int)
  inside = search[max(y, 0) : y + h, max(x, 0) : x + w]
  assert inside.size and inside.max() > search.mean()


def test_training_pairs_hold_the_target_where_their_box_says(tracking_dir):
  config = load_config(SMOKE, tracking_dir, data__negative_fraction=0.5)
  s = train.setup(config, jax.devices()[:1])
  batch = jax.device_get(next(train.train_batches(s)))
  t, size = config.data.template_size, config.data.search_size
  assert batch['template'].shape == (8, t, t, 1) and batch['search'].shape == (8, size, size, 1)
  assert set(np.unique(batch['present'])) <= {0.0, 1.0} and 0 < batch['present'].sum() < 8
  for search, box, present in zip(batch['search'], batch['box'], batch['present']):
    if not present:
      continue
    assert_strokes_inside(search, box)
    assert np.all(box[2:] > 0) and np.all((box[:2] + box[2:] / 2 >= 0) & (box[:2] + box[2:] / 2 <= 1))
  # Crops cut off-centre: where the target leaves the crop, its box is still the whole target, past [0, 1].
  config.data.centre_jitter, config.data.negative_fraction = 4.0, 0.0
  s = train.setup(config, jax.devices()[:1])
  batches = train.train_batches(s)
  box = np.concatenate([jax.device_get(next(batches))['box'] for _ in range(4)])
  outside = (box[:, :2] < 0) | (box[:, :2] + box[:, 2:] > 1)
  assert outside.any()
  side = box[:, 2:] * config.data.search_size  # The target's sides, whether it leaves the crop or not.
  np.testing.assert_allclose(side[:, 0], side[:, 1], rtol=1e-4)  # tracking_digits' boxes are squares.


def test_distractor_boxes_frame_the_other_digits(tracking_dir):
  """Each sequence's 2-4 distractor boxes are squares of 8-20 px inside the canvas, the same ones in every frame,
  moving at most 3 px per axis per frame; the part of the target hidden lies under them."""
  test = tfds.as_numpy(tfds.builder('tracking_digits/tiny', data_dir=tracking_dir).as_dataset('test', batch_size=-1))
  for others, target, hidden in zip(test['distractors'], test['boxes'], test['hidden']):
    real = others[..., 2] > 0
    count = real[0].sum()
    assert 2 <= count <= 4 and (real == (np.arange(4) < count)).all()  # A prefix, in every frame.
    x, y, w, h = np.moveaxis(others[:, :count], -1, 0)
    assert (w == h).all() and (8 <= w).all() and (w <= 20).all() and (x >= 0).all() and (x + w <= 64).all()
    assert (np.abs(np.diff(others[:, :count, :2], axis=0)) <= 3).all()
    for t in range(len(target)):
      under = np.zeros((64, 64), bool)
      for ox, oy, ow, oh in others[t, :count].astype(int):
        under[oy : oy + oh, ox : ox + ow] = True
      tx, ty, tw, th = target[t].astype(int)
      assert hidden[t] <= under[ty : ty + th, tx : tx + tw].mean() + 1e-6


def test_search_crops_cut_around_the_nearest_distractor(tracking_dir):
  """`_nearest` skips empty rows; with every crop cut around a distractor, those far from the target are negatives
  (none other are made here) and the rest hold the target's strokes where their box says."""
  distractors = tf.constant([[40.0, 40.0, 10.0, 10.0], [12.0, 10.0, 8.0, 8.0], [0.0, 0.0, 0.0, 0.0]])
  nearest, any_distractor = data_tracking._nearest(distractors, (0.0, 0.0, 2.0, 2.0))
  assert [float(v) for v in nearest] == [12.0, 10.0, 8.0, 8.0] and bool(any_distractor)
  _, any_distractor = data_tracking._nearest(tf.zeros((4, 4)), (0.0, 0.0, 2.0, 2.0))
  assert not bool(any_distractor)
  config = load_config(SMOKE, tracking_dir, data__distractor_fraction=1.0, data__negative_fraction=0.0)
  s = train.setup(config, jax.devices()[:1])
  batches = train.train_batches(s)
  batch = jax.tree.map(lambda *x: np.concatenate(x), *[jax.device_get(next(batches)) for _ in range(4)])
  assert 0 < batch['present'].mean() < 1
  for search, box in zip(batch['search'][batch['present'] > 0], batch['box'][batch['present'] > 0]):
    assert_strokes_inside(search, box)
  config.data.distractor_fraction = 0.0
  s = train.setup(config, jax.devices()[:1])
  assert jax.device_get(next(train.train_batches(s)))['present'].all()


def test_corner_soft_argmax_reaches_past_the_crop_edge_only_with_a_margin():
  """A heat map all on one cell reads out that cell's centre: the outermost cell of the grid is half a cell inside
  the crop; with a margin of 1 the map's outermost cell is half a cell outside."""
  n = 6
  for margin, (first, last) in ((0, (0.5 / n, 1 - 0.5 / n)), (1, (-0.5 / n, 1 + 0.5 / n))):
    side = n + 2 * margin
    probs = jnp.zeros((2, side, side, 1)).at[0, 0, 0, 0].set(1.0).at[1, -1, 0, 0].set(1.0)
    x, y = tracker.soft_argmax(probs, (n, n), margin)
    np.testing.assert_allclose(np.concatenate([x[:, 0], y[:, 0]]), [first, first, first, last], rtol=1e-6)
  uniform = jnp.full((1, n + 2, n + 2, 1), 1 / (n + 2) ** 2)
  np.testing.assert_allclose(tracker.soft_argmax(uniform, (n, n), 1), [[[0.5]], [[0.5]]], rtol=1e-6)


@pytest.mark.slow
def test_both_box_heads_give_boxes_and_refuse_bad_options():
  template, search = jnp.zeros((2, 32, 32, 1)), jnp.ones((2, 64, 64, 1))
  for head in ('mlp', 'corner'):
    model = tracker.Tracker(
      32,
      64,
      1,
      width=32,
      depth=1,
      mlp_dim=64,
      num_heads=2,
      patch_size=8,
      box_head=head,
      corner_channels=16,
      rngs=nnx.Rngs(0),
    )
    logit, box = model(template, search)
    assert logit.shape == (2,) and box.shape == (2, 4)
    assert np.all(np.asarray(box[:, 2:]) >= 0)
  with pytest.raises(ConfigError, match='box_head'):
    tracker.Tracker(
      32, 64, 1, width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, box_head='mean', rngs=nnx.Rngs(0)
    )
  with pytest.raises(ConfigError, match='attention'):
    tracker.Tracker(
      32, 64, 1, width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, attention='local', rngs=nnx.Rngs(0)
    )
  with pytest.raises(ConfigError, match='corner_margin=-1 must be >= 0'):
    tracker.Tracker(
      32, 64, 1, width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, corner_margin=-1, rngs=nnx.Rngs(0)
    )
  with pytest.raises(ConfigError, match='corner_channels=1 must be an integer >= 2'):  # Was a ZeroDivisionError.
    tracker.Tracker(
      32, 64, 1, width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, corner_channels=1, rngs=nnx.Rngs(0)
    )


def test_conv_stem_tokens_lie_on_the_patch_grid_with_overlapping_receptive_fields():
  """Both stems give one token per patch; one pixel moves only its own patch's token under the linear patch
  projection, and also its neighbours' under the conv stem. The conv stem needs a power-of-2 patch."""
  images = jax.random.normal(jax.random.key(0), (1, 32, 32, 1))
  touched = images.at[0, 16, 16].add(1.0)  # The top-left pixel of patch (2, 2) of the 4 x 4 grid.
  for stem, moved in ((layers.PatchEmbedding, [10]), (layers.ConvStem, [5, 6, 9, 10])):
    embed = stem(8, 1, 32, rngs=nnx.Rngs(0))
    tokens = embed(images)
    assert tokens.shape == (1, 16, 32)
    changed = np.nonzero(np.abs(np.asarray(embed(touched) - tokens)).max(-1)[0] > 1e-6)[0]
    assert list(changed) == moved, stem
  with pytest.raises(ConfigError, match='patch_size=12 must be a power of 2'):
    tracker.Tracker(24, 48, 1, width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=12, stem='conv', rngs=nnx.Rngs(0))


def test_attention_weight_adds_the_regression_tokens_cross_entropy_to_the_loss():
  """The supervised attention is the one the last block uses (`search_attention` draws the same map, the boxes are
  `__call__`'s); the loss grows by attention_weight times its cross-entropy from the target's cell shares, over
  positive pairs only."""
  dims = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8)
  model = tracker.Tracker(16, 32, 1, **dims, rngs=nnx.Rngs(0))
  keys = jax.random.split(jax.random.key(1), 2)
  batch = {
    'template': jax.random.normal(keys[0], (3, 16, 16, 1)),
    'search': jax.random.normal(keys[1], (3, 32, 32, 1)),
    'box': jnp.array([[0.0, 0.0, 0.5, 0.5], [0.25, 0.5, 0.5, 0.5], [0.1, 0.1, 0.3, 0.3]]),
    'present': jnp.array([1.0, 1.0, 0.0]),
  }

  @nnx.jit  # One compile instead of six eager passes (8.5 s eager).
  def outputs(model, batch):
    rng = jax.random.key(2)
    plain, plain_metrics = tracking.Tracking().loss(model, batch, rng, jnp.int32(0))
    weighted, metrics = tracking.Tracking(attention_weight=2.0).loss(model, batch, rng, jnp.int32(0))
    return dict(
      with_attention=model.with_attention(batch['template'], batch['search']),
      call=model(batch['template'], batch['search']),
      drawn=model.search_attention(batch['template'], batch['search'])[1],
      plain=(plain, plain_metrics),
      weighted=(weighted, metrics),
    )

  out = outputs(model, batch)
  logit, box, attention = out['with_attention']
  np.testing.assert_allclose(logit, out['call'][0], rtol=1e-6)
  np.testing.assert_allclose(box, out['call'][1], rtol=1e-6)
  np.testing.assert_allclose(attention.mean(1).reshape(out['drawn'].shape), out['drawn'], rtol=1e-6)
  looked = attention.mean(1) / attention.mean(1).sum(-1, keepdims=True)
  by_hand = -(tracking.cell_shares(batch['box'], (4, 4)) * jnp.log(looked)).sum(-1)[:2].mean()
  (plain, plain_metrics), (weighted, metrics) = out['plain'], out['weighted']
  assert 'attention_ce' not in plain_metrics
  np.testing.assert_allclose(metrics['attention_ce'], by_hand, rtol=1e-5)
  np.testing.assert_allclose(weighted - plain, 2.0 * by_hand, rtol=1e-5)
  scanned = tracker.Tracker(16, 32, 1, **dims, scan=True, rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='model.scan=False'):
    scanned.with_attention(batch['template'], batch['search'])


def test_supervised_attention_keeps_rematerialisation():
  """`with_attention` applies the blocks before the last one as the encoder does: with model.remat they are
  rematerialised (recomputed in the backward pass), and the gradients stay the plain model's."""
  dims = dict(width=32, depth=3, mlp_dim=64, num_heads=2, patch_size=8)
  keys = jax.random.split(jax.random.key(1), 2)
  batch = {
    'template': jax.random.normal(keys[0], (2, 16, 16, 1)),
    'search': jax.random.normal(keys[1], (2, 32, 32, 1)),
    'box': jnp.array([[0.0, 0.0, 0.5, 0.5], [0.25, 0.5, 0.5, 0.5]]),
    'present': jnp.array([1.0, 1.0]),
  }
  task = tracking.Tracking(attention_weight=2.0)

  def gradients(remat):
    graphdef, params = nnx.split(tracker.Tracker(16, 32, 1, **dims, remat=remat, rngs=nnx.Rngs(0)))
    grad = jax.grad(lambda p: task.loss(nnx.merge(graphdef, p), batch, jax.random.key(2), jnp.int32(0))[0])
    return str(jax.make_jaxpr(grad)(params)).count('remat'), jax.jit(grad)(params)

  (plain_count, plain), (remat_count, rematted) = gradients('none'), gradients('full')
  assert (plain_count, remat_count) == (0, 2)  # The two blocks before the last.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), plain, rematted)


def test_sincos_position_embeddings_start_each_grid_apart_and_beside_the_search_grid():
  dims = dict(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8)
  model = tracker.Tracker(32, 64, 1, **dims, posemb_init='sincos2d', rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param).to_pure_dict()
  np.testing.assert_array_equal(params['template_pos'][0], layers.sincos_2d(4, 4, 32))
  np.testing.assert_array_equal(params['search_pos'][0], layers.sincos_2d(8, 8, 32))
  # 'sincos2d_beside': the template's 4 x 4 grid as columns 8-11 of a 4 x 12 grid, no embedding a search patch's.
  beside = tracker.Tracker(32, 64, 1, **dims, posemb_init='sincos2d_beside', rngs=nnx.Rngs(0))
  params = nnx.state(beside, nnx.Param).to_pure_dict()
  wide = layers.sincos_2d(4, 12, 32).reshape(4, 12, 32)
  np.testing.assert_array_equal(params['template_pos'][0].reshape(4, 4, 32), wide[:, 8:])
  np.testing.assert_array_equal(params['search_pos'][0], layers.sincos_2d(8, 8, 32))
  gaps = np.abs(params['template_pos'][0][:, None] - params['search_pos'][0][None]).sum(-1)
  assert gaps.min() > 0.5 and not np.allclose(params['template_pos'][0], layers.sincos_2d(4, 4, 32))
  with pytest.raises(
    ConfigError, match="posemb_init='fixed' is not one of 'normal', 'sincos2d', 'sincos2d_beside'"
  ) as e:
    tracker.Tracker(32, 64, 1, **dims, posemb_init='fixed', rngs=nnx.Rngs(0))
  assert '\n' not in str(e.value)


@pytest.mark.parametrize(
  'overrides, message',
  [
    (dict(data__name='digits'), 'no frames and boxes'),
    (dict(data__search_size=60), 'patch'),
    (dict(data__negative_fraction=1.0), 'negative_fraction'),
    (dict(data__distractor_fraction=1.5), 'distractor_fraction'),
    (dict(data__search_factor=0.0), 'search_factor'),
    (dict(task__attention_weight=-1.0), 'attention_weight=-1.0 must be >= 0'),
    (dict(task__motion_rate=1.5), r'task.motion_rate=1.5 must be in \[0, 1\]'),
    (dict(task__velocity_smoothing=1.0), r'task.velocity_smoothing=1.0 must be in \[0, 1\)'),
    (dict(task__attention_weight=1.0, model__scan=True), 'set model.scan=False or task.attention_weight=0'),
    (dict(task__attention_weight=1.0, model__attention='linear'), "set model.attention='full' or task.attention_"),
  ],
)
def test_bad_tracking_configs_stop_in_one_line(tracking_dir, data_dir, overrides, message):
  config = load_config(SMOKE, tracking_dir, **overrides)
  if overrides.get('data__name') == 'digits':
    config.data.data_dir = data_dir
  with pytest.raises(ConfigError, match=message) as error:
    config_lib.validate(config)
    train.setup(config, jax.devices()[:1])
  assert '\n' not in str(error.value)


@pytest.mark.slow
def test_online_tracking_gives_equal_boxes_on_1_and_8_devices(tracking_dir):
  results = []
  for devices, eval_batch in ((jax.devices()[:1], 4), (jax.devices(), 8)):
    config = load_config(SMOKE, tracking_dir, data__eval_batch_size=eval_batch)
    s = train.setup(config, devices)
    state = train.init_state(s)
    results.append(train.evaluate(s, train.make_eval_step(s), state.params))
  assert results[0]['eval/sequences'] == 4
  for key in results[0]:
    assert results[0][key] == pytest.approx(results[1][key], abs=1e-5), key


@pytest.mark.slow
def test_train_steps_equal_on_1_and_8_devices(tracking_dir):
  reference, _, _ = run_steps(load_config(SMOKE, tracking_dir), jax.devices()[:1], num_steps=3)
  losses, _, _ = run_steps(load_config(SMOKE, tracking_dir, data__eval_batch_size=8), jax.devices(), num_steps=3)
  np.testing.assert_allclose(losses, reference, rtol=1e-5)
  assert np.all(np.diff(reference) != 0)


@pytest.mark.slow
def test_resumed_tracking_run_equals_uninterrupted(tracking_dir, tmp_path, monkeypatch):
  config = load_config(SMOKE, tracking_dir, total_steps=6, checkpoint_every=3, eval_every=3, data__eval_batch_size=8)
  whole, resumed = str(tmp_path / 'whole'), str(tmp_path / 'resumed')
  train.train_and_evaluate(config, whole)
  crash_after_logging(config, resumed, 5, monkeypatch)
  train.train_and_evaluate(config, resumed)
  assert read_metrics(resumed) == read_metrics(whole)
  assert any('eval/auc' in m for m in read_metrics(whole))


@pytest.fixture(scope='module')
def tracking_run(tracking_dir, tmp_path_factory) -> str:
  """A finished smoke tracking run (corner head, whose maps are spatial)."""
  workdir = str(tmp_path_factory.mktemp('track_run'))
  config = load_config('configs/tracking/digits.py:corner,smoke', tracking_dir, data__eval_batch_size=8)
  train.train_and_evaluate(config, workdir)
  return workdir


@pytest.mark.slow
def test_track_command_draws_a_test_sequence_and_a_users_frames(tracking_run, tracking_dir, tmp_path, capsys):
  assert track.main(['--workdir', tracking_run, '--sequence', '2']) == 0  # Into the run's workdir.
  figure = np.asarray(Image.open(os.path.join(tracking_run, 'track_sequence2.png')))
  assert figure.shape[1] > 2 * figure.shape[0] and figure.std() > 0  # 8 frames x (frame, reg, cls).
  predicted = np.loadtxt(os.path.join(tracking_run, 'track_sequence2.txt'), delimiter=',')
  assert predicted.shape == (48, 4)
  assert 'auc' in capsys.readouterr().out
  # A folder of frames, tracked from a given first box, animated.
  frames = str(tmp_path / 'frames')
  os.makedirs(frames)
  rng = np.random.default_rng(0)
  for t in range(5):
    Image.fromarray(rng.integers(0, 255, (40, 50), np.uint8)).save(os.path.join(frames, f'{t + 1}.png'))
  gif = str(tmp_path / 'mine.gif')
  assert track.main(['--workdir', tracking_run, '--video', frames, '--box', '10,12,8,8', '--out', gif]) == 0
  assert Image.open(gif).n_frames == 5
  np.testing.assert_allclose(np.loadtxt(str(tmp_path / 'mine.txt'), delimiter=',')[0], [10, 12, 8, 8])


@pytest.mark.slow
@pytest.mark.parametrize(
  'args, message',
  [
    (['--box', '60,12,8,8'], 'outside the first frame'),
    (['--box', '10,12,8'], 'expected x,y,w,h'),
    (['--box', '10,12,0,8'], 'must be positive'),
    (['--video', 'EMPTY', '--box', '1,1,4,4'], 'holds no frames'),
    (['--sequence', '9'], 'the eval split has 4 sequences'),
  ],
)
def test_track_command_stops_bad_inputs_in_one_line(tracking_run, tmp_path, capsys, args, message):
  frames = str(tmp_path / 'frames')
  os.makedirs(frames)
  (tmp_path / 'empty').mkdir()
  Image.fromarray(np.zeros((40, 50), np.uint8)).save(os.path.join(frames, '1.png'))
  Image.fromarray(np.zeros((40, 50), np.uint8)).save(os.path.join(frames, '2.png'))
  if args[0] == '--box':
    args = ['--video', frames] + args
  args = [str(tmp_path / 'empty') if a == 'EMPTY' else a for a in args]
  assert track.main(['--workdir', tracking_run, '--out', str(tmp_path / 'x.png')] + args) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and '\n' not in err


def test_init_from_an_image_vit_copies_the_encoder_and_resamples_positions_per_grid():
  from vit_jax_lab.models import release, vit

  dims = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8)
  image_model = vit.ViT(10, (32, 32, 1), **dims, rngs=nnx.Rngs(1))  # A 4 x 4 grid with a class token.
  image = nnx.state(image_model, nnx.Param).to_pure_dict()
  model = tracker.Tracker(32, 64, 1, **dims, rngs=nnx.Rngs(0))
  initial = nnx.state(model, nnx.Param).to_pure_dict()
  for source in (image, release.to_release(image, 2)):  # Our ViT's parameters, and the release layout.
    loaded, notes = model.load_pretrained(source, initial)
    jax.tree.map(np.testing.assert_array_equal, loaded['encoder'], jax.tree.map(np.asarray, image['encoder']))
    np.testing.assert_array_equal(loaded['embedding']['kernel'], image['embedding']['kernel'])
    grid_pos = np.asarray(image['pos_embedding'])[:, 1:]
    np.testing.assert_array_equal(loaded['template_pos'], grid_pos)  # Same 4 x 4 grid: unchanged.
    np.testing.assert_allclose(loaded['search_pos'], release.resample_posemb(grid_pos, (8, 8), False), rtol=1e-6)
    for fresh in ('cls', 'reg', 'class_head', 'box_mlp'):
      jax.tree.map(np.testing.assert_array_equal, loaded[fresh], initial[fresh])
    assert any('search grid (8, 8)' in note for note in notes)
  with pytest.raises(ConfigError, match='image ViTs'):
    model.load_pretrained({'encoder': image['encoder']}, initial)
  conv = tracker.Tracker(32, 64, 1, **dims, stem='conv', rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match="fits model.stem='patch' only"):
    conv.load_pretrained(image, nnx.state(conv, nnx.Param).to_pure_dict())


def test_init_from_a_tracker_run_copies_every_weight_or_names_the_first_difference():
  dims = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8)
  model = tracker.Tracker(32, 64, 1, **dims, rngs=nnx.Rngs(0))
  initial = nnx.state(model, nnx.Param).to_pure_dict()
  trained = nnx.state(tracker.Tracker(32, 64, 1, **dims, rngs=nnx.Rngs(1)), nnx.Param).to_pure_dict()
  loaded, notes = model.load_pretrained(trained, initial)
  jax.tree.map(np.testing.assert_array_equal, loaded, jax.tree.map(np.asarray, trained))
  assert notes == ['every weight from the tracker run']
  wider = nnx.state(tracker.Tracker(32, 64, 1, **dims | {'mlp_dim': 96}, rngs=nnx.Rngs(1)), nnx.Param)
  with pytest.raises(ConfigError, match='differs from the configured tracker .first at encoder') as e:
    model.load_pretrained(wider.to_pure_dict(), initial)
  assert '\n' not in str(e.value)


@pytest.mark.slow
def test_bench_times_the_tracker_and_names_each_input(tracking_dir, tmp_path):
  from vit_jax_lab.tools import bench

  out = tmp_path / 'bench.json'
  spec = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), SMOKE)
  argv = ['--steps', '2', '--warmup', '0', '--input_batches', '2', '--out', str(out), '--config', spec]
  assert bench.main([*argv, f'--config.data.data_dir={tracking_dir}', '--config.data.eval_batch_size=8']) == 0
  (result,) = json.loads(out.read_text())
  config = load_config(SMOKE, tracking_dir)
  template, search, channels = config.data.template_size, config.data.search_size, 1
  assert result['input_shape'] == {
    'template': [template, template, channels],
    'search': [search, search, channels],
    'box': [4],
    'present': [],
  }
  assert result['model'] == 'tracker' and result['step_s_median'] > 0 and result['step_tflop'] > 0


def test_a_crop_that_shrinks_its_region_decodes_the_jpeg_at_a_dct_scale():
  """A tracking crop over a region 2x (4x, 8x) its size decodes the JPEG frame at 1/2 (1/4, 1/8): libjpeg's scaled
  IDCT averages the pixels a crop would sample 2x2 at the full size. On a smooth frame the crops agree to about a
  level; one no smaller than its region crops the whole frame's pixels (to float rounding: the part decoded is
  sampled at other fractions of its size)."""
  ys, xs = np.mgrid[0:720, 0:1280]  # GOT-10k's frame size; the regions lie inside it.
  frame = np.stack([xs * 0.15, ys * 0.3, (xs + ys) * 0.1], -1).astype(np.uint8)
  data = tf.io.encode_jpeg(frame, quality=95)
  full = tf.io.decode_jpeg(data, channels=3)
  for side, size, ratio in ((100.0, 128, 1), (300.0, 128, 2), (600.0, 128, 4), (330.0, 32, 8)):
    region = (tf.constant(20.0), tf.constant(10.0), tf.constant(side))
    decoded, scaled = data_tracking.decode_for_crop(data, region, size, 3)
    ours = data_tracking.crop(decoded, scaled, size).numpy()
    whole = data_tracking.crop(full, region, size).numpy()
    if ratio == 1:
      np.testing.assert_allclose(ours, whole, atol=5e-3)
    else:
      difference = np.abs(ours - whole)
      assert difference.mean() < 1.5 and difference.max() < 6, (ratio, difference.mean(), difference.max())


def test_a_crop_decodes_only_the_part_of_the_jpeg_it_reads():
  """Only the rows and columns a crop samples (and a margin) are decoded, and its crop is the crop of the whole
  frame decoded at the same scale: inside the frame, across its edges, and wholly outside it (the fill)."""
  rng = np.random.default_rng(0)
  ys, xs = np.mgrid[0:720, 0:1280]
  frame = np.clip(np.stack([xs * 0.15, ys * 0.3, (xs + ys) * 0.1], -1) + rng.normal(0, 20, (720, 1280, 3)), 0, 255)
  data = tf.io.encode_jpeg(frame.astype(np.uint8), quality=90)
  for side, size, ratio in ((100.0, 128, 1), (300.0, 128, 2), (600.0, 128, 4), (330.0, 32, 8)):
    at_scale = tf.io.decode_jpeg(data, channels=3, ratio=ratio)
    corners = ((417.3, 211.9), (-50.0, 600.0), (1200.0, -30.5), (1500.0, 900.0), (-700.0, -700.0), (1270.0, 715.0))
    for x0, y0 in corners:
      region = (tf.constant(x0), tf.constant(y0), tf.constant(side))
      decoded, scaled = data_tracking.decode_for_crop(data, region, size, 3)
      ours = data_tracking.crop(decoded, scaled, size, fill=7.0).numpy()
      theirs = data_tracking.crop(at_scale, (x0 / ratio, y0 / ratio, side / ratio), size, fill=7.0).numpy()
      np.testing.assert_allclose(ours, theirs, atol=5e-3, err_msg=str((x0, y0, side, ratio)))
      if (x0, y0) == corners[0]:  # Inside: the region's side and the margins, not the frame.
        assert max(decoded.shape[:2]) <= side / ratio + 2 * 17 + 2, decoded.shape
