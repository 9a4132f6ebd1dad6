"""The seq2seq Transformer and decoding: causality, padding, packing, cache = no cache, beam search = exhaustive
search and = a plain-Python reference, no PAD or BOS generated, the paper's parameter counts, and the paper's
tokenised BLEU beside sacreBLEU; captions' BLEU-1..4 and CIDEr-D equal to the COCO caption toolkit's."""

import itertools
import math
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
import sacremoses
from flax import nnx

from vit_jax_lab import config as config_lib, decode
from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import seq2seq
from vit_jax_lab.tasks.seq2seq import (
  Seq2Seq,
  bleu,
  bleu_stats,
  caption_scores,
  decoder_inputs,
  moses_tokens,
  split_compounds,
)


def tiny(vocab=11, input_vocab=13, **kwargs):
  options = dict(variant='tiny', share_embeddings='none', dropout=0.0) | kwargs
  return seq2seq.Transformer(vocab, input_vocab, None, 16, rngs=nnx.Rngs(0), **options)


SOURCE = jnp.array([[5, 6, 7, 2, 0, 0], [4, 3, 2, 0, 0, 0]])
TARGET_IN = jnp.array([[1, 5, 6, 7, 0], [1, 9, 8, 4, 10]])


@pytest.mark.parametrize('prenorm', [False, True])
def test_changing_a_future_target_token_never_changes_earlier_logits(prenorm):
  model = tiny(prenorm=prenorm)
  logits = model(SOURCE, TARGET_IN)
  for t in range(1, TARGET_IN.shape[1]):
    changed = model(SOURCE, TARGET_IN.at[:, t].set(3))
    np.testing.assert_allclose(changed[:, :t], logits[:, :t], atol=1e-6)
    assert np.abs(changed[:, t:] - logits[:, t:]).max() > 1e-3  # The changed position itself does change.


def test_padding_never_changes_real_tokens():
  model = tiny()
  logits = model(SOURCE, TARGET_IN)
  longer = model(jnp.pad(SOURCE, ((0, 0), (0, 5))), jnp.pad(TARGET_IN, ((0, 0), (0, 3))))
  real = np.asarray(TARGET_IN != 0)
  np.testing.assert_allclose(np.asarray(longer[:, :5])[real], np.asarray(logits)[real], atol=1e-5)
  # A real source token changed where the padding was: the outputs change.
  assert np.abs(model(SOURCE.at[1, 3].set(5), TARGET_IN) - logits)[1].max() > 1e-3


@pytest.mark.slow
def test_packed_sequences_equal_each_alone():
  model = tiny(posemb='learn')
  a_src, a_tgt = jnp.array([5, 6, 2]), jnp.array([1, 7, 8])
  b_src, b_tgt = jnp.array([9, 4, 3, 2]), jnp.array([1, 6])
  alone_a = model(a_src[None], a_tgt[None])[0]
  alone_b = model(b_src[None], b_tgt[None])[0]

  def row(x, y):
    return jnp.concatenate([x, y, jnp.zeros(1, x.dtype)])[None]

  packed = model(
    row(a_src, b_src),
    row(a_tgt, b_tgt),
    inputs_segments=jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]]),
    inputs_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
    targets_segments=jnp.array([[1, 1, 1, 2, 2, 0]]),
    targets_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
  )[0]
  np.testing.assert_allclose(packed[:3], alone_a, atol=1e-5)
  np.testing.assert_allclose(packed[3:5], alone_b, atol=1e-5)


def test_decoder_inputs_shift_within_each_packed_sequence():
  targets = jnp.array([[7, 8, 2, 9, 2, 0]])
  positions = jnp.array([[0, 1, 2, 0, 1, 0]])
  np.testing.assert_array_equal(decoder_inputs(targets, positions), [[1, 7, 8, 1, 9, 0]])
  np.testing.assert_array_equal(decoder_inputs(targets[:, :3]), [[1, 7, 8]])


