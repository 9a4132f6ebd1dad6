"""Files handed over that are wrong or hostile: no code runs, reads are bounded, nothing of the user's is
overwritten, and each is one line (docs/reliability.md, hostile files)."""

import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT, digits_renamed, elsewhere_env
from vit_jax_lab import checkpoints, config as config_lib, errors, hub, workdir as workdir_lib
from vit_jax_lab.data import info as data_info
from vit_jax_lab.data.builders import folder
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tools import hub_benchmark, predict, predictors, pretrained


def test_a_prepared_dataset_naming_a_module_of_its_own_runs_no_code(data_dir, tmp_path):
  """features.json's pythonClassName would make TFDS import `payload` (on sys.path: the working folder)."""
  prepared = digits_renamed(data_dir, tmp_path / 'tfds', 'evil', moduleName='payload')
  features = (prepared / 'features.json').read_text()
  (prepared / 'features.json').write_text(
    features.replace('tensorflow_datasets.core.features.class_label_feature', 'payload')
  )
  marker = tmp_path / 'MARKER'
  (tmp_path / 'payload.py').write_text(f'open({str(marker)!r}, "w").write("ran")\n')
  command = [sys.executable, '-m', 'main', '--config', os.path.join(ROOT, 'configs/vit/digits.py')]
  command += ['--workdir', str(tmp_path / 'run'), '--config.data.name=evil', f'--config.data.data_dir={tmp_path}/tfds']
  done = subprocess.run(command, cwd=tmp_path, env=elsewhere_env(), capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and not marker.exists()
  assert done.stderr.strip().splitlines() == [
    f"error: {prepared}/features.json names the feature class 'payload.ClassLabel', which TFDS would import to read "
    'the data: only its own (tensorflow_datasets.core.features.*) are read; rebuild the dataset'
  ]


@pytest.mark.parametrize('where', ['features.json', 'array_record/features.json'])
def test_a_builtin_dataset_naming_a_module_runs_no_code_on_grain(data_dir, tmp_path, where):
  """The grain backend opens its ArrayRecord copy from the files alone (tfds.builder_from_directory), which imports
  what features.json names, even for a built-in dataset: the prepared folder's or only the copy's features.json
  naming `payload` is one line, and payload.py never runs."""
  from vit_jax_lab.data import grain_input

  prepared = tmp_path / 'tfds' / 'digits' / '1.0.0'
  shutil.copytree(os.path.join(data_dir, 'digits', '1.0.0'), prepared, ignore=shutil.ignore_patterns('array_record*'))
  config = config_lib.load(os.path.join(ROOT, 'configs/vit/digits.py'))
  config.data.update(dict(data_dir=str(tmp_path / 'tfds'), backend='grain'))
  grain_input.load(config.data, data_info.label_info)  # The copy, made while the folder is sound.
  features = (prepared / where).read_text()
  (prepared / where).write_text(features.replace('tensorflow_datasets.core.features.class_label_feature', 'payload'))
  marker = tmp_path / 'MARKER'
  (tmp_path / 'payload.py').write_text(f'open({str(marker)!r}, "w").write("ran")\n')
  command = [sys.executable, '-m', 'main', '--config', os.path.join(ROOT, 'configs/vit/digits.py')]
  command += [
    '--workdir',
    str(tmp_path / 'run'),
    f'--config.data.data_dir={tmp_path}/tfds',
    '--config.data.backend=grain',
  ]
  done = subprocess.run(command, cwd=tmp_path, env=elsewhere_env(), capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and not marker.exists(), done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == [
    f"error: {prepared}/{where} names the feature class 'payload.ClassLabel', which TFDS would import to read "
    'the data: only its own (tensorflow_datasets.core.features.*) are read; rebuild the dataset'
  ]
  assert not (tmp_path / 'run' / 'config.json').exists()


def hub_folder(tmp_path, config) -> str:
  folder_path = tmp_path / 'hub'
  folder_path.mkdir()
  (folder_path / 'model.safetensors').write_bytes(struct.pack('<Q', 2) + b'{}')
  if isinstance(config, bytes):
    (folder_path / 'config.json').write_bytes(config)
  elif config is not None:
    (folder_path / 'config.json').write_text(json.dumps(config))
  return str(folder_path)


@pytest.mark.parametrize(
  'config, message',
  [
    ([1, 2], 'holds a JSON list, not an object'),
    (b'{"architecture": ', 'is not JSON'),
    (b'\xff\xfe', 'is not JSON'),
    (b'[' * 10**6 + b']' * 10**6, 'nests its JSON too deep to read'),  # Before: 34 lines of RecursionError.
  ],
)
def test_a_hub_config_of_the_wrong_kind_is_one_line(tmp_path, config, message):
  with pytest.raises(ConfigError, match=f'init_from: the config .*config.json {message}'):
    hub.read(hub_folder(tmp_path, config))


def test_a_huge_or_endless_hub_config_is_refused_before_it_is_read(tmp_path):
  path = hub_folder(tmp_path, None)
  with open(os.path.join(path, 'config.json'), 'wb') as f:
    f.truncate(5 * 2**30)  # 5 GB of nothing, on disk as a sparse file.
  with pytest.raises(ConfigError, match='holds 5,368,709,120 bytes, more than such a file can'):
    hub.read(path)
  os.remove(os.path.join(path, 'config.json'))
  os.mkfifo(os.path.join(path, 'config.json'))  # Opened, it would block until a writer comes: never.
  with pytest.raises(ConfigError, match='is not a regular file \\(a pipe or a device\\)'):
    hub.read(path)


def png_header(width: int, height: int) -> bytes:
  """A PNG whose header declares width x height (its pixel data cut off): what a decompression bomb shows before
  it is decoded."""

  def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))

  ihdr = struct.pack('>IIBBBBB', width, height, 8, 0, 0, 0, 0)
  return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', zlib.compress(b'\0' * 64)) + chunk(b'IEND', b'')


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: png_header(20_000, 20_000), 'more than 134,217,728'),
    (lambda: png_header(999_999, 1), 'one side over 64 times the other'),
  ],
)
def test_images_too_large_to_decode_are_refused_from_their_header(tmp_path, make, message):
  path = tmp_path / 'image.png'
  path.write_bytes(make())
  assert message in folder.size_problem(path.read_bytes())
  with pytest.raises(predictors.Unreadable, match=message):
    predictors.read_input(predictors.Item(str(path), 'image', (str(path),)), 3)


