"""Fine-tuning an ImageNet-21k ViT the vision_transformer way (Dosovitskiy et al. 2021, appendix B.1.1).

Argument: DATASET,VARIANT[,STEPS][,paper]: cifar10 | cifar100 | imagenet2012, a variant such as B/16, the
step count (default: the full schedule, 10k steps for CIFAR and 20k for ImageNet; 500 gives the short
schedule with 50 warm-up steps), and `paper` for the paper's ImageNet recipe on top: 512 px (518 for H/14)
and Polyak averaging of the parameters with decay 0.9999 (ema_decay), which its Table 2 figures used.

Each value is vision_transformer's (`vit_jax/configs/common.py`, `vit.py`, `models.py`; its README's table of
results was run with them): SGD with momentum 0.9 kept in bfloat16, global batch 512 (8 accumulated
micro-batches of 64), gradient clipping at 1, no weight decay, cosine decay, lr 0.03 (0.01 for B/16 on
CIFAR-10), dropout 0.1 for L/16 and H/14 (0 otherwise), 384 px, inception crop and flip for training, a
resize to 384 x 384 (no crop) for evaluation. experiments/vit_finetune/README.md sets them beside the
reference values and the accuracies they reached.

python -m main --config configs/vit/finetune.py:cifar10,B/16,500 --workdir runs/c10_b16_500 \
    --config.init_from=pretrained/imagenet21k/ViT-B_16.npz --config.data.data_dir=/datasets/tfds
"""

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.models import release

DATASETS = {  # train split, eval split, full schedule (steps)
  'cifar10': ('train[:98%]', 'test', 10_000),
  'cifar100': ('train[:98%]', 'test', 10_000),
  'imagenet2012': ('train[:99%]', 'validation', 20_000),
}
DROPOUT = {'L/16': 0.1, 'H/14': 0.1}  # vision_transformer's models.py; every other variant: 0.
# data.canvas: the crop's window travels in a canvas this many times image_size and the jitted step resizes it; it
# holds every CIFAR image (32 px) and the crops of nearly every ImageNet photo (up to 500 px).
CANVAS = {'cifar10': 0.25, 'cifar100': 0.25, 'imagenet2012': 1.25}
LR = {('cifar10', 'B/16'): 0.01}  # vision_transformer's vit.py; every other pair: common.py's 0.03.


def get_config(arg: str | None = None):
  parts = (arg or 'cifar10,B/16').split(',')
  paper = parts[-1] == 'paper'
  parts = parts[:-1] if paper else parts
  if len(parts) not in (2, 3) or parts[0] not in DATASETS or (len(parts) == 3 and not parts[2].isdigit()):
    raise config_lib.ConfigError(
      f'configs/vit/finetune.py takes DATASET,VARIANT[,STEPS][,paper] with DATASET one of {", ".join(DATASETS)}, '
      f'got {arg!r}'
    )
  dataset, variant = parts[:2]
  train_split, eval_split, full_steps = DATASETS[dataset]
  steps = int(parts[2]) if len(parts) == 3 else full_steps

  c = config_lib.base_config()
  # The released weights' math: tanh GELU, LayerNorm epsilon 1e-6; class token; zero-initialised head.
  c.model = models.config(
    'vit', variant=variant, pool='tok', dropout=DROPOUT.get(variant, 0.0), **release.RELEASE_OPTIONS
  )
  c.task = tasks.config('classification')
  c.init_from = f'pretrained/imagenet21k/ViT-{variant.replace("/", "_")}.npz'
  c.data.name = dataset
  c.data.train_split, c.data.eval_split = train_split, eval_split
  c.data.image_size = (518 if variant == 'H/14' else 512) if paper else 384
  c.data.inception_crop = True
  c.data.flip = True
  c.data.augment_on = 'device'  # The flip and the crop's resize in the jitted step (data/device.py).
  c.data.canvas = CANVAS[dataset]
  # CIFAR's 50,000 images are held in memory once read (decoded: 150 MB; pipeline.pixels_fit), as task_adaptation
  # caches datasets under 150,000 examples: reading, parsing and decoding a 32-pixel image each epoch cost the host
  # more than the rest of its preprocessing.
  c.data.cache = dataset != 'imagenet2012'
  c.data.antialias = False  # vision_transformer's tf.image.resize: matters where ImageNet images are shrunk.
  c.data.batch_size = 512
  c.data.eval_batch_size = 512
  c.accum_steps = 8  # 64 images at a time: fits B/16 at 384 px on one 16 GB accelerator.
  c.total_steps = steps
  c.optim.name = 'sgd'
  c.optim.lr = LR.get((dataset, variant), 0.03)  # The paper sweeps {0.001, 0.003, 0.01, 0.03}.
  c.optim.momentum = 0.9
  c.optim.mu_dtype = 'bfloat16'
  c.optim.weight_decay = 0.0
  c.optim.clip_norm = 1.0
  c.schedule.decay = 'cosine'
  c.schedule.warmup_steps = 500 if steps >= 5_000 else max(steps // 10, 1)
  c.ema_decay = 0.9999 if paper else None
  c.log_every = 10
  c.eval_every = min(1_000, steps)
  c.checkpoint_every = min(1_000, steps)
  return c
