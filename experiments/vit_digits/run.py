"""Trains configs/vit/digits.py with seeds 0, 1, 2 and writes the table of README.md.

python -m experiments.vit_digits.run [--workdir runs/vit_digits_seeds] [--seeds 0,1,2]
Each run is the command `python -m main --config configs/vit/digits.py --config.seed=SEED`, timed whole, in a
workdir of its own under --workdir (a finished one is read back, not rerun).
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.vit_digits.run')

import argparse
import os
import platform

from experiments import common


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m experiments.vit_digits.run')
  parser.add_argument('--workdir', default=os.path.join(common.ROOT, 'runs', 'vit_digits_seeds'))
  parser.add_argument('--seeds', default='0,1,2')
  args = parser.parse_args()
  rows = []
  for seed in map(int, args.seeds.split(',')):
    workdir = os.path.join(args.workdir, f'seed{seed}')
    final = common.train('configs/vit/digits.py', workdir, {'seed': seed}, separate=True)
    rows.append((seed, final['step'], 100 * final['eval/accuracy'], common.wall(workdir)['seconds']))
  accuracies = [r[2] for r in rows]
  mean = sum(accuracies) / len(accuracies)
  std = (sum((a - mean) ** 2 for a in accuracies) / max(len(accuracies) - 1, 1)) ** 0.5
  print(f'Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only\n')
  lines = ['| seed | steps | test top-1 (%) | wall time, whole command (s) |', '|---|---|---|---|']
  for seed, step, acc, wall in rows:
    lines.append(f'| {seed} | {step} | {acc:.2f} | {wall:.0f} |')
  lines.append(f'| mean ± std | | {mean:.2f} ± {std:.2f} | {sum(r[3] for r in rows) / len(rows):.0f} |')
  common.write_table(__file__, lines)


if __name__ == '__main__':
  main()
