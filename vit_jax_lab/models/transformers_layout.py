"""Hugging Face transformers image models (a hub folder's model.safetensors) -> the release flat layout that
`release.from_release` adapts into our ViT, and the ViT constructor keys that give the folder's model.

Three layouts (hub.LAYOUTS): 'transformers_vit', `ViTModel` / `ViTForImageClassification` / `Dinov2Model` /
`Dinov2WithRegistersModel` (separate query / key / value Linears under `encoder.layer.N.attention.attention`), and
'transformers_clip', `CLIPVisionModel` / `CLIPVisionModelWithProjection` / `SiglipVisionModel` / `Siglip2VisionModel`
(SigLIP 2's Linear on patches cut row, column, channel is our patch kernel; its square table of `num_patches`
positions is resized bilinear, antialiased, as it does for each image) (`q_proj`, `k_proj`,
`v_proj` under `encoder.layers.N.self_attn`), and 'transformers_dinov3', `DINOv3ViTModel` (`q_proj`, `k_proj`,
`v_proj`, `o_proj` under `layer.N.attention`; rotary positions, model.rope='dinov3'; no key bias, or none at all:
zeros, the same function; its gated MLP `gate_proj` / `up_proj` / `down_proj` with SiLU, model.mlp='swiglu').
Folders written by transformers 4 (and whole `CLIPModel` /
`SiglipModel` folders) prefix the image tower's names with its module (`vit.`, `vision_model.`): the prefix is
stripped, and a whole model's text tower is left out.

PyTorch Linear weights are (out, in), the patch embedding a convolution (out, in, h, w). DINOv2 with registers adds
its position embeddings to the class token and the patches, never to the registers: the class token's row is added
to the class token (the same function), the rest covers the patches alone (model.posemb_prefix=False), as timm does.
DINOv2 giant's SwiGLU MLP (use_swiglu_ffn, model.mlp='swiglu') is saved as `mlp.weights_in` (the gate's outputs,
then the value's) and `mlp.weights_out`; transformers 5 splits weights_in into `gate_proj` / `up_proj` when loading
and names weights_out `down_proj`, and either naming is read.

The video classifiers `VivitForVideoClassification` and `VideoMAEForVideoClassification` are saved in the
'transformers_vit' layout too (their model_type tells them apart): the same names under `vivit.` / `videomae.`, a
Conv3d tubelet embedding (out, in, time, h, w), VideoMAE's query and value biases as `q_bias` / `v_bias` (its key has
none: a zero one is the same function, softmax being blind to a constant per query) and its `fc_norm` after the
average pool. `vivit_options` gives the ViViT keys of such a folder.

`folder` is the way back, for `tools.export --layout transformers` (the model families it writes: EXPORTS; tensors by
`from_release`, config.json and preprocessor_config.json by `folder_config` and `video_folder_config`): a ViT as
`ViTForImageClassification`, a ViViT model 1 as `VivitForVideoClassification` or, with VideoMAE's options,
`VideoMAEForVideoClassification`.
"""

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

import vit_jax_lab.models.release as release
import vit_jax_lab.models.vivit as vivit
from vit_jax_lab import errors, hub
from vit_jax_lab.errors import ConfigError

# How transformers' DINOv2 resamples position embeddings (bicubic, antialiased: as jax.image.resize's bicubic).
# ViT, CLIP and SigLIP resample only when asked (interpolate_pos_encoding), bicubic without antialiasing.
POSEMB_RESIZE = (
  'bicubic',
  "'bicubic', antialiased, as transformers' DINOv2 interpolates (its ViT, CLIP and SigLIP: without antialiasing, "
  'slightly different; not model.posemb_resize)',
)
# SigLIP 2 resizes its table to each image's patch grid bilinear, antialiased (as jax.image.resize's bilinear).
SIGLIP2_RESIZE = ('bilinear', "'bilinear', antialiased, as transformers' SigLIP 2 resizes (not model.posemb_resize)")
# model_type (of the image tower) -> the defaults of its config class, for a config.json that leaves them out.
MODEL_TYPES = {
  'vit': dict(hidden_act='gelu', layer_norm_eps=1e-12),
  'dinov2': dict(hidden_act='gelu', layer_norm_eps=1e-6),
  'dinov2_with_registers': dict(hidden_act='gelu', layer_norm_eps=1e-6),
  'clip_vision_model': dict(hidden_act='quick_gelu', layer_norm_eps=1e-5),
  'siglip_vision_model': dict(hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6),
  'siglip2_vision_model': dict(hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6, num_patches=256),
  'dinov3_vit': dict(hidden_act='gelu', layer_norm_eps=1e-5, rope_theta=100.0, layerscale_value=1.0),
}
# Whole two-tower models: their image tower's model_type; the text tower's tensors are left out.
TWO_TOWERS = {'clip': 'clip_vision_model', 'siglip': 'siglip_vision_model', 'siglip2': 'siglip2_vision_model'}
_TEXT = ('text_model.', 'text_projection.', 'logit_scale', 'logit_bias')
# transformers' hidden_act -> our (activation, gelu_approximate).
ACTIVATIONS = {
  'gelu': ('gelu', False),
  'gelu_pytorch_tanh': ('gelu', True),
  'gelu_new': ('gelu', True),
  'quick_gelu': ('quick_gelu', False),
  'gelu_fast': ('gelu', True),  # ViViT's: the tanh approximation written out.
}
# Video model_type -> the defaults of its config class (into the ViViT's model 1).
VIDEO_TYPES = {
  'vivit': dict(hidden_act='gelu_fast', layer_norm_eps=1e-6, image_size=224, num_frames=32),
  'videomae': dict(hidden_act='gelu', layer_norm_eps=1e-12, image_size=224, num_frames=16, use_mean_pooling=True),
}
# VideoMAE's fc_norm is an nn.LayerNorm built without the config's epsilon: PyTorch's default.
FC_NORM_EPSILON = 1e-5

