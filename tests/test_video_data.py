"""The built-in moving_digits videos and the video input path: clips, shared crops, multi-view evaluation."""

import collections
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import main
from conftest import ROOT
from vit_jax_lab import config as config_lib, parallel
from vit_jax_lab.config import ConfigError
from vit_jax_lab.data import device, images as image_data, info as info_lib, labels as label_data, pipeline, videos
from vit_jax_lab.tasks.classification import Classification

OPPOSITE = [1, 0, 3, 2]  # right <-> left, down <-> up.


def make_config(data_dir=None, **data):
  """base_config() for moving_digits with `data.*` overrides; pixel values kept in 0..255 unless overridden."""
  config = config_lib.base_config()
  config.lock()
  config.data.update({'name': 'moving_digits', 'data_dir': data_dir, 'value_range': (0.0, 255.0), **data})
  return config


def synthetic(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (*shape, 1)).astype(np.uint8)


def video_info(num_frames, height, width) -> info_lib.LabelInfo:
  return info_lib.LabelInfo(
    num_classes=4, input_key='video', input_shape=(num_frames, height, width, 1), num_train=0, num_eval=0
  )


def seed(s: int) -> tf.Tensor:
  return tf.constant([0, s], tf.int64)


@pytest.fixture(scope='module')
def splits(moving_digits_dir):
  builder = tfds.builder('moving_digits', data_dir=moving_digits_dir)
  return {
    split: tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1, shuffle_files=False))
    for split in ('train', 'test')
  }


