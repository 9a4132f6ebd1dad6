"""Vision Transformer (Dosovitskiy et al. 2021), sized by variant strings such as "B/16"."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import vit_jax_lab.models.base as base
import vit_jax_lab.models.layers as layers
import vit_jax_lab.models.release as release
from vit_jax_lab.errors import ConfigError

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
  """ "B/16" -> width, depth, mlp_dim, num_heads and patch_size; "B" leaves patch_size out."""
  if variant is None:
    return {}
  size, _, patch = variant.partition('/')
  if size not in VARIANTS or (patch and not patch.isdigit()):
    raise ConfigError(
      f'model.variant={variant!r}: expected SIZE[/PATCH] with SIZE one of {", ".join(VARIANTS)}, e.g. "B/16"'
    )
  dims = dict(zip(('width', 'depth', 'mlp_dim', 'num_heads'), VARIANTS[size]))
  return dims | ({'patch_size': int(patch)} if patch else {})


class ViT(base.Model):
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
    pool: 'tok' classifies the class token, 'gap' the average of the patch tokens, 'map' the output of
      multi-head attention pooling.
    posemb: 'learn' (learned; with 'tok' it covers the class token too, as vision_transformer does) or
      'sincos2d' (fixed).
    posemb_resize: how init_from resamples learned position embeddings to another patch grid: 'zoom'
      (scipy.ndimage.zoom, linear, corner-aligned: what vision_transformer and big_vision do, so fine-tuning
      a release reproduces theirs), 'bilinear' (jax.image.resize, half-pixel centres, antialiased when
      shrinking) or 'bicubic' (the same, bicubic: timm's resample_abs_pos_embed).
    representation_size: if set, a dense layer of this size with tanh before the head ("pre-logits").
    head_zero_init: start the classification head at zero (as the ViT paper fine-tunes).
    encoder: the encoder options, as keywords: layers.EncoderOptions (dropout, drop_path, attention kind, remat,
      scan, ...).
  """

  NO_DECAY = ('pos_embedding', 'cls')
  PRETRAINED = ('npz', 'run')
  RELEASE_LAYOUT = 'vision_transformer'

  def __init__(
    self,
    num_classes: int,
    input_shape: tuple[int, ...],
    *,
    variant: str | None = None,
    patch_size: int | None = None,
    width: int | None = None,
    depth: int | None = None,
    mlp_dim: int | None = None,
    num_heads: int | None = None,
    pool: str = 'tok',
    posemb: str = 'learn',
    posemb_resize: str = 'zoom',
    representation_size: int | None = None,
    head_zero_init: bool = True,
    rngs: nnx.Rngs,
    **encoder: Any,
  ):
    if len(input_shape) != 3:
      raise ConfigError(
        f'ViT takes images of shape (height, width, channels), got {tuple(input_shape)}; '
        'use a video model (model.name="vivit") for clips'
      )
    height, wide, channels = input_shape
    dims = layers.resolve_dims(
      decode_variant(variant),
      dict(patch_size=patch_size, width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads),
      'Ti/16',
    )
    layers.check_patch(dims['patch_size'], (height, wide))
    layers.check_options(
      dict(
        pool=(pool, ('tok', 'gap', 'map')),
        posemb=(posemb, ('learn', 'sincos2d')),
        posemb_resize=(posemb_resize, tuple(release.POSEMB_RESIZE)),
      ),
      {},
    )
    self.options = options = self.ENCODER.of(encoder)
    p, d = dims['patch_size'], dims['width']
    self.grid = (height // p, wide // p)
    self.num_heads = dims['num_heads']
    self.pool, self.posemb_type, self.posemb_resize = pool, posemb, posemb_resize

    self.embedding = layers.PatchEmbedding(p, channels, d, rngs=rngs)
    if pool == 'tok':
      self.cls = nnx.Param(jnp.zeros((1, 1, d)))
    if posemb == 'learn':
      num_tokens = self.grid[0] * self.grid[1] + (pool == 'tok')
      self.pos_embedding = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, num_tokens, d)))
    self.dropout = layers.Dropout(options.dropout)
    self.encoder = layers.Encoder(
      dims['depth'],
      d,
      dims['mlp_dim'],
      dims['num_heads'],
      pattern=options.pattern(self.grid, num_global=int(pool == 'tok')),
      rngs=rngs,
      **options.stack(),
    )
    if pool == 'map':
      self.map_head = layers.MAPHead(
        d,
        dims['mlp_dim'],
        dims['num_heads'],
        gelu_approximate=options.gelu_approximate,
        layernorm_epsilon=options.layernorm_epsilon,
        rngs=rngs,
      )
    if representation_size is not None:
      self.pre_logits = nnx.Linear(d, representation_size, rngs=rngs)
    head_init = nnx.initializers.zeros if head_zero_init else nnx.initializers.lecun_normal()
    self.head = nnx.Linear(representation_size or d, num_classes, kernel_init=head_init, rngs=rngs)

  def tokens(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """Embedded patches with position embeddings (and the class token first, for 'tok')."""
    x = self.embedding(images)
    x = layers.add_positions(
      x,
      fixed=layers.sincos_2d(*self.grid, x.shape[-1]) if self.posemb_type == 'sincos2d' else None,
      cls=self.cls if self.pool == 'tok' else None,
      learned=self.pos_embedding if self.posemb_type == 'learn' else None,
    )
    return self.dropout(x, train=train, rngs=rngs)

  def __call__(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    return self.head(self.features(images, train=train, rngs=rngs))

  def features(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """(B, width or representation_size): the pooled representation the head classifies, after the pre-logits
    layer if there is one (big_vision's `pre_logits`); what few-shot linear evaluation reads."""
    x = self.encoder(self.tokens(images, train=train, rngs=rngs), train=train, rngs=rngs)

    def pooled(x):
      if self.pool == 'tok':
        return x[:, 0]
      if self.pool == 'gap':
        return x.mean(axis=1)
      if self.pool == 'map':
        return self.map_head(x)
      raise KeyError(self.pool)

    x = pooled(x)
    if hasattr(self, 'pre_logits'):
      x = jnp.tanh(self.pre_logits(x))
    return x

  def load_pretrained(self, source: dict, params: dict) -> tuple[dict, list[str]]:
    """Weights for this model from `source`: a release .npz's flat dict, or another ViT's parameters
    (a pure nested dict). `params` are this model's initial ones (kept for a re-initialised head)."""
    notes = []
    if any('/' in k for k in source):
      options = dict(gelu_approximate=self.options.gelu_approximate, layernorm_epsilon=self.options.layernorm_epsilon)
      if options != release.RELEASE_OPTIONS:
        notes.append(
          f'the released checkpoints were trained with {release.RELEASE_OPTIONS}; this model has '
          f'{options}, so its outputs differ slightly from the published model'
        )
    else:
      source = release.to_release(source, self.num_heads)
    params, adapted = release.from_release(source, self, params)
    return params, notes + adapted

  @classmethod
  def release_params(cls, params: dict, model_config: Any) -> dict:
    """`params` in the vision_transformer / big_vision .npz naming (what `tools.export` writes)."""
    return release.to_release(params, model_config.num_heads or decode_variant(model_config.variant)['num_heads'])

  def attention_maps(self, images: jax.Array) -> list[jax.Array]:
    """Every block's attention probabilities (batch, heads, tokens, tokens), in inference mode."""
    x, maps = self.tokens(images), []
    for i, block in enumerate(self.encoder.blocks):
      maps.append(block.attention_weights(x, layer=i))
      x = block(x, train=False, rngs=None, layer=i)
    return maps
