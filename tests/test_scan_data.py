"""The built-in SCAN dataset: generated from the grammar, the paper's counts, examples and splits."""

import os

import pytest
import tensorflow_datasets as tfds

from vit_jax_lab import config as config_lib
from vit_jax_lab.data import builders
from vit_jax_lab.data.builders import scan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_PAIRS = {  # Lake & Baroni 2018, Fig. 1 and Appendix.
  'jump': 'I_JUMP',
  'jump left': 'I_TURN_LEFT I_JUMP',
  'jump around right': 'I_TURN_RIGHT I_JUMP I_TURN_RIGHT I_JUMP I_TURN_RIGHT I_JUMP I_TURN_RIGHT I_JUMP',
  'turn left twice': 'I_TURN_LEFT I_TURN_LEFT',
  'jump thrice': 'I_JUMP I_JUMP I_JUMP',
  'jump opposite left after walk around left': 'I_TURN_LEFT I_WALK I_TURN_LEFT I_WALK I_TURN_LEFT I_WALK '
  'I_TURN_LEFT I_WALK I_TURN_LEFT I_TURN_LEFT I_JUMP',
  'walk and jump': 'I_WALK I_JUMP',
  'walk after jump': 'I_JUMP I_WALK',
  'turn opposite left': 'I_TURN_LEFT I_TURN_LEFT',
  'turn around right': 'I_TURN_RIGHT I_TURN_RIGHT I_TURN_RIGHT I_TURN_RIGHT',
  'look opposite right thrice': 'I_TURN_RIGHT I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_TURN_RIGHT I_LOOK '
  'I_TURN_RIGHT I_TURN_RIGHT I_LOOK',
}


@pytest.fixture(scope='module')
def scan_dir(tmp_path_factory) -> str:
  """A data_dir with both SCAN configs built once, through the registry as pipeline.load does."""
  path = str(tmp_path_factory.mktemp('tensorflow_datasets'))
  for name in ('scan/simple', 'scan/length'):
    builders.register(name)
    tfds.builder(name, data_dir=path).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
  return path


def read(data_dir: str, config: str, split: str) -> list[tuple[str, str]]:
  builder = tfds.builder(f'scan/{config}', data_dir=data_dir)
  data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1, shuffle_files=False))
  return [(c.decode(), a.decode()) for c, a in zip(data['commands'], data['actions'])]


def test_registry_accepts_config_suffix():
  assert builders.is_builtin('scan/simple') and builders.is_builtin('scan/length') and builders.is_builtin('scan')
  assert not builders.is_builtin('scanner/simple') and not builders.is_builtin('mnist')
  config = config_lib.load(os.path.join(ROOT, 'configs/vit/digits.py:smoke'))
  config.data.name, config.data.data_dir = 'scan/length', '/no/such/dir'
  builders.check_data_dir(config.data)  # Built-in: generated into data_dir, so it need not exist yet.
  config.data.name = 'mnist'
  with pytest.raises(config_lib.ConfigError, match='does not exist'):
    builders.check_data_dir(config.data)


def test_grammar_counts_and_paper_examples():
  pairs = scan.pairs()
  assert len(pairs) == scan.NUM_PAIRS == 20_910
  table = dict(pairs)
  assert len(table) == 20_910  # Every command is distinct: one action sequence each.
  for command, actions in PAPER_PAIRS.items():
    assert table[command] == actions, command
  assert max(len(a.split()) for a in table.values()) == scan.MAX_ACTION_LENGTH == 48
  assert max(len(c.split()) for c in table) == scan.MAX_COMMAND_LENGTH == 9
  assert len({w for c in table for w in c.split()}) == 13
  assert {w for a in table.values() for w in a.split()} == {
    'I_WALK',
    'I_LOOK',
    'I_RUN',
    'I_JUMP',
    'I_TURN_LEFT',
    'I_TURN_RIGHT',
  }
  assert 'turn' not in table and 'walk twice and' not in table  # Not sentences of the grammar.
  assert pairs == scan.pairs()  # Deterministic order.


def test_built_splits_sizes_and_contents(scan_dir):
  for config, (n_train, n_test) in scan.SPLIT_SIZES.items():
    info = tfds.builder(f'scan/{config}', data_dir=scan_dir).info
    assert info.splits['train'].num_examples == n_train and info.splits['test'].num_examples == n_test
    assert info.supervised_keys == ('commands', 'actions')
  assert scan.SPLIT_SIZES == {'simple': (16_728, 4_182), 'length': (16_990, 3_920)}

  everything = set(scan.pairs())
  train, test = set(read(scan_dir, 'simple', 'train')), set(read(scan_dir, 'simple', 'test'))
  assert len(train) == 16_728 and len(test) == 4_182
  assert not train & test and train | test == everything
  assert set(scan.split('simple', test=True)) == test  # The documented default_rng(0) draw, fixed.

  train, test = read(scan_dir, 'length', 'train'), read(scan_dir, 'length', 'test')
  assert max(len(a.split()) for _, a in train) == scan.MAX_ACTION_LENGTH_TRAIN == 22
  assert min(len(a.split()) for _, a in test) > 22
  assert set(train) | set(test) == everything and len(train) + len(test) == 20_910
  table = dict(train + test)
  assert all(table[c] == a for c, a in PAPER_PAIRS.items())  # Stored text round-trips.
