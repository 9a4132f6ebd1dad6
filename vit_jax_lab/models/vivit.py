"""Video Vision Transformer (Arnab et al. 2021): tubelet or per-frame embedding, the paper's four ways of
attending over space and time, and initialisation from an image ViT.

Tokens live on a grid of `nt` times x `ns` places. The four models differ only in how they mix them:
  spatiotemporal             every token attends to every token (model 1);
  factorised_encoder         a spatial encoder per time step, then a temporal encoder over their outputs (2);
  factorised_self_attention  each block attends over time, then over space, then applies its MLP (3);
  factorised_dot_product     half of each layer's heads attend over space, half over time (4).

Initialised from an image ViT (`load_pretrained`), a clip of T copies of an image embeds as nt copies of
the image's tokens. Without a class token that leaves softmax attention and the average pool unchanged,
so model 1 (and model 3 with its temporal attention zeroed) gives exactly the image model's output. A
class token is outweighed nt : 1 by the copies, so with one it holds only for nt = 1 (tests/test_vivit.py).

Hugging Face transformers' video classifiers load too (`init_from` a hub folder; transformers_layout): ViViT
(model 1, class token, learned positions) and VideoMAE (model 1, fixed sine-cosine positions over the token index,
mean pooling and `fc_norm`), each giving the library's logits; and V-JEPA 2 (vjepa2_layout: model 1, rotary positions
over time, rows and columns, no position table, its attentive pool).
"""

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import vit_jax_lab.hub as hub
import vit_jax_lab.models.attention as attention
import vit_jax_lab.models.base as base
import vit_jax_lab.models.layers as layers
import vit_jax_lab.models.release as release
import vit_jax_lab.models.rope as rotary_embeddings
import vit_jax_lab.models.vit as vit
from vit_jax_lab.errors import ConfigError

MODELS = ('spatiotemporal', 'factorised_encoder', 'factorised_self_attention', 'factorised_dot_product')
# hub layout -> the module that reads it (vivit_options, to_release, notes).
# What a hub folder fixes beside the sizes (ViViT.pretrained_config fills each left unset or at its default).
SIZES = ('patch_size', 'width', 'depth', 'mlp_dim', 'num_heads')
STRUCTURE = ('model', 'embedding', 'tubelet_time', 'pool', 'posemb', 'fc_norm', 'rope', 'pool_depth', 'pool_mlp_dim')
# Keys a folder may leave open (None): a backbone without its pool takes any.
OPEN = ('pool', 'pool_depth', 'pool_mlp_dim')
# The encoder options a folder computes with (taken from it when left at their defaults).
FOLDER_OPTIONS = ('gelu_approximate', 'layernorm_epsilon')


def sincos_flat(length: int, features: int) -> np.ndarray:
  """(length, features) fixed position embeddings over the token index, sines at even and cosines at odd features,
  the pair 2i at frequency 10000^(-2i / features): VideoMAE's table (its get_sinusoid_encoding_table), computed in
  float64 as it is."""
  angles = np.arange(length)[:, None] / np.power(10_000.0, 2 * (np.arange(features) // 2) / features)
  angles[:, 0::2], angles[:, 1::2] = np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])
  return angles.astype(np.float32)


def decode_variant(variant: str | None) -> dict[str, int]:
  """ "B/16x2" -> the ViT dimensions of "B/16" and tubelet_time 2; "B/16" and "B" leave the rest out."""
  if variant is None:
    return {}
  if not re.fullmatch(r'[A-Za-z]+(/\d+(x\d+)?)?', variant):
    raise ConfigError(
      f'model.variant={variant!r}: expected SIZE[/PATCH[xTIME]] with SIZE one of '
      f'{", ".join(vit.VARIANTS)}, e.g. "B/16x2"'
    )
  image, _, time = variant.partition('x')
  return vit.decode_variant(image) | ({'tubelet_time': int(time)} if time else {})


