"""What a model and its task need to know of a dataset before anything is built: shapes, classes, vocabularies.

TensorFlow-free, unlike the modules that read the data (labels, text, tracking): a train step on synthetic input
(`tools.bench --synthetic`), model construction and the lowering tests build these without a dataset, on machines
that may have no TensorFlow at all.
"""

import dataclasses
from typing import Protocol

import numpy as np

from vit_jax_lab.tokens import BOS, EOS, PAD

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


class Vocab(Protocol):
  """A vocabulary: WordVocab, or text.SentencePieceVocab."""

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