@pytest.mark.slow
@pytest.mark.parametrize('scan', [False, True])
def test_cached_decoding_equals_uncached(scan):
  model = tiny(scan=scan)
  for length in (1, 7):
    cached = decode.greedy(decode.stepper(model, SOURCE, length), 2, length)
    uncached = decode.greedy(decode.stepper(model, SOURCE, length, cached=False), 2, length)
    np.testing.assert_array_equal(cached[0], uncached[0])
    np.testing.assert_allclose(cached[1], uncached[1], rtol=1e-5)
  beams = [
    decode.beam_search(decode.stepper(model, SOURCE, 7, cached=c, repeat=3), 2, 7, beam_size=3) for c in (True, False)
  ]
  np.testing.assert_array_equal(beams[0][0], beams[1][0])
  np.testing.assert_allclose(beams[0][1], beams[1][1], rtol=1e-5)
  # The cache holds each step's keys: its logits equal the full forward pass on the decoded prefix.
  tokens = cached[0]
  full = jax.nn.log_softmax(
    model(
      SOURCE, jnp.concatenate([jnp.ones((2, 1), jnp.int32), tokens[:, :-1]], 1), targets_segments=jnp.ones_like(tokens)
    )
  )
  scores = jnp.take_along_axis(full, tokens[..., None], -1)[..., 0]
  ended = jnp.cumsum(tokens == decode.EOS, axis=1) - (tokens == decode.EOS) > 0
  np.testing.assert_allclose(jnp.where(ended, 0.0, scores).sum(1), cached[1], rtol=1e-5)


def test_beam_search_with_one_beam_is_never_worse_than_greedy():
  """One live beam follows greedy's path (the best token that is not EOS), and every sequence ending in EOS
  among the two best candidates is kept: greedy's own sequence, or a better one."""
  model = tiny()
  greedy_tokens, greedy_scores = decode.greedy(decode.stepper(model, SOURCE, 9), 2, 9)
  tokens, scores = decode.beam_search(decode.stepper(model, SOURCE, 9), 2, 9, beam_size=1, alpha=0.0)
  assert (scores[:, 0] >= greedy_scores - 1e-5).all()
  for b in range(2):
    if scores[b, 0] < greedy_scores[b] + 1e-5:
      np.testing.assert_array_equal(tokens[b, 0], greedy_tokens[b])


@pytest.mark.parametrize('alpha', [0.0, 0.6])
@pytest.mark.slow
def test_full_width_beam_search_finds_the_best_of_all_sequences(alpha):
  """Words {3, 4} and EOS, length 4: a beam of 27 holds every live prefix (8 at most) and its 2 x 27 candidates
  every extension, so the search is exhaustive. PAD and BOS are in the vocabulary but never generated."""
  model = seq2seq.Transformer(5, 5, None, 8, variant='tiny', share_embeddings='none', dropout=0.0, rngs=nnx.Rngs(1))
  source, length = jnp.array([[3, 4, 2, 0], [4, 4, 3, 2]]), 4
  tokens, scores = decode.beam_search(
    decode.stepper(model, source, length, repeat=27), 2, length, beam_size=27, alpha=alpha
  )
  encoded, segments = model.encode(source)
  sequences = [list(body) + [decode.EOS] for n in range(length) for body in itertools.product([3, 4], repeat=n)]
  sequences += [list(body) for body in itertools.product([3, 4], repeat=length)]
  for b in range(2):
    prefixes = jnp.array([[decode.BOS] + (seq + [0] * length)[: length - 1] for seq in sequences])
    log_probs = jax.nn.log_softmax(
      model.decode(
        prefixes,
        jnp.repeat(encoded[b : b + 1], len(sequences), 0),
        jnp.repeat(segments[b : b + 1], len(sequences), 0),
        segments=jnp.ones_like(prefixes),
      )
    )
    totals = [float(sum(log_probs[i, t, token] for t, token in enumerate(seq))) for i, seq in enumerate(sequences)]
    ranked = sorted(
      zip([t / float(decode.length_penalty(len(s), alpha)) for t, s in zip(totals, sequences)], sequences), reverse=True
    )
    best_score, best = ranked[0]
    assert ranked[0][0] - ranked[1][0] > 1e-4  # A unique best sequence, so the comparison is meaningful.
    assert list(np.asarray(tokens[b, 0])) == best + [0] * (length - len(best))
    np.testing.assert_allclose(float(scores[b, 0]), best_score, rtol=1e-5)
    # The beam lists the finished sequences best first, as the enumeration does.
    np.testing.assert_allclose(np.asarray(scores[b, :5]), [r[0] for r in ranked[:5]], rtol=1e-5)


