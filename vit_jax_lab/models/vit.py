"""Vision Transformer (Dosovitskiy et al. 2021), sized by variant strings such as "B/16", and the
mapping to and from the published checkpoints' parameter names."""

import math

import jax
import jax.numpy as jnp
import numpy as np
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

# The released checkpoints (google-research/vision_transformer and big_vision) were trained with
# flax.linen's defaults: tanh-approximate GELU and LayerNorm epsilon 1e-6.
RELEASE_OPTIONS = dict(gelu_approximate=True, layernorm_epsilon=1e-6)


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


def resolve_dims(decoded: dict[str, int], given: dict[str, int | None], image_size: tuple[int, int],
                 example: str) -> dict[str, int]:
  """The variant's dimensions with the explicitly given ones on top, checked against the image size."""
  dims = decoded | {k: v for k, v in given.items() if v is not None}
  missing = [k for k in given if k not in dims]
  if missing:
    raise ConfigError(f'model.{missing[0]} is not set: give model.variant (e.g. "{example}") or model.{missing[0]}')
  p = dims['patch_size']
  if image_size[0] % p or image_size[1] % p:
    raise ConfigError(f'model.patch_size={p} must divide the image size {image_size[0]}x{image_size[1]}: '
                      'change model.patch_size or data.image_size')
  if dims['width'] % dims['num_heads']:
    raise ConfigError(f'model.width={dims["width"]} must be divisible by model.num_heads={dims["num_heads"]}')
  return dims


ATTENTION_IMPLS = (None, 'xla', 'cudnn')


def check_options(choices: dict[str, tuple[str, tuple[str, ...]]], rates: dict[str, float]) -> None:
  """`choices`: key -> (value, valid values); `rates`: key -> a dropout-like rate in [0, 1)."""
  for key, (value, valid) in choices.items():
    if value not in valid:
      raise ConfigError(f'model.{key}={value!r} is not one of {", ".join(map(repr, valid))}')
  if choices.get('attention_impl', (None,))[0] == 'cudnn' and jax.default_backend() != 'gpu':
    raise ConfigError(f"model.attention_impl='cudnn' needs an NVIDIA GPU (backend: {jax.default_backend()}); "
                      "use None or 'xla'")
  for key, rate in rates.items():
    if not 0.0 <= rate < 1.0:
      raise ConfigError(f'model.{key}={rate} must be in [0, 1)')


