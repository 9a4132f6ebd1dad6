"""Sequence to sequence: teacher-forced cross-entropy on real target tokens; evaluation decodes (greedy or
beam search) and scores exact match, token accuracy and corpus BLEU (sacreBLEU, 13a tokenisation; optionally
also the Transformer paper's tokenised, compound-split BLEU). Captions of images are scored as the COCO caption
toolkit (pycocoevalcap) scores them instead: BLEU-1 to BLEU-4 and CIDEr-D.
"""

from __future__ import annotations

import collections
import functools
import re
import types
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from vit_jax_lab import decode
from vit_jax_lab.data.info import SPECIALS, TextInfo, WordVocab
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tasks.base import Batch, Preprocess, Task, synthetic_dims
from vit_jax_lab.tokens import BOS, PAD

if TYPE_CHECKING:
  import tensorflow as tf

  from vit_jax_lab.data import pipeline

BLEU_ORDER = 4
CIDER_SIGMA = 6.0  # CIDEr-D's Gaussian length penalty (the COCO toolkit's sigma).
# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. ASCII \s as perl's on the
# bytes it reads; non-overlapping left to right as perl's /g, so "a-b-c" -> "a ##AT##-##AT## b-c".
COMPOUND = re.compile(r'(\S)-(\S)', re.ASCII)


def _data() -> types.SimpleNamespace:
  """vit_jax_lab.data.text and .images, imported at their first use, never with this module: they load TensorFlow
  (5.5 s, `python -X importtime`), and a config file naming this task loads without it (1.5 s), so a mistake in
  the config is reported at once."""
  from vit_jax_lab.data import images, text

  return types.SimpleNamespace(images=images, text=text)


def _sacremoses() -> types.ModuleType:
  """sacremoses, imported at its first use: 0.6 s that every config load would pay, for task.tokenized_bleu only."""
  import sacremoses

  return sacremoses


def decoder_inputs(targets: jax.Array, positions: jax.Array | None = None) -> jax.Array:
  """Targets shifted right within each sequence: BOS where a sequence starts (position 0), PAD on padding."""
  positions = jnp.arange(targets.shape[1])[None] if positions is None else positions
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(targets == PAD, PAD, jnp.where(positions == 0, BOS, shifted))


