"""ListOps (Nangia & Bowman 2018) as Long Range Arena generates it (Tay et al. 2021): no download.

An example is a nested list operation over the digits 0-9, written in prefix form with brackets, e.g.
`[MAX 2 9 [MIN 4 7 ] 0 ]` (= 9); the label is its value, one of 10 classes. The operators:
  [MAX, [MIN   the largest / smallest argument;
  [MED         the median, as LRA computes it, int(np.median(args)): with an even count the mean of the two middle
               arguments, rounded down ([MED 2 5 ] = 3; not statistics.median_low's 2);
  [SM          the sum of the arguments modulo 10.

The trees come from LRA's generator (lra_benchmarks/data/listops.py), followed step by step (every choice one
`random()` draw, with LRA's probabilities): a node at depth d (the root has depth 1) below `MAX_DEPTH` = 10 is an
operator with probability `BRANCH_P` = 0.25, else (and always at depth 10) a uniformly drawn digit; an operator
has 2-`MAX_ARGS` (10) arguments, drawn uniformly, each a node one level deeper, and its operator is drawn
uniformly after them. A tree's length is its tokens (an operator
counts its opening token and its `]`). Trees are drawn until there are enough distinct ones with a length in the
config's [min_length, max_length]; the first `num_train` distinct ones are `train`, the next `num_validation`
`validation`, the next `num_test` `test` (LRA's order), so the three splits are disjoint. The draws come from
Python's `random.Random(config.seed)`, so a config and its seed fix the data.

Differences from LRA's files: LRA draws from an unseeded generator and keeps 500 < length < 2000 (our
`len2000`: [501, 1999]); LRA's input pipeline tokenises with tfds' alphanumeric Tokenizer, which drops the `]`
tokens (and the parentheses of its written form), so its models see `MAX 2 9 MIN 4 7 0`, where an operator's
arguments end is not written. Ours keeps `]`: the task as the grammar defines it.

Features: `inputs`, the token ids (int32, variable length, no padding stored; ids index `TOKENS`, 0 is the padding
id and never stored), and `label` (ClassLabel 10). The vocabulary and the config's max_length are in the dataset's
metadata ('vocabulary', 'max_length'), which is what the classification data side reads.
"""

import dataclasses
import random

import numpy as np
import tensorflow_datasets as tfds

OPERATORS = ('[MAX', '[MIN', '[MED', '[SM')
END = ']'
TOKENS = ('<pad>', *OPERATORS, END, *(str(d) for d in range(10)))  # Token id -> its text; 0 is padding.
ID = {t: i for i, t in enumerate(TOKENS)}
PAD, END_ID, FIRST_DIGIT = 0, ID[END], ID['0']
MAX_ID, MIN_ID, MED_ID, SM_ID = (ID[op] for op in OPERATORS)
BRANCH_P = 0.25  # LRA's VALUE_P: a node above the deepest level is an operator with this probability.
MAX_DEPTH = 10  # Nodes at this depth (the root is at 1) are digits.
MAX_ARGS = 10  # An operator has 2..MAX_ARGS arguments.


@dataclasses.dataclass
class ListOpsConfig(tfds.core.BuilderConfig):
  """Lengths in tokens (inclusive bounds), split sizes, and the seed of the draws."""

  min_length: int = 501
  max_length: int = 1999
  num_train: int = 96_000
  num_validation: int = 2_000
  num_test: int = 2_000
  seed: int = 0


def _config(name: str, min_length: int, max_length: int, sizes: tuple[int, int, int], description: str):
  train, validation, test = sizes
  return ListOpsConfig(
    name=name,
    description=description,
    min_length=min_length,
    max_length=max_length,
    num_train=train,
    num_validation=validation,
    num_test=test,
  )


LRA_SIZES = (96_000, 2_000, 2_000)
CONFIGS = [
  _config('len2000', 501, 1999, LRA_SIZES, "LRA's task: 501-1999 tokens (500 < length < 2000), 96k/2k/2k."),
  _config('len1000', 250, 1000, LRA_SIZES, '250-1000 tokens, 96k/2k/2k.'),
  _config('len512', 128, 512, LRA_SIZES, '128-512 tokens, 96k/2k/2k.'),
  _config('len256', 64, 256, LRA_SIZES, '64-256 tokens, 96k/2k/2k.'),
  _config('len128', 32, 128, LRA_SIZES, '32-128 tokens, 96k/2k/2k.'),
  _config('tiny', 8, 48, (512, 64, 128), 'For tests: 8-48 tokens, 512/64/128.'),
]


