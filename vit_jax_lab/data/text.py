"""Text for sequence-to-sequence tasks: vocabularies, tokenisation in tf.data, length filtering, packing.

Every vocabulary numbers PAD 0, BOS 1, EOS 2, UNK 3 (`vit_jax_lab.tokens`). Word-level
vocabularies are built from the training split's words (SCAN, captions); SentencePiece ones (translation)
are trained on the training text when no model file is given, or loaded from `data.vocab`, which may also name a
transformers Marian folder (MarianVocab).
"""

import os
import tempfile
from typing import Callable

import jax
import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax_lab.data import pipeline
from vit_jax_lab.data.info import (
  SPECIALS,
  MarianVocab,
  TextInfo,
  WordVocab,
  is_marian_folder,
  sentencepiece_model,
  until_eos,
)
from vit_jax_lab.errors import check
from vit_jax_lab.tokens import BOS, EOS, PAD, UNK


class SentencePieceVocab:
  """A SentencePiece model (Kudo & Richardson 2018) trained with our special-token ids."""

  def __init__(self, path: str):
    self.path = path
    self._sp = sentencepiece_model(path)
    self.size = self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """`encode` of each text, in one call: SentencePiece's C++ loop (about 20x a call per text from tf.data)."""
    return self._sp.encode(texts, num_threads=1)

  def decode(self, ids: np.ndarray) -> str:
    return self._sp.decode([int(i) for i in until_eos(ids) if i not in (PAD, BOS)])


TOKENIZE_BATCH = 1024  # Texts tokenised per call: the per-call cost of tf.numpy_function is paid once per batch.


def encoder(vocab: WordVocab | SentencePieceVocab | MarianVocab) -> Callable[[tf.Tensor], tf.RaggedTensor]:
  """Strings (B,) -> int32 ids (B, None) (unknown words: UNK), without EOS, inside tf.data. Made outside the map, so
  a word vocabulary's lookup table is built once, eagerly; other vocabularies tokenise a batch per Python call."""
  if isinstance(vocab, WordVocab):
    keys = tf.constant(vocab.words[len(SPECIALS) :])
    values = tf.range(len(SPECIALS), vocab.size, dtype=tf.int32)
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), UNK)
    return lambda texts: tf.ragged.map_flat_values(table.lookup, tf.strings.split(texts))
  encode_batch = getattr(vocab, 'encode_batch', lambda texts: [vocab.encode(t) for t in texts])

  def encode(texts):
    ids = encode_batch([t.decode('utf-8') for t in texts])
    flat = np.fromiter((i for seq in ids for i in seq), np.int32, sum(len(seq) for seq in ids))
    return flat, np.array([len(seq) for seq in ids], np.int64)

  def fn(texts):
    flat, lengths = tf.numpy_function(encode, [texts], [tf.int32, tf.int64], stateful=False)
    return tf.RaggedTensor.from_row_lengths(tf.ensure_shape(flat, [None]), tf.ensure_shape(lengths, [None]))

  return fn


