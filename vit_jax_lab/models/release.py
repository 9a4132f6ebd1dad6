"""The published ViT checkpoints: google-research/vision_transformer's and big_vision's flat .npz layouts,
to and from our parameters, with what fine-tuning adapts (head, pre-logits, class token, position embeddings).

Both releases store one flat .npz of '/'-joined linen names. vision_transformer (ViT paper) names
blocks' sub-layers LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3 and puts the
position embedding (class token included) at Transformer/posembed_input/pos_embedding. big_vision
numbers them _0, _0, _1, _0, keeps a top-level pos_embedding without a class-token row, and with
scanned layers stores one Transformer/encoderblock/... tree whose arrays have a leading layer axis.
"""

import dataclasses
import math
from typing import Any

import jax
import numpy as np
import scipy.ndimage

import vit_jax_lab.models.layers as layers
from vit_jax_lab.errors import ConfigError

# The released checkpoints (google-research/vision_transformer and big_vision) were trained with
# flax.linen's defaults: tanh-approximate GELU and LayerNorm epsilon 1e-6.
RELEASE_OPTIONS = dict(gelu_approximate=True, layernorm_epsilon=1e-6)

_BIG_VISION_NAMES = {
  'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
  'LayerNorm_1': 'LayerNorm_2',
  'MlpBlock_0': 'MlpBlock_3',
}


def _attention_to_release(attn: dict, num_heads: int) -> dict:
  d = attn['out']['kernel'].shape[1]
  out = {
    name: {'kernel': w.reshape(d, num_heads, -1), 'bias': b.reshape(num_heads, -1)}
    for name, w, b in zip(
      ('query', 'key', 'value'), np.split(attn['qkv']['kernel'], 3, axis=1), np.split(attn['qkv']['bias'], 3)
    )
  }
  return out | {'out': {'kernel': attn['out']['kernel'].reshape(num_heads, -1, d), 'bias': attn['out']['bias']}}


def _buffer(a: np.ndarray) -> Any:
  """The object whose memory `a` views (its last ndarray base's buffer)."""
  while isinstance(a.base, np.ndarray):
    a = a.base
  return a if a.base is None else a.base


def _join_columns(parts: list[np.ndarray]) -> np.ndarray:
  """np.concatenate(parts, axis=1), but a view where the parts are adjacent column blocks of one array (a fused
  qkv kernel split into the release's query / key / value, as timm's and our own runs' are), so that a hub
  folder's memory-mapped tensors are not copied here."""
  a = parts[0]
  if a.ndim == 2 and all(
    p.ndim == 2 and p.dtype == a.dtype and p.strides == a.strides and p.shape[0] == a.shape[0] for p in parts
  ):
    pointers = [p.__array_interface__['data'][0] for p in parts]
    adjacent = all(q - p == a.strides[1] * part.shape[1] for p, q, part in zip(pointers, pointers[1:], parts))
    if adjacent and all(_buffer(p) is _buffer(a) for p in parts):
      width = sum(p.shape[1] for p in parts)
      return np.lib.stride_tricks.as_strided(a, (a.shape[0], width), a.strides, writeable=False)
  return np.concatenate(parts, axis=1)


def _attention_from_release(t: dict) -> dict:
  d, names = t['out']['bias'].shape[0], ('query', 'key', 'value')
  return {
    'qkv': {
      'kernel': _join_columns([t[n]['kernel'].reshape(d, -1) for n in names]),
      'bias': np.concatenate([t[n]['bias'].reshape(-1) for n in names]),
    },
    'out': {'kernel': t['out']['kernel'].reshape(-1, d), 'bias': t['out']['bias']},
  }


def _dense(p: dict) -> dict:
  return {'kernel': p['kernel'], 'bias': p['bias']}


def _norm(p: dict) -> dict:
  return {'scale': p['scale'], 'bias': p['bias']}


def _mlp_to_release(mlp: dict) -> dict:
  gate = {'Dense_gate': _dense(mlp['gate'])} if 'gate' in mlp else {}  # SwiGLU's (model.mlp): our name.
  norm = {'norm': _norm(mlp['norm'])} if 'norm' in mlp else {}  # The hidden LayerNorm (model.mlp_norm): ours.
  return {'Dense_0': _dense(mlp['fc1']), 'Dense_1': _dense(mlp['fc2'])} | gate | norm


def _block_to_release(b: dict, num_heads: int) -> dict:
  out = {
    'LayerNorm_0': _norm(b['norm1']),
    'LayerNorm_2': _norm(b['norm2']),
    'MultiHeadDotProductAttention_1': _attention_to_release(b['attn'], num_heads),
    'MlpBlock_3': _mlp_to_release(b['mlp']),
  }
  if 'ls1' in b:  # LayerScale (model.layerscale), which the Google releases lack: named here.
    out |= {'LayerScale_0': {'gamma': b['ls1']}, 'LayerScale_1': {'gamma': b['ls2']}}
  return out


