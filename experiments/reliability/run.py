"""Every way a `python -m main` run ends, from the command line: signals, kill -9, a non-finite loss, damaged
checkpoints and files, a full disk, two runs on one workdir, bad inputs. Prints and rewrites the README's table.

python -m experiments.reliability.run [--keep]    # rewrites the table in README.md; see there for the time
Each case is a real `python -m main` subprocess (JAX_PLATFORMS=cpu) on configs/vit/digits.py, shortened to 200
steps. Runs as root: the full-disk and read-only cases mount tmpfs file systems, unmounted again at the end.
--keep keeps the temporary directory (workdirs, and each command's output in logs/) instead of deleting it.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.reliability.run')

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Callable

from experiments import common

CONFIG = 'configs/vit/digits.py'
BASE = ('--config.total_steps=200', '--config.log_every=20', '--config.eval_every=200', '--config.checkpoint_every=50')
NAN = BASE + ('--config.optim.lr=1e4', '--config.checkpoint_every=10', '--config.total_steps=300')
DISK = BASE + ('--config.keep=100', '--config.checkpoint_every=20', '--config.total_steps=400')
TIMEOUT = 600  # Seconds one command may take before it counts as hung.

# The lines the command prints itself; anything else is a library's.
OWN = re.compile(
  r'(parameters:|  \S.* [\d,]+$|mesh |step +\d+/|eval at step |done: step |resumed from step |error: |stopped by |'
  r'checkpoint \d+ does not read whole|took over the lock|total_steps changed |\S+ changed .* \(resume_changes\)|'
  r'init_from |.*: the run is complete|generating the built-in dataset )'
)
NORMAL = re.compile(r'(parameters:|  \S.* [\d,]+$|mesh |step +\d+/|eval at step |done: step |resumed from step )')


class Run:
  """One `python -m main` subprocess; what it prints (stdout and stderr together) goes to a file."""

  def __init__(self, lab: 'Lab', workdir: str, overrides: tuple[str, ...], config: str):
    lab.count += 1
    self.log = os.path.join(lab.tmp, 'logs', f'{lab.count:02d}.txt')
    command = common.main_command(config, workdir, [f'--config.data.data_dir={lab.data_dir}', *overrides])
    with open(self.log, 'w') as out:
      self.process = subprocess.Popen(command, cwd=common.ROOT, env=lab.env, stdout=out, stderr=subprocess.STDOUT)
    lab.processes.append(self.process)

  def lines(self) -> list[str]:
    with open(self.log, errors='replace') as f:
      return f.read().splitlines()

  def wait(self) -> 'Run':
    try:
      self.process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()
    return self

  def wait_until(self, condition: Callable[[], bool]) -> None:
    """Polls `condition` while the process runs; raises if it ends first."""
    deadline = time.time() + TIMEOUT
    while not condition():
      if self.process.poll() is not None or time.time() > deadline:
        raise RuntimeError(f'the run ended (or hung) before the awaited point; its output is in {self.log}')
      time.sleep(0.2)

  @property
  def status(self) -> str:
    code = self.process.returncode
    return f'killed ({signal.Signals(-code).name})' if code < 0 else str(code)

  def last(self) -> str:
    lines = self.lines()
    return lines[-1] if lines else '(nothing)'

  def foreign(self) -> list[str]:
    return [line for line in self.lines() if not OWN.match(line)]

  def notes(self) -> list[str]:
    """What a (re)run printed besides the lines of a normal run."""
    return [line for line in self.lines() if not NORMAL.match(line)]

  def resumed(self) -> str:
    steps = [line.split()[-1] for line in self.lines() if line.startswith('resumed from step ')]
    return f'resumed from step {steps[0]}' if steps else 'started from step 0'


class Lab:
  """A temporary directory with the TFDS data dir, the workdirs and the output of every run."""

  def __init__(self, tmp: str):
    self.tmp, self.data_dir, self.count, self.processes = tmp, os.path.join(tmp, 'tfds'), 0, []
    self.env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
    self.env.pop('VIT_JAX_LAB_VERBOSE', None)  # The table is of what a user sees by default.
    self.noise: list[tuple[str, str]] = []
    os.makedirs(os.path.join(tmp, 'logs'))

  def workdir(self, name: str) -> str:
    return os.path.join(self.tmp, 'runs', name)

  def start(self, workdir: str, *overrides: str, config: str = CONFIG) -> Run:
    return Run(self, workdir, overrides, config)

  def run(self, workdir: str, *overrides: str, config: str = CONFIG) -> Run:
    return self.check_noise(self.start(workdir, *overrides, config=config).wait())

  def check_noise(self, run: Run) -> Run:
    self.noise += [(run.log, line) for line in run.foreign()]
    return run

  def show(self, text: str) -> str:
    """`text` for a table cell: the temporary directory as $TMP, in code, with | escaped."""
    return '`' + text.replace(self.tmp, '$TMP').replace('|', '\\|') + '`'

  def kill_all(self) -> None:
    for process in self.processes:
      if process.poll() is None:
        process.kill()
        process.wait()


def logged_step(workdir: str) -> int:
  """The newest step with a train line in metrics.jsonl (0 before the first)."""
  try:
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      records = [json.loads(line) for line in f if line.endswith('\n')]
  except (FileNotFoundError, json.JSONDecodeError):
    return 0
  return max((r['step'] for r in records if 'train/loss' in r), default=0)


def final(workdir: str) -> tuple[float, float, float]:
  """(eval/accuracy, eval/loss) of the last eval line and the loss of the last train line of metrics.jsonl."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  evaluation = [r for r in records if 'eval/accuracy' in r][-1]
  train = [r for r in records if 'train/loss' in r][-1]
  return evaluation['eval/accuracy'], evaluation['eval/loss'], train['train/loss']