@pytest.mark.slow
def test_sampling():
  model = tiny()

  def s():
    return decode.stepper(model, SOURCE, 9)

  greedy_tokens = decode.greedy(s(), 2, 9)[0]
  for options in (dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-4)):
    np.testing.assert_array_equal(decode.greedy(s(), 2, 9, rng=jax.random.key(0), **options)[0], greedy_tokens)
  draws = [decode.greedy(s(), 2, 9, rng=jax.random.key(i), temperature=2.0)[0] for i in range(4)]
  np.testing.assert_array_equal(draws[0], decode.greedy(s(), 2, 9, rng=jax.random.key(0), temperature=2.0)[0])
  assert any(not np.array_equal(d, greedy_tokens) for d in draws)  # Sampling is not greedy...
  top2 = np.asarray(jax.lax.top_k(model.decode(jnp.ones((2, 1), jnp.int32), *model.encode(SOURCE))[:, 0], 2)[1])
  for i in range(8):  # ...and top-k keeps only the k most likely first tokens.
    first = np.asarray(decode.greedy(s(), 2, 1, rng=jax.random.key(i), top_k=2, temperature=5.0)[0][:, 0])
    assert all(first[b] in top2[b] for b in range(2))


def test_filter_keeps_the_smallest_set_reaching_top_p():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))

  def kept(p):
    return np.asarray(decode._filter(logits, 1.0, 0, p) > decode.NEG_INF / 2)[0].tolist()

  assert kept(0.5) == [True, False, False, False]
  assert kept(0.6) == [True, True, False, False]
  assert kept(0.95) == [True, True, True, False]
  assert kept(0.96) == [True, True, True, True]


def test_paper_parameter_counts():
  counts = {}
  for size in ('base', 'big'):
    model = nnx.eval_shape(lambda: seq2seq.Transformer(37_000, 37_000, None, 256, variant=size, rngs=nnx.Rngs(0)))
    counts[size] = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  # Tied embeddings (37,000 x d, counted once), biases on every dense layer, post-norm (no final norms).
  assert counts == {'base': 63_082_496, 'big': 214_245_376}
  assert abs(counts['base'] / 65e6 - 1) < 0.05 and abs(counts['big'] / 213e6 - 1) < 0.05


@pytest.mark.slow
def test_image_encoder_and_errors():
  model = seq2seq.Transformer(9, None, (8, 24, 1), 4, variant='tiny', share_embeddings='decoder', rngs=nnx.Rngs(0))
  images = jnp.zeros((2, 8, 24, 1))
  assert model(images, jnp.ones((2, 3), jnp.int32)).shape == (2, 3, 9)
  tokens, _ = decode.greedy(decode.stepper(model, images, 4), 2, 4)
  assert tokens.shape == (2, 4)
  with pytest.raises(ConfigError, match='one vocabulary'):
    seq2seq.Transformer(9, None, (8, 24, 1), 4, variant='tiny', share_embeddings='all', rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='patch_size=5'):
    seq2seq.Transformer(9, None, (8, 24, 1), 4, variant='tiny', patch_size=5, share_embeddings='none', rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='variant'):
    seq2seq.Transformer(9, 9, None, 4, variant='huge', rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='divisible'):
    seq2seq.Transformer(9, 9, None, 4, variant='tiny', num_heads=3, rngs=nnx.Rngs(0))


# --- Beam search against a plain-Python reference ------------------------------------------------------------

VOCAB, LENGTH, BUCKETS = 7, 6, 32  # PAD, BOS, EOS and 4 words; prefixes hashed into 32 buckets.


def table_stepper(table: np.ndarray, repeat: int) -> decode.Stepper:
  """A random model: next-token logits `table[example, hash of the prefix, position]`, the hash kept in the
  state (so the search must reorder the state with its beams)."""
  batch, table = table.shape[0], jnp.asarray(table)

  def step(tokens, index, state):
    prefix = (state['prefix'] * 31 + tokens) % BUCKETS
    return table[state['example'], prefix, index], state | {'prefix': prefix}

  state = {'example': jnp.repeat(jnp.arange(batch), repeat), 'prefix': jnp.zeros(batch * repeat, jnp.int32)}
  return decode.Stepper(step, state)


