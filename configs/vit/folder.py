"""A small ViT on a folder of your own photos, its length sized from the folder: EPOCHS passes over its training
images, at least MIN_STEPS steps (docs/data.md, your data).

python -m main --config vit/folder:/path/to/photos --workdir runs/mine   # ~100 photos: about 2 minutes on 2 CPU cores

photos/<class>/*.jpg (20% held out as test), or photos/train/<class>/... with test/ or val/; any sizes, taken
to 64x64 (random-resized crops and flips for training). Override any key as usual, e.g. --config.data.image_size=96.
"""

import os

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.data.builders import folder

EPOCHS = 100
MIN_STEPS = 200
BATCH = 32


def get_config(arg: str | None = None):
  if not arg or not os.path.isdir(arg):
    raise config_lib.ConfigError(
      f'configs/vit/folder.py takes the folder of your photos, e.g. --config vit/folder:/path/to/photos; got {arg!r}'
    )
  layout = folder.scan(f'folder:{arg}')  # Its splits as the run will read them (a bad layout: one line here).
  if layout.kind != 'images':
    raise config_lib.ConfigError(f'{arg} holds {layout.kind}; configs/vit/folder.py trains on photos')
  images = len(layout.splits['train'])
  c = config_lib.base_config()
  c.model = models.config('vit', variant='mu/8', pool='gap', posemb='sincos2d', dropout=0.1)
  c.task = tasks.config('classification', label_smoothing=0.1)
  c.data.name = f'folder:{os.path.abspath(arg)}'
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
  return c
