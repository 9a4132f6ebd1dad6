"""Vision Transformer (Dosovitskiy et al. 2021), sized by variant strings such as "B/16"."""

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import vit_jax_lab.hub as hub
import vit_jax_lab.models.base as base
import vit_jax_lab.models.layers as layers
import vit_jax_lab.models.release as release
import vit_jax_lab.models.rope as rotary_embeddings
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


SIZES = ('patch_size', 'width', 'depth', 'mlp_dim', 'num_heads')
# The keys beside the sizes that a pretrained folder fixes (ViT.pretrained_config fills them when left at default).
STRUCTURE = (
  'pool',
  'class_token',
  'posemb',
  'posemb_prefix',
  'distilled',
  'reg_tokens',
  'layerscale',
  'norm_pre',
  'activation',
  'mlp',
  'mlp_norm',
  'rope',
  'rope_temperature',
  'rope_axes',
  'rope_ref_grid',
  'rope_offset',
  'fc_norm',
  'map_heads',
  'map_mlp_dim',
  'map_prefix',
)
# model.mlp: the encoder blocks' MLP.
MLPS = ('plain', 'swiglu')
# The encoder options a pretrained folder computes with (ViT.pretrained_config fills them when left at default).
FOLDER_OPTIONS = ('gelu_approximate', 'layernorm_epsilon')


def folder_options(weights: hub.HubWeights) -> dict[str, Any]:
  """The ViT keys of an image folder (its layout's `vit_options`), with the constructor's defaults for the
  STRUCTURE keys its layout never sets (a transformers folder has no rotary embedding)."""
  defaults = {k: p.default for k, p in inspect.signature(ViT.__init__).parameters.items() if k in STRUCTURE}
  return defaults | hub.reader(weights.layout).vit_options(weights.config, weights.tensors)


def folder_into_config(family: type[base.Model], model_config: Any, weights: hub.HubWeights, keys: tuple) -> list[str]:
  """A timm or transformers image folder's shape into config.model of `family` (the ViT, or a family whose backbone
  is one: the tracker), by `fill_config`. Returns the notes."""
  if weights.layout not in hub.reads('ViT'):
    return []  # checkpoints.check_init_from refuses it in one line.
  folder = folder_options(weights)
  preset = decode_variant(model_config.get('variant'))
  return fill_config(family, model_config, weights.path, folder, preset, (*SIZES, *keys), ('layerscale',))


def fill_config(
  family: type[base.Model],
  model_config: Any,
  path: str,
  folder: dict[str, Any],
  preset: dict[str, Any],
  keys: tuple[str, ...],
  presence: tuple[str, ...] = (),
) -> list[str]:
  """A folder's model keys (`folder`, from its layout's reader) into config.model of `family`: each of `keys` the
  config leaves unset (None, and no value from model.variant's `preset`) or at the constructor's default takes the
  folder's value; one set otherwise is one ConfigError line naming both values. Keys in `presence` compare by
  whether they are set (LayerScale, fc_norm: the weights hold their values). The GELU form and LayerNorm epsilon
  take the folder's when left at their defaults. Returns the notes."""
  defaults = {k: p.default for k, p in inspect.signature(family.__init__).parameters.items()}
  notes = []
  for key in keys:
    ours = model_config.get(key) if model_config.get(key) is not None else preset.get(key)
    same = (ours is None) == (folder[key] is None) if key in presence else ours == folder[key]
    if same:
      continue
    if ours is not None and ours != defaults.get(key):
      raise ConfigError(
        f'init_from={path!r} is a model with model.{key}={folder[key]!r}, the config sets '
        f'model.{key}={ours!r}{" (by model.variant)" if model_config.get(key) is None else ""}: set '
        f'--config.model.{key}={folder[key]!r}, or leave it to the folder'
      )
    model_config[key] = folder[key]
    notes.append(f'model.{key}={folder[key]!r} from the folder')
  encoder_defaults = {f.name: f.default for f in dataclasses.fields(family.ENCODER)}
  for key in FOLDER_OPTIONS:
    if model_config.get(key, encoder_defaults[key]) == encoder_defaults[key] != folder[key]:
      model_config[key] = folder[key]
      notes.append(f'model.{key}={folder[key]!r} from the folder')
  return notes


