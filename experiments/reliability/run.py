"""Every way a `python -m main` run ends, from the command line: signals, kill -9, a non-finite loss, damaged
checkpoints and files, full and read-only disks, two runs on one workdir, bad inputs, a lost or disagreeing process
of a two-process run, grain's workers after a kill, a job's memory cgroup. Prints and rewrites the
README's table: per case its exit status, the one line it ended with, and whether the rerun equalled the
uninterrupted run.

python -m experiments.reliability.run [--keep]    # rewrites the table in README.md; see there for the time
Each case is a real `python -m main` subprocess (JAX_PLATFORMS=cpu) on configs/vit/digits.py, shortened to 200
steps. Runs as root: the full-disk and read-only cases mount tmpfs file systems, unmounted again at the end, and
the memory case makes a cgroup of 2 GiB under this process's own, removed again.
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
import socket
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
  r'init_from |.*: the run is complete|generating the built-in dataset |interrupted at once by a second Ctrl-C|'
  r'waiting for another run that prepares )'
)
NORMAL = re.compile(r'(parameters:|  \S.* [\d,]+$|mesh |step +\d+/|eval at step |done: step |resumed from step )')


class Run:
  """One `python -m main` subprocess; what it prints (stdout and stderr together) goes to a file."""

  def __init__(self, lab: 'Lab', workdir: str, overrides: tuple[str, ...], config: str, cgroup: str | None = None):
    lab.count += 1
    self.log = os.path.join(lab.tmp, 'logs', f'{lab.count:02d}.txt')
    command = common.main_command(config, workdir, [f'--config.data.data_dir={lab.data_dir}', *overrides])
    if cgroup is not None:  # Joins the group first, as a scheduler starts a job in its own.
      command = ['sh', '-c', f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', 'sh', *command]
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

  def start(self, workdir: str, *overrides: str, config: str = CONFIG, cgroup: str | None = None) -> Run:
    return Run(self, workdir, overrides, config, cgroup)

  def run(self, workdir: str, *overrides: str, config: str = CONFIG, cgroup: str | None = None) -> Run:
    return self.check_noise(self.start(workdir, *overrides, config=config, cgroup=cgroup).wait())

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


LINE = 110  # Characters of a printed line shown in the table.


class Rows:
  """The table: per case, its exit status(es), the one line it ended with, and whether the rerun equalled the
  uninterrupted run. Lines that are not the command's own are counted in `lab.noise` and reported under it."""

  def __init__(self, lab: Lab):
    self.lab, self.rows = lab, []

  def add(self, case: str, status: str, line: str, rerun: str = '—') -> None:
    self.rows.append((case, status, line, rerun))
    print(f'{case} | {status} | {line} | {rerun}', flush=True)

  def cell(self, text: str) -> str:
    """A printed line for a cell, cut to LINE characters (the temporary directory shown as $TMP)."""
    text = text.replace(self.lab.tmp, '$TMP')
    return self.lab.show(text if len(text) <= LINE else text[: LINE - 1] + '…')

  def fault(self, case: str, first: Run | None, rerun: Run, reference: str, workdir: str) -> None:
    """A fault (a run, or damage done by hand when `first` is None) and the rerun after it: the fault's line (or the
    rerun's first note), the statuses, and whether the rerun ended where the uninterrupted run did."""
    notes = [line for line in rerun.notes() if not line.startswith(('error: ', 'stopped by '))]
    line = first.last() if first is not None else (notes[0] if notes else '(no note)')
    status = f'{first.status}, rerun {rerun.status}' if first is not None else f'rerun {rerun.status}'
    self.add(case, status, self.cell(line) + f'; rerun {rerun.resumed()}', verdict(workdir, reference))

  def refused(self, case: str, run: Run, workdir: str | None = None) -> None:
    """A run that should end in one line (besides a normal run's, where it trains first); notes a workdir it
    leaves behind."""
    line = self.cell(run.last())
    if len(run.notes()) > 1:
      line += f' ({len(run.notes())} lines)'
    if workdir and os.path.isdir(workdir):
      line += f' (left {", ".join(sorted(os.listdir(workdir)))} behind)'
    self.add(case, run.status, line)


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
    'first run, empty data_dir (`digits.py:smoke`; generates the dataset)', first.status, rows.cell(first.last())
  )
  reference = lab.workdir('reference')
  run = lab.run(reference, *BASE)
  rows.add('plain run (200 steps; the uninterrupted reference)', run.status, rows.cell(run.last()))
  return reference


