"""Encoder-decoder Transformer (Vaswani et al. 2017) with a key/value cache for decoding.

The encoder reads tokens, or images as a ViT does (image captioning); the decoder is the same either way.
Sequences may be packed: `segments` number the sequences of a row (0 is padding) and `positions` count
within each, so no token attends across sequences or to padding.
"""

import dataclasses
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import vit_jax_lab.models.attention as patterns
import vit_jax_lab.models.base as base
import vit_jax_lab.models.layers as layers
import vit_jax_lab.models.marian_layout as marian_layout
from vit_jax_lab import hub
from vit_jax_lab.errors import ConfigError

# width, encoder_depth, decoder_depth, mlp_dim, num_heads. "tiny" is for tests and small built-in tasks.
PRESETS = {
  'tiny': (64, 2, 2, 128, 4),
  'base': (512, 6, 6, 2048, 8),
  'big': (1024, 6, 6, 4096, 16),
}
SHARING = ('all', 'decoder', 'none')
ACTIVATIONS = (*layers.ACTIVATIONS, 'silu')
SIZES = ('width', 'encoder_depth', 'decoder_depth', 'mlp_dim', 'num_heads')
# Keys a hub folder fixes besides the sizes: taken from it where the config leaves the constructor's default.
STRUCTURE = ('share_embeddings', 'posemb', 'activation', 'scale_embedding', 'logits_bias')
FOLDER_OPTIONS = ('prenorm', 'layernorm_epsilon')  # Encoder options the same way.


def attention_mask(query_segments: jax.Array, key_segments: jax.Array, causal: bool = False) -> jax.Array:
  """(B, Q) and (B, K) segment ids -> bool (B, 1, Q, K): a query sees the keys of its own sequence (and for
  `causal` only those at or before it). Padding (segment 0) only sees padding, which no real token sees."""
  mask = query_segments[:, None, :, None] == key_segments[:, None, None, :]
  if causal:
    mask &= jnp.tril(jnp.ones((query_segments.shape[1], key_segments.shape[1]), bool))
  return mask


