"""Tracking ViT with class and regression tokens (Di Nardo & Ciaramella 2023, ViTCRT), one-stream as OSTrack: one
encoder over [cls, reg, template patches, search patches]; the class token scores whether the target is in the
search crop, the regression token gives its box there."""

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import vit_jax_lab.hub as hub
import vit_jax_lab.models.attention as patterns
import vit_jax_lab.models.base as base
import vit_jax_lab.models.layers as layers
import vit_jax_lab.models.release as release
import vit_jax_lab.models.rope as rotary_embeddings
import vit_jax_lab.models.vit as vit
from vit_jax_lab.errors import ConfigError


def soft_argmax(probs: jax.Array, grid: tuple[int, int], margin: int) -> tuple[jax.Array, jax.Array]:
  """The expected (x, y) (each (B, K), crop units) of heat maps (B, gh + 2 margin, gw + 2 margin, K) over the cell
  centres of a `grid` over the crop, the `margin` cells on each side lying outside [0, 1]."""
  ys, xs = ((jnp.arange(n + 2 * margin) - margin + 0.5) / n for n in grid)
  px, py = probs.sum(1), probs.sum(2)  # (B, gw, K), (B, gh, K): marginals over rows and columns.
  return jnp.einsum('bwk,w->bk', px, xs), jnp.einsum('bhk,h->bk', py, ys)