class Seq2Seq(Task):
  """Attributes:
  label_smoothing: mass spread uniformly over the vocabulary in the training targets (the paper: 0.1).
  eval_decode: how evaluation produces outputs: 'greedy' or 'beam'.
  beam_size: beams of 'beam' decoding.
  alpha: length-penalty exponent of beam search.
  length_penalty: what beam search divides a finished sequence's log-probability by, with `length` its
    tokens EOS included: 'gnmt', ((5 + length) / 6) ** alpha (Wu et al. 2016, tensor2tensor); 'power',
    length ** alpha (fairseq, Hugging Face), to compare scores with theirs.
  max_decode_length: tokens to decode at most (EOS included); None: data.max_target_length.
  scheduled_sampling: final probability that a decoder input is the model's own prediction instead of the
    gold token (Bengio et al. 2015), in the parallel two-pass form of Duckworth et al. 2019: a first pass
    without gradients predicts every position from the gold prefix, the second trains on the mixed inputs.
    0 is teacher forcing.
  scheduled_sampling_steps: the probability rises linearly from 0 to `scheduled_sampling` over these
    optimizer steps, then stays.
  tokenized_bleu: the Moses language code of the targets (e.g. 'de'): evaluation also reports
    `bleu_tokenized`, the Transformer paper's BLEU (tensor2tensor's get_ende_bleu.sh: Moses tokenisation,
    compound splitting, multi-bleu.perl without smoothing), to compare with papers; None: only sacreBLEU.
  headline: the evaluation metric a run's last line ranks its evaluations by: 'bleu' (translation), 'exact_match'
    (SCAN-like tasks, where an output is right or wrong) or 'cider_d' (captions).
  """

  predicts = 'text'

  def __init__(
    self,
    *,
    label_smoothing: float = 0.1,
    eval_decode: str = 'greedy',
    beam_size: int = 4,
    alpha: float = 0.6,
    length_penalty: str = 'gnmt',
    max_decode_length: int | None = None,
    scheduled_sampling: float = 0.0,
    scheduled_sampling_steps: int = 1,
    tokenized_bleu: str | None = None,
    headline: str = 'bleu',
  ):
    if not 0.0 <= label_smoothing < 1.0:
      raise ConfigError(f'task.label_smoothing={label_smoothing} must be in [0, 1)')
    if eval_decode not in ('greedy', 'beam'):
      raise ConfigError(f"task.eval_decode={eval_decode!r} is not one of 'greedy', 'beam'")
    if beam_size < 1:
      raise ConfigError(f'task.beam_size={beam_size} must be a positive integer')
    if alpha < 0:
      raise ConfigError(f'task.alpha={alpha} must be >= 0')
    if length_penalty not in decode.PENALTIES:
      raise ConfigError(f"task.length_penalty={length_penalty!r} is not one of 'gnmt', 'power'")
    if max_decode_length is not None and max_decode_length < 1:
      raise ConfigError(f'task.max_decode_length={max_decode_length} must be positive or None')
    if not 0.0 <= scheduled_sampling <= 1.0:
      raise ConfigError(f'task.scheduled_sampling={scheduled_sampling} must be in [0, 1]')
    if scheduled_sampling_steps < 1:
      raise ConfigError(f'task.scheduled_sampling_steps={scheduled_sampling_steps} must be a positive integer')
    if tokenized_bleu is not None and tokenized_bleu not in moses_languages():
      raise ConfigError(f'task.tokenized_bleu={tokenized_bleu!r} is not None or one of {", ".join(moses_languages())}')
    self.label_smoothing, self.eval_decode, self.beam_size, self.alpha = label_smoothing, eval_decode, beam_size, alpha
    self.length_penalty, self.max_decode_length = length_penalty, max_decode_length
    self.scheduled_sampling, self.scheduled_sampling_steps = scheduled_sampling, scheduled_sampling_steps
    if headline not in ('bleu', 'exact_match', 'cider_d'):
      raise ConfigError(f"task.headline={headline!r} is not one of 'bleu', 'exact_match', 'cider_d'")
    self.tokenized_bleu, self.headline = tokenized_bleu, f'eval/{headline}'

  # --- Data --------------------------------------------------------------------------------------------------

  def dataset_info(self, builder, data_config, workdir: str | None) -> TextInfo:
    return _data().text.dataset_info(builder, data_config, workdir)

  def model_kwargs(self, info: TextInfo) -> dict[str, Any]:
    tokens = info.input_vocab is not None
    return dict(
      vocab_size=info.target_vocab.size,
      input_vocab_size=info.input_vocab.size if tokens else None,
      input_shape=None if tokens else info.input_shape,
      max_len=max(info.max_target_length, info.input_shape[0] if tokens else 0),
    )

  def prepare(self, info: TextInfo, train: bool) -> Callable:
    return _data().text.prepare_fn(info, train)

  def preprocess(self, data_config, info: TextInfo, train: bool) -> Preprocess:
    """(example, seed) -> {'inputs': padded token ids or a preprocessed image, 'targets': padded ids}."""
    images, text = _data().images, _data().text
    image_fn = None if info.input_vocab is not None else images.preprocess_fn(data_config, info.input_shape, train)

    def fn(example: dict, seed: tf.Tensor) -> dict:
      if image_fn is None:
        inputs = text.pad_to(example['inputs'], info.input_shape[0])
      else:
        inputs = image_fn(example['inputs'], seed)
      return {'inputs': inputs, 'targets': text.pad_to(example['targets'], info.max_target_length)}

    if image_fn is None:  # Padding alone: the token-budget pipeline pads whole batches instead.
      fn.padded_to = {'inputs': info.input_shape[0], 'targets': info.max_target_length}
    return fn

  def pack(self, data_config) -> tuple[int, Callable] | None:
    """(examples per row, the batch map) when `data.pack_factor` asks for sequence packing."""
    return (data_config.pack_factor, _data().text.pack_batch) if data_config.pack_factor > 1 else None

  def buckets(self, data_config, info: TextInfo) -> pipeline.Buckets | None:
    """Length buckets when `data.token_budget` asks for batches by tokens (the paper's batching)."""
    if data_config.token_budget == 0:
      return None
    if data_config.pack_factor > 1:
      raise ConfigError(
        f'data.token_budget={data_config.token_budget} and data.pack_factor={data_config.pack_factor}: batches are '
        'either by token budget or packed; set data.pack_factor=1 or data.token_budget=0'
      )
    return _data().text.buckets(info)

  # --- Training ----------------------------------------------------------------------------------------------

  def sampling_rate(self, step: jax.Array) -> jax.Array:
    return self.scheduled_sampling * jnp.minimum(step / self.scheduled_sampling_steps, 1.0)

  def loss(
    self, model: nnx.Module, batch: Batch, rng: jax.Array, step: jax.Array
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean cross-entropy over the real target tokens of the batch, and metrics to log."""
    targets = batch['targets']
    segments, positions = batch.get('targets_segments'), batch.get('targets_positions')
    dropout_rng, mix_rng = jax.random.split(rng)
    rngs = nnx.Rngs(dropout=dropout_rng)
    encoded, encoder_segments = model.encode(
      batch['inputs'],
      segments=batch.get('inputs_segments'),
      positions=batch.get('inputs_positions'),
      train=True,
      rngs=rngs,
    )
    inputs = decoder_inputs(targets, positions)

    def run(x):
      return model.decode(x, encoded, encoder_segments, segments=segments, positions=positions, train=True, rngs=rngs)

    metrics = {'packed_fraction': batch['packed_fraction'].mean()} if 'packed_fraction' in batch else {}
    if self.scheduled_sampling > 0.0:
      rate = self.sampling_rate(step)
      predicted = decoder_inputs(jax.lax.stop_gradient(run(inputs)).argmax(-1).astype(targets.dtype), positions)
      use = jax.random.bernoulli(mix_rng, rate, inputs.shape) & (inputs != BOS) & (inputs != PAD)
      inputs = jnp.where(use, predicted, inputs)
      metrics['sampling_rate'] = rate
    loss, correct, tokens = token_sums(run(inputs), targets, targets != PAD, self.label_smoothing)
    tokens = jnp.maximum(tokens, 1.0)
    return loss / tokens, metrics | {'loss': loss / tokens, 'token_accuracy': correct / tokens}

  # --- Evaluation --------------------------------------------------------------------------------------------

  def generate(
    self, model: nnx.Module, inputs: jax.Array, length: int, encoded: tuple[jax.Array, jax.Array] | None = None
  ) -> jax.Array:
    """Token ids (B, length) by the configured decoding, with the cache; `encoded`: `model.encode(inputs)`."""
    batch = inputs.shape[0]
    if self.eval_decode == 'greedy':
      return decode.greedy(decode.stepper(model, inputs, length, encoded=encoded), batch, length)[0]
    s = decode.stepper(model, inputs, length, repeat=self.beam_size, encoded=encoded)
    return decode.beam_search(
      s, batch, length, beam_size=self.beam_size, alpha=self.alpha, length_penalty=self.length_penalty
    )[0][:, 0]

  def predict(self, model: nnx.Module, batch: Batch, info: TextInfo, top_k: int) -> jax.Array:
    """Token ids (batch, length) decoded as evaluation decodes them, of task.max_decode_length or
    data.max_target_length tokens; `top_k` is for classes."""
    del top_k
    return self.generate(model, batch['inputs'], self.max_decode_length or info.max_target_length)

  def input_kind(self, info: TextInfo) -> str:
    return 'text' if info.input_vocab is not None else 'image'

  def blank_targets(self, info: TextInfo) -> dict[str, Any]:
    return {info.target_key: ''}

  def synthetic_batch(self, shape: str, batch_size: int) -> tuple[TextInfo, Batch]:
    """LENGTH,VOCAB: random source and target tokens of one shared word vocabulary."""
    length, size = synthetic_dims(shape, (2,), 'LENGTH,VOCAB')
    vocab = WordVocab([f'w{i}' for i in range(max(size - len(SPECIALS), 1))])
    info = TextInfo('inputs', 'targets', vocab, vocab, (length,), length, 0, 0)
    keys = jax.random.split(jax.random.key(0))
    return info, {
      k: jax.random.randint(key, (batch_size, length), len(SPECIALS), vocab.size)
      for k, key in zip(('inputs', 'targets'), keys)
    }

  def eval_sums(self, model: nnx.Module, batch: Batch) -> dict[str, Any]:
    """Sums over the real (mask=1) examples, and under 'host' the arrays BLEU is computed from on the host."""
    targets, mask = batch['targets'], batch['mask']
    encoded, encoder_segments = model.encode(batch['inputs'])
    logits = model.decode(decoder_inputs(targets), encoded, encoder_segments)
    loss, correct, tokens = token_sums(logits, targets, (targets != PAD) * mask[:, None])
    length = self.max_decode_length or targets.shape[1]
    decoded = self.generate(model, batch['inputs'], length, (encoded, encoder_segments))
    width = max(length, targets.shape[1])

    def pad(x):
      return jnp.pad(x, ((0, 0), (0, width - x.shape[1])))

    exact = (pad(decoded) == pad(targets)).all(-1)
    return {
      'loss': loss,
      'token_accuracy': correct,
      'tokens': tokens,
      'exact_match': (exact * mask).sum(),
      'count': mask.sum(),
      'host': {'decoded': decoded, 'targets': targets, 'mask': mask},
    }

  def host_sums(self, host: dict[str, np.ndarray], info: TextInfo) -> dict[str, np.ndarray]:
    """BLEU statistics of detokenised outputs against detokenised targets (and, with `tokenized_bleu`, of the
    same text Moses-tokenised and compound-split); for captions of images, the caption pairs themselves (CIDEr-D
    weighs n-grams by how many captions of the whole split hold them, so it is computed once, in `summarize`)."""
    keep, vocab = host['mask'] > 0, info.target_vocab
    hypotheses = [vocab.decode(ids) for ids in host['decoded'][keep]]
    references = [vocab.decode(ids) for ids in host['targets'][keep]]
    if getattr(info, 'input_vocab', None) is None and getattr(info, 'input_shape', None) is not None:
      return {'captions': caption_pairs(hypotheses, references)}
    sums = {'bleu_stats': bleu_stats(hypotheses, references)}
    if self.tokenized_bleu is not None:
      sums['bleu_tokenized_stats'] = bleu_stats(hypotheses, references, moses_tokens(self.tokenized_bleu))
    return sums

  def summarize(self, sums: dict[str, Any]) -> dict[str, float]:
    tokens, count = max(float(sums['tokens']), 1.0), max(float(sums['count']), 1.0)
    metrics = {
      'loss': float(sums['loss']) / tokens,
      'token_accuracy': float(sums['token_accuracy']) / tokens,
      'exact_match': float(sums['exact_match']) / count,
    }
    if 'captions' in sums:
      hypotheses, references = zip(*sums['captions'][0]) if sums['captions'][0] else ((), ())
      metrics |= caption_scores(list(hypotheses), [[r] for r in references])
    else:
      metrics['bleu'] = bleu(sums['bleu_stats'])
      if self.tokenized_bleu is not None:
        metrics['bleu_tokenized'] = bleu(sums['bleu_tokenized_stats'], 'none')
    return metrics | {'examples': float(sums['count'])}


def token_sums(
  logits: jax.Array, targets: jax.Array, weights: jax.Array, label_smoothing: float = 0.0
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(cross-entropy, correct predictions, tokens), each summed over the target tokens `weights` selects."""
  logits, weights = logits.astype(jnp.float32), weights.astype(jnp.float32)
  soft = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), label_smoothing)
  return (
    (optax.softmax_cross_entropy(logits, soft) * weights).sum(),
    ((logits.argmax(-1) == targets) * weights).sum(),
    weights.sum(),
  )


