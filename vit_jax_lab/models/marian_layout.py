"""transformers' MarianMTModel folders (the opus-mt translation models) in the seq2seq Transformer's terms: its shape
and options from config.json, and its tensors as our parameters.

Marian is the original post-norm Transformer with fixed sine-cosine positions (sines then cosines, from position 0:
layers.sincos_1d), embeddings scaled by sqrt(d_model), one embedding table for source, target and output plus a
`final_logits_bias`, and no BOS: the decoder starts from <pad>. Its ids (eos 0, unk 1, pad = size - 1) become ours
by tokens.foreign_ids: the embedding rows and the bias are gathered so that each of our ids means its token.

The way back, for `tools.export --layout transformers` of a translation run (EXPORTS): `folder`, by `from_params`,
`folder_config` and `marian_tokenizer` (the run's vocabulary as Marian's tokenizer files).
"""

import os
from typing import Any, Callable

import numpy as np
import sentencepiece as spm

import vit_jax_lab.models.layers as layers
from vit_jax_lab import errors, hub, tokens
from vit_jax_lab.errors import ConfigError

# Marian's activation_function -> our model.activation.
ACTIVATIONS = {'swish': 'silu', 'silu': 'silu', 'gelu': 'gelu', 'relu': 'relu'}
VOCAB = 'vocab.json'
LAYERNORM_EPSILON = 1e-5  # torch.nn.LayerNorm's, which Marian's layers use.


def _refuse(weights: hub.HubWeights, what: str) -> ConfigError:
  return ConfigError(f'init_from={weights.path!r}: {what}')


def options(weights: hub.HubWeights) -> dict[str, Any]:
  """The folder's Transformer keys (model.<key>): sizes and the options that change what it computes."""
  config = weights.config
  if config.get('model_type') != 'marian':
    raise _refuse(weights, f"config.json has model_type={config.get('model_type')!r}; only 'marian' is read")
  size = config.get('vocab_size')
  if not isinstance(size, int) or isinstance(size, bool) or size < 2:
    raise _refuse(weights, f'config.json has vocab_size={size!r}; a vocabulary holds at least 2 ids')
  if not config.get('share_encoder_decoder_embeddings', True) or config.get('decoder_vocab_size') not in (
    None,
    config['vocab_size'],
  ):
    raise _refuse(weights, 'separate source and target vocabularies are not read (share_encoder_decoder_embeddings)')
  for a, b in (('encoder_ffn_dim', 'decoder_ffn_dim'), ('encoder_attention_heads', 'decoder_attention_heads')):
    if config[a] != config[b]:
      raise _refuse(weights, f'{a}={config[a]} and {b}={config[b]} differ; our stacks share one value')
  activation = config.get('activation_function', 'gelu')
  if activation not in ACTIVATIONS:
    raise _refuse(weights, f'activation_function={activation!r} is not one of {", ".join(ACTIVATIONS)}')
  if config.get('normalize_before') or config.get('add_final_layer_norm') or config.get('normalize_embedding'):
    raise _refuse(weights, 'pre-norm or embedding LayerNorms (normalize_before, add_final_layer_norm) are not read')
  return dict(
    width=config['d_model'],
    encoder_depth=config['encoder_layers'],
    decoder_depth=config['decoder_layers'],
    mlp_dim=config['encoder_ffn_dim'],
    num_heads=config['encoder_attention_heads'],
    share_embeddings='all',
    posemb='sincos',
    prenorm=False,
    activation=ACTIVATIONS[activation],
    scale_embedding=bool(config.get('scale_embedding', False)),
    logits_bias=True,
    layernorm_epsilon=LAYERNORM_EPSILON,
  )