def signals(lab: Lab, rows: Rows, reference: str) -> None:
  for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    run, workdir = signalled(lab, sig.name.lower(), sig)
    rerun = lab.run(workdir, *BASE)
    rows.fault(f'{sig.name} mid-run, rerun', run, rerun, reference, workdir)

  workdir = lab.workdir('kill9')
  run = lab.start(workdir, *BASE)
  run.wait_until(lambda: logged_step(workdir) > 50)
  run.process.kill()
  run.wait()
  rerun = lab.run(workdir, *BASE)
  rows.fault('kill -9 mid-run, rerun', run, rerun, reference, workdir)

  workdir = lab.workdir('early')
  run = lab.start(workdir, *BASE)
  time.sleep(2)  # Importing JAX.
  run.process.send_signal(signal.SIGTERM)
  lab.check_noise(run.wait())
  rerun = lab.run(workdir, *BASE)
  rows.fault('SIGTERM 2 s after the start (before the first step), rerun', run, rerun, reference, workdir)

  workdir = lab.workdir('twice')
  run = lab.start(workdir, *BASE)
  run.wait_until(lambda: logged_step(workdir) > 50)
  run.process.send_signal(signal.SIGINT)
  time.sleep(0.3)  # Two signals sent at once are one to the process: a person's second press comes later.
  run.process.send_signal(signal.SIGINT)
  lab.check_noise(run.wait())
  rerun = lab.run(workdir, *BASE)
  rows.fault('Ctrl-C twice mid-run, rerun', run, rerun, reference, workdir)


def diverged(lab: Lab, rows: Rows) -> None:
  workdir = lab.workdir('nan')
  run = lab.run(workdir, *NAN)
  rows.add('non-finite loss (`optim.lr=1e4`)', run.status, rows.cell(run.last()))
  lower = NAN + ('--config.optim.lr=1e-3',)
  rows.refused('… rerun with `optim.lr=1e-3`', lab.run(workdir, *lower))
  run = lab.run(workdir, *lower, '--config.resume_changes=optim.lr')
  note = next((line for line in run.notes() if 'resume_changes' in line), '(no note)')
  rows.add('… rerun adding `resume_changes=optim.lr`', run.status, rows.cell(note) + f'; {run.resumed()}')


def damaged(lab: Lab, rows: Rows, reference: str) -> None:
  def copy(name: str) -> str:
    workdir = lab.workdir(name)
    shutil.copytree(reference, workdir)
    return workdir

  cases = (
    ('truncate', 'newest checkpoint: its largest file truncated to half, rerun', truncate),
    ('delete', 'newest checkpoint: its largest file deleted, rerun', os.remove),
  )
  for name, case, damage in cases:
    workdir = copy(name)
    damage(largest_data_file(workdir))
    rows.fault(case, None, lab.run(workdir, *BASE), reference, workdir)
  workdir = copy('metadata')
  os.remove(os.path.join(newest_checkpoint(workdir), 'state', '_METADATA'))
  rows.fault('newest checkpoint: `state/_METADATA` deleted, rerun', None, lab.run(workdir, *BASE), reference, workdir)

  workdir = copy('config_json')
  truncate(os.path.join(workdir, 'config.json'))
  rows.refused('`config.json` truncated to half, rerun', lab.run(workdir, *BASE))

  run = lab.run(copy('longer'), *BASE[:-1], '--config.checkpoint_every=50', '--config.total_steps=220')
  note = next((line for line in run.notes() if line.startswith('total_steps changed')), '(no note)')
  rows.add('finished run rerun with `total_steps` 200 -> 220', run.status, rows.cell(note) + f'; {run.resumed()}')


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
    rows.fault('workdir disk full (20 MB tmpfs, 400 steps), rerun after growing it', run, rerun, reference, workdir)
  finally:
    lab.kill_all()
    subprocess.run(['umount', mount], check=False)
  for name, size, case in (
    ('tiny', '8k', 'workdir on an 8 KB disk'),
    ('data64k', '64k', 'empty data_dir on a 64 KB disk'),
  ):
    mount = os.path.join(lab.tmp, name)
    os.makedirs(mount)
    subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', mount], check=True)
    try:
      if name == 'tiny':
        run = lab.run(os.path.join(mount, 'run'), *BASE)
      else:
        run = lab.run(lab.workdir(name), *BASE, f'--config.data.data_dir={mount}')
      rows.refused(case, run)
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
    f'{second.status}, first {first.status}',
    rows.cell(second.last()),
    verdict(workdir, reference),
  )


