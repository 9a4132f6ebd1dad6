"""Tracking benchmarks read from their published layouts (GOT-10k, LaSOT, OTB100, UAV123), small folders made
here: what each layout's sequences become, training and online evaluation on sequences of any length and frame
size, a GOT-10k-trained run scored on another benchmark, and one-line errors for broken folders."""

import glob
import os
import shutil
import zipfile

import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from conftest import build_builtin, load_config
from vit_jax_lab import train
from vit_jax_lab.data import tracking as data_tracking
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tools import evaluate, track

SMOKE = 'configs/tracking/got10k.py:got10k,smoke'


def write_sequence(
  folder: str,
  frames: int,
  size: tuple[int, int],
  seed: int,
  box_file: str | None,
  sep=',',
  first: int = 1,
  digits: int = 8,
) -> np.ndarray:
  """A bright square moving over noise: frames `<first>.png`... numbered with `digits` digits in `folder`, and its
  boxes (x, y, w, h) one per line in `box_file` (if given); returns the boxes."""
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  height, width = size
  side, out = 8, []
  x, y = rng.uniform(2, width - side - 2), rng.uniform(2, height - side - 2)
  for t in range(frames):
    x = float(np.clip(x + rng.uniform(-2, 2), 0, width - side))
    y = float(np.clip(y + rng.uniform(-2, 2), 0, height - side))
    image = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
    image[int(round(y)) : int(round(y)) + side, int(round(x)) : int(round(x)) + side] = 230
    tf.io.write_file(os.path.join(folder, f'{first + t:0{digits}d}.png'), tf.io.encode_png(image))
    out.append((round(x), round(y), side, side))
  if box_file:
    with open(box_file, 'w') as f:
      f.writelines(sep.join(str(v) for v in box) + '\n' for box in out)
  return np.asarray(out, np.float32)


def got10k(root: str) -> dict[str, np.ndarray]:
  """GOT-10k/{train,val,test}: 8 train sequences of 12-26 frames (a smoke batch), 2 val and 2 test ones, of three
  frame sizes; the test ones give their first box alone, as GOT-10k's test split does."""
  boxes = {}
  for split, count in (('train', 8), ('val', 2), ('test', 2)):
    names = [f'GOT-10k_{split.title()}_{i:06d}' for i in range(1, count + 1)]
    for i, name in enumerate(names):
      d = os.path.join(root, 'GOT-10k', split, name)
      size = [(36, 44), (40, 40), (48, 36)][i % 3]
      box_file = os.path.join(d, 'groundtruth.txt')
      boxes[name] = write_sequence(d, 12 + 2 * i, size, i + 100 * ['train', 'val', 'test'].index(split), box_file)
      if split == 'test':
        with open(box_file) as f:
          first = f.readline()
        with open(box_file, 'w') as f:
          f.write(first)
        continue
      with open(os.path.join(d, 'absence.label'), 'w') as f:
        f.write('\n'.join('1' if t == 5 and split == 'train' else '0' for t in range(len(boxes[name]))) + '\n')
    with open(os.path.join(root, 'GOT-10k', split, 'list.txt'), 'w') as f:
      f.write('\n'.join(names) + '\n')
  return boxes


@pytest.fixture(scope='module')
def got10k_dir(tmp_path_factory) -> str:
  data_dir = str(tmp_path_factory.mktemp('tensorflow_datasets'))
  got10k(os.path.join(data_dir, 'downloads', 'manual'))
  return build_builtin('tracking_benchmarks/got10k', data_dir)


def read_split(data_dir: str, name: str, split: str) -> list[dict]:
  """The split's sequences, 'paths' as stored (relative to the benchmark's folder) and 'frames' the files read."""
  builder = tfds.builder(f'tracking_benchmarks/{name}', data_dir=data_dir)
  out = []
  for ex in builder.as_dataset(split=split, shuffle_files=False).as_numpy_iterator():
    ex['paths'] = ex['frames']
    ex['frames'] = [open(os.path.join(builder.frames_root(), p.decode()), 'rb').read() for p in ex['paths']]
    out.append(ex)
  return out


