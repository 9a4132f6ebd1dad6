"""What clusters do to runs: signals, non-finite losses, damaged checkpoints, full disks, two runs on one
workdir, files cut short by a crash. Each ends in one line, keeps what was saved, and the rerun finishes as an
uninterrupted run would. The tests that train (a few steps each) are in the slow tier."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow as tf

from conftest import load_config, wait_for_first_log
from test_train import crash_after_logging, final_params, read_metrics
from vit_jax_lab import checkpoints, errors, reporting, train, workdir as workdir_lib
from vit_jax_lab.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_same_run(config, a, b):
  """The two workdirs hold the same final checkpoint and the same logged metrics."""
  step_a, params_a, opt_a = final_params(config, a)
  step_b, params_b, opt_b = final_params(config, b)
  assert step_a == step_b == config.total_steps
  jax.tree.map(np.testing.assert_array_equal, (params_a, opt_a), (params_b, opt_b))


@pytest.fixture(scope='module')
def reference(tmp_path_factory, data_dir):
  """An uninterrupted run of the smoke config, in this process (8 devices)."""
  config = load_config('configs/vit/digits.py:smoke', data_dir)
  workdir = str(tmp_path_factory.mktemp('reference'))
  train.train_and_evaluate(config, workdir)
  return workdir


def command(workdir, data_dir, *overrides):
  return [
    sys.executable,
    '-m',
    'main',
    '--config',
    'configs/vit/digits.py:smoke',
    '--workdir',
    workdir,
    f'--config.data.data_dir={data_dir}',
    *overrides,
  ]


def environment():
  """The test processes' settings for a child (the shared compilation cache among them), on CPU devices."""
  return os.environ | {'JAX_PLATFORMS': 'cpu'}


SIGNAL_STEPS = ('--config.total_steps=120', '--config.checkpoint_every=60', '--config.eval_every=120')


def stop_by_signal(workdir, data_dir, sig) -> int:
  """Starts a run, sends it `sig` once it has logged a step, checks that it stopped as a preempted run must (the
  step saved, one line, exit status 75, the workdir's lock gone), and returns the step."""
  process = subprocess.Popen(
    command(workdir, data_dir, *SIGNAL_STEPS),
    cwd=ROOT,
    env=environment(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  wait_for_first_log(workdir, timeout=120)
  process.send_signal(sig)
  _, err = process.communicate(timeout=120)
  assert process.returncode == errors.Preempted.exit_status, err
  message = err.decode().strip()
  assert message.count('\n') == 0 and message.startswith(f'stopped by {sig.name} at step '), message
  step = int(message.split(' at step ')[1].split(':')[0])
  assert 0 < step < 120 and os.path.isdir(os.path.join(workdir, 'checkpoints', str(step)))
  assert not os.path.exists(os.path.join(workdir, 'lock'))
  return step


@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_the_rerun_equals_an_uninterrupted_run(data_dir, tmp_path):
  """A real process gets the signal mid-run: it finishes the step, saves it, says so in one line and exits 75;
  the same command then finishes exactly as a run that was never stopped."""
  whole, stopped = str(tmp_path / 'whole'), str(tmp_path / 'stopped')
  run = subprocess.run(command(whole, data_dir, *SIGNAL_STEPS), cwd=ROOT, env=environment(), capture_output=True)
  assert run.returncode == 0, run.stderr
  step = stop_by_signal(stopped, data_dir, signal.SIGTERM)
  rerun = subprocess.run(command(stopped, data_dir, *SIGNAL_STEPS), cwd=ROOT, env=environment(), capture_output=True)
  assert rerun.returncode == 0 and f'resumed from step {step}' in rerun.stdout.decode()
  whole_eval, stopped_eval = read_metrics(whole)[-1], read_metrics(stopped)[-1]
  assert whole_eval == stopped_eval and 'eval/accuracy' in whole_eval


@pytest.mark.slow
def test_ctrl_c_stops_as_sigterm_does(data_dir, tmp_path):
  """SIGINT takes the same path as SIGTERM (the rerun after it is the SIGTERM test's)."""
  stop_by_signal(str(tmp_path / 'stopped'), data_dir, signal.SIGINT)


@pytest.mark.slow
def test_a_non_finite_loss_stops_at_once_and_never_reaches_a_checkpoint(smoke_config, tmp_path, capsys):
  config = smoke_config(
    optim__lr=1e6, optim__clip_norm=0.0, total_steps=12, checkpoint_every=4, schedule__warmup_steps=0
  )
  workdir = str(tmp_path / 'run')
  with pytest.raises(errors.Diverged, match=r'not finite at step (\d+)') as stop:
    train.train_and_evaluate(config, workdir)
  bad = int(stop.value.args[0].split('at step ')[1].split(';')[0])
  saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())
  assert saved and max(saved) < bad  # Nothing from the diverged step on.
  s = train.setup(config)
  ckpt = checkpoints.Checkpointer(workdir, every=4, keep=3)
  state = ckpt.restore(max(saved), checkpoints.abstract(s.abstract_state, s.state_shardings))
  ckpt.close()
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params.to_pure_dict())))

  lower = smoke_config(
    optim__lr=1e-3, optim__clip_norm=0.0, total_steps=12, checkpoint_every=4, schedule__warmup_steps=0
  )
  with pytest.raises(ConfigError, match=r'different config \(optim.lr\).*resume_changes'):
    train.train_and_evaluate(lower, workdir)  # Never silently.
  lower.resume_changes = 'optim.lr'
  metrics = train.train_and_evaluate(lower, workdir)
  out = capsys.readouterr().out
  assert 'optim.lr changed 1000000.0 -> 0.001 (resume_changes)' in out and f'resumed from step {max(saved)}' in out
  assert np.isfinite(metrics['eval/loss'])


