"""What a model and its task need to know of a dataset before anything is built: shapes, classes, vocabularies.

TensorFlow-free, unlike the modules that read the data (labels, text, tracking): a train step on synthetic input
(`tools.bench --synthetic`), model construction and the lowering tests build these without a dataset, on machines
that may have no TensorFlow at all.
"""

import dataclasses
import os
from typing import Protocol

import numpy as np
import sentencepiece as spm

from vit_jax_lab import errors
from vit_jax_lab.errors import ConfigError, check
from vit_jax_lab.tokens import BOS, EOS, PAD, UNK, foreign_ids

SPECIALS = ('<pad>', '<s>', '</s>', '<unk>')  # Ids PAD, BOS, EOS, UNK of every vocabulary.


@dataclasses.dataclass(frozen=True)
class LabelInfo:
  """What a classification model and task need to know about the data before anything is built."""

  num_classes: int
  input_key: str  # The raw feature the model input is made from: 'image', 'video' or 'inputs' (token ids).
  input_shape: tuple[int, ...]  # One preprocessed example: (height, width, channels), (frames, h, w, c), or
  # (data.max_input_length,) token ids, padded with 0.
  num_train: int  # Examples in the train split (all shards).
  num_eval: int  # Examples in the eval split (all shards).
  vocab_size: int = 0  # Token inputs: ids are below this (0 is padding); 0 for images and videos.
  source_size: tuple[int, int] | None = None  # (height, width) of the stored images or frames when all share it.
  frames_root: str | None = None  # Videos stored as frame files: the folder of their paths (videos.read_frames).


IMAGE_AUGMENTATIONS = (  # data.* keys that resize or augment images and videos: refused for token inputs.
  'image_size',
  'resize_size',
  'inception_crop',
  'crop_padding',
  'flip',
  'color_augment',
  'color_drop',
  'randaugment_layers',
  'random_erasing',
  'rotate90',
  'recolor',
)


