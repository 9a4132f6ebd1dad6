"""The command line: overrides reach the model; every user mistake is one line and exit status 2."""

import os
import subprocess
import sys

import pytest

import main
from conftest import console_script, elsewhere_env, without_packages
from vit_jax_lab import config as config_lib, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, 'configs/vit/digits.py')


def test_override_reaches_the_model(data_dir):
  config, workdir = main.parse_args(
    [
      '--config',
      CONFIG,
      '--workdir',
      'w',
      f'--config.data.data_dir={data_dir}',
      '--config.model.width=48',
      '--config.model.num_heads=3',
      '--config.model.pool=tok',
      '--config.optim.lr=0.01',
    ]
  )
  assert (workdir, config.model.width, config.optim.lr) == ('w', 48, 0.01)
  params = train.setup(config).abstract_state.params
  assert params['cls'].shape == (1, 1, 48)
  assert params['encoder']['blocks'][0]['attn']['qkv']['kernel'].shape == (48, 144)


@pytest.mark.parametrize(
  'overrides, message',
  [
    (['--config.model.widht=3'], "unknown config key 'model.widht': did you mean 'model.width'? valid keys at model"),
    (['--config.modle.width=3'], "unknown config key 'modle.width': did you mean 'model'? valid keys at the top"),
    (['--config.optim.lr=nan'], 'optim.lr=nan is not a finite number'),
    ([f'--config.total_steps={"9" * 5000}'], f'--config.total_steps={"9" * 60}...: expected int'),
    (['--config.data.batch_size=lots'], '--config.data.batch_size=lots: expected int'),
    (['--config.data.batch_size=1.5'], '--config.data.batch_size=1.5: expected int'),
    (['--config.model.patch_size=3'], 'model.patch_size=3 must divide the image size 8x8'),
    (['--config.data.image_size=9'], 'model.patch_size=2 must divide the image size 9x9'),
    (['--config.model.num_heads=5'], 'model.width=64 must be divisible by model.num_heads=5'),
    (['--config.data.batch_size=100'], 'data.batch_size=100 must be divisible by the 8 batch shards'),
    (['--config.data.eval_batch_size=60'], 'data.eval_batch_size=60 must be divisible by the 8 batch shards'),
    (['--config.data.name=no_such_dataset'], "data.name='no_such_dataset' is not a TFDS dataset"),
    (['--config.data.name=mnist'], "data.name='mnist' is not prepared in data.data_dir="),
    # Names TFDS cannot parse, or whose config or version the dataset lacks: its own errors were tracebacks.
    (['--config.data.name=0'], "data.name='0': Parsing builder name string 0 failed; a TFDS name is NAME[/CONFIG]"),
    (['--config.data.name=mnist/nope'], "data.name='mnist/nope': BuilderConfig nope not found with version"),
    (['--config.data.name=mnist:9.9.9'], "data.name='mnist:9.9.9': Dataset mnist cannot be loaded at version 9.9.9"),
    (
      ['--config.data.data_dir=/no/such/dir', '--config.data.name=mnist'],
      "data.data_dir='/no/such/dir' does not exist",
    ),
    (['--config.data.eval_split=validation'], "data.eval_split='validation' is not a split of digits"),
    (['--config.data.train_split=train[:0%]'], "data.train_split='train[:0%]' of digits holds no examples"),
    (['--config.data.eval_split=test[5:5]'], "data.eval_split='test[5:5]' of digits holds no examples"),
    (['--config.model.name=resnet'], "model.name='resnet' is not one of vit"),
    (['--config.model.name=transformer'], "model.name='transformer' takes no model.class_token, model.depth"),
    (['--config.task.name=seq2seq'], "task.name='seq2seq' takes no task.cutmix, task.mix_switch_prob, task.mixup"),
    (['--config.model.variant=Q/16'], "model.variant='Q/16': expected SIZE[/PATCH]"),
    (['--config.model.pool=max'], "model.pool='max' is not one of 'tok', 'gap'"),
    (['--config.optim.name=lamb'], "optim.name='lamb' is not one of 'adamw', 'sgd'"),
    (['--config.schedule.decay=step'], "schedule.decay='step' is not one of"),
    (['--config.schedule.warmup_steps=5000'], 'schedule.warmup_steps=5000 must be between 0 and total_steps=1800'),
    (['--config.mesh.fsdp=3'], "mesh: {'data': -1, 'fsdp': 3, 'model': 1} does not fit 8 devices"),
    (['--config.mesh.data=2'], "mesh: {'data': 2, 'fsdp': 1, 'model': 1} uses 2 devices but there are 8"),
    (['--config.task.label_smoothing=1.0'], 'task.label_smoothing=1.0 must be in [0, 1)'),
    (['--config.data.shards=3'], 'data.batch_size=128 must be divisible by data.shards=3'),
    (['--config.data.shuffle_buffer=-5'], 'data.shuffle_buffer=-5 must be positive (1: no shuffling)'),
    (['--config.model=3'], '--config.model is a group'),
    (['--config.seed=-1'], 'seed=-1 must be in [0, 2**32)'),
    (['--config.accum_steps=3'], 'data.batch_size=128 must be divisible by accum_steps=3 x 8 batch shards'),
    (['--config.init_from=/no/such.npz'], "init_from='/no/such.npz' does not exist"),
    (['--config.model.dropout=1.0'], 'model.dropout=1.0 must be in [0, 1)'),
    (['--config.model.layernorm_epsilon=-1'], 'model.layernorm_epsilon=-1.0 must be a non-negative number'),
    (['--config.model.representation_size=0'], 'model.representation_size=0 must be a positive integer or None'),
    (['--config.optim.b1=-1'], 'optim.b1=-1.0 must be in [0, 1)'),
    (['--config.optim.b2=1'], 'optim.b2=1.0 must be in [0, 1)'),
    (['--config.optim.eps=0'], 'optim.eps=0.0 must be positive'),
    (['--config.model.attention_impl=cudnn'], "model.attention_impl='cudnn' takes bf16 or fp16 only"),
    (['--batch_size=3'], "unrecognised argument '--batch_size=3'"),
  ],
)
def test_bad_config_is_one_line_and_exit_2(overrides, message, data_dir, tmp_path, capsys):
  workdir = str(tmp_path / 'run')
  argv = ['--config', CONFIG, '--workdir', workdir, f'--config.data.data_dir={data_dir}', *overrides]
  assert main.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1, err
  assert message in err
  assert not os.path.exists(workdir)  # Failed before anything was written.


