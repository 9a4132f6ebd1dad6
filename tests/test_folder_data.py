"""`data.name='folder:PATH'`: a user's images, videos and text pairs, prepared once through TFDS and read by the
same pipeline as the built-in datasets."""

import dataclasses
import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from conftest import load_config, local_address, start_processes
from vit_jax_lab import config as config_lib, tasks, train
from vit_jax_lab.data import info as data_info, labels, pipeline, text
from vit_jax_lab.data.builders import folder
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tools import hub_benchmark

CLASSES = ('ant', 'bee', 'cat')


def write_image(path, shape, value: int) -> np.ndarray:
  """A uint8 RGB image of `shape` (height, width) whose pixels encode `value` and their position."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  h, w = shape
  pixels = ((np.arange(h * w * 3).reshape(h, w, 3) + value * 7) % 256).astype(np.uint8)
  Image.fromarray(pixels).save(path)
  return pixels


def image_tree(root, splits=('train', 'test'), per_class=4) -> dict[str, tuple[int, np.ndarray]]:
  """3 classes of PNG and JPEG images of two sizes; relative path -> (label, pixels written)."""
  files = {}
  for split in splits:
    for label, c in enumerate(CLASSES):
      for i in range(per_class):
        rel = os.path.join(*([split] if split else []), c, f'{i}.{"png" if i % 2 else "jpg"}')
        files[rel] = (label, write_image(os.path.join(root, rel), (12, 10) if i % 2 else (6, 9), 10 * label + i))
  return files


def folder_config(root, data_dir, **data):
  config = load_config('configs/vit/digits.py:smoke', str(data_dir))
  config.data.name = f'folder:{root}'
  config.data.image_size = 8
  config.data.update(data)
  return config


def examples(builder, split) -> dict[str, dict]:
  return {ex['file_name'].decode(): ex for ex in tfds.as_numpy(builder.as_dataset(split=split))}


def video_of(builder, ex: dict) -> np.ndarray:
  """A prepared video's pixels (T, H, W, 3), decoded from the frame files its record names."""
  read = [open(os.path.join(builder.frames_root(), p.decode()), 'rb').read() for p in ex['video']]
  return np.stack([tf.io.decode_image(f, channels=3).numpy() for f in read])


def test_split_folders_give_classes_splits_and_the_files_pixels(tmp_path):
  files = image_tree(tmp_path / 'photos')
  config = folder_config(tmp_path / 'photos', tmp_path / 'tfds')
  builder, info = pipeline.load(config.data, data_info.label_info)
  assert builder.info.features['label'].names == list(CLASSES)
  assert (info.num_classes, info.input_shape, info.num_train, info.num_eval) == (3, (8, 8, 3), 12, 12)
  for split in ('train', 'test'):
    got = examples(builder, split)
    assert sorted(got) == sorted(rel for rel in files if rel.startswith(f'{split}/'))  # Relative to the folder.
    for name, ex in got.items():
      label, pixels = files[name]
      assert ex['label'] == label
      assert ex['image'].shape == pixels.shape  # Two sizes, kept as they are.
      if name.endswith('.png'):  # Lossless: stored as written.
        np.testing.assert_array_equal(ex['image'], pixels)
      else:  # The file's own bytes, decoded: not encoded again.
        np.testing.assert_array_equal(ex['image'], tf.io.decode_jpeg((tmp_path / 'photos' / name).read_bytes()))
        assert np.abs(ex['image'].astype(int) - pixels).mean() < 20
  fn = labels.preprocess_fn(config.data, info, train=True)
  batch = fn(next(iter(examples(builder, 'train').values())), np.zeros(2, np.int64))
  assert batch['inputs'].shape == (8, 8, 3)


def test_flat_tree_holds_out_a_stable_fifth_by_path_hash(tmp_path):
  files = image_tree(tmp_path / 'a', splits=(None,), per_class=20)
  builder, _ = pipeline.load(folder_config(tmp_path / 'a', tmp_path / 'tfds').data, data_info.label_info)
  train_files, test_files = set(examples(builder, 'train')), set(examples(builder, 'test'))
  assert not train_files & test_files and train_files | test_files == set(files)  # Each file in exactly one split.
  assert test_files == {f for f in files if folder.held_out(f)}
  # The same files elsewhere, written in another order, rebuilt into another data_dir: the same test files.
  for rel in reversed(sorted(files)):
    os.makedirs(tmp_path / 'b' / os.path.dirname(rel), exist_ok=True)
    shutil.copy(tmp_path / 'a' / rel, tmp_path / 'b' / rel)
  again, _ = pipeline.load(folder_config(tmp_path / 'b', tmp_path / 'tfds2').data, data_info.label_info)
  assert set(examples(again, 'test')) == test_files
  assert again.data_dir != builder.data_dir  # Another folder, another dataset.
  # The fraction over many names.
  names = [f'class{i % 7}/IMG_{i:05d}.jpg' for i in range(20_000)]
  assert abs(np.mean([folder.held_out(n) for n in names]) - folder.TEST_PERCENT / 100) < 0.01


