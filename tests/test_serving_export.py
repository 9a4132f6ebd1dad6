"""The SavedModel export: loaded back with tf.saved_model.load, it gives the probabilities our model gives on the
run's evaluation inputs, for images of another size and any batch; user mistakes are one line."""

import os

import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from flax import nnx

from conftest import load_config
from vit_jax_lab import checkpoints, config as config_lib, train, workdir as workdir_lib
from vit_jax_lab.data import device
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tools import export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_model(workdir):
  """(setup, our model with the run's evaluation parameters, the run's evaluation preprocessing of one example)."""
  config = workdir_lib.load_run(workdir)
  s = train.setup(config, jax.devices()[:1])
  params = s.abstract_state.params
  params.replace_by_pure_dict(checkpoints.read_params(workdir))
  preprocess = s.task.preprocess(config.data, s.info, train=False)
  seed = tf.zeros([2], tf.int64)
  return s, nnx.merge(s.graphdef, params), lambda raw: preprocess({s.info.input_key: raw, 'label': 0}, seed)


def scaled(s, pixels):
  """uint8 pixels in the run's value range, as the jitted step gets them."""
  return np.asarray(device.scaled({'x': np.asarray(pixels)}, tuple(s.config.data.value_range))['x'])


def eval_examples(s, count=None):
  """(uint8 inputs, labels) of the first `count` examples of the run's eval split."""
  split = s.config.data.eval_split + ('' if count is None else f'[:{count}]')
  examples = list(tfds.as_numpy(s.builder.as_dataset(split=split)))
  return np.stack([ex[s.info.input_key] for ex in examples]), np.array([ex['label'] for ex in examples])


def softmax(logits):
  return np.asarray(jax.nn.softmax(np.asarray(logits, np.float32), axis=-1))


def serve(path):
  return tf.saved_model.load(path).signatures['serving_default']


@pytest.mark.slow
def test_vit_saved_model_gives_our_probabilities(data_dir, tmp_path):
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'serving')
  config = load_config('configs/vit/digits.py:smoke', data_dir, total_steps=30, eval_every=30, checkpoint_every=30)
  metrics = train.train_and_evaluate(config, workdir)
  assert export.main(['--format', 'saved_model', '--workdir', workdir, '--out', out]) == 0
  signature = serve(out)
  s, model, preprocess = run_model(workdir)

  images, labels = eval_examples(s)
  inputs = np.stack([preprocess(image)['inputs'] for image in images[:3]])
  expected = softmax(model(scaled(s, inputs), train=False))
  assert expected.std() > 1e-3  # A trained model: the probabilities differ between classes and examples.
  for batch in (1, 3):
    served = signature(images=tf.constant(images[:batch]))
    assert served['probabilities'].shape == (batch, 10) and served['class_index'].shape == (batch,)
    np.testing.assert_allclose(served['probabilities'], expected[:batch], atol=1e-5)
    np.testing.assert_array_equal(served['class_index'], expected[:batch].argmax(-1))

  # Over the whole eval split, the served classes score the run's reported accuracy.
  served = signature(images=tf.constant(images))
  assert np.mean(served['class_index'].numpy() == labels) == metrics['eval/accuracy']

  # Another size: squashed to the run's 8x8 (it kept the dataset's size), then the run's value range.
  large = np.repeat(np.repeat(images[:3], 3, axis=1), 2, axis=2)  # 24 x 16.
  squashed = tf.round(tf.image.resize(tf.cast(large, tf.float32), (8, 8), antialias=True)).numpy().astype(np.uint8)
  served = signature(images=tf.constant(large))
  np.testing.assert_allclose(served['probabilities'], softmax(model(scaled(s, squashed), train=False)), atol=1e-5)

  # --config with init_from the run's .npz serves the same model.
  npz, from_npz = str(tmp_path / 'vit.npz'), str(tmp_path / 'from_npz')
  assert export.main(['--workdir', workdir, '--out', npz]) == 0
  smoke = os.path.join(ROOT, 'configs/vit/digits.py:smoke')
  overrides = [f'--config.init_from={npz}', f'--config.data.data_dir={data_dir}']
  assert export.main(['--format', 'saved_model', '--config', smoke, *overrides, '--out', from_npz]) == 0
  served = serve(from_npz)(images=tf.constant(images[:3]))
  np.testing.assert_allclose(served['probabilities'], expected, atol=1e-5)


