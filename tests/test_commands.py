"""What every command relies on: one way to start each, and the task methods they call instead of task names."""

import importlib
import os
import subprocess
import sys

import pytest

import vit_jax_lab
from conftest import without_packages
from vit_jax_lab import console, tasks
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tasks.base import Task
from vit_jax_lab.tools import bench, predict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACKING = os.path.join(ROOT, 'configs/tracking/digits.py:mlp,smoke')

# What the commands call on a task, by what it predicts (tools.predict, tools.export, tools.bench --decode).
NEEDS = {
  'classes': ('logits', 'predict', 'input_kind', 'blank_targets', 'synthetic_batch'),
  'text': ('generate', 'predict', 'input_kind', 'blank_targets', 'synthetic_batch'),
  'boxes': (),
  None: (),
}


@pytest.mark.parametrize('name', vit_jax_lab.MOVED_COMMANDS)
def test_an_old_command_form_names_the_new_one(name):
  result = subprocess.run(
    [sys.executable, '-m', f'vit_jax_lab.{name}', '--help'], cwd=ROOT, capture_output=True, text=True, timeout=60
  )
  assert result.returncode == 2 and result.stdout == ''
  assert result.stderr == f'error: python -m vit_jax_lab.{name} is now python -m vit_jax_lab.tools.{name}\n'


TOOLS = sorted(  # The commands: the modules of tools/ with a main (common, predictors, pretrained are their parts).
  os.path.splitext(name)[0]
  for name in os.listdir(os.path.join(ROOT, 'vit_jax_lab', 'tools'))
  if name.endswith('.py') and '\ndef main(' in open(os.path.join(ROOT, 'vit_jax_lab', 'tools', name)).read()
)


@pytest.mark.slow
def test_every_tools_help_answers_without_tensorflow(tmp_path):
  """TensorFlow unimportable: each command's --help still answers (TensorFlow loads only when data is read), so
  it costs no 5 s of TensorFlow and prints none of its start-up lines, on any CPU."""
  env = without_packages(tmp_path, ('tensorflow',))
  for name in TOOLS:
    done = subprocess.run(
      [sys.executable, '-m', f'vit_jax_lab.tools.{name}', '--help'], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (0, ''), (name, done.stderr[-800:])
    assert done.stdout.startswith('usage: '), name


@pytest.mark.parametrize('name', TOOLS)
def test_every_tools_argument_mistake_is_one_line(name, capsys):
  """An option no tool has, or a required one left out: one `error:` line and exit status 2 (console.Parser), not
  argparse's usage block."""
  tool = importlib.import_module(f'vit_jax_lab.tools.{name}')
  assert tool.main(['--no-such-option']) == 2
  captured = capsys.readouterr()
  assert captured.out == '' and len(captured.err.splitlines()) == 1 and captured.err.startswith('error: ')


def test_held_stderr_holds_what_python_and_c_write(capsys):
  """A damaged checkpoint's abandoned reads print tracebacks through sys.stderr, which a notebook or a test's
  capture points away from descriptor 2: both are held, and given back only when asked."""
  for replay in (False, True):
    with console.held_stderr() as held:
      print('from python', file=sys.stderr)
      os.write(2, b'from c\n')
      held['replay'] = replay
    assert held['text'] == b'from python\nfrom c\n'
    assert capsys.readouterr().err == ('from python\nfrom c\n' if replay else '')


def test_an_old_command_module_does_not_import():
  with pytest.raises(ImportError, match='python -m vit_jax_lab.tools.predict'):
    from vit_jax_lab import predict as _  # noqa: F401


@pytest.mark.parametrize('name', sorted(tasks.TASKS))
def test_a_task_implements_what_it_predicts(name):
  task = tasks.TASKS[name]
  assert task.predicts in NEEDS
  missing = [method for method in NEEDS[task.predicts] if getattr(task, method) is getattr(Task, method)]
  assert not missing, f'{name} predicts {task.predicts} without {missing}'


def test_synthetic_inputs_name_their_form():
  classification, seq2seq, tracking = (
    tasks.build(tasks.config(name)) for name in ('classification', 'seq2seq', 'tracking')
  )
  info, batch = classification.synthetic_batch('2,8,8,3,5', 4)
  assert info.input_key == 'video' and batch['inputs'].shape == (4, 2, 8, 8, 3) and batch['label'].max() < 5
  info, batch = seq2seq.synthetic_batch('7,20', 3)
  assert batch['inputs'].shape == batch['targets'].shape == (3, 7) and batch['targets'].max() < info.target_vocab.size
  with pytest.raises(ConfigError, match='expected LENGTH,VOCAB'):
    seq2seq.synthetic_batch('7,x', 3)
  with pytest.raises(ConfigError, match='no synthetic inputs'):
    tracking.synthetic_batch('8,8,3', 2)


def test_commands_refuse_what_the_task_does_not_predict(tmp_path, capsys):
  weights = tmp_path / 'weights.npz'
  weights.write_bytes(b'')
  argv = ['--config', TRACKING, f'--config.init_from={weights}', 'frame.png']
  assert predict.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'predicts boxes' in err and 'python -m vit_jax_lab.tools.track' in err
  assert bench.main(['--steps', '0', '--config', TRACKING, '--synthetic', '8,8,3']) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'no synthetic inputs: time it on its dataset' in err