def test_got10k_sequences_keep_their_frames_boxes_and_absence(got10k_dir):
  manual = os.path.join(got10k_dir, 'downloads', 'manual', 'GOT-10k')
  train_split = read_split(got10k_dir, 'got10k', 'train')
  assert sorted(ex['name'].decode() for ex in train_split) == [f'GOT-10k_Train_{i:06d}' for i in range(1, 9)]
  for ex in train_split:
    name = ex['name'].decode()
    truth = np.loadtxt(os.path.join(manual, 'train', name, 'groundtruth.txt'), delimiter=',', dtype=np.float32)
    np.testing.assert_array_equal(ex['boxes'], truth)
    assert len(ex['frames']) == len(truth) and np.flatnonzero(ex['absent']).tolist() == [5]
    with open(os.path.join(manual, 'train', name, '00000003.png'), 'rb') as f:
      assert ex['frames'][2] == f.read()  # The files, in frame order: their paths in the benchmark's folder.
    assert ex['paths'][2].decode() == os.path.join('train', name, '00000003.png')
  assert len(read_split(got10k_dir, 'got10k', 'val')) == 2
  for ex in read_split(got10k_dir, 'got10k', 'test'):  # The first box alone: the others are the server's.
    name = ex['name'].decode()
    with open(os.path.join(manual, 'test', name, 'groundtruth.txt')) as f:
      np.testing.assert_array_equal(ex['boxes'][0], [float(v) for v in f.read().split(',')])
    assert np.isnan(ex['boxes'][1:]).all() and ex['absent'].tolist() == [False] + [True] * (len(ex['frames']) - 1)


@pytest.mark.parametrize('key', ['train_split', 'eval_split'])
def test_the_withheld_got10k_test_split_is_neither_trained_on_nor_scored(got10k_dir, key):
  with pytest.raises(ConfigError, match=f"data.{key}='test'.*first box alone") as e:
    train.setup(load_config(SMOKE, data_dir=got10k_dir, **{f'data__{key}': 'test'}))
  assert '\n' not in str(e.value) and 'python -m vit_jax_lab.tools.results' in str(e.value)


@pytest.mark.slow  # Tracks four sequences a frame at a time, twice, compiling the crops per frame size.
def test_results_are_written_as_the_got10k_server_and_the_toolkits_read_them(got10k_dir, tmp_path):
  """The test split's files for the server (a folder per sequence, zipped), and the val split's boxes in the OTB
  layout equal to the online tracking that scores it."""
  from vit_jax_lab.tasks import tracking
  from vit_jax_lab.tools import common, results

  spec = ['--config', SMOKE, f'--config.data.data_dir={got10k_dir}']
  out = str(tmp_path / 'got10k_test')
  written, count = results.run([*spec, '--split', 'test', '--out', out])
  assert written == [out, out + '.zip'] and count == 2
  with zipfile.ZipFile(out + '.zip') as z:
    names = sorted(n for n in z.namelist() if n.endswith('.txt'))
  assert names == sorted(
    f'GOT-10k_Test_00000{i}/GOT-10k_Test_00000{i}_{k}.txt' for i in (1, 2) for k in ('001', 'time')
  )
  for ex in read_split(got10k_dir, 'got10k', 'test'):
    name = ex['name'].decode()
    boxes = np.loadtxt(os.path.join(out, name, f'{name}_001.txt'), delimiter=',')
    seconds = np.loadtxt(os.path.join(out, name, f'{name}_time.txt'), delimiter=',')
    assert boxes.shape == (len(ex['frames']), 4) and seconds.shape == (len(ex['frames']),)
    np.testing.assert_array_equal(boxes[0], ex['boxes'][0])
    assert np.isfinite(boxes).all() and (boxes[:, 2:] > 0).all() and (seconds > 0).all()

  written, count = results.run([*spec, '--layout', 'otb', '--out', str(tmp_path / 'val')])
  s = train.setup(common.one_device_one_example(load_config(SMOKE, data_dir=got10k_dir)), jax.devices()[:1])
  model = common.load_model(s, None)
  for ex in read_split(got10k_dir, 'got10k', 'val'):
    name = ex['name'].decode()
    expected, _ = tracking.track_frames(
      model, data_tracking.decoded_frames(ex['frames'], s.info), ex['boxes'][0], s.info
    )
    got = np.loadtxt(tmp_path / 'val' / f'{name}.txt', delimiter=',')
    np.testing.assert_allclose(got, expected, atol=1e-3)
    assert (tmp_path / 'val' / 'times' / f'{name}_time.txt').exists()
  # Nothing written is overwritten: neither the folder nor, once it is gone, its zip.
  with pytest.raises(ConfigError, match='got10k_test exists: name a new file or folder') as e:
    results.run([*spec, '--out', out])
  assert '\n' not in str(e.value)
  shutil.rmtree(out)
  with pytest.raises(ConfigError, match='got10k_test.zip exists: name a new file or folder'):
    results.run([*spec, '--split', 'test', '--out', out])
  assert results.run([*spec, '--layout', 'otb', '--out', out]) == ([out], 2)  # The otb layout writes no zip.


