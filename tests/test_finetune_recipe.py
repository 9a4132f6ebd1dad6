"""The fine-tuning recipe runs end to end (tiny variant, built-in data); accumulation is exact."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from vit_jax_lab import checkpoints, config as config_lib, train
from vit_jax_lab.models import release, vit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_recipe_values():
  c = config_lib.load(os.path.join(ROOT, 'configs/vit/finetune.py:cifar10,B/16,500'))
  assert (c.data.batch_size, c.accum_steps, c.total_steps, c.schedule.warmup_steps) == (512, 8, 500, 50)
  assert (c.optim.name, c.optim.momentum, c.optim.clip_norm, c.schedule.decay) == ('sgd', 0.9, 1.0, 'cosine')
  assert (c.data.image_size, c.data.inception_crop, c.data.flip) == (384, True, True)
  assert c.model.gelu_approximate and c.model.variant == 'B/16'
  assert c.init_from == 'pretrained/imagenet21k/ViT-B_16.npz'
  assert (c.optim.lr, c.optim.mu_dtype, c.model.dropout, c.data.antialias, c.ema_decay) == (
    0.01,
    'bfloat16',
    0,
    False,
    None,
  )
  # vision_transformer: lr 0.01 for B/16 on CIFAR-10 only, dropout 0.1 for L/16 and H/14 only.
  large = config_lib.load(os.path.join(ROOT, 'configs/vit/finetune.py:imagenet2012,L/16'))
  assert (large.total_steps, large.optim.lr, large.model.dropout, large.data.image_size) == (20_000, 0.03, 0.1, 384)
  assert config_lib.load(os.path.join(ROOT, 'configs/vit/finetune.py:cifar100,B/16')).optim.lr == 0.03
  # The paper's ImageNet recipe (its Table 2): 512 px (518 for H/14) and Polyak averaging.
  paper = config_lib.load(os.path.join(ROOT, 'configs/vit/finetune.py:imagenet2012,H/14,paper'))
  assert (paper.data.image_size, paper.ema_decay, paper.model.dropout, paper.total_steps) == (518, 0.9999, 0.1, 20_000)


@pytest.mark.slow
def test_recipe_runs_from_a_release_checkpoint(data_dir, tmp_path, capsys):
  # A "pre-trained" release file: another class count, another resolution, a pre-logits layer.
  source = vit.ViT(1000, (8, 8, 1), variant='mu/4', representation_size=32, rngs=nnx.Rngs(3), **release.RELEASE_OPTIONS)
  npz = str(tmp_path / 'ViT-mu_4.npz')
  checkpoints.write_npz(npz, release.to_release(jax.device_get(nnx.state(source, nnx.Param).to_pure_dict()), 4))

  c = config_lib.load(os.path.join(ROOT, 'configs/vit/finetune.py:cifar10,mu/4,4'))
  c.init_from = npz
  c.data.update(
    name='digits',
    data_dir=data_dir,
    train_split='train',
    eval_split='test',
    image_size=16,
    batch_size=64,
    eval_batch_size=64,
  )
  c.log_every = 1
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(c, workdir)
  out = capsys.readouterr().out
  assert 'head (32, 1000) re-initialised for (64, 10)' in out
  assert 'pre-logits layer dropped' in out and 'resampled (1, 5, 64) -> (1, 17, 64)' in out
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    lines = [json.loads(line) for line in f]
  assert [m['step'] for m in lines if 'train/loss' in m] == [1, 2, 3, 4]
  assert all(np.isfinite(m['train/loss']) for m in lines if 'train/loss' in m)
  assert lines[-1]['eval/examples'] == 360


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch(smoke_config):
  from test_train import run_steps

  plain = dict(model__dropout=0.0, model__drop_path=0.0, task__mixup=0.0, data__batch_size=64)
  losses, params, _ = run_steps(smoke_config(**plain), jax.devices(), num_steps=3)
  accumulated_losses, accumulated, _ = run_steps(smoke_config(accum_steps=4, **plain), jax.devices(), num_steps=3)
  np.testing.assert_allclose(accumulated_losses, losses, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), accumulated, params)
