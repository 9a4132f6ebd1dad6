"""timm's VisionTransformer state dict (a hub folder's model.safetensors) -> the release flat layout that
`release.from_release` adapts into our ViT, and the ViT constructor keys that give the folder's model.

timm stores PyTorch Linear weights as (out, in) and the patch embedding as a convolution (out, in, h, w); its fused
qkv is laid out (3, heads, head_dim) along the outputs, as our Attention's, and its attention pool's q / kv are our
MAPHead's fused qkv split in two. timm's ViTs use the exact GELU and LayerNorm epsilon 1e-6; its CLIP image towers
(`*_clip_*`) PyTorch's LayerNorm epsilon 1e-5, a LayerNorm before the encoder (`norm_pre`), a patch embedding without
bias, the exact GELU or (`*_quickgelu_*`) quick-GELU, and their `head` is CLIP's output projection. DINOv2 giant's
SwiGLU MLP (`SwiGLUPacked`) keeps the names `mlp.fc1` / `mlp.fc2`, its fc1 packing the gate (first half of the
outputs, through SiLU) and the value (second half): fc1 twice as wide as fc2's input tells it (model.mlp='swiglu').

timm's Eva class (its rotary ViTs, DINOv3, EVA-02, Perception Encoder: the rows of EVA) is read into the same ViT:
LayerScale `gamma_1` / `gamma_2`, q and v biases (no key bias) or separate q / k / v projections (layout 'timm_eva'),
SwiGLU as `fc1_g` / `fc1_x` and the MLP's hidden LayerNorm `mlp.norm`, RoPE-Mixed's `rope.freqs`. The way back,
for `tools.export --layout timm`: `folder` (the model families it writes: EXPORTS), by `from_release` (with `to_eva`)
and `folder_config`, VisionTransformer's or Eva's (`eva_args`); what `predict --pretrained` applies: `preprocessing`.
"""

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

import vit_jax_lab.models.release as release
from vit_jax_lab import errors, hub
from vit_jax_lab.errors import ConfigError

TIMM_OPTIONS = dict(gelu_approximate=False, layernorm_epsilon=1e-6)
# timm size word -> heads, for folders whose config.json has no model_args (a hub folder's): the first word of the
# architecture's name found here, unless ARCHITECTURE_HEADS names it. Exact for every ViT, DeiT and EVA of timm
# 1.0.31 (tests/data/pretrained/timm_heads.json); an architecture with none of them is one line.
HEADS = {
  'tiny': 3,
  'small': 6,
  'medium': 8,
  'base': 12,
  'large': 16,
  'huge': 16,
  'so400m': 16,
  'betwixt': 10,
  'mediumd': 8,
  'little': 5,
  'dlittle': 5,
  'wee': 4,
  'pwee': 4,
  'dwee': 4,
  'xsmall': 4,
  'giant': 16,
  'gigantic': 16,
  'enormous': 16,
}
# Architectures whose heads their size word does not give.
ARCHITECTURE_HEADS = {
  'vit_base_patch16_gap_224': 16,
  **dict.fromkeys(
    (
      'vit_base_patch16_plus_240',
      'vit_base_patch16_plus_clip_240',
      'vit_base_patch32_plus_256',
      'vit_relpos_base_patch16_plus_240',
      'vit_relpos_base_patch32_plus_rpn_256',
      'vit_so150m_patch16_reg4_gap_256',
      'vit_so150m_patch16_reg4_gap_384',
      'vit_so150m_patch16_reg4_map_256',
    ),
    14,
  ),
  **dict.fromkeys(('vit_so150m2_patch16_reg1_gap_256', 'vit_so150m2_patch16_reg1_gap_384'), 13),
  'vit_so150m2_patch16_reg1_gap_448': 13,
  **dict.fromkeys(
    (
      'vit_giant_patch14_dinov2',
      'vit_giant_patch14_reg1_tipsv2',
      'vit_giant_patch14_reg4_dinov2',
      'vit_giant_patch16_lingbot',
      'vit_giant_patch16_radio_v3',
      'vit_giant_patch16_sapiens2',
    ),
    24,
  ),
  'vit_huge_plus_patch16_dinov3': 20,
  'vit_huge_plus_patch16_dinov3_qkvb': 20,
  'vit_small_resnet26d_224': 8,
  'vit_small_resnet50d_s16_224': 8,
  **dict.fromkeys(
    (
      'vit_giantopt_patch16_siglip_256',
      'vit_giantopt_patch16_siglip_384',
      'vit_giantopt_patch16_siglip_gap_256',
      'vit_giantopt_patch16_siglip_gap_384',
      'vit_intern300m_patch14_448',
    ),
    16,
  ),
  'vit_5b_patch16_sapiens2': 32,
  'vit_7b_patch16_dinov3': 32,
}


def heads_of(architecture: str) -> int | None:
  """The heads of timm architecture `architecture` (a pretrained tag after '.' ignored) when its config.json does not
  say: ARCHITECTURE_HEADS, else the first size word of HEADS in its name; None if neither knows it."""
  name = architecture.split('.')[0]
  return ARCHITECTURE_HEADS.get(name) or next((HEADS[w] for w in name.split('_') if w in HEADS), None)


# How timm resamples a checkpoint's position embeddings (resample_abs_pos_embed), for release.from_release.
POSEMB_RESIZE = ('bicubic', "'bicubic', timm's own (not model.posemb_resize)")

# Every argument of timm 1.0.31's VisionTransformer (a folder's config.json `model_args`) by how a folder's value is
# met, so that none is guessed: 'read' (used: vit_options, timm_options, _refuse_unread), 'tensors' (what it changes
# shows in the tensor names and shapes, each of which is read or refused), 'neutral' (training or initialisation
# only, or sizes a fixed input never meets: evaluation computes the same), or the tuple of values read, any other
# one line. An argument not listed (another timm class, a newer timm) is one line too.
_TENSORS, _NEUTRAL = 'tensors', 'neutral'
MODEL_ARGS = {
  **dict.fromkeys(('global_pool', 'num_heads', 'init_values', 'pos_embed'), 'read'),
  'act_layer': (None, 'gelu', 'gelu_tanh', 'quick_gelu'),
  'norm_layer': (None,),  # timm's LayerNorm, its epsilon by architecture (timm_options).
  'pool_include_prefix': (False,),  # True averages the class and register tokens too.
  # Named by the argument rather than by the tensors they add or drop (q_norm, k_norm; proj.bias; norm after the
  # patch embedding): none of them is computed.
  'qk_norm': (False,),
  'proj_bias': (True,),
  'embed_norm_layer': (None,),
  **dict.fromkeys(
    ('img_size', 'patch_size', 'in_chans', 'num_classes', 'embed_dim', 'depth', 'mlp_ratio', 'qkv_bias'), _TENSORS
  ),
  **dict.fromkeys(
    ('scale_attn_norm', 'scale_mlp_norm', 'class_token', 'no_embed_class', 'reg_tokens', 'pre_norm'), _TENSORS
  ),
  **dict.fromkeys(('final_norm', 'fc_norm', 'embed_layer', 'block_fn', 'mlp_layer', 'attn_layer'), _TENSORS),
  **dict.fromkeys(('drop_rate', 'pos_drop_rate', 'patch_drop_rate', 'proj_drop_rate', 'attn_drop_rate'), _NEUTRAL),
  **dict.fromkeys(('drop_path_rate', 'weight_init', 'fix_init', 'dynamic_img_size', 'dynamic_img_pad'), _NEUTRAL),
  **dict.fromkeys(('device', 'dtype'), _NEUTRAL),
}

