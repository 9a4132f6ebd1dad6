"""transformers' MarianMTModel (opus-mt) folders into the seq2seq Transformer: a tiny random-weight model and its
tokenizer made by the library (tests/data/pretrained/make_marian_reference.py, transformers 5.24; torch is never
imported here) give the library's teacher-forced logits and greedy translation through our model, decoder and
tokenizer; every refusal is one line."""

import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx

import test_seq2seq_train
from conftest import load_config
from vit_jax_lab import data as data_lib, decode, hub, models, tokens, train
from vit_jax_lab.data.info import MarianVocab, TextInfo, WordVocab, is_marian_folder
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import layers, marian_layout, seq2seq
from vit_jax_lab.tools import export

seq_data_dir = test_seq2seq_train.seq_data_dir  # The fixture: TinyTranslate in the session's data_dir.
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'pretrained', 'marian')


@pytest.fixture(scope='module')
def reference():
  with open(os.path.join(FOLDER, 'reference.json')) as f:
    return dict(np.load(os.path.join(FOLDER, 'reference.npz'))) | json.load(f)


def folder_config(path=FOLDER, **overrides):
  """config.model of a Transformer with the folder's shape (as train does: pretrained_config), and its notes."""
  model_config = models.config('transformer', variant=None, dropout=0.0, **overrides)
  notes = seq2seq.Transformer.pretrained_config(model_config, hub.read(path))
  return model_config, notes


def build(model_config, vocab_size, **changes):
  """A Transformer of `model_config` with `changes` to its keys, for data of one vocabulary of `vocab_size`."""
  kwargs = {k: v for k, v in model_config.items() if k != 'name'} | changes
  return seq2seq.Transformer(vocab_size, vocab_size, None, 32, rngs=nnx.Rngs(0), **kwargs)


def loaded_model(path=FOLDER, **overrides):
  """Our Transformer with the folder's weights, and the load notes."""
  model_config, _ = folder_config(path, **overrides)
  weights = hub.read(path)
  model = build(model_config, len(marian_layout.our_rows(weights)))
  params, notes = model.load_pretrained(weights, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))
  state = nnx.state(model, nnx.Param)
  state.replace_by_pure_dict(params)
  nnx.update(model, state)
  return model, notes


def ours_of(weights):
  """Marian id -> ours (its pad: our PAD), the inverse of tokens.foreign_ids."""
  rows = marian_layout.our_rows(weights)
  table = np.zeros(len(rows) - 1, np.int32)
  for ours, theirs in reversed(list(enumerate(rows))):
    table[theirs] = ours
  return table


def test_foreign_ids_rule():
  # Marian's layout: eos 0, unk 1, pieces 2..4, pad 5 -> PAD, BOS: pad; EOS: eos; UNK: unk; then the pieces.
  assert tokens.foreign_ids(6, pad=5, eos=0, unk=1) == [5, 5, 0, 1, 2, 3, 4]
  assert tokens.foreign_ids(5, pad=0, eos=2, unk=4) == [0, 0, 2, 4, 1, 3]


def test_folder_config_takes_the_folders_shape():
  model_config, notes = folder_config()
  assert (model_config.width, model_config.encoder_depth, model_config.decoder_depth) == (16, 2, 2)
  assert (model_config.mlp_dim, model_config.num_heads) == (32, 2)
  assert model_config.activation == 'silu'  # config.json's 'swish'.
  assert model_config.logits_bias is True and model_config.scale_embedding is True
  assert model_config.layernorm_epsilon == 1e-5 and model_config.prenorm is False
  assert 'model.activation=' + repr('silu') + ' from the folder' in notes


