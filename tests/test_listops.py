"""ListOps: the built-in generator and its labels, the text classifier on padded token inputs, the config's run,
and the one-line errors of the token-classification path."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from flax import nnx

from conftest import build_builtin, load_config
from vit_jax_lab import config as config_lib, train
from vit_jax_lab.data.builders import listops
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import text_classifier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/lra/listops.py:smoke'


@pytest.fixture(scope='module')
def listops_dir(tmp_path_factory) -> str:
  """A data_dir with listops/tiny built once, through the registry as pipeline.load does."""
  return build_builtin('listops/tiny', str(tmp_path_factory.mktemp('tensorflow_datasets')))


def ids(text: str) -> list[int]:
  return [listops.ID[t] for t in text.split()]


def reference_value(tokens: list[int]) -> int:
  """LRA's semantics by recursive descent, with numpy's median as LRA's to_value takes it: a second evaluator."""

  def parse(i: int) -> tuple[int, int]:
    token = listops.TOKENS[tokens[i]]
    if token.isdigit():
      return int(token), i + 1
    args, i = [], i + 1
    while listops.TOKENS[tokens[i]] != listops.END:
      value, i = parse(i)
      args.append(value)
    op = {'[MAX': max, '[MIN': min, '[MED': lambda a: int(np.median(a)), '[SM': lambda a: int(np.sum(a)) % 10}
    return op[token](args), i + 1

  value, end = parse(0)
  assert end == len(tokens)
  return value


@pytest.mark.parametrize(
  'text, value',
  [
    ('[MAX 2 9 [MIN 4 7 ] 0 ]', 9),
    ('[MIN 4 7 ]', 4),
    ('7', 7),
    ('[MED 1 2 9 ]', 2),
    ('[MED 2 5 ]', 3),  # Even count: int(np.median) = floor of the mean of the two middle ones (3.5 -> 3).
    ('[MED 3 8 2 9 ]', 5),  # Sorted 2 3 8 9: (3 + 8) / 2 = 5.5 -> 5; not median_low's 3.
    ('[MED 9 9 ]', 9),
    ('[SM 7 8 9 ]', 4),
    ('[SM 0 0 ]', 0),
    ('[SM [MAX 1 9 ] [MED 0 0 1 ] 5 ]', 4),  # 9 + 0 + 5 = 14.
    ('[MIN [SM 5 5 ] [MAX 3 [MIN 8 6 ] ] ]', 0),
    ('[MAX [MED [SM 1 2 ] [MIN 4 5 6 ] 9 ] 2 ]', 4),  # MED(3, 4, 9) = 4.
  ],
)
def test_evaluator_on_hand_written_expressions(text, value):
  assert listops.evaluate(text.split()) == value
  assert listops.evaluate(ids(text)) == value
  assert reference_value(ids(text)) == value


@pytest.mark.parametrize('text', ['[MAX 1 2', '] 1', '[MAX ]', '1 2', '', '[SM 1 ] ]', '[MIN 1 <pad> ]'])
def test_evaluator_refuses_malformed_expressions(text):
  with pytest.raises(ValueError):
    listops.evaluate(text.split())


def small(name: str, seed: int = 0, sizes: tuple[int, int, int] = (300, 50, 50)) -> listops.ListOpsConfig:
  """A registered config's lengths with fewer examples (the same generator)."""
  base = next(c for c in listops.CONFIGS if c.name == name)
  train_n, validation, test = sizes
  return listops.ListOpsConfig(
    name=f'{name}_small',
    min_length=base.min_length,
    max_length=base.max_length,
    num_train=train_n,
    num_validation=validation,
    num_test=test,
    seed=seed,
  )


def test_generated_trees_follow_the_grammar_and_lengths():
  for name in ('tiny', 'len128', 'len512'):
    config = small(name)
    splits = listops.examples(config)
    assert {k: len(v) for k, v in splits.items()} == {'train': 300, 'validation': 50, 'test': 50}
    for tokens in (t for split in splits.values() for t in split):
      assert tokens.dtype == np.int32 and config.min_length <= len(tokens) <= config.max_length
      assert listops.PAD not in tokens
      depth, deepest, args = 0, 0, []
      for t in tokens:  # Operators nest at most MAX_DEPTH - 1 deep (leaves are at depth MAX_DEPTH), 2-10 args.
        if listops.TOKENS[t] in listops.OPERATORS:
          if args:
            args[-1] += 1
          depth, args = depth + 1, args + [0]
          deepest = max(deepest, depth)
        elif t == listops.END_ID:
          assert 2 <= args.pop() <= listops.MAX_ARGS
          depth -= 1
        elif args:
          args[-1] += 1
      assert depth == 0 and deepest <= listops.MAX_DEPTH - 1
      assert listops.evaluate(tokens) == reference_value(list(tokens))


def test_splits_are_deterministic_distinct_and_seeded():
  a, b = listops.examples(small('tiny')), listops.examples(small('tiny'))
  assert all(len(a[k]) == len(b[k]) and all(np.array_equal(x, y) for x, y in zip(a[k], b[k])) for k in a)
  everything = [bytes(t) for split in a.values() for t in split]
  assert len(set(everything)) == len(everything)  # Distinct trees: no example in two splits.
  other = listops.examples(small('tiny', seed=1))
  assert [bytes(t) for t in other['train']] != [bytes(t) for t in a['train']]


def test_label_distribution():
  labels = [listops.evaluate(t) for t in listops.examples(small('len128', sizes=(3000, 0, 0)))['train']]
  shares = np.bincount(labels, minlength=10) / len(labels)
  assert shares.min() > 0.05 and 0.10 < shares.max() < 0.25  # LRA: majority ~17%, chance 10%.
  assert shares.argmax() in (0, 9)  # MAX and MIN push values to the ends.


