"""Hugging Face transformers' V-JEPA 2 (Assran et al. 2025: `VJEPA2Model`, `VJEPA2ForVideoClassification`) -> the
ViViT's model 1 with V-JEPA 2's rotary positions and attentive pool (hub layout 'transformers_vjepa2').

The encoder is a pre-norm ViT over 2 x 16 x 16 tubelets (a Conv3d, (out, in, time, h, w)) with no class token and no
position table: each block turns its queries and keys by the tubelet's time, row and column index (model.rope=
'vjepa2', posemb='none'), separate `query` / `key` / `value` Linears and the output `proj` under
`encoder.layer.N.attention`, and a final `encoder.layernorm`. The classifier's `pooler` (model.pool='attentive';
pool_depth: its self-attention layers; pool_mlp_dim: its MLPs, 4 x width whatever the config's mlp_ratio) and
`classifier` (our head) sit beside `vjepa2.`. A `VJEPA2Model` folder has neither (a backbone: any pool, a new head)
but its `predictor`, which only the masked pretraining uses and is left out. transformers numbers the rotary
positions with the config's crop_size; the ViViT numbers them on the grid of the clip it is given: the same at that
size, and V-JEPA 2's own code's positions at another.
"""

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_jax_lab import errors, hub
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import transformers_layout

# VJEPA2Config's defaults, for a config.json that leaves them out.
MAX_CLIP = 4096  # Pixels a side and frames of a clip, beyond any V-JEPA 2 release (crop 256-384, 64 frames).
DEFAULTS = dict(hidden_act='gelu', layer_norm_eps=1e-6, crop_size=256, frames_per_clip=64, num_attention_heads=16)
_PATCH = 'encoder.embeddings.patch_embeddings.proj'
_LAYER = re.compile(r'encoder\.layer\.(\d+)\.')
_BLOCK = {  # Module inside encoder.layer.N -> its release name inside Transformer/encoderblock_N.
  'norm1': 'LayerNorm_0',
  'attention.query': 'MultiHeadDotProductAttention_1/query',
  'attention.key': 'MultiHeadDotProductAttention_1/key',
  'attention.value': 'MultiHeadDotProductAttention_1/value',
  'attention.proj': 'MultiHeadDotProductAttention_1/out',
  'norm2': 'LayerNorm_2',
  'mlp.fc1': 'MlpBlock_3/Dense_0',
  'mlp.fc2': 'MlpBlock_3/Dense_1',
}
_POOLER = {  # Module of the pooler's layers -> ours inside pooler/blocks/N (self-attention) or pooler (cross).
  'layer_norm1': 'norm1',
  'layer_norm2': 'norm2',
  'mlp.fc1': 'mlp/fc1',
  'mlp.fc2': 'mlp/fc2',
  'self_attn.out_proj': 'attn/out',
}


def _names(tensors: Mapping[str, Any]) -> dict[str, str]:
  """Our name (`vjepa2.` stripped) -> the folder's."""
  return {name.removeprefix('vjepa2.'): name for name in tensors}


def _linear(weight: np.ndarray, bias: np.ndarray | None) -> dict[str, np.ndarray]:
  if weight.ndim == 1:  # A LayerNorm.
    return {'scale': weight, 'bias': bias}
  return {'kernel': weight.T, 'bias': np.zeros(weight.shape[0], weight.dtype) if bias is None else bias}


# Every field of transformers 5.24's VJEPA2Config, as transformers_layout.CONFIG_FIELDS: read, shown by the tensors
# or neutral (dropout, initialisation, the predictor, which is left out); another is one line.
CONFIG_FIELDS = transformers_layout.BASE_FIELDS | {
  **dict.fromkeys(('patch_size', 'crop_size', 'frames_per_clip', 'tubelet_size', 'in_chans'), 'read'),
  **dict.fromkeys(('num_attention_heads', 'hidden_act', 'layer_norm_eps'), 'read'),
  **dict.fromkeys(('hidden_size', 'num_hidden_layers', 'mlp_ratio', 'qkv_bias', 'num_pooler_layers'), 'tensors'),
  **dict.fromkeys(
    ('drop_path_rate', 'attention_probs_dropout_prob', 'attention_dropout', 'initializer_range'), 'neutral'
  ),
  **dict.fromkeys(('pred_hidden_size', 'pred_num_attention_heads', 'pred_num_hidden_layers'), 'neutral'),
  **dict.fromkeys(('pred_num_mask_tokens', 'pred_zero_init_mask_tokens', 'pred_mlp_ratio'), 'neutral'),
}