class DecoderBlock(layers.EncoderBlock):
  """Causal self-attention, cross-attention to the encoder output, then the MLP, each a residual branch.

  `step` applies the block to one new token per sequence with a cache of the keys and values of the
  earlier ones (and of the encoder output), so a token costs work linear in the length so far.
  """

  def __init__(
    self,
    width: int,
    mlp_dim: int,
    num_heads: int,
    *,
    attention_dropout: float,
    layernorm_epsilon: float,
    rngs: nnx.Rngs,
    attention_impl: str | None = None,
    **kwargs,
  ):
    super().__init__(
      width,
      mlp_dim,
      num_heads,
      attention_dropout=attention_dropout,
      layernorm_epsilon=layernorm_epsilon,
      attention_impl=attention_impl,
      rngs=rngs,
      **kwargs,
    )
    self.cross_norm = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.cross_attn = layers.Attention(
      width, num_heads, dropout=attention_dropout, implementation=attention_impl, rngs=rngs
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    train: bool,
    rngs: nnx.Rngs | None,
    drop_path: jax.Array | None = None,
    mask: patterns.Mask | None = None,
    layer: int | jax.Array = 0,
    encoded: jax.Array | None = None,
    cross_mask: jax.Array | None = None,
  ) -> jax.Array:
    x = self.mix(x, train=train, rngs=rngs, drop_path=drop_path, mask=mask, layer=layer)
    x = self.residual(
      x,
      self.cross_norm,
      lambda y: self.cross_attn(y, encoded, train=train, rngs=rngs, mask=cross_mask),
      train=train,
      rngs=rngs,
      drop_path=drop_path,
    )
    return self.feed_forward(x, train=train, rngs=rngs, drop_path=drop_path)

  def init_cache(self, encoded: jax.Array, length: int) -> dict[str, jax.Array]:
    """Empty self-attention keys/values for `length` tokens (linear attention: its running sums), and the
    encoder output's keys/values."""
    cross_k, cross_v = self.cross_attn.keys_values(encoded)
    b, _, heads, head_dim = cross_k.shape
    if self.attn.pattern is not None and patterns.KINDS[self.attn.pattern.kind].cache == 'sums':
      own = patterns.linear_cache(b, heads, head_dim)
    else:
      empty = jnp.zeros((b, length, heads, head_dim), cross_k.dtype)
      own = {'k': empty, 'v': empty}
    return own | {'cross_k': cross_k, 'cross_v': cross_v}

  def step(
    self, x: jax.Array, cache: dict[str, jax.Array], index: jax.Array, cross_mask: jax.Array | None, layer: int = 0
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Tokens (B, 1, D) at position `index` -> outputs (B, 1, D) and the cache with their keys/values. A local
    or sparse pattern masks the cached keys to those its row sees; linear attention adds to its running sums."""
    cache = dict(cache)
    pattern = self.attn.pattern

    def self_attention(y):
      q, k, v = self.attn.heads(y)
      if pattern is not None and patterns.KINDS[pattern.kind].cache == 'sums':
        out, state = patterns.linear_step(q, k, v, {'kv': cache['kv'], 'z': cache['z']})
        cache.update(state)
        return self.attn.output(out)
      for name, new in (('k', k), ('v', v)):
        cache[name] = jax.lax.dynamic_update_slice_in_dim(cache[name], new.astype(cache[name].dtype), index, 1)
      length = cache['k'].shape[1]
      visible = jnp.arange(length) <= index
      if pattern is not None:
        visible = patterns.causal_row(pattern, index, length, layer)
      return self.attn.output(
        self.attn.attend(q, cache['k'], cache['v'], train=False, rngs=None, mask=visible[None, None, None, :])
      )

    def cross_attention(y):
      q = self.cross_attn.queries(y)
      return self.cross_attn.output(
        self.cross_attn.attend(q, cache['cross_k'], cache['cross_v'], train=False, rngs=None, mask=cross_mask)
      )

    x = self.residual(x, self.norm1, self_attention, train=False, rngs=None)
    x = self.residual(x, self.cross_norm, cross_attention, train=False, rngs=None)
    return self.feed_forward(x, train=False, rngs=None), cache


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerOptions(layers.EncoderOptions):
  """The Transformer's encoder options: post-norm and dropout 0.1 as the paper's base, windows of 16 tokens; no
  stochastic depth, and GELU is always exact (model.activation chooses it)."""

  prenorm: bool = False
  dropout: float = 0.1
  attention_window: int = 16
  drop_path: float = dataclasses.field(default=0.0, init=False)
  gelu_approximate: bool = dataclasses.field(default=False, init=False)


class Transformer(base.Model):
  """Source tokens (B, S) or images (B, H, W, C), and decoder inputs (B, T) -> next-token logits (B, T, V).

  Attributes:
    vocab_size: target vocabulary (from the data).
    input_vocab_size: source vocabulary; None when the inputs are images (from the data).
    input_shape: (height, width, channels) of image inputs; None for token inputs (from the data).
    max_len: longest sequence the data holds (from the data); only learned position embeddings need it.
    variant: a preset of PRESETS ('tiny', 'base', 'big'); explicit dimensions below override it.
    width: d_model, the token dimension.
    encoder_depth: encoder layers.
    decoder_depth: decoder layers.
    mlp_dim: hidden size of each block's MLP (d_ff).
    num_heads: attention heads; must divide width.
    patch_size: side of the square image patches (image inputs only).
    share_embeddings: 'all' ties source, target and output embeddings (one vocabulary, as the paper);
      'decoder' ties the target embedding and the output projection; 'none' ties nothing.
    posemb: 'sincos' (fixed, as the paper: sines then cosines, from position 0) or 'learn'.
    activation: of the MLPs, 'relu' (the paper), 'gelu' or 'silu' (swish: opus-mt's Marian models).
    scale_embedding: token embeddings times sqrt(width) before the positions are added (the paper; Marian's
      scale_embedding); False: as they are.
    logits_bias: a learned bias on the output logits (Marian's final_logits_bias); False: none (the paper).
    encoder: the options of both stacks, as keywords: TransformerOptions (post-norm and dropout 0.1 as the
      paper's base; no stochastic depth). The self-attention kind applies to both stacks, cross-attention stays
      full: 'local' blocks of attention_window tokens attend to their block and the adjacent ones, the decoder's to
      its block and the one before, its first token global (image inputs: 3 x 3 blocks of patches); 'linear'
      decodes with running sums and takes no packed sequences.
  """

  NO_DECAY = ('input_posemb', 'target_posemb', 'image_posemb')
  ENCODER = TransformerOptions
  PRETRAINED = ()  # Marian folders: hub.LAYOUTS names the Transformer.

  def __init__(
    self,
    vocab_size: int,
    input_vocab_size: int | None,
    input_shape: tuple[int, ...] | None,
    max_len: int,
    *,
    variant: str | None = 'base',
    width: int | None = None,
    encoder_depth: int | None = None,
    decoder_depth: int | None = None,
    mlp_dim: int | None = None,
    num_heads: int | None = None,
    patch_size: int = 4,
    share_embeddings: str = 'all',
    posemb: str = 'sincos',
    activation: str = 'relu',
    scale_embedding: bool = True,
    logits_bias: bool = False,
    rngs: nnx.Rngs,
    **encoder: Any,
  ):
    if variant is not None and variant not in PRESETS:
      raise ConfigError(f'model.variant={variant!r} is not one of {", ".join(PRESETS)} (or None with explicit sizes)')
    preset = dict(zip(('width', 'encoder_depth', 'decoder_depth', 'mlp_dim', 'num_heads'), PRESETS.get(variant, ())))
    given = dict(
      width=width, encoder_depth=encoder_depth, decoder_depth=decoder_depth, mlp_dim=mlp_dim, num_heads=num_heads
    )
    dims = layers.resolve_dims(preset, given, 'base')
    d = dims['width']
    layers.check_options(
      dict(
        share_embeddings=(share_embeddings, SHARING),
        posemb=(posemb, ('sincos', 'learn')),
        activation=(activation, ACTIVATIONS),
        scale_embedding=(scale_embedding, (True, False)),
        logits_bias=(logits_bias, (True, False)),
      ),
      {},
    )
    options = self.ENCODER.of(encoder)
    images = input_vocab_size is None
    if images and (input_shape is None or len(input_shape) != 3):
      raise ConfigError(f'the inputs are neither tokens nor images (height, width, channels): {input_shape}')
    if share_embeddings == 'all' and (images or input_vocab_size != vocab_size):
      raise ConfigError(
        f"model.share_embeddings='all' needs one vocabulary for inputs and targets, but the data has "
        f"{'images' if images else input_vocab_size} -> {vocab_size}; use 'decoder' or 'none'"
      )
    if posemb == 'sincos' and d % 2:
      raise ConfigError(f'model.width={d} must be even for sin-cos position embeddings')
    self.share_embeddings, self.scale_embedding = share_embeddings, scale_embedding
    # What a pretrained folder must agree with (load_pretrained).
    self.structure = dims | dict(
      share_embeddings=share_embeddings,
      posemb=posemb,
      activation=activation,
      scale_embedding=scale_embedding,
      logits_bias=logits_bias,
      prenorm=options.prenorm,
    )
    self.layernorm_epsilon = options.layernorm_epsilon
    stack = dict(mlp_dim=dims['mlp_dim'], num_heads=dims['num_heads'], activation=activation, rngs=rngs)
    stack |= options.stack()
    pattern = options.pattern
    embed_init = nnx.initializers.normal(d**-0.5)  # Scaled by sqrt(d) at the input: unit-variance tokens.
    self.target_embedding = layers.Embed(vocab_size, d, embedding_init=embed_init, rngs=rngs)
    self.images = images
    if images:
      height, wide, channels = input_shape
      layers.check_patch(patch_size, (height, wide))
      self.grid = (height // patch_size, wide // patch_size)
      self.patch_embedding = layers.PatchEmbedding(patch_size, channels, d, rngs=rngs)
      self.image_posemb = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, self.grid[0] * self.grid[1], d)))
    elif share_embeddings != 'all':
      self.input_embedding = layers.Embed(input_vocab_size, d, embedding_init=embed_init, rngs=rngs)
    if posemb == 'learn':
      self.input_posemb = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (max_len, d)))
      self.target_posemb = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (max_len, d)))
    self.dropout = layers.Dropout(options.dropout)
    encoder_grid = self.grid if images else None
    self.encoder = layers.Encoder(dims['encoder_depth'], d, pattern=pattern(grid=encoder_grid, num_global=0), **stack)
    self.decoder = layers.Encoder(
      dims['decoder_depth'], d, block=DecoderBlock, pattern=pattern(grid=None, num_global=1), **stack
    )
    if share_embeddings == 'none':
      self.logits = nnx.Linear(d, vocab_size, use_bias=False, kernel_init=layers.xavier, rngs=rngs)
    if logits_bias:
      self.logits_bias = nnx.Param(jnp.zeros((vocab_size,)))

  def _embed(
    self,
    tokens: jax.Array,
    embedding: layers.Embed,
    positions: jax.Array | None,
    learned: nnx.Param | None,
    length: int | None = None,
  ) -> jax.Array:
    """Tokens (B, L) -> embeddings (sqrt(d)-scaled with scale_embedding) plus the position embeddings of
    `positions` (default 0..L-1), which are below `length` (default L)."""
    x = embedding(tokens)
    if self.scale_embedding:
      x = x * jnp.sqrt(embedding.features).astype(embedding.embedding.dtype)
    if positions is None:
      positions = jnp.arange(tokens.shape[1])[None]
    table = learned[...] if learned is not None else layers.sincos_1d(length or tokens.shape[1], x.shape[-1])
    return x + jnp.take(table, positions, axis=0).astype(x.dtype)

  def encode(
    self,
    inputs: jax.Array,
    *,
    segments: jax.Array | None = None,
    positions: jax.Array | None = None,
    train: bool = False,
    rngs: nnx.Rngs | None = None,
  ) -> tuple[jax.Array, jax.Array]:
    """Source tokens (B, S) or images -> encoder outputs (B, S', D) and their segment ids (B, S')."""
    if self.images:
      x = self.patch_embedding(inputs) + self.image_posemb[...]
      segments = jnp.ones(x.shape[:2], jnp.int32)
      mask = None
    else:
      mask = patterns.Mask(
        (inputs != 0).astype(jnp.int32) if segments is None else segments, packed=segments is not None
      )
      segments = mask.segments
      embedding = self.target_embedding if self.share_embeddings == 'all' else self.input_embedding
      x = self._embed(inputs, embedding, positions, getattr(self, 'input_posemb', None))
    x = self.dropout(x, train=train, rngs=rngs)
    return self.encoder(x, train=train, rngs=rngs, mask=mask), segments

  def output_logits(self, y: jax.Array) -> jax.Array:
    logits = self.logits(y) if self.share_embeddings == 'none' else self.target_embedding.attend(y)
    return logits + self.logits_bias[...].astype(logits.dtype) if hasattr(self, 'logits_bias') else logits

  def decode(
    self,
    decoder_inputs: jax.Array,
    encoded: jax.Array,
    encoder_segments: jax.Array,
    *,
    segments: jax.Array | None = None,
    positions: jax.Array | None = None,
    train: bool = False,
    rngs: nnx.Rngs | None = None,
  ) -> jax.Array:
    """Decoder inputs (B, T) (targets shifted right) and the encoder output -> logits (B, T, V), all at once."""
    packed = segments is not None
    segments = (decoder_inputs != 0).astype(jnp.int32) if segments is None else segments
    x = self._embed(decoder_inputs, self.target_embedding, positions, getattr(self, 'target_posemb', None))
    x = self.dropout(x, train=train, rngs=rngs)
    y = self.decoder(
      x,
      train=train,
      rngs=rngs,
      mask=patterns.Mask(segments, causal=True, packed=packed),
      encoded=encoded,
      cross_mask=attention_mask(segments, encoder_segments),
    )
    return self.output_logits(y)

  def __call__(
    self,
    inputs: jax.Array,
    decoder_inputs: jax.Array,
    *,
    inputs_segments: jax.Array | None = None,
    inputs_positions: jax.Array | None = None,
    targets_segments: jax.Array | None = None,
    targets_positions: jax.Array | None = None,
    train: bool = False,
    rngs: nnx.Rngs | None = None,
  ) -> jax.Array:
    encoded, encoder_segments = self.encode(
      inputs, segments=inputs_segments, positions=inputs_positions, train=train, rngs=rngs
    )
    return self.decode(
      decoder_inputs,
      encoded,
      encoder_segments,
      segments=targets_segments,
      positions=targets_positions,
      train=train,
      rngs=rngs,
    )

  # --- Pretrained weights ----------------------------------------------------------------------------------------

  @classmethod
  def pretrained_config(cls, model_config: Any, weights: hub.HubWeights) -> list[str]:
    """A Marian folder's shape into config.model: each size the config leaves unset (model.variant=None and no
    value) and each of STRUCTURE and FOLDER_OPTIONS it leaves at the constructor's default takes the folder's
    value; one set otherwise is one ConfigError line naming both values."""
    if weights.layout not in cls.pretrained():
      return []  # checkpoints.check_init_from refuses it in one line.
    folder = marian_layout.options(weights)
    preset = dict(zip(SIZES, PRESETS.get(model_config.get('variant'), ())))
    defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()}
    defaults |= {f.name: f.default for f in dataclasses.fields(cls.ENCODER)}
    notes = []
    for key in (*SIZES, *STRUCTURE, *FOLDER_OPTIONS):
      given = model_config.get(key, defaults[key])
      ours = preset.get(key) if given is None else given
      if ours == folder[key]:
        continue
      if (ours is not None) if key in SIZES else (ours != defaults[key]):
        by_variant = key in SIZES and given is None
        raise ConfigError(
          f'init_from={weights.path!r} is a model with model.{key}={folder[key]!r}, the config sets '
          f'model.{key}={ours!r}'
          + (
            f' (by model.variant={model_config.get("variant")!r}): set --config.model.variant=None to take the '
            "folder's sizes"
            if by_variant
            else f': set --config.model.{key}={folder[key]!r}, or leave it to the folder'
          )
        )
      model_config[key] = folder[key]
      notes.append(f'model.{key}={folder[key]!r} from the folder')
    return notes

  def load_pretrained(self, source: Any, params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A transformers MarianMTModel folder (hub.HubWeights): its shape and options must be this model's (one line
    naming the first key that differs), and its vocabulary the data's (data.vocab=the folder)."""
    if not isinstance(source, hub.HubWeights) or source.layout not in self.pretrained():
      what = hub.LAYOUTS[source.layout].description if isinstance(source, hub.HubWeights) else 'a release .npz or a run'
      raise ConfigError(
        f"init_from: the Transformer reads Marian folders only (transformers' MarianMTModel), not {what}; to "
        'continue one of its runs, rerun it in its own workdir'
      )
    folder = marian_layout.options(source)
    for key, value in self.structure.items():
      if folder[key] != value:
        raise ConfigError(
          f'init_from={source.path!r} is a model with model.{key}={folder[key]!r}, this model has '
          f'model.{key}={value!r}: set --config.model.{key}={folder[key]!r}'
        )
    loaded, notes = marian_layout.to_params(source, self.structure)
    ours, theirs = params['target_embedding']['embedding'].shape[0], loaded['target_embedding']['embedding'].shape[0]
    if ours != theirs or getattr(self, 'input_embedding', None) is not None:
      raise ConfigError(
        f'init_from={source.path!r} has a vocabulary of {theirs} ids (ours, with BOS), the data one of {ours}: set '
        f"--config.data.vocab={source.path} so that the data is tokenised as the folder's model was trained"
      )
    if self.layernorm_epsilon != folder['layernorm_epsilon']:
      notes.append(
        f"the folder's LayerNorms have epsilon {folder['layernorm_epsilon']}, this model's {self.layernorm_epsilon}: "
        'its outputs differ slightly'
      )
    loaded = layers.scanned_like(loaded, params)
    loaded, cast = hub.cast_like(loaded, params)
    return loaded, notes + cast

  # --- Cached decoding -------------------------------------------------------------------------------------------

  def _decoder_blocks(self) -> list[DecoderBlock]:
    """The decoder's blocks, one module per layer in either layout."""
    if not self.decoder.scan:
      return list(self.decoder.blocks)
    graphdef, params = nnx.split(self.decoder.blocks)
    depth = len(self.decoder.drop_path_rates)
    return [nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params)) for i in range(depth)]

  def init_cache(self, encoded: jax.Array, encoder_segments: jax.Array, length: int) -> dict:
    """A decoding cache for up to `length` tokens after the encoder output (B, S, D). Every array in it
    has the batch first, so beam search can reorder it."""
    return {
      'layers': [block.init_cache(encoded, length) for block in self._decoder_blocks()],
      'cross_mask': (encoder_segments > 0)[:, None, None, :],
      'length': jnp.zeros((encoded.shape[0], length, 0), jnp.int8),  # Empty: its shape holds the cache length.
    }

  def decode_step(self, tokens: jax.Array, index: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
    """The last tokens (B,) at position `index` -> next-token logits (B, V) and the updated cache."""
    x = self._embed(
      tokens[:, None],
      self.target_embedding,
      jnp.reshape(index, (1, 1)),
      getattr(self, 'target_posemb', None),
      length=cache['length'].shape[1],
    )
    new_layers = []
    for i, (block, layer_cache) in enumerate(zip(self._decoder_blocks(), cache['layers'])):
      x, layer_cache = block.step(x, layer_cache, index, cache['cross_mask'], layer=i)
      new_layers.append(layer_cache)
    if self.decoder.norm is not None:
      x = self.decoder.norm(x)
    return self.output_logits(x)[:, 0], cache | {'layers': new_layers}
