"""The experiment scripts: how they start (as modules), how they train (one helper, in this process or as the
command), what a table reports as its training time, and where it is written."""

import glob
import json
import os
import subprocess
import sys

import pytest

import conftest
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


def _readme_copies(tmp_path) -> str:
  """Copies of the two READMEs the GPU parts write, as --readme_dir takes them."""
  for name in ('throughput', 'attention_scaling'):
    (tmp_path / 'readmes' / name).mkdir(parents=True)
    with open(os.path.join(common.ROOT, 'experiments', name, 'README.md')) as f:
      (tmp_path / 'readmes' / name / 'README.md').write_text(f.read())
  return str(tmp_path / 'readmes')


def _section(path: str, marker: str) -> str:
  with open(path) as f:
    text = f.read()
  return text[text.index(f'<!-- {marker} -->') : text.index(f'<!-- /{marker} -->')]


@pytest.mark.slow
@pytest.mark.parametrize(
  'part, readme, marker, rows',
  [
    (1, 'throughput', 'gpu', ['| ViT-Ti/16 bf16 cuDNN |', '| ViT-S/16 bf16 cuDNN |']),
    (2, 'throughput', 'profile', ['| 1 |', '| 20 |', '| every op |']),
    (3, 'attention_scaling', 'table', ['**One self-attention layer', '| full | ', '| linear | ']),
    (4, 'throughput', 'levers', ['| ViT-B/16 baseline |', '| ViT-B/16 no Triton GEMMs |']),
    (5, 'attention_scaling', 'table', ['**ViT-Ti/16 train step**', '| full | ', '| linear | ']),
  ],
)
def test_every_gpu_part_runs_at_toy_sizes_without_tensorflow(tmp_path, part, readme, marker, rows):
  """The GPU parts (experiments/throughput/run.py gpu --part N) on CPU at toy sizes, in processes that cannot import
  what a GPU machine lacks: no part meets a GPU for the first time."""
  readmes = _readme_copies(tmp_path)
  command = [sys.executable, '-m', 'experiments.throughput.run', 'gpu', '--part', str(part), '--tiny']
  command += ['--readme_dir', readmes, '--trace_dir', str(tmp_path / 'trace')]
  env = conftest.without_packages(tmp_path)
  done = subprocess.run(command, cwd=common.ROOT, env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  section = _section(os.path.join(readmes, readme, 'README.md'), marker)
  assert all(row in section for row in rows), section
  if readme == 'attention_scaling':  # Every cell of its table measured.
    assert '—' not in section and ' ms / ' in section


@pytest.mark.slow
def test_a_gpu_part_cut_off_keeps_the_rows_it_measured(tmp_path):
  readmes = _readme_copies(tmp_path)
  command = [sys.executable, '-m', 'experiments.throughput.run', 'gpu', '--part', '1', '--tiny']
  process = subprocess.Popen(
    [*command, '--readme_dir', readmes],
    cwd=common.ROOT,
    env=conftest.without_packages(tmp_path),
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
  )
  first = next(line for line in process.stdout if line.startswith('{'))  # The first row is measured.
  process.kill()
  process.wait()
  section = _section(os.path.join(readmes, 'throughput', 'README.md'), 'gpu')
  assert json.loads(first)['config'] == 'ViT-Ti/16 bf16 cuDNN'
  assert '| ViT-Ti/16 bf16 cuDNN | vit |' in section and 'ViT-S/16' not in section
