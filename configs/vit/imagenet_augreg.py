"""AugReg (Steiner et al. 2021, "How to train your ViT?"): ViT from scratch on ImageNet-1k, 300 epochs at 224 px.

Argument: VARIANT[,AUG][,reg]. VARIANT: Ti/16, S/32, S/16, B/32, B/16 or L/16. AUG, the paper's augmentation levels
(RandAugment layers, magnitude; mixup alpha):
  none: -, -          light1: 2, 0; -        light2: 2, 10; 0.2
  medium1: 2, 15; 0.2  medium2: 2, 15; 0.5    strong1: 2, 20; 0.5    strong2: 2, 20; 0.8
Without AUG, big_vision's choice for the variant (Ti/16 light1, S/32 light2, the others medium2). `reg` adds the
paper's regularisation, dropout 0.1 and stochastic depth 0.1 (the `do_0.1-sd_0.1` of its released checkpoints);
without it both are 0.

Every value is big_vision's `configs/vit_i1k.py`, the paper's training code: train[:99%] (the last 1% is its minival),
global batch 4096, 300 epochs (92,897 steps), Adam (b1 0.9, b2 0.999, first moment in bfloat16), lr 1e-3 with 10k
linear warm-up steps then cosine decay, weight decay 1e-4 decoupled from the learning rate (here AdamW's 0.1, which
optax multiplies by lr 1e-3: the same 1e-4 x schedule per step), gradient clipping at global norm 1, no label
smoothing; a class token and a tanh pre-logits layer of the model width (`rep_size=True`), tanh GELU; inception crop
(5%-100% of the area) and flip, then RandAugment, pixels in [-1, 1]; evaluation resizes the shorter side to 256 and
takes the central 224.

Reference numbers. The checkpoints the paper released and timm serves as the best ImageNet-1k-only models
(`vit_*_224.augreg_in1k` in timm's `vision_transformer.py`) are S/16 medium2, B/32 medium2 + reg and B/16 strong2 +
reg, at weight decay 0.1 (their names end in `--imagenet2012-steps_20k-lr_0.01-res_224`: they were fine-tuned once
more at 224 px after pre-training). Their accuracies are plotted in the paper's figures; no top-1 value of these runs
could be checked against a source available offline here, so none is quoted: see the paper and its index.csv.

Where this config differs: RandAugment uses the paper's 14 ops with strength growing with m (vit_jax_lab/data/
augment.py); big_vision's copy of the TF TPU ops adds invert, cutout and solarize-add and maps m to posterize, solarize
and the four enhance ops so that their strength does not grow with m (its `light1`, m = 0, is "actually not nothing":
it solarizes every pixel and posterizes to 0 bits; here m = 0 leaves all but autocontrast and equalize the identity).
AugReg's magnitudes were tuned with big_vision's mapping. Training computes in bfloat16 (float32 parameters), as
TPUs multiply.

python -m main --config configs/vit/imagenet_augreg.py:B/16,medium2 --workdir runs/augreg_b16 \\
    --config.data.data_dir=/datasets/tfds
"""

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.models import release

AUG = {  # big_vision configs/vit_i1k.py: RANDAUG_DEF (layers, magnitude) and MIXUP_DEF (p, the Beta alpha).
  'none': (0, 0.0, 0.0),
  'light1': (2, 0.0, 0.0),
  'light2': (2, 10.0, 0.2),
  'medium1': (2, 15.0, 0.2),
  'medium2': (2, 15.0, 0.5),
  'strong1': (2, 20.0, 0.5),
  'strong2': (2, 20.0, 0.8),
}
DEFAULT_AUG = {'Ti/16': 'light1', 'S/32': 'light2', 'S/16': 'medium2', 'B/32': 'medium2', 'B/16': 'medium2'}
VARIANTS = ('Ti/16', 'S/32', 'S/16', 'B/32', 'B/16', 'L/16')
TRAIN_EXAMPLES = 1_268_355  # ImageNet-1k train[:99%].
BATCH, EPOCHS = 4096, 300


def get_config(arg: str | None = None):
  parts = (arg or '').split(',')
  reg = parts[-1] == 'reg'
  parts = parts[:-1] if reg else parts
  if not 1 <= len(parts) <= 2 or parts[0] not in VARIANTS or (len(parts) == 2 and parts[1] not in AUG):
    raise config_lib.ConfigError(
      f'configs/vit/imagenet_augreg.py takes VARIANT[,AUG][,reg] with VARIANT one of {", ".join(VARIANTS)} and AUG '
      f'one of {", ".join(AUG)}, got {arg!r}'
    )
  variant = parts[0]
  aug = parts[1] if len(parts) == 2 else DEFAULT_AUG.get(variant, 'medium2')
  layers, magnitude, mixup = AUG[aug]
  width = models.vit.decode_variant(variant)['width']

  c = config_lib.base_config()
  c.model = models.config(
    'vit',
    variant=variant,
    pool='tok',
    posemb='learn',
    representation_size=width,
    dropout=0.1 if reg else 0.0,
    drop_path=0.1 if reg else 0.0,
    head_zero_init=True,
    **release.RELEASE_OPTIONS,
  )
  c.task = tasks.config('classification', mixup=mixup)
  c.data.name = 'imagenet2012'
  c.data.train_split, c.data.eval_split = 'train[:99%]', 'validation'
  c.data.image_size, c.data.resize_size = 224, 256
  c.data.inception_crop = True
  c.data.flip = True
  c.data.augment_on = 'device'  # Flip and RandAugment in the jitted step (data/device.py), and the crop's resize:
  c.data.canvas = 2.0  # the host decodes the crop's window and hands it over in a canvas twice image_size.
  c.data.randaugment_layers, c.data.randaugment_magnitude = layers, magnitude
  c.data.batch_size = BATCH
  c.data.eval_batch_size = 1024
  c.data.shuffle_buffer = 250_000
  c.compute_dtype = 'bfloat16'
  c.optim.name = 'adamw'
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.1
  c.optim.b1, c.optim.b2 = 0.9, 0.999
  c.optim.mu_dtype = 'bfloat16'
  c.optim.clip_norm = 1.0
  c.schedule.decay = 'cosine'
  c.schedule.warmup_steps = 10_000
  c.total_steps = EPOCHS * TRAIN_EXAMPLES // BATCH
  c.log_every = 50
  c.eval_every = 2_500
  c.checkpoint_every = 1_000
  return c