def test_teacher_forced_logits_match_the_library(reference):
  model, notes = loaded_model()
  assert any('53 -> 54' in n for n in notes)
  table = ours_of(hub.read(FOLDER))
  inputs = table[reference['input_ids']] * reference['attention_mask']
  mask = reference['labels_mask']
  decoder_inputs = table[reference['decoder_input_ids']]
  decoder_inputs[:, 0] = tokens.BOS  # Marian starts from its pad; we from BOS, which means the same row.
  logits = np.asarray(model(inputs, decoder_inputs * mask))
  ours = logits[..., table]  # In Marian's columns.
  difference = np.abs(ours - reference['logits'])[mask].max()
  print(f'teacher-forced logits: max |ours - transformers| = {difference:.2e}')
  assert difference < 1e-4
  # PAD and BOS are both Marian's pad: the same column.
  np.testing.assert_array_equal(logits[..., tokens.PAD], logits[..., tokens.BOS])


def test_scanned_layers_load_alike(reference):
  model, _ = loaded_model()
  scanned, _ = loaded_model(scan=True)
  inputs = ours_of(hub.read(FOLDER))[reference['input_ids']] * reference['attention_mask']
  targets = np.full((2, 3), tokens.BOS, np.int32)
  np.testing.assert_allclose(np.asarray(scanned(inputs, targets)), np.asarray(model(inputs, targets)), atol=1e-5)


@pytest.mark.parametrize('cached', [True, False])
def test_greedy_translation_matches_the_library(reference, cached):
  model, _ = loaded_model()
  table = ours_of(hub.read(FOLDER))
  inputs = table[reference['input_ids']] * reference['attention_mask']
  expected = table[reference['generated'][:, 1:]]  # After the decoder start; Marian's pad after EOS is our PAD.
  length = expected.shape[1]
  got, _ = decode.greedy(decode.stepper(model, inputs, length, cached=cached), len(inputs), length)
  np.testing.assert_array_equal(np.asarray(got), expected)
  assert (expected == tokens.EOS).any(axis=1).tolist() == [False, True]  # One ends early, the other at the limit.


def test_tokenizer_reads_the_folder(reference):
  source, target = MarianVocab(FOLDER, 'source'), MarianVocab(FOLDER, 'target')
  assert is_marian_folder(FOLDER) and source.size == target.size == 54
  for text, pieces in zip(reference['sources'], reference['source_pieces']):
    assert source.tokenize(text) == pieces  # The library's own split.
  table = ours_of(hub.read(FOLDER))
  for text, ids, mask in zip(reference['sources'], reference['input_ids'], reference['attention_mask']):
    assert source.encode(text) + [tokens.EOS] == table[ids[mask > 0]].tolist()
  for text, ids, mask in zip(reference['targets'], reference['decoder_input_ids'], reference['labels_mask']):
    assert target.encode(text) == table[ids[1 : mask.sum()]].tolist()  # Shifted right: the first is the start.
    assert target.decode(np.asarray(target.encode(text) + [tokens.EOS, 7])) == text  # Round trip, cut at EOS.
  for ids, text in zip(reference['generated'], reference['translations']):
    assert target.decode(table[ids]) == text  # The library's batch_decode(skip_special_tokens=True).
  assert source.encode('>>de<< the') == [tokens.UNK, *source.encode('the')]  # A language code is one piece.
  assert source.pieces[tokens.EOS] == '</s>' and source.pieces[tokens.PAD] == source.pieces[tokens.BOS] == '<pad>'


def test_options_change_what_the_model_computes(reference):
  model, _ = loaded_model()
  inputs = ours_of(hub.read(FOLDER))[reference['input_ids']] * reference['attention_mask']
  targets = np.full((2, 2), tokens.BOS, np.int32)
  base = np.asarray(model(inputs, targets))
  for key, value in (('scale_embedding', False), ('activation', 'gelu')):
    other = build(folder_config()[0], 54, **{key: value})
    nnx.update(other, nnx.state(model, nnx.Param))
    assert np.abs(np.asarray(other(inputs, targets)) - base).max() > 1e-3, key
  without_bias = build(folder_config()[0], 54, logits_bias=False)
  state = nnx.state(model, nnx.Param).to_pure_dict()
  state.pop('logits_bias')
  params = nnx.state(without_bias, nnx.Param)
  params.replace_by_pure_dict(state)
  nnx.update(without_bias, params)
  np.testing.assert_allclose(
    base - np.asarray(without_bias(inputs, targets)), np.broadcast_to(model.logits_bias[...], base.shape), atol=1e-5
  )


