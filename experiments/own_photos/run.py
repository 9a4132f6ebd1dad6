"""The own-photos command on folders a newcomer would bring (photos.py: 2 kinds, 100 pictures each, 20% held out),
over seeds: held-out accuracy of `python -m main --config vit/folder:FOLDER`, against chance (1/3).

python -m experiments.own_photos.run [SEEDS] [--scratch DIR]   # SEEDS: 3 by default (~8 minutes on 2 CPU cores)
Each run is its own command (experiments.common.train_all, two at a time on 2 cores); the folders are made once
under --scratch from fixed seeds, and the table is written into README.md.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.own_photos.run')

import argparse
import os

from experiments import common
from experiments.own_photos import photos

ROWS = {  # The command as a user runs it; recipes to try go beside it.
  'vit/folder as it is': {},
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('seeds', nargs='?', type=int, default=3)
  parser.add_argument('--scratch', default='/tmp/own_photos')
  parser.add_argument('--rows', default=','.join(ROWS), help='which rows, by name, comma-separated (names have none)')
  args = parser.parse_args()
  rows = [r for r in ROWS if r in args.rows.split(',')]
  folders = {}
  for kind in photos.KINDS:
    folders[kind] = os.path.join(args.scratch, 'photos', kind)
    if not os.path.isdir(folders[kind]):
      photos.make(folders[kind], kind, seed=0)
  runs, keys = [], []
  for row in rows:
    for kind, folder in folders.items():
      for seed in range(args.seeds):
        workdir = os.path.join(args.scratch, 'runs', f'{list(ROWS).index(row)}_{kind}_{seed}')
        runs.append((f'configs/vit/folder.py:{folder}', workdir, {'seed': seed, **ROWS[row]}))
        keys.append((row, kind))
  results = common.train_all(runs, jobs=min(2, len(common.pinnable_cores())))
  accuracy, held_out = {}, {}
  for key, metrics in zip(keys, results):
    accuracy.setdefault(key, []).append(100 * metrics['eval/accuracy'])
    held_out[key[1]] = int(metrics['eval/examples'])
  lines = ['| recipe | ' + ' | '.join(f'{kind} (held-out %)' for kind in photos.KINDS) + ' |']
  lines.append('|---|' + '---:|' * len(photos.KINDS))
  for row in rows:
    cells = [common.mean_spread(accuracy[row, kind], 1) for kind in photos.KINDS]
    lines.append(f'| {row} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  counts = ', '.join(f'{kind} {n}' for kind, n in held_out.items())
  lines.append(f'Mean ± standard deviation over {args.seeds} seeds; held-out pictures: {counts}; chance 33.3%.')
  each = '; '.join(f'{row}, {kind}: {", ".join(f"{a:.0f}" for a in v)}' for (row, kind), v in accuracy.items())
  lines.append(f'Each run: {each}.')
  common.write_table(__file__, lines)


if __name__ == '__main__':
  main()