_ATTENTION = 'MultiHeadDotProductAttention_1'
_BLOCK = {  # Module inside encoder.layer(s).N -> its release name inside Transformer/encoderblock_N.
  'layernorm_before': 'LayerNorm_0',
  'norm1': 'LayerNorm_0',
  'layer_norm1': 'LayerNorm_0',
  'layernorm_after': 'LayerNorm_2',
  'norm2': 'LayerNorm_2',
  'layer_norm2': 'LayerNorm_2',
  'attention.attention.query': f'{_ATTENTION}/query',
  'attention.attention.key': f'{_ATTENTION}/key',
  'attention.attention.value': f'{_ATTENTION}/value',
  'self_attn.q_proj': f'{_ATTENTION}/query',
  'self_attn.k_proj': f'{_ATTENTION}/key',
  'self_attn.v_proj': f'{_ATTENTION}/value',
  'attention.output.dense': f'{_ATTENTION}/out',
  'self_attn.out_proj': f'{_ATTENTION}/out',
  'intermediate.dense': 'MlpBlock_3/Dense_0',
  'mlp.fc1': 'MlpBlock_3/Dense_0',
  'output.dense': 'MlpBlock_3/Dense_1',
  'mlp.fc2': 'MlpBlock_3/Dense_1',
  'mlp.weights_out': 'MlpBlock_3/Dense_1',  # DINOv2's SwiGLU (mlp.weights_in: split in to_release).
  'mlp.up_proj': 'MlpBlock_3/Dense_0',
  'mlp.gate_proj': 'MlpBlock_3/Dense_gate',
  'mlp.down_proj': 'MlpBlock_3/Dense_1',
  'attention.q_proj': f'{_ATTENTION}/query',  # DINOv3's.
  'attention.k_proj': f'{_ATTENTION}/key',
  'attention.v_proj': f'{_ATTENTION}/value',
  'attention.o_proj': f'{_ATTENTION}/out',
}
_TOP = {
  'embeddings.patch_embeddings.projection': 'embedding',
  'embeddings.patch_embedding': 'embedding',
  'embeddings.patch_embeddings': 'embedding',  # DINOv3's Conv2d.
  'norm': 'Transformer/encoder_norm',  # DINOv3's.
  'pre_layrnorm': 'norm_pre',
  'layernorm': 'Transformer/encoder_norm',
  'post_layernorm': 'Transformer/encoder_norm',
  'pooler.dense': 'pre_logits',
  'classifier': 'head',
  'fc_norm': 'fc_norm',
  'visual_projection': 'head',
  'head.layernorm': 'MAPHead_0/LayerNorm_0',
  'head.mlp.fc1': 'MAPHead_0/MlpBlock_0/Dense_0',
  'head.mlp.fc2': 'MAPHead_0/MlpBlock_0/Dense_1',
  'head.attention.out_proj': 'MAPHead_0/MultiHeadDotProductAttention_0/out',
}
_PATCH = (
  'embeddings.patch_embeddings.projection.weight',
  'embeddings.patch_embedding.weight',
  'embeddings.patch_embeddings.weight',
)
_LAYER = re.compile(r'encoder\.layers?\.(\d+)\.')
# VideoMAE's separate query and value biases (transformers 5 renames them so on loading).
_SPLIT_BIASES = {
  '.attention.attention.q_bias': '.attention.attention.query.bias',
  '.attention.attention.v_bias': '.attention.attention.value.bias',
}


def _names(tensors: Mapping[str, Any]) -> dict[str, str]:
  """Our name (the image tower's, its module prefix stripped) -> the folder's name, for every tensor but a
  two-tower model's text tower."""
  prefix = next((n[: -len(p)] for n in tensors for p in _PATCH if n.endswith(p)), '')
  out = {}
  for name in tensors:
    short = name[len(prefix) :] if prefix and name.startswith(prefix) else name
    for split, bias in _SPLIT_BIASES.items():
      if short.endswith(split):
        short = short[: -len(split)] + bias
    if short.startswith(('layer.', 'model.layer.')):  # DINOv3's blocks (saved, in memory), named as the others'.
      short = 'encoder.' + short.removeprefix('model.')
    if not short.startswith(_TEXT):
      out[short] = name
  return out


def tensor_shape(tensors: Any, name: str) -> tuple[int, ...]:
  """A tensor's shape, read from a folder's header (hub.Tensors) without its data, or from an array."""
  return tensors.shape(name) if hasattr(tensors, 'shape') else tuple(np.shape(tensors[name]))


def tubelet(tensors: Any, name: str) -> tuple[int, int, int, int]:
  """(width, channels, time, patch) of a video model's Conv3d tubelet embedding `name` (out, in, time, h, w); a
  tubelet that is not square is one line."""
  width, channels, time, patch, patch_width = tensor_shape(tensors, name)
  if patch != patch_width:
    raise ConfigError(f'init_from: tubelets of {patch} x {patch_width} pixels are not square, as the ViViT needs')
  return width, channels, time, patch


