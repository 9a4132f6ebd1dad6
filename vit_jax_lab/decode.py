"""Autoregressive decoding: greedy, sampling and beam search, as `lax.while_loop`s inside jit.

A decoder is any `Stepper`: next-token logits from the last tokens and a state. `stepper(model, ...)`
makes one from a seq2seq model, with the key/value cache (each token costs work linear in the length so
far) or without it (the whole prefix is run again every step; the reference the cache is tested against).
Sequences start after BOS; EOS ends one, and the positions after it hold PAD. No decoder generates PAD or BOS:
their log-probabilities are set to NEG_INF before every choice (the others are not renormalised, so scores stay
the model's log-probabilities).
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from vit_jax_lab.tokens import BOS, EOS, PAD

NEG_INF = -1e9  # Score of impossible candidates (finite, so arithmetic on it stays well defined).


@dataclasses.dataclass(frozen=True)
class Stepper:
  """`step(tokens (N,), index, state) -> (logits (N, V), state)`; every array in `state` has N first."""

  step: Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]
  state: Any


def stepper(
  model,
  inputs: jax.Array,
  length: int,
  *,
  cached: bool = True,
  repeat: int = 1,
  encoded: tuple[jax.Array, jax.Array] | None = None,
) -> Stepper:
  """Decodes `model` (a seq2seq Transformer) for `inputs`, up to `length` tokens; each example repeated
  `repeat` times (the beams of beam search) next to each other. `encoded`: `model.encode(inputs)` when the
  caller has it already."""
  encoded, segments = model.encode(inputs) if encoded is None else encoded
  encoded, segments = (jnp.repeat(x, repeat, axis=0) for x in (encoded, segments))
  if cached:
    return Stepper(model.decode_step, model.init_cache(encoded, segments, length))

  def step(tokens, index, state):
    prefix = jax.lax.dynamic_update_slice_in_dim(state['prefix'], tokens[:, None], index, 1)
    logits = model.decode(prefix, state['encoded'], state['segments'], segments=jnp.ones_like(prefix))
    return jax.lax.dynamic_index_in_dim(logits, index, 1, keepdims=False), state | {'prefix': prefix}

  prefix = jnp.zeros((encoded.shape[0], length), jnp.int32)
  return Stepper(step, {'prefix': prefix, 'encoded': encoded, 'segments': segments})


def _filter(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
  """Logits to sample from: divided by `temperature`, then only the `top_k` most likely tokens (0: all) and the
  smallest set whose probability reaches `top_p` (1: all)."""
  logits = logits / temperature
  if top_k:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    # The smallest logit kept: that of the first token where the mass before it already reaches top_p, or the last.
    cutoff_index = jnp.sum(cumulative - jax.nn.softmax(sorted_logits, axis=-1) < top_p, axis=-1, keepdims=True) - 1
    cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
    logits = jnp.where(logits < cutoff, NEG_INF, logits)
  return logits


def greedy(
  s: Stepper,
  batch: int,
  length: int,
  *,
  rng: jax.Array | None = None,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  min_length: int = 0,
) -> tuple[jax.Array, jax.Array]:
  """The most likely next token at every step (or, with `rng`, a sampled one) -> tokens (batch, length) and
  their log-probabilities summed up to EOS (batch,). PAD and BOS are never chosen, nor EOS before
  `min_length` tokens. Stops early once every sequence has ended."""

  def body(carry):
    index, last, state, tokens, scores, done = carry
    logits, state = s.step(last, index, state)
    log_probs = _allowed(jax.nn.log_softmax(logits.astype(jnp.float32)))
    if min_length:
      log_probs = log_probs.at[:, EOS].set(jnp.where(index < min_length, NEG_INF, log_probs[:, EOS]))
    if rng is None:
      token = log_probs.argmax(-1)
    else:
      token = jax.random.categorical(jax.random.fold_in(rng, index), _filter(log_probs, temperature, top_k, top_p))
    token = jnp.where(done, PAD, token).astype(jnp.int32)
    scores += jnp.where(done, 0.0, jnp.take_along_axis(log_probs, token[:, None], -1)[:, 0])
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], index, 1)
    return index + 1, token, state, tokens, scores, done | (token == EOS)

  def cond(carry):
    index, *_, done = carry
    return (index < length) & ~done.all()

  init = (
    jnp.asarray(0),
    jnp.full((batch,), BOS, jnp.int32),
    s.state,
    jnp.zeros((batch, length), jnp.int32),
    jnp.zeros((batch,), jnp.float32),
    jnp.zeros((batch,), bool),
  )
  _, _, _, tokens, scores, _ = jax.lax.while_loop(cond, body, init)
  return tokens, scores


def _gnmt(length: jax.Array, alpha: float) -> jax.Array:
  return ((5.0 + length) / 6.0) ** alpha


def _power(length: jax.Array, alpha: float) -> jax.Array:
  return jnp.asarray(length, jnp.float32) ** alpha


PENALTIES = {'gnmt': _gnmt, 'power': _power}


def length_penalty(length: jax.Array, alpha: float, form: str = 'gnmt') -> jax.Array:
  """What a finished sequence's log-probability is divided by to score it. `length` counts the generated tokens,
  EOS included (BOS not): a sequence of 3 words and EOS has length 4. `form` 'gnmt': ((5 + length) / 6) ** alpha
  (Wu et al. 2016, tensor2tensor, the flax WMT example); 'power': length ** alpha (fairseq, Hugging Face's
  `length_penalty`). Both are 1 for alpha 0 and grow with the length."""
  return _penalty(form)(length, alpha)


def _penalty(form: str) -> Callable[[jax.Array, float], jax.Array]:
  if form not in PENALTIES:
    raise ValueError(f'length penalty {form!r} is not one of {", ".join(map(repr, PENALTIES))}')
  return PENALTIES[form]


def beam_search(
  s: Stepper, batch: int, length: int, *, beam_size: int, alpha: float = 0.6, length_penalty: str = 'gnmt'
) -> tuple[jax.Array, jax.Array]:
  """The `beam_size` best-scoring sequences per example -> tokens (batch, beam, length) and scores
  (batch, beam), best first; a slot no sequence reached holds score NEG_INF. `s` must hold each example
  `beam_size` times (`stepper(..., repeat=beam_size)`). `length_penalty`: the form of `length_penalty`
  ('gnmt' or 'power') with exponent `alpha`.

  The search of tensor2tensor and the flax WMT example: k = `beam_size` live (unfinished) beams and a set of
  the k best finished sequences. Each step takes the 2k best extensions of the live beams by log-probability
  (one extension per beam ends in EOS, so at least k of them do not): those ending in EOS (all of them at
  the last step, `length`) join the finished set, scored by log-probability / length_penalty, and the k
  best of the others are the next live beams, so the beam stays full however many sequences have finished.
  PAD and BOS are never chosen; scores are the model's log-probabilities (not renormalised without them).
  The search stops when no live beam can still beat the k-th finished sequence: log-probabilities only
  fall, so a live beam's best possible score is its log-probability over the penalty of the longest length.
  """
  k = beam_size
  penalty = _penalty(length_penalty)
  offsets = (jnp.arange(batch) * k)[:, None]

  def body(carry):
    index, alive, alive_logp, state, finished, finished_scores = carry
    logits, state = s.step(_last(alive, index), index, state)
    log_probs = _allowed(jax.nn.log_softmax(logits.astype(jnp.float32))).reshape(batch, k, -1)
    vocab = log_probs.shape[-1]
    candidates = (alive_logp[:, :, None] + log_probs).reshape(batch, k * vocab)
    top_logp, top = jax.lax.top_k(candidates, 2 * k)
    beam, token = top // vocab, (top % vocab).astype(jnp.int32)
    seqs = jnp.take_along_axis(alive, beam[:, :, None], axis=1)
    seqs = jax.lax.dynamic_update_slice_in_dim(seqs, token[:, :, None], index, 2)
    eos = token == EOS
    # The finished set: the k best of those it had and the candidates that end here.
    ends = eos | (index == length - 1)
    new_scores = jnp.where(ends & (top_logp > NEG_INF / 2), top_logp / penalty(index + 1.0, alpha), NEG_INF)
    finished_scores, best = jax.lax.top_k(jnp.concatenate([finished_scores, new_scores], axis=1), k)
    finished = jnp.take_along_axis(jnp.concatenate([finished, seqs], axis=1), best[:, :, None], axis=1)
    # The live beams: the k best candidates that do not end in EOS, and the state of the beams they extend.
    alive_logp, keep = jax.lax.top_k(jnp.where(eos, -jnp.inf, top_logp), k)
    alive = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
    parents = jnp.take_along_axis(beam, keep, axis=1)
    state = jax.tree.map(lambda x: x[(offsets + parents).reshape(-1)], state)
    return index + 1, alive, alive_logp, state, finished, finished_scores

  def cond(carry):
    index, _, alive_logp, _, _, finished_scores = carry
    best_possible = alive_logp.max(-1) / penalty(float(length), alpha)
    can_improve = (best_possible > finished_scores.min(-1)) & (alive_logp.max(-1) > NEG_INF / 2)
    return (index < length) & can_improve.any()

  alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (batch, 1))  # One live beam to start from.
  init = (
    jnp.asarray(0),
    jnp.zeros((batch, k, length), jnp.int32),
    alive_logp,
    s.state,
    jnp.zeros((batch, k, length), jnp.int32),
    jnp.full((batch, k), NEG_INF),
  )
  _, _, _, _, finished, finished_scores = jax.lax.while_loop(cond, body, init)
  return finished, finished_scores


def _allowed(log_probs: jax.Array) -> jax.Array:
  """`log_probs` (..., V) with PAD and BOS impossible: no decoder ever generates them."""
  return log_probs.at[..., PAD].set(NEG_INF).at[..., BOS].set(NEG_INF)


def _last(alive: jax.Array, index: jax.Array) -> jax.Array:
  """The tokens the live beams (batch, beam, length) end with after `index` steps: BOS at first."""
  previous = jax.lax.dynamic_index_in_dim(alive, jnp.maximum(index - 1, 0), 2, keepdims=False)
  return jnp.where(index == 0, BOS, previous).reshape(-1)