def reference_beam_search(log_probs, length: int, k: int, alpha: float, form: str) -> list[tuple[float, list[int]]]:
  """tensor2tensor's beam search, for clarity: `log_probs(prefix)` -> the next token's log-probabilities
  (PAD and BOS already excluded). Runs every step (no early stop) and returns the k best (score, tokens)."""
  alive, finished = [(0.0, [])], []
  for index in range(length):
    candidates = [(lp + float(log_probs(seq)[t]), seq + [t]) for lp, seq in alive for t in range(VOCAB)]
    candidates = [c for c in candidates if c[0] > decode.NEG_INF / 2]
    top = sorted(candidates, key=lambda c: -c[0])[: 2 * k]  # Python's sort is stable, as lax.top_k.
    for lp, seq in top:
      if seq[-1] == decode.EOS or index == length - 1:
        finished.append((lp / float(decode.length_penalty(len(seq), alpha, form)), seq))
    alive = [c for c in top if c[1][-1] != decode.EOS][:k]
  return sorted(finished, key=lambda c: -c[0])[:k]


def table_log_probs(table: np.ndarray, example: int):
  allowed = np.asarray(decode._allowed(jax.nn.log_softmax(jnp.asarray(table[example]))))  # Once, not per prefix.

  def fn(seq):
    prefix = 0
    for token in [decode.BOS] + seq:
      prefix = (prefix * 31 + token) % BUCKETS
    return allowed[prefix, len(seq)]

  return fn


@pytest.mark.parametrize('form', ['gnmt', 'power'])
@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_beam_search_equals_the_reference(alpha, form):
  batch = 3
  table = np.random.default_rng(int(10 * alpha) + (form == 'power')).normal(0, 2, (batch, BUCKETS, LENGTH, VOCAB))
  table[..., decode.EOS] += np.linspace(-2, 2, LENGTH)  # Sequences end at every length.
  table = table.astype(np.float32)
  for k in range(1, 9):
    search = jax.jit(
      lambda t, k=k: decode.beam_search(
        table_stepper(t, k), batch, LENGTH, beam_size=k, alpha=alpha, length_penalty=form
      )
    )
    tokens, scores = map(np.asarray, search(table))
    for b in range(batch):
      expected = reference_beam_search(table_log_probs(table, b), LENGTH, k, alpha, form)
      found = scores[b] > decode.NEG_INF / 2
      assert found.sum() == len(expected) and found[: len(expected)].all(), (k, b)
      np.testing.assert_allclose(scores[b, : len(expected)], [e[0] for e in expected], rtol=1e-5, err_msg=f'{k=}')
      for row, (_, seq) in zip(tokens[b], expected):
        assert list(row) == seq + [decode.PAD] * (LENGTH - len(seq)), (k, b)


def test_no_decoder_generates_pad_or_bos():
  """A model that puts nearly all its mass on PAD and BOS: every decoder writes words and EOS only, and PAD
  only after EOS."""
  batch, k = 3, 4
  table = np.random.default_rng(5).normal(0, 1, (batch, BUCKETS, LENGTH, VOCAB)).astype(np.float32)
  table[..., [decode.PAD, decode.BOS]] += 10.0

  def check(tokens):
    for row in np.asarray(tokens).reshape(-1, LENGTH):
      ended = np.cumsum(row == decode.EOS) - (row == decode.EOS) > 0
      assert (row[ended] == decode.PAD).all() and not np.isin(row[~ended], [decode.PAD, decode.BOS]).any(), row

  greedy_tokens, greedy_scores = decode.greedy(table_stepper(table, 1), batch, LENGTH)
  check(greedy_tokens)
  assert (greedy_scores < -5.0).all()  # The scores are the model's log-probabilities, PAD and BOS kept in them.
  for i in range(3):
    check(decode.greedy(table_stepper(table, 1), batch, LENGTH, rng=jax.random.key(i), temperature=2.0)[0])
    check(decode.greedy(table_stepper(table, 1), batch, LENGTH, rng=jax.random.key(i), top_k=3, top_p=0.9)[0])
  tokens, scores = decode.beam_search(table_stepper(table, k), batch, LENGTH, beam_size=k)
  assert (scores > decode.NEG_INF / 2).all()
  check(tokens)


def test_length_penalty_forms():
  np.testing.assert_allclose(decode.length_penalty(7.0, 0.6), (12 / 6) ** 0.6, rtol=1e-6)
  np.testing.assert_allclose(decode.length_penalty(7.0, 0.6, 'power'), 7**0.6, rtol=1e-6)
  assert float(decode.length_penalty(7.0, 0.0, 'power')) == 1.0
  with pytest.raises(ValueError, match='gnmt'):
    decode.length_penalty(7.0, 0.6, 'linear')
  with pytest.raises(ConfigError, match='task.length_penalty'):
    Seq2Seq(length_penalty='linear')


