"""SCAN (Lake & Baroni 2018) as a TFDS dataset, generated from the paper's grammar: no download.

Grammar (the paper's Fig. 6), where D[1] opposite D[2] is 'U|turn opposite left|right' (likewise around):
  C -> S and S | S after S | S
  S -> V twice | V thrice | V
  V -> D[1] opposite D[2] | D[1] around D[2] | D | U
  D -> U left | U right | turn left | turn right
  U -> walk | look | run | jump
Semantics: 'u left' is I_TURN_LEFT u, 'u opposite left' is I_TURN_LEFT I_TURN_LEFT u, 'u around left' is
(I_TURN_LEFT u) x 4 (with 'turn' as u, just the turns); 'x twice' is x x, 'x thrice' x x x; 'x1 and x2' is
x1 x2, 'x1 after x2' is x2 x1. 34 V, 102 S, 102 + 2 * 102^2 = 20,910 commands of 1-9 words, each with one
action sequence of 1-48 actions.
"""

import itertools

import numpy as np
import tensorflow_datasets as tfds

NUM_PAIRS = 20_910
SPLIT_SIZES = {'simple': (16_728, 4_182), 'length': (16_990, 3_920)}  # Config -> (train, test) sizes.
MAX_ACTION_LENGTH_TRAIN = 22  # `length`: train has the action sequences of at most 22 actions, test the longer.
MAX_ACTION_LENGTH = 48
MAX_COMMAND_LENGTH = 9
SIMPLE_SEED = 0  # `simple`: np.random.default_rng(0).permutation of pairs(); its first 16,728 are train.

PRIMITIVES = {'walk': 'I_WALK', 'look': 'I_LOOK', 'run': 'I_RUN', 'jump': 'I_JUMP'}  # U.
TURNS = {'left': 'I_TURN_LEFT', 'right': 'I_TURN_RIGHT'}
REPEATS = {'': 1, ' twice': 2, ' thrice': 3}


def _verbs() -> list[tuple[str, list[str]]]:
  """The 34 (V, actions): U; D; D[1] opposite D[2]; D[1] around D[2]."""
  verbs = [(u, [a]) for u, a in PRIMITIVES.items()]
  for u, a in [*PRIMITIVES.items(), ('turn', None)]:
    act = [] if a is None else [a]  # 'turn' only turns.
    for direction, turn in TURNS.items():
      verbs.append((f'{u} {direction}', [turn] + act))
      verbs.append((f'{u} opposite {direction}', [turn, turn] + act))
      verbs.append((f'{u} around {direction}', ([turn] + act) * 4))
  return verbs


def pairs() -> list[tuple[str, str]]:
  """All 20,910 (command, actions), space-separated words: each S, then every S and S, then every S after S."""
  sentences = [(v + r, actions * n) for v, actions in _verbs() for r, n in REPEATS.items()]
  out = list(sentences)
  out += [(f'{s1} and {s2}', a1 + a2) for (s1, a1), (s2, a2) in itertools.product(sentences, repeat=2)]
  out += [(f'{s1} after {s2}', a2 + a1) for (s1, a1), (s2, a2) in itertools.product(sentences, repeat=2)]
  return [(command, ' '.join(actions)) for command, actions in out]


def split(config_name: str, test: bool) -> list[tuple[str, str]]:
  """(command, actions) of a config's `test` or `train` split, in the order of pairs()."""
  everything = pairs()
  if config_name == 'simple':
    in_test = np.zeros(len(everything), bool)
    in_test[np.random.default_rng(SIMPLE_SEED).permutation(len(everything))[SPLIT_SIZES['simple'][0] :]] = True
  elif config_name == 'length':
    in_test = np.array([len(actions.split()) > MAX_ACTION_LENGTH_TRAIN for _, actions in everything])
  else:
    raise ValueError(f'SCAN has no split {config_name!r}; there are {sorted(SPLIT_SIZES)}')
  return [pair for pair, t in zip(everything, in_test) if t == test]


class Scan(tfds.core.GeneratorBasedBuilder):
  """Commands in a small English-like language and the action sequences they mean (Lake & Baroni 2018).

  Tests compositional generalisation of seq2seq models. `simple` is a random 80/20 split of all 20,910
  pairs (the paper's experiment 1, though not its exact draw: ours is default_rng(0)); `length` trains on
  the pairs of at most 22 actions and tests on the longer ones (experiment 2). This shadows TFDS's own
  'scan' (which downloads the SCAN repo) once registered; its data (version 1.1.1) sits apart from ours.
  """

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Generated from the grammar; simple: default_rng(0) 80/20; length: <= 22 actions.'}
  BUILDER_CONFIGS = [
    tfds.core.BuilderConfig(name='simple', description='Random 80/20 split: 16,728 train, 4,182 test.'),
    tfds.core.BuilderConfig(name='length', description='Train <= 22 actions (16,990), test longer (3,920).'),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict({'commands': tfds.features.Text(), 'actions': tfds.features.Text()}),
      supervised_keys=('commands', 'actions'),
      homepage='https://github.com/brendenlake/SCAN',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {'train': self._generate_examples(test=False), 'test': self._generate_examples(test=True)}

  def _generate_examples(self, test: bool):
    for command, actions in split(self.builder_config.name, test):
      yield command, {'commands': command, 'actions': actions}  # Commands are unique: the key.