@pytest.mark.slow
def test_builder_sizes_shapes_and_balanced_labels(moving_digits_dir, splits):
  builder = tfds.builder('moving_digits', data_dir=moving_digits_dir)
  assert builder.info.features['label'].names == ['right', 'left', 'down', 'up']
  assert builder.info.supervised_keys == ('video', 'label')
  for split, n in (('train', 5748), ('test', 1440)):
    assert builder.info.splits[split].num_examples == n
    data = splits[split]
    assert data['video'].shape == (n, 9, 20, 20, 1) and data['video'].dtype == np.uint8
    assert collections.Counter(data['label'].tolist()) == {k: n // 4 for k in range(4)}


@pytest.mark.slow
def test_builder_videos_are_the_documented_ones(splits):
  """The test split is exactly: digit i (i % 5 == 0) with its corner at c + v * (t - 4), c from default_rng(i)."""
  from sklearn.datasets import load_digits

  digits = load_digits()
  images = np.round(digits.images * 255 / 16).astype(np.uint8)
  expected = collections.Counter()
  for i in range(0, len(images), 5):
    c = np.random.default_rng(i).integers(4, 9, size=2)
    for label, v in enumerate(((0, 1), (0, -1), (1, 0), (-1, 0))):
      video = np.zeros((9, 20, 20), np.uint8)
      for t in range(9):
        r, col = c + np.array(v) * (t - 4)
        video[t, r : r + 8, col : col + 8] = images[i]
      expected[video.tobytes(), label, int(digits.target[i])] += 1
  test = splits['test']
  got = collections.Counter(zip(map(bytes, test['video']), test['label'].tolist(), test['digit'].tolist()))
  assert got == expected


@pytest.mark.slow
def test_label_is_not_recoverable_from_any_single_frame(splits):
  """Every frame of the test split appears under at least 2 labels; the middle frames under all 4."""
  test = splits['test']
  video, label = test['video'], test['label']
  by_bytes = {v.tobytes(): y for v, y in zip(video, label)}
  for v, y in zip(video, label):  # Played backwards, every video is its group's opposite-direction video.
    assert by_bytes[v[::-1].tobytes()] == OPPOSITE[y]
  middles = collections.defaultdict(list)
  for v, y in zip(video, label):
    middles[v[4].tobytes()].append(y)
  assert len(middles) == 360 and all(sorted(ls) == [0, 1, 2, 3] for ls in middles.values())  # One per group.
  labels_of_frame = collections.defaultdict(set)
  for v, y in zip(video, label):
    for frame in v:
      labels_of_frame[frame.tobytes()].add(y)
  assert min(map(len, labels_of_frame.values())) >= 2
  assert all(labels_of_frame[m] == {0, 1, 2, 3} for m in middles)


@pytest.mark.slow
def test_load_reads_video_shapes(moving_digits_dir):
  _, info = pipeline.load(make_config(moving_digits_dir, num_frames=4).data, info_lib.label_info)
  assert (info.input_key, info.input_shape, info.num_classes) == ('video', (4, 20, 20, 1), 4)
  assert (info.num_train, info.num_eval) == (5748, 1440)
  assert pipeline.load(make_config(moving_digits_dir, image_size=16).data, info_lib.label_info)[1].input_shape == (
    8,
    16,
    16,
    1,
  )
  assert pipeline.load(make_config(moving_digits_dir, resize_size=10).data, info_lib.label_info)[1].input_shape == (
    8,
    10,
    10,
    1,
  )


class VaryingVideos(tfds.core.GeneratorBasedBuilder):
  """Two videos of different frame sizes."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict(
        {'video': tfds.features.Video(shape=(None, None, None, 1)), 'label': tfds.features.ClassLabel(num_classes=2)}
      ),
    )

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(), 'test': self._generate_examples()}

  def _generate_examples(self):
    for i, shape in enumerate(((3, 6, 8), (5, 10, 7))):
      yield i, {'video': synthetic(shape, i), 'label': i}


def test_frames_of_varying_size_need_image_size(tmp_path):
  config = make_config(str(tmp_path), name='varying_videos')
  tfds.builder('varying_videos', data_dir=str(tmp_path)).download_and_prepare(
    download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
  with pytest.raises(ConfigError, match=r"'varying_videos' has frames of varying size .*: set data.image_size"):
    pipeline.load(config.data, info_lib.label_info)
  config.data.image_size = 4
  builder, info = pipeline.load(config.data, info_lib.label_info)
  assert info.input_shape == (8, 4, 4, 1)
  fn = label_data.preprocess_fn(config.data, info, train=True)
  for example in tfds.as_numpy(builder.as_dataset(split='train')):
    assert fn(example, seed(0))['inputs'].shape == (8, 4, 4, 1)


@pytest.mark.slow
def test_train_clip_is_a_strided_window_of_the_video(moving_digits_dir, splits):
  config = make_config(moving_digits_dir, num_frames=4, frame_stride=2)
  _, info = pipeline.load(config.data, info_lib.label_info)
  fn = label_data.preprocess_fn(config.data, info, train=True)
  raw = splits['test']['video'][0]
  starts = []
  for s in range(30):
    clip = fn({'video': raw, 'label': 0}, seed(s))['inputs'].numpy()
    assert clip.shape == (4, 20, 20, 1) and clip.dtype == np.uint8  # Scaled on the device.
    matches = [start for start in range(3) if np.array_equal(clip, raw[start : start + 7 : 2])]
    assert len(matches) == 1
    starts.append(matches[0])
  assert set(starts) == {0, 1, 2}  # Spans of 7 of 9 frames: every start is drawn.
  np.testing.assert_array_equal(fn({'video': raw, 'label': 0}, seed(3))['inputs'], clip)  # Deterministic.

  config.data.value_range = (-1.0, 1.0)
  clip = label_data.preprocess_fn(config.data, info, train=True)({'video': raw, 'label': 0}, seed(0))['inputs'].numpy()
  clip = np.asarray(device.scaled({'x': clip}, config.data.value_range)['x'])
  assert clip.min() == -1.0 and clip.max() <= 1.0 and clip.max() > 0.9


def test_short_video_loops():
  """5 frames, clips spanning 7: frames 0, 2, 4, then 6 mod 5 = 1."""
  config = make_config(num_frames=4, frame_stride=2, eval_crops=1)
  source = np.repeat(np.arange(5, dtype=np.uint8)[:, None, None, None] * 10, 4, axis=1).repeat(6, axis=2)
  info = video_info(4, 4, 6)
  for train in (True, False):
    out = label_data.preprocess_fn(config.data, info, train)({'video': source, 'label': 0}, seed(1))
    frames = out['inputs'] if train else out['views'][0]
    np.testing.assert_allclose(frames[:, 0, 0, 0], [0, 20, 40, 10], atol=1e-3)


def find_crop(frames, source, size):
  """The (top, left, flipped) of the one size x size crop of all frames of `source` that equals `frames`."""
  found = []
  for r in range(source.shape[1] - size + 1):
    for c in range(source.shape[2] - size + 1):
      crop = source[:, r : r + size, c : c + size]
      for flip, x in ((False, crop), (True, crop[:, :, ::-1])):
        if np.allclose(frames, x, atol=1e-3):
          found.append((r, c, flip))
  assert len(found) == 1
  return found[0]


def test_train_crop_and_flip_are_the_same_for_all_frames():
  config = make_config(num_frames=6, image_size=8, resize_size=12, flip=True)  # 12x16 frames: no resize.
  source = synthetic((6, 12, 16))
  fn = label_data.preprocess_fn(config.data, video_info(6, 8, 8), train=True)
  crops = {find_crop(fn({'video': source, 'label': 0}, seed(s))['inputs'].numpy(), source, 8) for s in range(20)}
  assert len({(r, c) for r, c, _ in crops}) > 5 and {f for *_, f in crops} == {False, True}


def test_inception_crop_is_the_same_for_all_frames():
  config = make_config(num_frames=4, image_size=8, inception_crop=True, flip=True)
  source = np.repeat(synthetic((1, 12, 16)), 4, axis=0)  # A still video gives a still clip.
  fn = label_data.preprocess_fn(config.data, video_info(4, 8, 8), train=True)
  clips = [fn({'video': source, 'label': 0}, seed(s))['inputs'].numpy() for s in range(3)]
  for clip in clips:
    assert clip.shape == (4, 8, 8, 1)
    np.testing.assert_array_equal(clip, np.repeat(clip[:1], 4, axis=0))
  assert not np.allclose(clips[0], clips[1])


def test_scale_jitter_and_colour_are_seeded_per_example_and_alike_for_all_frames():
  """scenic's training augmentation: one scale, crop and colour change per clip, a function of the example's seed."""
  still = np.repeat(np.random.default_rng(0).integers(0, 256, (1, 12, 16, 3)).astype(np.uint8), 4, axis=0)
  info = info_lib.LabelInfo(4, 'video', (4, 8, 8, 3), 0, 0)

  def clip(s, **data):
    config = make_config(num_frames=4, image_size=8, resize_size=12, **data)
    return label_data.preprocess_fn(config.data, info, train=True)({'video': still, 'label': 0}, seed(s))['inputs']

  augmented = {'scale_jitter': (0.9, 1.33), 'color_augment': 1.0}
  clips = [clip(s, **augmented).numpy() for s in range(4)]
  for c in clips:
    np.testing.assert_array_equal(c, np.repeat(c[:1], 4, axis=0))  # A still video stays still.
  np.testing.assert_array_equal(clips[0], clip(0, **augmented).numpy())  # Seeded: the same example, the same clip.
  assert len({c.tobytes() for c in clips}) == 4
  grey = clip(2, color_drop=1.0).numpy()
  assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 1], grey[..., 2])
  assert not np.array_equal(grey, clip(2).numpy())
  sizes = {tuple(image_data.jittered_size((12, 16), seed(s), 0.9, 1.33, (8, 8)).numpy()) for s in range(20)}
  assert len(sizes) > 5 and all(11 <= h <= 16 and 14 <= w <= 22 for h, w in sizes)
  assert tuple(image_data.jittered_size((8, 8), seed(0), 0.5, 0.6, (8, 8)).numpy()) == (8, 8)


@pytest.mark.parametrize('antialias', [True, False])
def test_resized_crop_is_a_resize_then_a_crop(antialias):
  """The training crop resamples only the window it keeps: the same pixels as resizing the whole frames (smaller and
  larger) and cutting the crop at the offsets stateless_random_crop draws."""
  frames = np.random.default_rng(0).integers(0, 256, (3, 30, 40, 3)).astype(np.uint8)
  for size, s in (((36, 50), 0), ((20, 27), 1), ((30, 40), 2), ((61, 79), 3)):
    whole = tf.image.resize(frames, size, antialias=antialias)
    expected = tf.image.stateless_random_crop(whole, (3, 16, 20, 3), seed(s))
    top, left = image_data.crop_offset(size, (16, 20), seed(s), 4).numpy()
    np.testing.assert_array_equal(expected, whole[:, top : top + 16, left : left + 20])
    crop = image_data.resized_crop(frames, size, (top, left), (16, 20), antialias)
    np.testing.assert_allclose(crop, expected, atol=2e-3)
    one = image_data.resized_crop(frames[0], size, (top, left), (16, 20), antialias)
    np.testing.assert_allclose(one, crop[0], atol=1e-4)


def test_clip_starts_crop_offsets_and_resized_size():
  np.testing.assert_array_equal(videos.clip_starts(20, 10, 3), [0, 5, 10])
  np.testing.assert_array_equal(videos.clip_starts(21, 10, 3), [0, 6, 11])
  np.testing.assert_array_equal(videos.clip_starts(21, 10, 1), [6])
  np.testing.assert_array_equal(videos.clip_starts(5, 7, 2), [0, 0])
  np.testing.assert_array_equal(videos.crop_offsets(12, 16, 8, 8, 3), [[2, 0], [2, 4], [2, 8]])
  np.testing.assert_array_equal(videos.crop_offsets(16, 12, 8, 8, 3), [[0, 2], [4, 2], [8, 2]])
  np.testing.assert_array_equal(videos.crop_offsets(12, 16, 8, 8, 1), [[2, 4]])
  assert [tuple(int(n) for n in image_data.resized_size(*hw, 6)) for hw in ((12, 16), (16, 12), (7, 10))] == [
    (6, 8),
    (8, 6),
    (6, 9),
  ]


@pytest.mark.parametrize('height, width', [(12, 16), (16, 12)])
def test_eval_views_are_clips_times_crops(height, width):
  """20 frames, clips of 4 frames 3 apart (span 10) starting at 0 and 10; crops along the longer side."""
  config = make_config(num_frames=4, frame_stride=3, image_size=8, resize_size=12, eval_clips=2, eval_crops=3)
  source, wide = synthetic((20, height, width)), height < width

  def views(**data):
    config.data.update(data)
    out = label_data.preprocess_fn(config.data, video_info(4, 8, 8), train=False)(
      {'video': source, 'label': 2}, seed(0)
    )
    assert set(out) == {'views', 'label'} and int(out['label']) == 2
    return out['views'].numpy()

  if wide:  # resize_size=12: the frames keep their size.
    expected = [source[s : s + 10 : 3, 2:10, c : c + 8] for s in (0, 10) for c in (0, 4, 8)]
  else:
    expected = [source[s : s + 10 : 3, r : r + 8, 2:10] for s in (0, 10) for r in (0, 4, 8)]
  np.testing.assert_allclose(views(), np.stack(expected), atol=1e-3)
  top, left = (height - 8) // 2, (width - 8) // 2  # One clip: the centre window (start 5); one crop: the centre.
  np.testing.assert_allclose(
    views(eval_clips=1, eval_crops=1), source[None, 5:15:3, top : top + 8, left : left + 8], atol=1e-3
  )
  # Without resize_size the shorter side is resized to image_size, keeping the aspect ratio: 8x11 or 11x8.
  resized = tf.image.resize(source[5:15:3].astype(np.float32), (8, 11) if wide else (11, 8), antialias=True)
  expected = np.round(resized[:, :8, 1:9] if wide else resized[:, 1:9, :8])  # Pixels leave as whole levels.
  np.testing.assert_array_equal(views(resize_size=None)[0], expected)


def linear_model(num_inputs, calls=None):
  """Logits = flattened pixels @ a fixed random matrix: they depend on every pixel of the view."""
  w = np.random.default_rng(1).normal(size=(num_inputs, 4)).astype(np.float32) / num_inputs

  def model(x, train):
    assert not train
    if calls is not None:
      calls.append(x.shape)
    return x.reshape(x.shape[0], -1) @ w

  return model, w


def expected_sums(views, labels, mask, w):
  logits = (views.reshape(*views.shape[:2], -1).astype(np.float64) @ w).mean(1)
  loss = np.log(np.exp(logits).sum(-1)) - logits[np.arange(len(labels)), labels]
  return {'loss': (loss * mask).sum(), 'accuracy': ((logits.argmax(-1) == labels) * mask).sum(), 'count': mask.sum()}


def test_eval_sums_average_the_logits_of_all_views():
  views = np.random.default_rng(0).normal(size=(5, 6, 4, 8, 8, 1)).astype(np.float32)
  labels, mask = np.array([0, 1, 2, 3, 0], np.int32), np.array([1, 1, 1, 1, 0], np.float32)
  calls = []
  model, w = linear_model(4 * 8 * 8, calls)
  sums = Classification().eval_sums(model, {'views': jnp.asarray(views), 'label': labels, 'mask': mask})
  assert calls == [(30, 4, 8, 8, 1)]  # One call on all 5 x 6 views.
  expected = expected_sums(views, labels, mask, w)
  for key in expected:
    np.testing.assert_allclose(sums[key], expected[key], rtol=1e-5)
  first_view_only = expected_sums(views[:, :1], labels, mask, w)['loss']
  assert not np.isclose(first_view_only, expected['loss'], rtol=1e-3)


def test_mixup_mixes_whole_clips():
  clips = np.random.default_rng(0).normal(size=(4, 3, 8, 8, 1)).astype(np.float32)
  seen = []

  def model(x, train, rngs):
    seen.append(x)
    return jnp.zeros((x.shape[0], 4))

  Classification(mixup=0.5).loss(
    model, {'inputs': jnp.asarray(clips), 'label': np.zeros(4, np.int32)}, jax.random.key(0), 0
  )
  mixed, rolled = np.asarray(seen[0]), np.roll(clips, 1, axis=0)
  lam = (mixed - rolled).ravel()[0] / (clips - rolled).ravel()[0]  # One mixing weight for the whole batch.
  assert 0.0 < lam < 1.0
  np.testing.assert_allclose(mixed, lam * clips + (1 - lam) * rolled, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_whole_split_eval_counts_every_video_once(moving_digits_dir, splits):
  """1,440 test videos in global batches of 200 (8 devices): each video once, in order, then padding."""
  config = make_config(moving_digits_dir, num_frames=9, eval_batch_size=200, eval_clips=1, eval_crops=3)
  builder, info = pipeline.load(config.data, info_lib.label_info)
  task = Classification()
  sharding = jax.sharding.NamedSharding(parallel.make_mesh(config.mesh), parallel.BATCH)
  model, w = linear_model(9 * 20 * 20)
  eval_step = jax.jit(lambda batch: task.eval_sums(model, batch))
  views, labels, masks, totals = [], [], [], collections.Counter()
  for batch in pipeline.eval_batches(
    builder, config.data, task.preprocess(config.data, info, False), sharding, task.prepare(info, False)
  ):
    assert batch['views'].shape == (200, 3, 9, 20, 20, 1)
    totals.update(jax.device_get(eval_step(batch)))
    views.append(jax.device_get(batch['views']))
    labels.append(jax.device_get(batch['label']))
    masks.append(jax.device_get(batch['mask']))
  views, labels, mask = map(np.concatenate, (views, labels, masks))
  assert len(mask) == 1600 and mask.sum() == 1440 and mask[:1440].all()
  test = splits['test']
  # Whole 9-frame videos, no resize: each of the 3 views is the raw video.
  np.testing.assert_array_equal(views[:1440].round().astype(np.uint8), np.repeat(test['video'][:, None], 3, 1))
  np.testing.assert_array_equal(labels[:1440], test['label'])
  expected = expected_sums(test['video'][:, None].astype(np.float32), test['label'], np.ones(1440), w)
  assert totals['count'] == 1440
  for key in ('loss', 'accuracy'):
    np.testing.assert_allclose(totals[key], expected[key], rtol=1e-4)


@pytest.mark.parametrize(
  'key, value, message',
  [
    ('num_frames', 0, 'data.num_frames=0 must be a positive integer'),
    ('frame_stride', -1, 'data.frame_stride=-1 must be a positive integer'),
    ('resize_size', 0, 'data.resize_size=0 must be positive or None'),
    ('eval_clips', 0, 'data.eval_clips=0 must be a positive integer'),
    ('eval_crops', 2, 'data.eval_crops=2 must be 1 (centre) or 3 (both ends and centre)'),
    (
      'scale_jitter',
      (1.2, 0.9),
      'data.scale_jitter=(1.2, 0.9) must be (low, high) with 0 < low <= high; (1, 1) turns it off',
    ),
    ('color_augment', 1.5, 'data.color_augment=1.5 is a probability: it must be in [0, 1]'),
  ],
)
def test_bad_video_keys_are_config_errors(key, value, message):
  config = make_config(**{key: value})
  with pytest.raises(ConfigError) as e:
    config_lib.validate(config)
  assert str(e.value) == message


def test_resize_size_below_image_size_is_a_config_error():
  with pytest.raises(ConfigError, match='data.resize_size=12 must be >= data.image_size=16'):
    config_lib.validate(make_config(image_size=16, resize_size=12))
  config_lib.validate(make_config(image_size=16, resize_size=16, eval_crops=1, eval_clips=4, frame_stride=2))


@pytest.mark.slow
def test_augmenting_videos_is_refused(moving_digits_dir, tmp_path, capsys):
  """Here, beside the other tests of moving_digits, so one pytest-xdist worker builds it."""
  argv = ['--config', os.path.join(ROOT, 'configs/vivit/moving_digits.py:factorised_encoder')]
  argv += ['--workdir', str(tmp_path / 'run'), f'--config.data.data_dir={moving_digits_dir}']
  assert main.main([*argv, '--config.data.randaugment_layers=2']) == 2
  assert 'these augment images, and data.name=' in capsys.readouterr().err
  assert main.main([*argv, '--config.data.recolor=0.5']) == 2  # The host's video path has no such op.
  assert 'data.recolor=0.5: these augment images, and data.name=' in capsys.readouterr().err