def test_built_dataset(listops_dir):
  builder = tfds.builder('listops/tiny', data_dir=listops_dir)
  config = builder.builder_config
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {'train': 512, 'validation': 64, 'test': 128}
  assert builder.info.metadata['vocabulary'] == list(listops.TOKENS) and builder.info.metadata['max_length'] == 48
  expected = listops.examples(config)
  for split in ('train', 'validation', 'test'):
    data = tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
    got = {bytes(ex['inputs'].astype(np.uint8)): int(ex['label']) for ex in data}
    assert got == {bytes(t.astype(np.uint8)): listops.evaluate(t) for t in expected[split]}


def model(pool: str, posemb: str, **kwargs) -> text_classifier.TextClassifier:
  return text_classifier.TextClassifier(
    10, len(listops.TOKENS), 48, variant='tiny', pool=pool, posemb=posemb, head_zero_init=False,
    rngs=nnx.Rngs(0), **kwargs,
  )  # fmt: skip


def jitted(m: nnx.Module):
  """The model's inference logits as a compiled function of the token ids (eager op-by-op calls are slow)."""
  graphdef, state = nnx.split(m)
  fn = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
  return lambda tokens: fn(state, jnp.asarray(tokens))


@pytest.mark.parametrize(
  'pool, posemb, attention',
  [('tok', 'learn', 'full'), ('gap', 'sincos', 'full'), ('gap', 'learn', 'full'), ('tok', 'learn', 'local'),
   ('gap', 'sincos', 'linear')],
)  # fmt: skip
def test_padding_changes_nothing(pool, posemb, attention):
  """Sparse attention's random blocks depend on the length, so only the others are invariant to more padding."""
  m = model(pool, posemb, attention=attention, attention_window=4)
  f = jitted(m)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, len(listops.TOKENS), size=(3, 20))
  tokens[1, 12:] = 0  # A shorter sequence in the batch.
  logits = f(tokens)
  for length in (33, 48):
    padded = np.pad(tokens, ((0, 0), (0, length - 20)))
    np.testing.assert_allclose(f(padded), logits, atol=1e-5, rtol=1e-5)
  changed = tokens.copy()
  changed[0, 3] = 1 + tokens[0, 3] % (len(listops.TOKENS) - 1)
  changed[1, 15] = 5  # Padding of row 1 made real: its logits change too.
  new = f(changed)
  assert not np.allclose(new[0], logits[0], atol=1e-5) and not np.allclose(new[1], logits[1], atol=1e-5)
  np.testing.assert_allclose(new[2], logits[2], atol=1e-5, rtol=1e-5)  # Rows are independent.
  with pytest.raises(ValueError, match='max_len=48'):
    m(jnp.zeros((1, 49), jnp.int32))


def test_scan_equals_loop():
  loop, scanned = model('tok', 'learn'), model('tok', 'learn', scan=True)
  params = nnx.state(loop, nnx.Param).to_pure_dict()
  from vit_jax_lab.models import layers

  nnx.update(scanned, layers.scanned_like(params, nnx.state(scanned, nnx.Param).to_pure_dict()))
  tokens = np.random.default_rng(1).integers(0, len(listops.TOKENS), size=(2, 30))
  np.testing.assert_allclose(jitted(scanned)(tokens), jitted(loop)(tokens), atol=1e-5, rtol=1e-5)


def one_line_error(config) -> str:
  with pytest.raises(ConfigError) as e:
    train.setup(config, devices=jax.devices()[:1])
  assert '\n' not in str(e.value)
  return str(e.value)


def test_bad_inputs_are_one_line_errors(listops_dir):
  def smoke(**overrides):
    return load_config(SMOKE, listops_dir, **overrides)

  assert 'has no config' in one_line_error(smoke(data__name='listops/len3'))
  assert 'task.mixup' in one_line_error(smoke(task__mixup=0.2))
  assert 'task.cutmix' in one_line_error(smoke(task__cutmix=1.0))
  assert 'data.crop_padding=1' in one_line_error(smoke(data__crop_padding=1))
  assert 'data.max_input_length=32' in one_line_error(smoke(data__max_input_length=32))
  assert 'model.attention' in one_line_error(smoke(model__attention='dense'))
  assert 'model.pool' in one_line_error(smoke(model__pool='map'))
  with pytest.raises(ConfigError, match='KIND'):
    config_lib.load(os.path.join(ROOT, 'configs/lra/listops.py:wide'))


def test_smoke_config_shapes(listops_dir):
  config = load_config(SMOKE, listops_dir)
  s = train.setup(config, devices=jax.devices()[:1])
  assert (s.info.input_key, s.info.input_shape, s.info.vocab_size, s.info.num_eval) == ('inputs', (48,), 16, 128)
  batch = next(train.train_batches(s))
  assert batch['inputs'].shape == (32, 48) and batch['inputs'].dtype == jnp.int32
  assert (np.asarray(batch['inputs']) != 0).sum(1).min() >= 8  # Real tokens first, padding after.
  for row, label in zip(np.asarray(batch['inputs']), np.asarray(batch['label'])):
    assert listops.evaluate(row[row != 0]) == label


@pytest.mark.slow
def test_smoke_config_trains(listops_dir, tmp_path):  # About 6 s: the fast tier keeps it.
  config = load_config(SMOKE, listops_dir)
  metrics = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert metrics['eval/examples'] == 128 and 0.0 <= metrics['eval/accuracy'] <= 1.0
  assert np.isfinite(metrics['eval/loss'])