# timm 1.0.31's Eva-class ViTs (timm/models/eva.py) that our ViT computes, by architecture: the rotary embedding
# (model.rope, rope_temperature, rope_axes, rope_ref_grid) and LayerNorm epsilon their definitions build in, which
# config.json does not repeat. A folder's `rope.freqs` makes an axial row 'mixed' (RoPE-Mixed's learned frequencies).
_NAMED_GRID = 'size / patch'  # An EVA row's rope_ref_grid: the architecture name's image size over its patch.
EVA = (
  (r'vit_[a-z]+_patch16_rope_(mixed_)?(ape_)?224', dict(rope='axial', rope_temperature=100.0, rope_axes='xy'), 1e-6),
  (
    r'vit_[a-z]+_patch16_rope_reg\d_gap_256',
    dict(rope='axial', rope_temperature=1e4, rope_axes='ij', rope_ref_grid=16),
    1e-6,
  ),
  (r'vit_[a-z_]+_patch16_dinov3(_qkvb)?', dict(rope='dinov3', rope_temperature=100.0, rope_axes='ij'), 1e-5),
  # Perception Encoder (PE core): a CLIP image tower (norm_pre, an attention pool of 8 heads, its head a projection),
  # positions on the grid of its architecture's own size (ref_feat_shape: 384 / 16 = 24 for tiny).
  (
    r'vit_pe_core_[a-z]+_patch(?P<patch>\d+)_(?P<size>\d+)',
    dict(rope='axial', rope_temperature=1e4, rope_axes='xy', rope_ref_grid=_NAMED_GRID, rope_offset=1.0, map_heads=8),
    1e-5,
  ),
  # EVA-02 (SwiGLU, sub-LN from base up; positions on its 16 x 16 pre-training grid at any fine-tuning size).
  (
    r'eva02_(tiny|small|base|large)_patch14_(224|336|448)',
    dict(rope='axial', rope_temperature=1e4, rope_axes='ij', rope_ref_grid=16),
    1e-6,
  ),
)
# Every argument of timm 1.0.31's Eva (config.json's model_args of such a folder), as MODEL_ARGS for
# VisionTransformer: a value outside the tuple, or an argument not listed, is one line.
EVA_ARGS = {
  **dict.fromkeys(('global_pool', 'num_heads', 'init_values', 'class_token', 'use_fc_norm'), 'read'),
  **dict.fromkeys(('use_rot_pos_emb', 'rope_type', 'rope_temperature', 'rope_grid_indexing', 'ref_feat_shape'), 'read'),
  'rope_rotate_half': 'read',
  'norm_layer': (None,),
  'attn_type': ('eva', 'rope'),  # The same computation: fused qkv, no key bias in 'eva' (the tensors show it).
  'qkv_fused': _TENSORS,  # attn.qkv, or attn.q_proj / k_proj / v_proj (layout 'timm_eva': EVA-02 base, large).
  **dict.fromkeys(('num_kv_heads', 'rope_mrope_section'), (None,)),
  **dict.fromkeys(('swiglu_mlp', 'scale_mlp'), _TENSORS),  # SwiGLU's gate, the hidden LayerNorm (mlp.norm).
  **dict.fromkeys(('scale_attn_inner', 'qk_norm', 'use_post_norm'), (False,)),
  'attn_only_layer_scale': (False,),
  'rope_grid_offset': 'read',
  **dict.fromkeys(('img_size', 'patch_size', 'in_chans', 'num_classes', 'embed_dim', 'depth', 'mlp_ratio'), _TENSORS),
  **dict.fromkeys(('qkv_bias', 'num_reg_tokens', 'no_embed_class', 'use_abs_pos_emb'), _TENSORS),
  **dict.fromkeys(('use_pre_transformer_norm', 'use_post_transformer_norm'), _TENSORS),
  'attn_pool_num_heads': 'read',  # model.map_heads: not in the shapes.
  **dict.fromkeys(('attn_pool_mlp_ratio', 'swiglu_align_to'), _TENSORS),
  **dict.fromkeys(('drop_rate', 'pos_drop_rate', 'patch_drop_rate', 'proj_drop_rate', 'attn_drop_rate'), _NEUTRAL),
  **dict.fromkeys(('drop_path_rate', 'dynamic_img_size', 'dynamic_img_pad', 'head_init_scale'), _NEUTRAL),
  **dict.fromkeys(('rope_shift_coords', 'rope_jitter_coords', 'rope_rescale_coords', 'device', 'dtype'), _NEUTRAL),
}
_ROPE_TYPES = {'cat': 'axial', 'mixed': 'mixed', 'dinov3': 'dinov3'}

_BLOCK = {
  'norm1': 'LayerNorm_0',
  'norm2': 'LayerNorm_2',
  'mlp.fc1': 'MlpBlock_3/Dense_0',
  'mlp.fc2': 'MlpBlock_3/Dense_1',
  'mlp.norm': 'MlpBlock_3/norm',  # The hidden LayerNorm (scale_mlp_norm, Eva's scale_mlp): model.mlp_norm.
  'attn.proj': 'MultiHeadDotProductAttention_1/out',
}
# Eva's unpacked SwiGLU (with scale_mlp: EVA-02 base and large), read only.
_EVA_SWIGLU = {'mlp.fc1_g': 'MlpBlock_3/Dense_gate', 'mlp.fc1_x': 'MlpBlock_3/Dense_0'}
_TOP = {
  'norm': 'Transformer/encoder_norm',
  'head': 'head',
  'head_dist': 'head_dist',
  'norm_pre': 'norm_pre',
  'fc_norm': 'fc_norm',
}
_POOL = {
  'attn_pool.norm': 'MAPHead_0/LayerNorm_0',
  'attn_pool.mlp.fc1': 'MAPHead_0/MlpBlock_0/Dense_0',
  'attn_pool.mlp.fc2': 'MAPHead_0/MlpBlock_0/Dense_1',
  'attn_pool.proj': 'MAPHead_0/MultiHeadDotProductAttention_0/out',
}
_TOKENS = {
  'cls_token': 'cls',
  'dist_token': 'dist',
  'reg_token': 'reg',
  'attn_pool.latent': 'MAPHead_0/probe',
  'rope.freqs': 'rope/freqs',
}