def to_release(params: dict, num_heads: int) -> dict[str, np.ndarray]:
  """Our parameters (a pure dict) -> the vision_transformer .npz layout (MAP heads in big_vision's). What the
  Google layout lacks keeps our names: the distillation token `dist` and its head `head_dist`, register tokens
  `reg`, LayerScale gammas `LayerScale_0/gamma` and `LayerScale_1/gamma` in each block, a SwiGLU MLP's gate
  `MlpBlock_3/Dense_gate`, the LayerNorms before the encoder `norm_pre` (CLIP) and after the pooling `fc_norm`, the
  learned rotary frequencies `rope/freqs`, the ViViT's attentive pool `pooler/...`."""
  params = layers.unscanned(params)
  tree = {'embedding': _dense(params['embedding']), 'head': _dense(params['head'])}
  tree['Transformer'] = {
    f'encoderblock_{i}': _block_to_release(b, num_heads) for i, b in params['encoder']['blocks'].items()
  }
  if params['encoder'].get('norm'):
    tree['Transformer']['encoder_norm'] = _norm(params['encoder']['norm'])
  if 'pos_embedding' in params:
    tree['Transformer']['posembed_input'] = {'pos_embedding': params['pos_embedding']}
  for key in ('cls', 'dist', 'reg'):
    if key in params:
      tree[key] = params[key]
  for key in ('pre_logits', 'head_dist'):
    if key in params:
      tree[key] = _dense(params[key])
  for key in ('norm_pre', 'fc_norm'):
    if key in params:
      tree[key] = _norm(params[key])
  if 'rope' in params:  # RoPE-Mixed's learned frequencies (model.rope='mixed').
    tree['rope'] = {'freqs': params['rope']['freqs']}
  if 'pooler' in params:  # The ViViT's attentive pool (model.pool='attentive'), in our names.
    tree['pooler'] = params['pooler']
  if 'map_head' in params:
    m = params['map_head']
    tree['MAPHead_0'] = {
      'probe': m['probe'],
      'LayerNorm_0': _norm(m['norm']),
      'MlpBlock_0': _mlp_to_release(m['mlp']),
      'MultiHeadDotProductAttention_0': _attention_to_release(m['attn'], num_heads),
    }
  return {k: np.asarray(v) for k, v in flatten(tree).items()}


