"""ViViT-B/16x2 on Kinetics-400, initialised from an ImageNet-21k ViT-B/16: the recipe of Arnab et al. 2021.

For clusters. Kinetics is not in the TFDS catalogue: prepare it as a TFDS dataset named `kinetics400` with
features `video` (uint8 frames) and `label` (400 classes) and splits `train` / `validation` in DATA_DIR
(any TFDS builder of your own, built with `tfds build`), and fetch the ViT-B/16 ImageNet-21k release
(vision_transformer's `imagenet21k/ViT-B_16.npz`). Then, on every host:

python -m main --config configs/vivit/kinetics400.py --workdir WORKDIR \
    --config.data.data_dir=DATA_DIR --config.init_from=pretrained/imagenet21k/ViT-B_16.npz
python -m main --config configs/vivit/kinetics400.py:spatiotemporal ...   # model 1

ARG: the model, 'factorised_encoder' (default) or 'spatiotemporal'. Published top-1 (Table 2, 4 x 3 views):
factorised encoder 78.8, spatio-temporal 80.0. We have not run this (no cluster here).
What follows the paper / scenic's release: 32 frames at stride 2, resize to 256 and crop 224, random crop
and flip, SGD momentum 0.9, lr 0.05 with cosine decay and 2.5 epochs of warm-up, batch 64, 30 epochs,
gradient clipping at 1, no weight decay, central-frame tubelet initialisation, class token, 4 temporal
clips x 3 crops at test time. Not implemented here: scenic's scale jitter and colour augmentation.
"""

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.models import release

TRAIN_EXAMPLES = 214_834  # Kinetics-400 shrinks as videos leave YouTube; set your copy's count.
PUBLISHED_TOP1 = {'factorised_encoder': 78.8, 'spatiotemporal': 80.0}


def get_config(arg: str | None = None):
  model = arg or 'factorised_encoder'
  if model not in PUBLISHED_TOP1:
    raise config_lib.ConfigError(f'configs/vivit/kinetics400.py takes {" or ".join(PUBLISHED_TOP1)}, got {arg!r}')
  c = config_lib.base_config()
  # The released image weights' math (tanh GELU, LayerNorm epsilon 1e-6); model 2's temporal encoder starts fresh.
  c.model = models.config(
    'vivit',
    variant='B/16x2',
    model=model,
    temporal_depth=4,
    pool='tok',
    tubelet_init='central_frame',
    **release.RELEASE_OPTIONS,
  )
  c.init_from = 'pretrained/imagenet21k/ViT-B_16.npz'
  c.task = tasks.config('classification')
  c.data.name = 'kinetics400'
  c.data.eval_split = 'validation'
  c.data.num_frames = 32
  c.data.frame_stride = 2
  c.data.resize_size = 256
  c.data.image_size = 224
  c.data.flip = True
  c.data.eval_clips = 4
  c.data.eval_crops = 3
  c.data.batch_size = 64
  c.data.eval_batch_size = 32  # Videos; x 12 views = 384 clips per eval step.
  c.data.shuffle_buffer = 5_000
  c.data.value_range = (-1.0, 1.0)  # The release's input range.
  steps_per_epoch = TRAIN_EXAMPLES // c.data.batch_size
  c.total_steps = 30 * steps_per_epoch
  c.schedule.warmup_steps = int(2.5 * steps_per_epoch)
  c.schedule.decay = 'cosine'
  c.optim.name = 'sgd'
  c.optim.momentum = 0.9
  c.optim.lr = 0.05
  c.optim.weight_decay = 0.0
  c.optim.clip_norm = 1.0
  c.log_every = 100
  c.eval_every = 5 * steps_per_epoch
  c.checkpoint_every = 1000
  return c
