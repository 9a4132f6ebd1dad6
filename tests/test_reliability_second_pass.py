"""Issue 44, the reliability table's second pass: each fault a careless user or a cluster brings ends in one true
line, and a rejected start never blocks its own fix. Real `python -m main` processes, signals and tmpfs mounts
(root) where the fault needs them; the rest in this process."""

import gc
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow_datasets as tfds

import main
from conftest import load_config, wait_for_first_log
from test_folder_data import folder_config, image_tree, write_image
from test_reliability import command, stop_by_signal
from vit_jax_lab import errors, train, workdir as workdir_lib
from vit_jax_lab.data import builders, info as data_info, pipeline
from vit_jax_lab.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment(**extra):
  """A child's environment on CPU devices, with TensorFlow's log level left to the command (this process's imports
  set one)."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'} | {'JAX_PLATFORMS': 'cpu'}
  return env | extra


def run(args, timeout=300, **env):
  return subprocess.run(args, cwd=ROOT, env=environment(**env), capture_output=True, text=True, timeout=timeout)


def one_line(result, status: int) -> str:
  """The one line a command ended with, after checking that it is all it printed on stderr."""
  assert result.returncode == status, result.stderr
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr
  return lines[0]


# 1. A rejected init_from blocks the corrected command.


@pytest.mark.slow
def test_a_rejected_init_from_leaves_nothing_and_a_run_without_checkpoint_holds_nothing(smoke_config, tmp_path):
  other = str(tmp_path / 'other')  # A ViT workdir of another size.
  train.train_and_evaluate(smoke_config(total_steps=2, checkpoint_every=2, eval_every=2), other)
  workdir = str(tmp_path / 'run')
  with pytest.raises(ConfigError):
    train.train_and_evaluate(smoke_config(init_from=other, model__width=48, model__mlp_dim=96), workdir)
  assert not os.path.exists(workdir)  # Nothing recorded before the weights were known to fit.
  train.train_and_evaluate(smoke_config(init_from=other, total_steps=2, eval_every=2), workdir)  # The fix runs.

  # A workdir whose run saved no checkpoint (an older version's rejected start): its config.json is replaced.
  never = str(tmp_path / 'never')
  os.makedirs(never)
  workdir_lib.record_config(smoke_config(model__width=48, model__mlp_dim=96), never)
  notes = workdir_lib.record_config(smoke_config(), never)
  assert len(notes) == 1 and 'saved no checkpoint (model.mlp_dim, model.width differ): replaced' in notes[0]
  assert workdir_lib.load_run(never).model.width == 32


# 2. Tracebacks where one line belongs.

SYNTAX = 'def get_config(:\n'
RAISES = 'def get_config(arg=None):\n  return helper()\n\n\ndef helper():\n  raise RuntimeError("no such preset")\n'
NO_ARG = 'from configs.vit.digits import get_config as digits\n\n\ndef get_config():\n  return digits("smoke")\n'


@pytest.mark.parametrize(
  'text, arg, expected',
  [
    (SYNTAX, '', r'--config: .*bad\.py:1: SyntaxError: invalid syntax'),
    (RAISES, '', r'--config: .*bad\.py:6: RuntimeError: no such preset'),
    (NO_ARG, ':smoke', r'--config .*bad\.py:smoke: get_config\(\) of .*bad\.py takes no argument; drop :smoke'),
  ],
)
def test_config_files_with_mistakes_are_one_line(tmp_path, text, arg, expected):
  path = tmp_path / 'bad.py'
  path.write_text(text)
  line = one_line(run([sys.executable, '-m', 'main', '--config', f'{path}{arg}', '--workdir', str(tmp_path / 'w')]), 2)
  assert re.fullmatch(f'error: {expected}', line), line


def test_a_get_config_without_argument_is_accepted(tmp_path):
  (tmp_path / 'plain.py').write_text(NO_ARG)
  config, _ = main.parse_args(['--config', str(tmp_path / 'plain.py'), '--workdir', 'w'])
  assert config.model.width == 32  # The smoke model.


def faulty_workdir(tmp_path, source: str, fault: str) -> tuple[list[str], dict]:
  """The command and the environment of a run meeting `fault`; `source`: the prepared data_dir."""
  workdir, env, data_dir = str(tmp_path / 'run'), {}, source
  if fault == 'JAX_NUM_CPU_DEVICES=abc':
    env['JAX_NUM_CPU_DEVICES'] = 'abc'
  elif fault == 'data_dir a file':
    data_dir = str(tmp_path / 'file')
    open(data_dir, 'w').close()
  elif fault.startswith('truncated train records'):
    data_dir = str(tmp_path / 'tfds')
    shutil.copytree(source, data_dir)
    prepared = os.path.join(data_dir, 'digits', '1.0.0')
    records = os.path.join(prepared, next(f for f in os.listdir(prepared) if 'train.tfrecord' in f))
    size = os.path.getsize(records) // 2
    if fault.endswith('between two records'):  # Each record: a length (8 bytes), its CRC (4), data, its CRC (4).
      size, data = 0, open(records, 'rb').read()
      while size < len(data) // 2:
        size += 16 + int.from_bytes(data[size : size + 8], 'little')
    os.truncate(records, size)
  elif fault == 'empty dataset_info.json':
    data_dir = str(tmp_path / 'tfds')
    shutil.copytree(source, data_dir)
    open(os.path.join(data_dir, 'digits', '1.0.0', 'dataset_info.json'), 'w').close()
  else:
    name, kind = fault.split(' a ')
    os.makedirs(workdir)
    path = os.path.join(workdir, name)
    os.makedirs(path) if kind == 'folder' else open(path, 'w').close()
  return command(workdir, data_dir), env


@pytest.mark.slow
@pytest.mark.parametrize(
  'fault, expected',
  [
    ('JAX_NUM_CPU_DEVICES=abc', 'JAX_NUM_CPU_DEVICES=abc in the environment is not a valid value for JAX'),
    ('data_dir a file', 'file, not a folder: name the folder that holds'),
    ('truncated train records', 'the prepared data of digits in .*/digits/1.0.0 is damaged .*: delete .* run again'),
    (
      'truncated train records between two records',  # TFDS counts the examples: a FailedPreconditionError.
      'the prepared data of digits in .*/digits/1.0.0 is damaged .*expected to contain .*: delete .* run again',
    ),
    ('empty dataset_info.json', "dataset_info.json of its prepared data .* is damaged .*: delete the dataset's folder"),
    ('metrics.jsonl a folder', 'metrics.jsonl is a folder where the run keeps its metrics.jsonl file'),
    ('tensorboard a file', 'tensorboard is a file where the run keeps its tensorboard folder'),
    ('checkpoints a file', 'checkpoints is a file where the run keeps its checkpoints folder'),
  ],
)
def test_faults_of_the_environment_data_and_workdir_are_one_line(tmp_path, data_dir, fault, expected):
  args, env = faulty_workdir(tmp_path, data_dir, fault)
  started = time.time()
  line = one_line(run(args, **env), 2)
  assert re.match(f'error: .*{expected}', line), line
  assert time.time() - started < 120  # No hang (checkpoints a file took 5 minutes).


@pytest.mark.slow
def test_an_empty_data_dir_on_a_read_only_disk_is_one_line(tmp_path, mount):
  data_dir = mount('ro,size=1m')
  line = one_line(run(command(str(tmp_path / 'run'), data_dir)), 2)
  assert line.startswith('error: the data cannot be prepared: ') and 'give a writable data.data_dir' in line, line
  assert not os.path.exists(tmp_path / 'run')


# 3. The wrong disk is named; 6. noise on a tiny disk.


@pytest.mark.slow
def test_a_full_data_dir_disk_is_named(tmp_path, mount):
  data_dir = mount('size=64k')  # Smaller than the digits dataset.
  line = one_line(run(command(str(tmp_path / 'run'), data_dir)), errors.DiskFull.exit_status)
  assert line.startswith(f'error: no space left at {data_dir}/digits/1.0.0: ') and 'prepare the data' in line, line


@pytest.mark.slow
@pytest.mark.parametrize('size', ['4k', '8k'])
def test_a_tiny_workdir_disk_is_one_line_without_tensorflow_warnings(data_dir, mount, size):
  workdir = os.path.join(mount(f'size={size}'), 'run')
  result = run(command(workdir, data_dir))
  assert one_line(result, errors.DiskFull.exit_status).startswith(f'error: no space left at {workdir}')
  assert 'WARNING' not in result.stdout
  assert not os.path.isdir(workdir) or not [n for n in os.listdir(workdir) if n.endswith('.tmp')]  # 4k: config.json.tmp


# 4. Changed data is resumed silently.


@pytest.mark.slow
def test_a_folder_changed_before_the_resume_is_refused_and_its_prepared_copy_kept(tmp_path):
  image_tree(tmp_path / 'p', per_class=4)
  config = folder_config(tmp_path / 'p', tmp_path / 'tfds', batch_size=8, eval_batch_size=8)
  config.total_steps, config.eval_every, config.checkpoint_every = 2, 2, 2
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir)  # As if preempted at step 2 of 4.
  write_image(str(tmp_path / 'p/train/cat/new.png'), (5, 5), 0)
  config.total_steps = 4
  with pytest.raises(ConfigError, match=r'changed since it was prepared in (\S+), on which this run trained') as e:
    train.train_and_evaluate(config, workdir)
  prepared = e.value.args[0].split('prepared in ')[1].split(',')[0]
  assert f'delete {prepared}' in str(e.value) and 'use another --workdir' in str(e.value)
  assert tfds.builder_from_directory(prepared).info.splits['train'].num_examples == 12  # The copy it trained on.
  shutil.rmtree(prepared)  # The user accepts the change, as the line says.
  train.train_and_evaluate(config, workdir)
  assert pipeline.load(config.data, data_info.label_info)[1].num_train == 13


# 5. Signals with no line.


def catching(process: subprocess.Popen, sig: int, timeout: float = 60) -> None:
  """Returns once `process` catches `sig` (its SigCgt mask in /proc). Before, a signal meets the interpreter's start
  or what the process inherited: a pytest-xdist worker ignores SIGTERM, and so would its children until then."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    with open(f'/proc/{process.pid}/status') as f:
      caught = int(next(line for line in f if line.startswith('SigCgt:')).split()[1], 16)
    if caught >> (sig - 1) & 1:
      return
    time.sleep(0.005)
  raise AssertionError(f'process {process.pid} did not catch signal {sig} within {timeout} s')


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_start_up_says_nothing_was_trained(data_dir, tmp_path, sig):
  workdir = str(tmp_path / 'run')
  process = subprocess.Popen(
    command(workdir, data_dir), cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  catching(process, sig)  # main.py's first lines; JAX and TensorFlow are being imported now.
  process.send_signal(sig)
  _, err = process.communicate(timeout=120)
  assert process.returncode == errors.Preempted.exit_status, err
  assert err.splitlines() == [
    f'stopped by {sig.name} during start-up, before the first step: nothing was trained; run the same command to '
    'start again'
  ]


class _Finalized:
  def __del__(self):
    signal.raise_signal(signal.SIGUSR1)  # Handled at the next instruction: still in here.


def test_a_stop_signal_inside_a_finalizer_still_stops(capfd):
  """The same inside a `__del__` (TensorFlow's functions are collected so), where an exception is ignored too."""
  previous = signal.signal(
    signal.SIGUSR1, lambda sig, frame: errors.stop_from_handler(sig, errors.stopped_before_training('SIGUSR1'))
  )
  try:
    with pytest.raises(errors.Preempted, match='stopped by SIGUSR1 during start-up'):
      _Finalized()
      time.sleep(5)
  finally:
    signal.signal(signal.SIGUSR1, previous)
  assert 'Exception ignored' not in capfd.readouterr().err


def test_a_stop_signal_inside_a_garbage_collection_callback_still_stops(capfd):
  """A signal handled while Python runs a gc callback (JAX's _xla_gc_callback, during start-up): an exception raised
  there is printed as 'Exception ignored' and dropped, and the run would train on. errors.stop_from_handler's
  unraisable hook delivers the signal again, until its exception stops the command; nothing is printed."""
  handled = []

  def handler(sig, frame):
    handled.append(any(f.f_code is callback.__code__ for f in _stack(frame)))
    errors.stop_from_handler(sig, errors.stopped_before_training(signal.Signals(sig).name))

  def callback(phase, info):
    if phase == 'start' and not handled:
      signal.raise_signal(signal.SIGUSR1)  # Python runs its handler at the next instruction: still in here.
      handled.append(None)

  previous = signal.signal(signal.SIGUSR1, handler)
  gc.callbacks.append(callback)
  try:
    with pytest.raises(errors.Preempted, match='stopped by SIGUSR1 during start-up'):
      gc.collect()
      time.sleep(5)  # The signal comes back 50 ms after the callback.
  finally:
    gc.callbacks.remove(callback)
    signal.signal(signal.SIGUSR1, previous)
  # Raised inside our callback (ignored there, so delivered again), then where it stops: outside the callback.
  assert handled[0] is True and handled[-1] is False
  assert 'Exception ignored' not in capfd.readouterr().err


def _stack(frame):
  while frame is not None:
    yield frame
    frame = frame.f_back


@pytest.mark.slow
def test_sighup_stops_as_sigterm_does(data_dir, tmp_path):
  stop_by_signal(str(tmp_path / 'run'), data_dir, signal.SIGHUP)  # The step saved, one line, exit status 75.


# 7. Small ones.


def test_a_missing_option_is_one_error_line(tmp_path):
  result = run([sys.executable, '-m', 'main', '--workdir', str(tmp_path)])
  assert one_line(result, 2).startswith('error: the following arguments are required: --config (usage: ')


def test_a_model_without_blocks_is_refused(smoke_config):
  with pytest.raises(ConfigError, match=r'^model.depth=0 must be a positive integer'):
    train.setup(smoke_config(model__depth=0))


def test_a_killed_preparations_leftovers_go_with_the_next_successful_one(tmp_path, capsys):
  data_dir = str(tmp_path / 'tfds')
  leftover = os.path.join(data_dir, 'digits', 'incomplete.ABC123_1.0.0')
  os.makedirs(leftover)
  open(os.path.join(leftover, 'digits-train.tfrecord-00000-of-00001'), 'w').close()
  dead = subprocess.Popen(['true'])
  dead.wait()
  marker = os.path.join(data_dir, 'digits', f'.preparing_1.0.0.{os.uname().nodename}.{dead.pid}')
  open(marker, 'w').close()  # The killed preparation's own mark.
  pipeline.load(load_config('configs/vit/digits.py:smoke', data_dir).data, data_info.label_info)
  # Left: the dataset, and the empty file runs take turns on (kept: a lock file removed could be locked twice).
  assert sorted(os.listdir(os.path.join(data_dir, 'digits'))) == ['.lock_1.0.0', '1.0.0']
  assert f'removed 1 unfinished preparation(s) left by a stopped run: {leftover}' in capsys.readouterr().out


def test_a_preparation_in_progress_elsewhere_is_left_alone(tmp_path):
  parent = tmp_path / 'digits'
  (parent / 'incomplete.XYZ_1.0.0').mkdir(parents=True)
  (parent / f'.preparing_1.0.0.{os.uname().nodename}.{os.getppid()}').touch()  # A live process.
  with builders.preparing(str(parent / '1.0.0')):
    pass
  assert (parent / 'incomplete.XYZ_1.0.0').is_dir()


# 8. A second Ctrl-C interrupts at once, during a save too.


@pytest.mark.slow
def test_a_second_ctrl_c_during_a_save_interrupts_at_once(data_dir, tmp_path):
  """A larger model (150 MB of state) so that the save lasts long enough to be caught in the act."""
  workdir = str(tmp_path / 'run')
  big = ('--config.model.width=512', '--config.model.mlp_dim=2048', '--config.model.num_heads=2')
  args = command(workdir, data_dir, *big, '--config.total_steps=1000', '--config.checkpoint_every=5')
  process = subprocess.Popen(args, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  checkpoints = os.path.join(workdir, 'checkpoints')
  deadline = time.time() + 240
  while not os.path.isdir(os.path.join(checkpoints, '5')) and time.time() < deadline:
    time.sleep(0.05)
  wait_for_first_log(workdir, timeout=60)
  process.send_signal(signal.SIGINT)
  saving = []
  while not saving and process.poll() is None and time.time() < deadline:
    saving = [d for d in os.listdir(checkpoints) if 'tmp' in d and d.split('.')[0] != '5']
  assert saving, 'the save after the first Ctrl-C was not seen'
  process.send_signal(signal.SIGINT)
  sent = time.time()
  _, err = process.communicate(timeout=60)
  assert time.time() - sent < 5  # At once: the save was not waited for.
  assert process.returncode == errors.SECOND_INTERRUPT_STATUS, err
  assert err.decode().splitlines() == [
    'interrupted at once by a second Ctrl-C (after SIGINT): a checkpoint being written is not kept; run the same '
    'command to continue from the newest whole one'
  ]
  assert not os.path.exists(os.path.join(workdir, 'lock'))
  rerun = run(args[:-2] + ['--config.total_steps=12', '--config.checkpoint_every=5'])
  assert rerun.returncode == 0 and 'resumed from step ' in rerun.stdout, rerun.stderr


def test_tracebacks_of_dead_event_loops_interleaved_by_threads_are_dropped(monkeypatch):
  """Orbax's writer threads print their 'Event loop is closed' tracebacks at once after a full disk; interleaved,
  they are still dropped, and another thread's traceback still shown whole."""
  from vit_jax_lab import console

  out = io.StringIO()
  stream, thread = console._WithoutDeadLoopTracebacks(out), [0]
  monkeypatch.setattr(console.threading, 'get_ident', lambda: thread[0])
  dead = ['Traceback (most recent call last):\n', '  File "x.py", line 1\n', '    loop()\n']
  other = ['Traceback (most recent call last):\n', '  File "y.py", line 2\n', 'ValueError: kept\n']
  for i in range(3):  # Threads 1 and 2 print a dead loop's traceback line by line, alternately; thread 3 another.
    for t, lines in ((1, dead), (2, dead), (3, other)):
      thread[0] = t
      stream.write(lines[i])
  for t in (1, 2):
    thread[0] = t
    stream.write('RuntimeError: Event loop is closed\n')
  assert out.getvalue() == ''.join(other)


@pytest.mark.slow
def test_outputs_on_a_full_or_read_only_disk_are_one_line_and_leave_nothing(smoke_config, tmp_path, mount, capsys):
  """Exports (npz, safetensors, SavedModel) and figures: the disk named, no part of the output left behind."""
  from vit_jax_lab.tools import export, plot

  run = str(tmp_path / 'run')
  train.train_and_evaluate(smoke_config(total_steps=2, checkpoint_every=2, eval_every=2), run)
  full, read_only = mount('size=64k'), mount('ro,size=64k')
  with open(os.path.join(full, 'filler'), 'wb') as f:
    f.write(b'\0' * 60_000)  # A few kB left: less than any output.
  commands = {
    'x.npz': (export.main, ['--workdir', run]),
    'x': (export.main, ['--format', 'safetensors', '--layout', 'timm', '--workdir', run]),
    'x.png': (plot.main, [run]),
  }
  for disk, status, message in ((full, errors.DiskFull.exit_status, 'no space left at'), (read_only, 2, None)):
    for name, (command_main, args) in commands.items():
      out = os.path.join(disk, name)
      capsys.readouterr()
      assert command_main([*args, '--out', out]) == status
      err = capsys.readouterr().err
      expected = f'{message} {out}: free space' if message else f'{out} cannot be written (Read-only file system)'
      assert err.count('\n') == 1 and expected in err, err
  assert export.main(['--format', 'saved_model', '--workdir', run, '--out', os.path.join(full, 'served')]) == 74
  assert sorted(os.listdir(full)) == ['filler'] and os.listdir(read_only) == []


@pytest.mark.slow
def test_two_runs_that_start_on_one_unprepared_data_dir_both_train(tmp_path):
  """The first to take the data_dir's lock generates the dataset, the other waits and reads it (without the lock the
  second failed: TFDS could not move its own copy into place). The test holds the lock until both wait."""
  import fcntl

  data_dir = tmp_path / 'tfds'
  os.makedirs(data_dir / 'digits')
  with open(data_dir / 'digits' / '.lock_1.0.0', 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    runs = [
      subprocess.Popen(
        command(str(tmp_path / name), str(data_dir)),
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
      for name in ('a', 'b')
    ]
    waiting = [run.stdout.readline() for run in runs]
    assert waiting == [f'waiting for another run that prepares {data_dir}/digits/1.0.0\n'] * 2
  outputs = [run.communicate(timeout=300) for run in runs]
  assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
  assert sum('generating the built-in dataset digits' in out for out, _ in outputs) == 1


@pytest.mark.slow
def test_a_workdir_disk_out_of_inodes_is_named_as_such(smoke_config, mount):
  """ENOSPC says the same for bytes and for inodes; the line says which ran out, as `df -i` would."""
  workdir = os.path.join(mount('size=20m,nr_inodes=40'), 'run')
  with pytest.raises(errors.DiskFull, match=f'^no file entries \\(inodes\\) left at {workdir}/checkpoints: delete'):
    train.train_and_evaluate(smoke_config(), workdir)


def test_a_checkpoints_link_into_another_run_is_one_line(tmp_path):
  """checkpoints/ linked into another run's workdir (one with its config.json) would continue that run's weights
  under this config: one line naming both, nothing written. A link to a folder on another disk is the run's own."""
  other = tmp_path / 'other'
  (other / 'checkpoints' / '5').mkdir(parents=True)
  (other / 'config.json').write_text('{}')
  mine = tmp_path / 'mine'
  mine.mkdir()
  os.symlink(other / 'checkpoints', mine / 'checkpoints')
  with pytest.raises(ConfigError, match=r'checkpoints links to .*/other/checkpoints, the checkpoints of the run in '):
    with workdir_lib.lock(str(mine)):
      pass
  assert os.listdir(mine) == ['checkpoints']
  disk = tmp_path / 'disk' / 'run_checkpoints'
  disk.mkdir(parents=True)
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  os.symlink(disk, elsewhere / 'checkpoints')
  with workdir_lib.lock(str(elsewhere)):
    assert os.path.exists(elsewhere / 'lock')