@pytest.mark.slow
@pytest.mark.parametrize('damage', ['truncate its data files', 'delete its data files', 'delete _METADATA'])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_used(
  smoke_config, reference, data_dir, tmp_path, damage
):
  """The rerun is a new process, as after a crash (this one's tensorstore cache still holds what it wrote)."""
  config = smoke_config()  # Checkpoints at 1, 3 and 6.
  workdir = str(tmp_path / 'run')
  shutil.copytree(reference, workdir)  # The same run: trained once for the module.
  state_dir = os.path.join(workdir, 'checkpoints', '6', 'state')
  data = os.path.join(state_dir, 'ocdbt.process_0', 'd')
  # Every data file: tensorstore can leave files the checkpoint no longer reads, so damaging one (even the
  # largest) left the checkpoint whole now and then.
  files = [os.path.join(data, f) for f in os.listdir(data)]
  if damage == 'truncate its data files':
    for path in files:
      os.truncate(path, 10)
  elif damage == 'delete its data files':
    for path in files:
      os.remove(path)
  else:
    os.remove(os.path.join(state_dir, '_METADATA'))
  rerun = subprocess.run(
    command(workdir, data_dir),
    cwd=ROOT,
    env=environment() | {'JAX_NUM_CPU_DEVICES': '8'},
    capture_output=True,
    text=True,
  )
  assert rerun.returncode == 0 and rerun.stderr == '', rerun.stderr
  out = rerun.stdout
  note = next((line for line in out.splitlines() if line.startswith('checkpoint 6 does not read whole')), None)
  assert note is not None, out  # The rerun's whole output when it saw no damage.
  moved = note.split('moved to ')[1]
  assert os.path.isdir(moved) and os.path.dirname(moved) == os.path.join(workdir, 'checkpoints_damaged')
  assert 'resumed from step 3' in out
  assert_same_run(config, workdir, reference)


@pytest.mark.slow
def test_no_readable_checkpoint_is_an_error_that_moves_nothing(smoke_config, reference, tmp_path):
  config = smoke_config()
  workdir = str(tmp_path / 'run')
  shutil.copytree(reference, workdir)
  for step in ('1', '3', '6'):
    os.remove(os.path.join(workdir, 'checkpoints', step, 'state', '_METADATA'))
  with pytest.raises(ConfigError, match='no checkpoint in .* fits this model'):
    train.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['1', '3', '6']