def test_missing_config_file(capsys, monkeypatch, tmp_path):
  assert main.main(['--config', 'configs/vit/nope.py', '--workdir', 'w']) == 2
  assert "no config file 'configs/vit/nope.py' here or in " in capsys.readouterr().err
  # A `pip install .` (not -e) has no clone beside the package: the line says where the configs are.
  monkeypatch.setattr(config_lib, 'CONFIGS', str(tmp_path / 'site-packages' / 'configs'))
  assert main.main(['--config', 'vit/digits', '--workdir', 'w']) == 2
  err = capsys.readouterr().err
  assert 'this install has no configs folder (they live in the clone): install with pip install -e .' in err


def test_a_config_that_is_not_a_python_file_is_one_line(capsys):
  """--config README.md used to end in a 22-line AttributeError traceback (Python finds no loader for it)."""
  assert main.main(['--config', 'README.md', '--workdir', 'w']) == 2
  err = capsys.readouterr().err
  assert err == 'error: --config: README.md is not a Python file; a config is a .py file defining get_config(arg)\n'
  assert not os.path.exists('w')


def test_a_config_resolves_from_any_folder(tmp_path, monkeypatch):
  """From another folder, the clone's configs/vit/digits.py, and its short form vit/digits."""
  monkeypatch.chdir(tmp_path)
  full, short = config_lib.load('configs/vit/digits.py:smoke'), config_lib.load('vit/digits:smoke')
  assert full.to_dict() == short.to_dict() and full.total_steps == 6