# --- The Transformer paper's BLEU (tensor2tensor's get_ende_bleu.sh) beside sacreBLEU ---------------------------

AT = '##AT##-##AT##'


def test_compound_splitting_matches_perls_left_to_right_non_overlapping_matches():
  # perl's /g resumes after the whole match "a-b": the next "-" has no \S of its own before it, so "b-c" stays;
  # in "a-b-c-d" the search then finds "c-d".
  assert split_compounds('a-b-c') == f'a {AT} b-c'
  assert split_compounds('a-b-c-d') == f'a {AT} b-c {AT} d'
  assert split_compounds('rich-text Ein- und -5 - x') == f'rich {AT} text Ein- und -5 - x'  # Needs \S both sides.


@pytest.mark.parametrize(
  'text, tokens',
  [
    # No -a: tokenizer.perl leaves hyphens inside words; compound splitting then separates every part, since
    # "Main" is long enough to end one match and start the next.
    (
      'Die E-Mail kam aus dem Rhein-Main-Gebiet.',
      ['Die', 'E', AT, 'Mail', 'kam', 'aus', 'dem', 'Rhein', AT, 'Main', AT, 'Gebiet', '.'],
    ),
    # U+201C becomes '"' (replace-unicode-punctuation), escaped to &quot;; U+201E and the en dash are not
    # replaced, only padded as non-alphanumerics. "Mio" is a German nonbreaking prefix: "Mio." stays a word.
    # Commas between digits and periods inside a word stay; the sentence-final period is split off.
    (
      '\u201eDas kostet 3.5 Mio. Euro\u201c, sagte er \u2013 rund 1,000 Dollar.',
      ['\u201e', 'Das', 'kostet', '3.5', 'Mio.', 'Euro', '&quot;', ',', 'sagte', 'er', '\u2013', 'rund', '1,000']
      + ['Dollar', '.'],
    ),
    # Outside English, French and Italian every apostrophe is its own token; quotes are escaped.
    (
      'Peter\'s Ein- und Ausgang (a-b-c) ist "rich-text"!',
      ['Peter', '&apos;', 's', 'Ein-', 'und', 'Ausgang', '(', 'a', AT, 'b-c', ')', 'ist', '&quot;', 'rich', AT]
      + ['text', '&quot;', '!'],
    ),
    # Full-width digits and percent, and the ellipsis character, are replaced first.
    ('Es waren \uff11\uff12\uff05 mehr\u2026', ['Es', 'waren', '12', '%', 'mehr', '...']),
  ],
)
def test_moses_tokens_of_german(text, tokens):
  assert moses_tokens('de')(text) == tokens


def test_moses_tokens_follow_the_language():
  assert moses_tokens('en')('Das kostet 3.5 Mio. Euro.') == ['Das', 'kostet', '3.5', 'Mio', '.', 'Euro', '.']
  # sacremoses tokenises an unknown code as English without a word: hence the task's own check.
  assert sacremoses.MosesTokenizer('xx').NONBREAKING_PREFIXES == sacremoses.MosesTokenizer('en').NONBREAKING_PREFIXES


def test_tokenized_bleu_by_hand():
  def score(hypotheses, references, smoothing):
    return bleu(bleu_stats(hypotheses, references, moses_tokens('de')), smoothing)

  perfect = ['Die E-Mail kam aus dem Rhein-Main-Gebiet.', 'Peter\'s "rich-text"!']
  assert score(perfect, perfect, 'none') == pytest.approx(100.0)
  # 5 tokens each ("Haus" "."): 1-grams 4/5, 2-grams 2/4 ("Das ist", "Haus ."), 3-grams 0/3, 4-grams 0/2.
  hypothesis, reference = ['Das ist ein Haus.'], ['Das ist kein Haus.']
  assert score(hypothesis, reference, 'none') == 0.0  # multi-bleu.perl: a zero precision is BLEU 0.
  # sacreBLEU's exp smoothing: the k-th zero precision becomes 1 / (2^k * n-grams).
  assert score(hypothesis, reference, 'exp') == pytest.approx(100 * (4 / 5 * 2 / 4 * 1 / 6 * 1 / 8) ** 0.25)
  # Every n-gram matches, but 4 hypothesis tokens against 5 reference tokens: brevity penalty exp(1 - 5/4).
  assert score(['Das ist ein Haus'], ['Das ist ein Haus.'], 'none') == pytest.approx(100 * math.exp(1 - 5 / 4))
  # Compound splitting makes "E-Mail" three tokens: 7 each, 1-grams 6/7, 2-grams 4/6 ("Die E", "E ##AT##",
  # "##AT## Mail", "da ."), 3-grams 2/5, 4-grams 1/4. sacreBLEU's 13a keeps "E-Mail" one token: 4/5, 2/4, 0/3, 0/2.
  hypothesis, reference = ['Die E-Mail ist da.'], ['Die E-Mail war da.']
  assert score(hypothesis, reference, 'none') == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25)
  assert bleu(bleu_stats(hypothesis, reference)) == pytest.approx(100 * (4 / 5 * 2 / 4 * 1 / 6 * 1 / 8) ** 0.25)
  with pytest.raises(ValueError, match='smoothing'):
    bleu(bleu_stats(hypothesis, reference), 'floor')


