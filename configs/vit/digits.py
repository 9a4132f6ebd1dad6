"""A small ViT on the built-in UCI digits (8x8 grey): >= 97% test accuracy in a few CPU minutes.

python -m main --config configs/vit/digits.py --workdir runs/vit_digits
python -m main --config configs/vit/digits.py:smoke --workdir runs/smoke   # a tiny model, a few steps
"""

from vit_jax_lab import config as config_lib, models, tasks


def get_config(arg: str | None = None):
  c = config_lib.base_config()
  c.model = models.config('vit', variant='mu/2', pool='gap', posemb='sincos2d', dropout=0.1)
  c.task = tasks.config('classification', label_smoothing=0.1)
  c.data.name = 'digits'
  c.data.batch_size = 128
  c.data.eval_batch_size = 360
  c.data.crop_padding = 1
  c.data.cache = True
  c.total_steps = 1800
  c.log_every = 100
  c.eval_every = 600
  c.checkpoint_every = 600
  c.optim.lr = 2e-3
  c.optim.weight_decay = 0.05
  c.schedule.warmup_steps = 100

  if arg == 'smoke':  # Dropout, stochastic depth, mixup, class token, learned position embeddings; seconds.
    c.model.update(
      width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=4, pool='tok', posemb='learn', dropout=0.1, drop_path=0.1
    )
    c.task.mixup = 0.2
    config_lib.smoke(c, steps=6, warmup=2)
    c.mesh.fsdp_min_size = 256
  elif arg is not None:
    raise config_lib.ConfigError(f'configs/vit/digits.py takes no argument or "smoke", got {arg!r}')
  return c