def test_an_image_that_is_a_device_or_a_pipe_is_not_read(tmp_path):
  (tmp_path / 'zero.png').symlink_to('/dev/zero')
  os.mkfifo(tmp_path / 'fifo.png')
  for name in ('zero.png', 'fifo.png'):
    path = str(tmp_path / name)
    with pytest.raises(predictors.Unreadable, match='is not a regular file'):
      predictors.read_input(predictors.Item(path, 'image', (path,)), 3)
  photo = io.BytesIO()
  Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(photo, 'PNG')
  assert folder.size_problem(photo.getvalue()) is None


def test_foreign_strings_print_escaped_and_cut():
  assert errors.foreign('vit_base\x1b]0;owned\x07\x1b[2J') == 'vit_base\\x1b]0;owned\\x07\\x1b[2J'
  assert errors.foreign('x' * 10_000_000) == 'x' * 300 + '...'


def test_an_export_never_overwrites_and_leaves_nothing_partial(tmp_path):
  out = tmp_path / 'vit.npz'
  checkpoints.write_npz(str(out), {'a': np.ones(3)})
  with pytest.raises(ConfigError, match='was written by another process meanwhile'):
    checkpoints.write_npz(str(out), {'a': np.zeros(3)})
  np.testing.assert_array_equal(np.load(out)['a'], np.ones(3))
  assert os.listdir(tmp_path) == ['vit.npz']


def test_predict_out_never_overwrites_a_file_nor_an_input(tmp_path, capsys):
  image = tmp_path / 'photo.png'
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(image)
  before = image.read_bytes()
  assert predict.main(['--workdir', str(tmp_path / 'run'), str(image), '--out', str(image)]) == 2
  assert f'--out {image} exists: name a new file or folder' in capsys.readouterr().err
  assert image.read_bytes() == before


def test_an_out_in_a_missing_folder_is_one_line_before_anything_is_done(tmp_path):
  """`DIR/missing/../x.npz`: the path climbs out of a folder that is not there (before: FileNotFoundError at the
  write, after the export's work)."""
  from vit_jax_lab.tools import common

  with pytest.raises(ConfigError, match=r'missing/\.\. does not exist \(make it first\)'):
    common.check_new(str(tmp_path / 'missing' / '..' / 'x.npz'))
  common.check_new(str(tmp_path / 'x.npz'))
  assert os.listdir(tmp_path) == []


def test_a_marian_vocabulary_of_the_wrong_kind_is_one_line(tmp_path):
  for name in data_info.MarianVocab.FILES:
    (tmp_path / name).write_text('{}')
  (tmp_path / 'vocab.json').write_text(json.dumps({'</s>': 0, '<unk>': 'one', '<pad>': 2}))
  with pytest.raises(ConfigError, match="vocab.json maps '<unk>' to 'one'; each piece needs an integer id from 0"):
    data_info.MarianVocab(str(tmp_path))
  (tmp_path / 'vocab.json').write_text(json.dumps({'</s>': 0, '<unk>': 10**12, '<pad>': 2}))  # Was "negative".
  with pytest.raises(ConfigError, match="vocab.json maps '<unk>' to 1000000000000; each piece needs an integer id"):
    data_info.MarianVocab(str(tmp_path))
  (tmp_path / 'vocab.json').write_text(json.dumps({'</s>': 0, '<unk>': 1, '<pad>': 100}))
  with pytest.raises(ConfigError, match='vocab.json must number its 3 pieces 0 to 2, each id once'):
    data_info.MarianVocab(str(tmp_path))
  (tmp_path / 'vocab.json').write_text('[1, 2]')
  with pytest.raises(ConfigError, match='the vocabulary .*vocab.json holds a JSON list, not an object'):
    data_info.MarianVocab(str(tmp_path))