class PatchEmbedding(nnx.Module):
  """Non-overlapping p x p patches -> tokens: a strided convolution, computed as one matmul."""

  def __init__(self, patch_size: int, channels: int, width: int, *, rngs: nnx.Rngs):
    self.patch_size = patch_size
    self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (patch_size, patch_size, channels, width)))
    self.bias = nnx.Param(jnp.zeros((width,)))

  def __call__(self, images: jax.Array) -> jax.Array:
    b, h, w, c = images.shape
    p = self.patch_size
    patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, p * p * c)
    kernel = self.kernel[...]
    return patches @ kernel.reshape(-1, kernel.shape[-1]) + self.bias[...]


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
    pool: 'tok' classifies the class token, 'gap' the average of the patch tokens, 'map' the output of
      multi-head attention pooling.
    posemb: 'learn' (learned; with 'tok' it covers the class token too, as vision_transformer does) or
      'sincos2d' (fixed).
    prenorm: LayerNorm before each residual branch (ViT) or after the residual sum (original Transformer).
    representation_size: if set, a dense layer of this size with tanh before the head ("pre-logits").
    dropout: dropout rate after the embedding, in the MLP and on each residual branch.
    attention_dropout: dropout rate on the attention probabilities.
    drop_path: stochastic-depth rate of the last block (rising linearly from 0 in the first).
    gelu_approximate: tanh-approximate GELU, as in the released checkpoints; False is the exact one.
    layernorm_epsilon: epsilon of every LayerNorm.
    head_zero_init: start the classification head at zero (as the ViT paper fine-tunes).
    remat: rematerialisation policy of every block: 'none', 'full', 'dots' or 'dots_no_batch'
      (layers.REMAT_POLICIES): less activation memory for recomputation in the backward pass.
    scan: stack the blocks' parameters on a leading layer axis and apply them with one `lax.scan`, so
      compile time does not grow with depth. Checkpoints and releases load into either layout.
    attention_impl: `jax.nn.dot_product_attention`'s implementation: None (JAX picks), 'xla', or 'cudnn'
      (fused flash attention; NVIDIA GPUs with compute_dtype='bfloat16').
  """

  def __init__(self, num_classes: int, input_shape: tuple[int, ...], *, variant: str | None = None,
               patch_size: int | None = None, width: int | None = None, depth: int | None = None,
               mlp_dim: int | None = None, num_heads: int | None = None, pool: str = 'tok',
               posemb: str = 'learn', prenorm: bool = True, representation_size: int | None = None,
               dropout: float = 0.0, attention_dropout: float = 0.0, drop_path: float = 0.0,
               gelu_approximate: bool = False, layernorm_epsilon: float = 1e-6, head_zero_init: bool = True,
               remat: str = 'none', scan: bool = False, attention_impl: str | None = None, rngs: nnx.Rngs):
    remat = remat or 'none'  # The command line reads --config.model.remat=none as None.
    if len(input_shape) != 3:
      raise ConfigError(f'ViT takes images of shape (height, width, channels), got {tuple(input_shape)}; '
                        'use a video model (model.name="vivit") for clips')
    height, wide, channels = input_shape
    dims = resolve_dims(decode_variant(variant), dict(patch_size=patch_size, width=width, depth=depth,
                                                      mlp_dim=mlp_dim, num_heads=num_heads), (height, wide), 'Ti/16')
    check_options(dict(pool=(pool, ('tok', 'gap', 'map')), posemb=(posemb, ('learn', 'sincos2d')),
                       remat=(remat, tuple(layers.REMAT_POLICIES)), attention_impl=(attention_impl, ATTENTION_IMPLS)),
                  dict(dropout=dropout, attention_dropout=attention_dropout, drop_path=drop_path))
    p, d = dims['patch_size'], dims['width']
    self.grid = (height // p, wide // p)
    self.num_heads = dims['num_heads']
    self.gelu_approximate, self.layernorm_epsilon = gelu_approximate, layernorm_epsilon
    self.pool, self.posemb_type = pool, posemb
    norm_kwargs = dict(gelu_approximate=gelu_approximate, layernorm_epsilon=layernorm_epsilon)

    self.embedding = PatchEmbedding(p, channels, d, rngs=rngs)
    if pool == 'tok':
      self.cls = nnx.Param(jnp.zeros((1, 1, d)))
    if posemb == 'learn':
      num_tokens = self.grid[0] * self.grid[1] + (pool == 'tok')
      self.pos_embedding = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, num_tokens, d)))
    self.dropout = layers.Dropout(dropout)
    self.encoder = layers.Encoder(dims['depth'], d, dims['mlp_dim'], dims['num_heads'], dropout=dropout,
                                  attention_dropout=attention_dropout, drop_path=drop_path, prenorm=prenorm,
                                  remat=remat, scan=scan, attention_impl=attention_impl, rngs=rngs, **norm_kwargs)
    if pool == 'map':
      self.map_head = layers.MAPHead(d, dims['mlp_dim'], dims['num_heads'], rngs=rngs, **norm_kwargs)
    if representation_size is not None:
      self.pre_logits = nnx.Linear(d, representation_size, rngs=rngs)
    head_init = nnx.initializers.zeros if head_zero_init else nnx.initializers.lecun_normal()
    self.head = nnx.Linear(representation_size or d, num_classes, kernel_init=head_init, rngs=rngs)

  def tokens(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """Embedded patches with position embeddings (and the class token first, for 'tok')."""
    x = self.embedding(images)
    x = layers.add_positions(
        x, fixed=layers.sincos_2d(*self.grid, x.shape[-1]) if self.posemb_type == 'sincos2d' else None,
        cls=self.cls if self.pool == 'tok' else None,
        learned=self.pos_embedding if self.posemb_type == 'learn' else None)
    return self.dropout(x, train=train, rngs=rngs)

  def __call__(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    x = self.encoder(self.tokens(images, train=train, rngs=rngs), train=train, rngs=rngs)
    x = {'tok': lambda: x[:, 0], 'gap': lambda: x.mean(axis=1), 'map': lambda: self.map_head(x)}[self.pool]()
    if hasattr(self, 'pre_logits'):
      x = jnp.tanh(self.pre_logits(x))
    return self.head(x)

  def load_pretrained(self, source: dict, params: dict) -> tuple[dict, list[str]]:
    """Weights for this model from `source`: a release .npz's flat dict, or another ViT's parameters
    (a pure nested dict). `params` are this model's initial ones (kept for a re-initialised head)."""
    notes = []
    if any('/' in k for k in source):
      options = dict(gelu_approximate=self.gelu_approximate, layernorm_epsilon=self.layernorm_epsilon)
      if options != RELEASE_OPTIONS:
        notes.append(f'the released checkpoints were trained with {RELEASE_OPTIONS}; this model has {options}, '
                     'so its outputs differ slightly from the published model')
    else:
      source = to_release(source, self.num_heads)
    params, adapted = from_release(source, self, params)
    return params, notes + adapted

  def attention_maps(self, images: jax.Array) -> list[jax.Array]:
    """Every block's attention probabilities (batch, heads, tokens, tokens), in inference mode."""
    x, maps = self.tokens(images), []
    for block in self.encoder.blocks:
      maps.append(block.attention_weights(x))
      x = block(x, train=False, rngs=None)
    return maps