@pytest.mark.slow
def test_vivit_saved_model_averages_the_eval_views(moving_digits_dir, tmp_path):
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'serving')
  config = config_lib.load(os.path.join(ROOT, 'configs/vivit/moving_digits.py:factorised_encoder,smoke'))
  config.data.data_dir = moving_digits_dir
  config.update(total_steps=8, eval_every=8, checkpoint_every=8)
  train.train_and_evaluate(config, workdir)
  assert export.main(['--format', 'saved_model', '--workdir', workdir, '--out', out]) == 0
  signature = serve(out)
  s, model, preprocess = run_model(workdir)

  videos, _ = eval_examples(s, 3)
  views = np.stack([preprocess(video)['views'] for video in videos])  # (3, eval_clips x eval_crops, T, H, W, C)
  assert views.shape == (3, 2, 4, 20, 20, 1)
  logits = model(scaled(s, views.reshape(-1, *views.shape[2:])), train=False).reshape(3, 2, -1)
  expected = softmax(np.asarray(logits).mean(1))
  assert expected.std() > 1e-4
  for batch in (1, 3):
    served = signature(videos=tf.constant(videos[:batch]))
    assert served['probabilities'].shape == (batch, 4)
    np.testing.assert_allclose(served['probabilities'], expected[:batch], atol=1e-5)
    np.testing.assert_array_equal(served['class_index'], expected[:batch].argmax(-1))

  # Other lengths and sizes: clips are taken, resized and cropped as evaluation does.
  for shape in ((2, 5, 20, 20, 1), (1, 12, 30, 24, 1)):
    served = signature(videos=tf.constant(np.random.RandomState(0).randint(0, 256, shape, np.uint8)))
    np.testing.assert_allclose(served['probabilities'].numpy().sum(-1), 1.0, rtol=1e-5)


def error(capsys, argv):
  """(exit status, the stderr of export.main(argv)): one line."""
  status = export.main(argv)
  err = capsys.readouterr().err
  assert err.count('\n') == 1, err
  return status, err


def record(config, workdir):
  os.makedirs(workdir)
  workdir_lib.record_config(config, workdir)


def test_mistakes_are_one_line(smoke_config, tmp_path, capsys):
  saved_model = ['--format', 'saved_model']
  seq2seq = str(tmp_path / 'scan')
  record(config_lib.load(os.path.join(ROOT, 'configs/seq2seq/scan.py:simple')), seq2seq)
  status, err = error(capsys, [*saved_model, '--workdir', seq2seq, '--out', str(tmp_path / 'a')])
  assert status == 2 and 'seq2seq run' in err and 'classification runs (vit, vivit)' in err

  untrained = str(tmp_path / 'untrained')
  record(smoke_config(), untrained)
  status, err = error(capsys, [*saved_model, '--workdir', untrained, '--out', str(tmp_path / 'b')])
  assert status == 2 and 'has no checkpoint yet' in err
  status, err = error(capsys, ['--workdir', untrained, '--out', str(tmp_path / 'b.npz')])
  assert status == 2 and 'has no checkpoint yet' in err

  status, err = error(capsys, [*saved_model, '--workdir', untrained, '--out', str(tmp_path)])
  assert status == 2 and 'exists' in err

  status, err = error(capsys, [*saved_model, '--config', os.path.join(ROOT, 'configs/vit/digits.py'), '--out', 'x'])
  assert status == 2 and 'init_from' in err
  status, err = error(capsys, ['--config', os.path.join(ROOT, 'configs/vit/digits.py'), '--out', 'x.npz'])
  assert status == 2 and '--format npz exports a run' in err
  status, err = error(capsys, [*saved_model, '--workdir', untrained, '--out', 'y', '--platforms', 'gpu'])
  assert status == 2 and '--platforms' in err
  assert not os.path.exists(tmp_path / 'a') and not os.path.exists(tmp_path / 'b')


@pytest.mark.slow
def test_saved_model_names_the_classes(tmp_path, data_dir):
  """A folder of three named classes: the SavedModel returns each class index's folder name, and keeps the names as
  its asset class_names.txt."""
  from PIL import Image

  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for name in ('ant', 'bee', 'cat'):
      os.makedirs(tmp_path / 'photos' / split / name)
      for i in range(4):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), np.uint8)).save(tmp_path / 'photos' / split / name / f'{i}.png')
  config = load_config(
    'configs/vit/digits.py:smoke', data_dir, total_steps=2, data__batch_size=8, data__eval_batch_size=16
  )
  config.data.name, config.data.image_size = f'folder:{tmp_path / "photos"}', 8
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'serving')
  train.train_and_evaluate(config, workdir)
  assert export.main(['--format', 'saved_model', '--workdir', workdir, '--out', out]) == 0
  assert (tmp_path / 'serving' / 'assets' / export.CLASS_NAMES).read_text() == 'ant\nbee\ncat\n'
  served = serve(out)(images=tf.constant(rng.integers(0, 255, (6, 8, 8, 3), np.uint8)))
  names = [n.decode() for n in served['class_name'].numpy()]
  assert names == [('ant', 'bee', 'cat')[i] for i in served['class_index'].numpy()]
  assert sorted(os.listdir(tmp_path)) == ['photos', 'run', 'serving']  # Nothing else left behind.


def test_the_private_jax_writer_a_saved_model_export_replaces_is_there_or_refused(monkeypatch):
  """_for_tensorflow swaps jax's private StableHLO writer; this fails first when a jax release changes it."""
  from jax._src.export import _export

  assert export.private_bytecode_writer() is _export._module_to_bytecode
  monkeypatch.setattr(_export, '_module_to_bytecode', lambda module, version: b'')
  with pytest.raises(ConfigError, match='no longer has the private jax._src.export._export._module_to_bytecode'):
    export.private_bytecode_writer()
