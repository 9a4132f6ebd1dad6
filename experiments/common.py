"""What the experiment scripts share: runs trained once and read back, step times, and the tables they write into
READMEs."""

import json
import os
import subprocess
import sys
import time

import numpy as np


def train_once(spec: str, workdir: str, seed: int, data_dir: str | None) -> float:
  """Runs `python -m main --config spec --config.seed=SEED` in `workdir` unless it finished before; the seconds that
  command took (kept in the workdir, so a table rewritten later reports the run's own time)."""
  wall_file = os.path.join(workdir, 'wall_seconds.json')
  if not os.path.exists(wall_file):
    command = [sys.executable, '-m', 'main', '--config', spec, '--workdir', workdir, f'--config.seed={seed}']
    command += [f'--config.data.data_dir={data_dir}'] if data_dir else []
    start = time.time()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(command, cwd=root, check=True, stdout=subprocess.DEVNULL)
    with open(wall_file, 'w') as f:
      json.dump(time.time() - start, f)
  with open(wall_file) as f:
    return json.load(f)


def step_seconds(workdir: str) -> float:
  """Median seconds per train step of a finished run, from its metrics.jsonl; the first logging interval
  (which holds the compilation) is left out."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rates = [m['train/steps_per_sec'] for m in map(json.loads, f) if 'train/steps_per_sec' in m]
  return 1.0 / float(np.median(rates[1:] or rates))


def write_table(script: str, lines: list[str], marker: str = 'table') -> None:
  """Rewrites what lies between `<!-- marker -->` and `<!-- /marker -->` in the README.md beside the
  experiment `script` (its __file__) with `lines`, and prints them. The prose around stays hand-written."""
  path = os.path.join(os.path.dirname(os.path.abspath(script)), 'README.md')
  begin, end = f'<!-- {marker} -->', f'<!-- /{marker} -->'
  with open(path) as f:
    text = f.read()
  if begin not in text or end not in text:
    raise ValueError(f'{path} has no {begin} ... {end} markers to write between')
  start, stop = text.index(begin) + len(begin), text.index(end)
  table = '\n'.join(lines)
  with open(path, 'w') as f:
    f.write(text[:start] + '\n' + table + '\n' + text[stop:])
  print(table)


def recipe_lines(rows: list[tuple[str, str, str, str]]) -> list[str]:
  """A recipe beside its reference: rows of (setting, reference value, source of that value, our config's
  value), marked = where they agree."""
  lines = ['| setting | reference | source | ours | |', '|---|---|---|---|:-:|']
  for setting, reference, source, ours in rows:
    lines.append(f'| {setting} | {reference} | {source} | {ours} | {"=" if ours == reference else "≠"} |')
  return lines


def config_of(spec: str):
  """The config file `spec` (path[:arg], relative to the repository) as a run would load it."""
  from vit_jax_lab import config as config_lib

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return config_lib.load(os.path.join(root, spec))