def special_ids(weights: hub.HubWeights) -> tuple[int, int, int, int]:
  """(size, pad, eos, unk) of the folder's vocabulary: config.json's pad and eos, vocab.json's <unk>."""
  config = weights.config
  file = os.path.join(weights.path, VOCAB)
  if not os.path.isfile(file):
    raise _refuse(weights, f'a Marian folder holds {VOCAB} beside config.json; this one has none')
  unk = errors.read_json(file, 'init_from: the vocabulary').get('<unk>', 1)
  ids = {'pad_token_id': config['pad_token_id'], 'eos_token_id': config['eos_token_id'], f'{VOCAB} <unk>': unk}
  size = config['vocab_size']
  for name, i in ids.items():
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < size:
      raise _refuse(weights, f'{name}={i!r} is not an id of its vocabulary (0 to vocab_size - 1 = {size - 1})')
  if len(set(ids.values())) < len(ids):
    raise _refuse(weights, f'{", ".join(f"{k}={v}" for k, v in ids.items())} must be three different ids')
  return size, *ids.values()


def our_rows(weights: hub.HubWeights) -> np.ndarray:
  """Marian's row of each of our ids (tokens.foreign_ids)."""
  return np.asarray(tokens.foreign_ids(*special_ids(weights)))


def _prefix(weights: hub.HubWeights) -> str:
  """'model.' (MarianMTModel) or '' (MarianModel)."""
  name = next(n for n in weights.tensors if n.endswith('encoder.layers.0.self_attn.q_proj.weight'))
  return name.removesuffix('encoder.layers.0.self_attn.q_proj.weight')