def test_new_keys_are_validated():
  for key, value in (('scale_embedding', 'yes'), ('logits_bias', 1.5), ('activation', 'swish')):
    with pytest.raises(ConfigError, match=f'model.{key}='):
      seq2seq.Transformer(10, 10, None, 8, variant='tiny', rngs=nnx.Rngs(0), **{key: value})
  default = seq2seq.Transformer(10, 10, None, 8, variant='tiny', rngs=nnx.Rngs(0))
  assert 'logits_bias' not in nnx.state(default, nnx.Param).to_pure_dict()  # Today's model unchanged.


def one_line(excinfo):
  message = str(excinfo.value)
  assert '\n' not in message
  return message


def test_a_config_that_disagrees_is_one_line():
  with pytest.raises(ConfigError) as e:
    folder_config(width=32)
  assert 'model.width=16' in one_line(e) and 'model.width=32' in one_line(e)
  with pytest.raises(ConfigError) as e:
    seq2seq.Transformer.pretrained_config(models.config('transformer'), hub.read(FOLDER))
  assert "model.variant='base'" in one_line(e) and 'variant=None' in one_line(e)
  with pytest.raises(ConfigError) as e:
    folder_config(activation='gelu')
  assert "model.activation='silu'" in one_line(e) and "model.activation='gelu'" in one_line(e)
  model_config, _ = folder_config()
  wrong = build(model_config, 54, prenorm=True)
  with pytest.raises(ConfigError) as e:
    wrong.load_pretrained(hub.read(FOLDER), jax.device_get(nnx.state(wrong, nnx.Param).to_pure_dict()))
  assert 'model.prenorm=False' in one_line(e)
  other_vocab = build(model_config, 60)  # Data tokenised with another vocabulary.
  with pytest.raises(ConfigError) as e:
    other_vocab.load_pretrained(hub.read(FOLDER), jax.device_get(nnx.state(other_vocab, nnx.Param).to_pure_dict()))
  assert '54 ids' in one_line(e) and 'of 60' in one_line(e) and f'data.vocab={FOLDER}' in one_line(e)


def test_a_max_length_beyond_the_positions_is_capped_with_a_note(reference, capsys, tmp_path):
  """A small model's max_position_embeddings below transformers' default max_length=512: translated as transformers
  does (it stops at the end token), cut at the positions, with a note; before, a refusal. (The tiny random model
  runs to the cut where it does not end, and the folder's own max_length=9 translations are its beginnings.)"""
  from vit_jax_lab.tools import predict

  path = copy_folder(tmp_path, max_position_embeddings=64, max_length=512)
  if os.path.exists(os.path.join(path, 'generation_config.json')):
    os.remove(os.path.join(path, 'generation_config.json'))
  assert predict.main(['--pretrained', path, *reference['sources']]) == 0
  out = capsys.readouterr()
  pairs = list(zip(out.out.split('\n'), reference['translations']))
  assert all(o.startswith(t) for o, t in pairs) and any(len(o) > len(t) for o, t in pairs), pairs
  assert 'translations cut at max_position_embeddings=64 tokens (max_length=512)' in out.err


def copy_folder(tmp_path, **config_changes):
  path = tmp_path / 'marian'
  shutil.copytree(FOLDER, path)
  with open(path / 'config.json') as f:
    config = json.load(f)
  with open(path / 'config.json', 'w') as f:
    json.dump(config | config_changes, f)
  return str(path)


def test_wrong_folders_are_one_line(tmp_path):
  with pytest.raises(ConfigError) as e:
    hub.read(str(tmp_path))
  assert 'no config.json' in one_line(e)
  with pytest.raises(ConfigError) as e:
    folder_config(copy_folder(tmp_path, model_type='bart'))
  assert "model_type='bart'" in one_line(e)
  shutil.rmtree(tmp_path / 'marian')
  with pytest.raises(ConfigError) as e:
    folder_config(copy_folder(tmp_path, share_encoder_decoder_embeddings=False))
  assert 'separate' in one_line(e)
  shutil.rmtree(tmp_path / 'marian')
  path = copy_folder(tmp_path)
  os.remove(os.path.join(path, 'vocab.json'))
  with pytest.raises(ConfigError) as e:
    loaded_model(path)
  assert 'vocab.json' in one_line(e)
  with pytest.raises(ConfigError) as e:
    MarianVocab(path)
  assert 'lacks vocab.json' in one_line(e)