# --- Published checkpoints ----------------------------------------------------------------------
# Both releases store one flat .npz of '/'-joined linen names. vision_transformer (ViT paper) names
# blocks' sub-layers LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3 and puts the
# position embedding (class token included) at Transformer/posembed_input/pos_embedding. big_vision
# numbers them _0, _0, _1, _0, keeps a top-level pos_embedding without a class-token row, and with
# scanned layers stores one Transformer/encoderblock/... tree whose arrays have a leading layer axis.

_BIG_VISION_NAMES = {'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1', 'LayerNorm_1': 'LayerNorm_2',
                     'MlpBlock_0': 'MlpBlock_3'}


def _attention_to_release(attn: dict, num_heads: int) -> dict:
  d = attn['out']['kernel'].shape[1]
  out = {name: {'kernel': w.reshape(d, num_heads, -1), 'bias': b.reshape(num_heads, -1)}
         for name, w, b in zip(('query', 'key', 'value'), np.split(attn['qkv']['kernel'], 3, axis=1),
                               np.split(attn['qkv']['bias'], 3))}
  return out | {'out': {'kernel': attn['out']['kernel'].reshape(num_heads, -1, d), 'bias': attn['out']['bias']}}


def _attention_from_release(t: dict) -> dict:
  d, names = t['out']['bias'].shape[0], ('query', 'key', 'value')
  return {'qkv': {'kernel': np.concatenate([t[n]['kernel'].reshape(d, -1) for n in names], axis=1),
                  'bias': np.concatenate([t[n]['bias'].reshape(-1) for n in names])},
          'out': {'kernel': t['out']['kernel'].reshape(-1, d), 'bias': t['out']['bias']}}


def _dense(p: dict) -> dict:
  return {'kernel': p['kernel'], 'bias': p['bias']}


def _norm(p: dict) -> dict:
  return {'scale': p['scale'], 'bias': p['bias']}


def _mlp_to_release(mlp: dict) -> dict:
  return {'Dense_0': _dense(mlp['fc1']), 'Dense_1': _dense(mlp['fc2'])}


