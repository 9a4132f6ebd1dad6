"""Your own photos, a folder of them, sized from the folder: from scratch, a small CNN (models/cnn.py) for STEPS
steps or EPOCHS passes, whichever is longer; after a comma, a ViT from pretrained weights (docs/data.md, your data).

python -m main --config vit/folder:/path/to/photos --workdir runs/mine   # ~100 photos: 11 minutes on 1 CPU core
python -m main --config vit/folder:/path/to/photos,/path/to/hub_folder --workdir runs/mine_pretrained

photos/<class>/*.jpg (20% held out as test), or photos/train/<class>/... with test/ or val/; any sizes. From
scratch, a ViT memorises ~100 photos and scores at chance on the held-out ones, so the recipe trains a CNN, whose
locality is built in, at 48x48 with strong augmentation: inception crops of at least 85% of the picture, flips,
quarter turns, grey, and colours remapped (channels shuffled, inverted, scaled and shifted); experiments/own_photos
gives its accuracy on two kinds of folders. These suit things told apart by their shape; where colour or which way
is up tells the classes apart, unset data.recolor or data.rotate90. Override any key as usual, e.g.
--config.data.image_size=64.
After a comma, weights pretrained on photos (a timm or transformers ViT folder you downloaded, a release .npz, a
run: docs/pretrained.md) start a ViT instead, in their own shape, fine-tuned at 224 pixels as vision_transformer
fine-tunes (SGD with momentum, learning rate 0.01, cosine, no weight decay, gradients clipped at 1;
PRETRAINED_EPOCHS passes, at least PRETRAINED_MIN_STEPS steps).
"""

import os

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.data.builders import folder

STEPS = 4000
EPOCHS = 100
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
  c.data.name = f'folder:{os.path.abspath(photos)}'
  c.data.inception_crop = True
  c.data.flip = True
  c.data.cache = True
  c.data.eval_split = 'test' if 'test' in layout.splits else 'val'  # train/ + val/ only: evaluate on val.
  c.data.batch_size = BATCH
  c.data.eval_batch_size = 64
  if pretrained:
    c.init_from = os.path.abspath(pretrained)
    c.model = models.config('vit')  # Every size and option the folder's (docs/pretrained.md).
    c.task = tasks.config('classification')
    c.data.image_size = 224  # Most hub ViTs' resolution; their position embeddings are resampled to another.
    c.total_steps = max(PRETRAINED_MIN_STEPS, -(-PRETRAINED_EPOCHS * images // BATCH))
    c.optim.name = 'sgd'
    c.optim.momentum = 0.9
    c.optim.lr = 0.01
    c.optim.weight_decay = 0.0
    c.optim.clip_norm = 1.0
    c.schedule.decay = 'cosine'
    c.schedule.warmup_steps = c.total_steps // 10
  else:
    c.model = models.config('cnn')
    c.task = tasks.config('classification', label_smoothing=0.1)
    c.data.image_size = 48
    c.data.inception_min_area = 0.85  # Crops that cut the thing teach a wrong label; none at all: no scale to vary.
    c.data.rotate90 = True
    c.data.color_drop = 0.2
    c.data.recolor = 1.0  # Any colour; tf.image's colour jitter beside it did no better (experiments/own_photos).
    c.data.augment_on = 'device'  # Flips, turns and colours in the step: the same on grain, which has no colour ops.
    c.total_steps = max(STEPS, -(-EPOCHS * images // BATCH))
    c.optim.lr = 1e-3
    c.optim.weight_decay = 0.05
    c.schedule.warmup_steps = min(100, c.total_steps // 10)
  c.log_every = max(1, c.total_steps // 10)
  c.eval_every = c.checkpoint_every = max(1, c.total_steps // 4)
  return c
