"""The predict command: on files written from eval-split examples it gives what the run's model gives on their
evaluation inputs (images, frame folders, text, captions), from a workdir, a run as init_from, or a release .npz;
a folder gives one JSON line per file; mistakes are one line."""

import json
import os

import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from flax import nnx
from PIL import Image

from conftest import load_config
from test_train import run_steps
from vit_jax_lab import checkpoints, parallel, train, workdir as workdir_lib
from vit_jax_lab.data import builders, device, pipeline
from vit_jax_lab.tools import export, predict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, 'configs/vit/digits.py:smoke')


def save_run(config, workdir: str, steps: int):
  """A run of `steps` train steps on one device, saved as the trainer saves one: config.json and a checkpoint."""
  _, _, state = run_steps(config, jax.devices()[:1], num_steps=steps)
  os.makedirs(workdir, exist_ok=True)
  workdir_lib.record_config(config, workdir)
  checkpointer = checkpoints.Checkpointer(workdir, every=steps, keep=1)
  checkpointer.save(steps, state, force=True)
  checkpointer.close()
  return state


def run_setup(workdir: str, **data):
  config = workdir_lib.load_run(workdir)
  config.data.update(data)
  return train.setup(config, jax.devices()[:1])


def write_image(path, pixels: np.ndarray) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(path)
  return str(path)


def probabilities(s, params, features: dict) -> np.ndarray:
  """The softmax of the run's evaluation logits of a batch of preprocessed examples."""
  model = nnx.merge(s.graphdef, jax.device_get(params))
  batch = device.eval_inputs({k: np.asarray(v) for k, v in features.items()}, s.config.data)
  return np.asarray(jax.nn.softmax(s.task.logits(model, batch)))


def evaluation_input(s, raw: np.ndarray) -> dict:
  preprocess = s.task.preprocess(s.config.data, s.info, train=False)
  out = preprocess({s.info.input_key: tf.constant(raw), 'label': tf.constant(0, tf.int64)}, tf.zeros([2], tf.int64))
  return {k: v.numpy()[None] for k, v in out.items() if k != 'label'}


def check_top_k(top_k, expected: np.ndarray, k: int, atol: float = 1e-5) -> None:
  """`top_k` ([label, p] pairs) holds k labels, probabilities sorted and summing to <= 1, each equal to the
  expected one (to `atol`), and its first label is a most probable one."""
  labels, probs = [label for label, _ in top_k], np.array([p for _, p in top_k])
  assert len(top_k) == k and len(set(labels)) == k
  assert np.all(np.diff(probs) <= 0) and probs.sum() <= 1 + 1e-6
  np.testing.assert_allclose(probs, expected[[int(label) for label in labels]], atol=atol)
  assert expected[int(labels[0])] >= expected.max() - atol


@pytest.fixture(scope='module')
def digits_run(data_dir, tmp_path_factory):
  """A ViT trained 6 steps on digits, keeping a parameter average (what evaluation and predict use)."""
  workdir = str(tmp_path_factory.mktemp('predict') / 'vit')
  state = save_run(load_config('configs/vit/digits.py:smoke', data_dir, ema_decay=0.9), workdir, 6)
  return workdir, state


@pytest.fixture(scope='module')
def digit_files(digits_run, tmp_path_factory):
  """PNG files of the first 6 test digits (two in a subfolder), and their evaluation inputs."""
  s = run_setup(digits_run[0])
  folder = tmp_path_factory.mktemp('digit_files')
  files, inputs = [], []
  for i, ex in enumerate(tfds.as_numpy(s.builder.as_dataset(split='test[:6]'))):
    files.append(write_image(folder / ('sub' if i % 3 == 0 else '') / f'{i}.png', ex['image']))
    inputs.append(evaluation_input(s, ex['image']))
  return str(folder), files, {k: np.concatenate([x[k] for x in inputs]) for k in inputs[0]}


@pytest.mark.slow
def test_image_folder_gives_the_models_top_k_on_the_evaluation_inputs(digits_run, digit_files, tmp_path, capsys):
  workdir, state = digits_run
  folder, files, features = digit_files
  s = run_setup(workdir)
  expected = probabilities(s, state.eval_params(), features)
  out = str(tmp_path / 'out' / 'digits.jsonl')
  assert predict.main(['--workdir', workdir, folder, '--top_k', '10', '--batch_size', '4', '--out', out]) == 0
  lines = [json.loads(line) for line in open(out)]
  assert sorted(line['input'] for line in lines) == sorted(files)  # One line per file, subfolders included.
  for line in lines:
    check_top_k(line['top_k'], expected[files.index(line['input'])], 10)
  # The parameter average, not the raw parameters: they differ by more than the tolerance.
  assert np.abs(probabilities(s, state.params, features) - expected).max() > 1e-4
  capsys.readouterr()
  assert predict.main(['--workdir', workdir, files[1], files[4], '--top_k', '3']) == 0  # Files: readable lines.
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == files[1] and printed[4] == files[4] and len(printed) == 8
  for i, rows in ((1, printed[1:4]), (4, printed[5:8])):
    check_top_k([[label, float(p)] for p, label in (row.split() for row in rows)], expected[i], 3, atol=5e-5)
    assert sum(float(row.split()[0]) for row in rows) < 1