@pytest.fixture
def small_disk(tmp_path):
  """A 24 MB tmpfs (mounting needs root, which this project's machines and CI have): the rerun after freeing space
  holds every checkpoint, with those cut short moved aside (10 MB was too few on a loaded machine)."""
  path = str(tmp_path / 'disk')
  os.makedirs(path)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=24m', 'tmpfs', path], check=True)
  yield path
  subprocess.run(['umount', '--lazy', path], check=True)  # Lazy: orbax's threads may still hold a file.


@pytest.mark.slow
def test_a_full_disk_is_one_error_and_the_rerun_after_freeing_space_equals_an_uninterrupted_run(
  smoke_config, reference, small_disk, tmp_path
):
  config = smoke_config(total_steps=6, checkpoint_every=1, keep=100)
  workdir = os.path.join(small_disk, 'run')
  with open(os.path.join(small_disk, 'ballast'), 'wb') as f:
    f.write(b'\0' * (24 * 2**20 - 2_000_000))  # Room for about three of the six checkpoints (0.4-0.7 MB each).
  with pytest.raises(errors.DiskFull, match=f'^no space left at {workdir}'):
    train.train_and_evaluate(config, workdir)
  saved = [int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit()]
  assert saved and max(saved) < 6
  os.remove(os.path.join(small_disk, 'ballast'))
  train.train_and_evaluate(config, workdir)
  reference_run = str(tmp_path / 'reference')
  train.train_and_evaluate(config, reference_run)
  assert_same_run(config, workdir, reference_run)


@pytest.mark.slow
def test_a_second_run_on_a_workdir_is_refused_and_a_dead_holders_lock_taken_over(smoke_config, tmp_path, capsys):
  config = smoke_config()
  workdir = str(tmp_path / 'run')
  os.makedirs(workdir)
  lock = os.path.join(workdir, 'lock')
  with open(lock, 'w') as f:
    f.write(f'{socket.gethostname()} {os.getppid()}')  # A live process: pytest's parent.
  with pytest.raises(ConfigError, match=f'is in use by process {os.getppid()} on {socket.gethostname()}'):
    train.train_and_evaluate(config, workdir)
  assert os.listdir(workdir) == ['lock']  # Refused before touching anything.
  dead = subprocess.Popen(['true'])
  dead.wait()
  with open(lock, 'w') as f:
    f.write(f'{socket.gethostname()} {dead.pid}')
  train.train_and_evaluate(config, workdir)
  assert f'took over the lock of process {dead.pid}' in capsys.readouterr().out
  assert not os.path.exists(lock)  # Released at the end.
  with workdir_lib.lock(workdir):
    with pytest.raises(ConfigError, match='is in use by process'):
      train.train_and_evaluate(config, workdir)


@pytest.mark.slow
def test_a_rejected_config_leaves_no_trace_and_bad_workdirs_are_one_line(smoke_config, tmp_path):
  workdir = str(tmp_path / 'run')
  with pytest.raises(ConfigError, match='model.patch_size=3 must divide'):
    train.train_and_evaluate(smoke_config(model__patch_size=3), workdir)
  assert not os.path.exists(workdir)
  train.train_and_evaluate(smoke_config(), workdir)  # The corrected command is not refused.
  with pytest.raises(ConfigError, match='--workdir is empty'):
    train.train_and_evaluate(smoke_config(), '')
  a_file = str(tmp_path / 'file')
  open(a_file, 'w').close()
  with pytest.raises(ConfigError, match='is a file, not a folder'):
    train.train_and_evaluate(smoke_config(), a_file)


def test_a_workdir_on_a_read_only_disk_is_one_line(smoke_config, tmp_path):
  disk = str(tmp_path / 'read_only')
  os.makedirs(disk)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', disk], check=True)
  try:
    with pytest.raises(ConfigError, match=r'--workdir .*/run cannot be written \(Read-only file system\)'):
      train.train_and_evaluate(smoke_config(), os.path.join(disk, 'run'))
  finally:
    subprocess.run(['umount', disk], check=True)