def to_release(params: dict, num_heads: int) -> dict[str, np.ndarray]:
  """Our parameters (a pure dict) -> the vision_transformer .npz layout (MAP heads in big_vision's)."""
  params = layers.unscanned(params)
  tree = {'embedding': _dense(params['embedding']), 'head': _dense(params['head'])}
  tree['Transformer'] = {f'encoderblock_{i}': {
      'LayerNorm_0': _norm(b['norm1']), 'LayerNorm_2': _norm(b['norm2']),
      'MultiHeadDotProductAttention_1': _attention_to_release(b['attn'], num_heads),
      'MlpBlock_3': _mlp_to_release(b['mlp'])} for i, b in params['encoder']['blocks'].items()}
  if params['encoder'].get('norm'):
    tree['Transformer']['encoder_norm'] = _norm(params['encoder']['norm'])
  if 'pos_embedding' in params:
    tree['Transformer']['posembed_input'] = {'pos_embedding': params['pos_embedding']}
  if 'cls' in params:
    tree['cls'] = params['cls']
  if 'pre_logits' in params:
    tree['pre_logits'] = _dense(params['pre_logits'])
  if 'map_head' in params:
    m = params['map_head']
    tree['MAPHead_0'] = {'probe': m['probe'], 'LayerNorm_0': _norm(m['norm']), 'MlpBlock_0': _mlp_to_release(m['mlp']),
                         'MultiHeadDotProductAttention_0': _attention_to_release(m['attn'], num_heads)}
  return {k: np.asarray(v) for k, v in _flatten(tree).items()}


def _flatten(tree: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in tree.items():
    out |= _flatten(v, f'{prefix}{k}/') if isinstance(v, dict) else {f'{prefix}{k}': v}
  return out


def normalise_release(flat: dict[str, np.ndarray], *, class_token_row: bool) -> dict[str, np.ndarray]:
  """Any release layout -> vision_transformer names, unscanned. `class_token_row`: the target's
  position embedding has a row for the class token (a big_vision one gets a zero row: same function)."""
  flat = dict(flat)
  for key in [k for k in flat if k.startswith('Transformer/encoderblock/')]:  # Scanned: unstack layers.
    for i, layer in enumerate(flat.pop(key)):
      flat[key.replace('encoderblock/', f'encoderblock_{i}/')] = layer
  if not any('MultiHeadDotProductAttention_1' in k for k in flat):
    renamed = {}
    for k, v in flat.items():
      parts = k.split('/')
      if parts[0] == 'Transformer' and parts[1].startswith('encoderblock_'):
        parts[2] = _BIG_VISION_NAMES.get(parts[2], parts[2])
      renamed['/'.join(parts)] = v
    flat = renamed
  if 'pos_embedding' in flat:
    pos = flat.pop('pos_embedding')
    if class_token_row:
      pos = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)
    flat['Transformer/posembed_input/pos_embedding'] = pos
  return flat


def resample_posemb(pos: np.ndarray, grid: tuple[int, int], class_token_row: bool) -> np.ndarray:
  """Bilinear resampling of a square grid of position embeddings to `grid`; the class-token row is kept."""
  cls, pos = (pos[:, :1], pos[:, 1:]) if class_token_row else (pos[:, :0], pos)
  side = math.isqrt(pos.shape[1])
  if side * side != pos.shape[1]:
    raise ConfigError(f'init_from: cannot resample {pos.shape[1]} position embeddings: not a square grid')
  if (side, side) != tuple(grid):
    pos = jax.image.resize(pos.reshape(side, side, -1), (*grid, pos.shape[-1]), 'bilinear')
    pos = np.asarray(pos).reshape(1, grid[0] * grid[1], -1)
  return np.concatenate([cls, pos], axis=1)


