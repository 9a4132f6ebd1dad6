"""The vision row: ViViT model 1 on the built-in moving digits with local attention against full, 3 seeds each.

python -m experiments.lra_listops.vision     # rewrites the vision table of README.md (about 6 minutes)
Each run is configs/vivit/moving_digits.py:spatiotemporal as it stands (4 x 5 x 5 tubelets, 100 tokens), with
model.attention='local' and model.attention_window=1: each tubelet sees its 3 x 3 x 3 neighbourhood, 27 of the
100 tokens at most. Trained and evaluated in this one process, one run after another.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.lra_listops.vision')

import os
import statistics
import tempfile

from experiments import common
from vit_jax_lab import config as config_lib, parallel

SPEC = 'configs/vivit/moving_digits.py:spatiotemporal'
SEEDS = (0, 1, 2)
PATTERNS = {'full': {}, 'local': {'model.attention': 'local', 'model.attention_window': 1}}


def main() -> None:
  parallel.use_cpu_cores(config_lib.load(os.path.join(common.ROOT, SPEC)))  # One device per core, as `python -m main`.
  parallel.enable_compilation_cache()
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for name, options in PATTERNS.items():
      accuracies, steps = [], []
      for seed in SEEDS:
        workdir = os.path.join(tmp, f'{name}_{seed}')
        accuracies.append(100 * common.train(SPEC, workdir, {**options, 'seed': seed})['eval/accuracy'])
        steps.append(common.step_seconds(workdir))
        print(name, seed, accuracies[-1], steps[-1], flush=True)
      rows.append((name, accuracies, 1000 * statistics.median(steps)))
  lines = [
    '| ViViT model 1, moving digits | test top-1 (%) | seeds 0 / 1 / 2 | step time (ms) |',
    '|---|---:|---|---:|',
  ]
  for name, accuracies, step in rows:
    spread = common.mean_spread(accuracies)
    lines.append(f'| {name} | {spread} | {" / ".join(f"{a:.2f}" for a in accuracies)} | {step:.1f} |')
  common.write_table(__file__, lines, marker='vision')


if __name__ == '__main__':
  main()