def verdict(workdir: str, reference: str) -> str:
  try:
    got, want = final(workdir), final(reference)
  except (json.JSONDecodeError, IndexError, FileNotFoundError) as e:
    return f'differs (metrics.jsonl: {type(e).__name__})'
  if got == want:
    return 'equal'
  return f'differs (accuracy, eval loss, train loss {got} vs {want})'


def newest_checkpoint(workdir: str) -> str:
  directory = os.path.join(workdir, 'checkpoints')
  return os.path.join(directory, str(max(int(d) for d in os.listdir(directory) if d.isdigit())))


def largest_data_file(workdir: str) -> str:
  data = os.path.join(newest_checkpoint(workdir), 'state', 'ocdbt.process_0', 'd')
  return max((os.path.join(data, name) for name in os.listdir(data)), key=os.path.getsize)


def truncate(path: str) -> None:
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


class Rows:
  def __init__(self, lab: Lab):
    self.lab, self.rows = lab, []

  def add(self, scenario: str, happened: str, status: str, lines: str, rerun: str = '—') -> None:
    self.rows.append((scenario, happened, status, lines, rerun))
    print(f'{scenario} | {happened} | {status} | {lines} | {rerun}', flush=True)

  def fault(self, scenario: str, first: Run | None, what: str, rerun: Run, reference: str, workdir: str) -> None:
    """A fault (a run, or damage done by hand when `first` is None) and the rerun after it: the rerun's notes,
    the statuses and line counts, and whether the rerun ended where the uninterrupted run did."""
    happened = f'{what}; rerun: ' + '; '.join([*map(self.lab.show, rerun.notes()), rerun.resumed()])
    status, lines = f'rerun {rerun.status}', f'rerun {len(rerun.lines())}'
    if first is not None:
      status, lines = f'{first.status}, {status}', f'{len(first.lines())}, {lines}'
    self.add(scenario, happened, status, lines, verdict(workdir, reference))

  def refused(self, scenario: str, run: Run, workdir: str | None = None) -> None:
    """A run that should end at once in one line; notes a workdir it leaves behind."""
    happened = self.lab.show(run.last())
    if workdir and os.path.isdir(workdir):
      happened += f' (left {workdir.replace(self.lab.tmp, "$TMP")} behind: {", ".join(sorted(os.listdir(workdir)))})'
    self.add(scenario, happened, run.status, str(len(run.lines())))


def signalled(lab: Lab, name: str, sig: signal.Signals) -> tuple[Run, str]:
  """A BASE run sent `sig` once a step past 50 is logged (after the checkpoint of step 50)."""
  workdir = lab.workdir(name)
  run = lab.start(workdir, *BASE)
  run.wait_until(lambda: logged_step(workdir) > 50)
  run.process.send_signal(sig)
  return lab.check_noise(run.wait()), workdir


def plain(lab: Lab, rows: Rows) -> str:
  first = lab.run(lab.workdir('first'), config=f'{CONFIG}:smoke')  # Generates the digits dataset in data_dir.
  rows.add(
    'first run with an empty data_dir (`digits.py:smoke`; generates the dataset)',
    f'finished; first line {lab.show(first.lines()[0])}; lines not its own: {len(first.foreign())}',
    first.status,
    str(len(first.lines())),
  )
  reference = lab.workdir('reference')
  run = lab.run(reference, *BASE)
  rows.add(
    'plain run (200 steps; the uninterrupted reference)',
    f'finished; first line {lab.show(run.lines()[0])}; last {lab.show(run.last())}; '
    f'lines not its own: {len(run.foreign())}',
    run.status,
    str(len(run.lines())),
  )
  return reference