def test_missing_and_misshaped_tensors_are_named(tmp_path):
  path = copy_folder(tmp_path)
  file = os.path.join(path, 'model.safetensors')
  tensors = safetensors.numpy.load_file(file)
  del tensors['model.decoder.layers.1.fc2.bias']
  tensors['model.encoder.layers.0.fc1.weight'] = tensors['model.encoder.layers.0.fc1.weight'][:8]
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(ConfigError) as e:
    loaded_model(path)
  message = one_line(e)
  assert 'model.decoder.layers.1.fc2.bias (missing; want (16,))' in message
  assert 'model.encoder.layers.0.fc1.weight (8, 16) (want (32, 16))' in message


def test_the_vit_does_not_take_a_marian_folder():
  with pytest.raises(ConfigError) as e:
    hub.check(FOLDER, ('timm_vit', 'transformers_vit'))
  assert 'MarianMTModel' in one_line(e)


@pytest.mark.slow
def test_init_from_a_marian_folder_in_a_run(tmp_path, capsys, reference):
  """train.setup / init_state as `python -m main --config.init_from=DIR --config.data.vocab=DIR` runs them: the
  folder's shape into config.model (noted), the data tokenised by the folder's vocabulary, the library's logits."""
  config = load_config('configs/seq2seq/scan.py:simple,smoke', str(tmp_path), init_from=FOLDER, data__vocab=FOLDER)
  config.model = models.config('transformer', variant=None, dropout=0.0)
  data_lib.check_text(config.data)  # data.vocab may name the folder.
  with pytest.raises(ConfigError, match='or a Marian folder'):
    data_lib.check_text(load_config('configs/seq2seq/scan.py:simple', str(tmp_path), data__vocab=str(tmp_path)).data)
  source, target = MarianVocab(FOLDER, 'source'), MarianVocab(FOLDER, 'target')
  info = TextInfo('commands', 'actions', source, target, (20,), 16, 8, 8)
  s = train.setup(config, data=(None, info))
  model = nnx.merge(s.graphdef, train.init_state(s).params)
  out = capsys.readouterr().out
  assert "model.activation='silu' from the folder" in out and "Marian's ids" in out
  table = ours_of(hub.read(FOLDER))
  inputs = table[reference['input_ids']] * reference['attention_mask']
  decoder_inputs = np.full((2, 1), tokens.BOS, np.int32)
  theirs = reference['logits'][:, :1]
  assert np.abs(np.asarray(model(inputs, decoder_inputs))[..., table] - theirs).max() < 1e-4
  words = WordVocab(['a', 'b'])  # Data of another vocabulary: refused before anything is recorded.
  config.model = models.config('transformer', variant=None)
  s = train.setup(config, data=(None, TextInfo('commands', 'actions', words, words, (20,), 16, 8, 8)))
  with pytest.raises(ConfigError) as e:
    train.init_state(s)
  assert f'--config.data.vocab={FOLDER}' in one_line(e)


def test_the_data_pipeline_tokenises_with_the_folder(reference):
  """text.encoder, which tf.data maps over batches of examples, gives the folder's ids for a MarianVocab."""
  import tensorflow as tf

  from vit_jax_lab.data import text

  source = MarianVocab(FOLDER, 'source')
  encoded = text.encoder(source)(tf.constant(reference['sources'])).to_list()
  assert encoded == [source.encode(sentence) for sentence in reference['sources']]


