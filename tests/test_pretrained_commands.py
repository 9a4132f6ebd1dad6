"""The commands on hub folders: `tools.predict --pretrained DIR` gives the library's own eval-pipeline
probabilities (tests/data/pretrained/predict/, made by make_references.py with timm 1.0.31 and transformers 5.24),
and `tools.export --format safetensors --layout timm` writes a folder that loads back exactly."""

import json
import os
import shutil

import numpy as np
import pytest

from vit_jax_lab.tools import predict

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'pretrained')
IMAGE = os.path.join(DATA, 'predict', 'image.png')  # 32x32: the folders' input size.


def _folder(tmp_path, row):
  """The row's folder; a timm one with crop_pct 1 (its eval pipeline then the identity at 32x32, as the reference
  was made) and label names."""
  if row.startswith('hf_'):
    return os.path.join(DATA, row)
  folder = tmp_path / row
  shutil.copytree(os.path.join(DATA, row), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['pretrained_cfg']['crop_pct'] = 1.0
  config['label_names'] = [f'class {i}' for i in range(config['num_classes'])]
  (folder / 'config.json').write_text(json.dumps(config))
  return str(folder)


@pytest.mark.parametrize('row', ['vit', 'deit_distilled', 'hf_vit'])
def test_predict_pretrained_gives_the_librarys_probabilities(row, tmp_path, capsys):
  reference = np.load(os.path.join(DATA, 'predict', f'{row}.npy'))[0]
  out = str(tmp_path / 'out.jsonl')
  assert predict.main(['--pretrained', _folder(tmp_path, row), IMAGE, '--top_k', '10', '--out', out]) == 0
  (line,) = [json.loads(x) for x in open(out)]
  names = [f'LABEL_{i}' if row == 'hf_vit' else f'class {i}' for i in range(10)]
  ours = np.array([dict(line['top_k'])[name] for name in names])
  print(f'{row}: max |ours - library| probability {np.max(np.abs(ours - reference)):.2e}')
  np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
  assert [label for label, _ in line['top_k']] == [names[i] for i in np.argsort(-reference)]
  assert 'resized' not in capsys.readouterr().err  # The identity: nothing resized.


def test_predict_pretrained_preprocessing_follows_the_folder():
  p = predict.preprocessing_of(
    os.path.join(DATA, 'vit'), json.load(open(os.path.join(DATA, 'vit', 'config.json'))), 'timm_vit'
  )
  assert (p.resize, p.crop, p.method, p.mean, p.std) == (35, (32, 32), 'bicubic', (0.5,) * 3, (0.5,) * 3)
  hf = os.path.join(DATA, 'hf_vit')
  p = predict.preprocessing_of(hf, {}, 'transformers_vit')
  assert (p.resize, p.crop, p.method, p.scale) == ((32, 32), None, 'bilinear', 1 / 255)


@pytest.mark.parametrize(
  'row,message', [('mae', 'has no classification head (a backbone)'), ('clip', 'embedding projection')]
)
def test_predict_pretrained_without_a_head_is_one_line(row, message, capsys):
  assert predict.main(['--pretrained', os.path.join(DATA, row), IMAGE]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err
