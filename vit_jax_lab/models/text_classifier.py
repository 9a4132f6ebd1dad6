"""A Transformer encoder that classifies token sequences: Long Range Arena's classifier (Tay et al. 2021), e.g. for
ListOps. Token and position embeddings, an optional class token, pre-norm encoder blocks, a linear head."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import vit_jax_lab.models.attention as attention
import vit_jax_lab.models.base as base
import vit_jax_lab.models.layers as layers
from vit_jax_lab.errors import ConfigError

# width, depth, mlp_dim, num_heads.
PRESETS = {
  'tiny': (16, 1, 32, 2),  # Tests.
  'small': (64, 4, 128, 4),  # configs/lra/listops.py: what learns ListOps in minutes on a CPU.
  'lra': (512, 6, 2048, 8),  # LRA's ListOps Transformer (base_listops_config: emb 512, 6 layers, MLP 2048, 8 heads).
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextClassifierOptions(layers.EncoderOptions):
  """The text classifier's encoder options: pre-norm, exact GELU and epsilon 1e-6 fixed; windows of 16 tokens."""

  prenorm: bool = dataclasses.field(default=True, init=False)
  gelu_approximate: bool = dataclasses.field(default=False, init=False)
  layernorm_epsilon: float = dataclasses.field(default=1e-6, init=False)
  attention_window: int = 16


class TextClassifier(base.Model):
  """Token ids (B, N), 0 for padding, N <= max_len -> class logits (B, num_classes).

  Padding changes nothing: no token attends to a padding one, and 'gap' averages the real tokens only, so a
  sequence padded to any length gets the same logits.

  Attributes:
    num_classes: size of the classification head (from the data).
    vocab_size: token ids are below this; 0 is padding (from the data).
    max_len: longest input in tokens (from the data: data.max_input_length); sizes learned position embeddings.
    variant: a preset of PRESETS ('tiny', 'small', 'lra'); explicit dimensions below override it.
    width: token dimension.
    depth: number of encoder blocks (pre-norm).
    mlp_dim: hidden size of each block's MLP.
    num_heads: attention heads; must divide width.
    pool: 'tok' classifies a class token prepended to the sequence (LRA's 'CLS' pooling), 'gap' the average of
      the real (non-padding) tokens.
    posemb: 'learn' (learned; with 'tok' it covers the class token too) or 'sincos' (fixed 1-D sine-cosine, on
      the sequence's tokens only).
    head_zero_init: start the classification head at zero.
    encoder: the encoder options, as keywords: TextClassifierOptions (pre-norm, exact GELU; 'local' blocks of
      attention_window tokens attend to their own and the two adjacent blocks, the class token global).
  """

  NO_DECAY = ('pos_embedding', 'cls')
  ENCODER = TextClassifierOptions

  def __init__(
    self,
    num_classes: int,
    vocab_size: int,
    max_len: int,
    *,
    variant: str | None = None,
    width: int | None = None,
    depth: int | None = None,
    mlp_dim: int | None = None,
    num_heads: int | None = None,
    pool: str = 'tok',
    posemb: str = 'learn',
    head_zero_init: bool = True,
    rngs: nnx.Rngs,
    **encoder: Any,
  ):
    if variant is not None and variant not in PRESETS:
      raise ConfigError(f'model.variant={variant!r} is not one of {", ".join(PRESETS)} (or None with explicit sizes)')
    preset = dict(zip(('width', 'depth', 'mlp_dim', 'num_heads'), PRESETS.get(variant, ())))
    dims = layers.resolve_dims(
      preset, dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads), example='small'
    )
    layers.check_options(
      dict(
        pool=(pool, ('tok', 'gap')),
        posemb=(posemb, ('learn', 'sincos')),
      ),
      {},
    )
    options = self.ENCODER.of(encoder)
    d = dims['width']
    if posemb == 'sincos' and d % 2:
      raise ConfigError(f'model.width={d} must be even for sin-cos position embeddings')
    self.max_len, self.pool, self.posemb_type = max_len, pool, posemb
    self.embedding = layers.Embed(vocab_size, d, embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
    if pool == 'tok':
      self.cls = nnx.Param(jnp.zeros((1, 1, d)))
    if posemb == 'learn':
      self.pos_embedding = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, max_len + (pool == 'tok'), d)))
    self.dropout = layers.Dropout(options.dropout)
    self.encoder = layers.Encoder(
      dims['depth'],
      d,
      dims['mlp_dim'],
      dims['num_heads'],
      pattern=options.pattern(grid=None, num_global=int(pool == 'tok')),
      rngs=rngs,
      **options.stack(),
    )
    head_init = nnx.initializers.zeros if head_zero_init else nnx.initializers.lecun_normal()
    self.head = nnx.Linear(d, num_classes, kernel_init=head_init, rngs=rngs)

  def __call__(self, tokens: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    return self.head(self.features(tokens, train=train, rngs=rngs))

  def features(self, tokens: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """(B, width): the pooled representation the head classifies."""
    b, n = tokens.shape
    if n > self.max_len:
      raise ValueError(f'{n} tokens are more than the model was built for (max_len={self.max_len})')
    x = self.embedding(tokens)
    fixed = layers.sincos_1d(n, x.shape[-1]) if self.posemb_type == 'sincos' else None
    x = layers.add_positions(x, fixed=fixed, cls=self.cls if self.pool == 'tok' else None)
    if self.posemb_type == 'learn':
      x = x + self.pos_embedding[:, : x.shape[1]]
    segments = (tokens != 0).astype(jnp.int32)  # 1: a real token, 0: padding, which no real token attends to.
    if self.pool == 'tok':
      segments = jnp.concatenate([jnp.ones((b, 1), jnp.int32), segments], axis=1)
    x = self.dropout(x, train=train, rngs=rngs)
    x = self.encoder(x, train=train, rngs=rngs, mask=attention.Mask(segments))
    if self.pool == 'tok':
      return x[:, 0]
    real = segments[..., None].astype(x.dtype)
    return (x * real).sum(axis=1) / jnp.maximum(real.sum(axis=1), 1)
