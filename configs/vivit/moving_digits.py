"""ViViT on the built-in moving digits: the label is the direction a digit moves, which no frame shows.

python -m main --config configs/vivit/moving_digits.py:factorised_encoder --workdir runs/vivit_fe

Argument: MODEL[,smoke]. MODEL is one of the four ViViT models (spatiotemporal, factorised_encoder,
factorised_self_attention, factorised_dot_product) or `single_frame`: the baseline, the same network on
clips of one frame (a ViT on a frame chosen at random in training; at evaluation the logits of the
eval_clips frames are averaged). `smoke` makes it tiny and a few steps long, for tests.
Clips are 8 of the 9 frames; evaluation averages the two 8-frame clips of each video.
"""

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.models import vivit

MODELS = (*vivit.MODELS, 'single_frame')


def get_config(arg: str | None = None):
  model, _, smoke = (arg or 'spatiotemporal').partition(',')
  if model not in MODELS or smoke not in ('', 'smoke'):
    raise config_lib.ConfigError(
      f'configs/vivit/moving_digits.py takes MODEL[,smoke] with MODEL one of {", ".join(MODELS)}, got {arg!r}'
    )
  c = config_lib.base_config()
  single = model == 'single_frame'
  c.model = models.config(
    'vivit',
    model='spatiotemporal' if single else model,
    width=64,
    depth=4,
    mlp_dim=128,
    num_heads=4,
    patch_size=4,
    tubelet_time=1 if single else 2,
    temporal_depth=2,
    pool='gap',
  )
  c.task = tasks.config('classification')
  c.data.name = 'moving_digits'
  c.data.num_frames = 1 if single else 8
  c.data.eval_clips = 2
  c.data.eval_crops = 1  # Frames are not cropped: a crop could cut the digit.
  c.data.batch_size = 32
  c.data.eval_batch_size = 160
  c.data.cache = True
  c.total_steps = 300
  c.log_every = 25
  c.eval_every = 300
  c.checkpoint_every = 300
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.schedule.warmup_steps = 50

  if smoke:
    c.model.update(width=32, depth=1, mlp_dim=64, num_heads=2, temporal_depth=1, dropout=0.1, drop_path=0.1)
    c.task.mixup = 0.2
    c.data.num_frames = 1 if single else 4
    config_lib.smoke(c, batch_size=16)
    c.mesh.fsdp_min_size = 256
  return c