def test_lasot_otb_and_uav_layouts_become_their_sequences(tmp_path):
  manual = tmp_path / 'downloads' / 'manual'
  # LaSOT: class/class-n/img + groundtruth.txt, occlusion flags on one line; testing_set.txt picks test.
  for name, seed in (('cat-1', 0), ('cat-2', 1)):
    d = manual / 'LaSOT' / 'cat' / name
    write_sequence(str(d / 'img'), 6, (32, 40), seed, str(d / 'groundtruth.txt'))
    (d / 'full_occlusion.txt').write_text('0,0,1,0,0,0')
    (d / 'out_of_view.txt').write_text('0,0,0,0,0,1')
  (manual / 'LaSOT' / 'testing_set.txt').write_text('cat-2\n')
  # OTB100: David's frames 300-770 of more (here 3-7 of 9: TRIMMED is overridden below), two-target Jogging with
  # tab-separated boxes, Human4's empty first box file.
  write_sequence(str(manual / 'OTB100' / 'Jogging' / 'img'), 5, (30, 30), 2, None, digits=4)
  for k in (1, 2):
    write_sequence(
      str(tmp_path / 'unused'),
      5,
      (30, 30),
      2 + k,
      str(manual / 'OTB100' / 'Jogging' / f'groundtruth_rect.{k}.txt'),
      sep='\t',
    )
  write_sequence(
    str(manual / 'OTB100' / 'Human4' / 'img'),
    4,
    (30, 30),
    5,
    str(manual / 'OTB100' / 'Human4' / 'groundtruth_rect.2.txt'),
    digits=4,
  )
  (manual / 'OTB100' / 'Human4' / 'groundtruth_rect.1.txt').write_text('')
  # UAV123: video bird1 of 12 frames in parts 1-3 (part 2 after a gap), car1_s whole, NaN where absent.
  data, anno = manual / 'UAV123' / 'data_seq' / 'UAV123', manual / 'UAV123' / 'anno' / 'UAV123'
  anno.mkdir(parents=True)
  bird = write_sequence(str(data / 'bird1'), 12, (30, 36), 6, None, digits=6)
  np.savetxt(anno / 'bird1_1.txt', bird[0:3], fmt='%d', delimiter=',')
  np.savetxt(anno / 'bird1_2.txt', bird[5:8], fmt='%d', delimiter=',')
  np.savetxt(anno / 'bird1_3.txt', bird[7:12], fmt='%d', delimiter=',')
  car = write_sequence(str(data / 'car1_s'), 4, (30, 36), 7, None, digits=6)
  (anno / 'car1_s.txt').write_text(
    '\n'.join(','.join(map(str, map(int, b))) for b in car[:2])
    + '\nNaN,NaN,NaN,NaN\n'
    + ','.join(map(str, map(int, car[3])))
    + '\n'
  )

  from vit_jax_lab.data.builders import tracking_benchmarks as tb

  with pytest.MonkeyPatch.context() as m:
    m.setattr(tb, 'GAPS', {'bird1_2': 6})
    data_dir = str(tmp_path)
    for name in ('lasot', 'otb100', 'uav123'):
      build_builtin(f'tracking_benchmarks/{name}', data_dir)
  lasot = {s: read_split(data_dir, 'lasot', s) for s in ('train', 'test')}
  assert [ex['name'] for ex in lasot['train']] == [b'cat-1'] and [ex['name'] for ex in lasot['test']] == [b'cat-2']
  assert np.flatnonzero(lasot['test'][0]['absent']).tolist() == [2, 5]
  otb = {ex['name'].decode(): ex for ex in read_split(data_dir, 'otb100', 'test')}
  assert sorted(otb) == ['Human4.2', 'Jogging.1', 'Jogging.2']
  assert otb['Jogging.1']['frames'][0] == otb['Jogging.2']['frames'][0]  # Two targets, the same frames.
  uav = {ex['name'].decode(): ex for ex in read_split(data_dir, 'uav123', 'test')}
  for name, frames in (('bird1_1', range(0, 3)), ('bird1_2', range(5, 8)), ('bird1_3', range(7, 12))):
    np.testing.assert_array_equal(uav[name]['boxes'], bird[list(frames)])
    with open(data / 'bird1' / f'{frames[0] + 1:06d}.png', 'rb') as f:
      assert uav[name]['frames'][0] == f.read(), name
  assert uav['car1_s']['absent'].tolist() == [False, False, True, False]