def _linear(prefix: str, tensors: Mapping[str, np.ndarray], out: str, num_heads: int) -> dict[str, np.ndarray]:
  """A Linear (kernel transposed; an attention output's split by heads) or LayerNorm (weight -> scale) of timm
  under the release name `out`."""
  w, b = tensors[f'{prefix}.weight'], tensors[f'{prefix}.bias']
  if 'norm' in prefix.split('.')[-1]:  # norm, norm1, norm2, norm_pre, fc_norm.
    return {f'{out}/scale': w, f'{out}/bias': b}
  kernel = w.T.reshape(num_heads, -1, w.shape[0]) if out.endswith('/out') else w.T
  return {f'{out}/kernel': kernel, f'{out}/bias': b}


def _qkv(kernel: np.ndarray, bias: np.ndarray, out: str, num_heads: int) -> dict[str, np.ndarray]:
  """A fused (in, 3 * width) kernel, laid out (3, heads, head_dim) along its outputs -> the release's query / key /
  value (in, heads, head_dim)."""
  d = kernel.shape[1] // 3
  flat = {}
  for i, name in enumerate(('query', 'key', 'value')):
    flat[f'{out}/{name}/kernel'] = kernel[:, i * d : (i + 1) * d].reshape(kernel.shape[0], num_heads, -1)
    flat[f'{out}/{name}/bias'] = bias[i * d : (i + 1) * d].reshape(num_heads, -1)
  return flat


def _qkv_bias(tensors: Mapping[str, np.ndarray], attn: str) -> tuple[np.ndarray, list[str]]:
  """The fused query/key/value bias of block attention `attn` and the tensors it came from: `qkv.bias`; Eva's
  `q_bias` and `v_bias` (its keys have none: zeros); or, without a bias (qkv_bias=False), zeros: the same
  function."""
  if f'{attn}.qkv.bias' in tensors:
    return tensors[f'{attn}.qkv.bias'], [f'{attn}.qkv.bias']
  rows = _shape(tensors, f'{attn}.qkv.weight')[0] // 3
  dtype = tensors[f'{attn}.qkv.weight'].dtype
  if f'{attn}.q_bias' in tensors and f'{attn}.v_bias' in tensors:
    q, v = tensors[f'{attn}.q_bias'], tensors[f'{attn}.v_bias']
    return np.concatenate([q, np.zeros(rows, dtype), v]), [f'{attn}.q_bias', f'{attn}.v_bias']
  return np.zeros(3 * rows, dtype), []


