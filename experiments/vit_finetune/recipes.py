"""Writes the fine-tuning recipes beside vision_transformer's, value by value, and the accuracies reported for
them, into experiments/vit_finetune/README.md.

python -m experiments.vit_finetune.recipes
Read from configs/vit/finetune.py, so the tables show what the configs set; nothing is trained.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.vit_finetune.recipes')

import os

from experiments import common
from vit_jax_lab import config as config_lib

VT = 'vision_transformer'


def config(arg: str):
  return config_lib.load(os.path.join(common.ROOT, f'configs/vit/finetune.py:{arg}'))


def recipe_rows() -> list[tuple[str, str, str, str]]:
  c, b32, l16 = config('cifar10,B/16'), config('cifar10,B/32'), config('imagenet2012,L/16')
  paper = config('imagenet2012,L/16,paper')
  crop = 'inception crop' if c.data.inception_crop else 'no crop'
  return [
    ('optimizer', 'SGD, momentum 0.9', f'{VT} `train.py`', f'{c.optim.name.upper()}, momentum {c.optim.momentum}'),
    ('momentum dtype', 'bfloat16', f'{VT} `configs/common.py`', str(c.optim.mu_dtype)),
    ('weight decay', '0', f'{VT} `train.py` (none)', f'{c.optim.weight_decay:g}'),
    (
      'global batch (accumulated)',
      '512 (8 x 64)',
      f'{VT} `configs/common.py`',
      f'{c.data.batch_size} ({c.accum_steps} x {c.data.batch_size // c.accum_steps})',
    ),
    ('gradient clipping (global norm)', '1', f'{VT} `configs/common.py`', f'{c.optim.clip_norm:g}'),
    (
      'schedule',
      'cosine, 500 warm-up steps',
      f'{VT} `configs/common.py`',
      f'{c.schedule.decay}, {c.schedule.warmup_steps} warm-up steps',
    ),
    (
      'steps: CIFAR / ImageNet',
      '10,000 / 20,000',
      f'{VT} `configs/common.py`',
      f'{c.total_steps:,} / {l16.total_steps:,}',
    ),
    (
      'lr: B/16 on CIFAR-10 / others',
      '0.01 / 0.03',
      f'{VT} `configs/vit.py`, `common.py`',
      f'{c.optim.lr:g} / {b32.optim.lr:g}',
    ),
    (
      'dropout: L/16, H/14 / others',
      '0.1 / 0',
      f'{VT} `configs/models.py`',
      f'{l16.model.dropout:g} / {c.model.dropout:g}',
    ),
    ('resolution', '384', f'{VT} `configs/common.py`', str(c.data.image_size)),
    (
      'training augmentation',
      'inception crop, flip',
      f'{VT} `input_pipeline.py`',
      f'{crop}, {"flip" if c.data.flip else "no flip"}',
    ),
    (
      'evaluation',
      'resize to 384 x 384',
      f'{VT} `input_pipeline.py`',
      'resize to 384 x 384' if c.data.resize_size is None else f'shorter side {c.data.resize_size}, central crop',
    ),
    (
      'resize method',
      'bilinear, not antialiased',
      f'{VT} `input_pipeline.py`',
      f'bilinear, {"antialiased" if c.data.antialias else "not antialiased"}',
    ),
    ('pixels', '[-1, 1]', f'{VT} `input_pipeline.py`', f'[{c.data.value_range[0]:g}, {c.data.value_range[1]:g}]'),
    (
      'held out of train',
      'CIFAR 2%, ImageNet 1%',
      f'{VT} `configs/common.py`',
      f'CIFAR {100 - int(c.data.train_split[7:-2])}%, ImageNet {100 - int(l16.data.train_split[7:-2])}%',
    ),
    (
      'ImageNet, paper Table 2 (`paper`)',
      '512 px, Polyak 0.9999',
      'ViT paper, appendix B.1.1',
      f'{paper.data.image_size} px, Polyak {paper.ema_decay:g}',
    ),
  ]


# (config argument, reference top-1 %, its source); the README column is the recipe's dropout setting.
ACCURACIES = [
  ('cifar10,B/16,500', 98.59, f'{VT} README, 500 steps'),
  ('cifar10,B/16,1000', 98.86, f'{VT} README, 1,000 steps'),
  ('cifar10,B/16', 99.02, f'{VT} README, dropout 0'),
  ('cifar100,B/16', 92.06, f'{VT} README, dropout 0'),
  ('cifar10,B/32', 98.88, f'{VT} README, dropout 0'),
  ('cifar100,B/32', 92.31, f'{VT} README, dropout 0'),
  ('cifar10,L/16', 99.14, f'{VT} README, dropout 0.1'),
  ('cifar100,L/16', 93.22, f'{VT} README, dropout 0.1'),
  ('imagenet2012,B/16', 84.53, f'{VT} README, dropout 0'),
  ('imagenet2012,B/32', 81.66, f'{VT} README, dropout 0'),
  ('imagenet2012,L/16', 85.05, f'{VT} README, dropout 0.1'),
  ('imagenet2012,L/16,paper', 85.30, 'ViT paper, Table 2 (ImageNet-21k row)'),
]


def accuracy_lines() -> list[str]:
  lines = [
    '| config argument | steps | px | dropout | reference top-1 | source | ours |',
    '|---|--:|--:|--:|--:|---|---|',
  ]
  for arg, top1, source in ACCURACIES:
    c = config(arg)
    lines.append(
      f'| `{arg}` | {c.total_steps:,} | {c.data.image_size} | {c.model.dropout:g} | {top1:.2f} | {source} | not run |'
    )
  return lines


if __name__ == '__main__':
  common.write_table(__file__, common.recipe_lines(recipe_rows()), marker='recipe')
  common.write_table(__file__, accuracy_lines(), marker='accuracies')