def partial_line(lab: Lab, rows: Rows, reference: str) -> None:
  run, workdir = signalled(lab, 'partial_line', signal.SIGTERM)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 999, "train/loss": 0.12')
  rerun = lab.run(workdir, *BASE)
  rows.fault('half-written line appended to metrics.jsonl after a SIGTERM, rerun', run, rerun, reference, workdir)


def huge_total_steps(lab: Lab, rows: Rows) -> None:
  workdir = lab.workdir('huge')
  run = lab.start(workdir, *BASE, '--config.total_steps=1000000000000')
  run.wait_until(lambda: any(line.startswith('step ') for line in run.lines()))
  run.process.send_signal(signal.SIGTERM)
  lab.check_noise(run.wait())
  line = next(line for line in run.lines() if line.startswith('step '))
  rows.add('`total_steps=1000000000000`, then SIGTERM', run.status, rows.cell(line))


def bad_inputs(lab: Lab, rows: Rows, reference: str) -> None:
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
  syntax = os.path.join(files, 'syntax.py')
  with open(syntax, 'w') as f:
    f.write('def get_config(:\n')
  cases = [
    ('`model.patch_size=0`', '--config.model.patch_size=0'),
    ('`model.patch_size=3` (8x8 images)', '--config.model.patch_size=3'),
    ('`model.depth=0`', '--config.model.depth=0'),
    ('`init_from=` a truncated .npz', f'--config.init_from={npz}'),
    ('`init_from=` an empty file', f'--config.init_from={empty}'),
    ('`init_from=` a text file (named .npz)', f'--config.init_from={text}'),
    ('`init_from=` a ViT of another size (the reference, `model.width=32`)', f'--config.init_from={reference}'),
    ('`data.name=` (empty)', '--config.data.name='),
    ('`data.data_dir=` a file', f'--config.data.data_dir={regular}'),
    ('`optim.lr=1e400`', '--config.optim.lr=1e400'),
    ('`data.eval_batch_size=1000000000`', '--config.data.eval_batch_size=1000000000'),
    ('`model.width=1000000`', '--config.model.width=1000000'),
  ]
  for i, (case, override) in enumerate(cases):
    extra = ('--config.model.width=32', '--config.model.num_heads=2') if 'another size' in case else ()
    workdir = lab.workdir(f'bad{i}')
    rows.refused(case, lab.run(workdir, *BASE, override, *extra), workdir)
  other = next(i for i, (case, _) in enumerate(cases) if 'another size' in case)
  workdir = lab.workdir(f'bad{other}')  # Refused an init_from of another size: the corrected command runs.
  short = (
    '--config.total_steps=20',
    '--config.eval_every=20',
    '--config.log_every=10',
    '--config.schedule.warmup_steps=2',
  )
  run = lab.run(workdir, *short)
  rows.add('… the same workdir without `init_from`', run.status, rows.cell(run.last()))
  rows.refused('`--config` a file with a syntax error', lab.run(lab.workdir('syntax'), *BASE, config=syntax))
  rows.refused('`--workdir` a regular file', lab.run(regular, *BASE))
  rows.refused("`--workdir ''`", lab.run('', *BASE))
  metrics = lab.workdir('metrics_folder')
  os.makedirs(os.path.join(metrics, 'metrics.jsonl'))
  rows.refused('`metrics.jsonl` a folder in the workdir', lab.run(metrics, *BASE))
  mount = os.path.join(lab.tmp, 'readonly')
  os.makedirs(mount)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m,ro', 'tmpfs', mount], check=True)
  try:
    rows.refused('`--workdir` on a read-only file system', lab.run(os.path.join(mount, 'run'), *BASE))
    rows.refused('empty `data.data_dir` on a read-only file system', lab.run(lab.workdir('ro_data'), *BASE,
      f'--config.data.data_dir={mount}'))  # fmt: skip
  finally:
    subprocess.run(['umount', mount], check=False)