@pytest.mark.parametrize(
  'breakage, message',
  [
    (lambda d: open(os.path.join(d, 'groundtruth.txt'), 'a').write('3,4,five,6\n'), 'line 13'),
    (lambda d: [os.remove(os.path.join(d, n)) for n in os.listdir(d) if n.endswith('.png')], 'has no frames'),
    (lambda d: open(os.path.join(d, 'groundtruth.txt'), 'a').write('3,4,5,6\n'), '13 boxes for 12 frames'),
  ],
  ids=['bad-line', 'no-frames', 'extra-box'],
)
def test_broken_benchmark_folders_stop_in_one_line(tmp_path, breakage, message):
  manual = str(tmp_path / 'downloads' / 'manual')
  got10k(manual)
  breakage(os.path.join(manual, 'GOT-10k', 'train', 'GOT-10k_Train_000001'))
  config = load_config(SMOKE, data_dir=str(tmp_path))
  with pytest.raises(ConfigError, match=message) as e:
    train.setup(config)
  assert '\n' not in str(e.value) and 'GOT-10k_Train_000001' in str(e.value)
  # Nothing half-prepared is left to be read: once fixed, the folder is prepared from scratch.
  assert not tfds.builder('tracking_benchmarks/got10k', data_dir=str(tmp_path)).is_prepared()


def test_a_missing_benchmark_folder_stops_in_one_line(tmp_path):
  with pytest.raises(ConfigError, match='downloads/manual/GOT-10k, which is missing or empty') as e:
    train.setup(load_config(SMOKE, data_dir=str(tmp_path)))
  assert '\n' not in str(e.value)


def test_training_pairs_from_benchmark_frames_of_any_size(got10k_dir):
  config = load_config(SMOKE, data_dir=got10k_dir)
  s = train.setup(config)
  assert s.info.frames is None and s.info.frame_size is None and s.info.channels == 3
  batches = train.train_batches(s, 0)
  for _ in range(3):
    batch = next(batches)
    assert batch['template'].shape == (8, 16, 16, 3) and batch['search'].shape == (8, 32, 32, 3)
    assert np.isfinite(np.asarray(batch['box'])).all()
  config.data.distractor_fraction = 0.5  # Benchmarks do not annotate the other objects.
  with pytest.raises(ConfigError, match="distractor_fraction=0.5 needs the distractors' boxes") as e:
    train.setup(config)
  assert '\n' not in str(e.value) and 'set data.distractor_fraction=0' in str(e.value)


def test_training_reads_the_benchmarks_files_and_says_when_they_are_gone(got10k_dir, tmp_path):
  """The prepared records hold the frames' paths (a pair reads its two files, not its sequence); frames moved away
  after preparing are one line naming the file, and a benchmark folder gone is one line before anything runs."""
  data_dir = str(tmp_path / 'tfds')
  shutil.copytree(got10k_dir, data_dir)
  records = glob.glob(os.path.join(data_dir, 'tracking_benchmarks', 'got10k', '*', '*train.tfrecord*'))
  frames = glob.glob(os.path.join(data_dir, 'downloads', 'manual', 'GOT-10k', 'train', '*', '*.png'))
  assert sum(os.path.getsize(f) for f in records) < sum(os.path.getsize(f) for f in frames) / 4
  manual = os.path.join(data_dir, 'downloads', 'manual', 'GOT-10k')
  os.rename(os.path.join(manual, 'train'), os.path.join(manual, 'moved'))
  s = train.setup(load_config(SMOKE, data_dir=data_dir))
  with pytest.raises(ConfigError, match=r'reads a file that cannot be read \(.*train/GOT-10k_Train_.*png') as e:
    next(train.train_batches(s, 0))
  assert '\n' not in str(e.value) and 'put it back where the data was prepared from' in str(e.value)
  shutil.rmtree(manual)
  with pytest.raises(ConfigError, match='reads its frames from .*GOT-10k, the folder it was prepared from, which is'):
    train.setup(load_config(SMOKE, data_dir=data_dir))