def moses_languages() -> list[str]:
  """Language codes sacremoses has nonbreaking prefixes for: it tokenises any other code as English, silently."""
  return sorted(set(_sacremoses().corpus.NonbreakingPrefixes().available_langs.values()))


def split_compounds(text: str) -> str:
  """Compound splitting of tokenised text as the Transformer paper's BLEU (GNMT, ConvS2S): "rich-text" ->
  "rich ##AT##-##AT## text"."""
  return COMPOUND.sub(r'\1 ##AT##-##AT## \2', text)


@functools.cache
def moses_tokens(lang: str) -> Callable[[str], list[str]]:
  """text -> tokens as tensor2tensor's get_ende_bleu.sh: Moses replace-unicode-punctuation.perl, then
  tokenizer.perl -l LANG (its defaults: XML escaping, no -a hyphen splitting), then compound splitting."""
  sacremoses = _sacremoses()
  normalizer, tokenizer = sacremoses.MosesPunctNormalizer(lang), sacremoses.MosesTokenizer(lang)

  def tokenize(text: str) -> list[str]:
    text = tokenizer.tokenize(normalizer.replace_unicode_punct(text), escape=True, return_str=True)
    return split_compounds(text).split()

  return tokenize


def bleu_stats(
  hypotheses: list[str], references: list[str], tokenize: Callable[[str], list[str]] | None = None
) -> np.ndarray:
  """Sufficient statistics of corpus BLEU, summable over batches and hosts: hypothesis length, reference
  length, then n-gram matches and hypothesis n-gram counts for n = 1..4, of the tokens `tokenize` gives
  (default: sacreBLEU's 13a tokenisation)."""
  if tokenize is None:
    tokenizer_13a = Tokenizer13a()

    def tokenize(text: str) -> list[str]:
      return tokenizer_13a(text.strip()).split()

  stats = np.zeros(2 + 2 * BLEU_ORDER, np.int64)
  for hypothesis, reference in zip(hypotheses, references):
    hyp, ref = tokenize(hypothesis), tokenize(reference)
    stats[:2] += len(hyp), len(ref)
    for n in range(1, BLEU_ORDER + 1):
      hyp_ngrams = collections.Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
      ref_ngrams = collections.Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
      stats[1 + n] += sum((hyp_ngrams & ref_ngrams).values())
      stats[1 + BLEU_ORDER + n] += sum(hyp_ngrams.values())
  return stats


