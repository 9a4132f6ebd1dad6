"""Attention maps and rollout, and the command that draws them."""

import numpy as np
import pytest
from PIL import Image

from vit_jax_lab import train
from vit_jax_lab.tools import attention_map


def test_rollout_properties():
  rng = np.random.RandomState(0)
  maps = [rng.dirichlet(np.ones(5), size=(3, 5)) for _ in range(4)]  # 4 layers, 3 heads, 5 tokens.
  result = attention_map.rollout(maps)
  np.testing.assert_allclose(result.sum(-1), 1.0, rtol=1e-6)
  identity = [np.broadcast_to(np.eye(5), (3, 5, 5)) for _ in range(4)]
  np.testing.assert_allclose(attention_map.rollout(identity), np.eye(5), atol=1e-12)
  # One layer whose every head attends to token 2 only: rollout is 0.5 I + 0.5 e_2 per row.
  focused = np.zeros((3, 5, 5))
  focused[..., 2] = 1.0
  expected = 0.5 * np.eye(5)
  expected[:, 2] += 0.5
  np.testing.assert_allclose(attention_map.rollout([focused]), expected)


def test_patch_scores():
  a = np.arange(2 * 4 * 4, dtype=float).reshape(2, 4, 4)
  np.testing.assert_array_equal(attention_map.patch_scores(a, has_class_token=True), a[:, 0, 1:])
  np.testing.assert_array_equal(attention_map.patch_scores(a, has_class_token=False), a.mean(axis=1))


@pytest.mark.slow
def test_a_missing_image_is_one_line_before_the_run_is_read(tmp_path, capsys):
  missing = str(tmp_path / 'cat.jpg')
  assert attention_map.main(['--workdir', str(tmp_path / 'no_run'), '--image', missing]) == 2
  assert capsys.readouterr().err.strip() == f'error: --image {missing} does not exist'


def test_command_draws_a_trained_digits_model(smoke_config, tmp_path, capsys):
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'attention.png')
  train.train_and_evaluate(smoke_config(), workdir)  # A class-token model with 2 heads.
  capsys.readouterr()
  assert attention_map.main(['--workdir', workdir, '--example', '7', '--layer', '1']) == 0  # Into the workdir.
  assert capsys.readouterr().out.strip() == f'wrote {workdir}/attention_7.png'
  pixels = np.asarray(Image.open(f'{workdir}/attention_7.png'))
  assert pixels.shape[1] > 3 * pixels.shape[0] and pixels.std() > 0  # Input, rollout and 2 heads side by side.
  assert attention_map.main(['--config', 'configs/vit/digits.py:smoke']) == 2  # No run folder: --out is needed.
  assert '--out' in capsys.readouterr().err
  assert attention_map.main(['--workdir', workdir, '--layer', '5', '--out', out]) == 2
  assert attention_map.main(['--workdir', workdir, '--example', '360', '--out', out]) == 2
  # Its own image reads as predict reads it: turned upright by EXIF, and one line for what it cannot read.
  photo = tmp_path / 'sideways.jpg'
  pixels = np.zeros((8, 16, 3), np.uint8)
  pixels[:, :8] = 255  # Bright on the left, as stored; EXIF orientation 6 turns it 90 degrees clockwise.
  exif = Image.Exif()
  exif[0x0112] = 6
  Image.fromarray(pixels).save(photo, exif=exif.tobytes(), quality=95)
  assert attention_map.main(['--workdir', workdir, '--image', str(photo), '--out', out]) == 0
  webp, fake, cut = tmp_path / 'a.webp', tmp_path / 'fake.webp', tmp_path / 'cut.jpg'
  Image.fromarray(pixels).save(webp)  # Read, as training and predict read it.
  fake.write_text('not an image')
  cut.write_bytes(photo.read_bytes()[:300])
  assert attention_map.main(['--workdir', workdir, '--image', str(webp), '--out', str(tmp_path / 'b.png')]) == 0
  capsys.readouterr()
  assert attention_map.main(['--workdir', workdir, '--image', str(fake), '--out', str(tmp_path / 'b2.png')]) == 2
  assert (
    capsys.readouterr().err.strip() == f'error: --image {fake}: not an image file (JPEG, PNG, WebP, BMP, GIF or TIFF)'
  )
  assert attention_map.main(['--workdir', workdir, '--image', str(cut), '--out', str(tmp_path / 'c.png')]) == 2
  assert capsys.readouterr().err.strip().startswith(f'error: --image {cut}: a damaged image')
