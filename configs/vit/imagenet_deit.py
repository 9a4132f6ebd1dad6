"""DeiT (Touvron et al. 2021): ViT-Ti/16, S/16 or B/16 trained from scratch on ImageNet-1k alone, 300 epochs at 224 px.

Argument: Ti | S | B. Published ImageNet-1k top-1 (224 px, single crop; the paper's Table 1, without distillation):
DeiT-Ti 72.2, DeiT-S 79.8 (79.9 in the repository's model zoo), DeiT-B 81.8.

DeiT's recipe (its `main.py` defaults, which its README's training commands keep for all three models): AdamW, lr
5e-4 x batch / 512, weight decay 0.05, no gradient clipping, 5 warm-up epochs, then cosine decay to 1e-5; label
smoothing 0.1; inception crop (random-resized crop) and flip; RandAugment n=2, m=9 (timm's `rand-m9-mstd0.5-inc1`);
mixup 0.8 and CutMix 1.0, one of them per batch with switch probability 0.5; random erasing 0.25; repeated
augmentation (3 copies); stochastic depth 0.1 for every size (the `--drop-path` default; none of the README's
commands changes it, so DeiT-Ti uses 0.1 too); no dropout; evaluation resizes the shorter side to 256 and takes the
central 224 (crop ratio 0.875).

Where this config differs, and why:
- Batch 1152 instead of 1024 (lr 5e-4 x 1152 / 512 = 1.125e-3 by DeiT's own rule, 300 epochs = 333,600 steps):
  repeated augmentation puts whole groups of 3 copies in each batch of every data shard, so batches per process
  must divide by 3; 1152 = 9 x 128 does on 1-128 processes and devices. (DeiT's sampler deals copies to GPUs by index
  and needs no such rounding.)
- RandAugment applies one of the paper's 14 ops per layer always, without timm's magnitude noise (mstd0.5) or its
  op probability 0.5, and timm's list adds invert and solarize-add (vit_jax_lab/data/augment.py). The inception crop
  takes 5%-100% of the area (big_vision's default) rather than timm's 8%-100%; random erasing's noise is N(0, 1) in
  the (-1, 1) value range rather than in ImageNet-normalised pixels.
- DeiT's `main.py` also keeps an exponential moving average of the weights (decay 0.99996); it is off here
  (`--config.ema_decay=0.99996` turns it on, and evaluation then scores the average). Training is in bfloat16 (DeiT:
  float16 AMP); timm's exact GELU, LayerNorm epsilon 1e-6, the head initialised like every dense layer.

python -m main --config configs/vit/imagenet_deit.py:S --workdir runs/deit_s --config.data.data_dir=/datasets/tfds
ImageNet (`imagenet2012`) must be prepared in data_dir: `tfds build imagenet2012 --manual_dir ...` where the
archives are.
"""

from vit_jax_lab import config as config_lib, models, tasks

TOP1 = {'Ti': 72.2, 'S': 79.8, 'B': 81.8}  # DeiT paper, Table 1 (ImageNet-1k val top-1, 224 px).
TRAIN_EXAMPLES = 1_281_167  # ImageNet-1k train.
BATCH = 1152
EPOCHS, WARMUP_EPOCHS = 300, 5


def get_config(arg: str | None = None):
  if arg not in TOP1:
    raise config_lib.ConfigError(f'configs/vit/imagenet_deit.py takes Ti, S or B, got {arg!r}')
  steps_per_epoch = TRAIN_EXAMPLES // BATCH  # Full batches only, as DeiT's loader drops the last.

  c = config_lib.base_config()
  c.model = models.config(
    'vit', variant=f'{arg}/16', pool='tok', posemb='learn', drop_path=0.1, gelu_approximate=False, head_zero_init=False
  )
  c.task = tasks.config('classification', label_smoothing=0.1, mixup=0.8, cutmix=1.0, mix_switch_prob=0.5)
  c.data.name = 'imagenet2012'
  c.data.train_split, c.data.eval_split = 'train', 'validation'
  c.data.image_size, c.data.resize_size = 224, 256  # Evaluation: shorter side 256, central 224.
  c.data.inception_crop = True
  c.data.flip = True
  c.data.augment_on = 'device'  # Flip and RandAugment in the jitted step (data/device.py), and the crop's resize:
  c.data.canvas = 2.0  # the host decodes the crop's window and hands it over in a 448-pixel canvas.
  c.data.randaugment_layers, c.data.randaugment_magnitude = 2, 9.0
  c.data.random_erasing = 0.25
  c.data.repeated_augment = 3
  c.data.batch_size = BATCH
  c.data.eval_batch_size = 1024
  c.data.shuffle_buffer = 250_000
  c.compute_dtype = 'bfloat16'
  c.optim.name = 'adamw'
  c.optim.lr = 5e-4 * BATCH / 512
  c.optim.weight_decay = 0.05
  c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.999, 1e-8
  c.optim.clip_norm = 0.0
  c.schedule.decay = 'cosine'
  c.schedule.warmup_steps = WARMUP_EPOCHS * steps_per_epoch
  c.schedule.end_factor = 1e-5 / c.optim.lr  # DeiT's min_lr.
  c.total_steps = EPOCHS * steps_per_epoch
  c.log_every = 100
  c.eval_every = 10 * steps_per_epoch
  c.checkpoint_every = steps_per_epoch
  return c