def test_real_process_exits_2_without_traceback(tmp_path):
  result = subprocess.run(
    [sys.executable, '-m', 'main', '--config', CONFIG, '--workdir', str(tmp_path), '--config.optim.lr=fast'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == 'error: --config.optim.lr=fast: expected float'
  assert 'Traceback' not in result.stderr


def test_a_run_recorded_before_the_code_gained_keys_still_resumes(smoke_config, tmp_path):
  """config.json of an older version lacks the keys added since: they take their defaults, not a change; a
  changed value is still refused."""
  import json

  from vit_jax_lab import workdir as workdir_lib
  from vit_jax_lab.errors import ConfigError

  workdir, config = str(tmp_path), smoke_config()
  os.makedirs(os.path.join(workdir, 'checkpoints', '1'))  # A run that trained (one without a checkpoint holds none).
  assert workdir_lib.record_config(config, workdir) == []
  path = os.path.join(workdir, 'config.json')
  with open(path) as f:
    older = json.load(f)
  del older['ema_decay'], older['data']['token_budget'], older['model']['attention_dropout']
  with open(path, 'w') as f:
    json.dump(older, f)
  assert workdir_lib.record_config(config, workdir) == []
  with pytest.raises(ConfigError, match=r'different config \(optim.lr\)'):
    workdir_lib.record_config(smoke_config(optim__lr=0.5), workdir)
  with open(path) as f:
    older = json.load(f) | {'gone_key': 1}
  with open(path, 'w') as f:
    json.dump(older, f)
  with pytest.raises(ConfigError, match='config.json has key gone_key, which this code does not know'):
    workdir_lib.record_config(config, workdir)


def test_init_from_a_model_without_load_pretrained_is_one_line(data_dir, tmp_path):
  from conftest import load_config
  from vit_jax_lab import tasks
  from vit_jax_lab.errors import ConfigError

  config = load_config('configs/lra/listops.py:smoke', data_dir, init_from=str(tmp_path))
  info, _ = tasks.build(config.task).synthetic_batch('32,20,10', config.data.batch_size)
  with pytest.raises(ConfigError, match='init_from: a text_classifier model cannot start from other weights'):
    train.setup(config, data=(None, info))


@pytest.mark.parametrize(
  'override, message',
  [
    ('--config.model.patch_size=3', 'model.patch_size=3 must divide the image size 8x8'),
    ('--config.data.train_split=training', "data.train_split='training' is not a split of digits"),
  ],
)
def test_data_and_model_mistakes_are_answered_before_tensorflow_loads(override, message, data_dir, tmp_path):
  """TensorFlow unimportable: the run still reads a prepared dataset's info and checks the model, so the mistake is
  its one line, and on every CPU (no TensorFlow start-up line can come before it), with nothing written."""
  workdir = tmp_path / 'run'
  command = [sys.executable, '-m', 'main', '--config', 'configs/vit/digits.py', '--workdir', str(workdir)]
  command += [f'--config.data.data_dir={data_dir}', override]
  done = subprocess.run(
    command, cwd=ROOT, env=without_packages(tmp_path, ('tensorflow',)), capture_output=True, text=True
  )
  assert done.returncode == 2, done.stderr[-1500:]
  lines = (done.stdout + done.stderr).splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'error: {message}'), lines
  assert not workdir.exists()


def test_the_command_is_not_shadowed_by_a_main_py_in_the_working_folder(tmp_path):
  """`vit-jax-lab` (pyproject's script) runs the project's main even where the user's own main.py lies."""
  (tmp_path / 'main.py').write_text('raise SystemExit("the user\'s main.py ran")\n')
  os.makedirs(tmp_path / 'bin')
  done = subprocess.run(
    [
      console_script(tmp_path / 'bin'),
      '--config',
      'vit/digits',
      '--workdir',
      str(tmp_path / 'run'),
      '--config.optim.lr=-1',
    ],
    cwd=tmp_path,
    env=elsewhere_env(),
    capture_output=True,
    text=True,
  )
  assert (done.returncode, done.stderr.strip()) == (2, 'error: optim.lr=-1.0 must be positive')


def test_tools_evaluate_names_the_eval_batch_it_was_given(data_dir, capsys):
  """tools.evaluate runs with data.batch_size set to data.eval_batch_size: a bad one is named as the user gave it."""
  from vit_jax_lab.tools import evaluate

  argv = ['--config', CONFIG, f'--config.data.data_dir={data_dir}', '--config.data.eval_batch_size=-1']
  assert evaluate.main(argv) == 2
  assert capsys.readouterr().err == 'error: data.eval_batch_size=-1 must be positive\n'