class TubeletEmbedding(nnx.Module):
  """Non-overlapping time x patch x patch tubelets -> tokens (B, nt, ns, D): a strided 3-D convolution,
  computed as one matmul. With `time=None` each frame is embedded with 2-D patches (the paper's uniform
  frame sampling; the clip's frames are sampled by the data pipeline) and the kernel is an image ViT's."""

  def __init__(self, time: int | None, patch_size: int, channels: int, width: int, *, rngs: nnx.Rngs):
    self.time, self.patch_size = time or 1, patch_size
    shape = (patch_size, patch_size, channels, width)
    shape = shape if time is None else (time, *shape)
    self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), shape))
    self.bias = nnx.Param(jnp.zeros((width,)))

  def __call__(self, video: jax.Array) -> jax.Array:
    b, frames, h, w, c = video.shape
    t, p = self.time, self.patch_size
    x = video.reshape(b, frames // t, t, h // p, p, w // p, p, c).transpose(0, 1, 3, 5, 2, 4, 6, 7)
    x = x.reshape(b, frames // t, (h // p) * (w // p), t * p * p * c)
    kernel = self.kernel[...]
    return x @ kernel.reshape(-1, kernel.shape[-1]) + self.bias[...]


class FactorisedDotProductAttention(layers.Attention):
  """Model 4: the first half of the heads attend over space (tokens of the same time step), the other half
  over time (tokens at the same place). Same parameters as full attention; tokens (B, nt * ns, D)."""

  def __init__(
    self,
    width: int,
    num_heads: int,
    *,
    grid: tuple[int, int],
    dropout: float = 0.0,
    implementation: str | None = None,
    pattern: attention.Pattern | None = None,
    rngs: nnx.Rngs,
  ):
    super().__init__(width, num_heads, dropout=dropout, implementation=implementation, pattern=pattern, rngs=rngs)
    self.grid = grid

  def __call__(
    self,
    x: jax.Array,
    context: jax.Array | None = None,
    *,
    train: bool = False,
    rngs: nnx.Rngs | None = None,
    mask: attention.Mask | None = None,
    layer: int | jax.Array = 0,
  ) -> jax.Array:
    del context, mask, layer  # Self-attention over every token of a clip.
    b, n, _ = x.shape
    (nt, ns), half = self.grid, self.num_heads // 2
    q, k, v = (y.reshape(b, nt, ns, *y.shape[2:]) for y in self.heads(x))
    space = [y[..., :half, :].reshape(b * nt, ns, half, -1) for y in (q, k, v)]
    time = [y[..., half:, :].swapaxes(1, 2).reshape(b * ns, nt, self.num_heads - half, -1) for y in (q, k, v)]
    y_space = self.attend(*space, train=train, rngs=rngs).reshape(b, nt, ns, half, -1)
    y_time = self.attend(*time, train=train, rngs=rngs).reshape(b, ns, nt, self.num_heads - half, -1).swapaxes(1, 2)
    return self.out(jnp.concatenate([y_space, y_time], axis=3).reshape(b, n, -1))


class FactorisedSelfAttentionBlock(layers.EncoderBlock):
  """Model 3: self-attention over time, then over space (or the other way round), each with its own
  LayerNorm and residual, then the MLP. Tokens (B, nt * ns, D). `attn`/`norm1` are the spatial ones, so
  the block holds an image ViT block plus `temporal_attn`/`temporal_norm`."""

  def __init__(
    self,
    width: int,
    mlp_dim: int,
    num_heads: int,
    *,
    grid: tuple[int, int],
    time_first: bool,
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
    self.grid, self.time_first = grid, time_first
    self.temporal_norm = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.temporal_attn = layers.Attention(
      width, num_heads, dropout=attention_dropout, implementation=attention_impl, rngs=rngs
    )

  def mix(
    self,
    x: jax.Array,
    *,
    train: bool,
    rngs: nnx.Rngs | None,
    drop_path: jax.Array | None,
    mask: attention.Mask | None = None,
    layer: int | jax.Array = 0,
  ) -> jax.Array:
    del mask, layer  # Every token of a clip is real; the attention is full.
    b, n, d = x.shape
    nt, ns = self.grid

    def over_space(y):
      return self.attn(y.reshape(b * nt, ns, d), train=train, rngs=rngs).reshape(b, n, d)

    def over_time(y):
      y = self.temporal_attn(y.reshape(b, nt, ns, d).swapaxes(1, 2).reshape(b * ns, nt, d), train=train, rngs=rngs)
      return y.reshape(b, ns, nt, d).swapaxes(1, 2).reshape(b, n, d)

    order = [(self.temporal_norm, over_time), (self.norm1, over_space)]
    for norm, fn in order if self.time_first else order[::-1]:
      x = self.residual(x, norm, fn, train=train, rngs=rngs, drop_path=drop_path)
    return x


class AttentivePooler(nnx.Module):
  """V-JEPA's attentive probe (Bardes et al. 2024; transformers' VJEPA2AttentivePooler): `depth` pre-norm
  self-attention blocks over the tokens, then a learned `query` attends over them (keys and values normalised by
  `norm1`, the heads concatenated with no output projection), a residual on the query, then a residual MLP."""

  def __init__(
    self,
    width: int,
    mlp_dim: int,
    num_heads: int,
    depth: int,
    *,
    dropout: float,
    attention_dropout: float,
    gelu_approximate: bool,
    layernorm_epsilon: float,
    rngs: nnx.Rngs,
  ):
    self.query = nnx.Param(nnx.initializers.truncated_normal(0.02)(rngs.params(), (1, 1, width)))
    self.blocks = nnx.List(
      layers.EncoderBlock(
        width,
        mlp_dim,
        num_heads,
        dropout=dropout,
        attention_dropout=attention_dropout,
        drop_path=0.0,
        prenorm=True,
        gelu_approximate=gelu_approximate,
        layernorm_epsilon=layernorm_epsilon,
        rngs=rngs,
      )
      for _ in range(depth)
    )
    self.norm1 = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.attn = layers.Attention(width, num_heads, dropout=attention_dropout, projection=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.mlp = layers.Mlp(width, mlp_dim, dropout=dropout, gelu_approximate=gelu_approximate, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None) -> jax.Array:
    """Tokens (B, N, D) -> (B, D)."""
    for i, block in enumerate(self.blocks):
      x = block(x, train=train, rngs=rngs, layer=i)
    query = jnp.broadcast_to(self.query[...], (x.shape[0], 1, x.shape[-1])).astype(x.dtype)
    y = query + self.attn(query, context=self.norm1(x), train=train, rngs=rngs)
    return (y + self.mlp(self.norm2(y), train=train, rngs=rngs))[:, 0]


class ViViT(base.Model):
  """Video clips (B, T, H, W, C) -> class logits (B, num_classes).

  Attributes:
    num_classes: size of the classification head (from the dataset).
    input_shape: (frames, height, width, channels) of one clip (from the data config).
    variant: size, patch and tubelet length as a string, e.g. "B/16x2"; explicit dimensions override it.
    model: 'spatiotemporal', 'factorised_encoder', 'factorised_self_attention' or 'factorised_dot_product'
      (the paper's models 1-4; see the module docstring).
    embedding: 'tubelet' (tubelet_time x patch x patch, a 3-D convolution) or 'frames' (each frame with
      2-D patches: uniform frame sampling, with data.num_frames frames data.frame_stride apart).
    patch_size: side of the square patches; must divide the frame height and width.
    tubelet_time: frames per tubelet; must divide the clip length. Unused by 'frames'.
    width: token dimension.
    depth: encoder blocks (model 2: of the spatial encoder).
    mlp_dim: hidden size of each block's MLP.
    num_heads: attention heads; must divide width (and be even for model 4).
    temporal_depth: blocks of model 2's temporal encoder.
    attention_order: model 3's order within a block: 'time_space' or 'space_time'.
    pool: 'tok' (class token), 'gap' (average of the tokens) or 'attentive' (V-JEPA's attentive probe,
      AttentivePooler; not model 2); None: as the paper, 'tok' for models 1 and 2 (model 2 pools each time step
      and then the clip the same way), 'gap' for 3 and 4, which keep tokens on the time x space grid and so have no
      class token.
    pool_depth: the self-attention blocks of the 'attentive' pool before its query attends; None: 3 (V-JEPA 2's).
    pool_mlp_dim: the hidden size of the 'attentive' pool's MLPs; None: mlp_dim (V-JEPA 2's: 4 x width, whatever
      the encoder's).
    posemb: 'learn' (learned; spatio-temporal, or spatial and temporal for model 2), 'sincos' (fixed: 2-D
      sine-cosine over space plus 1-D over time), 'sincos_flat' (fixed: 1-D sine-cosine over the tokens' index,
      time-major, sines and cosines interleaved: VideoMAE's; not model 2) or 'none' (positions from model.rope).
    rope: rotary position embeddings in every block's self-attention (models/rope.py): None or 'vjepa2' (V-JEPA 2's
      over each tubelet's time, row and column index; model 1, softmax attention). A class token is not turned.
    posemb_resize: initialising from an image ViT of another patch grid, how its position embeddings are
      resampled over space: 'zoom' (scipy.ndimage.zoom, as the releases), 'bilinear' or 'bicubic' (as the ViT's).
    head_zero_init: start the classification head at zero.
    fc_norm: if set, a LayerNorm of this epsilon on the average-pooled tokens, in place of the last encoder's final
      LayerNorm on every token (VideoMAE's mean pooling: 1e-5, PyTorch's default); needs pool='gap'. None: none.
    tubelet_init: initialising from an image ViT (config.init_from), the tubelet kernel is the image kernel
      at the central time index and zero elsewhere ('central_frame') or the image kernel at every time
      index divided by tubelet_time ('inflate'). Either way a static clip embeds as its image does.
    temporal_attention_init: initialising model 3 from an image ViT, the temporal attention is the spatial
      one with a zero output projection, so each block starts as the image block ('zero'), or a copy of
      the spatial one ('copy'). Its LayerNorm is copied from the spatial one either way.
    encoder: the encoder options of every encoder, as keywords: layers.EncoderOptions. Drop path rises to its
      rate in each encoder. The attention kind applies to models 1 and 2: 'local' blocks of attention_window
      tubelets along time, height and width attend to their 3 x 3 x 3 neighbourhood (model 2: 3 x 3 blocks of each
      frame's patches, and 3 blocks of time steps). Models 3 and 4 already factorise attention over space and time
      and take only 'full'.
  """

  NO_DECAY = ('pos_embedding', 'cls', 'temporal_pos_embedding', 'temporal_cls')
  PRETRAINED = ('npz', 'run')

  def __init__(
    self,
    num_classes: int,
    input_shape: tuple[int, ...],
    *,
    variant: str | None = None,
    model: str = 'spatiotemporal',
    embedding: str = 'tubelet',
    patch_size: int | None = None,
    tubelet_time: int | None = None,
    width: int | None = None,
    depth: int | None = None,
    mlp_dim: int | None = None,
    num_heads: int | None = None,
    temporal_depth: int = 4,
    attention_order: str = 'time_space',
    pool: str | None = None,
    pool_depth: int | None = None,
    pool_mlp_dim: int | None = None,
    posemb: str | None = 'learn',
    rope: str | None = None,
    posemb_resize: str = 'zoom',
    head_zero_init: bool = True,
    fc_norm: float | None = None,
    tubelet_init: str = 'central_frame',
    temporal_attention_init: str = 'zero',
    rngs: nnx.Rngs,
    **encoder: Any,
  ):
    if len(input_shape) != 4:
      raise ConfigError(
        f'ViViT takes clips of shape (frames, height, width, channels), got {tuple(input_shape)}; '
        'use a video dataset, or model.name="vit" for images'
      )
    frames, height, wide, channels = input_shape
    self.input_shape = tuple(input_shape)
    posemb = 'none' if posemb is None else posemb  # The command line reads --config.model.posemb=none as None.
    pool = pool or ('tok' if model in MODELS[:2] else 'gap')
    layers.check_options(
      dict(
        model=(model, MODELS),
        embedding=(embedding, ('tubelet', 'frames')),
        posemb=(posemb, ('learn', 'sincos', 'sincos_flat', 'none')),
        posemb_resize=(posemb_resize, tuple(release.POSEMB_RESIZE)),
        pool=(
          pool,
          {MODELS[0]: ('tok', 'gap', 'attentive'), MODELS[1]: ('tok', 'gap')}.get(model, ('gap', 'attentive')),
        ),
        attention_order=(attention_order, ('time_space', 'space_time')),
        tubelet_init=(tubelet_init, ('central_frame', 'inflate')),
        temporal_attention_init=(temporal_attention_init, ('zero', 'copy')),
      ),
      {},
    )
    self.options = options = self.ENCODER.of(encoder)
    decoded = decode_variant(variant)
    variant_time = decoded.pop('tubelet_time', None)
    tubelet_time = None if embedding == 'frames' else tubelet_time or variant_time
    dims = layers.resolve_dims(
      decoded, dict(patch_size=patch_size, width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads), 'B/16x2'
    )
    layers.check_patch(dims['patch_size'], (height, wide))
    if embedding == 'tubelet' and (tubelet_time is None or tubelet_time < 1 or frames % tubelet_time):
      raise ConfigError(
        f'model.tubelet_time={tubelet_time} must be a positive divisor of the clip length '
        f'{frames} (data.num_frames); or use model.embedding="frames"'
      )
    if model == 'factorised_dot_product' and dims['num_heads'] % 2:
      raise ConfigError(
        f'model.num_heads={dims["num_heads"]} must be even: factorised_dot_product splits the '
        'heads between space and time'
      )
    if options.attention != 'full' and model not in MODELS[:2]:
      raise ConfigError(
        f"model.attention={options.attention!r} applies to models 'spatiotemporal' and 'factorised_encoder'; model "
        f"{model!r} already factorises attention over space and time: use model.attention='full'"
      )
    if temporal_depth < 1:
      raise ConfigError(f'model.temporal_depth={temporal_depth} must be positive')
    if posemb == 'sincos_flat' and model == 'factorised_encoder':
      raise ConfigError(
        "model.posemb='sincos_flat' numbers the tokens of one grid; model 'factorised_encoder' has two: use "
        "model.posemb='sincos' or 'learn'"
      )
    rotary_embeddings.check_kind(rope, rotary_embeddings.VIDEO_KINDS)
    if rope is not None and (model != 'spatiotemporal' or options.attention == 'linear'):
      raise ConfigError(
        f"model.rope={rope!r} turns the queries and keys of model 'spatiotemporal''s softmax attention over every "
        f'tubelet; this is model {model!r} with model.attention={options.attention!r}'
      )
    if rope is not None and dims['width'] // dims['num_heads'] < 6:
      raise ConfigError(
        f"model.rope={rope!r} turns three slices of each head's channels: the head width "
        f'{dims["width"] // dims["num_heads"]} must be at least 6 (model.width / model.num_heads)'
      )
    if posemb == 'none' and rope is None:
      raise ConfigError("model.posemb='none' leaves the tokens without positions: set model.rope, or another posemb")
    pool_depth = 3 if pool_depth is None else pool_depth
    if isinstance(pool_depth, bool) or not isinstance(pool_depth, int) or pool_depth < 0:
      raise ConfigError(f'model.pool_depth={pool_depth!r} must be a non-negative integer')
    if pool_mlp_dim is not None and (
      isinstance(pool_mlp_dim, bool) or not isinstance(pool_mlp_dim, int) or pool_mlp_dim < 1
    ):
      raise ConfigError(f'model.pool_mlp_dim={pool_mlp_dim!r} must be a positive integer or None (model.mlp_dim)')
    if fc_norm is not None and (isinstance(fc_norm, bool) or not isinstance(fc_norm, (int, float)) or fc_norm <= 0):
      raise ConfigError(f'model.fc_norm={fc_norm!r} must be a positive number (its LayerNorm epsilon) or None')
    if fc_norm is not None and pool != 'gap':
      raise ConfigError(f"model.fc_norm={fc_norm!r} normalises the average pool: it needs model.pool='gap'")
    p, d = dims['patch_size'], dims['width']
    self.model, self.pool, self.posemb_type, self.num_heads = model, pool, posemb, dims['num_heads']
    self.posemb_resize = posemb_resize
    self.space_grid = (height // p, wide // p)
    self.grid = (frames // (tubelet_time or 1), self.space_grid[0] * self.space_grid[1])  # (nt, ns)
    self.tubelet_init, self.temporal_attention_init = tubelet_init, temporal_attention_init
    # What a hub folder must agree on (transformers_layout.vivit_options); fc_norm's epsilon only computes.
    self.structure = dims | dict(
      model=model,
      embedding=embedding,
      tubelet_time=tubelet_time,
      pool=pool,
      posemb=posemb,
      fc_norm=fc_norm is not None,
      rope=rope,
    )
    pool_mlp_dim = pool_mlp_dim or dims['mlp_dim']
    if pool == 'attentive':
      self.structure |= dict(pool_depth=pool_depth, pool_mlp_dim=pool_mlp_dim)
    nt, ns = self.grid
    init = nnx.initializers.normal(0.02)

    def pattern(grid):
      return options.pattern(grid, num_global=int(pool == 'tok'))

    def learned(n):
      return nnx.Param(init(rngs.params(), (1, n, d))) if posemb == 'learn' else None

    def cls():
      return nnx.Param(jnp.zeros((1, 1, d))) if pool == 'tok' else None

    encoder = functools.partial(
      layers.Encoder,
      width=d,
      mlp_dim=dims['mlp_dim'],
      num_heads=dims['num_heads'],
      rngs=rngs,
      **options.stack(),
    )
    block = {
      'factorised_self_attention': functools.partial(
        FactorisedSelfAttentionBlock, grid=self.grid, time_first=attention_order == 'time_space'
      ),
      'factorised_dot_product': functools.partial(
        layers.EncoderBlock, attention=functools.partial(FactorisedDotProductAttention, grid=self.grid)
      ),
    }.get(model, layers.EncoderBlock)

    self.embedding = TubeletEmbedding(tubelet_time, p, channels, d, rngs=rngs)
    self.cls = cls()
    self.dropout = layers.Dropout(options.dropout)
    if model == 'factorised_encoder':
      self.pos_embedding = learned(ns + (pool == 'tok'))
      self.encoder = encoder(dims['depth'], pattern=pattern(self.space_grid))
      self.temporal_cls = cls()
      self.temporal_pos_embedding = learned(nt + (pool == 'tok'))
      self.temporal_encoder = encoder(temporal_depth, pattern=pattern((nt,)))
    else:
      self.pos_embedding = learned(nt * ns + (pool == 'tok'))
      self.encoder = encoder(dims['depth'], block=block, pattern=pattern((nt, *self.space_grid)))
    rotary = functools.partial(
      rotary_embeddings.Rope, temperature=10_000.0, axes='ij', ref_grid=None, offset=0.0, skip=int(pool == 'tok')
    )
    self.rope = (
      None
      if rope is None
      else rotary(rope, (nt, *self.space_grid), dims['depth'], self.num_heads, d // self.num_heads, rngs=rngs)
    )
    pooler = functools.partial(
      AttentivePooler,
      dropout=options.dropout,
      attention_dropout=options.attention_dropout,
      gelu_approximate=options.gelu_approximate,
      layernorm_epsilon=options.layernorm_epsilon,
      rngs=rngs,
    )
    self.pooler = pooler(d, pool_mlp_dim, self.num_heads, pool_depth) if pool == 'attentive' else None
    self.fc_norm = None if fc_norm is None else nnx.LayerNorm(d, epsilon=fc_norm, rngs=rngs)
    if fc_norm is not None:  # The pooled vector is normalised instead of each token.
      (self.temporal_encoder if model == 'factorised_encoder' else self.encoder).norm = None
    head_init = nnx.initializers.zeros if head_zero_init else nnx.initializers.lecun_normal()
    self.head = nnx.Linear(d, num_classes, kernel_init=head_init, rngs=rngs)

  def __call__(self, video: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    return self.head(self.features(video, train=train, rngs=rngs))

  def features(self, video: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """(B, width): the pooled representation the head classifies; what few-shot linear evaluation reads."""
    if self.model == 'factorised_encoder':
      x = self.embedding(self._checked(video))
      b, nt, ns, d = x.shape
      space, time = (layers.sincos_2d(*self.space_grid, d), layers.sincos_1d(nt, d)) if self.sincos else (None, None)
      x = self._encode(x.reshape(b * nt, ns, d), self.encoder, self.cls, self.pos_embedding, space, train, rngs)
      x = self._encode(
        x.reshape(b, nt, d), self.temporal_encoder, self.temporal_cls, self.temporal_pos_embedding, time, train, rngs
      )
    else:
      x = self.encode(video, train=train, rngs=rngs)
      if self.cls is not None:
        x = x[:, 0]
      else:
        x = x.mean(axis=1) if self.pooler is None else self.pooler(x, train=train, rngs=rngs)
    return self.fc_norm(x) if self.fc_norm is not None else x

  def _checked(self, video: jax.Array) -> jax.Array:
    """`video` if it is a batch of the model's clips; else a ValueError naming both shapes (not a broadcasting
    error deep inside)."""
    if video.ndim != 5 or tuple(video.shape[1:]) != self.input_shape:
      raise ValueError(f'this ViViT takes a batch of clips (B, *{self.input_shape}), got {tuple(video.shape)}')
    return video

  def encode(self, video: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """The encoder's output tokens (B, [1 +] nt * ns, D) of models 1, 3 and 4, before pooling (transformers'
    last_hidden_state)."""
    if self.model == 'factorised_encoder':
      raise ConfigError("ViViT.encode: model 'factorised_encoder' has two encoders, not one grid of output tokens")
    x = self.embedding(self._checked(video))
    b, nt, ns, d = x.shape
    fixed = None
    if self.sincos:
      fixed = (layers.sincos_2d(*self.space_grid, d)[None] + layers.sincos_1d(nt, d)[:, None]).reshape(nt * ns, d)
    if self.posemb_type == 'sincos_flat':
      fixed = sincos_flat(nt * ns, d)
    x = layers.add_positions(x.reshape(b, nt * ns, d), fixed=fixed, cls=self.cls, learned=self.pos_embedding)
    turn = {'rotary': self.rope()} if self.rope is not None else {}
    return self.encoder(self.dropout(x, train=train, rngs=rngs), train=train, rngs=rngs, **turn)

  @property
  def sincos(self) -> bool:
    return self.posemb_type == 'sincos'

  def _encode(self, x, encoder, cls, learned, fixed, train, rngs) -> jax.Array:
    """Model 2's tokens (B, N, D) -> one pooled vector per row: class token or average."""
    x = self.dropout(layers.add_positions(x, fixed=fixed, cls=cls, learned=learned), train=train, rngs=rngs)
    x = encoder(x, train=train, rngs=rngs)
    return x[:, 0] if cls is not None else x.mean(axis=1)

  # --- Initialisation from an image ViT ----------------------------------------------------------

  def load_pretrained(self, source: Any, params: dict) -> tuple[dict, list[str]]:
    """Weights for this model from an image ViT: a release .npz's flat dict, or our ViT's parameters (a pure
    nested dict, scanned or not); or from a transformers video classifier's hub folder (hub.HubWeights). `params`
    are this model's initial ones; what has no image counterpart (model 2's temporal encoder, the head for another
    class count) keeps them."""
    if isinstance(source, hub.HubWeights):
      return self._load_hub(source, params)
    if not any('/' in k for k in source):
      if 'embedding' not in source or np.ndim(source['embedding']['kernel']) != 4 or 'temporal_encoder' in source:
        raise ConfigError(
          'init_from: ViViT initialises from image ViT checkpoints (a release .npz or a ViT '
          'workdir); this checkpoint is not one'
        )
      source = release.to_release(source, self.num_heads)
    image_model = release.ImageModel(
      'tok' if self.cls is not None else 'gap',
      'learn' if self.posemb_type == 'learn' else 'sincos2d',
      self.num_heads,
      self.space_grid,
      self.posemb_resize,
    )
    unscanned = layers.unscanned(params)
    image, notes = release.from_release(source, image_model, self.image_params(unscanned))
    return layers.scanned_like(self.from_image(image, unscanned), params), notes

  @classmethod
  def pretrained_config(cls, model_config: Any, weights: hub.HubWeights) -> list[str]:
    """A transformers video classifier's shape into config.model: each size the config leaves unset (no variant, no
    value) and each of STRUCTURE it leaves at the constructor's default takes the folder's value; one set otherwise
    is one ConfigError line naming both values. The GELU form and LayerNorm epsilon take the folder's when left at
    their defaults. The clip's frames and size come from the data (learned positions resampled when they differ)."""
    if weights.layout not in hub.reads('ViViT'):
      return []  # checkpoints.check_init_from refuses it in one line.
    folder = hub.reader(weights.layout).vivit_options(weights.config, weights.tensors)
    preset = decode_variant(model_config.get('variant'))
    keys = tuple(k for k in (*SIZES, *STRUCTURE) if not (k in OPEN and folder[k] is None))
    return vit.fill_config(cls, model_config, weights.path, folder, preset, keys, ('fc_norm',))

  def _load_hub(self, weights: hub.HubWeights, params: dict) -> tuple[dict, list[str]]:
    """A transformers ViViT or VideoMAE folder: its shape must be this model's (one line naming the first key that
    differs); its class count and clip size may differ (head replaced; learned positions resampled)."""
    layout = hub.reader_of(weights, 'ViViT', 'ViViT')
    folder = layout.vivit_options(weights.config, weights.tensors)
    for key, mine in self.structure.items():
      theirs = folder[key] is not None if key == 'fc_norm' else folder[key]
      if theirs != mine and not (key in OPEN and theirs is None):
        mine = (self.fc_norm.epsilon if self.fc_norm is not None else None) if key == 'fc_norm' else mine
        raise ConfigError(
          f'init_from={weights.path!r} is a model with model.{key}={folder[key]!r}, this model has '
          f'model.{key}={mine!r}: set --config.model.{key}={folder[key]!r}'
        )
    notes = layout.notes(weights.config, weights.tensors)
    theirs = {key: folder[key] for key in FOLDER_OPTIONS} | {'fc_norm': folder['fc_norm']}
    mine = {key: getattr(self.options, key) for key in FOLDER_OPTIONS}
    mine['fc_norm'] = self.fc_norm.epsilon if self.fc_norm is not None else None
    if mine != theirs:
      notes.append(f"the folder's model computes with {theirs}; this model has {mine}: its outputs differ")
    flat, origin = layout.to_release(weights.tensors, self.num_heads)
    if self.pool == 'tok' and 'cls' not in flat:  # A V-JEPA 2 backbone: its tokens alone, no class token.
      raise ConfigError(
        f"init_from={weights.path!r} has no class token for model.pool='tok' to read: set --config.model.pool='gap' "
        "(the tokens' average) or 'attentive' (an attentive probe, trained anew)"
      )
    fc_norm = {k: flat.pop(f'fc_norm/{k}') for k in ('scale', 'bias') if f'fc_norm/{k}' in flat}
    if 'fc_norm' in params and not fc_norm:
      notes.append(f'fc_norm ({params["fc_norm"]["scale"].shape[0]},) initialised: the source has none')
    fc_norm = fc_norm or params.get('fc_norm')
    pos = 'Transformer/posembed_input/pos_embedding'
    if pos in flat and 'pos_embedding' in params and flat[pos].shape != params['pos_embedding'].shape:
      frames, height, wide, _ = folder['input_shape']
      p, t = folder['patch_size'], folder['tubelet_time']
      resized = self._resample_positions(flat[pos], (frames // t, height // p, wide // p))
      notes.append(
        f'position embeddings resampled {flat[pos].shape} -> {resized.shape}: over space by jax.image.resize '
        'bicubic, over time linear (antialiased when shrinking)'
      )
      flat[pos] = resized
    if 'pooler' in params and not any(k.startswith('pooler/') for k in flat):
      notes.append('the attentive pool initialised: the source has none (a backbone)')
      flat |= release.flatten({'pooler': params['pooler']})
    target = {k: v for k, v in params.items() if k != 'fc_norm'}
    loaded, adapted = release.from_release(flat, self, target, origin=origin)
    if fc_norm is not None:
      if np.shape(fc_norm['scale']) != np.shape(params['fc_norm']['scale']):
        raise ConfigError(
          f'init_from does not fit the model: mis-shaped: fc_norm {np.shape(fc_norm["scale"])} (model: '
          f'{np.shape(params["fc_norm"]["scale"])})'
        )
      loaded['fc_norm'] = fc_norm
    loaded, cast = hub.cast_like(loaded, params)
    return loaded, notes + cast + adapted

  def _resample_positions(self, pos: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
    """Learned positions (1, [1 +] nt * h * w, D) of the token grid `grid` (nt, h, w) -> this model's grid: each
    time step's bicubic over space, then linear over time (transformers' ViViT resamples only a square grid)."""
    rows = int(self.cls is not None)
    d = pos.shape[-1]
    x = np.asarray(pos[0, rows:], np.float32).reshape(*grid, d)
    x = jax.image.resize(x, (grid[0], *self.space_grid, d), 'bicubic', antialias=True)
    x = jax.image.resize(x, (self.grid[0], *self.space_grid, d), 'linear', antialias=True)
    x = np.asarray(x, pos.dtype).reshape(1, -1, d)
    return np.concatenate([pos[:, :rows], x], axis=1)

  def image_params(self, params: dict) -> dict:
    """The part of this model's parameters (a pure dict) an image ViT has, in the ViT's layout."""
    kernel = params['embedding']['kernel']
    blocks = {i: {k: b[k] for k in ('norm1', 'attn', 'norm2', 'mlp')} for i, b in params['encoder']['blocks'].items()}
    image = {
      'embedding': {
        'kernel': kernel[kernel.shape[0] // 2] if kernel.ndim == 5 else kernel,
        'bias': params['embedding']['bias'],
      },
      'head': params['head'],
      'encoder': params['encoder'] | {'blocks': blocks},
    }
    if 'cls' in params:
      image['cls'] = params['cls']
    if 'pos_embedding' in params:
      pos, rows = params['pos_embedding'], ('cls' in params) + self.grid[1]
      image['pos_embedding'] = pos if self.model == 'factorised_encoder' else pos[:, :rows]
    return image

  def from_image(self, image: dict, params: dict) -> dict:
    """Inverse of `image_params`: image ViT weights spread over time; the rest of `params` kept."""
    out = dict(params)
    kernel = np.asarray(image['embedding']['kernel'])
    if params['embedding']['kernel'].ndim == 5:
      t = params['embedding']['kernel'].shape[0]
      if self.tubelet_init == 'inflate':
        kernel = np.repeat(kernel[None] / t, t, axis=0)
      else:
        kernel = np.zeros((t, *kernel.shape), kernel.dtype)
        kernel[t // 2] = image['embedding']['kernel']
    out['embedding'] = {'kernel': kernel, 'bias': image['embedding']['bias']}
    out['head'] = image['head']
    blocks = {}
    for i, block in params['encoder']['blocks'].items():
      blocks[i] = block | image['encoder']['blocks'][i]
      if 'temporal_attn' in block:
        attn = jax.tree.map(np.asarray, image['encoder']['blocks'][i]['attn'])
        if self.temporal_attention_init == 'zero':
          attn['out'] = jax.tree.map(np.zeros_like, attn['out'])
        blocks[i] |= {'temporal_attn': attn, 'temporal_norm': image['encoder']['blocks'][i]['norm1']}
    out['encoder'] = image['encoder'] | {'blocks': blocks}
    if 'cls' in image:
      out['cls'] = image['cls']
    if 'pos_embedding' in image:
      pos = image['pos_embedding']
      if self.model != 'factorised_encoder':
        rows = 'cls' in params
        pos = np.concatenate([pos[:, :rows], np.tile(pos[:, rows:], (1, self.grid[0], 1))], axis=1)
      out['pos_embedding'] = pos
    return out
