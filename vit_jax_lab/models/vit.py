"""Vision Transformer (Dosovitskiy et al. 2021), sized by variant strings such as "B/16"."""

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import layers

# width, depth, mlp_dim, num_heads. "mu" is a tiny size for small images and tests.
VARIANTS = {
    'mu': (64, 4, 128, 4),
    'Ti': (192, 12, 768, 3),
    'S': (384, 12, 1536, 6),
    'M': (512, 12, 2048, 8),
    'B': (768, 12, 3072, 12),
    'L': (1024, 24, 4096, 16),
    'H': (1280, 32, 5120, 16),
}


def decode_variant(variant: str | None) -> dict[str, int]:
  """"B/16" -> width, depth, mlp_dim, num_heads and patch_size; "B" leaves patch_size out."""
  if variant is None:
    return {}
  size, _, patch = variant.partition('/')
  if size not in VARIANTS or (patch and not patch.isdigit()):
    raise ConfigError(f'model.variant={variant!r}: expected SIZE[/PATCH] with SIZE one of {", ".join(VARIANTS)}, '
                      'e.g. "B/16"')
  dims = dict(zip(('width', 'depth', 'mlp_dim', 'num_heads'), VARIANTS[size]))
  return dims | ({'patch_size': int(patch)} if patch else {})


class ViT(nnx.Module):
  """Images (B, H, W, C) -> class logits (B, num_classes).

  Attributes:
    num_classes: size of the classification head (from the dataset).
    input_shape: (height, width, channels) of one image (from the data config).
    variant: size (and patch) as a string, e.g. "Ti/16"; explicit dimensions below override it.
    patch_size: side of the square patches; must divide the image height and width.
    width: token dimension.
    depth: number of encoder blocks.
    mlp_dim: hidden size of each block's MLP.
    num_heads: attention heads; must divide width.
    pool: 'tok' classifies the class token, 'gap' the average of the patch tokens.
    posemb: 'learn' (learned, vision_transformer layout) or 'sincos2d' (fixed).
    prenorm: LayerNorm before each residual branch (ViT) or after the residual sum (original Transformer).
    dropout: dropout rate after the embedding, in the MLP and on each residual branch.
    drop_path: stochastic-depth rate of the last block (rising linearly from 0 in the first).
    gelu_approximate: tanh-approximate GELU, as in the original ViT release; False is the exact one.
    layernorm_epsilon: epsilon of every LayerNorm.
    head_zero_init: start the classification head at zero (as the ViT paper fine-tunes).
  """

  def __init__(self, num_classes: int, input_shape: tuple[int, ...], *, variant: str | None = None,
               patch_size: int | None = None, width: int | None = None, depth: int | None = None,
               mlp_dim: int | None = None, num_heads: int | None = None, pool: str = 'tok',
               posemb: str = 'learn', prenorm: bool = True, dropout: float = 0.0, drop_path: float = 0.0,
               gelu_approximate: bool = False, layernorm_epsilon: float = 1e-6, head_zero_init: bool = True,
               rngs: nnx.Rngs):
    given = dict(patch_size=patch_size, width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads)
    dims = decode_variant(variant) | {k: v for k, v in given.items() if v is not None}
    missing = [k for k in given if k not in dims]
    if missing:
      raise ConfigError(f'model.{missing[0]} is not set: give model.variant (e.g. "Ti/16") or model.{missing[0]}')
    if len(input_shape) != 3:
      raise ConfigError(f'ViT takes images of shape (height, width, channels), got {tuple(input_shape)}; '
                        'use a video model for clips')
    height, wide, channels = input_shape
    self.patch_size = p = dims['patch_size']
    if height % p or wide % p:
      raise ConfigError(f'model.patch_size={p} must divide the image size {height}x{wide}: '
                        'change model.patch_size or data.image_size')
    d = dims['width']
    if d % dims['num_heads']:
      raise ConfigError(f'model.width={d} must be divisible by model.num_heads={dims["num_heads"]}')
    if pool not in ('tok', 'gap'):
      raise ConfigError(f"model.pool={pool!r} is not one of 'tok', 'gap'")
    if posemb not in ('learn', 'sincos2d'):
      raise ConfigError(f"model.posemb={posemb!r} is not one of 'learn', 'sincos2d'")
    self.grid = (height // p, wide // p)
    self.pool, self.posemb_type = pool, posemb

    self.embedding = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (p, p, channels, d)))
    self.embedding_bias = nnx.Param(jnp.zeros((d,)))
    num_tokens = self.grid[0] * self.grid[1]
    if pool == 'tok':
      self.cls = nnx.Param(jnp.zeros((1, 1, d)))
    if posemb == 'learn':  # Covers the class token too, as the vision_transformer checkpoints do.
      self.pos_embedding = nnx.Param(
          nnx.initializers.normal(0.02)(rngs.params(), (1, num_tokens + (pool == 'tok'), d)))
    self.dropout = layers.Dropout(dropout)
    self.encoder = layers.Encoder(dims['depth'], d, dims['mlp_dim'], dims['num_heads'], dropout=dropout,
                                  drop_path=drop_path, prenorm=prenorm, gelu_approximate=gelu_approximate,
                                  layernorm_epsilon=layernorm_epsilon, rngs=rngs)
    head_init = nnx.initializers.zeros if head_zero_init else nnx.initializers.lecun_normal()
    self.head = nnx.Linear(d, num_classes, kernel_init=head_init, rngs=rngs)

  def embed(self, images: jax.Array) -> jax.Array:
    """Non-overlapping patches -> tokens (B, N, width), as a matmul rather than a strided convolution."""
    b, h, w, c = images.shape
    p = self.patch_size
    patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, p * p * c)
    kernel = self.embedding[...]
    return patches @ kernel.reshape(-1, kernel.shape[-1]) + self.embedding_bias[...]

  def __call__(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    x = self.embed(images)
    if self.posemb_type == 'sincos2d':
      x = x + layers.sincos_2d(*self.grid, x.shape[-1])
    if self.pool == 'tok':
      x = jnp.concatenate([jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[-1])), x], axis=1)
    if self.posemb_type == 'learn':
      x = x + self.pos_embedding[...]
    x = self.encoder(self.dropout(x, train=train, rngs=rngs), train=train, rngs=rngs)
    x = x[:, 0] if self.pool == 'tok' else x.mean(axis=1)
    return self.head(x)