def resized_size(height: int, width: int, short: int) -> tuple[int, int]:
  """(height, width) scaled so that the shorter side is `short`, rounded half up (as images.resized_size)."""
  shorter = min(height, width)
  return (height * short + shorter // 2) // shorter, (width * short + shorter // 2) // shorter


def split_size(builder, split: str) -> int:
  """The examples in `split`; 0 before the data is generated, when a builder declares its features alone and no
  split (what the model is checked on before the data is written). Not `is_prepared()`: a builder read from a
  directory (grain's ArrayRecord copy) says False there, with its splits known."""
  splits = builder.info.splits
  return splits[split].num_examples if len(splits) else 0


def input_key(features) -> str | None:
  """'image' or 'video', else 'inputs' (token ids): the feature the model input is made from; None when there is
  none, or both an image and a video."""
  keys = [k for k in ('image', 'video') if k in features]
  if not keys and 'inputs' in features:
    return 'inputs'
  return keys[0] if len(keys) == 1 else None


def label_info(builder, data_config) -> LabelInfo:
  """Input shape and classes of an image, video or token classification dataset (its TFDS builder's info)."""
  name, features = data_config.name, builder.info.features
  key = input_key(features)
  check(
    key is not None and 'label' in features,
    f'data.name={name!r} has features {list(features)}; classification needs "label" and one of "image", "video", '
    '"inputs" (token ids)',
  )
  if key == 'inputs':
    return _token_info(builder, data_config)
  frames_root = None
  if key == 'image':
    shape = tuple(features['image'].shape)
    source = shape[:2]
    if data_config.image_size is not None:
      shape = (data_config.image_size, data_config.image_size, shape[-1])
    elif data_config.resize_size is not None and None not in shape:
      shape = (*(int(n) for n in resized_size(shape[0], shape[1], data_config.resize_size)), shape[-1])
    check(None not in shape, f'data.name={name!r} has images of varying size {shape}: set data.image_size')
  else:
    frame_files = len(features['video'].shape) == 1  # Paths of frame files (the folder builder's videos).
    _, height, width, channels = (None, None, None, 3) if frame_files else features['video'].shape
    source = (height, width)
    if frame_files:
      frames_root = builder.frames_root()
      check(
        os.path.isdir(frames_root),
        f'data.name={name!r} reads its frames from {frames_root}, which is gone: delete {builder.data_dir} and run '
        'again, it is prepared anew',
      )
    check(
      data_config.image_size is not None or None not in (height, width),
      f'data.name={name!r} has frames of varying size {(height, width)}: set data.image_size',
    )
    if data_config.image_size is not None:
      height = width = data_config.image_size
    elif data_config.resize_size is not None:
      height, width = (int(n) for n in resized_size(height, width, data_config.resize_size))
    shape = (data_config.num_frames, height, width, channels)
  return LabelInfo(
    num_classes=features['label'].num_classes,
    input_key=key,
    input_shape=shape,
    num_train=split_size(builder, data_config.train_split),
    num_eval=split_size(builder, data_config.eval_split),
    source_size=None if None in source else tuple(int(n) for n in source),
    frames_root=frames_root,
  )


def _token_info(builder, data_config) -> LabelInfo:
  """A token-sequence dataset: its vocabulary from the metadata, sequences padded to data.max_input_length."""
  name, feature, metadata = data_config.name, builder.info.features['inputs'], builder.info.metadata or {}
  check(
    feature.shape == (None,) and np.issubdtype(feature.np_dtype, np.integer),
    f'data.name={name!r}: its "inputs" feature is {feature}; token classification needs integer ids of shape (None,)',
  )
  check(
    'vocabulary' in metadata,
    f"data.name={name!r} declares no vocabulary (info.metadata['vocabulary']), so the token embedding cannot be sized",
  )
  longest, length = metadata.get('max_length'), data_config.max_input_length
  check(
    longest is None or longest <= length,
    f'data.max_input_length={length} is shorter than the sequences of {name} (up to {longest} tokens): set it to '
    f'at least {longest}',
  )
  image_keys = [k for k in IMAGE_AUGMENTATIONS if data_config[k]]
  image_keys += ['scale_jitter'] if tuple(data_config.scale_jitter) != (1.0, 1.0) else []
  if image_keys:
    key = image_keys[0]
    raise ConfigError(
      f'data.{key}={data_config[key]!r} resizes or augments images, and data.name={name!r} has token sequences: '
      'unset it'
    )
  return LabelInfo(
    num_classes=builder.info.features['label'].num_classes,
    input_key='inputs',
    input_shape=(length,),
    num_train=split_size(builder, data_config.train_split),
    num_eval=split_size(builder, data_config.eval_split),
    vocab_size=len(metadata['vocabulary']),
  )


def sentencepiece_model(path: str) -> spm.SentencePieceProcessor:
  """The SentencePiece model file at `path`; one that is not one (empty, text, garbage) is one line."""
  errors.regular_file(path, 'the SentencePiece model', errors.JSON_LIMIT)
  try:
    return spm.SentencePieceProcessor(model_file=path)
  except (RuntimeError, OSError) as e:
    raise ConfigError(f'{errors.foreign(path)} is not a SentencePiece model ({errors.foreign(e, 80)})') from None


class Vocab(Protocol):
  """A vocabulary: WordVocab, MarianVocab, or text.SentencePieceVocab."""

  size: int  # Ids are below this.

  def decode(self, ids: np.ndarray) -> str: ...


class WordVocab:
  """Words split on spaces; `words` (sorted, unique) take the ids after the special tokens. Encoding happens in
  tf.data (`text.encoder`)."""

  def __init__(self, words: list[str]):
    self.words = list(SPECIALS) + sorted(set(words))
    self.size = len(self.words)

  def decode(self, ids: np.ndarray) -> str:
    """Ids up to the first EOS -> text; PAD and BOS are skipped."""
    return ' '.join(self.words[i] for i in until_eos(ids) if i not in (PAD, BOS))


def until_eos(ids: np.ndarray) -> list[int]:
  ids = [int(i) for i in ids]
  return ids[: ids.index(EOS)] if EOS in ids else ids


@dataclasses.dataclass(frozen=True)
class TextInfo:
  """What a seq2seq model and task need to know about the data before anything is built."""

  input_key: str  # Source feature: text, or an image.
  target_key: str  # Target text feature.
  input_vocab: Vocab | None  # None: the inputs are images.
  target_vocab: Vocab
  input_shape: tuple[int, ...]  # (max_input_length,) tokens, or (height, width, channels).
  max_target_length: int  # Target tokens, EOS included.
  num_train: int
  num_eval: int


@dataclasses.dataclass(frozen=True)
class TrackingInfo:
  """What the tracker and the tracking task need to know about the data before anything is built."""

  channels: int
  frames: int | None  # Frames per sequence; None: sequences of any length (real videos, tracked one by one).
  frame_size: tuple[int, int] | None  # (height, width) of the frames; None: any.
  num_train: int  # Sequences in the train split.
  num_eval: int  # Sequences in the eval split.
  template_size: int  # The crops, as data.template_size, data.search_size, data.template_factor, data.search_factor.
  search_size: int
  template_factor: float
  search_factor: float
  value_range: tuple[float, float] = (-1.0, 1.0)  # data.value_range: what frames are scaled to.
  frames_root: str | None = None  # The folder the frames' paths are relative to; None: 'frames' holds the files.


class MarianVocab:
  """The tokenizer of a transformers Marian folder (opus-mt: source.spm, target.spm, vocab.json, and
  tokenizer_config.json's names of the special tokens), in our ids: SentencePiece pieces of one side -> vocab.json's
  ids -> ours by tokens.foreign_ids, the rule the model's weights are gathered by. `side`: 'source' (encodes inputs)
  or 'target' (encodes targets, decodes translations). Encoding happens in tf.data (`text.encoder`)."""

  FILES = ('source.spm', 'target.spm', 'vocab.json')

  def __init__(self, path: str, side: str = 'target'):
    missing = [f for f in self.FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
      raise ConfigError(f'{path!r} is not a Marian tokenizer folder: it lacks {", ".join(missing)}')
    if side not in ('source', 'target'):
      raise ValueError(f"side={side!r} is not 'source' or 'target'")
    names = {'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<pad>'}
    config_file = os.path.join(path, 'tokenizer_config.json')
    if os.path.isfile(config_file):
      config = errors.read_json(config_file, 'the tokenizer config')
      if config.get('separate_vocabs'):
        raise ConfigError(f'{path!r}: separate source and target vocabularies (separate_vocabs) are not read')
      names |= {k: config[k] for k in names if isinstance(config.get(k), str)}
    self.marian = errors.read_json(os.path.join(path, 'vocab.json'), 'the vocabulary')  # piece -> Marian id.
    bad = next(
      ((k, i) for k, i in self.marian.items() if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 2**31),
      None,
    )
    check(
      bad is None,
      f'{errors.foreign(path)!r}: vocab.json maps {errors.foreign(repr(bad and bad[0]), 40)} to '
      f'{errors.foreign(repr(bad and bad[1]), 40)}; each piece needs an integer id from 0 to its piece count - 1',
    )
    check(
      sorted(self.marian.values()) == list(range(len(self.marian))),
      f'{errors.foreign(path)!r}: vocab.json must number its {len(self.marian)} pieces 0 to {len(self.marian) - 1}, '
      'each id once',
    )
    absent = [n for n in names.values() if n not in self.marian]
    if absent:
      raise ConfigError(f'{path!r}: vocab.json lacks the special tokens {", ".join(absent)}')
    self.path, self.side = path, side
    self._sp = sentencepiece_model(os.path.join(path, f'{side}.spm'))
    pad, eos, unk = (self.marian[names[k]] for k in ('pad_token', 'eos_token', 'unk_token'))
    rows = foreign_ids(len(self.marian), pad, eos, unk)
    self.size = len(rows)
    self._ours = {m: i for i, m in reversed(list(enumerate(rows)))}  # Marian id -> ours (its pad: PAD, not BOS).
    by_id = {i: piece for piece, i in self.marian.items()}
    self.pieces = [by_id[m] for m in rows]  # Our id -> its piece.
    self._unk = self.marian[names['unk_token']]

  def tokenize(self, text: str) -> list[str]:
    """The pieces of `text` as the library's tokenizer splits it: a leading language code (>>de<<) whole."""
    code = []
    if text.startswith('>>') and (end := text.find('<<')) != -1:
      code, text = [text[: end + 2]], text[end + 2 :]
    return code + self._sp.encode(text, out_type=str)

  def encode(self, text: str) -> list[int]:
    """Our ids of `text`, without EOS; a piece vocab.json lacks is UNK."""
    return [self._ours[self.marian.get(piece, self._unk)] for piece in self.tokenize(text)]

  def decode(self, ids: np.ndarray) -> str:
    """Ids up to the first EOS -> text, as the library's `decode(skip_special_tokens=True)`: PAD, BOS and UNK left
    out, the pieces joined by this side's SentencePiece model."""
    pieces = [self.pieces[i] for i in until_eos(ids) if i not in (PAD, BOS, UNK)]
    return self._sp.decode_pieces(pieces).replace('\u2581', ' ').strip()


def is_marian_folder(path: str) -> bool:
  """Whether `path` is a folder with a Marian tokenizer (data.vocab may name one)."""
  return os.path.isdir(path) and all(os.path.isfile(os.path.join(path, f)) for f in MarianVocab.FILES)