def bleu(stats: np.ndarray, smoothing: str = 'exp') -> float:
  """Corpus BLEU (0-100) from summed `bleu_stats`. smoothing: 'exp', sacreBLEU's default; 'none', as
  multi-bleu.perl (0 when an n-gram precision is 0)."""
  if smoothing not in ('exp', 'none'):
    raise ValueError(f"smoothing={smoothing!r} is not one of 'exp', 'none'")
  stats = [int(x) for x in stats]
  return BLEU.compute_bleu(
    correct=stats[2 : 2 + BLEU_ORDER],
    total=stats[2 + BLEU_ORDER :],
    sys_len=stats[0],
    ref_len=stats[1],
    smooth_method=smoothing,
  ).score


def caption_pairs(hypotheses: list[str], references: list[str]) -> np.ndarray:
  """(hypothesis, reference) pairs as a one-element object array: the evaluation loop adds the sums of its batches
  with np.add, which joins the lists it holds."""
  pairs = np.empty(1, object)
  pairs[0] = list(zip(hypotheses, references))
  return pairs


def caption_words(text: str) -> list[str]:
  """The words the COCO toolkit scores: its PTB tokenizer's output lowercased, punctuation dropped. Captions made
  of words and spaces (as the built-in ones) come out as their words."""
  return re.findall(r"[\w']+", text.lower())