@pytest.mark.parametrize('name', ['a' * 300, '/'.join(['b' * 200] * 25)])
def test_a_workdir_the_system_cannot_make_is_one_line_and_leaves_no_folder(smoke_config, tmp_path, name):
  """A name longer than the file system takes (one part, or the whole path), made part of the way."""
  with pytest.raises(ConfigError, match=r'--workdir .* cannot be written \(File name too long\): name a folder that'):
    train.train_and_evaluate(smoke_config(), str(tmp_path / 'runs' / name))
  assert os.listdir(tmp_path) == []
  with pytest.raises(ConfigError, match=r'--workdir /proc/run cannot be written \(No such file or directory\)'):
    train.train_and_evaluate(smoke_config(), '/proc/run')


@pytest.mark.slow
def test_files_cut_short_by_a_crash(smoke_config, reference, tmp_path, monkeypatch, capsys):
  """A half-written metrics line and the TensorBoard events logged after the newest checkpoint are dropped on
  resume; a damaged config.json is one line."""
  config = smoke_config()
  workdir = str(tmp_path / 'run')
  crash_after_logging(config, workdir, 5, monkeypatch)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 6, "train/lo')
  train.train_and_evaluate(config, workdir)
  assert read_metrics(workdir) == read_metrics(reference)
  logged = sorted(step for step in read_tensorboard_steps(workdir) if step > 0)
  assert logged == sorted(step for step in read_tensorboard_steps(reference) if step > 0)  # 4 and 5 once each.
  assert set(logged) == set(range(1, 7))

  config_json = os.path.join(workdir, 'config.json')
  with open(config_json) as f:
    text = f.read()
  with open(config_json, 'w') as f:
    f.write(text[: len(text) // 2])
  with pytest.raises(ConfigError, match='config.json is damaged .*: restore it from a copy, or delete it'):
    train.train_and_evaluate(config, workdir)
  os.remove(config_json)
  train.train_and_evaluate(config, workdir)  # As the message says: the run continues (here: is complete).
  assert 'the run is complete' in capsys.readouterr().out


def read_tensorboard_steps(workdir):
  return [
    tf.compat.v1.Event.FromString(r.numpy()).step
    for path in tf.io.gfile.glob(os.path.join(workdir, 'tensorboard', 'events.out.tfevents.*'))
    for r in tf.data.TFRecordDataset(path)
  ]


@pytest.mark.slow
def test_raising_total_steps_says_the_schedule_changes_and_the_end_says_where_things_are(
  smoke_config, tmp_path, capsys
):
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(smoke_config(), workdir)
  out = capsys.readouterr().out
  assert out.splitlines()[-1].startswith('done: step 6  eval/accuracy ')
  assert out.splitlines()[-1].endswith(f'workdir {workdir}  checkpoint {workdir}/checkpoints/6')
  train.train_and_evaluate(smoke_config(total_steps=8), workdir)
  out = capsys.readouterr().out
  assert 'total_steps changed 6 -> 8: the cosine learning-rate schedule now spans 8 steps' in out
  assert 'resumed from step 6' in out


def test_eta_counts_days():
  assert reporting.duration(59) == '00:00:59'
  assert reporting.duration(3 * 86_400 + 4 * 3600 + 5 * 60 + 6) == '3d 04:05:06'
  progress = reporting.Progress(10**12, 128, 0)
  assert 'ETA 11,574,074d ' in progress.line(1, 1.0, 1.0)


def test_config_mistakes_print_one_line_before_tensorflow_loads(tmp_path):
  """A config error in a real process: one line on stderr, nothing on stdout, exit 2, and TensorFlow was never
  imported (python -X importtime lists every import)."""
  result = subprocess.run(
    [sys.executable, '-X', 'importtime', '-m', 'main', '--config', 'configs/vit/digits.py', '--workdir', str(tmp_path),
     '--config.optim.lr=1e400'],
    cwd=ROOT, env=environment(), capture_output=True, text=True,
  )  # fmt: skip
  assert result.returncode == 2 and result.stdout == ''
  errors_printed = [line for line in result.stderr.splitlines() if not line.startswith('import time:')]
  assert errors_printed == ['error: optim.lr=inf is not a finite number']
  imported = [line.split('|')[-1].strip() for line in result.stderr.splitlines() if line.startswith('import time:')]
  assert 'jax' in imported and not [name for name in imported if name.split('.')[0] == 'tensorflow']


# What TensorFlow's C++ libraries print on file descriptor 2 as they load, where they turn oneDNN on.
TF_START_UP = [
  'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR',
  'I0000 00:00:1795747674.134066   28930 port.cc:153] oneDNN custom operations are on. You may see slightly '
  'different numerical results due to floating-point round-off errors from different computation orders. To turn '
  'them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.',
  'I0000 00:00:1795747674.186263   28930 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use '
  'available CPU instructions in performance-critical operations.',
  'To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the '
  'appropriate compiler flags.',
]


def stand_in_tensorflow(folder, lines: list[str]) -> dict:
  """An environment whose `tensorflow` is a stand-in in `folder` that writes `lines` straight to file descriptor 2
  as it loads (as TensorFlow's C++ libraries do, whatever the CPU here), then sets LOADED = 1."""
  (folder / 'tensorflow').mkdir()
  text = ''.join(line + '\n' for line in lines)
  (folder / 'tensorflow' / '__init__.py').write_text(f'import os\nos.write(2, {text!r}.encode())\nLOADED = 1\n')
  return environment() | {'PYTHONPATH': f'{folder}{os.pathsep}{ROOT}'}


def test_tensorflows_start_up_lines_are_dropped_wherever_it_is_first_imported(tmp_path):
  """A stand-in `tensorflow` writes, as TensorFlow's C++ libraries do where they turn oneDNN on (whatever the CPU
  here), its start-up lines straight to file descriptor 2 as it loads, and one line of its own: imported after
  console.quiet_libraries(), the start-up lines are gone, the other line kept, the module the real one."""
  lines = [*TF_START_UP[:2], 'a line of its own', *TF_START_UP]
  env = stand_in_tensorflow(tmp_path, lines)
  script = 'from vit_jax_lab import console\nconsole.quiet_libraries()\nimport tensorflow\nprint(tensorflow.LOADED)'
  quiet = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env, capture_output=True, text=True)
  assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, '1\n', 'a line of its own\n')
  verbose = subprocess.run(
    [sys.executable, '-c', script], cwd=ROOT, env=env | {'VIT_JAX_LAB_VERBOSE': '1'}, capture_output=True, text=True
  )
  assert verbose.stderr.splitlines() == lines  # VIT_JAX_LAB_VERBOSE=1 keeps them.