def from_release(flat: dict[str, np.ndarray], model: 'ViT', target: dict) -> tuple[dict, list[str]]:
  """A release .npz (any layout) -> parameters shaped like `target` (a pure dict of `model`'s params).

  Adapts what fine-tuning changes: a head of another class count stays at its initialisation, a
  pre-logits layer the model lacks is dropped, position embeddings are resampled to the model's grid.
  Anything else that is missing, unexpected or mis-shaped is a ConfigError naming every such key.
  Returns the parameters and notes on what was adapted.
  """
  has_cls_row = model.pool == 'tok' and model.posemb_type == 'learn'
  target, layout = layers.unscanned(target), target
  flat = normalise_release(flat, class_token_row=has_cls_row)
  expected = to_release(target, model.num_heads)
  notes = []
  pos_key = 'Transformer/posembed_input/pos_embedding'
  if 'cls' in flat and 'cls' not in expected:
    notes.append('class token dropped: the model pools without one')
    del flat['cls']
    rows = flat[pos_key].shape[1] if pos_key in flat else 0
    if pos_key in expected and rows > 1 and math.isqrt(rows - 1) ** 2 == rows - 1:  # Class-token row + grid.
      flat[pos_key] = flat[pos_key][:, 1:]
  if pos_key in flat and pos_key in expected and flat[pos_key].shape != expected[pos_key].shape:
    notes.append(f'position embeddings resampled {flat[pos_key].shape} -> {expected[pos_key].shape}')
    flat[pos_key] = resample_posemb(flat[pos_key], model.grid, has_cls_row)
  if 'head/kernel' in flat and flat['head/kernel'].shape != expected['head/kernel'].shape:
    notes.append(f'head {flat["head/kernel"].shape} re-initialised for {expected["head/kernel"].shape}')
    flat['head/kernel'], flat['head/bias'] = expected['head/kernel'], expected['head/bias']
  if 'pre_logits/kernel' in flat and 'pre_logits/kernel' not in expected:
    notes.append('pre-logits layer dropped (model.representation_size is None)')
    del flat['pre_logits/kernel'], flat['pre_logits/bias']
  missing = sorted(expected.keys() - flat.keys())
  unexpected = sorted(flat.keys() - expected.keys())
  misshaped = sorted(f'{k} {flat[k].shape} (model: {expected[k].shape})' for k in expected.keys() & flat.keys()
                     if flat[k].shape != expected[k].shape)
  if missing or unexpected or misshaped:
    raise ConfigError('init_from does not fit the model: ' + '; '.join(
        f'{what}: {", ".join(keys)}' for what, keys in
        (('missing', missing), ('unexpected', unexpected), ('mis-shaped', misshaped)) if keys))
  return layers.scanned_like(_unflatten_like(flat, target), layout), notes


def _unflatten_like(flat: dict[str, np.ndarray], target: dict) -> dict:
  """Inverse of `to_release` for the keys of `target`."""
  t = {}
  for k, v in flat.items():
    node = t
    *parents, leaf = k.split('/')
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  unmlp = lambda m: {'fc1': m['Dense_0'], 'fc2': m['Dense_1']}
  params = {'embedding': t['embedding'], 'head': t['head'], 'encoder': {'blocks': {}}}
  for i in target['encoder']['blocks']:
    b = t['Transformer'][f'encoderblock_{i}']
    params['encoder']['blocks'][i] = {
        'norm1': b['LayerNorm_0'], 'norm2': b['LayerNorm_2'], 'mlp': unmlp(b['MlpBlock_3']),
        'attn': _attention_from_release(b['MultiHeadDotProductAttention_1'])}
  if 'norm' in target['encoder']:
    params['encoder']['norm'] = t['Transformer']['encoder_norm']
  if 'pos_embedding' in target:
    params['pos_embedding'] = t['Transformer']['posembed_input']['pos_embedding']
  for key in ('cls', 'pre_logits'):
    if key in target:
      params[key] = t[key]
  if 'map_head' in target:
    m = t['MAPHead_0']
    params['map_head'] = {'probe': m['probe'], 'norm': m['LayerNorm_0'], 'mlp': unmlp(m['MlpBlock_0']),
                          'attn': _attention_from_release(m['MultiHeadDotProductAttention_0'])}
  return params
