"""Few-shot linear evaluation (vit_jax_lab/evaluators/fewshot.py): the ridge solve, the draws, the features in split
order, the periodic evaluator of a run and the command (vit_jax_lab/tools/fewshot.py)."""

import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from vit_jax_lab import config as config_lib, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.evaluators import fewshot
from vit_jax_lab.tools import fewshot as fewshot_tool


@pytest.mark.parametrize('n, d', [(40, 7), (6, 30), (12, 12)])
def test_ridge_is_the_regularised_least_squares_solution(n, d):
  rng = np.random.default_rng(n * d)
  x, y, l2 = rng.normal(size=(n, d)), rng.normal(size=(n, 3)), 0.7
  # Ridge is least squares on x stacked over sqrt(l2) I, with zero targets below y.
  stacked_x, stacked_y = np.vstack([x, np.sqrt(l2) * np.eye(d)]), np.vstack([y, np.zeros((d, 3))])
  expected = np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0]
  np.testing.assert_allclose(fewshot.ridge(x, y, l2), expected, rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(fewshot.ridge(x, y, l2), np.linalg.solve(x.T @ x + l2 * np.eye(d), x.T @ y), atol=1e-9)


def test_ridge_recovers_an_exact_linear_map_and_separates_separable_features():
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=(50, 8)), rng.normal(size=(8, 4))
  np.testing.assert_allclose(fewshot.ridge(x, x @ w, 1e-12), w, atol=1e-8)
  # Fewer points than dimensions: with a vanishing penalty the fit interpolates the {-1, 1} targets exactly.
  features, labels = rng.normal(size=(10, 64)), np.arange(10) % 5
  probe = fewshot.LinearProbe.fit(features, labels, 5, l2_reg=1e-9)
  np.testing.assert_allclose(probe.scores(features), 2.0 * np.eye(5)[labels] - 1.0, atol=1e-5)
  assert probe.accuracy(features, labels) == 1.0


def test_draws_hold_exactly_k_of_every_class_and_follow_the_seed():
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 7, size=500)
  shots = (1, 5, 10, 25)
  for seed in range(5):
    for index in range(3):
      d, again = fewshot.draw(labels, 7, shots, index, seed), fewshot.draw(labels, 7, shots, index, seed)
      assert all(np.array_equal(d[k], again[k]) for k in shots)  # A pure function of its arguments.
      for k in shots:
        assert len(set(d[k])) == 7 * k
        np.testing.assert_array_equal(np.bincount(labels[d[k]], minlength=7), np.full(7, k))
      assert set(d[1]) < set(d[5]) < set(d[10]) < set(d[25])  # Larger k extend smaller ones.
  picked = [tuple(fewshot.draw(labels, 7, (5,), index, seed)[5]) for seed in range(5) for index in range(3)]
  assert len(set(picked)) == len(picked)  # Every (seed, draw) differs.


def test_well_separated_classes_are_classified_perfectly_at_5_shots():
  rng = np.random.default_rng(2)
  centres = 10.0 * rng.normal(size=(6, 32))

  def sample(n):
    y = rng.integers(0, 6, size=n)
    return centres[y] + rng.normal(size=(n, 32)), y

  (x, y), test = sample(300), sample(200)
  draws = [fewshot.draw(y, 6, (5,), i, 0) for i in range(4)]
  np.testing.assert_array_equal(fewshot.accuracies(draws, (x, y), test, 6, 2.0**10)[5], np.ones(4))


def test_first_examples_cuts_any_split_spec(smoke_config):
  s = train.setup(smoke_config())
  assert fewshot.first_examples(s.builder, 'train', 100) == 'train[0:100]'
  assert fewshot.first_examples(s.builder, 'train', 10**6) == 'train[0:1437]'
  assert fewshot.first_examples(s.builder, 'train[1430:]+test', 10) == 'train[1430:1437]+test[0:3]'


@pytest.mark.parametrize(
  'key, value, message',
  [
    ('datasets', ('digits', 'digits'), 'eval.fewshot.datasets='),
    ('datasets', ('',), 'eval.fewshot.datasets='),
    ('shots', (), 'eval.fewshot.shots='),
    ('shots', (0, 5), 'eval.fewshot.shots='),
    ('shots', (5, 5), 'eval.fewshot.shots='),
    ('draws', 0, 'eval.fewshot.draws=0'),
    ('draws', 10**12, 'eval.fewshot.draws=1000000000000 must be from 1 to 1,000'),
    ('every', -1, 'eval.fewshot.every=-1'),
    ('l2_reg', 0.0, 'eval.fewshot.l2_reg=0.0'),
    ('max_train', 0, 'eval.fewshot.max_train=0'),
    ('test_split', ' ', 'eval.fewshot.test_split is empty'),
  ],
)
def test_bad_config_values_are_one_line_errors(key, value, message):
  config = config_lib.base_config()
  config.eval.fewshot[key] = value
  with pytest.raises(ConfigError) as e:
    config_lib.validate(config)
  assert str(e.value).startswith(message) and '\n' not in str(e.value)