def flatten(tree: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in tree.items():
    out |= flatten(v, f'{prefix}{k}/') if isinstance(v, dict) else {f'{prefix}{k}': v}
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


@dataclasses.dataclass(frozen=True)
class ImageModel:
  """What `from_release` needs to know of the image ViT whose weights another family (ViViT, the tracker) takes."""

  pool: str
  posemb_type: str
  num_heads: int
  grid: tuple[int, int]
  posemb_resize: str = 'zoom'


# model.posemb_resize: how position embeddings are resampled to another grid, with the note that names it.
POSEMB_RESIZE = {
  'zoom': 'scipy.ndimage.zoom order 1, corner-aligned linear, as vision_transformer and big_vision',
  'bilinear': 'jax.image.resize bilinear, half-pixel centres, antialiased when shrinking',
  'bicubic': "jax.image.resize bicubic, antialiased when shrinking, as timm's resample_abs_pos_embed",
}


def resample_posemb(
  pos: np.ndarray, grid: tuple[int, int], class_token_row: bool | int, method: str = 'zoom'
) -> np.ndarray:
  """A square grid of position embeddings resampled to `grid` by `method` (a key of POSEMB_RESIZE); the
  class-token row (or `class_token_row` leading rows: class, distillation, register tokens) is kept. 'zoom' is
  the releases' own resampling, so fine-tuning one reproduces theirs."""
  if method not in POSEMB_RESIZE:
    raise ConfigError(f'model.posemb_resize={method!r} is not one of {", ".join(map(repr, POSEMB_RESIZE))}')
  cls, pos = pos[:, : int(class_token_row)], pos[:, int(class_token_row) :]
  side = math.isqrt(pos.shape[1])
  if side * side != pos.shape[1]:
    raise ConfigError(f'init_from: cannot resample {pos.shape[1]} position embeddings: not a square grid')
  if (side, side) != tuple(grid):
    square, shape = np.asarray(pos).reshape(side, side, -1), (*grid, pos.shape[-1])
    if method == 'zoom':  # scipy computes in float64 and returns the input's dtype.
      resized = scipy.ndimage.zoom(square, (grid[0] / side, grid[1] / side, 1), order=1)
    else:
      resized = np.asarray(jax.image.resize(square, shape, method, antialias=True))
    assert resized.shape == shape, (resized.shape, shape)
    pos = resized.reshape(1, grid[0] * grid[1], -1)
  return np.concatenate([cls, pos], axis=1)


def from_release(
  flat: dict[str, np.ndarray],
  model: Any,
  target: dict,
  *,
  posemb_resize: tuple[str, str] | None = None,
  origin: dict[str, str] | None = None,
) -> tuple[dict, list[str]]:
  """A release .npz (any layout) -> parameters shaped like `target` (a pure dict of `model`'s params).

  Adapts what fine-tuning changes: a head of another class count (or one the source lacks: a backbone
  released without a head) stays at its initialisation, a pre-logits layer the model lacks is dropped,
  position embeddings are resampled to the model's grid (by `model.posemb_resize`, or by `posemb_resize`:
  (method, why), the source library's own resampling).
  Anything else that is missing, unexpected or mis-shaped is a ConfigError naming every such key (with the
  source's own name from `origin`, for a source converted to this layout).
  Returns the parameters and notes on what was adapted.
  """
  origin = origin or {}
  # Leading position-embedding rows before the patch grid: the class token's (and the ViT's distillation and
  # register tokens' when its position embeddings cover them).
  prefix_rows = getattr(model, 'posemb_prefix_rows', int(model.pool == 'tok' and model.posemb_type == 'learn'))
  has_cls_row = prefix_rows > 0
  # Only the heads' initial values are ever kept: every other parameter is compared by shape alone, on views of one
  # zero per array (no memory), so initial parameters still on the devices are never copied whole to the host.
  layout = target
  target = layers.unscanned(jax.tree.map(lambda a: np.broadcast_to(np.zeros((), a.dtype), a.shape), target))
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
    if posemb_resize is None:
      method, how = model.posemb_resize, f'model.posemb_resize={model.posemb_resize!r}'
    else:
      method, how = posemb_resize
    notes.append(
      f'position embeddings resampled {flat[pos_key].shape} -> {expected[pos_key].shape} by '
      f'{how} ({POSEMB_RESIZE[method]})'
    )
    flat[pos_key] = resample_posemb(flat[pos_key], model.grid, prefix_rows, method)
  for head in ('head', 'head_dist'):
    kernel, bias = f'{head}/kernel', f'{head}/bias'
    if kernel not in expected:
      continue
    if kernel not in flat and bias not in flat:
      notes.append(f'{head} {expected[kernel].shape} initialised: the source has none (a backbone without a head)')
      flat[kernel], flat[bias] = layout[head]['kernel'], layout[head]['bias']
    elif kernel in flat and flat[kernel].shape != expected[kernel].shape:
      notes.append(f'{head} {flat[kernel].shape} re-initialised for {expected[kernel].shape}')
      flat[kernel], flat[bias] = layout[head]['kernel'], layout[head]['bias']
  if 'pre_logits/kernel' in flat and 'pre_logits/kernel' not in expected:
    notes.append('pre-logits layer dropped (model.representation_size is None)')
    del flat['pre_logits/kernel'], flat['pre_logits/bias']
  missing = sorted(expected.keys() - flat.keys())
  unexpected = sorted(flat.keys() - expected.keys())
  misshaped = sorted(
    f'{k}{f" (from {origin[k]})" if k in origin else ""} {flat[k].shape} (model: {expected[k].shape})'
    for k in expected.keys() & flat.keys()
    if flat[k].shape != expected[k].shape
  )
  if missing or unexpected or misshaped:
    raise ConfigError(
      'init_from does not fit the model: '
      + '; '.join(
        f'{what}: {", ".join(keys[:4])}' + (f' and {len(keys) - 4} more' if len(keys) > 4 else '')
        for what, keys in (('missing', missing), ('unexpected', unexpected), ('mis-shaped', misshaped))
        if keys
      )
    )
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

  def unmlp(m):
    out = {'fc1': m['Dense_0'], 'fc2': m['Dense_1']} | ({'gate': m['Dense_gate']} if 'Dense_gate' in m else {})
    return out | ({'norm': m['norm']} if 'norm' in m else {})

  params = {'embedding': t['embedding'], 'head': t['head'], 'encoder': {'blocks': {}}}
  for i, like in target['encoder']['blocks'].items():
    b = t['Transformer'][f'encoderblock_{i}']
    params['encoder']['blocks'][i] = {
      'norm1': b['LayerNorm_0'],
      'norm2': b['LayerNorm_2'],
      'mlp': unmlp(b['MlpBlock_3']),
      'attn': _attention_from_release(b['MultiHeadDotProductAttention_1']),
    }
    if 'ls1' in like:
      params['encoder']['blocks'][i] |= {'ls1': b['LayerScale_0']['gamma'], 'ls2': b['LayerScale_1']['gamma']}
  if 'norm' in target['encoder']:
    params['encoder']['norm'] = t['Transformer']['encoder_norm']
  if 'pos_embedding' in target:
    params['pos_embedding'] = t['Transformer']['posembed_input']['pos_embedding']
  for key in ('cls', 'dist', 'reg', 'pre_logits', 'head_dist', 'norm_pre', 'fc_norm', 'rope'):
    if key in target:
      params[key] = t[key]
  if 'pooler' in target:
    params['pooler'] = _like(t['pooler'], target['pooler'])
  if 'map_head' in target:
    m = t['MAPHead_0']
    params['map_head'] = {
      'probe': m['probe'],
      'norm': m['LayerNorm_0'],
      'mlp': unmlp(m['MlpBlock_0']),
      'attn': _attention_from_release(m['MultiHeadDotProductAttention_0']),
    }
  return params


def _like(tree: dict, target: dict) -> dict:
  """A tree unflattened from '/'-joined names (layer numbers as strings) keyed as `target` is."""
  return {k: _like(tree[str(k)], v) if isinstance(v, dict) else tree[str(k)] for k, v in target.items()}
