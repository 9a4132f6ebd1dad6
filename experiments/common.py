"""What the experiment scripts share: runs trained once and read back, step times, and the tables they write into
READMEs."""

import concurrent.futures
import json
import os
import queue
import shutil
import subprocess
import sys
import time

import numpy as np


def train_once(spec: str, workdir: str, seed: int, data_dir: str | None, cores: list[int] | None = None) -> float:
  """Runs `python -m main --config spec --config.seed=SEED` in `workdir` unless it finished before, pinned to `cores`
  (taskset; None: this process's); the seconds that command took (kept in the workdir with when it started and
  ended, so a table rewritten later reports the run's own time)."""
  wall_file = os.path.join(workdir, 'wall_seconds.json')
  if not os.path.exists(wall_file):
    command = [sys.executable, '-m', 'main', '--config', spec, '--workdir', workdir, f'--config.seed={seed}']
    command += [f'--config.data.data_dir={data_dir}'] if data_dir else []
    command = (['taskset', '-c', ','.join(map(str, cores))] if cores else []) + command
    start = time.time()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(command, cwd=root, check=True, stdout=subprocess.DEVNULL)
    end = time.time()
    with open(wall_file, 'w') as f:
      json.dump({'seconds': end - start, 'start': start, 'end': end}, f)
  return wall(workdir)['seconds']


def wall(workdir: str) -> dict[str, float]:
  """A finished run's 'seconds', and the epoch seconds it 'start'ed and 'end'ed at (absent for runs from before
  they were kept)."""
  with open(os.path.join(workdir, 'wall_seconds.json')) as f:
    kept = json.load(f)
  return kept if isinstance(kept, dict) else {'seconds': kept}


def pinnable_cores() -> list[int]:
  """The CPU cores this process may run on, where runs can be pinned to some of them (Linux with taskset); else []."""
  if not hasattr(os, 'sched_getaffinity') or shutil.which('taskset') is None:
    return []
  return sorted(os.sched_getaffinity(0))


def train_all(runs: list[tuple[str, str, int]], data_dir: str | None, jobs: int = 1) -> list[float]:
  """`train_once` of each (spec, workdir, seed), `jobs` at a time, each pinned to its own share of this process's
  CPU cores, so that each makes one CPU device per core of its share (vit_jax_lab.parallel). A small model's step
  leaves a second core idle much of the time: on 2 cores two one-core runs at a time train ~1.2x the steps per
  second of one two-core run, and overlap each other's start-up. The seconds each run took."""
  if jobs == 1:
    return [train_once(*run, data_dir) for run in runs]
  cpus = pinnable_cores()
  if len(cpus) < jobs:
    raise ValueError(f'{jobs} runs at a time need {jobs} CPU cores to pin them to, and there are {len(cpus)}')
  shares = queue.Queue()
  for i in range(jobs):
    shares.put(cpus[i::jobs])

  def one(run):
    share = shares.get()
    try:
      return train_once(*run, data_dir, share)
    finally:
      shares.put(share)

  with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    return list(pool.map(one, runs))


def training_minutes(workdirs: list[str]) -> float:
  """Minutes during which any of these runs was training (runs side by side count once); the sum of their times
  where a run did not keep when it ran."""
  walls = [wall(w) for w in workdirs]
  if not all('start' in w for w in walls):
    return sum(w['seconds'] for w in walls) / 60
  busy, until = 0.0, float('-inf')
  for w in sorted(walls, key=lambda w: w['start']):
    busy += max(w['end'] - max(w['start'], until), 0.0)
    until = max(until, w['end'])
  return busy / 60


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