def test_undecodable_images_are_skipped_by_path_and_counted(tmp_path, capfd):
  image_tree(tmp_path / 'p', per_class=2)
  good = (tmp_path / 'p/train/ant/0.jpg').read_bytes()
  (tmp_path / 'p/train/ant/cut.jpg').write_bytes(good[: len(good) // 2])
  (tmp_path / 'p/train/bee/text.jpg').write_bytes(b'not an image at all')
  (tmp_path / 'p/train/bee/readme.txt').write_text('ignored')
  builder, info = pipeline.load(folder_config(tmp_path / 'p', tmp_path / 'tfds').data, data_info.label_info)
  out, err = capfd.readouterr()  # At the file descriptors, where libjpeg and TensorFlow's C++ log write.
  assert 'JPEG' not in err  # "Premature end of JPEG data": the cut file's complaint is in its skipped line.
  assert any('cut.jpg: a damaged image (' in line and 'JPEG' in line for line in out.splitlines())
  for bad in ('train/ant/cut.jpg', 'train/bee/text.jpg'):
    assert sum(str(tmp_path / 'p' / bad) in line for line in out.splitlines()) == 1
  assert 'skipped 2 of 14 images that do not decode' in out
  assert 'ignored 1 file(s)' in out and 'readme.txt' in out
  assert info.num_train == 6 and 'train/ant/0.jpg' in examples(builder, 'train')


def test_webp_bmp_gif_and_tiff_photos_are_stored_as_png_of_the_same_pixels(tmp_path):
  """TensorFlow decodes JPEG and PNG: the other formats PIL reads are re-encoded as PNG when the folder is
  prepared, lossless, so that training sees their pixels."""
  image_tree(tmp_path / 'p', per_class=2)
  pixels = np.random.default_rng(0).integers(0, 256, (6, 5, 3), np.uint8)
  for name in ('w.webp', 'b.bmp', 'g.gif', 't.tif'):
    image = Image.fromarray(pixels)
    (image.convert('P', palette=Image.Palette.ADAPTIVE) if name.endswith('gif') else image).save(
      tmp_path / 'p/train/ant' / name, lossless=True
    )
  builder, info = pipeline.load(folder_config(tmp_path / 'p', tmp_path / 'tfds').data, data_info.label_info)
  assert info.num_train == 10
  stored = examples(builder, 'train')
  for name in ('w.webp', 'b.bmp', 't.tif'):
    np.testing.assert_array_equal(stored[f'train/ant/{name}']['image'], pixels, err_msg=name)
  gif = np.asarray(Image.open(tmp_path / 'p/train/ant/g.gif').convert('RGB'))  # GIF's palette: PIL's pixels.
  np.testing.assert_array_equal(stored['train/ant/g.gif']['image'], gif)


def test_a_folder_is_prepared_again_only_when_its_files_change(tmp_path, capsys):
  image_tree(tmp_path / 'p', per_class=2)
  config = folder_config(tmp_path / 'p', tmp_path / 'tfds')
  pipeline.load(config.data, data_info.label_info)
  assert 'preparing' in capsys.readouterr().out
  _, info = pipeline.load(config.data, data_info.label_info)
  assert 'preparing' not in capsys.readouterr().out and info.num_train == 6
  write_image(str(tmp_path / 'p/train/cat/new.png'), (5, 5), 0)
  builder, info = pipeline.load(config.data, data_info.label_info)
  assert 'changed since it was prepared' in capsys.readouterr().out and info.num_train == 7
  assert builder.info.metadata['root'] == os.path.realpath(tmp_path / 'p')  # The dataset says whose it is.


@pytest.mark.parametrize('kind', ['pipe', 'folder'])
def test_a_lock_file_that_is_not_a_file_is_one_line(tmp_path, kind):
  """Where runs take turns preparing a dataset (`.lock_<version>` beside it): a pipe there hung the run, a folder
  gave a 35-line IsADirectoryError."""
  from vit_jax_lab.data import builders

  image_tree(tmp_path / 'p', per_class=2)
  config = folder_config(tmp_path / 'p', tmp_path / 'tfds')
  parent, version = os.path.split(os.path.normpath(builders.find(config.data).data_dir))
  os.makedirs(parent, exist_ok=True)
  lock = os.path.join(parent, f'.lock_{version}')
  if kind == 'pipe':
    os.mkfifo(lock)
    reader = os.open(lock, os.O_RDONLY | os.O_NONBLOCK)  # So that a run that opened it would not block this test.
  else:
    os.mkdir(lock)
  try:
    with pytest.raises(ConfigError, match=r'\.lock_.* is not a regular file: runs take turns preparing .* remove it'):
      pipeline.load(config.data, data_info.label_info)
  finally:
    if kind == 'pipe':
      os.close(reader)


def test_a_changed_tsv_with_a_mistake_keeps_the_prepared_copy(tmp_path):
  root = tmp_path / 'pairs'
  root.mkdir()
  (root / 'train.tsv').write_text('a b\tb a\n')
  (root / 'test.tsv').write_text('b a\ta b\n')
  config = folder_config(root, tmp_path / 'tfds')
  builder, _ = pipeline.load(config.data, lambda b, d: None)
  (root / 'test.tsv').write_text('b a\ta b\nno tab here\n')
  with pytest.raises(ConfigError, match=f'{root / "test.tsv"}:2 has 0 tabs'):
    pipeline.load(config.data, lambda b, d: None)
  assert builder.is_prepared()


def _mistake(tmp_path, case):
  """A folder with one mistake; returns the path the message must name."""
  root = tmp_path / 'p'
  if case == 'missing':
    return root
  if case == 'empty class':
    image_tree(root, splits=(None,))
    (root / 'dog').mkdir()
    return root / 'dog'
  if case == 'no class folders':
    write_image(str(root / 'a.png'), (4, 4), 0)
    return root
  if case == 'a link to a folder above':  # Walked until the OS refused: a 51-line OSError.
    image_tree(root, splits=(None,))
    os.symlink(root / 'ant', root / 'ant' / 'again')
    return root / 'ant' / 'again'
  if case == 'train without test':
    image_tree(root, splits=('train',))
    return root
  if case == 'test without train':
    image_tree(root, splits=('test',))
    return root
  if case == 'class only in test':
    image_tree(root)
    write_image(str(root / 'test/dog/1.png'), (4, 4), 0)
    return root / 'test/dog'
  if case == 'images and videos':
    image_tree(root, splits=(None,))
    (root / 'ant/clip.mp4').write_bytes(b'not read: its extension makes it a video')
    return root / 'ant/clip.mp4'
  if case == 'empty frame folder':
    (root / 'ant/clip').mkdir(parents=True)
    return root / 'ant'
  lines = {'no tab': 'a b\tc\nd e\n', 'two tabs': 'a\tb\tc\n', 'empty line': 'a\tb\n\nc\td\n'}[case]
  root.mkdir()
  (root / 'train.tsv').write_text('x\ty\n')
  (root / 'test.tsv').write_text(lines)
  return f'{root / "test.tsv"}:2' if case != 'two tabs' else f'{root / "test.tsv"}:1'


@pytest.mark.parametrize(
  'case',
  [
    'missing',
    'empty class',
    'no class folders',
    'train without test',
    'test without train',
    'class only in test',
    'images and videos',
    'empty frame folder',
    'no tab',
    'two tabs',
    'empty line',
    'a link to a folder above',
  ],
)
def test_folder_mistakes_are_one_line_config_errors_naming_the_path(tmp_path, case):
  path = _mistake(tmp_path, case)
  config = folder_config(tmp_path / 'p', tmp_path / 'tfds')
  with pytest.raises(ConfigError) as e:
    pipeline.load(config.data, data_info.label_info)
  message = str(e.value)
  assert str(path) in message and '\n' not in message and ':' in message
  assert not os.path.exists(tmp_path / 'tfds' / 'folder') or not any((tmp_path / 'tfds' / 'folder').iterdir())


def test_images_at_any_depth_count_for_their_top_class_folder_and_empty_folders_are_passed_over(tmp_path):
  root = tmp_path / 'photos'
  files = image_tree(root, splits=(None,), per_class=10)
  nested = write_image(str(root / 'ant/trip/day 2/z.png'), (5, 5), 99)
  (root / 'bee/empty_sub').mkdir()
  (root / 'cat/only_empty/deeper').mkdir(parents=True)
  layout = folder.scan(f'folder:{root}')
  assert layout.kind == 'images' and layout.classes == CLASSES
  items = {item.path: item.label for split in layout.splits.values() for item in split}
  assert items == {k: label for k, (label, _) in files.items()} | {'ant/trip/day 2/z.png': 0}
  builder, _ = pipeline.load(folder_config(root, tmp_path / 'tfds').data, data_info.label_info)
  read = examples(builder, 'train') | examples(builder, 'test')
  np.testing.assert_array_equal(read['ant/trip/day 2/z.png']['image'], nested)
  assert read['ant/trip/day 2/z.png']['label'] == 0


def sideways_photo(path) -> np.ndarray:
  """A JPEG stored 6 px wide and 4 high, dark on its left, with EXIF orientation 6 (a phone held sideways: shown
  turned 90 degrees clockwise, 4 wide and 6 high, dark at the top); returns the upright pixels."""
  pixels = np.full((4, 6, 3), 230, np.uint8)
  pixels[:, :3] = 20
  exif = Image.Exif()
  exif[folder.EXIF_ORIENTATION] = 6
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(pixels).save(path, 'JPEG', quality=100, exif=exif)
  return np.rot90(pixels, k=-1)


def test_an_exif_rotated_photo_is_read_upright(tmp_path):
  root = tmp_path / 'phone'
  image_tree(root, splits=(None,), per_class=10)
  expected = sideways_photo(str(root / 'ant' / 'sideways.jpg'))
  with open(root / 'ant' / 'sideways.jpg', 'rb') as f:
    raw = f.read()
  upright = tf.io.decode_image(folder.upright(raw), channels=3).numpy()
  assert tf.io.decode_image(raw, channels=3).shape == (4, 6, 3)  # What TensorFlow alone makes of it: sideways.
  assert upright.shape == (6, 4, 3) and np.abs(upright.astype(int) - expected).max() <= 16  # JPEG, twice.
  assert folder.upright(b'\x89PNG not a jpeg') == b'\x89PNG not a jpeg'
  builder, _ = pipeline.load(folder_config(root, tmp_path / 'tfds').data, data_info.label_info)
  read = examples(builder, 'train') | examples(builder, 'test')
  np.testing.assert_array_equal(read['ant/sideways.jpg']['image'], upright)


def test_a_small_folder_trains_with_the_configs_eval_batch_shrunk_to_its_split(tmp_path, capsys):
  root = tmp_path / 'few'
  image_tree(root, splits=('train', 'test'), per_class=3)  # 9 test images; the smoke config's eval batch is 64.
  config = folder_config(root, tmp_path / 'tfds')
  assert config.data.eval_batch_size == 64
  s = train.setup(config)
  assert s.config.data.eval_batch_size == 16  # 9 examples on 8 devices: 2 per device.
  assert 'data.eval_batch_size=64 -> 16: the eval split has 9 examples' in capsys.readouterr().out
  assert config.data.eval_batch_size == 64  # What config.json records: a resume adapts it the same way.
  metrics = train.evaluate(s, train.make_eval_step(s), train.init_state(s).eval_params())
  assert metrics['eval/examples'] == 9
  with pytest.raises(ConfigError, match=r'data.eval_batch_size=64 is larger than the eval split needs \(9 '):
    train.setup(config, given={'data.eval_batch_size'})  # Chosen on the command line: refused, not changed.


def test_a_train_batch_larger_than_the_dataset_spans_epochs_and_resumes_exactly(tmp_path):
  root = tmp_path / 'tiny'
  image_tree(root, splits=('train', 'test'), per_class=3)  # 9 training images, a batch of 32 (smoke config).
  s = train.setup(folder_config(root, tmp_path / 'tfds'))
  batches = train.train_batches(s)
  first = [jax.device_get(next(batches)) for _ in range(3)]
  assert all(b['label'].shape == (32,) for b in first)
  resumed = jax.device_get(next(train.train_batches(s, start_step=2)))
  for key in ('inputs', 'label'):
    np.testing.assert_array_equal(resumed[key], first[2][key])


def test_natural_order():
  names = ['f10.png', 'f2.png', 'f1.png', 'g.png', 'f02b.png']
  assert sorted(names, key=folder.natural_key) == ['f1.png', 'f2.png', 'f02b.png', 'f10.png', 'g.png']


def test_frame_folders_are_videos_in_natural_frame_order(tmp_path):
  root = tmp_path / 'clips'
  written = {}
  for split, count in (('train', 3), ('test', 2)):
    for label, c in enumerate(('left', 'right')):
      for v in range(count):
        frames = [
          write_image(str(root / split / c / f'v{v}' / f'f{t + 1}.png'), (6, 7), 20 * label + t) for t in range(12)
        ]
        written[f'{split}/{c}/v{v}'] = (label, np.stack(frames))
  config = folder_config(root, tmp_path / 'tfds', num_frames=4, eval_crops=1)
  builder, info = pipeline.load(config.data, data_info.label_info)
  assert (info.input_key, info.input_shape, info.num_train, info.num_eval) == ('video', (4, 8, 8, 3), 6, 4)
  for split in ('train', 'test'):
    for name, ex in examples(builder, split).items():
      label, frames = written[name]
      assert ex['label'] == label
      np.testing.assert_array_equal(video_of(builder, ex), frames)  # f1 ... f12, not f1, f10, f11, f12, f2, ...
  fn = labels.preprocess_fn(config.data, info, train=False)
  assert fn(next(iter(examples(builder, 'test').values())), np.zeros(2, np.int64))['views'].shape == (1, 4, 8, 8, 3)


def test_a_clip_reads_only_its_frame_files_and_equals_the_clip_of_the_videos_pixels(tmp_path):
  root = tmp_path / 'clips'
  for c, label in (('left', 0), ('right', 1)):
    for v in range(2):
      for t in range(12):
        write_image(str(root / c / f'v{v}' / f'{t}.png'), (10, 12), 20 * label + 7 * v + t)
  config = folder_config(root, tmp_path / 'tfds', num_frames=4, frame_stride=2, eval_clips=1, eval_crops=1)
  builder, info = pipeline.load(config.data, data_info.label_info)
  assert info.frames_root == builder.frames_root()
  ex = next(iter(examples(builder, 'train').values()))
  pixels = {'video': video_of(builder, ex), 'label': ex['label']}
  as_pixels = dataclasses.replace(info, frames_root=None)  # The same video held as pixels, as moving_digits is.
  for training in (True, False):
    files_fn, pixels_fn = (labels.preprocess_fn(config.data, i, training) for i in (info, as_pixels))
    for s in range(3):
      seed = np.array([s, 1], np.int64)
      for key, got in files_fn(ex, seed).items():
        np.testing.assert_array_equal(got, pixels_fn(pixels, seed)[key])
  # The evaluation clip of 12 frames is frames 3, 5, 7 and 9 (centred): the other 8 files are never opened.
  for t in set(range(12)) - {3, 5, 7, 9}:
    os.remove(os.path.join(builder.frames_root(), ex['video'][t].decode()))
  views = labels.preprocess_fn(config.data, info, train=False)(ex, np.zeros(2, np.int64))['views']
  np.testing.assert_array_equal(views, labels.preprocess_fn(config.data, as_pixels, False)(pixels, seed)['views'])
  # Training clips start anywhere: one that needs a deleted frame file stops the run in one line.
  config.data.batch_size = 8
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('data',))
  batches = pipeline.train_iterator(
    builder,
    config.data,
    labels.preprocess_fn(config.data, info, True),
    jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')),
    seed=0,
    start_step=0,
    prepare=labels.prepare_fn(info),
  )
  with pytest.raises(ConfigError, match=r'cannot be read \(.*/frames/.*No such file.*\): delete .* and run again'):
    for _ in range(4):
      next(batches)
  shutil.rmtree(builder.frames_root())
  with pytest.raises(ConfigError, match=r'reads its frames from .*/frames, which is gone: delete .* and run again'):
    pipeline.load(config.data, data_info.label_info)


def test_video_files_are_decoded_with_pyav(tmp_path):
  av = pytest.importorskip('av')
  root = tmp_path / 'v'
  for label, c in enumerate(('dark', 'light')):
    for i in range(6):
      os.makedirs(root / c, exist_ok=True)
      with av.open(str(root / c / f'{i}.mp4'), 'w') as out:
        stream = out.add_stream('mpeg4', rate=8)
        stream.width, stream.height, stream.pix_fmt = 16, 16, 'yuv420p'
        for t in range(5):
          frame = av.VideoFrame.from_ndarray(np.full((16, 16, 3), 40 + 120 * label + 10 * t, np.uint8), format='rgb24')
          for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode():
          out.mux(packet)
  (root / 'dark' / 'broken.mp4').write_bytes(b'\x00' * 100)
  builder, info = pipeline.load(folder_config(root, tmp_path / 'tfds', num_frames=2).data, data_info.label_info)
  assert info.input_key == 'video' and info.num_train + info.num_eval == 12  # The broken file is skipped.
  for split in ('train', 'test'):
    for name, ex in examples(builder, split).items():
      video = video_of(builder, ex)
      assert video.shape == (5, 16, 16, 3) and all(p.endswith(b'.jpg') for p in ex['video'])
      expected = 40 + 120 * (name.startswith('light')) + 10 * np.arange(5)
      assert np.all(np.abs(video.mean(axis=(1, 2, 3)) - expected) < 6)


def test_tsv_pairs_feed_the_seq2seq_task(tmp_path):
  root = tmp_path / 'pairs'
  root.mkdir()
  words = ['one', 'two', 'three', 'four']
  train_pairs = [(f'{a} {b}', f'{b} {a}') for a in words for b in words]
  (root / 'train.tsv').write_text(''.join(f'{s}\t{t}\n' for s, t in train_pairs))
  (root / 'val.tsv').write_text('two one\tone two\nfive\tfive')  # No newline at the end; an unknown word.
  config = load_config('configs/seq2seq/scan.py:simple,smoke', str(tmp_path / 'tfds'))
  config.data.name, config.data.train_split, config.data.eval_split = f'folder:{root}', 'train', 'val'
  task = tasks.build(config.task)
  builder, info = pipeline.load(config.data, lambda b, d: task.dataset_info(b, d, None))
  assert builder.info.supervised_keys == ('source', 'target')
  assert (info.num_train, info.num_eval) == (16, 2)
  assert info.input_vocab.words[4:] == sorted(words) and info.target_vocab.words[4:] == sorted(words)
  pairs = [(ex['source'].decode(), ex['target'].decode()) for ex in tfds.as_numpy(builder.as_dataset(split='train'))]
  assert sorted(pairs) == sorted(train_pairs)
  prepared = list(tfds.as_numpy(text.prepare_fn(info, train=False)(builder.as_dataset(split='val'))))
  decoded = sorted((info.input_vocab.decode(ex['inputs']), info.target_vocab.decode(ex['targets'])) for ex in prepared)
  assert decoded == [('<unk>', '<unk>'), ('two one', 'one two')]
  # The same data with a SentencePiece vocabulary trained on it.
  config.data.vocab, config.data.vocab_size = 'sentencepiece', 16
  _, info = pipeline.load(config.data, lambda b, d: task.dataset_info(b, d, str(tmp_path / 'work')))
  assert info.input_vocab.size == 16 and os.path.exists(tmp_path / 'work' / 'sentencepiece.model')


@pytest.mark.slow
def test_training_on_a_folder_evaluates_every_test_image_once(tmp_path):
  files = image_tree(tmp_path / 'photos', per_class=11)
  config = folder_config(tmp_path / 'photos', tmp_path / 'tfds', batch_size=16, eval_batch_size=16)
  config.data.crop_padding = 0
  train.train_and_evaluate(config, str(tmp_path / 'work'))
  evals = [json.loads(line) for line in open(tmp_path / 'work' / 'metrics.jsonl') if '"eval/examples"' in line]
  num_test = sum(rel.startswith('test/') for rel in files)
  assert evals and all(e['eval/examples'] == num_test == 33 for e in evals)
  assert all(np.isfinite(e['eval/loss']) for e in evals)


TWO_PROCESS_LOAD = """
import sys
import jax
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
from vit_jax_lab import config as config_lib
from vit_jax_lab.data import info as data_info, pipeline
config = config_lib.load('configs/vit/digits.py')
config.data.data_dir, config.data.image_size = sys.argv[3], 8
for name in (f'folder:{sys.argv[4]}', 'digits'):
  config.data.name = name
  builder, info = pipeline.load(config.data, data_info.label_info)
  print('loaded', name, info.num_train, info.num_eval, builder.info.splits['train'].num_examples, flush=True)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_prepare_once_and_read_the_same(tmp_path):
  """Process 0 prepares (a folder, and a built-in dataset) into the shared data_dir; process 1 reads that copy."""
  image_tree(tmp_path / 'photos', per_class=3)
  address, env = local_address(), os.environ | {'JAX_PLATFORMS': 'cpu', 'JAX_NUM_CPU_DEVICES': '1'}
  procs = start_processes(
    [
      [sys.executable, '-c', TWO_PROCESS_LOAD, address, str(i), str(tmp_path / 'tfds'), str(tmp_path / 'photos')]
      for i in range(2)
    ],
    env,
  )
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
  loaded = [sorted(line for line in out.splitlines() if line.startswith('loaded')) for out in outputs]
  assert loaded[0] == loaded[1] and len(loaded[0]) == 2
  assert 'loaded folder:' in loaded[0][1] and loaded[0][1].split()[2:] == ['9', '9', '9']
  assert [out.count('preparing') + out.count('generating') for out in outputs] == [2, 0]


def test_the_folder_recipe_sizes_its_run_from_the_folder(tmp_path):
  """configs/vit/folder.py:PATH: 100 epochs of the images it trains on (the 80% not held out), at least 4,000 steps;
  a train/ + val/ folder evaluates on val; anything but a folder is one line."""
  root = tmp_path / 'photos'
  for c in range(2):
    (root / f'class_{c}').mkdir(parents=True)
    for i in range(900):
      Image.fromarray(np.full((4, 4, 3), 40 * c, np.uint8)).save(root / f'class_{c}' / f'{i}.png')
  config = config_lib.load(f'configs/vit/folder.py:{root}')
  kept = sum(not folder.held_out(f'class_{c}/{i}.png') for c in range(2) for i in range(900))
  assert 1400 < kept < 1480 and config.total_steps == -(-100 * kept // 32) > 4000
  assert (config.data.name, config.data.eval_split, config.model.name) == (f'folder:{root}', 'test', 'cnn')
  for split in ('train', 'val'):
    (tmp_path / 'split' / split / 'a').mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / 'split' / split / 'a' / '0.png')
  small = config_lib.load(f'configs/vit/folder.py:{tmp_path / "split"}')
  assert (small.total_steps, small.data.eval_split) == (4000, 'val')
  with pytest.raises(ConfigError, match='configs/vit/folder.py takes the folder of your photos'):
    config_lib.load('configs/vit/folder.py:/no/such/folder')


def test_the_folder_recipe_starts_from_pretrained_weights_after_a_comma(tmp_path):
  """configs/vit/folder.py:PHOTOS,HUB_FOLDER fine-tunes the folder's model, in the folder's shape, at 224 pixels
  (vision_transformer's SGD recipe, 20 epochs, at least 50 steps): the initial state holds the folder's weights and
  a fresh head for the photos' classes. A missing folder after the comma is one line."""
  photos, hub_folder = tmp_path / 'photos', str(tmp_path / 'vit_ti16')
  for c in range(3):
    (photos / f'class_{c}').mkdir(parents=True)
    for i in range(10):
      Image.fromarray(np.full((40, 50, 3), 60 * c, np.uint8)).save(photos / f'class_{c}' / f'{i}.png')
  hub_benchmark.write(hub_folder, 'Ti/16')
  config = config_lib.load(f'configs/vit/folder.py:{photos},{hub_folder}')
  config.data.data_dir = str(tmp_path / 'tfds')
  assert (config.init_from, config.model.variant, config.data.image_size) == (hub_folder, None, 224)
  assert (config.optim.name, config.optim.lr, config.total_steps) == ('sgd', 0.01, 50)
  s = train.setup(config, workdir=str(tmp_path / 'run'))
  assert (s.config.model.width, s.config.model.depth, s.config.model.patch_size) == (192, 12, 16)
  params = train.init_state(s).params
  kernel = safetensors.numpy.load_file(os.path.join(hub_folder, 'model.safetensors'))['patch_embed.proj.weight']
  np.testing.assert_allclose(params['embedding']['kernel'][...], kernel.transpose(2, 3, 1, 0), rtol=1e-6)  # OIHW
  assert params['head']['kernel'][...].shape == (192, 3) and not np.any(params['head']['kernel'][...])
  with pytest.raises(ConfigError, match=r"folder.py: '/no/such/weights' \(after the comma\) is missing"):
    config_lib.load(f'configs/vit/folder.py:{photos},/no/such/weights')
