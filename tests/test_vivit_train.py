"""ViViT through the generic trainer: every moving-digits config trains and evaluates; any mesh gives the
same steps; an image ViT run initialises a video model."""

import os

import jax
import numpy as np
import pytest

from test_train import run_steps
from vit_jax_lab import checkpoints, config as config_lib, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ('spatiotemporal', 'factorised_encoder', 'factorised_self_attention', 'factorised_dot_product')
# single_frame is spatiotemporal on 1-frame clips: experiments/vivit_variants runs it.


def video_config(data_dir, model, **overrides):
  config = config_lib.load(os.path.join(ROOT, f'configs/vivit/moving_digits.py:{model},smoke'))
  config.data.data_dir = data_dir
  config.update(overrides)
  return config


@pytest.mark.slow
@pytest.mark.parametrize('model', MODELS)
def test_every_config_trains_and_evaluates_every_video(moving_digits_dir, tmp_path, model):
  metrics = train.train_and_evaluate(video_config(moving_digits_dir, model), str(tmp_path / model))
  assert metrics['eval/examples'] == 1440 and np.isfinite(metrics['eval/loss'])


@pytest.mark.slow  # The fast tier keeps the generic trainer's (tests/test_train.py).
def test_same_steps_on_1_device_and_8(moving_digits_dir):
  config = video_config(moving_digits_dir, 'factorised_encoder')
  losses_1, params_1, _ = run_steps(config, jax.devices()[:1], num_steps=3)
  losses_8, params_8, _ = run_steps(config, jax.devices(), num_steps=3)
  np.testing.assert_allclose(losses_8, losses_1, rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), params_8, params_1)


@pytest.mark.slow
def test_init_from_an_image_vit_run(smoke_config, moving_digits_dir, tmp_path, capsys):
  """A ViT trained on 8x8 digits (class token, 2x2 patches of 4 px) starts a gap video model on 20x20
  frames: the class token is dropped, position embeddings are resampled to 5x5 and repeated over time."""
  image_run = str(tmp_path / 'vit')
  train.train_and_evaluate(smoke_config(total_steps=2, eval_every=2, checkpoint_every=2), image_run)
  image = checkpoints.read_params(image_run)
  config = video_config(moving_digits_dir, 'spatiotemporal', init_from=image_run)
  config.model.depth = 2  # As the image model's.
  s = train.setup(config)
  params = jax.device_get(train.init_state(s).params.to_pure_dict())
  out = capsys.readouterr().out
  assert 'class token dropped' in out and 'position embeddings resampled' in out
  jax.tree.map(np.testing.assert_array_equal, params['encoder'], image['encoder'])
  kernel = params['embedding']['kernel']  # Central frame of 2: index 1.
  np.testing.assert_array_equal(kernel[1], image['embedding']['kernel'])
  assert not kernel[0].any()
  pos = params['pos_embedding'].reshape(2, 25, -1)
  np.testing.assert_array_equal(pos[0], pos[1])


def test_kinetics_recipe_builds_the_published_model():
  config = config_lib.load(os.path.join(ROOT, 'configs/vivit/kinetics400.py'))
  assert (config.model.variant, config.model.model, config.model.temporal_depth) == ('B/16x2', 'factorised_encoder', 4)
  assert (config.data.num_frames, config.data.frame_stride, config.data.resize_size, config.data.image_size) == (
    32,
    2,
    256,
    224,
  )
  assert (config.data.eval_clips, config.data.eval_crops, config.data.batch_size) == (4, 3, 64)
  assert (config.optim.name, config.optim.lr, config.optim.momentum, config.optim.clip_norm) == ('sgd', 0.05, 0.9, 1.0)
  assert config.total_steps == 30 * (214_834 // 64) and config.schedule.warmup_steps == int(2.5 * (214_834 // 64))
  # scenic's training augmentation and test split; model 1 trains at scenic's lr 0.1.
  assert (config.data.scale_jitter, config.data.color_augment, config.data.color_drop) == ((0.9, 1.33), 0.8, 0.1)
  assert config.data.eval_split == 'test'
  model1 = config_lib.load(os.path.join(ROOT, 'configs/vivit/kinetics400.py:spatiotemporal'))
  assert (model1.model.model, model1.optim.lr) == ('spatiotemporal', 0.1)
  from flax import nnx

  from vit_jax_lab import cost, models

  fn, args = cost.forward(
    lambda: models.build(config.model, nnx.Rngs(0), num_classes=400, input_shape=(32, 224, 224, 3)), (32, 224, 224, 3)
  )
  assert round(cost.param_count(args[0]) / 1e6, 1) == 115.1