def _ngrams(words: list[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def caption_scores(hypotheses: list[str], references: list[list[str]]) -> dict[str, float]:
  """BLEU-1..4 and CIDEr-D of one caption per image against that image's reference captions, in [0, 1] (BLEU)
  and [0, 10] (CIDEr-D) as the COCO caption toolkit (pycocoevalcap's Bleu(4) and Cider) computes them:

  BLEU is corpus BLEU with each caption's reference length the one closest to its own (ties: the shorter), n-gram
  matches clipped by their most frequent reference count, and precisions (matches + 1e-15) / (n-grams + 1e-9), so
  an order without n-grams (captions of 3 words have no 4-grams) gives about 0 rather than nothing.
  CIDEr-D: per n = 1..4, n-gram counts weighted by log(images / images whose references hold the n-gram), the
  candidate's weights clipped by the reference's, cosine similarity times exp(-(length difference)^2 / 2 sigma^2)
  (lengths counted as the toolkit counts them, in bigrams), averaged over n and references, times 10, then over
  the images."""
  if not hypotheses:
    return {f'bleu_{n}': 0.0 for n in range(1, BLEU_ORDER + 1)} | {'cider_d': 0.0}
  hyps = [caption_words(h) for h in hypotheses]
  refs = [[caption_words(r) for r in rs] for rs in references]
  correct, guess, hyp_len, ref_len = np.zeros(BLEU_ORDER), np.zeros(BLEU_ORDER), 0, 0
  for hyp, rs in zip(hyps, refs):
    hyp_len += len(hyp)
    ref_len += min((abs(len(r) - len(hyp)), len(r)) for r in rs)[1]
    for n in range(1, BLEU_ORDER + 1):
      most = collections.Counter()
      for r in rs:
        most |= _ngrams(r, n)
      correct[n - 1] += sum((_ngrams(hyp, n) & most).values())
      guess[n - 1] += max(0, len(hyp) - n + 1)
  precisions = (correct + 1e-15) / (guess + 1e-9)
  ratio = (hyp_len + 1e-15) / (ref_len + 1e-9)
  brevity = 1.0 if ratio >= 1 else float(np.exp(1 - 1 / ratio))
  scores = {f'bleu_{n}': brevity * float(np.prod(precisions[:n]) ** (1 / n)) for n in range(1, BLEU_ORDER + 1)}
  return scores | {'cider_d': cider_d(hyps, refs)}


def cider_d(hyps: list[list[str]], refs: list[list[list[str]]]) -> float:
  """CIDEr-D of tokenised captions (see caption_scores)."""
  counts = [{n: _ngrams(words, n) for n in range(1, BLEU_ORDER + 1)} for words in hyps]
  ref_counts = [[{n: _ngrams(words, n) for n in range(1, BLEU_ORDER + 1)} for words in rs] for rs in refs]
  frequency = collections.Counter(g for rs in ref_counts for g in {g for r in rs for c in r.values() for g in c})
  log_images = np.log(len(refs))

  def vector(c: dict[int, collections.Counter]) -> tuple[dict, dict, int]:
    weights = {n: {g: f * (log_images - np.log(max(1.0, frequency[g]))) for g, f in c[n].items()} for n in c}
    norms = {n: float(np.sqrt(sum(w * w for w in weights[n].values()))) for n in c}
    return weights, norms, sum(c[2].values())

  total = 0.0
  for c, rs in zip(counts, ref_counts):
    w, norm, length = vector(c)
    score = np.zeros(BLEU_ORDER)
    for r in rs:
      rw, rnorm, rlength = vector(r)
      for n in range(1, BLEU_ORDER + 1):
        value = sum(min(v, rw[n].get(g, 0.0)) * rw[n].get(g, 0.0) for g, v in w[n].items())
        if norm[n] and rnorm[n]:
          value /= norm[n] * rnorm[n]
        score[n - 1] += value * np.exp(-((length - rlength) ** 2) / (2 * CIDER_SIGMA**2))
    total += 10.0 * score.mean() / len(rs)
  return total / len(hyps)
