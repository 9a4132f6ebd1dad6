"""The own-photos command on folders a newcomer would bring (photos.py: 2 kinds, 100 pictures each, 20% held out),
over seeds: held-out accuracy of `python -m main --config vit/folder:FOLDER`, against chance (1/3).

python -m experiments.own_photos.run [SEEDS] [--scratch DIR]   # SEEDS: 3 by default (~47 minutes on 2 CPU cores)
Each run is its own command (experiments.common.train_all, two at a time on 2 cores); the folders are made once
under --scratch from fixed seeds, and the table is written into README.md. A last row trains once on folders of
another seed, which no recipe was chosen on.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.own_photos.run')

import argparse
import json
import os
import subprocess
import sys

from experiments import common
from experiments.own_photos import photos

MORE = 300  # Pictures of each kind drawn from another seed, which every run also predicts: 23 or 13 held out are few.

ROWS = {  # The command as a user runs it on folders of seed 0; recipes to try go beside it.
  'vit/folder as it is': {},
}
CHECK_SEED = 7  # The recipe was chosen on seed 0's folders: once more, on folders drawn from a seed used nowhere else.
CHECK_ROW = f'vit/folder as it is, folders of seed {CHECK_SEED}'


def predicted(workdir: str, folder: str) -> float:
  """The share of the pictures in `folder` (one folder per class) that `tools.predict` on the run puts in their
  class, as a user checks a run on new pictures."""
  files = sorted(os.path.join(folder, c, f) for c in os.listdir(folder) for f in os.listdir(os.path.join(folder, c)))
  out = os.path.join(workdir, 'more.jsonl')
  if not os.path.exists(out):
    command = [sys.executable, '-m', 'vit_jax_lab.tools.predict', '--workdir', workdir, '--top_k', '1']
    subprocess.run([*command, '--out', out, *files], cwd=common.ROOT, check=True, stdout=subprocess.DEVNULL)
  with open(out) as f:
    rows = [json.loads(line) for line in f]
  return sum(r['top_k'][0][0] == os.path.basename(os.path.dirname(r['input'])) for r in rows) / len(rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('seeds', nargs='?', type=int, default=3)
  parser.add_argument('--scratch', default='/tmp/own_photos')
  parser.add_argument('--rows', default=','.join(ROWS), help='which rows, by name, comma-separated (names have none)')
  args = parser.parse_args()
  rows = [r for r in ROWS if r in args.rows.split(',')]
  runs, keys, workdirs, more, folder_seeds = [], [], [], {}, {}
  table = [*((row, i, 0, args.seeds) for i, row in enumerate(ROWS) if row in rows), (CHECK_ROW, 'check', CHECK_SEED, 1)]
  for row, name, folder_seed, seeds in table:
    folder_seeds[row] = folder_seed
    for kind in photos.KINDS:
      folder = os.path.join(args.scratch, f'photos_{folder_seed}', kind)
      more[row, kind] = os.path.join(args.scratch, f'more_{folder_seed + 1}', kind)
      for root, photo_seed, count in ((folder, folder_seed, 100), (more[row, kind], folder_seed + 1, MORE)):
        if not os.path.isdir(root):
          photos.make(root, kind, seed=photo_seed, count=count)
      for seed in range(seeds):
        workdirs.append(os.path.join(args.scratch, 'runs', f'{name}_{kind}_{seed}'))
        runs.append((f'configs/vit/folder.py:{folder}', workdirs[-1], {'seed': seed, **ROWS.get(row, {})}))
        keys.append((row, kind))
  results = common.train_all(runs, jobs=min(2, len(common.pinnable_cores())))
  accuracy, on_more, held_out = {}, {}, {}
  for key, metrics, workdir in zip(keys, results, workdirs):
    accuracy.setdefault(key, []).append(100 * metrics['eval/accuracy'])
    on_more.setdefault(key, []).append(100 * predicted(workdir, more[key]))
    held_out.setdefault(folder_seeds[key[0]], {})[key[1]] = int(metrics['eval/examples'])
  header = [f'{kind} (held-out %) | {kind} ({MORE} more, %)' for kind in photos.KINDS]
  lines = ['| recipe | ' + ' | '.join(header) + ' |', '|---|' + '---:|' * 2 * len(photos.KINDS)]
  for row in [*rows, CHECK_ROW]:
    cells = [
      f'{common.mean_spread(accuracy[row, k], 1)} | {common.mean_spread(on_more[row, k], 1)}' for k in photos.KINDS
    ]
    lines.append(f'| {row} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  counts = '; '.join(
    f'seed {s}, ' + ', '.join(f'{k} {n}' for k, n in by_kind.items()) for s, by_kind in held_out.items()
  )
  lines.append(
    f'Mean ± standard deviation over {args.seeds} seeds (the last row: 1 run); held-out pictures of the folders of '
    f"{counts}; {MORE} more of each kind drawn from the folder's seed + 1 (photos.py), predicted by each run "
    '(tools.predict); chance 33.3%.'
  )
  each = '; '.join(f'{row}, {kind}: {", ".join(f"{a:.0f}" for a in v)}' for (row, kind), v in accuracy.items())
  lines.append(f'Each run: {each}.')
  minutes = [common.wall(w)['seconds'] / 60 for w in workdirs]
  shortest, longest = (f'{m:.1f}' for m in (min(minutes), max(minutes)))
  took = shortest if shortest == longest else f'{shortest}-{longest}'
  lines.append(f'A run took {took} minutes on one CPU core, two runs at a time.')
  common.write_table(__file__, lines)


if __name__ == '__main__':
  main()