def test_tokenized_bleu_equals_sacrebleu_on_pretokenised_text():
  """sacreBLEU with tokenize='none' is an independent multi-bleu.perl: BLEU of the whitespace tokens as given."""
  hypotheses = [
    'Die E-Mail kam gestern aus dem Rhein-Main-Gebiet.',
    '\u201eDas kostet 3.5 Mio. Euro\u201c, sagte er.',
    "Peter's Haus ist gro\u00df und alt.",
    'Die Katze sa\u00df auf der Matte.',
    '',
  ]
  references = [
    'Die E-Mail kam heute aus dem Rhein-Main-Gebiet.',
    '\u201eDas kostet rund 3.5 Mio. Euro\u201c, sagte sie.',
    'Peters Haus ist alt und gro\u00df.',
    'Die Katze sitzt auf der Matte.',
    'Leere Hypothese.',
  ]
  tokenize = moses_tokens('de')
  stats = bleu_stats(hypotheses[:2], references[:2], tokenize) + bleu_stats(hypotheses[2:], references[2:], tokenize)
  hypotheses, references = ([' '.join(tokenize(t)) for t in texts] for texts in (hypotheses, references))
  for smoothing in ('none', 'exp'):
    expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize='none', smooth_method=smoothing, force=True)
    assert bleu(stats, smoothing) == pytest.approx(expected.score, abs=1e-9)
    assert 0 < expected.score < 100


def test_summarize_reports_tokenized_bleu_only_when_asked():
  words = ['<pad>', '<bos>', '<eos>', 'Die', 'E-Mail', 'ist', 'war', 'da.']
  vocab = types.SimpleNamespace(decode=lambda ids: ' '.join(words[i] for i in ids if i > 2))
  info = types.SimpleNamespace(target_vocab=vocab)
  host = {  # The third example is padding (mask 0): left out.
    'decoded': np.array([[3, 4, 5, 7, 2], [3, 4, 6, 7, 2], [3, 3, 2, 0, 0]]),
    'targets': np.array([[3, 4, 6, 7, 2], [3, 4, 6, 7, 2], [5, 5, 5, 2, 0]]),
    'mask': np.array([1, 1, 0]),
  }
  hypotheses, references = ['Die E-Mail ist da.', 'Die E-Mail war da.'], ['Die E-Mail war da.'] * 2
  sums = {'loss': 2.0, 'token_accuracy': 3.0, 'tokens': 4.0, 'exact_match': 1.0, 'count': 2.0}
  plain = Seq2Seq().summarize(sums | Seq2Seq().host_sums(host, info))
  assert set(plain) == {'loss', 'token_accuracy', 'exact_match', 'bleu', 'examples'}
  task = Seq2Seq(tokenized_bleu='de')
  both = task.summarize(sums | task.host_sums(host, info))
  assert set(both) == set(plain) | {'bleu_tokenized'}
  assert both['bleu'] == plain['bleu'] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
  tokenize = moses_tokens('de')
  expected = sacrebleu.corpus_bleu(
    [' '.join(tokenize(t)) for t in hypotheses],
    [[' '.join(tokenize(t)) for t in references]],
    tokenize='none',
    smooth_method='none',
    force=True,
  )
  assert both['bleu_tokenized'] == pytest.approx(expected.score) and both['bleu_tokenized'] > both['bleu']
  config = config_lib.load(os.path.join(os.path.dirname(__file__), '..', 'configs/seq2seq/wmt14_ende.py'))
  assert config.task.tokenized_bleu == 'de'