def test_predict_translates_with_the_folder(reference, capsys, tmp_path):
  """`predict --pretrained DIR TEXT...`: the library's greedy translations, in order, batches padded."""
  from vit_jax_lab.tools import predict

  sources = [*reference['sources'], reference['sources'][0]]
  assert predict.main(['--pretrained', FOLDER, *sources, '--batch_size', '2']) == 0
  out = capsys.readouterr()
  expected = [*reference['translations'], reference['translations'][0]]
  assert out.out.split('\n')[: len(sources)] == expected
  assert "Marian's ids" in out.err
  lines = tmp_path / 'lines.txt'
  lines.write_text('\n'.join(reference['sources']) + '\n')
  out_file = tmp_path / 'out.jsonl'
  assert predict.main(['--pretrained', FOLDER, '--lines', str(lines), '--out', str(out_file)]) == 0
  rows = [json.loads(line) for line in out_file.read_text().splitlines()]
  assert rows == [{'input': s, 'output': t} for s, t in zip(reference['sources'], reference['translations'])]


def test_other_weights_are_one_line():
  model_config, _ = folder_config()
  model = build(model_config, 54)
  with pytest.raises(ConfigError) as e:
    model.load_pretrained({'embedding': np.zeros(3)}, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))
  assert 'reads Marian folders only' in one_line(e)


# --- Export: our Transformer as a Marian folder (tools.export --format safetensors --layout transformers) ----------

EXPORT = os.path.join(os.path.dirname(FOLDER), 'export')
EXPORT_SPM = os.path.join(EXPORT, 'marian_spm.model')  # Trained with our ids (PAD 0, BOS 1, EOS 2, UNK 3).
EXPORT_TEXT = [
  'the cat sits on the mat',
  'a dog runs in the park',
  'the bird sings a song',
  'my friend reads a book',
  'die katze sitzt auf der matte',
  'ein hund rennt im park',
  'der vogel singt ein lied',
  'mein freund liest ein buch',
]
EXPORT_DATA = dict(vocab=EXPORT_SPM, max_input_length=16, max_target_length=8)


def export_spm(path):
  """A tiny SentencePiece model as data.vocab='sentencepiece' trains one (text.train_sentencepiece: our special ids),
  without a normalisation table, so that it is a few hundred bytes."""
  import sentencepiece as spm

  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(EXPORT_TEXT),
    model_prefix=path.removesuffix('.model'),
    vocab_size=40,
    model_type='unigram',
    character_coverage=1.0,
    normalization_rule_name='identity',
    pad_id=tokens.PAD,
    bos_id=tokens.BOS,
    eos_id=tokens.EOS,
    unk_id=tokens.UNK,
    minloglevel=2,
  )
  os.remove(path.removesuffix('.model') + '.vocab')


def random_transformer(**changes):
  """config.model and random parameters (numpy's, seeded: the same on every machine) of a tiny Transformer over
  EXPORT_SPM's 40 ids: every tensor random, so a swapped row, column, norm or bias shows; the EOS logit raised, so
  that one greedy translation ends early."""
  model_config = models.config(
    'transformer',
    variant=None,
    width=16,
    encoder_depth=2,
    decoder_depth=2,
    mlp_dim=32,
    num_heads=2,
    logits_bias=True,
    dropout=0.0,
    **changes,
  )
  model = build(model_config, 40)
  rng = np.random.RandomState(0)
  params = jax.tree.map(
    lambda a: (rng.standard_normal(a.shape) * (0.1 if a.ndim > 1 else 0.2)).astype(np.float32),
    jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()),
  )
  params['target_embedding']['embedding'] *= 3
  for block in [*params['encoder']['blocks'].values(), *params['decoder']['blocks'].values()]:
    for name in ('norm1', 'norm2', 'cross_norm'):
      if name in block:
        block[name]['scale'] += 1
  params['logits_bias'][tokens.EOS] += 2
  state = nnx.state(model, nnx.Param)
  state.replace_by_pure_dict(params)
  nnx.update(model, state)
  return model_config, params, model


def write_marian(model_config, params, data_config, out, vocab_dir):
  """tools.export's writer of a translation run (config.model, config.data) whose workdir is `vocab_dir`."""
  run = ml_collections.ConfigDict(dict(model=model_config, data=data_config))
  return export.WRITERS['transformers']['transformer'](run, params, out, vocab_dir)