@pytest.mark.slow
def test_unreadable_files_are_one_line_each_and_the_rest_is_predicted(digits_run, digit_files, tmp_path, capsys):
  folder = tmp_path / 'mixed'
  os.makedirs(folder)
  (folder / 'a_text.png').write_text('not an image')
  (folder / 'b_cut.png').write_bytes(open(digit_files[1][0], 'rb').read()[:40])
  good = write_image(folder / 'c.png', np.asarray(Image.open(digit_files[1][0]))[..., None])
  assert predict.main(['--workdir', digits_run[0], str(folder)]) == 2
  captured = capsys.readouterr()
  errors = [line for line in captured.err.splitlines() if line.startswith('error: ')]
  assert len(errors) == 2 and 'a_text.png: not an image file (JPEG, PNG, WebP' in errors[0] and 'b_cut.png' in errors[1]
  lines = [json.loads(line) for line in captured.out.splitlines()]
  assert [line['input'] for line in lines] == [str(folder / 'a_text.png'), str(folder / 'b_cut.png'), good]
  assert 'error' in lines[0] and 'error' in lines[1] and len(lines[2]['top_k']) == 5
  # WebP, BMP, GIF and TIFF are read as the same pixels (re-encoded as PNG, as training stores them); a format no
  # decoder here reads is left out of a folder, and said so.
  for other in ('d.webp', 'e.bmp', 'f.gif', 'g.tiff'):
    Image.open(good).save(folder / other, lossless=True)  # WebP's lossless mode; the others are.
  (folder / 'h.heic').write_bytes(b'')
  assert predict.main(['--workdir', digits_run[0], str(folder), '--top_k', '10']) == 2
  captured = capsys.readouterr()
  assert f'{folder}: 1 images of formats not read left out, e.g. {folder}/h.heic' in captured.err
  lines = {json.loads(line)['input']: json.loads(line).get('top_k') for line in captured.out.splitlines()}
  for other in ('d.webp', 'e.bmp', 'f.gif', 'g.tiff'):
    assert lines[str(folder / other)] == lines[good], other


@pytest.mark.slow
def test_config_with_init_from_loads_the_weights_as_training_does(digits_run, digit_files, data_dir, tmp_path):
  workdir, _ = digits_run
  _, files, features = digit_files
  npz = str(tmp_path / 'vit.npz')
  export.export(workdir, npz)
  for i, source in enumerate((workdir, npz)):
    overrides = [f'--config.init_from={source}', f'--config.data.data_dir={data_dir}']
    out = str(tmp_path / f'out{i}.jsonl')  # A new file each time: predict overwrites none.
    assert predict.main(['--config', SMOKE, *overrides, *files[:3], '--top_k', '10', '--out', out]) == 0
    s = train.setup(load_config('configs/vit/digits.py:smoke', data_dir, init_from=source), jax.devices()[:1])
    expected = probabilities(s, train.init_state(s).eval_params(), features)
    for i, line in enumerate(open(out)):
      check_top_k(json.loads(line)['top_k'], expected[i], 10)


@pytest.mark.slow
def test_mistakes_are_one_line(digits_run, digit_files, data_dir, tmp_path, capsys):
  workdir, png = digits_run[0], digit_files[1][0]
  (tmp_path / 'clip.mp4').write_bytes(b'')
  (tmp_path / 'notes.txt').write_text('jump\n')
  cases = [
    (['--workdir', str(tmp_path), png], 'has no config.json'),
    (['--workdir', workdir, str(tmp_path / 'missing.png')], 'no such file'),
    (['--workdir', workdir, str(tmp_path / 'notes.txt')], 'is not an image (JPEG, PNG, WebP, BMP, GIF or TIFF)'),
    (['--workdir', workdir, str(tmp_path / 'clip.mp4')], 'is a video, and this model reads images'),
    (['--workdir', workdir, '--lines', str(tmp_path / 'notes.txt')], 'reads images, not text'),
    (['--workdir', workdir, png, '--top_k', '0'], '--top_k=0'),
    (['--workdir', workdir, png, '--frobnicate'], "unrecognised option '--frobnicate'"),
    (['--workdir', workdir], 'no inputs'),
    (['--workdir', workdir, '--config', SMOKE, png], 'not both'),
    (['--config', SMOKE, f'--config.data.data_dir={data_dir}', png], '--config.init_from'),
    (['--config', SMOKE, '--config.init_from=nowhere.npz', png], "init_from='nowhere.npz' does not exist"),
  ]
  for argv, message in cases:
    assert predict.main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], (argv, err)