def test_tensorflows_start_up_lines_whenever_they_come_are_dropped_from_a_commands_output(tmp_path):
  """Where a CPU's TensorFlow writes its start-up lines when it first runs something (its oneDNN graph passes, its
  notes on CPU features; any C++ file's INFO or WARNING line before absl's log is set up), not as it loads: a
  stand-in that writes them at its second call, long after the import. A command's whole run reads file descriptor
  2 through console.library_lines_dropped: only the command's own line and a C++ error line are left."""
  env = stand_in_tensorflow(tmp_path, [])
  later = [
    *TF_START_UP,
    'W0000 00:00:1795747675.000001   28930 onednn_graph_util.cc:42] oneDNN graph rewrite on',
    'E0000 00:00:1795747675.000002   28930 some_kernel.cc:7] a real error',
  ]
  text = ''.join(line + '\n' for line in later)
  (tmp_path / 'tensorflow' / '__init__.py').write_text(
    'import os\nCALLS = []\n'
    f'def run(x):\n  CALLS.append(x)\n  os.write(2, {text!r}.encode()) if len(CALLS) == 2 else None\n  return x\n'
  )
  script = (
    'import sys\nfrom vit_jax_lab import console, errors\nconsole.quiet_libraries()\n'
    '@console.command\ndef main(argv):\n  import tensorflow as tf\n  tf.run(1), tf.run(2)\n'
    "  print('done', file=sys.stderr)\n  raise errors.ConfigError('a bad value')\n"
    'sys.exit(main([]))'
  )
  quiet = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env, capture_output=True, text=True)
  assert (quiet.returncode, quiet.stdout) == (2, '')
  assert quiet.stderr.splitlines() == [later[-1], 'done', 'error: a bad value']
  verbose = subprocess.run(
    [sys.executable, '-c', script], cwd=ROOT, env=env | {'VIT_JAX_LAB_VERBOSE': '1'}, capture_output=True, text=True
  )
  assert verbose.stderr.splitlines() == [*later, 'done', 'error: a bad value']  # VIT_JAX_LAB_VERBOSE=1 keeps them.


