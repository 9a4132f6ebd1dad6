"""Seq2seq through the generic trainer: every config trains and evaluates, any mesh gives the same steps,
packing resumes exactly, BLEU equals sacreBLEU, scheduled sampling, and a trained SentencePiece vocabulary."""

import os

import jax
import numpy as np
import pytest
import sacrebleu
import tensorflow as tf
import tensorflow_datasets as tfds
from flax import nnx

from conftest import load_config as load
from test_train import run_steps
from vit_jax_lab import config as config_lib, train
from vit_jax_lab.data import builders, text
from vit_jax_lab.tasks import seq2seq as task_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_NETWORK = tfds.download.DownloadConfig(try_download_gcs=False)


@pytest.fixture(scope='module')
def seq_data_dir(data_dir):
  """The session's data_dir with SCAN, digit scenes and a tiny translation dataset built in it."""
  for name in ('scan/simple', 'scan/length', 'digit_scenes'):
    builders.register(name)
    tfds.builder(name, data_dir=data_dir).download_and_prepare(download_config=NO_NETWORK)
  TinyTranslate(data_dir=data_dir).download_and_prepare(download_config=NO_NETWORK)
  return data_dir


WORDS = {
  'the': 'die',
  'cat': 'katze',
  'dog': 'hund',
  'sees': 'sieht',
  'a': 'eine',
  'bird': 'vogel',
  'small': 'kleine',
  'big': 'grosse',
  'and': 'und',
  'sleeps': 'schlaeft',
}