class CornerHead(nnx.Module):
  """ViTCRT's token-attention box head: the regression token's dot product with every search patch feature
  weights those features; a small conv net turns the weighted grid into top-left and bottom-right heat maps,
  read out by soft-argmax. The maps extend `margin` cells past the grid on every side (zero features padded in,
  filled by the convolutions), so a corner at or past the crop's edge stays reachable: over cell centres alone a
  soft-argmax stops half a cell inside."""

  def __init__(self, width: int, channels: int, margin: int = 0, *, rngs: nnx.Rngs):
    self.margin = margin
    self.convs = nnx.List(
      [nnx.Conv(a, b, (3, 3), rngs=rngs) for a, b in ((width, channels), (channels, channels // 2))]
    )
    self.norms = nnx.List([nnx.LayerNorm(c, rngs=rngs) for c in (channels, channels // 2)])
    self.corners = nnx.Conv(channels // 2, 2, (1, 1), rngs=rngs)

  def __call__(self, reg: jax.Array, search: jax.Array, grid: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """(box (B, 4) as (x, y, w, h) in search-crop units, corner heat maps (B, gh + 2 margin, gw + 2 margin, 2) as
    probabilities)."""
    weights = jnp.einsum('bd,bnd->bn', reg, search) / jnp.sqrt(search.shape[-1])
    x = (search * jax.nn.sigmoid(weights)[..., None]).reshape(search.shape[0], *grid, -1)
    m = self.margin
    x = jnp.pad(x, ((0, 0), (m, m), (m, m), (0, 0)))
    for conv, norm in zip(self.convs, self.norms):
      x = jax.nn.gelu(norm(conv(x)))
    logits = self.corners(x)  # (B, gh + 2 m, gw + 2 m, 2)
    probs = jax.nn.softmax(logits.reshape(logits.shape[0], -1, 2), axis=1).reshape(logits.shape)
    xc, yc = soft_argmax(probs, grid, m)
    # Corners in either order make a box (sides >= 0), so GIoU stays defined from the first step.
    x1, x2, y1, y2 = xc.min(-1), xc.max(-1), yc.min(-1), yc.max(-1)
    return jnp.stack([x1, y1, x2 - x1, y2 - y1], -1), probs


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrackerOptions(layers.EncoderOptions):
  """The tracker's encoder options: always pre-norm, and no blocked attention (so no window keys)."""

  prenorm: bool = dataclasses.field(default=True, init=False)
  attention_window: int = dataclasses.field(default=1, init=False)
  attention_random_blocks: int = dataclasses.field(default=0, init=False)


class Tracker(base.Model):
  """(template (B, St, St, C), search (B, Ss, Ss, C)) -> (class logit (B,), box (B, 4) in search-crop units).

  Attributes:
    template_size: side of the template crop in pixels (from data.template_size).
    search_size: side of the search crop in pixels (from data.search_size).
    channels: image channels (from the dataset).
    variant: encoder size and patch as for the ViT, e.g. "Ti/16"; explicit dimensions below override it.
    patch_size: side of the square patches; must divide both crop sizes.
    width: token dimension.
    depth: number of encoder blocks.
    mlp_dim: hidden size of each block's MLP.
    num_heads: attention heads; must divide width.
    stem: how pixels become tokens: 'patch' (a linear projection of each patch, the ViT's) or 'conv' (stride-2
      3 x 3 convolutions, layers.ConvStem; patch_size a power of 2): a target at any offset within the patch grid
      gives more alike tokens, which matching the template needs (tracking digits, seed 0: MLP head 0.640
      against 0.584, corner head 0.726 against 0.711). init_from an image ViT needs 'patch'.
    box_head: 'mlp' (the regression token through a 3-layer MLP to sigmoid (cx, cy, w, h)) or 'corner' (ViTCRT's
      token-attention corner head, soft-argmax over the search patch grid).
    corner_channels: channels of the corner head's first convolution.
    corner_margin: cells the corner heat maps extend past the search grid on each side, so corners at the crop's
      edge or beyond can be predicted (0: cell centres only, the outermost half a cell inside the crop; the default
      only so that runs from before it load as they were trained).
    posemb_init: how the learned template and search position embeddings start: 'normal' (std 0.02, as the ViT's),
      'sincos2d' (the 2-D sine-cosine embedding of each grid, so positions differ from the first step; the template
      patches start as the search grid's top-left ones) or 'sincos2d_beside' (the same, the template's grid placed
      to the right of the search grid's, so no template patch starts as a search patch); init_from an image ViT
      replaces any of them.
    layerscale: if set, LayerScale on both residual branches of every block, its gammas starting at this value, as
      the ViT's model.layerscale (DINOv2's backbones have it); None: none.
    mlp: the encoder blocks' MLP, as the ViT's model.mlp: 'plain' or 'swiglu' (DINOv2 giant's).
    mlp_norm: a LayerNorm on each MLP's hidden activations, as the ViT's (EVA-02's sub-LN).
    posemb: 'learn' (the template and search position tables) or 'none' (positions from model.rope alone).
    rope: rotary position embeddings in every block, as the ViT's model.rope (None, 'axial', 'mixed', 'dinov3'),
      with rope_temperature, rope_axes, rope_offset as the ViT's; the class and regression tokens are not turned.
      The template's and the search crop's patches each span the same rotary extent, as position tables resampled to
      each grid span the image: rope_ref_grid patches per side ('axial', 'mixed'), None: the search grid's.
    encoder: the encoder options, as keywords: TrackerOptions (pre-norm; attention 'full' or 'linear', as
      'local' and 'sparse' need one patch grid and the tokens hold two).
  """

  NO_DECAY = ('template_pos', 'search_pos', 'cls', 'reg', 'rope')
  PRETRAINED = ('npz', 'run')
  ENCODER = TrackerOptions
  # The keys beside the sizes that an image folder fixes (pretrained_config).
  STRUCTURE = (
    'layerscale',
    'mlp',
    'mlp_norm',
    'posemb',
    'rope',
    'rope_temperature',
    'rope_axes',
    'rope_ref_grid',
    'rope_offset',
  )

  def __init__(
    self,
    template_size: int,
    search_size: int,
    channels: int,
    *,
    variant: str | None = None,
    patch_size: int | None = None,
    width: int | None = None,
    depth: int | None = None,
    mlp_dim: int | None = None,
    num_heads: int | None = None,
    stem: str = 'patch',
    box_head: str = 'mlp',
    corner_channels: int = 64,
    corner_margin: int = 0,
    posemb_init: str = 'normal',
    layerscale: float | None = None,
    mlp: str = 'plain',
    mlp_norm: bool = False,
    posemb: str | None = 'learn',
    rope: str | None = None,
    rope_temperature: float = 100.0,
    rope_axes: str = 'xy',
    rope_ref_grid: int | None = None,
    rope_offset: float = 0.0,
    rngs: nnx.Rngs,
    **encoder: Any,
  ):
    posemb = 'none' if posemb is None else posemb  # The command line reads --config.model.posemb=none as None.
    dims = layers.resolve_dims(
      vit.decode_variant(variant),
      dict(patch_size=patch_size, width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads),
      'Ti/16',
    )
    p, d = dims['patch_size'], dims['width']
    for size in (template_size, search_size):
      layers.check_patch(p, (size, size))
    layers.check_options(
      dict(
        stem=(stem, ('patch', 'conv')),
        box_head=(box_head, ('mlp', 'corner')),
        posemb_init=(posemb_init, ('normal', 'sincos2d', 'sincos2d_beside')),
        mlp=(mlp, vit.MLPS),
        posemb=(posemb, ('learn', 'none')),
      ),
      {},
    )
    head_dim = dims['width'] // dims['num_heads']
    rotary_embeddings.check(rope, head_dim, rope_temperature, rope_axes, rope_ref_grid, rope_offset)
    if posemb == 'none' and rope is None:
      raise ConfigError("model.posemb='none' leaves the patches without positions: set model.rope, or posemb='learn'")
    if layerscale is not None and (isinstance(layerscale, bool) or not isinstance(layerscale, (int, float))):
      raise ConfigError(f"model.layerscale={layerscale!r} must be a number (the gammas' start) or None")
    self.options = options = self.ENCODER.of(encoder)
    unblocked = tuple(k for k, kind in patterns.KINDS.items() if not kind.blocked)
    layers.check_options(dict(attention=(options.attention, unblocked)), {})
    if rope is not None and options.attention == 'linear':
      raise ConfigError(
        f"model.rope={rope!r} turns the queries and keys of softmax attention; model.attention='linear' has no such "
        "scores: use 'full', or model.rope=None"
      )
    if corner_margin < 0:
      raise ConfigError(f'model.corner_margin={corner_margin} must be >= 0 (cells past the search grid)')
    if corner_channels < 2:  # Its second convolution has corner_channels // 2.
      raise ConfigError(f'model.corner_channels={corner_channels} must be an integer >= 2')
    self.template_grid, self.search_grid = (template_size // p,) * 2, (search_size // p,) * 2
    self.search_start = 2 + self.template_grid[0] * self.template_grid[1]  # Token index of the first search patch.
    self.num_heads = dims['num_heads']
    rotary = dict(
      rope=rope,
      rope_temperature=rope_temperature,
      rope_axes=rope_axes,
      rope_ref_grid=rope_ref_grid,
      rope_offset=rope_offset,
    )
    # What an image folder must agree on.
    self.structure = dims | dict(layerscale=layerscale, mlp=mlp, mlp_norm=mlp_norm, posemb=posemb) | rotary
    self.box_head_kind = box_head
    self.stem = stem
    self.embedding = (layers.ConvStem if stem == 'conv' else layers.PatchEmbedding)(p, channels, d, rngs=rngs)
    normal = nnx.initializers.normal(0.02)
    self.cls = nnx.Param(jnp.zeros((1, 1, d)))
    self.reg = nnx.Param(normal(rngs.params(), (1, 1, d)))
    (th, tw), (sh, sw) = self.template_grid, self.search_grid
    if posemb_init == 'normal':
      template_pos, search_pos = (normal(rngs.params(), (1, h * w, d)) for h, w in ((th, tw), (sh, sw)))
    else:  # The template's grid starts `left` columns right of the search grid's first.
      left = sw if posemb_init == 'sincos2d_beside' else 0
      template_pos = layers.sincos_2d(th, left + tw, d).reshape(th, left + tw, d)[:, left:].reshape(1, th * tw, d)
      search_pos = layers.sincos_2d(sh, sw, d)[None]
    self.template_pos = nnx.Param(jnp.asarray(template_pos)) if posemb == 'learn' else None
    self.search_pos = nnx.Param(jnp.asarray(search_pos)) if posemb == 'learn' else None
    rotary_module = functools.partial(rotary_embeddings.Rope, grids=(self.template_grid, self.search_grid))
    self.rope = (
      None
      if rope is None
      else rotary_module(
        rope,
        self.search_grid,
        dims['depth'],
        dims['num_heads'],
        head_dim,
        temperature=rope_temperature,
        axes=rope_axes,
        ref_grid=rope_ref_grid or self.search_grid[0],
        offset=rope_offset,
        skip=2,
        rngs=rngs,
      )
    )
    self.dropout = layers.Dropout(options.dropout)
    self.encoder = layers.Encoder(
      dims['depth'],
      d,
      dims['mlp_dim'],
      dims['num_heads'],
      pattern=options.pattern(grid=None, num_global=2),
      block=layers.EncoderBlock
      if layerscale is None
      else functools.partial(vit.LayerScaleBlock, layerscale=layerscale),
      activation='swiglu' if mlp == 'swiglu' else 'gelu',
      mlp_norm=mlp_norm,
      rngs=rngs,
      **options.stack(),
    )
    self.class_head = nnx.Linear(d, 1, kernel_init=nnx.initializers.zeros, rngs=rngs)
    if box_head == 'mlp':
      self.box_mlp = nnx.List([nnx.Linear(d, d, rngs=rngs), nnx.Linear(d, d, rngs=rngs), nnx.Linear(d, 4, rngs=rngs)])
    else:
      self.corner_head = CornerHead(d, corner_channels, corner_margin, rngs=rngs)

  def tokens(
    self, template: jax.Array, search: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None
  ) -> jax.Array:
    """The encoder's input (B, 2 + template patches + search patches, width): cls, reg, then the patches."""
    t, s = self.embedding(template), self.embedding(search)
    if self.template_pos is not None:
      t, s = t + self.template_pos, s + self.search_pos
    learned = jnp.broadcast_to(jnp.concatenate([self.cls, self.reg], 1), (t.shape[0], 2, t.shape[-1]))
    return self.dropout(jnp.concatenate([learned.astype(t.dtype), t, s], 1), train=train, rngs=rngs)

  def features(
    self, template: jax.Array, search: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None
  ) -> jax.Array:
    """The encoder's output tokens, in the order of `tokens`."""
    x = self.tokens(template, search, train=train, rngs=rngs)
    return self.encoder(x, train=train, rngs=rngs, **self._rotary())

  def _rotary(self) -> dict[str, Any]:
    """The blocks' `rotary` keyword: only where there is a rotary embedding."""
    return {'rotary': self.rope()} if self.rope is not None else {}

  def _entering(
    self, template: jax.Array, search: jax.Array, layer: int, *, train: bool = False, rngs: nnx.Rngs | None = None
  ) -> tuple[jax.Array, nnx.Module, int]:
    """(the tokens entering block `layer`, that block, its index from 0). Unscanned layers only."""
    if self.encoder.scan:
      raise ConfigError("the tracker's attention maps need model.scan=False (scanned blocks give no attention)")
    layer = layer % len(self.encoder.blocks)
    x = self.tokens(template, search, train=train, rngs=rngs)
    x = self.encoder.through(x, layer, train=train, rngs=rngs, **self._rotary())
    return x, self.encoder.blocks[layer], layer

  def search_attention(self, template: jax.Array, search: jax.Array, layer: int = -1) -> tuple[jax.Array, jax.Array]:
    """The class and regression tokens' attention over the search patches in block `layer`, heads averaged:
    two (B, gh, gw) maps (what the tracking-ViT paper draws). Unscanned layers only."""
    x, block, layer = self._entering(template, search, layer)
    weights = block.attention_weights(x, layer=layer, **self._rotary()).mean(1)  # (B, tokens, tokens)
    cls, reg = (weights[:, row, self.search_start :].reshape(-1, *self.search_grid) for row in (0, 1))
    return cls, reg

  def with_attention(
    self, template: jax.Array, search: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`__call__`'s (logit, box) and the regression token's attention over the search patches in the last block
    (B, heads, gh * gw), which task.attention_weight supervises. Unscanned layers only."""
    x, block, last = self._entering(template, search, -1, train=train, rngs=rngs)
    rotary = self._rotary()
    attention = block.attention_weights(x, layer=last, **rotary)[:, :, 1, self.search_start :]
    x = self.encoder.norm(block(x, train=train, rngs=rngs, layer=last, **rotary))
    return *self.heads(x), attention

  def __call__(
    self, template: jax.Array, search: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None
  ) -> tuple[jax.Array, jax.Array]:
    return self.heads(self.features(template, search, train=train, rngs=rngs))

  def heads(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(class logit (B,), box (B, 4) as (x, y, w, h) in search-crop units) from the encoder's output tokens."""
    logit = self.class_head(x[:, 0])[:, 0]
    reg, search_tokens = x[:, 1], x[:, self.search_start :]
    if self.box_head_kind == 'mlp':
      y = reg
      for i, dense in enumerate(self.box_mlp):
        y = dense(y) if i == len(self.box_mlp) - 1 else jax.nn.relu(dense(y))
      cx, cy, w, h = jnp.unstack(jax.nn.sigmoid(y), axis=-1)
      return logit, jnp.stack([cx - w / 2, cy - h / 2, w, h], -1)
    return logit, self.corner_head(reg, search_tokens, self.search_grid)[0]

  @classmethod
  def pretrained_config(cls, model_config: Any, weights: hub.HubWeights) -> list[str]:
    """A timm or transformers image folder's backbone shape into config.model, as the ViT's (vit.folder_into_config:
    sizes, layerscale, mlp, the GELU form and LayerNorm epsilon); what the tracker cannot be is one line first."""
    if weights.layout in hub.reads('Tracker'):
      _refuse_image_folder(weights, vit.folder_options(weights))
    return vit.folder_into_config(cls, model_config, weights, cls.STRUCTURE)

  def load_pretrained(self, source: Any, params: dict) -> tuple[dict, list[str]]:
    """Weights from an image ViT (a release .npz's flat dict, our ViT's parameters, or a timm or transformers image
    folder, hub.HubWeights): the patch embedding and the encoder copied, its position embeddings resampled to the
    template grid and to the search grid separately (scipy zoom, as the releases resample; a folder: its library's
    own, as the ViT resamples it); cls, reg and both heads keep their initialisation. Or another tracker's weights,
    all of them (a run scored on another benchmark, or trained further)."""
    if isinstance(source, hub.HubWeights):
      return self._load_hub(source, params)
    if 'class_head' in source:
      mismatch = layers.first_mismatch(layers.unscanned(source), layers.unscanned(params), ('run', 'configured'))
      if mismatch:
        raise ConfigError(
          f'init_from: this tracker run differs from the configured tracker (first at {mismatch}): give the '
          'model.* of the run'
        )
      return layers.scanned_like(layers.unscanned(source), params), ['every weight from the tracker run']
    if self.stem != 'patch':
      raise ConfigError(
        f"init_from: an image ViT's patch embedding fits model.stem='patch' only, and this tracker's is "
        f"{self.stem!r}: set model.stem='patch'"
      )
    if self.rope is not None or self.template_pos is None:
      raise ConfigError(
        'init_from: a release .npz or a ViT run goes into a tracker with learned positions and no model.rope; for a '
        'rotary ViT run, write it as a timm folder (tools.export --layout timm) and give that folder'
      )
    if not any('/' in k for k in source):
      if 'embedding' not in source or np.ndim(source['embedding']['kernel']) != 4 or 'pos_embedding' not in source:
        raise ConfigError(
          'init_from: the tracker initialises from image ViTs with learned position embeddings (a release .npz or '
          'a ViT workdir); this checkpoint is not one'
        )
      source = release.to_release(source, self.num_heads)
    pos_key = 'Transformer/posembed_input/pos_embedding'
    if pos_key not in source and 'pos_embedding' not in source:
      raise ConfigError('init_from: this checkpoint has no position embeddings to resample for the tracker')
    has_cls = 'cls' in source
    rows = np.shape(source.get(pos_key, source.get('pos_embedding')))[1]
    side = math.isqrt(rows - (has_cls and pos_key in source))
    image = release.ImageModel('tok' if has_cls else 'gap', 'learn', self.num_heads, (side, side))
    unscanned = layers.unscanned(params)
    width = unscanned['embedding']['bias'].shape[0]
    target = {
      'embedding': unscanned['embedding'],
      'encoder': unscanned['encoder'],
      'pos_embedding': np.zeros((1, side * side + has_cls, width), np.float32),
    }
    if 'head/kernel' in source:
      target['head'] = {'kernel': np.zeros_like(source['head/kernel']), 'bias': np.zeros_like(source['head/bias'])}
    if has_cls:
      target['cls'] = np.zeros((1, 1, width), np.float32)
    loaded, notes = release.from_release(source, image, target)
    grid_pos = loaded['pos_embedding'][:, int(has_cls) :]
    template_pos, search_pos = (
      release.resample_posemb(grid_pos, grid, class_token_row=False) for grid in (self.template_grid, self.search_grid)
    )
    notes.append(
      f'position embeddings {side} x {side} resampled to the template grid {self.template_grid} and the search grid '
      f'{self.search_grid} (scipy.ndimage.zoom, linear)'
    )
    notes.append('cls, reg, the class head and the box head start fresh')
    out = unscanned | {
      'embedding': loaded['embedding'],
      'encoder': loaded['encoder'],
      'template_pos': template_pos,
      'search_pos': search_pos,
    }
    return layers.scanned_like(out, params), notes

  def _load_hub(self, weights: hub.HubWeights, params: dict) -> tuple[dict, list[str]]:
    """An image folder read by the ViT's own loader (vit.ViT._load_hub: its layout readers, its checks and casts)
    into an image ViT of the folder's shape, built abstractly (no weights of its own are made: its parameters are
    zero-sized views, and the folder's tensors views of the mapped files); its patch embedding and encoder taken,
    its patch position embeddings resampled to the template and search grids."""
    path = weights.path
    layout = hub.reader_of(weights, 'Tracker', 'tracker')
    folder = vit.folder_options(weights)
    _refuse_image_folder(weights, folder)
    if self.stem != 'patch':
      raise ConfigError(
        f"init_from: an image ViT's patch embedding fits model.stem='patch' only, and this tracker's is "
        f"{self.stem!r}: set model.stem='patch'"
      )
    for key, mine in self.structure.items():
      if key == 'rope_ref_grid':  # An extent, not a shape: noted below.
        continue
      if (folder[key] != mine) if key != 'layerscale' else ((folder[key] is None) != (mine is None)):
        raise ConfigError(
          f'init_from={path!r} is a model with model.{key}={folder[key]!r}, this tracker has model.{key}={mine!r}: '
          f'set --config.model.{key}={folder[key]!r}'
        )
    num_classes, input_shape = folder.pop('num_classes'), folder.pop('input_shape')
    folder |= {key: getattr(self.options, key) for key in vit.FOLDER_OPTIONS}  # Its loader notes a difference.
    image = nnx.eval_shape(lambda: vit.ViT(max(num_classes, 1), input_shape, rngs=nnx.Rngs(0), **folder))
    abstract = nnx.state(image, nnx.Param).to_pure_dict()
    target = jax.tree.map(lambda a: np.broadcast_to(np.zeros((), a.dtype), a.shape), abstract)
    loaded, image_notes = image.load_pretrained(weights, target)
    ours = layers.unscanned(params)
    theirs, mine = (np.shape(p['embedding']['kernel'])[2] for p in (loaded, ours))
    if theirs != mine:
      raise ConfigError(
        f"init_from={path!r} is a model of {theirs}-channel images, and this tracker's have {mine} channels: start "
        'it from a folder of the same channels'
      )
    notes = [n for n in image_notes if not n.startswith(('head', 'class token'))]
    out = {'embedding': loaded['embedding'], 'encoder': loaded['encoder']}
    if 'fc_norm' in loaded:  # The folder normalises its pooled tokens; the tracker's heads read tokens.
      out['encoder'] = out['encoder'] | {'norm': loaded['fc_norm']}
      notes.append("the image model's fc_norm (after its mean pool) is the encoder's final LayerNorm, on every token")
    mismatch = layers.first_mismatch(out['encoder'], ours['encoder'], ('image ViT', 'tracker'))
    assert mismatch is None, mismatch  # The structure check above makes them alike.
    if self.template_pos is not None:
      grid_pos = loaded['pos_embedding'][:, image.posemb_prefix_rows :]
      method, how = layout.posemb_resize(weights.config)
      out['template_pos'], out['search_pos'] = (
        release.resample_posemb(grid_pos, grid, class_token_row=False, method=method)
        for grid in (self.template_grid, self.search_grid)
      )
      notes.append(
        f'position embeddings {image.grid[0]} x {image.grid[1]} resampled to the template grid {self.template_grid} '
        f'and the search grid {self.search_grid} by {how} ({release.POSEMB_RESIZE[method]})'
      )
    if self.rope is not None:
      if 'rope' in loaded:
        out['rope'] = loaded['rope']
      extent = (
        'the [-1, 1] of' if self.rope.kind == 'dinov3' else f'{self.rope.ref_grid} x {self.rope.ref_grid} patches:'
      )
      theirs = folder['rope_ref_grid'] or image.grid[0]
      notes.append(
        f'rotary positions: the template grid {self.template_grid} and the search grid {self.search_grid} each span '
        f'{extent} the image model spans {theirs} x {theirs}'
      )
    taken = {'embedding', 'encoder', 'pos_embedding', 'rope', 'fc_norm'}
    left = [_IMAGE_PARTS.get(k, k) for k in sorted(set(loaded) - taken)]
    notes.append(f"the image model's {', '.join(left)} left out: cls, reg, the class head and the box head start fresh")
    return layers.scanned_like(ours | out, params), notes


# An image ViT's parameters the tracker leaves out, as its notes name them.
_IMAGE_PARTS = {
  'cls': 'class token',
  'dist': 'distillation token',
  'reg': 'register tokens',
  'head_dist': 'distillation head',
  'map_head': 'attention-pooling head',
  'pre_logits': 'pre-logits layer',
}


def _refuse_image_folder(weights: hub.HubWeights, folder: dict[str, Any]) -> None:
  """What of an image folder the tracker has no place for, in one line: a LayerNorm before the encoder or quick-GELU
  (CLIP's image towers, Perception Encoder), fixed sine-cosine positions."""
  what = (
    "a LayerNorm before the encoder (model.norm_pre: CLIP's, Perception Encoder's)"
    if folder['norm_pre']
    else "CLIP's quick-GELU (model.activation='quick_gelu')"
    if folder['activation'] != 'gelu'
    else 'fixed sine-cosine position embeddings'
    if folder['posemb'] == 'sincos2d'
    else None
  )
  if what:
    raise ConfigError(
      f'init_from={weights.path!r} is an image model with {what}, which the tracker has no place for: start it from '
      'a ViT, DeiT, MAE, DINOv2, DINOv3, SigLIP, EVA-02 or RoPE ViT folder'
    )
