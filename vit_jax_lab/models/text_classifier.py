"""A Transformer encoder that classifies token sequences: Long Range Arena's classifier (Tay et al. 2021), e.g. for
ListOps. Token and position embeddings, an optional class token, pre-norm encoder blocks, a linear head."""

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
    dropout: dropout rate after the embedding, in the MLP and on each residual branch.
    attention_dropout: dropout rate on the attention probabilities.
    drop_path: stochastic-depth rate of the last block (rising linearly from 0 in the first).
    head_zero_init: start the classification head at zero.
    remat: rematerialisation policy of every block: 'none', 'full', 'dots' or 'dots_no_batch'
      (layers.REMAT_POLICIES).
    scan: stack the blocks' parameters on a leading layer axis and apply them with one `lax.scan`.
    attention_impl: `jax.nn.dot_product_attention`'s implementation: None (JAX picks), 'xla', or 'cudnn'.
    attention: the self-attention pattern (models/attention.py): 'full' (O(n^2)); 'local', blocks of
      attention_window tokens attending to their own and the two adjacent blocks, the class token global (O(n));
      'sparse', 'local' plus attention_random_blocks random blocks (BigBird; O(n)); 'linear', kernelised linear
      attention (elu + 1; O(n)).
    attention_window: block length in tokens, for 'local' and 'sparse'.
    attention_random_blocks: random key blocks per query block, for 'sparse'.
  """

  NO_DECAY = ('pos_embedding', 'cls')

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
    dropout: float = 0.0,
    attention_dropout: float = 0.0,
    drop_path: float = 0.0,
    head_zero_init: bool = True,
    remat: str = 'none',
    scan: bool = False,
    attention_impl: str | None = None,
    attention: str = 'full',
    attention_window: int = 16,
    attention_random_blocks: int = 2,
    rngs: nnx.Rngs,
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
        remat=(remat, tuple(layers.REMAT_POLICIES)),
        attention_impl=(attention_impl, layers.ATTENTION_IMPLS),
      ),
      dict(dropout=dropout, attention_dropout=attention_dropout, drop_path=drop_path),
    )
    d = dims['width']
    if posemb == 'sincos' and d % 2:
      raise ConfigError(f'model.width={d} must be even for sin-cos position embeddings')
    pattern = layers.attention_pattern(
      attention, attention_window, attention_random_blocks, attention_dropout, grid=None, num_global=int(pool == 'tok')
    )
    self.max_len, self.pool, self.posemb_type = max_len, pool, posemb
    self.embedding = layers.Embed(vocab_size, d, embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
    if pool == 'tok':
      self.cls = nnx.Param(jnp.zeros((1, 1, d)))
    if posemb == 'learn':
      self.pos_embedding = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, max_len + (pool == 'tok'), d)))
    self.dropout = layers.Dropout(dropout)
    self.encoder = layers.Encoder(
      dims['depth'],
      d,
      dims['mlp_dim'],
      dims['num_heads'],
      dropout=dropout,
      attention_dropout=attention_dropout,
      drop_path=drop_path,
      prenorm=True,
      gelu_approximate=False,
      layernorm_epsilon=1e-6,
      remat=remat,
      scan=scan,
      attention_impl=attention_impl,
      pattern=pattern,
      rngs=rngs,
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