class TinyTranslate(tfds.core.GeneratorBasedBuilder):
  """Word-by-word English -> German sentences: a stand-in for wmt14_translate in tests."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict({'de': tfds.features.Text(), 'en': tfds.features.Text()}),
      supervised_keys=('de', 'en'),
    )

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(0, 400), 'test': self._generate_examples(1, 40)}

  def _generate_examples(self, seed, n):
    rng = np.random.default_rng(seed)
    for i in range(n):
      en = ' '.join(rng.choice(list(WORDS), size=rng.integers(2, 7)))
      yield i, {'en': en.capitalize() + '.', 'de': ' '.join(WORDS[w] for w in en.split()).capitalize() + '.'}


def wmt_config(data_dir, **overrides):
  """configs/seq2seq/wmt14_ende.py on TinyTranslate, with tiny dimensions: batches by a budget of 384 tokens
  (buckets of 8, 16 and 24 tokens: 48, 24 and 16 pairs)."""
  return load(
    'configs/seq2seq/wmt14_ende.py',
    data_dir,
    **dict(
      data__name='tiny_translate',
      model__variant='tiny',
      data__vocab_size=48,
      data__max_input_length=24,
      data__max_target_length=24,
      data__token_budget=384,
      data__eval_batch_size=16,
      data__shuffle_buffer=100,
      total_steps=3,
      eval_every=3,
      checkpoint_every=3,
      log_every=1,
      schedule__warmup_steps=1,
      task__max_decode_length=12,
    )
    | overrides,
  )


@pytest.mark.parametrize(
  'spec',
  [
    'configs/seq2seq/scan.py:simple,smoke',
    'configs/seq2seq/scan.py:length,beam,smoke',
    'configs/seq2seq/digit_captions.py:smoke',
  ],
)
@pytest.mark.slow
def test_every_config_trains_and_evaluates(seq_data_dir, tmp_path, spec):
  config = load(spec, seq_data_dir)
  metrics = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert metrics['eval/examples'] == 100
  assert np.isfinite(metrics['eval/loss'])
  if 'captions' in spec:  # Scored as the COCO caption toolkit scores captions.
    assert all(0 <= metrics[f'eval/bleu_{n}'] <= 1 for n in range(1, 5)) and metrics['eval/cider_d'] >= 0
  else:
    assert 0 <= metrics['eval/bleu'] <= 100
  assert 0 <= metrics['eval/exact_match'] <= 1 and 0 <= metrics['eval/token_accuracy'] <= 1


@pytest.mark.slow
def test_wmt_recipe_trains_a_sentencepiece_vocabulary_and_reuses_it(seq_data_dir, tmp_path, capsys):
  workdir = str(tmp_path / 'wmt')
  metrics = train.train_and_evaluate(wmt_config(seq_data_dir), workdir)
  assert metrics['eval/examples'] == 40 and np.isfinite(metrics['eval/loss'])
  model_file = os.path.join(workdir, 'sentencepiece.model')
  vocab = text.SentencePieceVocab(model_file)
  assert vocab.size == 48
  ids = text.encoder(vocab)(tf.constant(['The cat sees a dog.'])).to_list()[0] + [text.EOS]
  assert vocab.decode(ids) == 'The cat sees a dog.'
  before = os.path.getmtime(model_file)
  train.train_and_evaluate(wmt_config(seq_data_dir, total_steps=4, eval_every=4), workdir)  # Resumes.
  assert os.path.getmtime(model_file) == before and 'resumed from step 3' in capsys.readouterr().out
  config = config_lib.load(os.path.join(ROOT, 'configs/seq2seq/wmt14_ende.py'))  # The recipe's values.
  assert (config.optim.b2, config.optim.eps, config.schedule.warmup_steps, config.task.label_smoothing) == (
    0.98,
    1e-9,
    4000,
    0.1,
  )
  assert (config.task.beam_size, config.task.alpha, config.schedule.decay) == (4, 0.6, 'rsqrt')
  assert (config.data.token_budget, config.data.pack_factor) == (25_000, 1)  # The paper's batches, not packing.
  np.testing.assert_allclose(config.optim.lr, 512**-0.5 * 4000**-0.5)


@pytest.mark.slow  # The fast tier keeps the generic trainer's (tests/test_train.py).
def test_same_steps_on_1_device_and_8(seq_data_dir):
  config = load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, data__pack_factor=2)
  losses_1, params_1, _ = run_steps(config, jax.devices()[:1], num_steps=3)
  losses_8, params_8, _ = run_steps(config, jax.devices(), num_steps=3)
  np.testing.assert_allclose(losses_8, losses_1, rtol=1e-5, atol=1e-6)
  # Key biases have a zero gradient in exact arithmetic (softmax ignores a constant shift), so theirs is rounding
  # noise that differs with the summation order and that Adam scales up to ~lr: hence atol 1e-4 (lr is 1e-3).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4), params_8, params_1)
  assert np.all(np.diff(losses_1) != 0)


@pytest.mark.slow
def test_remat_and_scan_equal_the_plain_step(seq_data_dir):
  config = load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, model__dropout=0.0)
  reference, _, _ = run_steps(config, jax.devices()[:1], num_steps=2)
  for overrides in (dict(model__remat='full'), dict(model__scan=True), dict(model__scan=True, model__remat='dots')):
    losses, _, _ = run_steps(
      load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, model__dropout=0.0, **overrides),
      jax.devices()[:1],
      num_steps=2,
      initial_from=config,
    )
    np.testing.assert_allclose(losses, reference, rtol=1e-5, err_msg=str(overrides))


@pytest.mark.slow
def test_packed_batches_resume_exactly_and_keep_every_token(seq_data_dir):
  config = load(
    'configs/seq2seq/scan.py:simple,smoke',
    seq_data_dir,
    data__pack_factor=3,
    data__max_input_length=30,
    data__max_target_length=64,
  )
  s = train.setup(config, jax.devices()[:1])
  fresh = train.train_batches(s)
  batches = [jax.device_get(next(fresh)) for _ in range(4)]
  resumed = jax.device_get(next(train.train_batches(s, 3)))
  for k in batches[3]:
    np.testing.assert_array_equal(resumed[k], batches[3][k])
  b = batches[0]
  assert b['targets'].shape == (32, 64) and b['inputs'].shape == (32, 30)
  assert b['targets_segments'].max() >= 2  # Rows really hold several sequences.
  # Every sequence restarts its positions at 0 and ends with EOS; segment 0 is exactly the padding.
  np.testing.assert_array_equal(b['targets_segments'] == 0, b['targets'] == 0)
  starts = (b['targets_positions'] == 0) & (b['targets_segments'] > 0)
  assert starts.sum() == (b['targets'] == text.EOS).sum() == (b['inputs'] == text.EOS).sum()
  assert starts.sum() == round(b['packed_fraction'][0] * 3 * 32) > 2 * 32  # Over 2 sequences per row.


def test_pack_fills_rows_first_fit_and_counts_what_is_left_out():
  inputs = np.array([[5, 2, 0], [6, 7, 2], [8, 2, 0]])
  targets = np.array([[9, 9, 2, 0], [9, 2, 0, 0], [2, 0, 0, 0]])
  # Rows hold 3 input and 4 target tokens. Longest pair first (ties in order): pair 0 (2 + 3 tokens) takes row 0;
  # pair 1 (3 + 2) fits no row with it; pair 2 (2 + 1) neither, since 2 + 2 input tokens exceed 3.
  out = text.pack(inputs, targets, rows=1)
  assert out['inputs'].tolist() == [[5, 2, 0]] and out['targets'].tolist() == [[9, 9, 2, 0]]
  assert out['targets_segments'].tolist() == [[1, 1, 1, 0]]
  assert out['packed_fraction'][0] == pytest.approx(1 / 3)
  assert text.pack(inputs, targets, rows=2)['packed_fraction'][0] == pytest.approx(2 / 3)
  out = text.pack(np.array([[5, 2, 0, 0], [8, 2, 0, 0]]), np.array([[9, 2, 0, 0], [2, 0, 0, 0]]), rows=1)
  assert out['packed_fraction'][0] == 1.0
  assert out['inputs'].tolist() == [[5, 2, 8, 2]] and out['inputs_segments'].tolist() == [[1, 1, 2, 2]]
  assert out['targets'].tolist() == [[9, 2, 2, 0]] and out['targets_positions'].tolist() == [[0, 1, 0, 0]]


def test_bleu_equals_sacrebleu():
  hypotheses = [
    'The cat sat on the mat.',
    'A quick brown fox jumps over the lazy dog!',
    'Hello , world',
    'It is raining today in Berlin.',
    'no overlap at all',
    '',
  ]
  references = [
    'The cat is on the mat.',
    'The quick brown fox jumped over the lazy dog!',
    'Hello, world.',
    'Today it rains in Berlin.',
    'something else entirely',
    'empty hypothesis',
  ]
  # Summed over two "batches", as evaluation does.
  stats = task_lib.bleu_stats(hypotheses[:3], references[:3]) + task_lib.bleu_stats(hypotheses[3:], references[3:])
  expected = sacrebleu.corpus_bleu(hypotheses, [references])
  assert task_lib.bleu(stats) == pytest.approx(expected.score, abs=1e-9)
  assert 0 < expected.score < 100
  assert task_lib.bleu(task_lib.bleu_stats(references, references)) == pytest.approx(100.0)


@pytest.mark.slow
def test_scheduled_sampling_mixes_in_the_models_predictions(seq_data_dir):
  config = load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, model__dropout=0.0)
  task = task_lib.Seq2Seq(scheduled_sampling=0.5, scheduled_sampling_steps=10, label_smoothing=0.0)
  np.testing.assert_allclose([task.sampling_rate(s) for s in (0, 5, 10, 20)], [0.0, 0.25, 0.5, 0.5])
  s = train.setup(config, jax.devices()[:1])
  model = nnx.merge(s.graphdef, train.init_state(s).params)
  batch = jax.device_get(next(train.train_batches(s)))
  forced = s.task.loss(model, batch, jax.random.key(0), 0)[0]
  at_start = task.loss(model, batch, jax.random.key(0), 0)
  later = task.loss(model, batch, jax.random.key(0), 10)
  np.testing.assert_allclose(at_start[0], forced, rtol=1e-6)  # Rate 0: teacher forcing.
  assert float(later[1]['sampling_rate']) == 0.5 and abs(float(later[0]) - float(forced)) > 1e-4


def test_bad_text_config_values_are_one_line_errors(seq_data_dir):
  with pytest.raises(config_lib.ConfigError, match='data.target'):
    train.setup(load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, data__target='labels'))
  with pytest.raises(config_lib.ConfigError, match='data.vocab'):
    train.setup(load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, data__vocab='bpe'))
  with pytest.raises(config_lib.ConfigError, match="share_embeddings='all'"):
    train.setup(load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, model__share_embeddings='all'))
  with pytest.raises(config_lib.ConfigError, match='eval_decode'):
    train.setup(load('configs/seq2seq/scan.py:simple,smoke', seq_data_dir, task__eval_decode='nucleus'))