def test_a_lock_file_not_written_by_a_run_is_taken_over_with_a_note(tmp_path):
  (tmp_path / 'lock').write_bytes(b'\x00\xffgarbage')
  with workdir_lib.lock(str(tmp_path)) as notes:
    assert notes == [f'took over {tmp_path}/lock, which named no host and process (it was not written by a run)']
    assert (tmp_path / 'lock').read_text() == f'{socket.gethostname()} {os.getpid()}'
  assert not (tmp_path / 'lock').exists()


def test_a_config_without_model_or_task_is_one_line(tmp_path):
  (tmp_path / 'bare.py').write_text(
    'from vit_jax_lab import config as config_lib\n\n\ndef get_config():\n  return config_lib.base_config()\n'
  )
  config = config_lib.load(str(tmp_path / 'bare.py'))
  with pytest.raises(ConfigError, match=r'the config sets no model: its get_config sets c.model = models.config\('):
    config_lib.check_parts(config)


@pytest.fixture(scope='module')
def timm_folder(tmp_path_factory) -> str:
  """A random timm ViT-Ti/16 folder, as timm writes one."""
  path = str(tmp_path_factory.mktemp('timm') / 'vit_ti16')
  hub_benchmark.write(path, 'Ti/16')
  return path


@pytest.mark.parametrize(
  'change, message',
  [
    (
      {'model_args': [1, 2]},
      'its config.json holds a value of a type or range it cannot be read with \\(AttributeError',
    ),
    ({'label_names': 5}, 'its config.json holds a value of a type or range it cannot be read with \\(TypeError'),
    ({'pretrained_cfg': {'input_size': 'big'}}, 'has pretrained_cfg.input_size=big; it must be \\[channels, height'),
    ({'pretrained_cfg': {'std': [0, 0, 0]}}, "the folder's preprocessing has mean .* and std \\(0, 0, 0\\): they must"),
    # Values of the right type out of range: refused under the folder's own key, not replaced or blamed on an image.
    ({'pretrained_cfg': {'crop_pct': -0.5}}, 'pretrained_cfg.crop_pct=-0.5 must be a positive number'),
    ({'pretrained_cfg': {'input_size': [3, -224, 224]}}, 'pretrained_cfg.input_size\\[1\\]=-224; it must be a'),
    ({'pretrained_cfg': {'input_size': [3, 10**6, 224]}}, 'has resize\\[0\\]=1,142,857; a side of more than 16,384'),
    ({'model_args': {'num_heads': 0}}, 'has model_args.num_heads=0; it must be a positive integer'),
  ],
)
def test_a_hub_config_value_of_the_wrong_type_is_one_line(timm_folder, tmp_path, change, message):
  folder_path = str(tmp_path / 'changed')
  shutil.copytree(timm_folder, folder_path)
  with open(os.path.join(folder_path, 'config.json')) as f:
    config = json.load(f)
  for key, value in change.items():
    config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
  with open(os.path.join(folder_path, 'config.json'), 'w') as f:
    json.dump(config, f)
  with pytest.raises(ConfigError, match=message):
    pretrained.load_hub(folder_path, 5)


@pytest.mark.parametrize(
  'folder, change, message',
  [
    ('hf_vit', {'num_attention_heads': 0}, 'config.json has num_attention_heads=0; it must be a positive integer'),
    ('hf_vit', {'image_size': [32, -1]}, 'config.json has image_size\\[1\\]=-1; it must be a positive integer'),
    ('hf_vivit', {'num_frames': 0}, 'config.json has num_frames=0; it must be a positive integer'),
    ('hf_vit_model', {'pooler_act': 'relu'}, "config.json's pooler_act='relu': our ViT's pre-logits layer"),
  ],
)
def test_a_transformers_config_value_our_vit_cannot_take_is_one_line(tmp_path, folder, change, message):
  path = str(tmp_path / folder)
  shutil.copytree(os.path.join(ROOT, 'tests', 'data', 'pretrained', folder), path)
  with open(os.path.join(path, 'config.json')) as f:
    config = json.load(f) | change
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(config, f)
  with pytest.raises(ConfigError, match=message):
    pretrained.load_hub(path, 5)


@pytest.mark.parametrize('text', ['[1, 2]', '{}', '{"model": 3, "task": {"name": "classification"}}'])
def test_a_run_config_json_of_the_wrong_shape_is_one_line(tmp_path, text):
  (tmp_path / 'config.json').write_text(text)
  with pytest.raises(ConfigError, match="config.json is not a run's config \\(it names no model.name and task.name\\)"):
    workdir_lib.load_run(str(tmp_path))


@pytest.mark.parametrize('content', [b'', b'not a model', bytes(range(256)) * 4])
def test_a_sentencepiece_file_that_is_not_one_is_one_line(tmp_path, content):
  for name in data_info.MarianVocab.FILES:
    (tmp_path / name).write_bytes(content)
  (tmp_path / 'vocab.json').write_text(json.dumps({'</s>': 0, '<unk>': 1, '<pad>': 2}))
  with pytest.raises(ConfigError, match='source.spm is not a SentencePiece model'):
    data_info.MarianVocab(str(tmp_path), 'source')
