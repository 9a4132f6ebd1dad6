"""The experiment scripts: how they start (as modules), how they train (one helper, in this process or as the
command), what a table reports as its training time, and where it is written."""

import glob
import json
import os
import subprocess
import sys

import pytest

import main
from experiments import common
from vit_jax_lab import train


def test_training_minutes_count_runs_side_by_side_once(tmp_path):
  def run(name, kept):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'wall_seconds.json').write_text(json.dumps(kept))
    return str(tmp_path / name)

  # Two runs side by side (0-600 s and 60-660 s), then one alone after a pause (1000-1300 s): busy 660 + 300 s.
  side = [run('a', {'seconds': 600, 'start': 0, 'end': 600}), run('b', {'seconds': 600, 'start': 60, 'end': 660})]
  later = run('c', {'seconds': 300, 'start': 1000, 'end': 1300})
  assert common.training_minutes([*side, later]) == pytest.approx(960 / 60)
  assert common.training_minutes(side[:1]) == pytest.approx(10)
  assert [common.wall(w)['seconds'] for w in side] == [600, 600]
  # A run from before start and end were kept (its seconds alone): the times add up.
  old = run('d', 120.0)
  assert common.wall(old) == {'seconds': 120.0}
  assert common.training_minutes([*side, old]) == pytest.approx(1320 / 60)


SCRIPTS = sorted(
  os.path.relpath(path, common.ROOT)
  for path in glob.glob(os.path.join(common.ROOT, 'experiments', '*', '*.py'))
  if not path.endswith('__init__.py')
)


@pytest.mark.parametrize('script', SCRIPTS)
def test_a_script_run_by_its_path_names_its_module_form(script):
  module = script.removesuffix('.py').replace(os.sep, '.')
  with open(os.path.join(common.ROOT, script)) as f:
    assert f'python -m {module}' in f.read().split('"""')[1]  # Its docstring shows how to run it.
  done = subprocess.run([sys.executable, script], cwd=common.ROOT, capture_output=True, text=True)
  assert done.returncode == 1 and done.stdout == ''
  assert done.stderr == f'run from the repository root as a module: python -m {module}\n'


def test_a_run_in_this_process_gets_the_config_the_command_line_gives(monkeypatch, tmp_path):
  spec, overrides = 'configs/vit/digits.py', {'seed': 3, 'model.dropout': 0.0, 'eval.fewshot.datasets': ('digits',)}
  given = []
  monkeypatch.setattr(train, 'train_and_evaluate', lambda config, workdir: given.append(config) or {'eval/x': 1.0})
  assert common.train(spec, str(tmp_path), overrides) == {'eval/x': 1.0}
  config, workdir = main.parse_args(common.main_command(spec, str(tmp_path), common.flags(overrides))[3:])
  assert workdir == str(tmp_path) and given[0].to_dict() == config.to_dict()
  assert (config.seed, config.model.dropout, config.eval.fewshot.datasets) == (3, 0.0, ('digits',))


def test_a_separate_run_is_the_command_timed_once_and_its_last_evaluation_read_back(monkeypatch, tmp_path):
  commands = []

  def run(command, cwd, check, stdout):
    commands.append((command, cwd))
    with open(tmp_path / 'metrics.jsonl', 'w') as f:
      for line in (
        {'step': 10, 'train/loss': 1.0},
        {'step': 10, 'eval/accuracy': 0.5},
        {'step': 20, 'eval/accuracy': 0.75, 'eval/loss': 0.25},
        {'step': 20, 'eval/fewshot/digits/1shot': 0.25},  # Few-shot accuracies log on lines of their own.
      ):
        f.write(json.dumps(line) + '\n')

  monkeypatch.setattr(subprocess, 'run', run)
  final = common.train('configs/vit/digits.py', str(tmp_path), {'seed': 1}, separate=True, cores=[0, 2])
  assert final == {'step': 20, 'eval/accuracy': 0.75, 'eval/loss': 0.25}
  command = ['taskset', '-c', '0,2', sys.executable, '-m', 'main', '--config', 'configs/vit/digits.py']
  assert commands == [([*command, '--workdir', str(tmp_path), '--config.seed=1'], common.ROOT)]
  assert common.wall(str(tmp_path))['seconds'] >= 0
  # Finished: read back, not run again.
  assert common.train('configs/vit/digits.py', str(tmp_path), {'seed': 1}, separate=True) == final
  assert len(commands) == 1


def test_write_table_rewrites_between_the_markers_only(tmp_path):
  script = tmp_path / 'run.py'
  (tmp_path / 'README.md').write_text('# Title\n<!-- table -->\nold\n<!-- /table -->\nprose\n')
  common.write_table(str(script), ['| a |', '|---|'])
  assert (tmp_path / 'README.md').read_text() == '# Title\n<!-- table -->\n| a |\n|---|\n<!-- /table -->\nprose\n'
  with pytest.raises(ValueError, match='no <!-- curve --> ... <!-- /curve --> markers'):
    common.write_table(str(script), ['x'], marker='curve')