def write_export(out, **changes):
  model_config, params, model = random_transformer(**changes)
  config = write_marian(model_config, params, ml_collections.ConfigDict(EXPORT_DATA), out, EXPORT)
  return config, params, model


@pytest.fixture(scope='module')
def exported():
  """The library's outputs on the exported folder (make_marian_export_reference.py in a torch environment)."""
  with open(os.path.join(EXPORT, 'marian_export.json')) as f:
    reference = json.load(f)
  for name in ('input_ids', 'attention_mask', 'decoder_input_ids', 'labels_mask', 'logits', 'generated'):
    reference[name] = np.load(os.path.join(EXPORT, f'marian_{name}.npy'))
  return reference


def test_export_round_trip_is_exact(tmp_path):
  """ours -> a Marian folder -> ours (init_from=the folder): every parameter bit for bit; PAD's row, which Marian has
  no room for (its pad is our BOS, the decoder start), comes back as BOS's."""
  folder = str(tmp_path / 'marian')
  config, params, _ = write_export(folder)
  assert config['vocab_size'] == 39 and config['pad_token_id'] == config['decoder_start_token_id'] == 38
  assert config['activation_function'] == 'relu' and config['eos_token_id'] == 0
  assert sorted(os.listdir(folder)) == sorted(
    ['config.json', 'generation_config.json', 'model.safetensors', 'source.spm', 'target.spm', 'vocab.json']
    + ['tokenizer_config.json']
  )
  theirs = safetensors.numpy.load_file(os.path.join(FOLDER, 'model.safetensors'))
  ours = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  assert sorted(ours) == sorted(theirs)  # The names transformers saves.
  model_config, notes = folder_config(folder)
  assert model_config.activation == 'relu' and model_config.logits_bias and model_config.width == 16
  model, _ = loaded_model(folder)
  loaded = nnx.state(model, nnx.Param).to_pure_dict()
  for key in ('embedding',):
    expected = params['target_embedding'][key].copy()
    expected[tokens.PAD] = expected[tokens.BOS]
    np.testing.assert_array_equal(loaded['target_embedding'][key], expected)
  bias = params['logits_bias'].copy()
  bias[tokens.PAD] = bias[tokens.BOS]
  np.testing.assert_array_equal(loaded['logits_bias'], bias)
  rest = {k: v for k, v in params.items() if k not in ('target_embedding', 'logits_bias')}
  jax.tree.map(np.testing.assert_array_equal, {k: loaded[k] for k in rest}, rest)
  with open(os.path.join(folder, 'vocab.json')) as f:
    vocab = json.load(f)
  assert (vocab['</s>'], vocab['<unk>'], vocab['<pad>']) == (0, 1, 38) and len(vocab) == 39 and '<s>' not in vocab
  from vit_jax_lab.data.text import SentencePieceVocab

  for side in ('source', 'target'):  # The folder's tokenizer in our ids is the run's.
    for text in [*EXPORT_TEXT, 'an unseen word: x!']:
      assert MarianVocab(folder, side).encode(text) == SentencePieceVocab(EXPORT_SPM).encode(text)