def train_sentencepiece(texts: list[str], vocab_size: int, path: str) -> SentencePieceVocab:
  """Trains a unigram SentencePiece model on `texts` and saves it as `path` (+ '.vocab')."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts),
    model_prefix=path.removesuffix('.model'),
    vocab_size=vocab_size,
    model_type='unigram',
    character_coverage=1.0,
    pad_id=PAD,
    bos_id=BOS,
    eos_id=EOS,
    unk_id=UNK,
    shuffle_input_sentence=False,
    minloglevel=2,
  )
  return SentencePieceVocab(path)


def _texts(builder, split: str, keys: tuple[str, ...], limit: int = -1) -> dict[str, list[str]]:
  """The text features `keys` of the first `limit` examples of `split` (-1: all), read in one pass."""
  ds = builder.as_dataset(split=split, shuffle_files=False).take(limit).map(lambda ex: {k: ex[k] for k in keys})
  texts = {k: [] for k in keys}
  for example in ds.as_numpy_iterator():
    for k in keys:
      texts[k].append(example[k].decode('utf-8'))
  return texts


def dataset_info(builder, data_config, vocab_dir: str | None = None) -> TextInfo:
  """Source and target features and their vocabularies (built or trained here when needed; a trained
  SentencePiece model is saved in `vocab_dir`, and loaded from there when a run resumes)."""
  features = builder.info.features
  supervised = builder.info.supervised_keys or (None, None)
  source, target = data_config.source or supervised[0], data_config.target or supervised[1]
  for side, key in (('source', source), ('target', target)):
    check(key in features, f'data.{side}={key!r} is not a feature of {data_config.name}: it has {list(features)}')
  image = isinstance(features[source], tfds.features.Image)
  check(isinstance(features[target], tfds.features.Text), f'data.target={target!r} of {data_config.name} is not text')
  train = data_config.train_split
  vocab = data_config.vocab
  text_keys = (target,) if image else (target, source)
  if is_marian_folder(vocab):  # A transformers Marian folder's own tokenizer, one per side.
    target_vocab = MarianVocab(vocab, 'target')
    input_vocab = None if image else MarianVocab(vocab, 'source')
  elif vocab == 'words':
    texts = _texts(builder, train, text_keys)

    def words(key):
      return [w for t in texts[key] for w in t.split()]

    target_vocab = WordVocab(words(target))
    input_vocab = None if image else WordVocab(words(source))
  else:
    if vocab == 'sentencepiece':
      path = os.path.join(vocab_dir or tempfile.mkdtemp(), 'sentencepiece.model')
      if not os.path.exists(path):
        if jax.process_index() == 0:
          texts = _texts(builder, train, text_keys, data_config.vocab_sentences)
          train_sentencepiece([t for key in text_keys for t in texts[key]], data_config.vocab_size, path)
        if jax.process_count() > 1:
          from jax.experimental import multihost_utils

          multihost_utils.sync_global_devices('vocabulary trained')
    else:
      path = vocab
      check(os.path.isfile(path), f"data.vocab={vocab!r}: not 'words', 'sentencepiece' or an existing .model file")
    target_vocab = SentencePieceVocab(path)
    input_vocab = None if image else target_vocab
  input_shape = tuple(features[source].shape) if image else (data_config.max_input_length,)
  check(None not in input_shape, f'data.source={source!r} has images of varying size {input_shape}')
  return TextInfo(
    input_key=source,
    target_key=target,
    input_vocab=input_vocab,
    target_vocab=target_vocab,
    input_shape=input_shape,
    max_target_length=data_config.max_target_length,
    num_train=builder.info.splits[train].num_examples,
    num_eval=builder.info.splits[data_config.eval_split].num_examples,
  )


def prepare_fn(info: TextInfo, train: bool) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """Raw examples -> {'inputs', 'targets'} token ids (EOS-terminated) or images. For training, examples longer
  than the maximum lengths are left out; for evaluation every example is kept and cut to them. Its `batches`
  attribute gives them as ragged batches, without a tf.data op per example."""
  max_input, max_target = info.input_shape[0], info.max_target_length
  encode_target = encoder(info.target_vocab)
  encode_input = None if info.input_vocab is None else encoder(info.input_vocab)

  def with_eos(ids: tf.RaggedTensor) -> tf.RaggedTensor:
    return tf.concat([ids, tf.fill([ids.nrows(), 1], tf.constant(EOS, ids.dtype))], axis=1)

  def tokenize(batch):
    return {
      'inputs': with_eos(encode_input(batch[info.input_key])),
      'targets': with_eos(encode_target(batch[info.target_key])),
    }

  def tokenize_one(ex):  # Beside an image, which may not batch (evaluation decodes images of any size).
    return {'inputs': ex[info.input_key], 'targets': with_eos(encode_target(ex[info.target_key][None]))[0]}

  def fits(ex):
    fit = tf.shape(ex['targets'])[0] <= max_target
    return fit if info.input_vocab is None else fit & (tf.shape(ex['inputs'])[0] <= max_input)

  def fitting(batch):
    fit = batch['targets'].row_lengths() <= max_target
    if info.input_vocab is not None:
      fit &= batch['inputs'].row_lengths() <= max_input
    return {k: tf.ragged.boolean_mask(v, fit) for k, v in batch.items()}

  def batches(ds):
    """The same examples as `prepare`, TOKENIZE_BATCH at a time as ragged batches (pipeline.Held reads these)."""
    if info.input_vocab is None:
      return prepare(ds).ragged_batch(TOKENIZE_BATCH)
    ds = ds.batch(TOKENIZE_BATCH).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.map(fitting, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True) if train else ds

  def prepare(ds):
    if info.input_vocab is None:
      ds = ds.map(tokenize_one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:  # Tokenised TOKENIZE_BATCH pairs at a time, in order, then one by one again.
      ds = ds.batch(TOKENIZE_BATCH).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
    return ds.filter(fits) if train else ds

  prepare.batches = batches
  return prepare


def buckets(info: TextInfo) -> pipeline.Buckets:
  """Length buckets of token-budget batching: a pair's length is its longer side, EOS included (image inputs: its
  target's). A batch is cut to its bucket's length on each side, or to the side's maximum where that is shorter."""
  tokens = info.input_vocab is not None
  keys = ('inputs', 'targets') if tokens else ('targets',)

  def length(batch):
    return tf.reduce_max([tf.cast(batch[k].row_lengths(), tf.int32) for k in keys], axis=0)

  def cut(batch, length):
    return batch | {k: batch[k][:, :length] for k in keys}

  return pipeline.Buckets(max(info.max_target_length, info.input_shape[0] if tokens else 0), length, cut)