def to_params(weights: hub.HubWeights, dims: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
  """Our Transformer's parameters (a pure dict, blocks unscanned) from the folder, and notes. `dims`: width,
  encoder_depth, decoder_depth, mlp_dim. A missing or mis-shaped tensor: one ConfigError naming every such tensor
  and both shapes."""
  t, p = weights.tensors, _prefix(weights)
  d, m = dims['width'], dims['mlp_dim']
  size = weights.config['vocab_size']
  expected: dict[str, tuple[int, ...]] = {}
  problems: list[str] = []

  def get(name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    expected[name] = shape
    if name not in t:
      problems.append(f'{name} (missing; want {shape})')
    elif t.shape(name) != shape:
      problems.append(f'{name} {t.shape(name)} (want {shape})')
    else:
      return t[name]
    return None

  def linear(name: str, n_in: int, n_out: int) -> dict[str, Any]:
    w, b = get(name + '.weight', (n_out, n_in)), get(name + '.bias', (n_out,))
    return {'kernel': None if w is None else w.T, 'bias': b}

  def norm(name: str) -> dict[str, Any]:
    return {'scale': get(name + '.weight', (d,)), 'bias': get(name + '.bias', (d,))}

  def attention(name: str) -> dict[str, Any]:
    q, k, v = (linear(f'{name}.{x}_proj', d, d) for x in 'qkv')
    fused = None
    if all(x['kernel'] is not None and x['bias'] is not None for x in (q, k, v)):
      fused = {
        'kernel': np.concatenate([q['kernel'], k['kernel'], v['kernel']], axis=1),
        'bias': np.concatenate([q['bias'], k['bias'], v['bias']]),
      }
    return {'qkv': fused, 'out': linear(f'{name}.out_proj', d, d)}

  def block(name: str, cross: bool) -> dict[str, Any]:
    out = {
      'attn': attention(f'{name}.self_attn'),
      'norm1': norm(f'{name}.self_attn_layer_norm'),
      'mlp': {'fc1': linear(f'{name}.fc1', d, m), 'fc2': linear(f'{name}.fc2', m, d)},
      'norm2': norm(f'{name}.final_layer_norm'),
    }
    if cross:
      out |= {'cross_attn': attention(f'{name}.encoder_attn'), 'cross_norm': norm(f'{name}.encoder_attn_layer_norm')}
    return out

  params = {
    'encoder': {'blocks': {i: block(f'{p}encoder.layers.{i}', False) for i in range(dims['encoder_depth'])}},
    'decoder': {'blocks': {i: block(f'{p}decoder.layers.{i}', True) for i in range(dims['decoder_depth'])}},
  }
  notes = []
  # The one table: `shared`, or where a folder keeps only the tied copies, one of them. Untied copies that differ
  # would be another model.
  tables = [n for n in (f'{p}shared.weight', f'{p}decoder.embed_tokens.weight', 'lm_head.weight') if n in t]
  table = get(tables[0] if tables else f'{p}shared.weight', (size, d))
  for other in tables[1:] + [n for n in (f'{p}encoder.embed_tokens.weight',) if n in t]:
    if table is not None and t.shape(other) == table.shape and not np.array_equal(t[other], table):
      raise _refuse(weights, f'{other} differs from {tables[0]}: untied embeddings are not read')
  bias = t['final_logits_bias'] if 'final_logits_bias' in t else None
  if bias is None:
    notes.append('final_logits_bias: not in the folder, zero (as transformers loads it)')
    bias = np.zeros((1, size), np.float32)
  elif bias.shape != (1, size):
    problems.append(f'final_logits_bias {bias.shape} (want {(1, size)})')
  if problems:
    raise _refuse(weights, f'{len(problems)} tensors missing or mis-shaped: ' + '; '.join(problems))
  rows = our_rows(weights)
  params['target_embedding'] = {'embedding': np.asarray(table)[rows]}
  params['logits_bias'] = np.asarray(bias)[0, rows]
  notes.append(
    f"Marian's ids (pad {rows[0]}, eos {rows[2]}, unk {rows[3]}) as ours: embedding rows and logits bias gathered, "
    f'{size} -> {len(rows)} (PAD and BOS both its pad, the decoder start)'
  )
  return params, notes


def from_params(params: dict[str, Any], rows: list[int]) -> dict[str, np.ndarray]:
  """The inverse of to_params: our Transformer's parameters (a pure dict, blocks unscanned; share_embeddings='all')
  as MarianMTModel's tensors, the names transformers saves. `rows`: Marian's id of each of our ids
  (tokens.foreign_ids); Marian's row of an id is ours of the last id that maps to it, so its pad (the decoder start)
  is our BOS, and our PAD row is dropped. float32, as transformers loads them."""

  def array(x: Any) -> np.ndarray:
    return np.asarray(x, np.float32)

  def linear(p: dict[str, Any]) -> dict[str, np.ndarray]:
    return {'weight': np.ascontiguousarray(array(p['kernel']).T), 'bias': array(p['bias'])}

  tensors: dict[str, np.ndarray] = {}

  def put(name: str, values: dict[str, np.ndarray]) -> None:
    tensors.update({f'{name}.{k}': v for k, v in values.items()})

  def attention(name: str, p: dict[str, Any]) -> None:
    kernels = np.split(array(p['qkv']['kernel']), 3, axis=1)
    biases = np.split(array(p['qkv']['bias']), 3)
    for x, kernel, bias in zip('qkv', kernels, biases):
      put(f'{name}.{x}_proj', linear({'kernel': kernel, 'bias': bias}))
    put(f'{name}.out_proj', linear(p['out']))

  def norm(p: dict[str, Any]) -> dict[str, np.ndarray]:
    return {'weight': array(p['scale']), 'bias': array(p['bias'])}

  for stack in ('encoder', 'decoder'):
    for i, block in sorted(params[stack]['blocks'].items()):
      name = f'model.{stack}.layers.{i}'
      attention(f'{name}.self_attn', block['attn'])
      put(f'{name}.self_attn_layer_norm', norm(block['norm1']))
      put(f'{name}.fc1', linear(block['mlp']['fc1']))
      put(f'{name}.fc2', linear(block['mlp']['fc2']))
      put(f'{name}.final_layer_norm', norm(block['norm2']))
      if stack == 'decoder':
        attention(f'{name}.encoder_attn', block['cross_attn'])
        put(f'{name}.encoder_attn_layer_norm', norm(block['cross_norm']))
  ours_of = {m: i for i, m in enumerate(rows)}  # The last of our ids of each Marian id: BOS for its pad.
  order = [ours_of[m] for m in range(len(ours_of))]
  table = array(params['target_embedding']['embedding'])
  bias = array(params['logits_bias']) if 'logits_bias' in params else np.zeros(len(table), np.float32)
  tensors['model.shared.weight'] = np.ascontiguousarray(table[order])
  tensors['final_logits_bias'] = bias[order][None]
  return tensors


# Our model.activation -> Marian's activation_function.
_MARIAN_ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'silu': 'swish'}
# The Transformer keys MarianMTModel computes as ours only at these values.
_MARIAN_FIXED = dict(share_embeddings='all', posemb='sincos', prenorm=False, attention='full')


def folder_config(model: Any, model_config: Any, data_config: Any, rows: list[int]) -> tuple[dict, dict, list[str]]:
  """A seq2seq Transformer's transformers config.json (`MarianMTModel`: every size, the activation, Marian's ids of
  our special tokens), generation_config.json (greedy up to data.max_target_length tokens; Marian's pad, our BOS,
  never generated, as our decoders never choose it) and notes. What Marian computes otherwise is one line."""
  structure = model.structure
  mine = dict(structure, attention=model_config.get('attention', 'full'))
  for key, value in _MARIAN_FIXED.items():
    errors.check(
      mine[key] == value,
      f"--layout transformers: model.{key}={mine[key]!r}; transformers' MarianMTModel computes with "
      f'model.{key}={value!r}',
    )
  notes = []
  if model.layernorm_epsilon != LAYERNORM_EPSILON:
    notes.append(
      f"model.layernorm_epsilon={model.layernorm_epsilon}: Marian's LayerNorms compute with "
      f'{LAYERNORM_EPSILON}, its outputs differ slightly'
    )
  size, pad, eos = max(rows) + 1, rows[tokens.BOS], rows[tokens.EOS]
  heads, mlp = structure['num_heads'], structure['mlp_dim']
  config = dict(
    architectures=['MarianMTModel'],
    model_type='marian',
    vocab_size=size,
    decoder_vocab_size=size,
    d_model=structure['width'],
    encoder_layers=structure['encoder_depth'],
    decoder_layers=structure['decoder_depth'],
    encoder_attention_heads=heads,
    decoder_attention_heads=heads,
    encoder_ffn_dim=mlp,
    decoder_ffn_dim=mlp,
    activation_function=_MARIAN_ACTIVATIONS[structure['activation']],
    scale_embedding=structure['scale_embedding'],
    max_position_embeddings=max(512, data_config.max_input_length, data_config.max_target_length),
    dropout=model_config.get('dropout', 0.1),
    attention_dropout=model_config.get('attention_dropout', 0.0),
    activation_dropout=0.0,
    encoder_layerdrop=0.0,
    decoder_layerdrop=0.0,
    pad_token_id=pad,
    eos_token_id=eos,
    decoder_start_token_id=pad,
    bos_token_id=None,
    forced_eos_token_id=None,  # Our decoders force no EOS at the length limit.
    share_encoder_decoder_embeddings=True,
    tie_word_embeddings=True,
    is_encoder_decoder=True,
    dtype='float32',
  )
  generation = dict(
    bad_words_ids=[[pad]],
    decoder_start_token_id=pad,
    eos_token_id=eos,
    pad_token_id=pad,
    max_length=data_config.max_target_length + 1,  # The decoder start included.
    num_beams=1,
    forced_eos_token_id=None,
  )
  return config, generation, notes


# The model families (config.model.name) whose runs `folder` writes: tools.export --layout transformers.
EXPORTS = ('transformer',)


def marian_tokenizer(
  data_config: Any, vocab_dir: str, marian_vocab: Callable[[str], Any]
) -> tuple[list[int], dict, dict, dict]:
  """The run's vocabulary as a Marian tokenizer: (Marian's id of each of our ids, tokenizer files to copy as
  {name: path}, vocab.json (None: copied), tokenizer_config.json's names of the special tokens). A trained
  SentencePiece model (data.vocab='sentencepiece': vocab_dir's sentencepiece.model, or a .model file) becomes both
  sides' model; its pieces in vocab.json as Marian orders them (eos 0, unk 1, the pieces, pad last = the decoder
  start, which is our BOS; our PAD has no id of its own). A Marian folder (a run fine-tuned from one) is copied.
  `marian_vocab(data.vocab)`: the tokenizer of the Marian folder data.vocab names (data.info.MarianVocab), or None
  where it names none; the caller reads it, as models may not import data."""
  vocab = data_config.vocab
  tokenizer = marian_vocab(vocab)
  if tokenizer is not None:
    rows = [tokenizer.marian[piece] for piece in tokenizer.pieces]
    names = {'pad_token': tokenizer.pieces[tokens.BOS], 'eos_token': tokenizer.pieces[tokens.EOS]}
    names['unk_token'] = tokenizer.pieces[tokens.UNK]
    files = {name: os.path.join(vocab, name) for name in (*tokenizer.FILES, 'tokenizer_config.json')}
    files = {name: path for name, path in files.items() if os.path.isfile(path)}
    return rows, files, None, names
  errors.check(
    vocab != 'words',
    "--layout transformers: data.vocab='words'; MarianMTModel's tokenizer is a SentencePiece model: train with "
    "data.vocab='sentencepiece' (or a .model file) to export a translation run",
  )
  path = os.path.join(vocab_dir, 'sentencepiece.model') if vocab == 'sentencepiece' else vocab
  errors.check(os.path.isfile(path), f"--layout transformers: the run's SentencePiece model {path} is not there")
  sp = spm.SentencePieceProcessor(model_file=path)
  ids, specials = (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()), (tokens.PAD, tokens.BOS, tokens.EOS, tokens.UNK)
  errors.check(ids == specials, f'--layout transformers: {path} has pad, bos, eos, unk ids {ids}, not ours {specials}')
  size = sp.get_piece_size() - 1  # PAD and BOS share Marian's pad.
  rows = tokens.foreign_ids(size, pad=size - 1, eos=0, unk=1)
  pieces = {rows[i]: sp.id_to_piece(i) for i in range(sp.get_piece_size()) if i != tokens.BOS}
  vocab_json = {pieces[m]: m for m in range(size)}
  names = {'pad_token': pieces[size - 1], 'eos_token': pieces[0], 'unk_token': pieces[1]}
  return rows, {'source.spm': path, 'target.spm': path}, vocab_json, names


def folder(
  params: dict[str, Any],
  model_config: Any,
  data_config: Any,
  vocab_dir: str,
  build: Callable[[int], Any],
  marian_vocab: Callable[[str], Any],
) -> tuple[dict[str, dict], dict[str, np.ndarray], dict[str, str], list[str]]:
  """`params` of a seq2seq Transformer run (config.model `model_config`, trained on data of `data_config` whose
  trained SentencePiece model, if any, is in `vocab_dir`) as a transformers folder that
  `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load: its JSON files by name (config.json,
  generation_config.json, vocab.json, tokenizer_config.json, less those copied), model.safetensors' tensors, the
  tokenizer files to copy (name -> path: source.spm, target.spm, a Marian folder's own) and notes (a LayerNorm
  epsilon other than Marian's), for tools.export to write. `build(vocab_size)`: the run's model for that many ids,
  built abstractly (the model registry imports this module); `marian_vocab`: as marian_tokenizer's."""
  params = layers.unscanned(params)
  errors.check(
    'patch_embedding' not in params,
    '--layout transformers: an image-to-text Transformer; MarianMTModel translates tokens to tokens',
  )
  rows, files, vocab_json, names = marian_tokenizer(data_config, vocab_dir, marian_vocab)
  ours = params['target_embedding']['embedding'].shape[0]
  errors.check(
    ours == len(rows),
    f"--layout transformers: the run's embedding has {ours} rows, its vocabulary {data_config.vocab} {len(rows)} ids",
  )
  config, generation, notes = folder_config(build(ours), model_config, data_config, rows)
  tokenizer_config = dict(
    tokenizer_class='MarianTokenizer',
    separate_vocabs=False,
    source_lang=None,
    target_lang=None,
    model_max_length=config['max_position_embeddings'],
    sp_model_kwargs={},
    **names,
  )
  tensors = from_params(params, rows)
  json_files = {'config.json': config, 'generation_config.json': generation}
  if vocab_json is not None:
    json_files['vocab.json'] = vocab_json
  if 'tokenizer_config.json' not in files:  # A Marian folder's own is copied.
    json_files['tokenizer_config.json'] = tokenizer_config
  return json_files, tensors, files, notes
