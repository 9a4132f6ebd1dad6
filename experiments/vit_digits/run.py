"""Trains configs/vit/digits.py with seeds 0, 1, 2 and prints the markdown table of the README.

python experiments/vit_digits/run.py [--workdir runs/vit_digits_seeds]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--workdir', default=os.path.join(ROOT, 'runs', 'vit_digits_seeds'))
  parser.add_argument('--seeds', default='0,1,2')
  args = parser.parse_args()
  rows = []
  for seed in map(int, args.seeds.split(',')):
    workdir = os.path.join(args.workdir, f'seed{seed}')
    command = [
      sys.executable,
      '-m',
      'main',
      '--config',
      'configs/vit/digits.py',
      '--workdir',
      workdir,
      f'--config.seed={seed}',
    ]
    start = time.time()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - start
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      final = [m for m in map(json.loads, f) if 'eval/accuracy' in m][-1]
    rows.append((seed, final['step'], 100 * final['eval/accuracy'], wall))
  accuracies = [r[2] for r in rows]
  mean = sum(accuracies) / len(accuracies)
  std = (sum((a - mean) ** 2 for a in accuracies) / max(len(accuracies) - 1, 1)) ** 0.5
  print(f'Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only\n')
  print('| seed | steps | test top-1 (%) | wall time, whole command (s) |')
  print('|---|---|---|---|')
  for seed, step, acc, wall in rows:
    print(f'| {seed} | {step} | {acc:.2f} | {wall:.0f} |')
  print(f'| mean ± std | | {mean:.2f} ± {std:.2f} | {sum(r[3] for r in rows) / len(rows):.0f} |')


if __name__ == '__main__':
  main()