def pad_to(ids: tf.Tensor, length: int) -> tf.Tensor:
  """Cut or pad with PAD to exactly `length`."""
  ids = ids[:length]
  return tf.ensure_shape(tf.pad(ids, [[0, length - tf.shape(ids)[0]]]), [length])


def pack(inputs: np.ndarray, targets: np.ndarray, rows: int) -> dict[str, np.ndarray]:
  """Packs the sequences of a batch into `rows` rows (first-fit, longest first, in input order for ties).

  Returns inputs/targets with `*_segments` (1, 2, ... per row; 0 is padding) and `*_positions` (restarting
  at 0 in each sequence). A sequence pair that fits in no row is left out: a batch of `pack_factor` x rows
  sequences should rarely overflow, and `packed_fraction` in the output counts the ones kept.
  """
  li, lt = inputs.shape[1], targets.shape[1]
  lengths = [(int((x != PAD).sum()), int((y != PAD).sum())) for x, y in zip(inputs, targets)]
  out = {
    k: np.zeros((rows, n), np.int32)
    for k, n in (
      ('inputs', li),
      ('targets', lt),
      ('inputs_segments', li),
      ('targets_segments', lt),
      ('inputs_positions', li),
      ('targets_positions', lt),
    )
  }
  used = np.zeros((rows, 2), np.int64)
  count = np.zeros(rows, np.int32)
  kept = 0
  for i in sorted(range(len(lengths)), key=lambda i: (-sum(lengths[i]), i)):
    n_in, n_tg = lengths[i]
    if n_tg == 0:
      continue
    row = next((r for r in range(rows) if used[r, 0] + n_in <= li and used[r, 1] + n_tg <= lt), None)
    if row is None:
      continue
    count[row] += 1
    kept += 1
    for side, n, seq in (('inputs', n_in, inputs[i]), ('targets', n_tg, targets[i])):
      start = used[row, 0 if side == 'inputs' else 1]
      out[side][row, start : start + n] = seq[:n]
      out[f'{side}_segments'][row, start : start + n] = count[row]
      out[f'{side}_positions'][row, start : start + n] = np.arange(n)
    used[row] += (n_in, n_tg)
  out['packed_fraction'] = np.full((rows,), kept / max(sum(1 for _, t in lengths if t), 1), np.float32)
  return out


def pack_batch(batch: dict, rows: int) -> dict:
  """In tf.data: a batch of token sequences -> `rows` packed rows (see `pack`)."""
  keys = (
    'inputs',
    'targets',
    'inputs_segments',
    'targets_segments',
    'inputs_positions',
    'targets_positions',
    'packed_fraction',
  )

  def run(inputs, targets):
    return [pack(inputs, targets, rows)[k] for k in keys]

  values = tf.numpy_function(run, [batch['inputs'], batch['targets']], [tf.int32] * 6 + [tf.float32], stateful=False)
  shapes = [batch['inputs'].shape[1:], batch['targets'].shape[1:]] * 3 + [[]]
  return {k: tf.ensure_shape(v, [rows, *s]) for k, v, s in zip(keys, values, shapes)}