def test_a_mistake_in_a_config_that_imports_tensorflow_is_one_line(tmp_path):
  """A user's config file may import TensorFlow itself, before the command has parsed a single value: its start-up
  lines (forced by a stand-in, on every CPU) must not come before the one line its mistake gets."""
  env = stand_in_tensorflow(tmp_path, TF_START_UP)
  (tmp_path / 'mine.py').write_text(
    'import tensorflow  # noqa: F401\n\n'
    'from vit_jax_lab import config as config_lib, models, tasks\n\n\n'
    'def get_config():\n'
    '  c = config_lib.base_config()\n'
    "  c.model, c.task = models.config('vit', variant='Ti/2'), tasks.config('classification')\n"
    '  return c\n'
  )
  command = [sys.executable, '-m', 'main', '--config', str(tmp_path / 'mine.py'), '--workdir', str(tmp_path / 'run')]
  result = subprocess.run([*command, '--config.optim.lr=-1'], cwd=ROOT, env=env, capture_output=True, text=True)
  assert (result.returncode, result.stdout, result.stderr) == (2, '', 'error: optim.lr=-1.0 must be positive\n')
  assert not (tmp_path / 'run').exists()


# main.main with the command line after '--', then whether TensorFlow was imported, on stdout: the tests below
# check that the mistake was found after it loaded, which is when its start-up lines could leak.
MAIN_THEN_SAY_IF_TF = (
  'import sys\nimport main\ncode = main.main(sys.argv[sys.argv.index("--") + 1:])\n'
  'print("tensorflow loaded:", "tensorflow" in sys.modules)\nsys.exit(code)'
)


@pytest.mark.slow
@pytest.mark.parametrize(
  'fresh, override, message, loaded',
  [
    # A dataset not yet generated: the model is checked first on the shapes its builder declares, so nothing is
    # written and TensorFlow (which TFDS writes records with) never loads.
    (True, '--config.model.patch_size=3', 'model.patch_size=3 must divide the image size 8x8', False),
    # The few-shot evaluator reads its datasets with tf.data: checked after TensorFlow loads.
    (False, "--config.eval.fewshot.datasets=('nope',)", "eval.fewshot.datasets: data.name='nope' is not a TFDS", True),
  ],
)
def test_a_mistake_is_one_line_with_onednn_on_before_or_after_tensorflow_loads(
  data_dir, tmp_path, fresh, override, message, loaded
):
  """TF_ENABLE_ONEDNN_OPTS=1 makes TensorFlow print its start-up lines on CPUs that have the instructions (not on
  every CPU: where it prints none, this passes trivially; the import-hook test above forces them)."""
  data = str(tmp_path / 'fresh') if fresh else data_dir
  argv = command(str(tmp_path / 'run'), data, override)[3:]  # After `python -m main`.
  result = subprocess.run(
    [sys.executable, '-c', MAIN_THEN_SAY_IF_TF, '--', *argv],
    cwd=ROOT, env=environment() | {'TF_ENABLE_ONEDNN_OPTS': '1'}, capture_output=True, text=True,
  )  # fmt: skip
  assert result.returncode == 2 and result.stdout.splitlines()[-1] == f'tensorflow loaded: {loaded}', result.stdout
  assert result.stderr.splitlines() == [result.stderr.splitlines()[0]] and result.stderr.startswith(f'error: {message}')
  assert len(result.stdout.splitlines()) == 1  # No "generating the built-in dataset" line.
  if fresh:
    assert not os.path.exists(os.path.join(data, 'digits'))