def signals(lab: Lab, rows: Rows, reference: str) -> None:
  for sig in (signal.SIGTERM, signal.SIGINT):
    run, workdir = signalled(lab, sig.name.lower(), sig)
    rerun = lab.run(workdir, *BASE)
    rows.fault(f'{sig.name} mid-run, rerun', run, lab.show(run.last()), rerun, reference, workdir)

  workdir = lab.workdir('kill9')
  run = lab.start(workdir, *BASE)
  run.wait_until(lambda: logged_step(workdir) > 50)
  run.process.kill()
  run.wait()
  steps = [line.split()[1] for line in run.lines() if line.startswith('step ')]
  rerun = lab.run(workdir, *BASE)
  rows.fault('kill -9 mid-run, rerun', run, f'killed after step {steps[-1]} was logged', rerun, reference, workdir)


def diverged(lab: Lab, rows: Rows) -> None:
  workdir = lab.workdir('nan')
  run = lab.run(workdir, *NAN)
  rows.add('non-finite loss (`optim.lr=1e4`)', lab.show(run.last()), run.status, str(len(run.lines())))
  lower = NAN + ('--config.optim.lr=1e-3',)
  run = lab.run(workdir, *lower)
  rows.refused('… rerun with `optim.lr=1e-3`', run)
  run = lab.run(workdir, *lower, '--config.resume_changes=optim.lr')
  happened = f'continued: {"; ".join(map(lab.show, run.notes()))}; {run.resumed()}; ended {lab.show(run.last())}'
  rows.add('… rerun adding `resume_changes=optim.lr`', happened, run.status, str(len(run.lines())))


def damaged(lab: Lab, rows: Rows, reference: str) -> None:
  def copy(name: str) -> str:
    workdir = lab.workdir(name)
    shutil.copytree(reference, workdir)
    return workdir

  cases = (
    ('truncate', 'newest checkpoint: a data file truncated to half, rerun', truncate),
    ('delete', 'newest checkpoint: a data file deleted, rerun', os.remove),
  )
  for name, scenario, damage in cases:
    workdir = copy(name)
    path = largest_data_file(workdir)
    damage(path)
    rerun = lab.run(workdir, *BASE)
    what = f'{name}d the largest file in {os.path.relpath(os.path.dirname(path), workdir)}/ of the finished run'
    rows.fault(scenario, None, what, rerun, reference, workdir)
  workdir = copy('metadata')
  path = os.path.join(newest_checkpoint(workdir), 'state', '_METADATA')
  os.remove(path)
  rerun = lab.run(workdir, *BASE)
  rows.fault(
    'newest checkpoint: `state/_METADATA` deleted, rerun',
    None,
    f'deleted {os.path.relpath(path, workdir)} of the finished run',
    rerun,
    reference,
    workdir,
  )

  workdir = copy('config_json')
  truncate(os.path.join(workdir, 'config.json'))
  rows.refused('`config.json` truncated to half, rerun', lab.run(workdir, *BASE))

  run = lab.run(copy('longer'), *BASE[:-1], '--config.checkpoint_every=50', '--config.total_steps=220')
  notes = [line for line in run.notes() if line.startswith('total_steps changed')]
  happened = f'{lab.show(notes[0]) if notes else "no note"}; {run.resumed()}; trained to step 220'
  rows.add('finished run rerun with `total_steps` 200 -> 220', happened, run.status, str(len(run.lines())))


def disk_full(lab: Lab, rows: Rows) -> None:
  mount = os.path.join(lab.tmp, 'tmpfs20m')
  os.makedirs(mount)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=20m', 'tmpfs', mount], check=True)
  try:
    workdir = os.path.join(mount, 'run')
    run = lab.run(workdir, *DISK)
    subprocess.run(['mount', '-o', 'remount,size=200m', mount], check=True)
    rerun = lab.run(workdir, *DISK)
    reference = lab.workdir('disk_reference')
    lab.run(reference, *DISK)
    rows.fault(
      'disk full (20 MB tmpfs, 400 steps, a checkpoint every 20 kept), rerun after growing it to 200 MB',
      run,
      lab.show(run.last()),
      rerun,
      reference,
      workdir,
    )
  finally:
    lab.kill_all()
    subprocess.run(['umount', mount], check=False)


def two_runs(lab: Lab, rows: Rows, reference: str) -> None:
  workdir = lab.workdir('two')
  first = lab.start(workdir, *BASE)
  first.wait_until(lambda: any(line.startswith('step ') for line in first.lines()))
  second = lab.run(workdir, *BASE)
  lab.check_noise(first.wait())
  rows.add(
    'a second run on the workdir of a running one',
    f'second: {lab.show(second.last())}; first: {"finished" if first.status == "0" else lab.show(first.last())}',
    f'{second.status}, first {first.status}',
    f'{len(second.lines())}, first {len(first.lines())}',
    verdict(workdir, reference),
  )