@pytest.mark.slow
def test_track_draws_a_benchmark_sequence(got10k_dir, tmp_path, capsys):
  """tools.track on a benchmark's sequence: its encoded frames decoded, its box file's boxes scored."""
  out = str(tmp_path / 'track.png')
  args = ['--config', SMOKE, f'--config.data.data_dir={got10k_dir}', '--sequence', '1', '--out', out]
  assert track.main(args) == 0
  scores, wrote = capsys.readouterr().out.splitlines()
  assert scores.startswith('auc ') and wrote.startswith('wrote ')
  frames = len(read_split(got10k_dir, 'got10k', 'val')[1]['boxes'])
  assert np.loadtxt(str(tmp_path / 'track.txt'), delimiter=',').shape == (frames, 4)
  assert Image.open(out).size[1] > 0


@pytest.mark.slow  # Compiles the whole-sequence `track` per sequence length and size.
def test_online_evaluation_of_benchmark_sequences_equals_tracking_them_whole(got10k_dir):
  """The host's frame-by-frame tracking (real videos) gives the boxes of the compiled whole-sequence `track`."""
  from vit_jax_lab.tasks import tracking
  from vit_jax_lab.tools import common

  config = load_config(SMOKE, data_dir=got10k_dir)
  s = train.setup(config)
  model = common.load_model(s, None)
  examples = list(read_split(got10k_dir, 'got10k', 'val'))
  for ex in examples:
    frames = np.stack(list(data_tracking.decoded_frames(ex['frames'], s.info)))
    got, _ = tracking.track_frames(lambda t, x: model(t, x), iter(frames), ex['boxes'][0], s.info)
    expected, _ = tracking.track(model, frames[None], ex['boxes'][:1], s.info)
    np.testing.assert_allclose(got, np.asarray(expected[0]), rtol=1e-4, atol=1e-3)
  metrics = train.evaluate(s, train.make_eval_step(s), train.init_state(s).params)
  assert metrics['eval/sequences'] == 2 and 0 <= metrics['eval/auc'] <= 1 and metrics['eval/fps'] > 0


@pytest.mark.slow  # A whole (smoke) training.
def test_a_got10k_run_is_scored_on_another_benchmark(got10k_dir, tmp_path, capsys):
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(load_config(SMOKE, data_dir=got10k_dir), workdir)
  # OTB100 in the same data_dir: the val sequences again, as OTB sequences.
  manual = os.path.join(got10k_dir, 'downloads', 'manual')
  for i in (1, 2):
    d = os.path.join(manual, 'GOT-10k', 'val', f'GOT-10k_Val_{i:06d}')
    os.makedirs(os.path.join(manual, 'OTB100', f'Seq{i}'), exist_ok=True)
    os.symlink(d, os.path.join(manual, 'OTB100', f'Seq{i}', 'img'))
    os.symlink(os.path.join(d, 'groundtruth.txt'), os.path.join(manual, 'OTB100', f'Seq{i}', 'groundtruth_rect.txt'))
  args = [
    '--config',
    'configs/tracking/got10k.py:otb100,smoke',
    f'--config.init_from={workdir}',
    f'--config.data.data_dir={got10k_dir}',
  ]
  on_otb, _ = evaluate.run(args)
  on_val, _ = evaluate.run(['--workdir', workdir])
  assert on_otb['eval/sequences'] == 2
  assert set(on_otb) == set(on_val)
  for key in ('eval/auc', 'eval/precision', 'eval/ao'):
    assert on_otb[key] == pytest.approx(on_val[key], abs=1e-6), key  # The same sequences, the same weights.
