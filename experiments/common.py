"""What the experiment scripts share: one way to train a run, its times read back, and the tables they write into
READMEs. Every script runs from the repository root as a module: `python -m experiments.NAME.run`."""

import concurrent.futures
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np

from vit_jax_lab import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flags(overrides: Mapping[str, object]) -> list[str]:
  """The command line's --config.KEY=VALUE for each dotted key and value, e.g. {'model.dropout': 0.0}."""
  return [f'--config.{key}={value}' for key, value in overrides.items()]


def main_command(spec: str, workdir: str, overrides: Sequence[str] = ()) -> list[str]:
  """The command line `python -m main --config spec --workdir workdir OVERRIDES...`, to run in ROOT."""
  return [sys.executable, '-m', 'main', '--config', spec, '--workdir', workdir, *overrides]


def train(
  spec: str,
  workdir: str,
  overrides: Mapping[str, object] | None = None,
  *,
  separate: bool = False,
  cores: list[int] | None = None,
) -> dict[str, float]:
  """Trains the config file `spec` (path[:arg], relative to ROOT) in `workdir`, with `overrides` set as the command
  line sets them (`flags`); its last evaluation's eval/* metrics.

  In this process by default, so that runs one after another share one import of JAX and TensorFlow and, with
  parallel.enable_compilation_cache, their compiled steps. With `separate`, as the command `python -m main` in a
  process of its own, pinned to `cores` (taskset; None: this process's), unless it finished before: the seconds
  the command took are kept in the workdir with when it started and ended (`wall`), so a table rewritten later
  reports the run's own time; the metrics are then read back from its metrics.jsonl, with the 'step' they were
  logged at."""
  argv = flags(overrides or {})
  if not separate:
    from vit_jax_lab import train as train_lib  # With TensorFlow: ~6 s that the scripts which only read configs skip.

    config = config_lib.load(os.path.join(ROOT, spec))
    config_lib.apply_overrides(config, argv)
    return train_lib.train_and_evaluate(config, workdir)
  wall_file = os.path.join(workdir, 'wall_seconds.json')
  if not os.path.exists(wall_file):
    command = (['taskset', '-c', ','.join(map(str, cores))] if cores else []) + main_command(spec, workdir, argv)
    start = time.time()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    end = time.time()
    with open(wall_file, 'w') as f:
      json.dump({'seconds': end - start, 'start': start, 'end': end}, f)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    evaluations = [m for m in map(json.loads, f) if any(_evaluation_key(k) for k in m)]
  return evaluations[-1]


def _evaluation_key(key: str) -> bool:
  """Whether `key` is the evaluation's; few-shot accuracies are logged on lines of their own."""
  return key.startswith('eval/') and not key.startswith('eval/fewshot/')


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


def train_all(runs: list[tuple[str, str, Mapping[str, object]]], jobs: int = 1) -> list[dict[str, float]]:
  """`train` of each (spec, workdir, overrides) as a separate command, `jobs` at a time, each pinned to its own
  share of this process's CPU cores, so that each makes one CPU device per core of its share
  (vit_jax_lab.parallel). A small model's step leaves a second core idle much of the time: on 2 cores two one-core
  runs at a time train ~1.2x the steps per second of one two-core run, and overlap each other's start-up. Each
  run's last evaluation."""
  if jobs == 1:
    return [train(*run, separate=True) for run in runs]
  cpus = pinnable_cores()
  if len(cpus) < jobs:
    raise ValueError(f'{jobs} runs at a time need {jobs} CPU cores to pin them to, and there are {len(cpus)}')
  shares = queue.Queue()
  for i in range(jobs):
    shares.put(cpus[i::jobs])

  def one(run):
    share = shares.get()
    try:
      return train(*run, separate=True, cores=share)
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


def mean_spread(values: Sequence[float], places: int = 2) -> str:
  """'97.22 ± 0.39': the mean and standard deviation of runs over seeds; the mean alone for one run."""
  mean = f'{statistics.mean(values):.{places}f}'
  return f'{mean} ± {statistics.stdev(values):.{places}f}' if len(values) > 1 else mean


def write_table(script: str, lines: list[str], marker: str = 'table', echo: bool = True) -> None:
  """Rewrites what lies between `<!-- marker -->` and `<!-- /marker -->` in the README.md beside the
  experiment `script` (its __file__) with `lines`, and prints them unless not `echo`. The prose around stays
  hand-written."""
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
  if echo:
    print(table)


def recipe_lines(rows: list[tuple[str, str, str, str]]) -> list[str]:
  """A recipe beside its reference: rows of (setting, reference value, source of that value, our config's
  value), marked = where they agree."""
  lines = ['| setting | reference | source | ours | |', '|---|---|---|---|:-:|']
  for setting, reference, source, ours in rows:
    lines.append(f'| {setting} | {reference} | {source} | {ours} | {"=" if ours == reference else "≠"} |')
  return lines