def hostile(lab: Lab, rows: Rows) -> None:
  """Issue 53's security pass: paths the system refuses, an empty split, a disk out of inodes, a hub folder's
  sizes out of range, two runs preparing one data_dir."""
  from vit_jax_lab.tools import hub_benchmark

  timm = os.path.join(lab.tmp, 'files', 'timm_heads0')
  hub_benchmark.write(timm, 'Ti/16')
  with open(os.path.join(timm, 'config.json')) as f:
    config = json.load(f)
  with open(os.path.join(timm, 'config.json'), 'w') as f:
    json.dump(config | {'model_args': {'num_heads': 0}}, f)
  cases = [
    ('`data.train_split=train[:0%]` (no examples)', '--config.data.train_split=train[:0%]'),
    ('`init_from=` a timm folder whose config.json says `num_heads: 0`', f'--config.init_from={timm}'),
  ]
  for i, (case, override) in enumerate(cases):
    workdir = lab.workdir(f'hostile{i}')
    rows.refused(case, lab.run(workdir, *BASE, override), workdir)
  rows.refused('`--workdir` a name of 300 characters', lab.run(lab.workdir('a' * 300), *BASE))
  rows.refused('`--workdir` under /proc', lab.run('/proc/run', *BASE))
  mount = os.path.join(lab.tmp, 'inodes')
  os.makedirs(mount)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=20m,nr_inodes=40', 'tmpfs', mount], check=True)
  try:
    run = lab.run(os.path.join(mount, 'run'), *BASE)
    trained = logged_step(os.path.join(mount, 'run'))
    rows.refused(f'workdir disk out of inodes (40; 20 MB free; it trains to step {trained} first)', run)
  finally:
    subprocess.run(['umount', mount], check=False)
  data_dir = os.path.join(lab.tmp, 'tfds_together')
  smoke = ('--config.total_steps=6', f'--config.data.data_dir={data_dir}')
  runs = [lab.start(lab.workdir(f'together{i}'), *smoke, config=f'{CONFIG}:smoke') for i in range(2)]
  runs = [lab.check_noise(run.wait()) for run in runs]
  waited = next((r for r in runs if any(line.startswith('waiting for another run') for line in r.lines())), None)
  rows.add(
    'two runs started together on one empty data_dir (`digits.py:smoke`)',
    ', '.join(r.status for r in runs),
    rows.cell(next(line for line in waited.lines() if line.startswith('waiting'))) + '; then trained'
    if waited
    else 'neither waited (the first had finished preparing)',
  )


def free_address() -> str:
  """'127.0.0.1:PORT' of a free port, for a two-process run's coordinator."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'127.0.0.1:{s.getsockname()[1]}'


def parent_if_alive(pid: int | str) -> int | None:
  """The parent of process `pid` while it runs; None once it has ended (gone, or a zombie)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      state, parent = f.read().rpartition(')')[2].split()[:2]
  except OSError:
    return None
  return None if state == 'Z' else int(parent)


def children(pid: int) -> list[int]:
  """The live processes whose parent is `pid` (grain's workers, Python's resource tracker)."""
  return [int(entry) for entry in filter(str.isdigit, os.listdir('/proc')) if parent_if_alive(entry) == pid]


