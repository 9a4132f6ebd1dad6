"""A small ViT on a folder of your own photos, its length sized from the folder: EPOCHS passes over its training
images, at least MIN_STEPS steps (docs/data.md, your data).

python -m main --config vit/folder:/path/to/photos --workdir runs/mine   # ~100 photos: about 2 minutes on 2 CPU cores
python -m main --config vit/folder:/path/to/photos,/path/to/hub_folder --workdir runs/mine_pretrained

photos/<class>/*.jpg (20% held out as test), or photos/train/<class>/... with test/ or val/; any sizes, taken
to 64x64 (random-resized crops and flips for training). Override any key as usual, e.g. --config.data.image_size=96.
From scratch, so few photos are memorised, not learned (experiments/own_photos). After a comma, weights pretrained
on photos (a timm or transformers ViT folder you downloaded, a release .npz, a run: docs/pretrained.md) start the
model instead, in their own shape, fine-tuned at 224 pixels as vision_transformer fine-tunes (SGD with momentum,
learning rate 0.01, cosine, no weight decay, gradients clipped at 1; PRETRAINED_EPOCHS passes, at least
PRETRAINED_MIN_STEPS steps).
"""

import os

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.data.builders import folder

EPOCHS = 100
MIN_STEPS = 200
PRETRAINED_EPOCHS = 20
PRETRAINED_MIN_STEPS = 50
BATCH = 32


def get_config(arg: str | None = None):
  photos, _, pretrained = (arg or '').partition(',')
  if not photos or not os.path.isdir(photos):
    raise config_lib.ConfigError(
      'configs/vit/folder.py takes the folder of your photos, e.g. --config vit/folder:/path/to/photos (then '
      f',/path/to/pretrained_weights to start from them); got {arg!r}'
    )
  if pretrained and not os.path.exists(pretrained):
    raise config_lib.ConfigError(
      f'configs/vit/folder.py: {pretrained!r} (after the comma) is missing: give the folder or file of pretrained '
      'weights to start from'
    )
  layout = folder.scan(f'folder:{photos}')  # Its splits as the run will read them (a bad layout: one line here).
  if layout.kind != 'images':
    raise config_lib.ConfigError(f'{photos} holds {layout.kind}; configs/vit/folder.py trains on photos')
  images = len(layout.splits['train'])
  c = config_lib.base_config()
  c.model = models.config('vit', variant='mu/8', pool='gap', posemb='sincos2d', dropout=0.1)
  c.task = tasks.config('classification', label_smoothing=0.1)
  c.data.name = f'folder:{os.path.abspath(photos)}'
  c.data.image_size = 64
  c.data.inception_crop = True
  c.data.flip = True
  c.data.cache = True
  c.data.eval_split = 'test' if 'test' in layout.splits else 'val'  # train/ + val/ only: evaluate on val.
  c.data.batch_size = BATCH
  c.data.eval_batch_size = 64
  c.total_steps = max(MIN_STEPS, -(-EPOCHS * images // BATCH))
  c.log_every = max(1, c.total_steps // 10)
  c.eval_every = c.checkpoint_every = max(1, c.total_steps // 4)
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.schedule.warmup_steps = min(100, c.total_steps // 10)
  if pretrained:
    c.init_from = os.path.abspath(pretrained)
    c.model = models.config('vit')  # Every size and option the folder's (docs/pretrained.md).
    c.task = tasks.config('classification')
    c.data.image_size = 224  # Most hub ViTs' resolution; their position embeddings are resampled to another.
    c.total_steps = max(PRETRAINED_MIN_STEPS, -(-PRETRAINED_EPOCHS * images // BATCH))
    c.log_every = max(1, c.total_steps // 10)
    c.eval_every = c.checkpoint_every = max(1, c.total_steps // 4)
    c.optim.name = 'sgd'
    c.optim.momentum = 0.9
    c.optim.lr = 0.01
    c.optim.weight_decay = 0.0
    c.optim.clip_norm = 1.0
    c.schedule.decay = 'cosine'
    c.schedule.warmup_steps = c.total_steps // 10
  return c
