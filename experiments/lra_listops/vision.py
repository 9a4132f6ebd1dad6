"""The vision row: ViViT model 1 on the built-in moving digits with local attention against full, 3 seeds each.

python experiments/lra_listops/vision.py     # rewrites the vision table of README.md (about 6 minutes)
Each run is configs/vivit/moving_digits.py:spatiotemporal as it stands (4 x 5 x 5 tubelets, 100 tokens), with
model.attention='local' and model.attention_window=1: each tubelet sees its 3 x 3 x 3 neighbourhood, 27 of the
100 tokens at most. Trained and evaluated in this one process, one run after another.
"""

import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments import common  # noqa: E402
from vit_jax_lab import config as config_lib, parallel, train  # noqa: E402

SEEDS = (0, 1, 2)
PATTERNS = {'full': {}, 'local': {'attention': 'local', 'attention_window': 1}}


def config(options: dict, seed: int):
  c = config_lib.load(os.path.join(ROOT, 'configs/vivit/moving_digits.py:spatiotemporal'))
  c.model.update(**options)
  c.seed = seed
  return c


def main() -> None:
  parallel.use_cpu_cores(config({}, 0))  # One CPU device per core, as `python -m main` runs.
  parallel.enable_compilation_cache()
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for name, options in PATTERNS.items():
      accuracies, steps = [], []
      for seed in SEEDS:
        workdir = os.path.join(tmp, f'{name}_{seed}')
        accuracies.append(100 * train.train_and_evaluate(config(options, seed), workdir)['eval/accuracy'])
        steps.append(common.step_seconds(workdir))
        print(name, seed, accuracies[-1], steps[-1], flush=True)
      rows.append((name, accuracies, 1000 * statistics.median(steps)))
  lines = [
    '| ViViT model 1, moving digits | test top-1 (%) | seeds 0 / 1 / 2 | step time (ms) |',
    '|---|---:|---|---:|',
  ]
  for name, accuracies, step in rows:
    spread = f'{statistics.mean(accuracies):.2f} ± {statistics.stdev(accuracies):.2f}'
    lines.append(f'| {name} | {spread} | {" / ".join(f"{a:.2f}" for a in accuracies)} | {step:.1f} |')
  common.write_table(__file__, lines, marker='vision')


if __name__ == '__main__':
  main()