def cluster(lab: Lab, rows: Rows) -> None:
  """Issue 64's faults of a two-process run (docs/clusters.md's flags, on 4 simulated CPU devices each, data.shards
  fixed at 2 so that it equals the one-process reference) and of grain's worker processes."""
  lab.env['JAX_NUM_CPU_DEVICES'] = '4'
  shards = ('--config.data.shards=2',)

  def pair(workdir: str, *overrides: str, only: tuple[int, ...] = (0, 1), extra: dict | None = None) -> list[Run]:
    flags = (f'--config.distributed.coordinator_address={free_address()}', '--config.distributed.num_processes=2')
    return [
      lab.start(workdir, *BASE, *shards, *flags, f'--config.distributed.process_id={i}', *(extra or {}).get(i, ()))
      for i in only
    ]

  reference = lab.workdir('two_processes')  # Uninterrupted, on the same 8 devices (sums in the same order).
  for run in pair(reference):
    lab.check_noise(run.wait())
  workdir = lab.workdir('lost_peer')
  runs = pair(workdir)
  runs[0].wait_until(lambda: logged_step(workdir) > 50)
  runs[1].process.kill()
  killed = time.time()
  runs[0].wait()
  seconds = time.time() - killed
  runs[1].wait()
  lab.check_noise(runs[0])
  reruns = [lab.check_noise(r.wait()) for r in pair(workdir)]
  notes = runs[0].notes()
  rows.add(
    'process 1 of a two-process run killed (SIGKILL) mid-run, both rerun',
    f'{runs[0].status} (process 0, {seconds:.0f} s after), rerun {", ".join(r.status for r in reruns)}',
    rows.cell(notes[-1] if notes else runs[0].last()) + f' ({len(notes)} line); rerun {reruns[0].resumed()}',
    verdict(workdir, reference) + ' (the uninterrupted two-process run)',
  )
  workdir = lab.workdir('never_came')
  (alone,) = pair(workdir, only=(0,))
  start = time.time()
  lab.check_noise(alone.wait())
  rows.refused(f'process 1 of two never starts (process 0 ends after {time.time() - start:.0f} s)', alone, workdir)
  workdir = lab.workdir('disagree')
  runs = [lab.check_noise(r.wait()) for r in pair(workdir, extra={1: ('--config.total_steps=300',)})]
  rows.add(
    'the two processes disagree (`total_steps` 200 and 300)',
    ', '.join(r.status for r in runs),
    rows.cell(runs[0].last()) + ' (lines: ' + ', '.join(str(len(r.lines())) for r in runs) + ')',
  )
  lab.env.pop('JAX_NUM_CPU_DEVICES')
  workdir = lab.workdir('grain_workers')
  run = lab.start(workdir, *BASE, '--config.data.backend=grain', '--config.data.workers=2')
  run.wait_until(lambda: logged_step(workdir) > 0 and len(children(run.process.pid)) >= 2)
  workers = children(run.process.pid)
  run.process.kill()
  run.wait()
  time.sleep(5)
  left = [pid for pid in workers if parent_if_alive(pid) is not None]
  rows.add(
    'a grain run with `data.workers=2` killed (SIGKILL)',
    run.status,
    f'{len(workers)} child processes (workers, resource tracker); alive 5 s later: {len(left)}',
  )


def memory_cgroup(lab: Lab, rows: Rows) -> None:
  """A job in its own memory cgroup of 2 GiB under this process's (as SLURM or Kubernetes puts one; the host has
  more), whose batches would hold ~3 GiB: refused from the group's limit, not the host's."""
  from vit_jax_lab import hosts

  case = 'a run in its own 2 GiB memory cgroup, its batches ~3 GiB in flight (the host has 23 GiB)'
  own, version = hosts.memory_cgroups()[0]
  group = os.path.join(own, f'reliability_{os.getpid()}')
  try:
    os.mkdir(group)
    with open(os.path.join(group, 'memory.max' if version == 2 else 'memory.limit_in_bytes'), 'w') as f:
      f.write(str(2 * 2**30))
  except OSError as e:
    rows.add(case, 'not run', f'no cgroup made here ({e.strerror})')
    return
  try:
    workdir = lab.workdir('cgroup')
    run = lab.run(workdir, *BASE, '--config.data.image_size=224', '--config.data.batch_size=16384', cgroup=group)
    rows.refused(case, run, workdir)
  finally:
    lab.kill_all()
    os.rmdir(group)


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
    bad_inputs(lab, rows, reference)
    hostile(lab, rows)
    cluster(lab, rows)
    memory_cgroup(lab, rows)
  finally:
    lab.kill_all()
  minutes = (time.time() - start) / 60
  for log, line in lab.noise:
    print(f"not the command's own line ({log}): {line}")
  lines = [
    f'Regenerated by `python -m experiments.reliability.run` in {minutes:.0f} minutes '
    f"({os.cpu_count()} CPU cores, JAX_PLATFORMS=cpu); $TMP is the runs' temporary directory. Lines printed that "
    f"are not the command's own, over all {lab.count} commands: {len(lab.noise)}.",
    '',
    '| case | exit status | the line it ended with | rerun = uninterrupted run |',
    '|---|---|---|---|',
  ]
  lines += [f'| {" | ".join(row)} |' for row in rows.rows]
  common.write_table(__file__, lines)
  if args.keep:
    print(f'workdirs and the output of every command (logs/) kept in {tmp}')
  else:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
  main()