@pytest.mark.parametrize(
  'overrides, message',
  [
    (dict(datasets=('nope',)), "eval.fewshot.datasets: data.name='nope' is not a TFDS dataset"),
    (dict(train_split='validation'), "eval.fewshot.datasets: eval.fewshot.train_split='validation' is not a split"),
    (dict(test_split='tset'), "eval.fewshot.datasets: eval.fewshot.test_split='tset' is not a split"),
    (dict(test_split='test[:0]'), "eval.fewshot.datasets: eval.fewshot.test_split='test[:0]' of digits holds no"),
    (
      dict(max_train=100),
      'examples in train[0:100], fewer than 25 shots: lower the shots (eval.fewshot.shots, --shots) or raise '
      'eval.fewshot.max_train',
    ),
  ],
)
def test_dataset_mistakes_stop_the_run_before_it_writes(smoke_config, tmp_path, overrides, message):
  config = smoke_config()
  config.eval.fewshot.update(dict(datasets=('digits',)) | overrides)
  with pytest.raises(ConfigError) as e:
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert message in str(e.value) and '\n' not in str(e.value)
  assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_features_come_in_split_order_on_any_device_and_shard_count(smoke_config):
  features, draws = [], []
  for devices, shards in ((1, -1), (8, 8), (4, 2)):  # Shards of 8 devices, of 2 devices, a whole split.
    config = smoke_config(data__shards=shards, data__eval_batch_size=64)
    config.eval.fewshot.update(datasets=('digits',), shots=(1, 5), draws=2)
    s = train.setup(config, jax.devices()[:devices])
    evaluator = fewshot.Evaluator(config, s.mesh, s.graphdef, s.state_shardings.params, s.info)
    d = evaluator.datasets[0]
    x, y = evaluator._split_features(train.init_state(s).params, d, d.train_split)  # Checks y against the split.
    np.testing.assert_array_equal(y, d.train_labels)
    features.append(x)
    draws.append([{k: v.tolist() for k, v in draw.items()} for draw in d.draws])
  for x, same in zip(features[1:], draws[1:]):
    np.testing.assert_allclose(x, features[0], rtol=1e-5, atol=1e-5)
    assert same == draws[0]


@pytest.mark.slow
def test_a_run_logs_few_shot_metrics_and_the_command_reproduces_them(smoke_config, tmp_path, capsys):
  config = smoke_config(total_steps=4, eval_every=2)
  config.eval.fewshot.update(datasets=('digits',), shots=(1, 5), draws=3)
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    lines = [m for m in map(json.loads, f) if any(k.startswith('eval/fewshot/') for k in m)]
  assert [m['step'] for m in lines] == [2, 4]
  assert all(set(m) == {'step', 'eval/fewshot/digits/1shot', 'eval/fewshot/digits/5shot'} for m in lines)
  assert all(0.0 <= v <= 1.0 for m in lines for k, v in m.items() if k != 'step')
  assert 'few-shot at step 4: digits/1shot' in capsys.readouterr().out

  # The command on the finished run, on 8 devices as the run was, draws the same examples: the same numbers.
  results = fewshot_tool.run(['--workdir', workdir])
  assert {k: float(v.mean()) for k, v in results['digits'].items()} == {
    1: lines[-1]['eval/fewshot/digits/1shot'],
    5: lines[-1]['eval/fewshot/digits/5shot'],
  }
  assert fewshot_tool.main(['--workdir', workdir, '--shots', '1,2', '--draws', '2']) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == 'few-shot linear evaluation: test accuracy (%), mean ± std over 2 draws'
  assert out[1:3] == ['| dataset | 1-shot | 2-shot |', '|---|---|---|']
  assert out[3].startswith('| digits | ') and out[3].count('±') == 2
  assert fewshot_tool.main(['--workdir', workdir, '--shots', '1,x']) == 2
  assert fewshot_tool.main(['--workdir', workdir, '--config', 'x.py']) == 2
  assert 'not both' in capsys.readouterr().err