def check_mlp(mlp: str, activation: str) -> None:
  """model.mlp='swiglu' gates with SiLU: an activation set otherwise would be ignored, so it is one line."""
  if mlp == 'swiglu' and activation != 'gelu':
    raise ConfigError(
      f"model.mlp='swiglu' gates with SiLU and takes no model.activation, which is {activation!r}: leave it 'gelu'"
    )


class LayerScaleBlock(layers.EncoderBlock):
  """An encoder block whose two residual branches are scaled channel-wise by learned gammas `ls1`, `ls2` before
  they are added (LayerScale, Touvron et al. 2021 "Going deeper with image transformers"; DINOv2)."""

  def __init__(self, width: int, *args: Any, layerscale: float, **kwargs: Any):
    super().__init__(width, *args, **kwargs)
    self.ls1 = nnx.Param(jnp.full((width,), layerscale, jnp.float32))
    self.ls2 = nnx.Param(jnp.full((width,), layerscale, jnp.float32))

  def residual(self, x: jax.Array, norm: nnx.LayerNorm, fn: Any, **kwargs: Any) -> jax.Array:
    gamma = self.ls1 if norm is self.norm1 else self.ls2
    return super().residual(x, norm, lambda y: fn(y) * gamma[...], **kwargs)


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
    class_token: a learned class token before the other tokens; None: there is one when the pool reads it ('tok',
      'tok_gap'). True beside 'gap' or 'map': computed with, not read (timm's DINOv3 and EVA, global_pool='avg').
    pool: 'tok' classifies the class token, 'gap' the average of the patch tokens, 'map' the output of
      multi-head attention pooling, 'tok_gap' the class token and the patch tokens' average side by side (twice
      the width: transformers' Dinov2ForImageClassification, the DINOv2 linear probes).
    posemb: 'learn' (learned; with 'tok' it covers the class token too, as vision_transformer does),
      'sincos2d' (fixed) or 'none' (positions from model.rope alone).
    posemb_resize: how init_from resamples learned position embeddings to another patch grid: 'zoom'
      (scipy.ndimage.zoom, linear, corner-aligned: what vision_transformer and big_vision do, so fine-tuning
      a release reproduces theirs), 'bilinear' (jax.image.resize, half-pixel centres, antialiased when
      shrinking) or 'bicubic' (the same, bicubic: timm's resample_abs_pos_embed).
    representation_size: if set, a dense layer of this size with tanh before the head ("pre-logits").
    head_zero_init: start the classification head at zero (as the ViT paper fine-tunes).
    distilled: a distillation token after the class token, read by a second head `head_dist`; the logits are the
      mean of the two heads', the features the mean of the two tokens (DeiT's distilled models; pool 'tok').
    reg_tokens: this many learned register tokens after the class (and distillation) token, read by no head
      (Darcet et al. 2024; DINOv2 "reg4"); 'gap' and 'map' pool the patch tokens alone.
    posemb_prefix: learned position embeddings have rows for the tokens before the patches (class, distillation,
      register tokens), as vision_transformer and timm's default; False: for the patches only (timm's
      no_embed_class: DINOv2 with registers, DeiT III).
    layerscale: if set, LayerScale on both residual branches of every block, its gammas starting at this value
      (DINOv2: 1e-5); None: none.
    norm_pre: a LayerNorm on the tokens before the encoder (CLIP's image tower: timm's `norm_pre`, transformers'
      `pre_layrnorm`).
    activation: of the encoder's MLPs, 'gelu' (exact or approximate by gelu_approximate) or 'quick_gelu',
      x * sigmoid(1.702 x) (the original CLIP's).
    mlp: the encoder blocks' MLP: 'plain' (two dense layers, `activation` between them) or 'swiglu' (SwiGLU,
      Shazeer 2020: fc2(SiLU(gate(x)) * fc1(x)), gate and fc1 mlp_dim wide; DINOv2 giant's, timm's packed
      `mlp.fc1`, transformers' `mlp.weights_in`); 'swiglu' needs activation 'gelu', which it does not use.
    mlp_norm: a LayerNorm on each MLP's hidden activations before its last layer (EVA-02's sub-LN, timm's
      scale_mlp / scale_mlp_norm).
    rope: rotary position embeddings in every block's self-attention (models/rope.py): None, 'axial' (RoPE-ViT,
      timm's `vit_*_rope_*`), 'mixed' (learned frequencies per block and head: RoPE-Mixed) or 'dinov3'
      (DINOv3's); beside model.posemb or with posemb='none'. Not with model.attention='linear'.
    rope_temperature: the base of the rotary frequencies, temperature^(-k / n) (RoPE-ViT 100, RoPE-Mixed 10 at
      initialisation, timm's SBB ViTs 10000, DINOv3 100).
    rope_axes: which coordinate turns the first half of each head's channel pairs: 'xy' the column (RoPE-ViT),
      'ij' the row (timm's SBB ViTs, DINOv3).
    rope_ref_grid: 'axial' positions rescaled so that the model's grid spans this many patches per side (EVA's
      ref_feat_shape: a model fine-tuned at another size keeps its pre-training positions); None: patch indices.
    rope_offset: added to every patch index before the angles (timm's rope_grid_offset; Perception Encoder: 1):
      the class and register tokens, not turned, see the patches' absolute positions.
    fc_norm: with pool='gap', a LayerNorm on the pooled tokens in place of the encoder's final one (timm's
      fc_norm: its SBB and EVA ViTs).
    map_heads: the 'map' pool's attention heads; None: num_heads (Perception Encoder's pool has 8 of its own).
    map_mlp_dim: the 'map' pool's MLP width; None: mlp_dim.
    map_prefix: the 'map' pool attends over the class and register tokens too, not the patch tokens alone (timm's
      Eva: Perception Encoder).
    encoder: the encoder options, as keywords: layers.EncoderOptions (dropout, drop_path, attention kind, remat,
      scan, ...).
  """

  NO_DECAY = ('pos_embedding', 'cls', 'dist', 'reg', 'rope')  # rope: RoPE-Mixed's frequencies, as timm's.
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
    class_token: bool | None = None,
    posemb: str | None = 'learn',
    posemb_resize: str = 'zoom',
    representation_size: int | None = None,
    head_zero_init: bool = True,
    distilled: bool = False,
    reg_tokens: int = 0,
    posemb_prefix: bool = True,
    layerscale: float | None = None,
    norm_pre: bool = False,
    activation: str = 'gelu',
    mlp: str = 'plain',
    mlp_norm: bool = False,
    rope: str | None = None,
    rope_temperature: float = 100.0,
    rope_axes: str = 'xy',
    rope_ref_grid: int | None = None,
    rope_offset: float = 0.0,
    fc_norm: bool = False,
    map_heads: int | None = None,
    map_mlp_dim: int | None = None,
    map_prefix: bool = False,
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
    posemb = 'none' if posemb is None else posemb  # The command line reads --config.model.posemb=none as None.
    layers.check_patch(dims['patch_size'], (height, wide))
    layers.check_options(
      dict(
        pool=(pool, ('tok', 'gap', 'map', 'tok_gap')),
        posemb=(posemb, ('learn', 'sincos2d', 'none')),
        posemb_resize=(posemb_resize, tuple(release.POSEMB_RESIZE)),
        distilled=(distilled, (False, True)),
        posemb_prefix=(posemb_prefix, (True, False)),
        norm_pre=(norm_pre, (False, True)),
        activation=(activation, ('gelu', 'quick_gelu')),
        mlp=(mlp, MLPS),
        mlp_norm=(mlp_norm, (False, True)),
        fc_norm=(fc_norm, (False, True)),
        map_prefix=(map_prefix, (False, True)),
        class_token=(class_token, (None, False, True)),
      ),
      {},
    )
    check_mlp(mlp, activation)
    head_dim = dims['width'] // dims['num_heads']
    rotary_embeddings.check(rope, head_dim, rope_temperature, rope_axes, rope_ref_grid, rope_offset)
    if class_token is False and pool in ('tok', 'tok_gap'):
      raise ConfigError(f'model.class_token=False, but model.pool={pool!r} reads the class token: leave it None')
    for key, value in dict(
      map_heads=map_heads, map_mlp_dim=map_mlp_dim, representation_size=representation_size
    ).items():
      if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ConfigError(f'model.{key}={value!r} must be a positive integer or None')
    if (map_heads is not None or map_mlp_dim is not None or map_prefix) and pool != 'map':
      raise ConfigError(
        "model.map_heads, model.map_mlp_dim and model.map_prefix set the attention pool: they need model.pool='map'"
      )
    if fc_norm and pool != 'gap':
      raise ConfigError("model.fc_norm=True normalises the average pool: it needs model.pool='gap'")
    if distilled and (pool != 'tok' or representation_size is not None):
      raise ConfigError(
        "model.distilled=True needs model.pool='tok' and no model.representation_size: the two heads read the "
        'class and distillation tokens'
      )
    if not isinstance(reg_tokens, int) or isinstance(reg_tokens, bool) or reg_tokens < 0:
      raise ConfigError(f'model.reg_tokens={reg_tokens!r} must be a non-negative integer')
    if layerscale is not None and (isinstance(layerscale, bool) or not isinstance(layerscale, (int, float))):
      raise ConfigError(f"model.layerscale={layerscale!r} must be a number (the gammas' start) or None")
    self.options = options = self.ENCODER.of(encoder)
    if rope is not None and options.attention == 'linear':
      raise ConfigError(
        f"model.rope={rope!r} turns the queries and keys of softmax attention; model.attention='linear' "
        "(kernelised) has no such scores: use 'full', 'local' or 'sparse', or model.rope=None"
      )
    p, d = dims['patch_size'], dims['width']
    self.grid = (height // p, wide // p)
    self.input_shape = (height, wide, channels)
    self.num_heads = dims['num_heads']
    self.pool, self.posemb_type, self.posemb_resize = pool, posemb, posemb_resize
    self.distilled, self.posemb_prefix, self.map_prefix = distilled, posemb_prefix, map_prefix
    # The tokens before the patches, and how many of them the learned position embeddings cover.
    self.class_token = pool in ('tok', 'tok_gap') if class_token is None else class_token
    self.num_prefix = int(self.class_token) + int(distilled) + reg_tokens
    self.posemb_prefix_rows = self.num_prefix if posemb == 'learn' and posemb_prefix else 0
    # What a pretrained folder must agree on (timm_layout.vit_options): the rest is adapted or resampled.
    self.structure = dims | dict(
      pool=pool,
      class_token=None if self.class_token == (pool in ('tok', 'tok_gap')) else self.class_token,
      posemb=posemb,
      posemb_prefix=posemb_prefix or self.num_prefix == 0,
      distilled=distilled,
      reg_tokens=reg_tokens,
      layerscale=layerscale,
      norm_pre=norm_pre,
      activation=activation,
      mlp=mlp,
      mlp_norm=mlp_norm,
      rope=rope,
      rope_temperature=rope_temperature,
      rope_axes=rope_axes,
      rope_ref_grid=rope_ref_grid,
      rope_offset=rope_offset,
      fc_norm=fc_norm,
      map_heads=map_heads,
      map_mlp_dim=map_mlp_dim,
      map_prefix=map_prefix,
    )

    self.embedding = layers.PatchEmbedding(p, channels, d, rngs=rngs)
    if self.class_token:
      self.cls = nnx.Param(jnp.zeros((1, 1, d)))
    if distilled:
      self.dist = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, 1, d)))
    if reg_tokens:
      self.reg = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, reg_tokens, d)))
    if posemb == 'learn':
      num_tokens = self.grid[0] * self.grid[1] + self.posemb_prefix_rows
      self.pos_embedding = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, num_tokens, d)))
    self.dropout = layers.Dropout(options.dropout)
    if norm_pre:
      self.norm_pre = nnx.LayerNorm(d, epsilon=options.layernorm_epsilon, rngs=rngs)
    block = layers.EncoderBlock if layerscale is None else functools.partial(LayerScaleBlock, layerscale=layerscale)
    self.encoder = layers.Encoder(
      dims['depth'],
      d,
      dims['mlp_dim'],
      dims['num_heads'],
      pattern=options.pattern(self.grid, num_global=self.num_prefix),
      block=block,
      activation='swiglu' if mlp == 'swiglu' else activation,
      mlp_norm=mlp_norm,
      rngs=rngs,
      **options.stack(),
    )
    if rope is not None:
      self.rope = rotary_embeddings.Rope(
        rope,
        self.grid,
        dims['depth'],
        dims['num_heads'],
        d // dims['num_heads'],
        temperature=rope_temperature,
        axes=rope_axes,
        ref_grid=rope_ref_grid,
        offset=rope_offset,
        skip=self.num_prefix,
        rngs=rngs,
      )
    if fc_norm:  # The pooled vector is normalised instead of each token.
      self.encoder.norm = None
      self.fc_norm = nnx.LayerNorm(d, epsilon=options.layernorm_epsilon, rngs=rngs)
    if pool == 'map':
      self.map_head = layers.MAPHead(
        d,
        map_mlp_dim or dims['mlp_dim'],
        map_heads or dims['num_heads'],
        gelu_approximate=options.gelu_approximate,
        layernorm_epsilon=options.layernorm_epsilon,
        rngs=rngs,
      )
    self.representation_size = representation_size
    pooled = 2 * d if pool == 'tok_gap' else d
    if representation_size is not None:
      self.pre_logits = nnx.Linear(pooled, representation_size, rngs=rngs)
    head_init = nnx.initializers.zeros if head_zero_init else nnx.initializers.lecun_normal()
    self.head = nnx.Linear(representation_size or pooled, num_classes, kernel_init=head_init, rngs=rngs)
    if distilled:
      self.head_dist = nnx.Linear(d, num_classes, kernel_init=head_init, rngs=rngs)

  def tokens(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """Embedded patches with position embeddings, after the class, distillation and register tokens there are
    (normalised by norm_pre if the model has one)."""
    if images.ndim != 4 or tuple(images.shape[1:]) != self.input_shape:  # Else an error that names no size.
      raise ValueError(f'this ViT takes a batch of images (B, *{self.input_shape}), got {tuple(images.shape)}')
    x = self.embedding(images)
    if self.posemb_type == 'sincos2d':  # A float32 constant would promote bf16 tokens, and every layer after them.
      x = x + layers.sincos_2d(*self.grid, x.shape[-1]).astype(x.dtype)
    learned = self.pos_embedding[...] if self.posemb_type == 'learn' else None
    if learned is not None and not self.posemb_prefix_rows:
      x = x + learned
    prefix = [getattr(self, name, None) for name in ('cls', 'dist', 'reg')]
    prefix = [jnp.broadcast_to(t[...], (x.shape[0], *t.shape[1:])) for t in prefix if t is not None]
    if prefix:
      x = jnp.concatenate([*prefix, x], axis=1)
    if learned is not None and self.posemb_prefix_rows:
      x = x + learned
    x = self.dropout(x, train=train, rngs=rngs)
    return self.norm_pre(x) if hasattr(self, 'norm_pre') else x

  def __call__(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    if self.distilled:  # As timm's distilled DeiT outside distillation training: the two heads' mean.
      x = self.encode(self.tokens(images, train=train, rngs=rngs), train=train, rngs=rngs)
      return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2
    return self.head(self.features(images, train=train, rngs=rngs))

  def encode(self, tokens: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """The encoder over `tokens` (from `tokens`), with the model's rotary embeddings if it has them."""
    rotary = self.rope() if hasattr(self, 'rope') else None
    return self.encoder(tokens, train=train, rngs=rngs, **({'rotary': rotary} if rotary is not None else {}))

  def features(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """(B, width, 2 x width for 'tok_gap', or representation_size): the pooled representation the head
    classifies, after the pre-logits layer if there is one (big_vision's `pre_logits`); what few-shot linear
    evaluation reads. Distilled: the mean of the class and distillation tokens (timm's pre-logits)."""
    x = self.encode(self.tokens(images, train=train, rngs=rngs), train=train, rngs=rngs)

    def pooled(x):
      if self.distilled:
        return (x[:, 0] + x[:, 1]) / 2
      if self.pool == 'tok':
        return x[:, 0]
      if self.pool == 'gap':
        return x[:, self.num_prefix :].mean(axis=1)
      if self.pool == 'map':
        return self.map_head(x if self.map_prefix else x[:, self.num_prefix :])
      if self.pool == 'tok_gap':
        return jnp.concatenate([x[:, 0], x[:, self.num_prefix :].mean(axis=1)], axis=-1)
      raise KeyError(self.pool)

    x = pooled(x)
    if hasattr(self, 'fc_norm'):
      x = self.fc_norm(x)
    if self.representation_size is not None:
      x = jnp.tanh(self.pre_logits(x))
    return x

  def load_pretrained(self, source: Any, params: dict) -> tuple[dict, list[str]]:
    """Weights for this model from `source`: a release .npz's flat dict, another ViT's parameters (a pure nested
    dict) or a timm or transformers hub folder (hub.HubWeights). `params` are this model's initial ones (kept for
    a re-initialised head)."""
    if isinstance(source, hub.HubWeights):
      return self._load_hub(source, params)
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
  def pretrained_config(cls, model_config: Any, weights: hub.HubWeights) -> list[str]:
    """A timm or transformers folder's shape into config.model: each size the config leaves unset (no variant, no
    value) and each key it leaves at the constructor's default (pool, posemb, posemb_prefix, distilled, reg_tokens,
    layerscale, norm_pre, activation, mlp) takes the folder's value; a size or key set otherwise is one ConfigError line
    naming both values. The GELU form and LayerNorm epsilon take the folder's when left at their defaults."""
    return folder_into_config(cls, model_config, weights, STRUCTURE)

  def _load_hub(self, weights: hub.HubWeights, params: dict) -> tuple[dict, list[str]]:
    """A timm or transformers folder: its shape must be this model's (one line naming the first key that differs);
    its class count and image size may differ (head replaced, position embeddings resampled bicubic as the library
    does)."""
    layout = hub.reader_of(weights, 'ViT', 'ViT')
    folder = folder_options(weights)
    for key, mine in self.structure.items():
      if (folder[key] != mine) if key != 'layerscale' else ((folder[key] is None) != (mine is None)):
        raise ConfigError(
          f'init_from={weights.path!r} is a model with model.{key}={folder[key]!r}, this model has '
          f'model.{key}={mine!r}: set --config.model.{key}={folder[key]!r}'
        )
    notes = layout.notes(weights.config, weights.tensors)
    theirs = {key: folder[key] for key in FOLDER_OPTIONS}
    options = {key: getattr(self.options, key) for key in FOLDER_OPTIONS}
    if options != theirs:
      notes.append(f"the folder's model computes with {theirs}; this model has {options}: its outputs differ")
    flat, origin = layout.to_release(weights.tensors, self.num_heads)
    loaded, adapted = release.from_release(
      flat, self, params, posemb_resize=layout.posemb_resize(weights.config), origin=origin
    )
    loaded, cast = hub.cast_like(loaded, params)
    return loaded, notes + cast + adapted

  @classmethod
  def release_params(cls, params: dict, model_config: Any) -> dict:
    """`params` in the vision_transformer / big_vision .npz naming (what `tools.export` writes)."""
    return release.to_release(params, model_config.num_heads or decode_variant(model_config.variant)['num_heads'])

  def attention_maps(self, images: jax.Array) -> list[jax.Array]:
    """Every block's attention probabilities (batch, heads, tokens, tokens), in inference mode."""
    x, maps = self.tokens(images), []
    rotary = self.rope() if hasattr(self, 'rope') else None
    for i, block in enumerate(self.encoder.blocks):
      maps.append(block.attention_weights(x, layer=i, rotary=rotary))
      x = block(x, train=False, rngs=None, layer=i, rotary=rotary)
    return maps