def partial_line(lab: Lab, rows: Rows, reference: str) -> None:
  run, workdir = signalled(lab, 'partial_line', signal.SIGTERM)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 999, "train/loss": 0.12')
  rerun = lab.run(workdir, *BASE)
  rows.fault(
    'half-written last line appended to metrics.jsonl after a SIGTERM, rerun',
    run,
    lab.show(run.last()),
    rerun,
    reference,
    workdir,
  )


def huge_total_steps(lab: Lab, rows: Rows) -> None:
  workdir = lab.workdir('huge')
  run = lab.start(workdir, *BASE, '--config.total_steps=1000000000000')
  run.wait_until(lambda: any(line.startswith('step ') for line in run.lines()))
  run.process.send_signal(signal.SIGTERM)
  lab.check_noise(run.wait())
  line = next(line for line in run.lines() if line.startswith('step '))
  eta = re.search(r'ETA ([\d,]+d \d\d:\d\d:\d\d)$', line)
  happened = f'accepted; first log line {lab.show(line)} ({"ETA in days" if eta else "ETA not in days"}); SIGTERM'
  rows.add('`total_steps=1000000000000`', happened, run.status, str(len(run.lines())))


def bad_inputs(lab: Lab, rows: Rows) -> None:
  import numpy as np

  files = os.path.join(lab.tmp, 'files')
  os.makedirs(files)
  npz, empty, text, regular = (os.path.join(files, n) for n in ('weights.npz', 'empty.npz', 'text.npz', 'file'))
  np.savez(npz, kernel=np.zeros((256, 256), np.float32))
  truncate(npz)
  open(empty, 'w').close()
  for path, content in ((text, 'not weights\n'), (regular, 'a file, not a folder\n')):
    with open(path, 'w') as f:
      f.write(content)
  cases = [
    ('`model.patch_size=0`', '--config.model.patch_size=0'),
    ('`model.patch_size=-2`', '--config.model.patch_size=-2'),
    ('`model.patch_size=3` (8x8 images)', '--config.model.patch_size=3'),
    ('`init_from=` a truncated .npz', f'--config.init_from={npz}'),
    ('`init_from=` an empty file', f'--config.init_from={empty}'),
    ('`init_from=` a text file (named .npz)', f'--config.init_from={text}'),
    ('`data.name=` (empty)', '--config.data.name='),
    ('`optim.lr=1e400`', '--config.optim.lr=1e400'),
    ('`data.eval_batch_size=1000000000`', '--config.data.eval_batch_size=1000000000'),
    ('`model.width=1000000`', '--config.model.width=1000000'),
  ]
  for i, (scenario, override) in enumerate(cases):
    workdir = lab.workdir(f'bad{i}')
    rows.refused(scenario, lab.run(workdir, *BASE, override), workdir)
  rows.refused('`--workdir` a regular file', lab.run(regular, *BASE))
  rows.refused("`--workdir ''`", lab.run('', *BASE))
  mount = os.path.join(lab.tmp, 'readonly')
  os.makedirs(mount)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m,ro', 'tmpfs', mount], check=True)
  try:
    rows.refused('`--workdir` on a read-only file system', lab.run(os.path.join(mount, 'run'), *BASE))
  finally:
    subprocess.run(['umount', mount], check=False)


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m experiments.reliability.run')
  parser.add_argument('--keep', action='store_true', help='keep the workdirs and the output of every command')
  args = parser.parse_args()
  start = time.time()
  tmp = tempfile.mkdtemp(prefix='reliability_')
  lab = Lab(tmp)
  rows = Rows(lab)
  try:
    reference = plain(lab, rows)
    signals(lab, rows, reference)
    diverged(lab, rows)
    damaged(lab, rows, reference)
    disk_full(lab, rows)
    two_runs(lab, rows, reference)
    partial_line(lab, rows, reference)
    huge_total_steps(lab, rows)
    bad_inputs(lab, rows)
  finally:
    lab.kill_all()
  minutes = (time.time() - start) / 60
  for log, line in lab.noise:
    print(f"not the command's own line ({log}): {line}")
  lines = [
    f'Regenerated by `python -m experiments.reliability.run` in {minutes:.0f} minutes '
    f'({os.cpu_count()} CPU cores, JAX_PLATFORMS=cpu). $TMP is the temporary directory of the runs.',
    '',
    '| scenario | what happened | exit status | lines printed | rerun = uninterrupted run |',
    '|---|---|---|---|---|',
  ]
  lines += [f'| {" | ".join(row)} |' for row in rows.rows]
  common.write_table(__file__, lines)
  if args.keep:
    print(f'workdirs and the output of every command (logs/) kept in {tmp}')
  else:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
  main()
