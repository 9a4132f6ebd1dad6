"""Writes the GOT-10k tracking recipe beside OSTrack-256's, value by value, and the published scores beside ours,
into experiments/tracking_benchmarks/README.md.

python -m experiments.tracking_benchmarks.recipes
Read from configs/tracking/got10k.py, so the tables show what the config sets; nothing is trained.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.tracking_benchmarks.recipes')

import os

from experiments import common
from vit_jax_lab import config as config_lib

OSTRACK = 'OSTrack `vitb_256_mae_ce_32x4_got10k_ep100.yaml`'
PAIRS_PER_EPOCH = 60_000  # OSTrack's SAMPLE_PER_EPOCH.


def recipe_rows() -> list[tuple[str, str, str, str]]:
  c = config_lib.load(os.path.join(common.ROOT, 'configs/tracking/got10k.py'))
  d, o, m, t = c.data, c.optim, c.model, c.task
  epochs = c.total_steps * d.batch_size / PAIRS_PER_EPOCH
  return [
    ('initialisation', 'MAE ViT-B/16', OSTRACK, f'{os.path.basename(c.init_from)} (supervised, ImageNet-21k)'),
    ('box head', 'centre (heat map, offset, size)', OSTRACK, f'{m.box_head}, {m.corner_channels} channels'),
    ('template: size, factor', '128, 2', OSTRACK, f'{d.template_size}, {d.template_factor:g}'),
    ('search: size, factor', '256, 4', OSTRACK, f'{d.search_size}, {d.search_factor:g}'),
    ('search jitter: centre, scale', '3, 0.25', OSTRACK, f'{d.centre_jitter:g}, {d.size_jitter:g}'),
    ('largest template-search gap (frames)', '200', OSTRACK, str(d.max_gap)),
    ('trained on', 'GOT-10k train', OSTRACK, f'{d.name.split("/")[-1]} {d.train_split}'.replace('got10k', 'GOT-10k')),
    ('loss weights: L1, GIoU', '5, 2', OSTRACK, f'{t.l1_weight:g}, {t.giou_weight:g}'),
    (
      'optimizer, lr, weight decay',
      'AdamW, 0.0004, 0.0001',
      OSTRACK,
      f'{o.name.replace("adamw", "AdamW")}, {o.lr:g}, {o.weight_decay:g}',
    ),
    ('backbone lr multiplier', '0.1', OSTRACK, '1 (no per-layer multiplier)'),
    ('schedule', 'step: x0.1 at epoch 80', OSTRACK, f'{c.schedule.warmup_steps} warm-up steps, {c.schedule.decay}'),
    ('pairs per batch, epochs of 60,000 pairs', '128, 100', OSTRACK, f'{d.batch_size}, {epochs:.0f}'),
    ('gradient clipping, stochastic depth', '0.1, 0.1', OSTRACK, f'{o.clip_norm:g}, {m.drop_path:g}'),
    ('candidate elimination', 'layers 3, 6, 9, keep 0.7', OSTRACK, 'none'),
  ]


def score_lines() -> list[str]:
  from configs.tracking import got10k  # The published numbers live beside the recipe.

  lines = ['| evaluated on | score | OSTrack-256 | ours |', '|---|---|--:|---|']
  for benchmark, split, score in (
    ('got10k', 'test', 'AO (server, from tools.results)'),  # GOT-10k withholds its test boxes.
    ('got10k', 'val', 'AO'),
    ('otb100', 'test', 'success AUC'),
    ('uav123', 'test', 'success AUC'),
    ('lasot', 'test', 'success AUC'),
  ):
    published = got10k.PUBLISHED.get((benchmark, split))
    reference = f'{published[1]}' if published and score.startswith(published[0]) else '—'
    lines.append(f'| {benchmark} {split} | {score} | {reference} | not run |')
  return lines


if __name__ == '__main__':
  common.write_table(__file__, common.recipe_lines(recipe_rows()), marker='recipe')
  common.write_table(__file__, score_lines(), marker='scores')