def test_an_abandoned_checkpoint_read_collected_late_prints_nothing():
  """After a damaged checkpoint is set aside, orbax's abandoned reads can be collected at any later point: their
  'never awaited' warnings and their futures' 'exception was never retrieved' are dropped; another coroutine's or
  another failure's still shown."""
  orbax, other = os.path.join(os.sep, 'site', 'orbax'), os.path.join(os.sep, 'site', 'other')
  script = ['import asyncio, gc, os, sys', 'from vit_jax_lab import console', 'console.quiet_libraries()']
  # Both cases in one process (one TensorFlow import), each after a marker line on stderr.
  for case, (coroutine, where) in enumerate((('_read_array_index_and_device_put', orbax), ('elsewhere', other))):
    script += [
      f'print("case {case}", file=sys.stderr, flush=True)',
      f'async def {coroutine}(): pass',
      f'coroutine = {coroutine}()',
      'del coroutine',
      f"exec(compile('async def read(): raise ValueError(1)', os.path.join({where!r}, 'read.py'), 'exec'))",
      'async def abandon():\n  future = asyncio.gather(read())\n  await asyncio.sleep(0.01)',
      'asyncio.run(abandon())',
      'gc.collect()',
    ]
  run = subprocess.run(
    [sys.executable, '-c', '\n'.join(script)], cwd=ROOT, env=environment(), capture_output=True, text=True
  )
  assert run.returncode == 0, run.stderr
  cases = run.stderr.split('case 1\n')
  assert len(cases) == 2, run.stderr
  for stderr, expected in zip(cases, ((False, False), (True, True))):
    printed = ('was never awaited' in stderr, 'exception was never retrieved' in stderr)
    assert printed == expected, run.stderr


@pytest.mark.slow
def test_a_run_prints_its_own_lines_only(data_dir, tmp_path):
  fresh_data = str(tmp_path / 'tfds')  # A first run: the dataset is generated, without progress bars.
  result = subprocess.run(
    command(str(tmp_path / 'run'), fresh_data, '--config.total_steps=2', '--config.eval_every=2'),
    cwd=ROOT, env=environment(), capture_output=True, text=True,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr
  assert result.stderr == ''
  lines = result.stdout.splitlines()
  assert lines[0] == f'generating the built-in dataset digits in {fresh_data}/digits/1.0.0 (once, without network)'
  assert lines[1] == 'parameters:' and lines[-1].startswith('done: step 2')
  assert not any('\x1b' in line or 'absl' in line or 'WARNING' in line for line in lines)


def test_init_from_files_that_are_not_npz_are_one_line(smoke_config, tmp_path):
  cases = {'empty.npz': b'', 'text.npz': b'not an archive\n', 'truncated.npz': None}
  np.savez(tmp_path / 'whole.npz', a=np.zeros(1000))
  with open(tmp_path / 'whole.npz', 'rb') as f:
    cases['truncated.npz'] = f.read()[:300]
  for name, content in cases.items():
    path = str(tmp_path / name)
    with open(path, 'wb') as f:
      f.write(content)
    with pytest.raises(ConfigError, match=f"init_from='{path}' is not a readable .npz file"):
      checkpoints.read_npz(path)
  workdir = str(tmp_path / 'run')
  with pytest.raises(ConfigError, match='is not a readable .npz file'):
    train.train_and_evaluate(smoke_config(init_from=path), workdir)
  assert not os.path.exists(workdir)  # Checked before the run wrote anything: the corrected command runs.


def test_absurd_sizes_are_refused_before_compiling(smoke_config):
  with pytest.raises(ConfigError, match=r'data.eval_batch_size=1000000000 is larger than the eval split needs'):
    train.setup(smoke_config(data__eval_batch_size=10**9), given={'data.eval_batch_size'})
  with pytest.raises(ConfigError, match=r'the parameters and optimizer state need [\d,.]+ GiB per device'):
    train.setup(smoke_config(model__width=10**6, model__num_heads=1))


def test_resume_changes_names_only_optimizer_and_schedule_keys(smoke_config):
  from vit_jax_lab import config as config_lib

  config = smoke_config(resume_changes='optim.lr, schedule')
  config_lib.validate(config)
  for bad in ('model.width', 'optim.nope', 'data'):
    with pytest.raises(ConfigError, match='resume_changes'):
      config_lib.validate(smoke_config(resume_changes=bad))
  assert json.dumps(config_lib.resume_changes(config)) == '["optim.lr", "schedule"]'