def _square(inputs: int, channels: int) -> bool:
  """Whether a patch Linear of `inputs` features can be square patches of `channels` channels."""
  return inputs % channels == 0 and math.isqrt(inputs // channels) ** 2 == inputs // channels


# transformers' resample codes (PIL's) -> the filters of tools.pretrained.pil_resize (its image processors map
# nearest to torchvision's nearest-exact).
RESAMPLE = {0: 'nearest', 1: 'lanczos', 2: 'bilinear', 3: 'bicubic', 4: 'box', 5: 'hamming'}


def preprocessing(
  path: str, config: dict[str, Any], files: tuple[str, ...] = ('preprocessor_config.json',)
) -> hub.Preprocessing:
  """The folder's evaluation preprocessing as its image processor applies it, from preprocessor_config.json (or the
  first of `files` there: a video processor's) (size, crop, resample, rescale, image_mean, image_std; ViViT's offset,
  on by default as in VivitImageProcessor)."""
  file = next((f for f in (os.path.join(path, n) for n in files) if os.path.isfile(f)), None)
  errors.check(file is not None, f'--pretrained {path} has no {" or ".join(files)}: its preprocessing is unknown')
  p = errors.read_json(file, '--pretrained: the preprocessing')
  size = p.get('size') if p.get('do_resize', True) else None
  resize = size['shortest_edge'] if isinstance(size, dict) and 'shortest_edge' in size else size and hub.size_pair(size)
  crop = hub.size_pair(p['crop_size']) if p.get('do_center_crop') and p.get('crop_size') else None
  normalise, rescale = p.get('do_normalize', True), p.get('do_rescale', True)
  kind = str(p.get('image_processor_type', ''))
  offset = rescale and p.get('offset', kind.startswith('Vivit'))
  naflex = None
  if kind.startswith('Siglip2ImageProcessor'):  # Each image at its own grid (NaFlex), as Siglip2ImageProcessor.
    naflex = (p.get('patch_size', 16), p.get('max_num_patches', 256))
    errors.positive_ints('--pretrained: preprocessor_config.json', dict(zip(('patch_size', 'max_num_patches'), naflex)))
    resize, crop = None, None
  return hub.Preprocessing(
    resize,
    crop,
    RESAMPLE.get(p.get('resample', 2), 'bilinear'),
    p.get('rescale_factor', 1 / 255) if rescale else 1.0,
    tuple(p.get('image_mean', (0.5, 0.5, 0.5))) if normalise else (0.0,),
    tuple(p.get('image_std', (0.5, 0.5, 0.5))) if normalise else (1.0,),
    1.0 if offset else 0.0,
    library='torchvision',
    naflex=naflex,
  )


def posemb_resize(config: dict[str, Any]) -> tuple[str, str]:
  """How the folder's library resamples its position embeddings to another grid (method, why)."""
  model_type = config.get('model_type')
  return SIGLIP2_RESIZE if model_type in ('siglip2', 'siglip2_vision_model') else POSEMB_RESIZE


def convert(out: str, weight: np.ndarray, bias: np.ndarray | None, num_heads: int) -> dict[str, np.ndarray]:
  """One Linear, LayerNorm or the patch convolution under the release name `out`."""
  if bias is None:  # CLIP's patch embedding and projection have none: a zero one is the same function.
    bias = np.zeros(weight.shape[0], weight.dtype)
  if out == 'embedding' and weight.ndim == 2:  # SigLIP 2's Linear on patches cut (row, column, channel).
    side = next(math.isqrt(weight.shape[1] // c) for c in (3, 1, 4) if _square(weight.shape[1], c))
    return {'embedding/kernel': weight.T.reshape(side, side, -1, weight.shape[0]), 'embedding/bias': bias}
  if out == 'embedding':  # A Conv2d (out, in, h, w) or a video's Conv3d (out, in, time, h, w).
    return {'embedding/kernel': weight.transpose(*range(2, weight.ndim), 1, 0), 'embedding/bias': bias}
  if weight.ndim == 1:  # A LayerNorm.
    return {f'{out}/scale': weight, f'{out}/bias': bias}
  kernel = weight.T
  if out.endswith(('/query', '/key', '/value')):
    return {f'{out}/kernel': kernel.reshape(kernel.shape[0], num_heads, -1), f'{out}/bias': bias.reshape(num_heads, -1)}
  if out.endswith('/out'):
    kernel = kernel.reshape(num_heads, -1, kernel.shape[-1])
  return {f'{out}/kernel': kernel, f'{out}/bias': bias}


def _unused_map_head(names: Mapping[str, str]) -> bool:
  """SigLIP's image classifiers (Siglip(2)ForImageClassification) save their tower's attention-pool head beside a
  classifier that reads the mean of the tokens instead."""
  return 'classifier.weight' in names and 'head.probe' in names


def to_release(tensors: Mapping[str, np.ndarray], num_heads: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """transformers names -> (release names (layout of `release.to_release`), release name -> the transformers
  module it came from, for messages). A name not recognised is kept as it is, so `release.from_release` names it
  among the unexpected keys; a two-tower model's text tower, DINOv2's mask token (masked pretraining only) and a
  SigLIP classifier's unused attention-pool head are left out."""
  names = _names(tensors)
  flat, origin, used = {}, {}, {'embeddings.mask_token'}
  if _unused_map_head(names):
    used |= {n for n in names if n.startswith('head.')}
    names = {k: v for k, v in names.items() if k not in used}

  def get(short):
    return tensors[names[short]]

  def put(new, module, *shorts):
    flat.update(new)
    origin.update(dict.fromkeys(new, names.get(module, module)))
    used.update(shorts or [module])

  modules = dict(_TOP)
  for i in sorted({int(m.group(1)) for n in names if (m := _LAYER.match(n))}):
    layer = 'layer' if any(n.startswith(f'encoder.layer.{i}.') for n in names) else 'layers'
    for part, out in _BLOCK.items():
      modules[f'encoder.{layer}.{i}.{part}'] = f'Transformer/encoderblock_{i}/{out}'
    for j in (1, 2):
      gamma = f'encoder.{layer}.{i}.layer_scale{j}.lambda1'
      if gamma in names:
        put({f'Transformer/encoderblock_{i}/LayerScale_{j - 1}/gamma': get(gamma)}, gamma)
    packed = f'encoder.{layer}.{i}.mlp.weights_in'
    if f'{packed}.weight' in names and f'{packed}.bias' in names:  # SwiGLU: the gate's rows, then the value's.
      w, b = get(f'{packed}.weight'), get(f'{packed}.bias')
      h, out = w.shape[0] // 2, f'Transformer/encoderblock_{i}/MlpBlock_3'
      new = {f'{out}/Dense_gate/kernel': w[:h].T, f'{out}/Dense_gate/bias': b[:h]}
      put(
        new | {f'{out}/Dense_0/kernel': w[h:].T, f'{out}/Dense_0/bias': b[h:]},
        packed,
        *(f'{packed}.{n}' for n in ('weight', 'bias')),
      )
  for module, out in modules.items():
    weight, bias = f'{module}.weight', f'{module}.bias'
    if weight in names:
      new = convert(out, get(weight), get(bias) if bias in names else None, num_heads)
      put(new, module, weight, bias)

  tokens = {}
  if 'embeddings.cls_token' in names:
    tokens['cls'] = ('embeddings.cls_token', get('embeddings.cls_token'))
  if 'embeddings.class_embedding' in names:
    tokens['cls'] = ('embeddings.class_embedding', get('embeddings.class_embedding').reshape(1, 1, -1))
  if 'embeddings.register_tokens' in names:
    registers = get('embeddings.register_tokens')
    if registers.size:
      tokens['reg'] = ('embeddings.register_tokens', registers)
    else:  # DINOv3ViTConfig's default num_register_tokens=0 leaves a (1, 0, D) tensor: no registers, read.
      put({}, 'embeddings.register_tokens')
  if 'head.probe' in names:
    tokens['MAPHead_0/probe'] = ('head.probe', get('head.probe'))
  for pos_name in ('embeddings.position_embeddings', 'embeddings.position_embedding.weight'):
    if pos_name in names:
      pos = get(pos_name).reshape(1, -1, get(pos_name).shape[-1])
      if 'reg' in tokens and 'cls' in tokens:  # Registers get no position: the class token's row goes into it.
        module, cls = tokens['cls']
        tokens['cls'] = (module, cls + pos[:, :1])
        pos = pos[:, 1:]
      tokens['Transformer/posembed_input/pos_embedding'] = (pos_name, pos)
  for out, (module, value) in tokens.items():
    put({out: value}, module)
  if all(f'head.attention.in_proj_{w}' in names for w in ('weight', 'bias')):
    # nn.MultiheadAttention's fused (3 * width, width) projection: query, key, value along its outputs.
    kernel, bias = get('head.attention.in_proj_weight').T, get('head.attention.in_proj_bias')
    d = kernel.shape[1] // 3
    attention = {}
    for i, name in enumerate(('query', 'key', 'value')):
      attention[f'MAPHead_0/MultiHeadDotProductAttention_0/{name}/kernel'] = kernel[:, i * d : (i + 1) * d].reshape(
        kernel.shape[0], num_heads, -1
      )
      attention[f'MAPHead_0/MultiHeadDotProductAttention_0/{name}/bias'] = bias[i * d : (i + 1) * d].reshape(
        num_heads, -1
      )
    put(attention, 'head.attention', 'head.attention.in_proj_weight', 'head.attention.in_proj_bias')
  return flat | {short: get(short) for short in names if short not in used}, origin


# Every field of transformers 5.24's image configs read here (ViT, DINOv2 (with registers), CLIP, SigLIP (2), DINOv3
# and the CLIP / SigLIP (2) two-tower configs around them) and of transformers 4's PretrainedConfig, which older
# folders repeat, by how a folder's value is met, so that none is guessed (as timm_layout.MODEL_ARGS): 'read'
# (image_config, vit_options, preprocessing), 'tensors' (what it changes shows in the tensor names and shapes, each
# of which is read or refused), 'neutral' (training, initialisation, outputs or generation only: evaluation of the
# image tower computes the same). A field not listed (another model, a newer transformers) is one line.
_READ, _TENSORS, _NEUTRAL = 'read', 'tensors', 'neutral'
# PretrainedConfig's own (transformers 4 and 5): outputs, bookkeeping, tokens and generation of text models.
BASE_FIELDS = dict.fromkeys(
  (
    '_name_or_path _commit_hash _attn_implementation_autoset transformers_version dtype torch_dtype use_bfloat16 '
    'return_dict output_hidden_states output_attentions torchscript tf_legacy_loss pruned_heads problem_type '
    'chunk_size_feed_forward is_encoder_decoder is_decoder cross_attention_hidden_size add_cross_attention '
    'tie_encoder_decoder tie_word_embeddings finetuning_task tokenizer_class prefix task_specific_params '
    'bos_token_id pad_token_id eos_token_id sep_token_id decoder_start_token_id max_length min_length do_sample '
    'early_stopping num_beams num_beam_groups diversity_penalty temperature top_k top_p typical_p '
    'repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids '
    'num_return_sequences output_scores return_dict_in_generate forced_bos_token_id forced_eos_token_id '
    'remove_invalid_values exponential_decay_length_penalty suppress_tokens begin_suppress_tokens'
  ).split(),
  _NEUTRAL,
) | dict.fromkeys(('model_type', 'architectures', 'id2label', 'label2id'), _READ)
CONFIG_FIELDS = BASE_FIELDS | {
  **dict.fromkeys(('vision_config', 'text_config'), _READ),
  **dict.fromkeys(('hidden_act', 'layer_norm_eps', 'image_size', 'patch_size', 'num_channels', 'num_patches'), _READ),
  **dict.fromkeys(('num_attention_heads', 'rope_theta', 'layerscale_value', 'use_swiglu_ffn', 'use_gated_mlp'), _READ),
  'pooler_act': _READ,
  **dict.fromkeys(
    ('hidden_size', 'num_hidden_layers', 'intermediate_size', 'mlp_ratio', 'num_register_tokens'), _TENSORS
  ),
  **dict.fromkeys(('qkv_bias', 'query_bias', 'key_bias', 'value_bias', 'proj_bias', 'mlp_bias'), _TENSORS),
  **dict.fromkeys(('pooler_output_size', 'projection_dim', 'vision_use_head', 'use_mask_token'), _TENSORS),
  # Dropout and initialisation; DINOv3's position augmentation (training only); the Backbone class's feature maps;
  # SimMIM's decoder stride; CLIP's logit scale (the text tower's side).
  **dict.fromkeys(('hidden_dropout_prob', 'attention_probs_dropout_prob', 'attention_dropout', 'dropout'), _NEUTRAL),
  **dict.fromkeys(('initializer_range', 'initializer_factor', 'drop_path_rate', 'logit_scale_init_value'), _NEUTRAL),
  **dict.fromkeys(('pos_embed_shift', 'pos_embed_jitter', 'pos_embed_rescale', 'encoder_stride'), _NEUTRAL),
  **dict.fromkeys(('apply_layernorm', 'reshape_hidden_states', 'stage_names', 'out_features', 'out_indices'), _NEUTRAL),
  **dict.fromkeys(('text_config_dict', 'vision_config_dict'), _NEUTRAL),  # transformers 4's CLIP: copies.
}
# The same for the video classifiers read into the ViViT (ViViT, VideoMAE; vjepa2_layout.CONFIG_FIELDS V-JEPA 2's).
VIDEO_FIELDS = BASE_FIELDS | {
  **dict.fromkeys(('image_size', 'num_frames', 'tubelet_size', 'patch_size', 'num_channels'), _READ),
  **dict.fromkeys(('num_attention_heads', 'hidden_act', 'layer_norm_eps', 'use_mean_pooling'), _READ),
  **dict.fromkeys(('hidden_size', 'num_hidden_layers', 'intermediate_size', 'qkv_bias', 'qv_bias'), _TENSORS),
  **dict.fromkeys(('pooler_output_size', 'pooler_act'), _TENSORS),  # ViViT's pooler: its tensors are refused.
  **dict.fromkeys(('hidden_dropout_prob', 'attention_probs_dropout_prob', 'initializer_range'), _NEUTRAL),
  # VideoMAE's pretraining decoder and loss.
  **dict.fromkeys(('decoder_num_attention_heads', 'decoder_hidden_size', 'decoder_num_hidden_layers'), _NEUTRAL),
  **dict.fromkeys(('decoder_intermediate_size', 'norm_pix_loss'), _NEUTRAL),
}


def refuse_unknown(config: dict[str, Any], fields: Mapping[str, str], where: str = '') -> None:
  """A config.json field that `fields` does not list is one line (a model, or a transformers, this reader does not
  know)."""
  for key in config:
    if key not in fields:
      raise ConfigError(
        f'init_from: the transformers config.json{where} has {errors.foreign(key, 60)}, a field of another model or '
        'a newer transformers that this reader does not know'
      )


def image_config(config: dict[str, Any]) -> dict[str, Any]:
  """The image tower's config: a whole two-tower model's `vision_config` (with its model_type), else config.json's,
  its model_type's defaults filled in."""
  model_type = config.get('model_type')
  if model_type in VIDEO_TYPES:
    raise ConfigError(
      f"init_from: a transformers model_type={model_type!r} is a video model: read it into model.name='vivit'"
    )
  refuse_unknown(config, CONFIG_FIELDS)
  if model_type in TWO_TOWERS:
    config = {'model_type': TWO_TOWERS[model_type]} | (config.get('vision_config') or {})
    model_type = config['model_type']
    refuse_unknown(config, CONFIG_FIELDS, "'s vision_config")
  if model_type not in MODEL_TYPES:
    raise ConfigError(
      f'init_from: a transformers model_type={model_type!r} is not read into the ViT; read: '
      f'{", ".join([*MODEL_TYPES, *TWO_TOWERS])}'
    )
  return MODEL_TYPES[model_type] | {k: v for k, v in config.items() if v is not None}


def _sizes(config: dict[str, Any], size: Any, *counts: str) -> tuple[int, int]:
  """(height, width) of `size` (image_size: one int or a pair); these, num_attention_heads and `counts` must be
  positive integers."""
  height, wide = (size, size) if isinstance(size, int) else tuple(size)
  where = 'init_from: the transformers config.json'
  errors.positive_ints(where, {'image_size': height} if height == wide else {'image_size[0]': height})
  errors.positive_ints(where, {'image_size[1]': wide} | {k: config[k] for k in ('num_attention_heads', *counts)})
  return height, wide


def vit_options(config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The ViT constructor keys of the folder's model (its config.json and tensor shapes), with `input_shape`
  (height, width, channels) and `num_classes` (0: an image tower without a classifier or projection)."""
  config = image_config(config)
  names = _names(tensors)

  def shape(short):
    return tensor_shape(tensors, names[short])

  patch_name = next(p for p in _PATCH if p in names)
  if len(shape(patch_name)) == 2:  # SigLIP 2: a Linear on patches, a square table of num_patches positions.
    width, channels, patch = shape(patch_name)[0], config.get('num_channels', 3), config['patch_size']
    errors.positive_ints('init_from: the transformers config.json', {'num_patches': config['num_patches']})
    side = math.isqrt(config['num_patches']) * patch
    if (
      shape(patch_name)[1] != channels * patch * patch
      or math.isqrt(config['num_patches']) ** 2 != config['num_patches']
    ):
      raise ConfigError(
        f"init_from: SigLIP 2's patch embedding takes {shape(patch_name)[1]} features, not {channels} channels of "
        f'{patch} x {patch} patches, or num_patches={config["num_patches"]} is not a square grid'
      )
    height, wide = _sizes(config, side)
  else:
    width, channels, patch, _ = shape(patch_name)
    height, wide = _sizes(config, config.get('image_size', 224))
  act = config['hidden_act']
  dinov3 = config.get('model_type') == 'dinov3_vit'
  swiglu = any(f'encoder.layer.0.mlp.{m}.weight' in names for m in ('weights_in', 'gate_proj'))
  flag = 'use_gated_mlp' if dinov3 else 'use_swiglu_ffn'
  if swiglu != bool(config.get(flag)):
    raise ConfigError(
      f"init_from: config.json's {flag}={config.get(flag)!r} disagrees with the tensors, whose MLP is "
      f'{"SwiGLU (mlp.gate_proj / weights_in)" if swiglu else "plain"}'
    )
  if dinov3 and swiglu:  # DINOv3's gated MLP gates with hidden_act, ours (model.mlp='swiglu') with SiLU.
    if act != 'silu':
      raise ConfigError(f'init_from: a gated MLP with hidden_act={act!r}; our ViT gates with SiLU (silu)')
    act = 'gelu'
  if act not in ACTIVATIONS:
    raise ConfigError(
      f'init_from: hidden_act={act!r} of the transformers config is not one of {", ".join(ACTIVATIONS)}'
    )
  activation, approximate = ACTIVATIONS[act]
  has_cls = 'embeddings.cls_token' in names or 'embeddings.class_embedding' in names
  reg_tokens = shape('embeddings.register_tokens')[1] if 'embeddings.register_tokens' in names else 0
  fc2 = next(
    f'encoder.{k}.0.{m}.weight'
    for k in ('layer', 'layers')
    for m in ('output.dense', 'mlp.fc2', 'mlp.weights_out', 'mlp.down_proj')
    if f'encoder.{k}.0.{m}.weight' in names
  )
  head = next((n for n in ('classifier.weight', 'visual_projection.weight') if n in names), None)
  # Dinov2ForImageClassification's classifier reads the class token beside the patch tokens' mean: pool='tok_gap'.
  # SiglipForImageClassification's the mean of every token after the final norm: pool='gap' (no class token).
  both = head == 'classifier.weight' and has_cls and shape(head)[1] == 2 * width
  pool = 'tok_gap' if both else 'tok' if has_cls else 'gap'
  if head == 'classifier.weight' and shape(head)[1] != width and not both:  # Never dropped into a uniform head.
    raise ConfigError(
      f'init_from: its classifier reads {shape(head)[1]} features of a {width}-wide model, which our ViT does not '
      "compute (it computes the width, or twice it: the class token beside the patch tokens' mean)"
    )
  layerscale = 'encoder.layer.0.layer_scale1.lambda1' in names
  if 'pooler.dense.weight' in names and config.get('pooler_act', 'tanh') != 'tanh':  # ViTModel's pooler.
    raise ConfigError(
      f"init_from: config.json's pooler_act={errors.foreign(repr(config['pooler_act']), 40)}: our ViT's pre-logits "
      "layer (model.representation_size) computes tanh, transformers' default"
    )
  # DINOv3: rotary positions (centred, rows first, rotate-half pairs), no position table.
  rope = dict(rope='dinov3', rope_temperature=float(config['rope_theta']), rope_axes='ij') if dinov3 else {}
  return rope | dict(
    num_classes=shape(head)[0] if head else 0,
    input_shape=(height, wide, channels),
    patch_size=patch,
    width=width,
    depth=len({m.group(1) for n in names if (m := _LAYER.match(n))}),
    mlp_dim=shape(fc2)[1],
    num_heads=config['num_attention_heads'],
    pool='map' if 'head.probe' in names and not _unused_map_head(names) else pool,
    posemb='none' if dinov3 else 'learn',
    posemb_prefix=dinov3 or not reg_tokens,  # The class token's row, if any: registers have none (see to_release).
    distilled=False,
    reg_tokens=reg_tokens,
    layerscale=float(config.get('layerscale_value', 1.0)) if layerscale else None,
    norm_pre='pre_layrnorm.weight' in names,
    activation='gelu' if swiglu else activation,  # SwiGLU's SiLU is model.mlp's; hidden_act is the plain MLP's.
    mlp='swiglu' if swiglu else 'plain',
    representation_size=shape('pooler.dense.weight')[0] if 'pooler.dense.weight' in names else None,
    gelu_approximate=approximate,
    layernorm_epsilon=float(config['layer_norm_eps']),
  )


def video_config(config: dict[str, Any]) -> dict[str, Any]:
  """A video classifier's config.json, its model_type's defaults filled in; what the ViViT cannot be is one line."""
  model_type = config.get('model_type')
  if model_type not in VIDEO_TYPES:
    raise ConfigError(
      f'init_from: a transformers model_type={model_type!r} is not read into the ViViT; read: {", ".join(VIDEO_TYPES)}'
    )
  refuse_unknown(config, VIDEO_FIELDS)
  config = VIDEO_TYPES[model_type] | {k: v for k, v in config.items() if v is not None}
  if not config.get('use_mean_pooling', True):
    raise ConfigError(
      'init_from: a VideoMAE with use_mean_pooling=False (its classifier reads the first patch token after a '
      'final LayerNorm) is not read into the ViViT; its mean-pooling models are'
    )
  return config


def vivit_options(config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The ViViT constructor keys of a transformers video classifier's folder (its config.json and tensor shapes), with
  `input_shape` (frames, height, width, channels) and `num_classes` (0: a backbone without a classifier)."""
  model_type = config.get('model_type')
  config = video_config(config)
  names = _names(tensors)

  def shape(short):
    return tensor_shape(tensors, names[short])

  width, channels, time, patch = tubelet(tensors, names[_PATCH[0]])
  height, wide = _sizes(config, config['image_size'], 'num_frames')
  act = config['hidden_act']
  if act not in ACTIVATIONS:
    raise ConfigError(
      f'init_from: hidden_act={act!r} of the transformers config is not one of {", ".join(ACTIVATIONS)}'
    )
  activation, approximate = ACTIVATIONS[act]
  if activation != 'gelu':
    raise ConfigError(f"init_from: hidden_act={act!r}: the ViViT's MLPs compute GELU only")
  head = 'classifier.weight' in names
  return dict(
    num_classes=shape('classifier.weight')[0] if head else 0,
    input_shape=(config['num_frames'], height, wide, channels),
    patch_size=patch,
    tubelet_time=time,
    width=width,
    depth=len({m.group(1) for n in names if (m := _LAYER.match(n))}),
    mlp_dim=shape('encoder.layer.0.intermediate.dense.weight')[0],
    num_heads=config['num_attention_heads'],
    model='spatiotemporal',
    embedding='tubelet',
    pool='tok' if 'embeddings.cls_token' in names else 'gap',
    # VideoMAE's position table is a fixed buffer, never saved.
    posemb='learn' if 'embeddings.position_embeddings' in names else 'sincos_flat',
    fc_norm=FC_NORM_EPSILON if model_type == 'videomae' else None,
    rope=None,
    pool_depth=None,
    pool_mlp_dim=None,
    gelu_approximate=approximate,
    layernorm_epsilon=float(config['layer_norm_eps']),
  )


def projection(config: dict[str, Any]) -> bool:
  """Whether the folder's head is an embedding projection (CLIPVisionModelWithProjection), not a classifier."""
  return 'Projection' in str(config.get('architectures'))


def notes(config: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> list[str]:
  """What the load notes first: the architecture read, and what of the folder is left out."""
  architecture = (config.get('architectures') or [config.get('model_type', 'model')])[0]
  out = [f'transformers {architecture} read from its safetensors']
  names = _names(tensors)
  if len(names) < len(tensors):
    out.append(f'text tower left out ({len(tensors) - len(names)} tensors): the ViT is the image tower')
  if 'embeddings.mask_token' in names:
    out.append('mask_token left out (masked-image pretraining only)')
  if _unused_map_head(names):
    out.append("the tower's attention-pool head (head.*) left out: the classifier reads the mean of the tokens")
  return out


# transformers' ViTModel names of a block's modules, by their release names (what `from_release` writes).
_VIT_BLOCK = (
  'layernorm_before',
  'attention.attention.query',
  'attention.attention.key',
  'attention.attention.value',
  'attention.output.dense',
  'intermediate.dense',
  'output.dense',
  'layernorm_after',
)


# model_type -> (the backbone's module in its classifier, the classifier's class): what `from_release` writes.
CLASSIFIERS = {
  'vit': ('vit', 'ViTForImageClassification'),
  'vivit': ('vivit', 'VivitForVideoClassification'),
  'videomae': ('videomae', 'VideoMAEForVideoClassification'),
}


def from_release(flat: Mapping[str, np.ndarray], model_type: str = 'vit') -> dict[str, np.ndarray]:
  """The release flat layout (`release.to_release`) of a ViT with a class token, or of a ViViT model 1 (a 5-D
  tubelet kernel; `fc_norm/scale`, `fc_norm/bias` added for VideoMAE's), -> the state dict of transformers' classifier
  of `model_type` (CLASSIFIERS: the backbone's names under its module, `classifier`, VideoMAE's `fc_norm`), the
  inverse of `to_release` for it (what `tools.export --layout transformers` writes). VideoMAE's attention has no key
  bias (ours is left out: softmax is blind to the constant it adds per query) and its query and value biases are
  saved as `q_bias` / `v_bias`, as transformers saves them. A release name that model has no place for is one line."""
  prefix, architecture = CLASSIFIERS[model_type]
  modules = {'embedding': f'{prefix}.embeddings.patch_embeddings.projection'}
  modules |= {'Transformer/encoder_norm': f'{prefix}.layernorm', 'head': 'classifier', 'fc_norm': 'fc_norm'}
  blocks = sorted({int(m.group(1)) for n in flat if (m := re.match(r'Transformer/encoderblock_(\d+)/', n))})
  for i in blocks:
    modules |= {f'Transformer/encoderblock_{i}/{_BLOCK[p]}': f'{prefix}.encoder.layer.{i}.{p}' for p in _VIT_BLOCK}
  out, used = {}, set()

  def take(name):
    used.add(name)
    return np.asarray(flat[name])

  for name, to in (('cls', 'cls_token'), ('Transformer/posembed_input/pos_embedding', 'position_embeddings')):
    if name in flat:
      out[f'{prefix}.embeddings.{to}'] = take(name)
  for module, name in modules.items():
    if f'{module}/scale' in flat:
      out[f'{name}.weight'], out[f'{name}.bias'] = take(f'{module}/scale'), take(f'{module}/bias')
    elif f'{module}/kernel' in flat:
      kernel = take(f'{module}/kernel')
      if module == 'embedding':  # ([time,] h, w, in, out) -> a convolution's (out, in, [time,] h, w).
        weight = kernel.transpose(kernel.ndim - 1, kernel.ndim - 2, *range(kernel.ndim - 2))
      elif module.endswith(('/query', '/key', '/value')):  # (in, heads, head_dim) -> (heads * head_dim, in).
        weight = kernel.reshape(kernel.shape[0], -1).T
      else:  # A Dense's (in, out), an attention output's (heads, head_dim, out) -> (out, in).
        weight = kernel.reshape(-1, kernel.shape[-1]).T
      out[f'{name}.weight'], out[f'{name}.bias'] = weight, take(f'{module}/bias').reshape(-1)
  if model_type == 'videomae':
    for name in [n for n in out if n.endswith('.attention.attention.key.bias')]:
      del out[name]
    for split, bias in _SPLIT_BIASES.items():
      for name in [n for n in out if n.endswith(bias)]:
        out[name[: -len(bias)] + split] = out.pop(name)
  left = sorted(set(flat) - used)
  if left:
    raise ConfigError(
      f"--layout transformers: transformers' {architecture} has no place for {', '.join(left[:5])}"
      f'{" ..." if len(left) > 5 else ""}'
    )
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


# The ViT keys transformers' ViTForImageClassification computes as ours only at these values.
_TRANSFORMERS_FIXED = dict(
  pool='tok',
  posemb='learn',
  rope=None,
  fc_norm=False,
  class_token=None,
  mlp_norm=False,
  posemb_prefix=True,
  distilled=False,
  reg_tokens=0,
  layerscale=None,
  norm_pre=False,
  mlp='plain',
)
_HIDDEN_ACT = {('gelu', False): 'gelu', ('gelu', True): 'gelu_pytorch_tanh', ('quick_gelu', False): 'quick_gelu'}


def folder_config(model: Any, data_config: Any, labels: list[str] | None = None) -> tuple[dict, dict]:
  """A ViT's transformers config.json (`ViTForImageClassification`: every size, the activation, LayerNorm epsilon,
  class names) and preprocessor_config.json (`ViTImageProcessor`: resized to the input size, scaled by 1/255,
  normalised so that data.value_range comes out). A key transformers' ViT computes otherwise is one line."""
  structure, options = model.structure, model.options
  for key, value in _TRANSFORMERS_FIXED.items():
    errors.check(
      structure[key] == value,
      f"--layout transformers: model.{key}={structure[key]!r}; transformers' ViT computes with model.{key}={value!r} "
      '(--layout timm writes it)',
    )
  errors.check(
    options.prenorm and model.representation_size is None,
    "--layout transformers: transformers' ViT has LayerNorms before each branch and no pre-logits layer",
  )
  activation = (structure['activation'], options.gelu_approximate)
  errors.check(activation in _HIDDEN_ACT, f'--layout transformers: model.activation={activation[0]!r} with tanh GELU')
  channels, patch = model.embedding.kernel.shape[-2], structure['patch_size']
  height, width = model.grid[0] * patch, model.grid[1] * patch
  config = dict(
    architectures=['ViTForImageClassification'],
    model_type='vit',
    hidden_size=structure['width'],
    num_hidden_layers=structure['depth'],
    num_attention_heads=structure['num_heads'],
    intermediate_size=structure['mlp_dim'],
    hidden_act=_HIDDEN_ACT[activation],
    layer_norm_eps=options.layernorm_epsilon,
    image_size=height if height == width else [height, width],
    patch_size=patch,
    num_channels=channels,
    qkv_bias=True,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
  ) | _label_maps(labels, model.head.out_features)
  low, high = data_config.value_range
  preprocessor = dict(
    image_processor_type='ViTImageProcessor',
    do_resize=True,
    size=dict(height=height, width=width),  # Squashed: ViTImageProcessor cuts no central crop.
    resample=2,  # Bilinear, as our pipeline resizes.
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[-low / (high - low)] * channels,
    image_std=[1 / (high - low)] * channels,
  )
  return config, preprocessor


def _label_maps(labels: list[str] | None, num_classes: int) -> dict:
  names = labels or [f'LABEL_{i}' for i in range(num_classes)]
  return dict(id2label={str(i): n for i, n in enumerate(names)}, label2id={n: i for i, n in enumerate(names)})


# A ViViT model 1's (pool, posemb, fc_norm) -> the transformers video classifier computing it.
_VIDEO_TYPES = {('tok', 'learn', False): 'vivit', ('gap', 'sincos_flat', True): 'videomae'}
_VIDEO_FIXED = dict(model='spatiotemporal', embedding='tubelet')


def video_folder_config(model: Any, data_config: Any, labels: list[str] | None = None) -> tuple[dict, dict]:
  """A ViViT's transformers config.json (`VivitForVideoClassification`: model 1, class token, learned positions; or
  `VideoMAEForVideoClassification`: VideoMAE's fixed positions, average pool and fc_norm) and preprocessor_config.json
  (its image processor: each frame's shorter side resized to data.resize_size, then the central crop, as our
  evaluation; or squashed to the input size; scaled by 1/255 and normalised so that data.value_range comes out).
  What neither computes as ours is one line."""
  structure, options = model.structure, model.options
  for key, value in _VIDEO_FIXED.items():
    errors.check(
      structure[key] == value,
      f"--layout transformers: model.{key}={structure[key]!r}; transformers' ViViT and VideoMAE compute with "
      f'model.{key}={value!r}',
    )
  errors.check(
    options.attention == 'full' and options.prenorm,
    f"--layout transformers: model.attention={options.attention!r}, model.prenorm={options.prenorm!r}; transformers' "
    "ViViT and VideoMAE attend over every token ('full') with LayerNorms before each branch",
  )
  kind = (structure['pool'], structure['posemb'], structure['fc_norm'])
  epsilon = model.fc_norm.epsilon if model.fc_norm is not None else None
  theirs = FC_NORM_EPSILON
  errors.check(
    kind in _VIDEO_TYPES,
    f'--layout transformers: model.pool={kind[0]!r} with model.posemb={kind[1]!r} and model.fc_norm={epsilon!r}; '
    "transformers' ViViT pools its class token with learned positions (pool='tok', posemb='learn', fc_norm=None), "
    f"its VideoMAE averages with fixed ones (pool='gap', posemb='sincos_flat', fc_norm={theirs})",
  )
  model_type = _VIDEO_TYPES[kind]
  errors.check(
    epsilon in (None, theirs),
    f"--layout transformers: model.fc_norm={epsilon!r}; VideoMAE's fc_norm computes with epsilon {theirs} "
    "(PyTorch's default)",
  )
  channels, patch, time = model.embedding.kernel.shape[-2], structure['patch_size'], structure['tubelet_time']
  height, width = model.space_grid[0] * patch, model.space_grid[1] * patch
  config = dict(
    architectures=[CLASSIFIERS[model_type][1]],
    model_type=model_type,
    hidden_size=structure['width'],
    num_hidden_layers=structure['depth'],
    num_attention_heads=structure['num_heads'],
    intermediate_size=structure['mlp_dim'],
    hidden_act='gelu_fast' if options.gelu_approximate else 'gelu',  # gelu_fast: ViViT's own tanh GELU.
    layer_norm_eps=options.layernorm_epsilon,
    image_size=height if height == width else [height, width],
    num_frames=model.grid[0] * time,
    num_channels=channels,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
  )
  if model_type == 'vivit':
    config |= dict(tubelet_size=[time, patch, patch], qkv_bias=True)
  else:
    config |= dict(patch_size=patch, tubelet_size=time, qv_bias=True, use_mean_pooling=True)
  config |= _label_maps(labels, model.head.out_features)
  low, high = data_config.value_range
  short = data_config.get('resize_size') or data_config.get('image_size')
  preprocessor = dict(
    image_processor_type='VivitImageProcessor' if model_type == 'vivit' else 'VideoMAEImageProcessor',
    do_resize=True,
    size=dict(height=height, width=width) if short is None else dict(shortest_edge=short),
    resample=2,  # Bilinear, as our pipeline resizes.
    do_center_crop=short is not None,
    crop_size=dict(height=height, width=width),
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    image_mean=[-low / (high - low)] * channels,
    image_std=[1 / (high - low)] * channels,
  )
  if model_type == 'vivit':
    preprocessor['offset'] = False  # Its default maps to [-1, 1] by itself; mean and std do it here.
  return config, preprocessor


# The model families (config.model.name) whose runs `folder` writes: tools.export --layout transformers (a seq2seq
# Transformer's, MarianMTModel, is marian_layout's).
EXPORTS = ('vit', 'vivit')


def folder(
  model: Any, params: dict, data_config: Any, labels: list[str] | None = None
) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
  """`params` of the ViT or ViViT `model` as a transformers folder that its classifier's `from_pretrained` loads:
  its JSON files by name (config.json, preprocessor_config.json) and model.safetensors' tensors, for tools.export to
  write."""
  video = isinstance(model, vivit.ViViT)
  configs = video_folder_config if video else folder_config
  config, preprocessor = configs(model, data_config, labels)
  flat = release.to_release(params, model.structure['num_heads'])
  if 'fc_norm' in params:  # VideoMAE's, after the average pool: no place in the release layout.
    flat |= {f'fc_norm/{k}': np.asarray(params['fc_norm'][k]) for k in ('scale', 'bias')}
  tensors = from_release(flat, config['model_type'])
  return {'config.json': config, 'preprocessor_config.json': preprocessor}, tensors