@pytest.mark.parametrize('value', ['xx', 'german', '', 1, True, ['de']])
def test_tokenized_bleu_must_be_a_moses_language_code(value):
  with pytest.raises(ConfigError, match='task.tokenized_bleu'):
    Seq2Seq(tokenized_bleu=value)


CAPTIONS = [  # (candidate, references): digit captions of 1 to 3 words, and longer sentences with several references.
  ('seven one four', ['seven one four']),
  ('seven one', ['seven one four']),
  ('two', ['two']),
  ('three three', ['three eight']),
  ('nine', ['five nine']),
  ('a dog runs on the grass', ['a dog is running on the grass', 'the brown dog runs across a lawn']),
  ('a man rides a red bike down the street', ['a man riding a bicycle', 'a person on a red bike in a street']),
  ('two cats sleep', ['two cats are sleeping on a sofa', 'cats asleep', 'a pair of cats sleeping together']),
]


@pytest.mark.parametrize('cut', [5, len(CAPTIONS)])
def test_caption_scores_equal_pycocoevalcap(cut, capsys):
  from pycocoevalcap.bleu.bleu import Bleu
  from pycocoevalcap.cider.cider import Cider

  captions = CAPTIONS[:cut]  # The first 5: the digit captions alone, without a single 4-gram.
  res = {i: [c] for i, (c, _) in enumerate(captions)}
  gts = {i: refs for i, (_, refs) in enumerate(captions)}
  expected_bleu, _ = Bleu(4).compute_score(gts, res)
  expected_cider, _ = Cider().compute_score(gts, res)
  capsys.readouterr()  # Bleu prints its statistics.
  got = caption_scores([c for c, _ in captions], [refs for _, refs in captions])
  assert list(got) == ['bleu_1', 'bleu_2', 'bleu_3', 'bleu_4', 'cider_d']
  np.testing.assert_allclose([got[f'bleu_{n}'] for n in range(1, 5)], expected_bleu, rtol=1e-12, atol=1e-15)
  assert got['cider_d'] == pytest.approx(expected_cider, rel=1e-12)
  assert 0 < got['bleu_4'] < got['bleu_1'] < 1 and got['cider_d'] > 0


def test_captions_report_coco_scores_and_perfect_ones_score_one():
  words = ['<pad>', '<bos>', '<eos>', 'one', 'two', 'three']
  vocab = types.SimpleNamespace(decode=lambda ids: ' '.join(words[i] for i in ids if i > 2))
  info = types.SimpleNamespace(target_vocab=vocab, input_vocab=None, input_shape=(8, 24, 1))
  batches = [  # Two batches of the evaluation loop; the padding example (mask 0) is left out.
    {
      'decoded': np.array([[3, 4, 2], [5, 2, 0]]),
      'targets': np.array([[3, 4, 2], [5, 2, 0]]),
      'mask': np.array([1, 1]),
    },
    {
      'decoded': np.array([[4, 2, 0], [3, 2, 0]]),
      'targets': np.array([[4, 2, 0], [5, 2, 0]]),
      'mask': np.array([1, 0]),
    },
  ]
  task = Seq2Seq()
  sums = [task.host_sums(b, info) for b in batches]
  totals = jax.tree.map(np.add, *sums)  # As train.evaluate adds the batches' sums.
  metrics = task.summarize(
    totals | {'loss': 1.0, 'token_accuracy': 1.0, 'tokens': 1.0, 'exact_match': 3.0, 'count': 3.0}
  )
  assert set(metrics) == {
    'loss',
    'token_accuracy',
    'exact_match',
    'bleu_1',
    'bleu_2',
    'bleu_3',
    'bleu_4',
    'cider_d',
    'examples',
  }
  assert [p for p in totals['captions'][0]] == [('one two', 'one two'), ('three', 'three'), ('two', 'two')]
  assert metrics['bleu_1'] == pytest.approx(1.0) and metrics['bleu_2'] == pytest.approx(1.0)  # 1 bigram, matched.
  # No 3- or 4-grams: their precisions are (0 + 1e-15) / (0 + 1e-9) each, as the toolkit has it.
  assert metrics['bleu_4'] == pytest.approx(1e-3, rel=1e-6)
  assert metrics['cider_d'] > 0