def to_release(tensors: Mapping[str, np.ndarray], num_heads: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """timm names -> (release names (layout of `release.to_release`), release name -> the timm tensor or module it
  came from, for messages). A name not recognised is kept as it is, so `release.from_release` names it among the
  unexpected keys."""
  flat, origin, used = {}, {}, set()

  def put(new, module, *names):
    flat.update(new)
    origin.update(dict.fromkeys(new, module))
    used.update(names or [module])

  def pair(module):
    return f'{module}.weight' in tensors and f'{module}.bias' in tensors

  for name in tensors:
    if name in _TOKENS:
      put({_TOKENS[name]: tensors[name]}, name)
  if 'pos_embed' in tensors:
    put({'Transformer/posembed_input/pos_embedding': tensors['pos_embed']}, 'pos_embed')
  linears = _TOP | _POOL
  if 'patch_embed.proj.weight' in tensors:
    kernel = tensors['patch_embed.proj.weight'].transpose(2, 3, 1, 0)
    # CLIP's patch embedding has no bias: a zero one is the same function.
    bias = (
      tensors['patch_embed.proj.bias']
      if 'patch_embed.proj.bias' in tensors
      else np.zeros(kernel.shape[-1], kernel.dtype)
    )
    put(
      {'embedding/kernel': kernel, 'embedding/bias': bias},
      'patch_embed.proj',
      'patch_embed.proj.weight',
      'patch_embed.proj.bias',
    )
  for i in sorted({int(m.group(1)) for n in tensors if (m := re.match(r'blocks\.(\d+)\.', n))}):
    for part, out in (_BLOCK | _EVA_SWIGLU).items():
      linears[f'blocks.{i}.{part}'] = f'Transformer/encoderblock_{i}/{out}'
    fc1 = f'blocks.{i}.mlp.fc1'
    if pair(fc1) and _packed(tensors, i):  # SwiGLU: gate and value, split (views of the file's tensor).
      del linears[fc1]
      w, b, h = tensors[f'{fc1}.weight'], tensors[f'{fc1}.bias'], _shape(tensors, f'{fc1}.weight')[0] // 2
      out = f'Transformer/encoderblock_{i}/MlpBlock_3'
      new = {f'{out}/Dense_gate/kernel': w[:h].T, f'{out}/Dense_gate/bias': b[:h]}
      put(new | {f'{out}/Dense_0/kernel': w[h:].T, f'{out}/Dense_0/bias': b[h:]}, fc1, f'{fc1}.weight', f'{fc1}.bias')
    qkv, out = f'blocks.{i}.attn.qkv', f'Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1'
    if f'{qkv}.weight' in tensors:
      bias, names = _qkv_bias(tensors, f'blocks.{i}.attn')
      put(_qkv(tensors[f'{qkv}.weight'].T, bias, out, num_heads), qkv, f'{qkv}.weight', *names)
    separate = [f'blocks.{i}.attn.{n}_proj' for n in 'qkv']
    if all(f'{p}.weight' in tensors for p in separate):  # Eva's unfused projections (the key's without a bias).
      weight = np.concatenate([tensors[f'{p}.weight'] for p in separate])
      zeros = np.zeros(weight.shape[0] // 3, weight.dtype)
      bias = np.concatenate([tensors[f'{p}.bias'] if f'{p}.bias' in tensors else zeros for p in separate])
      names = [f'{p}.{w}' for p in separate for w in ('weight', 'bias') if f'{p}.{w}' in tensors]
      put(_qkv(weight.T, bias, out, num_heads), f'blocks.{i}.attn.q_proj + k_proj + v_proj', *names)
    for j in range(2):
      for name in (f'blocks.{i}.ls{j + 1}.gamma', f'blocks.{i}.gamma_{j + 1}'):  # VisionTransformer's, Eva's.
        if name in tensors:
          put({f'Transformer/encoderblock_{i}/LayerScale_{j}/gamma': tensors[name]}, name)
  for module, out in linears.items():
    if pair(module):
      put(_linear(module, tensors, out, num_heads), module, f'{module}.weight', f'{module}.bias')
  if all(pair(f'attn_pool.{n}') for n in ('q', 'kv')):
    kernel = np.concatenate([tensors['attn_pool.q.weight'].T, tensors['attn_pool.kv.weight'].T], axis=1)
    bias = np.concatenate([tensors['attn_pool.q.bias'], tensors['attn_pool.kv.bias']])
    names = [f'attn_pool.{n}.{w}' for n in ('q', 'kv') for w in ('weight', 'bias')]
    put(_qkv(kernel, bias, 'MAPHead_0/MultiHeadDotProductAttention_0', num_heads), 'attn_pool.q + kv', *names)
  return flat | {name: tensors[name] for name in tensors if name not in used}, origin


def _shape(tensors: Any, name: str) -> tuple[int, ...]:
  return tensors.shape(name) if hasattr(tensors, 'shape') else tuple(np.shape(tensors[name]))


def _packed(tensors: Any, block: int) -> bool:
  """Whether block `block`'s mlp.fc1 packs SwiGLU's gate and value: twice as many outputs as fc2 has inputs."""
  fc1, fc2 = (f'blocks.{block}.mlp.{n}.weight' for n in ('fc1', 'fc2'))
  return fc1 in tensors and fc2 in tensors and _shape(tensors, fc1)[0] == 2 * _shape(tensors, fc2)[1]


# timm 1.0.31's architectures built with act_layer='gelu_tanh' in their own definitions (SigLIP 2's image towers),
# which their config.json does not repeat.
TANH_GELU = (
  'vit_base_patch32_siglip_256',
  'vit_large_patch16_siglip_512',
  'vit_so400m_patch16_siglip_256',
  'vit_so400m_patch16_siglip_384',
  'vit_so400m_patch16_siglip_512',
  'vit_giantopt_patch16_siglip_256',
  'vit_giantopt_patch16_siglip_384',
  'vit_base_patch32_siglip_gap_256',
  'vit_large_patch16_siglip_gap_512',
  'vit_so400m_patch16_siglip_gap_256',
  'vit_so400m_patch16_siglip_gap_384',
  'vit_so400m_patch16_siglip_gap_512',
  'vit_giantopt_patch16_siglip_gap_256',
  'vit_giantopt_patch16_siglip_gap_384',
)


def timm_options(config: dict[str, Any]) -> dict[str, Any]:
  """The encoder options timm computes the folder's architecture with: GELU form, LayerNorm epsilon, activation."""
  architecture, args = config.get('architecture', ''), config.get('model_args') or {}
  quick = 'quickgelu' in architecture or args.get('act_layer') == 'quick_gelu'
  epsilon = 1e-5 if '_clip_' in architecture else TIMM_OPTIONS['layernorm_epsilon']  # CLIP: nn.LayerNorm's default.
  approximate = args.get('act_layer') == 'gelu_tanh' or architecture.split('.')[0] in TANH_GELU
  return TIMM_OPTIONS | dict(
    gelu_approximate=approximate, layernorm_epsilon=epsilon, activation='quick_gelu' if quick else 'gelu'
  )


def projection(config: dict[str, Any]) -> bool:
  """Whether a timm folder's `head` is a CLIP image tower's output projection (an embedding), not a classifier: a
  `*_clip_*` or Perception Encoder architecture as released, unless the folder says it classifies: label names, a
  fine-tuned pretrained tag (`laion2b_ft_in12k_in1k`: timm's ImageNet classifiers made from CLIP towers), or a
  num_classes other than its pretrained_cfg's (the projection's width: a head replaced to fine-tune, e.g.
  `timm.create_model(..., num_classes=10)`)."""
  cfg = config.get('pretrained_cfg') or {}
  architecture = str(config.get('architecture', ''))
  clip = '_clip_' in architecture or architecture.startswith('vit_pe_core_')  # Perception Encoder is a CLIP.
  tuned = re.search(r'(^|_)ft(_|$)', str(cfg.get('tag', ''))) or config.get('label_names')
  replaced = cfg.get('num_classes') is not None and config.get('num_classes', cfg['num_classes']) != cfg['num_classes']
  return clip and not tuned and not replaced


_EVA_ONLY = ('rope.freqs', 'blocks.0.gamma_1', 'blocks.0.attn.q_bias')


def _eva(config: dict[str, Any], names: set[str]) -> tuple[dict[str, Any], float] | None:
  """The rotary options and LayerNorm epsilon of a folder of timm's Eva class that our ViT computes (EVA), None for
  a VisionTransformer; an Eva architecture not in EVA is one line."""
  architecture = str(config.get('architecture', '')).split('.')[0]
  for pattern, rope, epsilon in EVA:
    if match := re.fullmatch(pattern, architecture):
      if rope.get('rope_ref_grid') == _NAMED_GRID:
        rope = rope | dict(rope_ref_grid=int(match['size']) // int(match['patch']))
      return rope, epsilon
  if any(n in names for n in _EVA_ONLY) or re.match(r'(eva|vit_pe_)', architecture):
    raise ConfigError(
      f"init_from: timm {errors.foreign(architecture or 'model')} is of timm's Eva class, of which our ViT reads the "
      'RoPE ViTs (vit_*_patch16_rope_*_224, vit_*_patch16_rope_reg*_gap_256), DINOv3 (vit_*_patch16_dinov3*), '
      'EVA-02 (eva02_*_patch14_224/336/448) and PE core (vit_pe_core_*)'
    )
  return None


def _rope_options(eva: tuple[dict[str, Any], float], args: dict[str, Any], names: set[str]) -> dict[str, Any]:
  """model.rope and its keys of an Eva folder: its architecture's, as its model_args change them."""
  options = dict(rope=None, rope_temperature=100.0, rope_axes='xy', rope_ref_grid=None, rope_offset=0.0)
  options = options | dict(map_heads=None) | eva[0]
  where = 'init_from: the config.json of timm'
  for key in ('rope_grid_offset', 'rope_temperature'):
    value = args.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      raise ConfigError(f'{where} has model_args.{key}={errors.foreign(repr(value), 40)}; it must be a number')
  if 'rope_grid_offset' in args:
    options['rope_offset'] = float(args['rope_grid_offset'])
  if args.get('attn_pool_num_heads') is not None:
    errors.positive_ints(where, {'model_args.attn_pool_num_heads': args['attn_pool_num_heads']})
    options['map_heads'] = args['attn_pool_num_heads']
  if args.get('use_rot_pos_emb', True) is False:
    return options | dict(rope=None)
  if 'rope_type' in args:
    if args['rope_type'] not in _ROPE_TYPES:
      raise ConfigError(
        f'{where} has model_args.rope_type={errors.foreign(repr(args["rope_type"]), 40)}, which our '
        f'ViT does not compute (it reads {", ".join(map(repr, _ROPE_TYPES))})'
      )
    options['rope'] = _ROPE_TYPES[args['rope_type']]
  if 'rope.freqs' in names:
    options['rope'] = 'mixed'
  if 'rope_temperature' in args:
    options['rope_temperature'] = float(args['rope_temperature'])
  if 'rope_grid_indexing' in args:
    options['rope_axes'] = args['rope_grid_indexing']
  if 'ref_feat_shape' in args:
    ref = args['ref_feat_shape']
    ref = [ref, ref] if isinstance(ref, int) or ref is None else list(ref) if isinstance(ref, list) else [ref]
    if len(ref) != 2 or ref[0] != ref[1]:
      raise ConfigError(f'{where} has model_args.ref_feat_shape={errors.foreign(ref, 40)}; our ViT reads square ones')
    if ref[0] is not None:
      errors.positive_ints(where, {'model_args.ref_feat_shape[0]': ref[0]})
    options['rope_ref_grid'] = ref[0]
  half = args.get('rope_rotate_half', options['rope'] == 'dinov3')
  if half != (options['rope'] == 'dinov3'):
    raise ConfigError(
      f'{where} has model_args.rope_rotate_half={half!r} with rope {options["rope"]!r}, which our '
      "ViT does not compute (rotate-half pairs are DINOv3's)"
    )
  return options


def vit_options(config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The ViT constructor keys of the folder's model (its config.json and tensor shapes), with `input_shape`
  (height, width, channels) and `num_classes` (0: a backbone released without a head)."""
  names = set(tensors)
  eva = _eva(config, names)
  _refuse_unread(config, names, eva is not None)  # Before anything else is asked of a folder we cannot compute.
  width, channels, patch, _ = _shape(tensors, 'patch_embed.proj.weight')
  args = config.get('model_args') or {}
  architecture = config.get('architecture', '?')
  num_heads = args['num_heads'] if 'num_heads' in args else heads_of(str(architecture))
  if num_heads is None:
    raise ConfigError(
      f'init_from: the number of heads of timm architecture {errors.foreign(architecture)!r} is unknown (config.json '
      'has no model_args.num_heads): set it in config.json'
    )
  input_size = (config.get('pretrained_cfg') or {}).get('input_size', [3, 224, 224])
  where = 'init_from: the config.json of timm'
  if not isinstance(input_size, list) or len(input_size) != 3:
    raise ConfigError(
      f'{where} has pretrained_cfg.input_size={errors.foreign(input_size, 60)}; it must be [channels, height, width]'
    )
  height, wide = input_size[1:]
  errors.positive_ints(where, {'model_args.num_heads': num_heads, 'pretrained_cfg.input_size[1]': height})
  errors.positive_ints(where, {'pretrained_cfg.input_size[2]': wide})
  if eva is None:
    mean = args.get('global_pool', config.get('global_pool')) == 'avg'  # Beside a class token: timm's fine-tuned MAE.
    pool = 'map' if 'attn_pool.latent' in names else 'tok' if 'cls_token' in names and not mean else 'gap'
  else:
    pool = {'token': 'tok', 'avg': 'gap', 'map': 'map'}[args.get('global_pool', config.get('global_pool') or 'avg')]
  reg_tokens = _shape(tensors, 'reg_token')[1] if 'reg_token' in names else 0
  prefix = int('cls_token' in names) + int('dist_token' in names) + reg_tokens
  rows = _shape(tensors, 'pos_embed')[1] if 'pos_embed' in names else None
  grid = (height // patch) * (wide // patch)
  if rows is not None and rows not in (grid, grid + prefix):  # The input size says nothing: a square grid then.
    grid = rows if math.isqrt(rows) ** 2 == rows else rows - prefix
  rope = _rope_options(eva, args, names) if eva is not None else {}
  swiglu = _packed(tensors, 0) or 'blocks.0.mlp.fc1_g.weight' in names
  class_token = 'cls_token' in names
  gamma = 'blocks.0.ls1.gamma' in names or 'blocks.0.gamma_1' in names
  options = dict(
    num_classes=_shape(tensors, 'head.weight')[0] if 'head.weight' in names else 0,
    input_shape=(height, wide, channels),
    patch_size=patch,
    width=width,
    depth=len({n.split('.')[1] for n in names if n.startswith('blocks.')}),
    mlp_dim=_shape(tensors, 'blocks.0.mlp.fc2.weight')[1],
    num_heads=num_heads,
    pool=pool,
    class_token=None if class_token == (pool == 'tok') else class_token,
    posemb='learn' if rows is not None else 'none' if rope.get('rope') else 'sincos2d',
    posemb_prefix=rows is None or prefix == 0 or rows != grid,
    distilled='dist_token' in names,
    reg_tokens=reg_tokens,
    layerscale=(args.get('init_values') or 1e-5) if gamma else None,
    norm_pre='norm_pre.weight' in names,
    mlp='swiglu' if swiglu else 'plain',
    mlp_norm='blocks.0.mlp.norm.weight' in names,
    fc_norm='fc_norm.weight' in names,
    map_mlp_dim=None,
    map_prefix=eva is not None and pool == 'map' and prefix > 0,  # Eva's pool attends over every token.
  )
  if 'attn_pool.mlp.fc1.weight' in names and _shape(tensors, 'attn_pool.mlp.fc1.weight')[0] != options['mlp_dim']:
    options['map_mlp_dim'] = _shape(tensors, 'attn_pool.mlp.fc1.weight')[0]
  options |= rope
  if options.get('map_heads') == num_heads:  # The same as model.map_heads=None.
    options['map_heads'] = None
  if eva is not None:
    return options | timm_options(config) | dict(layernorm_epsilon=eva[1])
  return options | timm_options(config)


def adapt(config: dict[str, Any], tensors: hub.Tensors) -> hub.Tensors:
  """The folder's tensors as our ViT reads them: timm's fc_norm after a class-token pool (global_pool='token' with
  fc_norm=True; Eva's use_fc_norm=True) is the final LayerNorm, which normalises each token alike, so taking the
  token first or last computes the same (model.pool='tok')."""
  names = set(tensors)
  default = 'avg' if _eva(config, names) is not None else 'token'
  pool = (config.get('model_args') or {}).get('global_pool', config.get('global_pool') or default)
  if pool == 'token' and 'fc_norm.weight' in names and 'norm.weight' not in names:
    return tensors.renamed({'fc_norm.weight': 'norm.weight', 'fc_norm.bias': 'norm.bias'})
  return tensors


def _refuse_unread(config: dict[str, Any], names: set[str], eva: bool) -> None:
  """What the folder computes that our ViT does not, each one line naming it (rather than a model that loads and
  computes something else): timm's mean pooling beside a class token and fc_norm after the pooling (both read
  from Eva folders), max pooling, no absolute position table (pos_embed='none'; Eva folders: no rotary embedding
  either), a final LayerNorm both before and after an Eva folder's pooling, or neither."""
  args = config.get('model_args') or {}
  pool = args.get('global_pool', config.get('global_pool') or ('avg' if eva else 'token'))
  where = f'init_from: timm {errors.foreign(config.get("architecture", "ViT"))}'
  known, kind = (EVA_ARGS, 'Eva') if eva else (MODEL_ARGS, 'VisionTransformer')
  for key, value in args.items():
    how = known.get(key)
    if how is None:
      raise ConfigError(
        f"{where} has model_args.{errors.foreign(key, 60)}, not an argument of timm's {kind}: a model of another "
        'class, which our ViT does not read'
      )
    if isinstance(how, tuple) and value not in how:
      raise ConfigError(
        f'{where} has model_args.{key}={errors.foreign(repr(value), 60)}, which our ViT does not compute (it reads '
        f'{", ".join(map(repr, how))})'
      )
  if pool not in ('token', 'avg', 'map', '', None) or (eva and pool == ''):
    raise ConfigError(f'{where} has global_pool={pool!r}, which our ViT does not compute')
  if ('norm.weight' in names) == ('fc_norm.weight' in names):
    which = 'both before and after' if 'norm.weight' in names else 'neither before nor after'
    raise ConfigError(f'{where} has a final LayerNorm {which} the pooling, which our ViT does not compute')
  if 'pos_embed' not in names and not (eva and args.get('use_rot_pos_emb', True)):
    raise ConfigError(
      f'{where} has no absolute position table (pos_embed={args.get("pos_embed", "none")!r}, or rotary position '
      'embeddings of a class our ViT does not read), which our ViT does not compute'
    )


TIMM_MEAN, TIMM_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # timm's defaults (ImageNet's).


def preprocessing(path: str, config: dict[str, Any]) -> hub.Preprocessing:
  """The folder's evaluation preprocessing as timm's eval transform applies it, from its `pretrained_cfg`
  (input_size, crop_pct, crop_mode, interpolation, mean, std)."""
  cfg = config.get('pretrained_cfg') or {}
  height, width = cfg.get('input_size', [3, 224, 224])[1:]
  crop_pct, mode = cfg.get('crop_pct') or 0.875, cfg.get('crop_mode') or 'center'  # None or 0: timm's default.
  errors.check(
    isinstance(crop_pct, (int, float)) and not isinstance(crop_pct, bool) and crop_pct > 0,
    f'--pretrained {path}: pretrained_cfg.crop_pct={errors.foreign(crop_pct, 60)} must be a positive number',
  )
  errors.check(mode in ('center', 'squash'), f'--pretrained {path}: pretrained_cfg.crop_mode={mode!r} is not read')
  # timm's transforms_factory: the shorter side to size / crop_pct for a square input, else both sides.
  scaled = (math.floor(height / crop_pct), math.floor(width / crop_pct))
  resize = scaled[0] if height == width and mode == 'center' else scaled
  method = cfg.get('interpolation') or 'bicubic'  # Missing or null: timm's resolve_data_config default.
  errors.check(
    method in ('box', 'bilinear', 'hamming', 'bicubic', 'lanczos'),
    f'--pretrained {path}: interpolation={method!r} is not read (Pillow filters are: box, bilinear, hamming, bicubic, '
    "lanczos; Pillow's nearest is not reproduced)",
  )
  mean, std = cfg.get('mean', TIMM_MEAN), cfg.get('std', TIMM_STD)
  return hub.Preprocessing(resize, (height, width), method, 1 / 255, tuple(mean), tuple(std), crop_round=True)


def posemb_resize(config: dict[str, Any]) -> tuple[str, str]:
  """How timm resamples the folder's position embeddings to another grid (method, why), for release.from_release."""
  return POSEMB_RESIZE


def notes(config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> list[str]:
  """What the load notes first: the architecture read."""
  return [f'timm {errors.foreign(config.get("architecture", "ViT"))} read from its safetensors']


def from_release(flat: Mapping[str, np.ndarray], patches: int | None = None) -> dict[str, np.ndarray]:
  """The release flat layout (`release.to_release`) -> timm's VisionTransformer state dict, the inverse of
  `to_release` (what `tools.export --layout timm` writes). A release name timm has no place for is one line. Beside
  norm_pre timm's patch embedding has no bias: ours is added to the position table's rows of the `patches` patch
  tokens (the same function), or refused in one line where there is no table."""
  out, used = {}, set()
  inverse = {v: k for k, v in (_TOP | _POOL | _TOKENS).items()}
  blocks = sorted({int(m.group(1)) for n in flat if (m := re.match(r'Transformer/encoderblock_(\d+)/', n))})
  for i in blocks:
    inverse |= {f'Transformer/encoderblock_{i}/{v}': f'blocks.{i}.{k}' for k, v in _BLOCK.items()}
    for j, ls in enumerate(('ls1', 'ls2')):
      inverse[f'Transformer/encoderblock_{i}/LayerScale_{j}/gamma'] = f'blocks.{i}.{ls}.gamma'
  inverse['Transformer/posembed_input/pos_embedding'] = 'pos_embed'

  def take(name):
    used.add(name)
    return np.asarray(flat[name])

  for name in flat:
    if name in inverse and not name.endswith(('/kernel', '/bias', '/scale')):  # Tokens, gammas, positions.
      out[inverse[name]] = take(name)
  if 'embedding/kernel' in flat:
    out['patch_embed.proj.weight'] = take('embedding/kernel').transpose(3, 2, 0, 1)
    out['patch_embed.proj.bias'] = take('embedding/bias')
    # timm's patch embedding has no bias beside norm_pre (CLIP, PE): it goes into the patches' positions.
    if 'norm_pre/scale' in flat:
      bias = out.pop('patch_embed.proj.bias')
      if bias.any():
        errors.check(
          'pos_embed' in out and patches is not None,
          "--layout timm: timm's patch embedding beside norm_pre has no bias, and this model's is not zero with no "
          'position table to carry it',
        )
        out['pos_embed'] = np.array(out['pos_embed'])
        out['pos_embed'][:, -patches:] += bias
  for module, timm_name in inverse.items():
    if f'{module}/scale' in flat:
      out[f'{timm_name}.weight'], out[f'{timm_name}.bias'] = take(f'{module}/scale'), take(f'{module}/bias')
    elif f'{module}/kernel' in flat:
      kernel = take(f'{module}/kernel')
      out[f'{timm_name}.weight'] = kernel.reshape(-1, kernel.shape[-1]).T  # An attention output's (heads, hd, out).
      out[f'{timm_name}.bias'] = take(f'{module}/bias')

  def fused(prefix, names):
    kernels = [take(f'{prefix}/{n}/kernel') for n in names]
    biases = [take(f'{prefix}/{n}/bias') for n in names]
    weight = np.concatenate([k.reshape(k.shape[0], -1) for k in kernels], axis=1).T
    return weight, np.concatenate([b.reshape(-1) for b in biases])

  for i in blocks:
    mlp = f'Transformer/encoderblock_{i}/MlpBlock_3'
    if f'{mlp}/Dense_gate/kernel' in flat:  # SwiGLU: timm's SwiGLUPacked fc1, the gate's outputs first.
      weight, bias = fused(mlp, ('Dense_gate', 'Dense_0'))
      out[f'blocks.{i}.mlp.fc1.weight'], out[f'blocks.{i}.mlp.fc1.bias'] = weight, bias
    prefix = f'Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1'
    if f'{prefix}/query/kernel' in flat:
      out[f'blocks.{i}.attn.qkv.weight'], out[f'blocks.{i}.attn.qkv.bias'] = fused(prefix, ('query', 'key', 'value'))
  prefix = 'MAPHead_0/MultiHeadDotProductAttention_0'
  if f'{prefix}/query/kernel' in flat:
    out['attn_pool.q.weight'], out['attn_pool.q.bias'] = fused(prefix, ('query',))
    out['attn_pool.kv.weight'], out['attn_pool.kv.bias'] = fused(prefix, ('key', 'value'))
  left = sorted(set(flat) - used)
  if left:
    raise ConfigError(f'--layout timm: timm has no place for {", ".join(left[:5])}{" ..." if len(left) > 5 else ""}')
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def is_eva(structure: dict[str, Any]) -> bool:
  """Whether a ViT of `structure` (ViT.structure) is written as timm's Eva class: rotary embeddings, no position
  table, a class token beside the mean pool, or fc_norm, none of which timm's VisionTransformer computes."""
  return bool(structure['rope'] or structure['posemb'] == 'none' or structure['fc_norm'] or structure['class_token'])


def eva_args(structure: dict[str, Any], layernorm_epsilon: float, gelu_approximate: bool) -> tuple[str, dict]:
  """The timm architecture and model_args that build the ViT of `structure` as timm's Eva (the inverse of
  `vit_options` for EVA's rows), the architecture chosen for its LayerNorm epsilon, which model_args cannot carry:
  the RoPE-ViT's 1e-6 or DINOv3's 1e-5. What Eva does not compute is one line."""
  where = '--layout timm: timm computes the rotary ViT (its Eva class) with'
  fixed = dict(distilled=False, activation='gelu', posemb_prefix=structure['posemb_prefix'])
  for key, value in fixed.items():
    if structure[key] != value:
      raise ConfigError(f'{where} model.{key}={value!r}; this model has model.{key}={structure[key]!r}')
  if gelu_approximate or structure['posemb'] == 'sincos2d' or structure['pool'] == 'tok_gap':
    raise ConfigError(
      f"{where} the exact GELU, learned or no position embeddings and pool 'tok', 'gap' or 'map': this model has "
      f'gelu_approximate={gelu_approximate}, posemb={structure["posemb"]!r}, pool={structure["pool"]!r}'
    )
  architectures = {1e-6: 'vit_base_patch16_rope_224', 1e-5: 'vit_base_patch16_dinov3'}
  if layernorm_epsilon not in architectures:
    raise ConfigError(f'{where} LayerNorm epsilon 1e-6 or 1e-5; this model has {layernorm_epsilon}')
  rope = structure['rope']
  kinds = {v: k for k, v in _ROPE_TYPES.items()}
  class_token = structure['class_token'] if structure['class_token'] is not None else structure['pool'] == 'tok'
  args = dict(
    embed_dim=structure['width'],
    depth=structure['depth'],
    num_heads=structure['num_heads'],
    mlp_ratio=structure['mlp_dim'] / structure['width'],
    global_pool={'tok': 'token', 'gap': 'avg', 'map': 'map'}[structure['pool']],
    class_token=class_token,
    num_reg_tokens=structure['reg_tokens'],
    use_abs_pos_emb=structure['posemb'] == 'learn',
    no_embed_class=not structure['posemb_prefix'],
    use_rot_pos_emb=rope is not None,
    rope_type=kinds.get(rope, 'cat'),
    rope_temperature=structure['rope_temperature'],
    rope_grid_indexing=structure['rope_axes'],
    rope_rotate_half=rope == 'dinov3',
    rope_grid_offset=structure['rope_offset'],
    ref_feat_shape=None if structure['rope_ref_grid'] is None else [structure['rope_ref_grid']] * 2,
    # Both architectures set init_values, and timm drops a None argument: no LayerScale is written as unit gammas.
    init_values=structure['layerscale'] or 1.0,
    use_fc_norm=structure['fc_norm'],
    use_post_transformer_norm=not structure['fc_norm'],
    use_pre_transformer_norm=structure['norm_pre'],  # Perception Encoder's, with a patch embedding without bias.
    swiglu_mlp=structure['mlp'] == 'swiglu',  # EVA-02's: packed (GluMlp, gate first), or fc1_g / fc1_x with scale_mlp.
    scale_mlp=structure['mlp_norm'],
    qkv_bias=True,
    attn_type='rope',  # A fused qkv with its bias (ours has a key bias, which 'eva' attention has not).
    dynamic_img_size=False,
  )
  if rope == 'mixed':  # RoPE-Mixed takes no reference grid.
    del args['ref_feat_shape']
  prefix = int(class_token) + structure['reg_tokens']
  if structure['pool'] == 'map' and prefix and not structure['map_prefix']:
    raise ConfigError(
      f'{where} an attention pool over every token, the {prefix} before the patches too: this model '
      'has model.map_prefix=False'
    )
  if structure['pool'] == 'map':
    args['attn_pool_num_heads'] = structure['map_heads'] or structure['num_heads']
    args['attn_pool_mlp_ratio'] = (structure['map_mlp_dim'] or structure['mlp_dim']) / structure['width']
  return architectures[layernorm_epsilon], args


def to_eva(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """VisionTransformer names (`from_release`) -> the Eva class's: LayerScale gammas `blocks.N.gamma_1` / `gamma_2`,
  of ones where the model has none (eva_args: the same function); a SwiGLU beside the hidden LayerNorm (EVA-02's
  SwiGLU module) as `fc1_g` (the gate) and `fc1_x`, the packed fc1's halves."""
  out = {re.sub(r'^(blocks\.\d+)\.ls([12])\.gamma$', r'\1.gamma_\2', k): v for k, v in tensors.items()}
  for norm in [k for k in tensors if re.fullmatch(r'blocks\.\d+\.mlp\.norm\.weight', k)]:
    fc1 = norm.replace('norm.weight', 'fc1')
    if f'{fc1}.weight' in out:  # GluMlp's packed fc1 is Eva's only without the norm.
      for part in ('weight', 'bias'):
        gate, value = np.split(out.pop(f'{fc1}.{part}'), 2)
        out[f'{fc1}_g.{part}'], out[f'{fc1}_x.{part}'] = gate, value
  for name in [k for k in tensors if re.fullmatch(r'blocks\.\d+\.norm1\.weight', k)]:
    for gamma in (name.replace('norm1.weight', 'gamma_1'), name.replace('norm1.weight', 'gamma_2')):
      out.setdefault(gamma, np.ones_like(tensors[name]))
  return out


# The ViT keys timm's VisionTransformer computes as ours only at these values (timm's LayerNorm epsilon is 1e-6).
_TIMM_FIXED = dict(
  posemb='learn',
  prenorm=True,
  representation_size=None,
  layernorm_epsilon=1e-6,
  map_heads=None,
  map_mlp_dim=None,
  map_prefix=False,
)
_TIMM_POOL = {'tok': 'token', 'map': 'map'}  # timm's 'avg' pools after fc_norm, not after the encoder norm as ours.


def folder_config(model: Any, data_config: Any) -> dict:
  """A ViT's timm config.json: its architecture and `model_args` (every size, so `timm.create_model(architecture,
  **model_args)` builds it), and `pretrained_cfg` from the run's evaluation preprocessing (data.resize_size: the
  shorter side, then a central crop, crop_pct = image size / resize size; else squashed to the input size;
  data.value_range as mean / std). A key timm computes otherwise is one line."""
  structure, options = model.structure, model.options
  eva = is_eva(structure)  # Written as timm's Eva class: eva_args checks the keys.
  mine = dict(
    posemb=structure['posemb'],
    prenorm=getattr(options, 'prenorm', True),
    representation_size=model.representation_size,
    layernorm_epsilon=options.layernorm_epsilon,
    map_heads=structure['map_heads'],
    map_mlp_dim=structure['map_mlp_dim'],
    map_prefix=structure['map_prefix'],
  )
  for key, value in () if eva else _TIMM_FIXED.items():
    errors.check(
      mine[key] == value,
      f'--layout timm: model.{key}={mine[key]!r}; timm computes the ViT with model.{key}={value!r}',
    )
  pool = structure['pool']
  errors.check(
    not structure['distilled'] or structure['posemb_prefix'],
    "--layout timm: timm's distilled ViT has position rows for its tokens: model.posemb_prefix=False is not written",
  )
  errors.check(eva or pool in _TIMM_POOL, f"--layout timm: model.pool={pool!r}; timm's ViT pools 'tok' or 'map'")
  channels = model.embedding.kernel.shape[-2]
  patch = structure['patch_size']
  height, width = model.grid[0] * patch, model.grid[1] * patch
  activation = 'gelu_tanh' if options.gelu_approximate else structure['activation']
  num_classes = model.head.out_features
  args = dict(
    img_size=[height, width],
    patch_size=patch,
    in_chans=channels,
    num_classes=num_classes,
    global_pool=_TIMM_POOL.get(pool),
    class_token=pool == 'tok',
    embed_dim=structure['width'],
    depth=structure['depth'],
    num_heads=structure['num_heads'],
    mlp_ratio=structure['mlp_dim'] / structure['width'],
    reg_tokens=structure['reg_tokens'],
    no_embed_class=not structure['posemb_prefix'],
    init_values=structure['layerscale'],
    pre_norm=structure['norm_pre'],
    act_layer=activation,
    scale_mlp_norm=structure['mlp_norm'],
  )
  low, high = data_config.value_range
  short = data_config.resize_size
  pretrained_cfg = dict(
    input_size=[channels, height, width],
    interpolation='bilinear',  # tf.image.resize's default, as our pipeline resizes.
    crop_pct=1.0 if short is None else min(height, width) / short,
    crop_mode='center' if short is not None else 'squash',
    mean=[-low / (high - low)] * channels,
    std=[1 / (high - low)] * channels,
    num_classes=num_classes,
    first_conv='patch_embed.proj',
    classifier='head',
  )
  architecture = 'deit_base_distilled_patch16_224' if structure['distilled'] else 'vit_base_patch16_224'
  if eva:
    errors.check(
      model.representation_size is None, '--layout timm: timm has no pre-logits layer (model.representation_size)'
    )
    architecture, eva = eva_args(structure, options.layernorm_epsilon, options.gelu_approximate)
    args = {k: args[k] for k in ('img_size', 'patch_size', 'in_chans', 'num_classes')} | eva
  elif structure['mlp'] == 'swiglu':  # timm's SwiGLUPacked: fc1 holds the gate and the value, with SiLU of its own.
    architecture = 'vit_giant_patch14_dinov2'
    args['mlp_ratio'] = 2 * structure['mlp_dim'] / structure['width']
    del args['act_layer']
  return dict(
    architecture=architecture,
    num_classes=num_classes,
    num_features=structure['width'],
    global_pool=args['global_pool'],
    model_args=args,
    pretrained_cfg=pretrained_cfg,
  )


EXPORTS = ('vit',)  # The model families (config.model.name) whose runs `folder` writes: tools.export --layout timm.


def folder(
  model: Any, params: dict, data_config: Any, labels: list[str] | None = None
) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
  """`params` of the ViT `model` as a timm hub folder: its JSON files by name (config.json, with `label_names` when
  given) and model.safetensors' tensors, for tools.export to write."""
  config = folder_config(model, data_config) | ({'label_names': labels} if labels else {})
  patches = model.grid[0] * model.grid[1]
  tensors = from_release(release.to_release(params, model.structure['num_heads']), patches)
  if is_eva(model.structure):
    tensors = to_eva(tensors)
  return {'config.json': config}, tensors
