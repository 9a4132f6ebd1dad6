"""Writes the ViViT Kinetics-400 recipes beside scenic's, value by value, and the accuracies reported for them,
into experiments/vivit_kinetics400/README.md.

python -m experiments.vivit_kinetics400.recipes
Read from configs/vivit/kinetics400.py, so the tables show what the config sets; nothing is trained.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.vivit_kinetics400.recipes')

import os

from experiments import common
from vit_jax_lab import config as config_lib

SCENIC = 'scenic `vivit_base_k400.py`, `vivit_base_factorised_encoder.py`'  # projects/vivit/configs/kinetics400/
TRAIN_SIZE = 214_834  # scenic's KINETICS_400_TRAIN_SIZE.


def config(model: str):
  return config_lib.load(os.path.join(common.ROOT, f'configs/vivit/kinetics400.py:{model}'))


def recipe_rows() -> list[tuple[str, str, str, str]]:
  m1, m2 = config('spatiotemporal'), config('factorised_encoder')
  d, o, epoch = m2.data, m2.optim, TRAIN_SIZE // m2.data.batch_size
  return [
    ('initialisation', 'imagenet21k/ViT-B_16.npz', SCENIC, '/'.join(m2.init_from.split('/')[-2:])),
    ('model, tubelet initialisation', 'B/16x2, central_frame', SCENIC, f'{m2.model.variant}, {m2.model.tubelet_init}'),
    ('model 2 temporal layers', '4', SCENIC, str(m2.model.temporal_depth)),
    ('frames, stride', '32, 2', SCENIC, f'{d.num_frames}, {d.frame_stride}'),
    ('shorter side, crop', '256, 224', SCENIC, f'{d.resize_size}, {d.image_size}'),
    (
      'scale jitter (h and w apart)',
      '0.9-1.33, p = 1',
      SCENIC,
      f'{d.scale_jitter[0]:g}-{d.scale_jitter[1]:g}, p = 1' if tuple(d.scale_jitter) != (1.0, 1.0) else 'none',
    ),
    ('colour augmentation, colour drop', 'p = 0.8, p = 0.1', SCENIC, f'p = {d.color_augment:g}, p = {d.color_drop:g}'),
    ('flip', 'yes', 'scenic `dataset_lib/video_ops.py`', 'yes' if d.flip else 'no'),
    ('optimizer', 'SGD, momentum 0.9', SCENIC, f'{o.name.upper()}, momentum {o.momentum}'),
    ('lr: model 1 / model 2', '0.1 / 0.05', SCENIC, f'{m1.optim.lr:g} / {o.lr:g}'),
    (
      'schedule',
      'cosine, 2.5 epochs warm-up',
      SCENIC,
      f'{m2.schedule.decay}, {m2.schedule.warmup_steps / epoch:g} epochs warm-up',
    ),
    ('epochs, batch', '30, 64', SCENIC, f'{m2.total_steps / epoch:g}, {d.batch_size}'),
    (
      'weight decay, clipping, label smoothing',
      '0, 1, none',
      SCENIC,
      f'{o.weight_decay:g}, {o.clip_norm:g}, {m2.task.label_smoothing or "none"}',
    ),
    ('dropout, stochastic depth', '0, 0', SCENIC, f'{m2.model.dropout:g}, {m2.model.drop_path:g}'),
    ('evaluation views', '4 clips x 3 crops', SCENIC, f'{d.eval_clips} clips x {d.eval_crops} crops'),
    ('evaluated on', 'test', 'ViViT paper, scenic README', d.eval_split),
  ]


def accuracy_lines() -> list[str]:
  from configs.vivit import kinetics400  # The published numbers live beside the recipe.

  lines = ['| model | paper (Table 2) | scenic release | ours |', '|---|--:|--:|---|']
  for model, name in (
    ('spatiotemporal', 'model 1, spatio-temporal'),
    ('factorised_encoder', 'model 2, factorised encoder'),
  ):
    lines.append(f'| {name} | {kinetics400.PUBLISHED_TOP1[model]} | {kinetics400.SCENIC_TOP1[model]} | not run |')
  return lines


if __name__ == '__main__':
  common.write_table(__file__, common.recipe_lines(recipe_rows()), marker='recipe')
  common.write_table(__file__, accuracy_lines(), marker='accuracies')