def test_export_scanned_run_writes_the_same_folder(tmp_path):
  _, params, _ = write_export(str(tmp_path / 'plain'))
  model_config = random_transformer(scan=True)[0]
  scanned = layers.scanned_like(params, nnx.state(build(model_config, 40), nnx.Param).to_pure_dict())
  write_marian(model_config, scanned, ml_collections.ConfigDict(EXPORT_DATA), str(tmp_path / 'scan'), EXPORT)
  a = safetensors.numpy.load_file(str(tmp_path / 'plain' / 'model.safetensors'))
  b = safetensors.numpy.load_file(str(tmp_path / 'scan' / 'model.safetensors'))
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_export_gives_the_librarys_logits_and_translation(exported, tmp_path):
  """transformers 5.24's MarianMTModel and MarianTokenizer on the exported folder (export/marian_*.npy) give our
  teacher-forced logits and our greedy translation, token for token; its tokenizer splits as ours."""
  from vit_jax_lab.data.text import SentencePieceVocab

  folder = str(tmp_path / 'marian')
  _, _, model = write_export(folder)
  table = ours_of(hub.read(folder))  # Marian id -> ours.
  inputs = table[exported['input_ids']] * exported['attention_mask']
  mask = exported['labels_mask']
  decoder_inputs = table[exported['decoder_input_ids']]
  decoder_inputs[:, 0] = tokens.BOS
  logits = np.asarray(model(inputs, decoder_inputs * mask))
  rows = marian_layout.our_rows(hub.read(folder))
  bos_columns = [i for i in range(len(rows)) if i != tokens.PAD]  # Marian's columns: ours without PAD.
  ours = logits[..., bos_columns][..., np.argsort(rows[bos_columns])]
  difference = np.abs(ours - exported['logits'])[mask].max()
  print(f'exported teacher-forced logits: max |ours - transformers| = {difference:.2e}')
  assert difference < 1e-4  # Ours with LayerNorm epsilon 1e-6, Marian's 1e-5 (noted by the export).
  read_back, _ = loaded_model(folder)  # The folder's model in ours: epsilon 1e-5 as Marian's.
  same = np.asarray(read_back(inputs, decoder_inputs * mask))[..., table]
  difference = np.abs(same - exported['logits'])[mask].max()
  print(f'exported folder read back: max |ours - transformers| = {difference:.2e}')
  assert difference < 1e-5
  expected = table[exported['generated'][:, 1:]]
  got, _ = decode.greedy(decode.stepper(model, inputs, expected.shape[1]), len(inputs), expected.shape[1])
  np.testing.assert_array_equal(np.asarray(got), expected)
  vocab = SentencePieceVocab(EXPORT_SPM)
  for text, ids, m in zip(exported['sources'], exported['input_ids'], exported['attention_mask']):
    assert vocab.encode(text) + [tokens.EOS] == table[ids[m > 0]].tolist()
  for text, pieces in zip(exported['sources'], exported['source_pieces']):
    assert [vocab._sp.id_to_piece(i) for i in vocab.encode(text)] == pieces
  for ids, text in zip(np.asarray(got), exported['translations']):
    assert vocab.decode(ids) == text  # The library's batch_decode(skip_special_tokens=True).


def test_export_of_a_run_from_a_marian_folder_gives_the_folder_back(tmp_path):
  """A run with data.vocab=a Marian folder (init_from it): its tokenizer files copied, and its weights, unchanged,
  written as the folder's tensors bit for bit (Marian's pad row is our BOS row, read from it)."""
  model, _ = loaded_model()
  model_config, _ = folder_config()
  params = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  data = ml_collections.ConfigDict(dict(vocab=FOLDER, max_input_length=16, max_target_length=8))
  out = str(tmp_path / 'again')
  config = write_marian(model_config, params, data, out, str(tmp_path))
  assert config['vocab_size'] == 53 and config['pad_token_id'] == 52 and config['activation_function'] == 'swish'
  original = safetensors.numpy.load_file(os.path.join(FOLDER, 'model.safetensors'))
  again = safetensors.numpy.load_file(os.path.join(out, 'model.safetensors'))
  assert sorted(again) == sorted(original)
  jax.tree.map(np.testing.assert_array_equal, again, original)
  for name in ('vocab.json', 'source.spm', 'target.spm', 'tokenizer_config.json'):
    with open(os.path.join(FOLDER, name), 'rb') as a, open(os.path.join(out, name), 'rb') as b:
      assert a.read() == b.read(), name