def test_the_commands_flag_mistakes_name_the_flags_before_the_run_is_read(tmp_path, capsys):
  """--shots, --draws and --batch_size, not the eval.fewshot.* keys they set, and before anything loads (the
  workdir does not exist)."""
  for flags, message in [
    (['--shots', '0'], '--shots 0: give distinct positive integers, e.g. 1,5,10,25'),
    (['--shots', '1,1'], '--shots 1,1: give distinct positive integers, e.g. 1,5,10,25'),
    (['--draws', '0'], '--draws 0: give a positive number of draws, e.g. 5'),
    (['--batch_size', '0'], '--batch_size 0: give a positive batch size'),
  ]:
    assert fewshot_tool.main(['--workdir', str(tmp_path / 'no_run'), *flags]) == 2
    assert capsys.readouterr().err.strip() == f'error: {message}'


def _dark_and_bright(root, swap_test: bool) -> None:
  """Two classes of noisy 8x8 photos, dark and bright, in train/ and test/; `swap_test` files the test split's
  bright photos as `dark` and its dark ones as `bright`."""
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for name, low in (('dark', 20), ('bright', 220)):
      stored = {'dark': 'bright', 'bright': 'dark'}[name] if split == 'test' and swap_test else name
      os.makedirs(root / split / stored)
      for i in range(7):
        pixels = rng.integers(low, low + 16, size=(8, 8, 3)).astype(np.uint8)
        Image.fromarray(pixels).save(root / split / stored / f'{i}.png')


@pytest.mark.parametrize('swap_test, expected', [(False, 1.0), (True, 0.0)])
def test_few_shot_on_a_folder_with_a_known_answer_and_no_batch_option(tmp_path, data_dir, swap_test, expected):
  """Dark against bright photos: a probe fitted on the k-shot train photos classifies every test photo right, and
  every one wrong when the test split's labels are swapped; a probe fitted on the test photos would score 1 both
  times. The 14 test photos are far fewer than the config's eval batch, which needs no option."""
  _dark_and_bright(tmp_path / 'photos', swap_test)
  config = os.path.join(os.path.dirname(__file__), '..', 'configs/vit/digits.py:smoke')
  argv = ['--config', config, f'--config.data.name=folder:{tmp_path / "photos"}', f'--config.data.data_dir={data_dir}']
  results = fewshot_tool.run([*argv, '--config.data.image_size=8', '--shots', '3,6', '--draws', '3'])
  assert set(results) == {f'folder:{tmp_path / "photos"}'}
  for k, accuracies in next(iter(results.values())).items():
    np.testing.assert_array_equal(accuracies, np.full(3, expected), err_msg=f'{k}-shot')


def test_default_shots_a_small_folder_cannot_fill_are_left_out_with_a_note(tmp_path, data_dir, capsys):
  _dark_and_bright(tmp_path / 'photos', swap_test=False)  # 7 training photos per class.
  config = os.path.join(os.path.dirname(__file__), '..', 'configs/vit/digits.py:smoke')
  argv = ['--config', config, f'--config.data.name=folder:{tmp_path / "photos"}', f'--config.data.data_dir={data_dir}']
  assert fewshot_tool.main([*argv, '--config.data.image_size=8', '--draws', '2']) == 0  # Shots 1, 5, 10, 25.
  out = capsys.readouterr().out
  assert "10, 25-shot left out: its class 'bright' has 7 examples in train" in out  # Named as its folder.
  assert '| 1-shot | 5-shot |' in out and '10-shot' not in out.split('note:')[0]
  assert fewshot_tool.main([*argv, '--config.data.image_size=8', '--shots', '1,10']) == 2  # Chosen: refused.
  err = capsys.readouterr().err
  assert "class 'bright' of folder:" in err and 'lower the shots (eval.fewshot.shots, --shots)' in err
  assert 'max_train' not in err  # All 14 training photos were read: a larger max_train would not help.


def test_batch_size_option_is_checked_and_listed_in_help(capsys):
  assert fewshot_tool.main(['--config', 'configs/vit/digits.py:smoke', '--batch-size', '3']) == 2
  assert 'error: --batch_size 3: must be a multiple of the device count, 8' in capsys.readouterr().err
  assert fewshot_tool.main(['--config', 'configs/vit/digits.py:smoke', '--batch_size', '3']) == 2  # As elsewhere.
  assert 'error: --batch_size 3: must be a multiple of the device count, 8' in capsys.readouterr().err
  with pytest.raises(SystemExit):
    fewshot_tool.main(['--help'])
  assert '--batch_size' in capsys.readouterr().out