@pytest.mark.slow
def test_inputs_are_checked_before_the_weights_are_read(digits_run, tmp_path, capsys, monkeypatch):
  def never(*args):
    raise AssertionError('the weights were read')

  monkeypatch.setattr(predict.common, 'params_of', never)
  for given in (str(tmp_path / 'missing.png'), str(tmp_path)):
    assert predict.main(['--workdir', digits_run[0], given]) == 2
    assert capsys.readouterr().err.startswith('error: ')


@pytest.fixture(scope='module')
def scan_run(data_dir, tmp_path_factory):
  builders.register('scan/simple')
  tfds.builder('scan/simple', data_dir=data_dir).download_and_prepare(
    download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
  workdir = str(tmp_path_factory.mktemp('predict') / 'scan')
  state = save_run(load_config('configs/seq2seq/scan.py:simple,smoke', data_dir), workdir, 4)
  return workdir, state


def decoded_eval_split(s, params) -> list[str]:
  """What evaluation decodes for the examples of the eval split (one batch of all of them)."""
  preprocess, prepare = s.task.preprocess(s.config.data, s.info, train=False), s.task.prepare(s.info, False)
  sharding = jax.sharding.NamedSharding(s.mesh, parallel.BATCH)
  batch = next(pipeline.eval_batches(s.builder, s.config.data, preprocess, sharding, prepare))
  batch = device.eval_inputs(batch, s.config.data)
  model = nnx.merge(s.graphdef, jax.device_get(params))
  ids = s.task.generate(model, batch['inputs'], s.task.max_decode_length or s.info.max_target_length)
  return [s.info.target_vocab.decode(row) for row in np.asarray(ids)]


@pytest.mark.slow
def test_seq2seq_text_decodes_as_evaluation(scan_run, tmp_path, capsys):
  workdir, state = scan_run
  s = run_setup(workdir, eval_split='test[:8]', eval_batch_size=8)
  expected = decoded_eval_split(s, state.eval_params())
  commands = [ex['commands'].decode() for ex in tfds.as_numpy(s.builder.as_dataset(split='test[:8]'))]
  (tmp_path / 'commands.txt').write_text('\n'.join(commands) + '\n')
  assert predict.main(['--workdir', workdir, '--lines', str(tmp_path / 'commands.txt'), '--batch_size', '8']) == 0
  assert capsys.readouterr().out.splitlines() == expected  # Lines in, lines out.
  out = str(tmp_path / 'out.jsonl')
  assert predict.main(['--workdir', workdir, commands[2], commands[5], '--out', out]) == 0
  lines = [json.loads(line) for line in open(out)]
  assert lines == [{'input': commands[i], 'output': expected[i]} for i in (2, 5)]
  assert predict.main(['--workdir', workdir, str(tmp_path / 'commands.txt')]) == 2
  assert '--lines FILE' in capsys.readouterr().err


@pytest.mark.slow
def test_captions_of_image_files_are_the_models(data_dir, tmp_path, capsys):
  builders.register('digit_scenes')
  tfds.builder('digit_scenes', data_dir=data_dir).download_and_prepare(
    download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
  workdir = str(tmp_path / 'captions')
  state = save_run(load_config('configs/seq2seq/digit_captions.py:smoke', data_dir), workdir, 4)
  s = run_setup(workdir, eval_split='test[:4]', eval_batch_size=4)
  expected = decoded_eval_split(s, state.eval_params())
  scenes = list(tfds.as_numpy(s.builder.as_dataset(split='test[:4]')))
  files = [write_image(tmp_path / 'scenes' / f'{i}.png', ex['image']) for i, ex in enumerate(scenes)]
  capsys.readouterr()
  assert predict.main(['--workdir', workdir, *files]) == 0
  assert capsys.readouterr().out.splitlines() == [f'{f}\t{caption}' for f, caption in zip(files, expected)]


@pytest.mark.slow
def test_frame_folders_give_the_mean_of_the_views(moving_digits_dir, tmp_path):
  workdir = str(tmp_path / 'vivit')
  config = load_config('configs/vivit/moving_digits.py:factorised_encoder,smoke', moving_digits_dir)
  state = save_run(config, workdir, 3)
  s = run_setup(workdir)
  assert s.config.data.eval_clips == 2  # Two views, their logits averaged.
  videos = list(tfds.as_numpy(s.builder.as_dataset(split='test[:3]')))
  folders = []
  for i, ex in enumerate(videos):
    folders.append(str(tmp_path / 'videos' / f'clip{i}'))
    for t, frame in enumerate(ex['video']):
      write_image(os.path.join(folders[-1], f'frame{t}.png'), frame)
  features = [evaluation_input(s, ex['video']) for ex in videos]
  expected = probabilities(s, state.eval_params(), {'views': np.concatenate([f['views'] for f in features])})
  out = str(tmp_path / 'out.jsonl')
  assert predict.main(['--workdir', workdir, str(tmp_path / 'videos'), '--top_k', '4', '--out', out]) == 0
  lines = [json.loads(line) for line in open(out)]
  assert [line['input'] for line in lines] == folders
  names = s.builder.info.features['label'].names
  for line, probs in zip(lines, expected):
    check_top_k([[str(names.index(label)), p] for label, p in line['top_k']], probs, 4)
  assert predict.main(['--workdir', workdir, os.path.join(folders[0], 'frame0.png')]) == 2  # An image: one line.


@pytest.mark.slow
def test_damaged_jpegs_are_counted_and_libjpeg_prints_nothing(digits_run, digit_files, tmp_path, capfd):
  """A JPEG cut short and one with corrupt data: TensorFlow's libjpeg would print "Premature end of JPEG data" or
  "Improper call to JPEG library" on the terminal (and decode the cut one with grey rows); each is one error line
  and counted instead."""
  import io

  folder = tmp_path / 'jpegs'
  os.makedirs(folder)
  image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8))
  buffer = io.BytesIO()
  image.save(buffer, 'JPEG', quality=90)
  whole = buffer.getvalue()
  (folder / 'a_whole.jpg').write_bytes(whole)
  (folder / 'b_cut.jpg').write_bytes(whole[: len(whole) // 2])
  scan = whole.index(b'\xff\xda')  # Start of scan: the header stays whole, the entropy-coded data does not.
  (folder / 'c_corrupt.jpg').write_bytes(whole[: scan + 20] + b'\xff\xd9' + whole[scan + 20 :])
  capfd.readouterr()
  assert predict.main(['--workdir', digits_run[0], str(folder)]) == 2
  captured = capfd.readouterr()
  assert not any(line.startswith(('Premature', 'Corrupt', 'Improper')) for line in captured.err.splitlines())
  errors = [line for line in captured.err.splitlines() if line.startswith('error: ')]
  assert len(errors) == 2 and 'b_cut.jpg: a damaged image (Premature end of JPEG data' in errors[0]
  assert 'c_corrupt.jpg: a damaged image (Corrupt JPEG data' in errors[1]
  assert '1 of 3 inputs' in captured.err
  lines = [json.loads(line) for line in captured.out.splitlines()]
  assert len(lines[0]['top_k']) == 5 and 'error' in lines[1] and 'error' in lines[2]


def test_names_labels_and_text_from_files_reach_the_terminal_escaped():
  """A file name, a label name (a folder's class, a hub config's id2label) and decoded text holding a terminal's
  escape sequences (retitle, clear the screen) are printed with their control characters escaped; JSON lines hold
  them as JSON escapes."""
  import io

  from vit_jax_lab.tools import predict as predict_tool
  from vit_jax_lab.tools.predictors import Item

  hostile = '\x1b]0;owned\x07\x1b[2J'
  out = io.StringIO()
  predict_tool._write(out, Item(f'cat{hostile}.png', 'image'), [(f'tabby{hostile}', 0.9)], jsonl=False, classify=True)
  predict_tool._write(out, Item('a sentence', 'text'), f'eine{hostile}', jsonl=False, classify=False)
  predict_tool._write(out, Item(f'x{hostile}.png', 'image'), [(hostile, 0.5)], jsonl=True, classify=True)
  text = out.getvalue()
  assert '\x1b' not in text and '\x07' not in text
  assert 'cat\\x1b]0;owned\\x07\\x1b[2J.png' in text and 'tabby\\x1b' in text and 'eine\\x1b' in text
  assert json.loads(text.split('\n')[-2])['top_k'][0][0] == hostile