def tree(rng: random.Random, max_length: int) -> list[int] | None:
  """One tree drawn as LRA draws it, as token ids in prefix order; None once it is longer than `max_length` (the
  draw is abandoned there: such a tree would be rejected anyway). Every choice is one `rng.random()` (uniform
  integers as int(random() * n)): LRA's probabilities, in a third less time than randrange and randint."""
  rand, tokens = rng.random, []
  append = tokens.append

  def node(depth: int) -> bool:
    if depth >= MAX_DEPTH or rand() > BRANCH_P:
      append(FIRST_DIGIT + int(rand() * 10))
      return True
    at = len(tokens)
    append(PAD)  # The operator, drawn after its arguments (LRA's order).
    for _ in range(2 + int(rand() * (MAX_ARGS - 1))):
      if not node(depth + 1) or len(tokens) > max_length:
        return False
    append(END_ID)
    tokens[at] = MAX_ID + int(rand() * len(OPERATORS))
    return True

  return tokens if node(1) and len(tokens) <= max_length else None


def examples(config: ListOpsConfig) -> dict[str, list[np.ndarray]]:
  """Split name -> the token ids (int32 arrays) of its distinct trees, in the order they were drawn."""
  rng, seen, drawn = random.Random(config.seed), set(), []
  total = config.num_train + config.num_validation + config.num_test
  while len(drawn) < total:
    tokens = tree(rng, config.max_length)
    if tokens is None or len(tokens) < config.min_length:
      continue
    key = bytes(tokens)  # Ids are < 256; the prefix form with `]` is the tree.
    if key not in seen:
      seen.add(key)
      drawn.append(np.array(tokens, np.int32))
  a, b = config.num_train, config.num_train + config.num_validation
  return {'train': drawn[:a], 'validation': drawn[a:b], 'test': drawn[b:]}


def evaluate(tokens) -> int:
  """The value of a written expression (token ids, or their texts), with its own parser: a stack of open operators
  and their arguments. Raises ValueError if it is not one well-formed expression."""
  ids = [ID[t] if isinstance(t, str) else int(t) for t in tokens]
  stack: list[tuple[int, list[int]]] = []
  value = None
  for i, t in enumerate(ids):
    if value is not None:
      raise ValueError(f'tokens after the end of the expression at position {i}')
    if t in (MAX_ID, MIN_ID, MED_ID, SM_ID):
      stack.append((t, []))
      continue
    if FIRST_DIGIT <= t < FIRST_DIGIT + 10:
      result = t - FIRST_DIGIT
    elif t == END_ID:
      if not stack or len(stack[-1][1]) == 0:
        raise ValueError(f'"]" at position {i} closes no operator with arguments')
      op, args = stack.pop()
      result = _apply(op, args)
    else:
      raise ValueError(f'token id {t} at position {i} is not a ListOps token')
    if stack:
      stack[-1][1].append(result)
    else:
      value = result
  if value is None:
    raise ValueError('the expression is empty or not closed')
  return value


def _apply(op: int, args: list[int]) -> int:
  if op == MAX_ID:
    return max(args)
  if op == MIN_ID:
    return min(args)
  if op == SM_ID:
    return sum(args) % 10
  ordered, n = sorted(args), len(args)
  return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) // 2  # = int(np.median(args)).


def to_text(tokens) -> str:
  """Token ids -> the written form, e.g. '[MAX 2 9 [MIN 4 7 ] 0 ]'."""
  return ' '.join(TOKENS[int(t)] for t in tokens)


class ListOps(tfds.core.GeneratorBasedBuilder):
  """ListOps, the Long Range Arena task: the value (0-9) of a nested MAX / MIN / MED / SM expression of digits.

  Tests whether a sequence model can follow hierarchical structure over long inputs. Configs differ in length:
  `len2000` is LRA's (501-1999 tokens), `len1000`, `len512`, `len256`, `len128` shorter ones, `tiny` a few hundred
  short examples for tests. See the module docstring for the generator and how it differs from LRA's files.
  """

  name = 'listops'  # Not 'list_ops' (the class name's default), a name TFDS's catalogue already lists.
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': "LRA's generator, seeded (random.Random(seed)), with `]` tokens; distinct trees."}
  BUILDER_CONFIGS = CONFIGS

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          'inputs': tfds.features.Tensor(shape=(None,), dtype=np.int32),
          'label': tfds.features.ClassLabel(num_classes=10),
        }
      ),
      supervised_keys=('inputs', 'label'),
      homepage='https://github.com/google-research/long-range-arena',
      metadata=tfds.core.MetadataDict(vocabulary=list(TOKENS), max_length=self.builder_config.max_length),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    splits = examples(self.builder_config)
    return {name: self._generate_examples(trees) for name, trees in splits.items()}

  def _generate_examples(self, trees: list[np.ndarray]):
    for i, tokens in enumerate(trees):
      yield i, {'inputs': tokens, 'label': evaluate(tokens)}