def vivit_options(config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The ViViT constructor keys of a V-JEPA 2 folder (config.json and tensor shapes), with `input_shape` (frames,
  height, width, channels: frames_per_clip and crop_size) and `num_classes` (0: a backbone without a classifier)."""
  transformers_layout.refuse_unknown(config, CONFIG_FIELDS)
  config = DEFAULTS | {k: v for k, v in config.items() if v is not None}
  names = _names(tensors)

  def shape(short):
    return transformers_layout.tensor_shape(tensors, names[short])

  width, channels, time, patch = transformers_layout.tubelet(tensors, names[f'{_PATCH}.weight'])
  act = config['hidden_act']
  if transformers_layout.ACTIVATIONS.get(act, ('',))[0] != 'gelu':
    raise ConfigError(f"init_from: hidden_act={act!r} of the V-JEPA 2 config: the ViViT's MLPs compute GELU only")
  crop = config['crop_size']
  sizes = {k: config[k] for k in ('crop_size', 'frames_per_clip', 'num_attention_heads')}
  errors.positive_ints('init_from: the V-JEPA 2 config', sizes)
  if crop > MAX_CLIP or config['frames_per_clip'] > MAX_CLIP:
    raise ConfigError(
      f"init_from: the V-JEPA 2 config's crop_size={crop} and frames_per_clip={config['frames_per_clip']} must be at "
      f'most {MAX_CLIP:,}, the clip the model reads: is it the right file?'
    )
  head = 'classifier.weight' in names
  pool_depth = len({m.group(1) for n in names if (m := re.match(r'pooler\.self_attention_layers\.(\d+)\.', n))})
  pooled = 'pooler.query_tokens' in names
  return dict(
    num_classes=shape('classifier.weight')[0] if head else 0,
    input_shape=(config['frames_per_clip'], crop, crop, channels),
    patch_size=patch,
    tubelet_time=time,
    width=width,
    depth=len({m.group(1) for n in names if (m := _LAYER.match(n))}),
    mlp_dim=shape('encoder.layer.0.mlp.fc1.weight')[0],
    num_heads=config['num_attention_heads'],
    model='spatiotemporal',
    embedding='tubelet',
    pool='attentive' if pooled else None,
    pool_depth=pool_depth if pooled else None,
    pool_mlp_dim=shape('pooler.cross_attention_layer.mlp.fc1.weight')[0] if pooled else None,
    posemb='none',
    fc_norm=None,
    rope='vjepa2',
    gelu_approximate=transformers_layout.ACTIVATIONS[act][1],
    layernorm_epsilon=float(config['layer_norm_eps']),
  )


def to_release(tensors: Mapping[str, np.ndarray], num_heads: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """V-JEPA 2 names -> (release names, and the attentive pool under pooler/ in the ViViT's own; release name -> the
  folder's module, for messages). The predictor is left out; a name not recognised is kept, so that the load names
  it among the unexpected keys."""
  names = _names(tensors)
  flat, origin, used = {}, {}, set()

  def take(module, out, converted):
    flat.update({f'{out}/{k}': v for k, v in converted.items()})
    origin.update(dict.fromkeys((f'{out}/{k}' for k in converted), module))
    used.update({f'{module}.weight', f'{module}.bias', module})

  def linear(module, out):
    weight, bias = names.get(f'{module}.weight'), names.get(f'{module}.bias')
    if weight is not None:
      take(module, out, _linear(tensors[weight], None if bias is None else tensors[bias]))

  modules = {_PATCH: 'embedding', 'encoder.layernorm': 'Transformer/encoder_norm', 'classifier': 'head'}
  for i in sorted({int(m.group(1)) for n in names if (m := _LAYER.match(n))}):
    modules |= {f'encoder.layer.{i}.{part}': f'Transformer/encoderblock_{i}/{out}' for part, out in _BLOCK.items()}
  for module, out in modules.items():
    weight, bias = f'{module}.weight', f'{module}.bias'
    if weight in names:
      b = tensors[names[bias]] if bias in names else None
      converted = transformers_layout.convert(out, tensors[names[weight]], b, num_heads)
      take(module, out, {k.removeprefix(f'{out}/'): v for k, v in converted.items()})
  layers = sorted({int(m.group(1)) for n in names if (m := re.match(r'pooler\.self_attention_layers\.(\d+)\.', n))})
  for prefix, out in [(f'pooler.self_attention_layers.{i}', f'pooler/blocks/{i}') for i in layers] + [
    ('pooler.cross_attention_layer', 'pooler')
  ]:
    for part, ours in _POOLER.items():
      linear(f'{prefix}.{part}', f'{out}/{ours}')
    attention = 'self_attn' if prefix != 'pooler.cross_attention_layer' else 'cross_attn'
    projections = [f'{prefix}.{attention}.{p}_proj' for p in ('q', 'k', 'v')]
    if all(f'{p}.weight' in names for p in projections):
      parts = [_linear(tensors[names[f'{p}.weight']], tensors[names[f'{p}.bias']]) for p in projections]
      fused = {k: np.concatenate([p[k] for p in parts], axis=-1) for k in ('kernel', 'bias')}
      take(f'{prefix}.{attention}', f'{out}/attn/qkv', fused)
      used.update(f'{p}.{w}' for p in projections for w in ('weight', 'bias'))
  if 'pooler.query_tokens' in names:
    take('pooler.query_tokens', 'pooler', {'query': tensors[names['pooler.query_tokens']]})
  kept = {
    short: tensors[name] for short, name in names.items() if short not in used and not short.startswith('predictor.')
  }
  return flat | kept, origin


def notes(config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> list[str]:
  """What the load notes first: the architecture read, and the predictor left out."""
  architecture = (config.get('architectures') or ['VJEPA2Model'])[0]
  out = [f'transformers {architecture} read from its safetensors']
  predictor = sum(name.removeprefix('vjepa2.').startswith('predictor.') for name in tensors)
  if predictor:
    out.append(f'predictor left out ({predictor} tensors: masked pretraining only)')
  return out


def posemb_resize(config: dict[str, Any]) -> tuple[str, str]:
  """V-JEPA 2 has no position table to resample: its rotary positions are computed for each grid."""
  return 'bilinear', 'none: V-JEPA 2 has no position table'


def preprocessing(path: str, config: dict[str, Any]) -> hub.Preprocessing:
  """VJEPA2VideoProcessor's, from the folder's video_preprocessor_config.json (or preprocessor_config.json): the
  shorter side to crop_size * 256 / 224, bilinear; the central crop; ImageNet's mean and std."""
  return transformers_layout.preprocessing(path, config, ('video_preprocessor_config.json', 'preprocessor_config.json'))