def test_export_refuses_what_marian_cannot_compute(tmp_path):
  for changes, message in [
    (dict(prenorm=True), "model.prenorm=True; transformers' MarianMTModel computes with model.prenorm=False"),
    (dict(posemb='learn'), "model.posemb='learn'"),
    (dict(share_embeddings='decoder'), "model.share_embeddings='decoder'"),
    (dict(attention='local'), "model.attention='local'"),
  ]:
    with pytest.raises(ConfigError) as e:
      write_export(str(tmp_path / 'x'), **changes)
    assert message in one_line(e)
    assert not os.path.exists(tmp_path / 'x')
  model_config, params, _ = random_transformer()
  with pytest.raises(ConfigError) as e:
    write_marian(model_config, params, ml_collections.ConfigDict(EXPORT_DATA | dict(vocab='words')), 'x', '.')
  assert "data.vocab='words'" in one_line(e)
  with pytest.raises(ConfigError) as e:
    write_marian(
      model_config, params, ml_collections.ConfigDict(EXPORT_DATA | dict(vocab='sentencepiece')), 'x', str(tmp_path)
    )
  assert 'sentencepiece.model is not there' in one_line(e)
  with pytest.raises(ConfigError) as e:  # A caption run's image encoder.
    write_marian(model_config, params | {'patch_embedding': {}}, ml_collections.ConfigDict(EXPORT_DATA), 'x', '.')
  assert 'an image-to-text Transformer; MarianMTModel translates tokens to tokens' in one_line(e)


@pytest.mark.slow
def test_export_command_writes_a_translation_run_as_a_marian_folder(seq_data_dir, tmp_path, capsys):
  """`tools.export --format safetensors --layout transformers --workdir RUN` of the WMT recipe's run (tiny, on
  TinyTranslate, its SentencePiece vocabulary trained in the workdir): the run's parameters back from the folder
  (PAD's row as BOS's), its tokenizer the run's; --layout timm is one line."""
  from vit_jax_lab import checkpoints
  from vit_jax_lab.data.text import SentencePieceVocab

  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'marian')
  train.train_and_evaluate(test_seq2seq_train.wmt_config(seq_data_dir), workdir)
  assert export.main(['--format', 'safetensors', '--layout', 'transformers', '--workdir', workdir, '--out', out]) == 0
  captured = capsys.readouterr()
  assert f'wrote a transformers folder (MarianMTModel) to {out}' in captured.out
  assert 'layernorm_epsilon=1e-06' in captured.err
  params = checkpoints.read_params(workdir)
  model, _ = loaded_model(out)
  loaded = nnx.state(model, nnx.Param).to_pure_dict()
  table = params['target_embedding']['embedding'] = np.array(params['target_embedding']['embedding'])
  table[tokens.PAD] = table[tokens.BOS]
  assert not loaded.pop('logits_bias').any()  # The recipe has none: Marian's final_logits_bias of zeros.
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  run_vocab = SentencePieceVocab(os.path.join(workdir, 'sentencepiece.model'))
  assert MarianVocab(out).encode('The cat sees a dog.') == run_vocab.encode('The cat sees a dog.')
  timm = ['--format', 'safetensors', '--layout', 'timm', '--workdir', workdir, '--out', str(tmp_path / 't')]
  assert export.main(timm) == 2
  assert capsys.readouterr().err.strip().endswith("holds a 'transformer' model: --layout timm writes vit runs")


if __name__ == '__main__':  # The folder make_marian_export_reference.py loads with transformers.
  import sys

  if not os.path.isfile(EXPORT_SPM):
    export_spm(EXPORT_SPM)
  write_export(os.path.join(sys.argv[1], 'marian'))


@pytest.mark.parametrize(
  'change, message',
  [
    (lambda c: c.pop('d_model'), "its config.json lacks the key 'd_model'"),
    (lambda c: c.update(pad_token_id=-3), r'pad_token_id=-3 is not an id of its vocabulary \(0 to vocab_size - 1 = '),
    (lambda c: c.update(eos_token_id=10**6), 'eos_token_id=1000000 is not an id of its vocabulary'),
    (lambda c: c.update(eos_token_id=c['pad_token_id']), 'must be three different ids'),
    (lambda c: c.update(vocab_size=0), 'config.json has vocab_size=0; a vocabulary holds at least 2 ids'),
  ],
)
def test_a_damaged_marian_config_is_one_line(tmp_path, change, message):
  """A wrong special id would otherwise wrap around (a negative one) or mix two tokens' rows without a word."""
  path = tmp_path / 'marian'
  shutil.copytree(FOLDER, path)
  config = json.loads((path / 'config.json').read_text())
  change(config)
  (path / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ConfigError, match=message), hub.config_values(str(path)):
    loaded_model(str(path))
