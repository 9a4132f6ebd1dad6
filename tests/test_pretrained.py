"""timm and Hugging Face transformers hub folders (config.json + model.safetensors) into our ViT, and transformers'
video classifiers into our ViViT: each row's outputs equal the library's own on the same inputs (reference folders
written by tests/data/pretrained/make_references.py with timm 1.0.31 and transformers 5.24; torch is never imported
here), what fine-tuning adapts, and every refusal as one line."""

import json
import os
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx

from conftest import load_config
from vit_jax_lab import checkpoints, hub, models, tasks, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import layers, release, timm_layout, tracker, transformers_layout, vit, vivit, vjepa2_layout
from vit_jax_lab.tools import hub_benchmark

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'pretrained')
# row -> what timm made it from (tests/data/pretrained/make_references.py).
ROWS = {
  'vit': 'vit_tiny_patch16_224 (AugReg layout: class token)',
  'deit': 'deit_tiny_patch16_224',
  'deit_distilled': 'deit_tiny_distilled_patch16_224 (distillation token, two heads averaged)',
  'mae': 'vit_base_patch16_224.mae (a backbone without a head)',
  'dinov2': 'vit_small_patch14_dinov2 (LayerScale)',
  'dinov2_reg4': 'vit_small_patch14_reg4_dinov2 (LayerScale, 4 registers, position embeddings on patches only)',
  'siglip': 'vit_base_patch16_siglip_224 (no class token, MAP head)',
  'clip': 'vit_base_patch16_clip_224 (norm_pre, LayerNorm epsilon 1e-5, no patch bias; head = the projection)',
  'clip_quickgelu': 'vit_base_patch16_clip_quickgelu_224 (the same with quick-GELU)',
  'clip_ft': 'vit_base_patch16_clip_224.laion2b_ft_in12k_in1k (a CLIP tower fine-tuned: its head a classifier)',
  'dinov2_giant': 'vit_giant_patch14_dinov2 (LayerScale, SwiGLU MLP packed in mlp.fc1, at MLP ratio 2.66667 * 2)',
  # timm's Eva class: rotary position embeddings (model.rope), LayerScale as gamma_1 / gamma_2.
  'rope_axial': 'vit_small_patch16_rope_224 (RoPE-ViT axial, no position table)',
  'rope_mixed_ape': 'vit_small_patch16_rope_mixed_ape_224 (RoPE-Mixed: learned rope.freqs; and a position table)',
  'rope_sbb': 'vit_medium_patch16_rope_reg1_gap_256 (q and v biases, a register, mean pool + fc_norm, ref grid 16)',
  'dinov3': 'vit_small_patch16_dinov3 (centred rotate-half RoPE, class token + 4 registers, mean pool, eps 1e-5)',
  'eva02_tiny': 'eva02_tiny_patch14_224 (SwiGLU packed in mlp.fc1, positions on a 16-patch grid, mean pool + fc_norm)',
  'eva02_base': 'eva02_base_patch14_448 (q/k/v_proj, SwiGLU fc1_g / fc1_x with the sub-LN mlp.norm)',
  'pe_core': 'vit_pe_core_tiny_patch16_384 (norm_pre, 8-head attention pool over every token, RoPE offset 1)',
}
# transformers row -> the outputs compared: (ours, theirs).
HF_ROWS = {
  'hf_vit': [('logits', 'logits')],  # ViTForImageClassification (names under 'vit.').
  'hf_vit_model': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],  # ViTModel: tanh pooler.
  'hf_dinov2': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],
  'hf_dinov2_reg': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],  # Dinov2WithRegistersModel.
  'hf_dinov2_giant': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],  # use_swiglu_ffn=True.
  # Dinov2(WithRegisters)ForImageClassification: pool='tok_gap', the class token beside the patch tokens' mean.
  'hf_dinov2_cls': [('logits', 'logits')],
  'hf_dinov2_reg_cls': [('logits', 'logits')],
  'hf_siglip': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],  # SiglipVisionModel: MAP head.
  'hf_clip': [('features', 'pooler_output'), ('blocks', 'last_hidden_state')],  # CLIPVisionModel.
  'hf_clip_projection': [('logits', 'image_embeds'), ('blocks', 'last_hidden_state')],  # ...WithProjection.
  # DINOv3ViTModel: rotary positions (model.rope='dinov3'), registers, LayerScale; and its gated (SiLU) MLP.
  'hf_dinov3': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],
  'hf_dinov3_gated': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],
  # Siglip2VisionModel (NaFlex) at its table's own grid: a Linear on patches (our patch kernel), SigLIP's MAP head.
  'hf_siglip2': [('features', 'pooler_output'), ('tokens', 'last_hidden_state')],
  # Siglip(2)ForImageClassification: the tokens' mean after the final norm, classified (pool='gap'); the tower's
  # attention-pool head, saved beside it, is unused. Read with the MAP head they were 2.4 and 2.7 off.
  'hf_siglip_cls': [('logits', 'logits')],
  'hf_siglip2_cls': [('logits', 'logits')],
}


def folder_model(row, num_classes=None, input_shape=None, family=vit.ViT, **overrides):
  """Our `family` model (ViT, or ViViT for a video folder) of the folder's shape (its class count and input size
  unless given) with the folder's weights, and the load notes."""
  weights = hub.read(os.path.join(DATA, row))  # A row's name, or a folder's path.
  reader = hub.reader(weights.layout)
  options = (reader.vit_options if family is vit.ViT else reader.vivit_options)(weights.config, weights.tensors)
  classes, shape = options.pop('num_classes'), options.pop('input_shape')
  options = {k: v for k, v in options.items() if not (family is vivit.ViViT and k in vivit.OPEN and v is None)}
  model = family(num_classes or classes or 7, input_shape or shape, rngs=nnx.Rngs(0), **(options | overrides))
  initial = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  params, notes = model.load_pretrained(weights, initial)
  state = nnx.state(model, nnx.Param)
  state.replace_by_pure_dict(params)
  nnx.update(model, state)
  return model, notes, initial, params


def max_difference(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize('row', ROWS)
def test_timm_folder_gives_timms_logits_and_features(row):
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  model, notes, _, _ = folder_model(row, input_shape=ref['images'].shape[1:])  # DINOv3 takes any size (256 first).
  features = max_difference(model.features(ref['images']), ref['features'])
  has_head = ref['logits'].shape != ref['features'].shape or 'head.weight' in hub.read(os.path.join(DATA, row)).tensors
  logits = max_difference(model(ref['images']), ref['logits']) if has_head else None
  print(f'{row}: max |ours - timm| features {features:.2e}, logits {logits if logits is None else f"{logits:.2e}"}')
  assert features < 1e-5
  assert logits is None or logits < 1e-5
  assert notes[0].startswith('timm ') and str(ref['name']).split('.')[0] in notes[0]
  assert any('the source has none' in n for n in notes) == (not has_head)


def test_timm_mean_pool_beside_a_class_token_is_read():
  """timm's global_pool='avg' beside a class token (its fine-tuned MAE ViTs): the patch tokens' mean, then fc_norm
  (timm's default), or the final norm before the mean (fc_norm=False). Read as 'tok' they were 1.05 and 1.39 off;
  now pool='gap' with class_token=True and fc_norm as the folder has it."""
  for row, fc_norm in (('vit_avg', True), ('vit_avg_norm', False)):
    ref = np.load(os.path.join(DATA, row, 'reference.npz'))
    model, _, _, _ = folder_model(row)
    assert (model.pool, model.class_token, model.structure['fc_norm']) == ('gap', True, fc_norm)
    assert max_difference(model(ref['images']), ref['logits']) < 1e-5
    assert max_difference(model.features(ref['images']), ref['features']) < 1e-5


def test_timm_fc_norm_after_a_class_token_is_the_final_norm(tmp_path):
  """timm's fc_norm=True with global_pool='token' (and Eva's use_fc_norm=True) normalises the class token after the
  pool: the final LayerNorm taken per token, which our ViT computes with model.pool='tok'. The `vit` folder with
  its final norm stored as fc_norm computes timm's logits of the folder as it was. Before: refused, naming
  model.pool='gap', a key the user never set."""
  folder = copy_row(tmp_path)
  path = os.path.join(folder, 'model.safetensors')
  tensors = safetensors.numpy.load_file(path)
  tensors = {k.replace('norm.', 'fc_norm.') if k.startswith('norm.') else k: v for k, v in tensors.items()}
  safetensors.numpy.save_file(tensors, path)
  config = json.load(open(os.path.join(folder, 'config.json')))
  config['model_args'] |= {'fc_norm': True, 'global_pool': 'token'}
  json.dump(config, open(os.path.join(folder, 'config.json'), 'w'))
  ref = np.load(os.path.join(DATA, 'vit', 'reference.npz'))
  model, _, _, _ = folder_model(folder)
  assert model.pool == 'tok' and not model.structure['fc_norm']
  assert max_difference(model(ref['images']), ref['logits']) < 1e-5


# A toy layout's reader module: timm's names under 'toy/', read by timm's reader.
TOY_READER = """from vit_jax_lab.models import timm_layout


def _plain(tensors):
  return {name.removeprefix('toy/'): tensors[name] for name in tensors}


def vit_options(config, tensors):
  return timm_layout.vit_options(config['timm'], _plain(tensors))


def to_release(tensors, num_heads):
  return timm_layout.to_release(_plain(tensors), num_heads)


def notes(config, tensors):
  return ['a toy folder read']


def posemb_resize(config):
  return timm_layout.posemb_resize(config['timm'])


def preprocessing(path, config):
  return timm_layout.preprocessing(path, config['timm'])
"""


def test_a_new_layout_is_its_reader_module_and_its_row(tmp_path, monkeypatch):
  """All a layout needs is its reader module and its row in hub.LAYOUTS (which names the families that read it):
  a toy layout, timm's tensors under 'toy/', is recognised, accepted by the ViT's init_from check and not by the
  ViViT's, and gives the timm folder's logits; nothing else in the package knows it."""
  (tmp_path / 'toy_reader.py').write_text(TOY_READER)
  monkeypatch.syspath_prepend(str(tmp_path))
  row = hub.Layout(
    'a toy layout (toy/patch_embed.proj.weight)', ('toy/patch_embed.proj.weight',), 'toy_reader', ('ViT',)
  )
  monkeypatch.setitem(hub.LAYOUTS, 'toy', row)
  timm = hub.read(os.path.join(DATA, 'vit'))
  folder = tmp_path / 'toy'
  folder.mkdir()
  (folder / 'config.json').write_text(json.dumps({'timm': timm.config}))
  safetensors.numpy.save_file(
    {f'toy/{k}': np.asarray(timm.tensors[k]) for k in timm.tensors}, folder / 'model.safetensors'
  )
  assert hub.read(str(folder)).layout == 'toy'
  assert 'toy' in vit.ViT.pretrained() and 'toy' not in vivit.ViViT.pretrained()
  checkpoints.check_init_from(str(folder), vit.ViT.pretrained())
  with pytest.raises(ConfigError, match='holds a toy layout .* weights, which this model does not read'):
    checkpoints.check_init_from(str(folder), vivit.ViViT.pretrained())
  ref = np.load(os.path.join(DATA, 'vit', 'reference.npz'))
  model, notes, _, _ = folder_model(str(folder))
  assert notes[0] == 'a toy folder read'
  assert max_difference(model(ref['images']), ref['logits']) < 1e-5
  assert hub.reader('toy').preprocessing(str(folder), {'timm': timm.config}).crop == (32, 32)


def test_timm_options_read_what_timm_builds_into_an_architecture():
  """SigLIP 2's towers use the tanh GELU by their definition, not their config.json; a folder without a position
  table is refused, not read as fixed sincos positions."""
  assert timm_layout.timm_options({'architecture': 'vit_so400m_patch16_siglip_384'})['gelu_approximate'] is True
  assert timm_layout.timm_options({'architecture': 'vit_base_patch16_siglip_224'})['gelu_approximate'] is False
  weights = hub.read(os.path.join(DATA, 'vit'))
  tensors = {k: v for k, v in weights.tensors.items() if k != 'pos_embed'}
  with pytest.raises(ConfigError, match="has no absolute position table \\(pos_embed='none', or rotary"):
    timm_layout.vit_options(weights.config, tensors)


# timm 1.0.31's VisionTransformer.__init__ arguments (inspect.signature, in the environment of make_references.py).
TIMM_VIT_ARGS = (
  'img_size patch_size in_chans num_classes global_pool embed_dim depth num_heads mlp_ratio qkv_bias qk_norm '
  'scale_attn_norm scale_mlp_norm proj_bias init_values class_token pos_embed no_embed_class reg_tokens pre_norm '
  'final_norm fc_norm pool_include_prefix dynamic_img_size dynamic_img_pad drop_rate pos_drop_rate patch_drop_rate '
  'proj_drop_rate attn_drop_rate drop_path_rate weight_init fix_init embed_layer embed_norm_layer norm_layer act_layer '
  'block_fn mlp_layer attn_layer device dtype'
).split()


@pytest.mark.parametrize(
  'args, message',
  [
    ({'pool_include_prefix': True}, 'model_args.pool_include_prefix=True, which our ViT does not compute'),
    ({'act_layer': 'silu'}, "model_args.act_layer='silu', which our ViT does not compute \\(it reads None, 'gelu'"),
    ({'norm_layer': 'rmsnorm'}, "model_args.norm_layer='rmsnorm', which our ViT does not compute"),
    ({'use_rot_pos_emb': True}, "model_args.use_rot_pos_emb, not an argument of timm's VisionTransformer"),
    ({'qk_norm': True}, r'model_args.qk_norm=True, which our ViT does not compute \(it reads False\)$'),
    ({'proj_bias': False}, r'model_args.proj_bias=False, which our ViT does not compute \(it reads True\)$'),
    ({'embed_norm_layer': 'LayerNorm'}, "model_args.embed_norm_layer='LayerNorm', which our ViT does not compute"),
  ],
)
def test_every_timm_model_arg_is_read_shown_by_the_tensors_neutral_or_refused(args, message):
  """Never guessed: each argument timm's VisionTransformer takes has a stated handling; a value our ViT does not
  compute, or an argument of another class (EVA's rotary embeddings), is one line."""
  assert sorted(timm_layout.MODEL_ARGS) == sorted(TIMM_VIT_ARGS)
  weights = hub.read(os.path.join(DATA, 'vit'))
  config = weights.config | {'model_args': weights.config['model_args'] | args}
  with pytest.raises(ConfigError, match=message):
    timm_layout.vit_options(config, weights.tensors)
  neutral = {k: 0.1 for k, how in timm_layout.MODEL_ARGS.items() if how == 'neutral' and k.endswith('rate')}
  options = timm_layout.vit_options(
    weights.config | {'model_args': weights.config['model_args'] | neutral}, weights.tensors
  )
  assert options == timm_layout.vit_options(weights.config, weights.tensors)


# timm 1.0.31's Eva.__init__ arguments (inspect.signature, in the environment of make_references.py).
TIMM_EVA_ARGS = (
  'img_size patch_size in_chans num_classes global_pool embed_dim depth num_heads num_kv_heads qkv_bias qkv_fused '
  'qk_norm mlp_ratio swiglu_mlp swiglu_align_to scale_mlp scale_attn_inner attn_type drop_rate pos_drop_rate '
  'patch_drop_rate proj_drop_rate attn_drop_rate drop_path_rate norm_layer init_values attn_only_layer_scale '
  'class_token num_reg_tokens no_embed_class use_abs_pos_emb use_rot_pos_emb rope_type rope_grid_offset '
  'rope_grid_indexing rope_temperature rope_rotate_half rope_shift_coords rope_jitter_coords rope_rescale_coords '
  'rope_mrope_section use_post_norm use_pre_transformer_norm use_post_transformer_norm use_fc_norm '
  'attn_pool_num_heads attn_pool_mlp_ratio dynamic_img_size dynamic_img_pad ref_feat_shape head_init_scale device dtype'
).split()


@pytest.mark.parametrize(
  'row, change, message',
  [
    ('rope_axial', {'model_args': {'qk_norm': True}}, 'model_args.qk_norm=True, which our ViT does not compute'),
    ('rope_axial', {'model_args': {'rope_type': 'mrope'}}, "rope_type='mrope', which our ViT does not compute"),
    ('rope_axial', {'model_args': {'rope_rotate_half': True}}, 'rope_rotate_half=True with rope .axial.'),
    ('rope_axial', {'model_args': {'pos_embed': 'learn'}}, "model_args.pos_embed, not an argument of timm's Eva"),
    ('rope_sbb', {'model_args': {'ref_feat_shape': [16, 12]}}, 'ref_feat_shape=\\[16, 12\\]; our ViT reads square'),
    ('rope_sbb', {'model_args': {'use_fc_norm': False}}, None),  # Read from the tensors, which still hold fc_norm.
    ('rope_sbb', {'model_args': {'rope_temperature': 'hot'}}, "rope_temperature='hot'; it must be a number"),
    ('rope_sbb', {'model_args': {'ref_feat_shape': [0, 0]}}, 'ref_feat_shape\\[0\\]=0; it must be a positive'),
    ('pe_core', {'model_args': {'attn_pool_num_heads': -8}}, 'attn_pool_num_heads=-8; it must be a positive'),
    ('rope_axial', {'architecture': 'eva02_base_patch16_clip_224'}, "eva02_base_patch16_clip_224 is of timm's Eva"),
    ('rope_axial', {'architecture': 'vit_small_patch16_224'}, "is of timm's Eva class, of which our ViT reads"),
  ],
)
def test_every_timm_eva_model_arg_is_read_shown_by_the_tensors_neutral_or_refused(row, change, message):
  """The Eva class (timm's RoPE ViTs, DINOv3) as VisionTransformer: each argument has a stated handling, and an Eva
  folder whose architecture is not one of the rows read (EVA-02, PE: SwiGLU, sub-LN) is one line, not a model
  computing something else."""
  assert sorted(timm_layout.EVA_ARGS) == sorted(TIMM_EVA_ARGS)
  weights = hub.read(os.path.join(DATA, row))
  config = weights.config | change | {'model_args': weights.config['model_args'] | change.get('model_args', {})}
  if message is None:
    assert timm_layout.vit_options(config, weights.tensors) == timm_layout.vit_options(weights.config, weights.tensors)
    return
  with pytest.raises(ConfigError, match=message):
    timm_layout.vit_options(config, weights.tensors)


def test_an_eva_folder_with_a_final_norm_before_and_after_the_pool_is_refused():
  weights = hub.read(os.path.join(DATA, 'rope_sbb'))
  tensors = dict(weights.tensors.items()) | {'norm.weight': np.ones(32), 'norm.bias': np.zeros(32)}
  with pytest.raises(ConfigError, match='a final LayerNorm both before and after the pooling'):
    timm_layout.vit_options(weights.config, tensors)


@pytest.mark.parametrize(
  'row', ['vit', 'dinov2_reg4', 'rope_axial', 'rope_mixed_ape', 'rope_sbb', 'dinov3', 'eva02_base', 'pe_core']
)
def test_another_image_size_resamples_bicubic_as_timm(row):
  """timm's own model at the larger size, loading the same state dict (its checkpoint_filter_fn resamples): the
  rotary rows turn by the larger grid's positions (rope_sbb's rescaled to its 16-patch reference grid)."""
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  images = ref['resized_images']
  model, notes, _, _ = folder_model(row, input_shape=images.shape[1:])
  assert max_difference(model(images), ref['resized_logits']) < 1e-5
  assert max_difference(model.features(images), ref['resized_features']) < 1e-5
  resampled = [n for n in notes if n.startswith('position embeddings resampled')]
  assert len(resampled) == ('pos_embed' in hub.read(os.path.join(DATA, row)).tensors)
  assert all("'bicubic', timm's own" in note for note in resampled)


def test_a_head_of_another_class_count_is_replaced():
  ref = np.load(os.path.join(DATA, 'vit', 'reference.npz'))
  model, notes, initial, params = folder_model('vit', num_classes=5)
  assert 'head (32, 10) re-initialised for (32, 5)' in notes
  np.testing.assert_array_equal(params['head']['kernel'], initial['head']['kernel'])
  assert max_difference(model.features(ref['images']), ref['features']) < 1e-5  # The rest is timm's.


def test_a_distilled_folder_replaces_both_heads():
  _, notes, initial, params = folder_model('deit_distilled', num_classes=3)
  assert {'head (32, 10) re-initialised for (32, 3)', 'head_dist (32, 10) re-initialised for (32, 3)'} <= set(notes)
  np.testing.assert_array_equal(params['head_dist']['kernel'], initial['head_dist']['kernel'])


def test_new_keys_round_trip_through_run_parameters():
  """A run with every new key loads into the same model exactly (the release layout carries them too)."""
  kwargs = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=4, distilled=True, reg_tokens=2)
  kwargs |= dict(posemb_prefix=False, layerscale=0.1, norm_pre=True, activation='quick_gelu', scan=True)
  a = vit.ViT(10, (16, 16, 3), rngs=nnx.Rngs(0), **kwargs)
  b = vit.ViT(10, (16, 16, 3), rngs=nnx.Rngs(1), **kwargs)
  pa, pb = (jax.device_get(nnx.state(m, nnx.Param).to_pure_dict()) for m in (a, b))
  assert pa['pos_embedding'].shape == (1, 16, 32) and pa['reg'].shape == (1, 2, 32)
  assert pa['encoder']['blocks']['ls1'].shape == (2, 32)  # Scanned: a leading layer axis.
  assert pa['norm_pre']['scale'].shape == (32,)
  loaded, notes = b.load_pretrained(pa, pb)
  assert notes == []
  jax.tree.map(np.testing.assert_array_equal, loaded, pa)


def test_default_vit_parameters_are_unchanged():
  model = vit.ViT(10, (16, 16, 3), variant='mu/4', rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param).to_pure_dict()
  assert set(params) == {'embedding', 'cls', 'pos_embedding', 'encoder', 'head'}
  assert set(params['encoder']['blocks'][0]) == {'norm1', 'attn', 'norm2', 'mlp'}


@pytest.mark.parametrize(
  'kwargs,message',
  [
    (dict(distilled=True, pool='gap'), "model.distilled=True needs model.pool='tok'"),
    (dict(reg_tokens=-1), 'model.reg_tokens=-1 must be a non-negative integer'),
    (dict(layerscale='small'), "model.layerscale='small' must be a number"),
    (dict(posemb_prefix='yes'), "model.posemb_prefix='yes' is not one of True, False"),
    (dict(norm_pre='yes'), "model.norm_pre='yes' is not one of False, True"),
    (dict(activation='relu'), "model.activation='relu' is not one of 'gelu', 'quick_gelu'"),
    (dict(mlp='geglu'), "model.mlp='geglu' is not one of 'plain', 'swiglu'"),
    (dict(mlp='swiglu', activation='quick_gelu'), "model.mlp='swiglu' gates with SiLU and takes no model.activation"),
  ],
)
def test_new_keys_are_validated(kwargs, message):
  with pytest.raises(ConfigError, match=message):
    vit.ViT(10, (16, 16, 3), variant='mu/4', rngs=nnx.Rngs(0), **kwargs)


def copy_row(tmp_path, row='vit'):
  out = tmp_path / row
  shutil.copytree(os.path.join(DATA, row), out)
  return str(out)


def one_line(error):
  assert '\n' not in str(error.value), str(error.value)
  return str(error.value)


def test_pickled_weights_are_refused_with_the_conversion_hint(tmp_path):
  folder = tmp_path / 'torch'
  folder.mkdir()
  (folder / 'config.json').write_text('{}')
  (folder / 'pytorch_model.bin').write_bytes(b'\x80\x04not unpickled')
  for path in (str(folder), str(folder / 'pytorch_model.bin')):
    with pytest.raises(ConfigError) as e:
      checkpoints.check_init_from(path)
    assert 'pytorch_model.bin is a pickled PyTorch file' in one_line(e) and 'safetensors' in str(e.value)


def test_a_folder_without_config_or_weights_is_one_line(tmp_path):
  no_config = copy_row(tmp_path)
  os.remove(os.path.join(no_config, 'config.json'))
  with pytest.raises(ConfigError) as e:
    checkpoints.check_init_from(no_config)
  assert 'has no config.json' in one_line(e)
  no_weights = tmp_path / 'empty'
  no_weights.mkdir()
  (no_weights / 'config.json').write_text('{}')
  with pytest.raises(ConfigError) as e:
    checkpoints.check_init_from(str(no_weights))
  assert 'is not a weights folder: it has no model.safetensors' in one_line(e)


def test_an_unknown_layout_names_its_first_keys_and_the_known_layouts(tmp_path):
  folder = tmp_path / 'bert'
  folder.mkdir()
  (folder / 'config.json').write_text(json.dumps({'model_type': 'bert'}))
  tensors = {f'encoder.layer.{i}.attention.self.query.weight': np.zeros((2, 2), np.float32) for i in range(7)}
  safetensors.numpy.save_file(tensors, str(folder / 'model.safetensors'))
  with pytest.raises(ConfigError) as e:
    checkpoints.check_init_from(str(folder))
  message = one_line(e)
  assert 'unknown layout (first names: encoder.layer.0.attention.self.query.weight, ' in message
  first, known = message.split('; known layouts: ')
  assert first.count('encoder.layer.') == 5 and known.startswith("timm's VisionTransformer")
  assert "transformers' ViT / DINOv2" in known and "transformers' CLIP / SigLIP image tower" in known


def test_sharded_weights_read_through_the_index(tmp_path):
  folder = copy_row(tmp_path, 'deit')
  tensors = safetensors.numpy.load_file(os.path.join(folder, 'model.safetensors'))
  os.remove(os.path.join(folder, 'model.safetensors'))
  names = sorted(tensors)
  shards = {'model-00001-of-00002.safetensors': names[::2], 'model-00002-of-00002.safetensors': names[1::2]}
  for shard, keys in shards.items():
    safetensors.numpy.save_file({k: tensors[k] for k in keys}, os.path.join(folder, shard))
  index = {'weight_map': {k: shard for shard, keys in shards.items() for k in keys}}
  with open(os.path.join(folder, 'model.safetensors.index.json'), 'w') as f:
    json.dump(index, f)
  weights = hub.read(folder)
  assert set(weights.tensors) == set(names)
  np.testing.assert_array_equal(weights.tensors['cls_token'], tensors['cls_token'])
  # The index is what the libraries load by: a tensor it puts in another shard, or leaves out, is named.
  wrong = dict(index['weight_map'], cls_token='model-00002-of-00002.safetensors')
  for weight_map, message in (
    (wrong, 'puts cls_token in model-00002-of-00002.safetensors, which does not hold it \\(model-00001'),
    ({k: v for k, v in index['weight_map'].items() if k != 'cls_token'}, 'cls_token is in model-00001-of-00002'),
  ):
    with open(os.path.join(folder, 'model.safetensors.index.json'), 'w') as f:
      json.dump({'weight_map': weight_map}, f)
    with pytest.raises(ConfigError, match=message):
      hub.read(folder)


def test_misshaped_and_unexpected_tensors_are_named(tmp_path):
  folder = copy_row(tmp_path)
  path = os.path.join(folder, 'model.safetensors')
  tensors = safetensors.numpy.load_file(path)
  tensors['blocks.1.mlp.fc2.bias'] = np.zeros(31, np.float32)
  tensors['extra.weight'] = np.ones(32, np.float32)
  safetensors.numpy.save_file(tensors, path)
  with pytest.raises(ConfigError) as e:
    folder_model_from(folder)
  message = one_line(e)
  assert 'unexpected: extra.weight' in message
  assert 'mis-shaped: Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias (from blocks.1.mlp.fc2) (31,)' in message
  tensors['fc_norm.weight'] = np.ones(32, np.float32)  # A norm after the pooling beside the final one: refused.
  safetensors.numpy.save_file(tensors, path)
  with pytest.raises(ConfigError, match='has a final LayerNorm both before and after the pooling, which our ViT'):
    folder_model_from(folder)


def folder_model_from(folder, **overrides):
  weights = hub.read(folder)
  options = hub.reader(weights.layout).vit_options(weights.config, weights.tensors) | overrides
  classes, shape = options.pop('num_classes'), options.pop('input_shape')
  model = vit.ViT(classes or 7, shape, rngs=nnx.Rngs(0), **options)
  return model.load_pretrained(weights, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))


@pytest.mark.parametrize(
  'row,key,value,message',
  [
    ('vit', 'depth', 3, 'is a model with model.depth=2, this model has model.depth=3: set --config.model.depth=2'),
    ('dinov2_reg4', 'reg_tokens', 0, 'model.reg_tokens=4, this model has model.reg_tokens=0'),
    ('dinov2', 'layerscale', None, 'model.layerscale=1e-05, this model has model.layerscale=None'),
    ('dinov2_giant', 'mlp', 'plain', "model.mlp='swiglu', this model has model.mlp='plain'"),
    ('hf_dinov2', 'mlp', 'swiglu', "model.mlp='plain', this model has model.mlp='swiglu'"),
    ('vit', 'num_heads', 2, 'model.num_heads=4, this model has model.num_heads=2'),
  ],
)
def test_a_model_of_another_shape_is_one_line_naming_the_key(row, key, value, message):
  with pytest.raises(ConfigError) as e:
    folder_model_from(os.path.join(DATA, row), **{key: value})
  assert message in one_line(e)


def test_a_family_that_does_not_read_the_layout_is_refused_before_reading():
  with pytest.raises(ConfigError) as e:
    checkpoints.check_init_from(os.path.join(DATA, 'vit'), ('npz', 'run'))
  assert 'VisionTransformer' in one_line(e) and 'which this model does not read (it reads: npz, run)' in str(e.value)


SIZES = ('variant', 'patch_size', 'width', 'depth', 'mlp_dim', 'num_heads')


@pytest.mark.slow
@pytest.mark.parametrize('row,shape', [('vit', '32,32,3,10'), ('dinov2_reg4', '42,42,3,10')])
def test_init_from_a_timm_folder_in_a_run_takes_the_folders_shape(smoke_config, row, shape, capsys):
  """train.setup / init_state, as `python -m main --config.init_from=DIR` runs them: sizes the config leaves unset
  and keys at their defaults come from the folder (noted), and the run starts from timm's weights, read straight into
  the devices: the initial parameters (a re-initialised head kept among them) never pass through the host."""
  config = smoke_config(init_from=os.path.join(DATA, row))
  config.model.update(dict.fromkeys(SIZES), dropout=0.0, drop_path=0.0)
  info, _ = tasks.build(config.task).synthetic_batch(shape, config.data.batch_size)
  s = train.setup(config, data=(None, info))
  with jax.transfer_guard_device_to_host('disallow'):  # Nothing of the initial model is copied to the host.
    state = train.init_state(s)
  model = nnx.merge(s.graphdef, state.params)
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  assert max_difference(model(ref['images']), ref['logits']) < 1e-5
  assert (config.model.width, config.model.num_heads, config.model.patch_size) == (32, 4, 8 if row == 'vit' else 14)
  out = capsys.readouterr().out
  assert 'model.width=32 from the folder' in out
  if row == 'dinov2_reg4':
    assert (config.model.reg_tokens, config.model.posemb_prefix, config.model.layerscale) == (4, False, 1e-5)
    assert 'model.reg_tokens=4 from the folder' in out


def test_a_size_the_config_sets_otherwise_is_one_line_before_anything_is_built(smoke_config):
  config = smoke_config(init_from=os.path.join(DATA, 'vit'))  # The smoke config sets patch_size=4.
  info, _ = tasks.build(config.task).synthetic_batch('32,32,3,10', config.data.batch_size)
  with pytest.raises(ConfigError) as e:
    train.setup(config, data=(None, info))
  assert 'is a model with model.patch_size=8, the config sets model.patch_size=4: set' in one_line(e)
  config = smoke_config(init_from=os.path.join(DATA, 'siglip'))
  config.model.update(dict.fromkeys(SIZES), variant='mu/8', pool='gap')
  with pytest.raises(ConfigError) as e:
    train.setup(config, data=(None, info))
  assert 'model.width=32, the config sets model.width=64 (by model.variant)' in one_line(e)
  with pytest.raises(ConfigError) as e:
    tracker.Tracker(32, 64, 3, variant='mu/8', mlp='geglu', rngs=nnx.Rngs(0))
  assert "model.mlp='geglu' is not one of 'plain', 'swiglu'" in one_line(e)


def test_a_release_without_a_head_keeps_the_models_head():
  """A release .npz without a head (a backbone) now keeps the model's head, with a note."""
  model = vit.ViT(10, (16, 16, 3), variant='mu/4', rngs=nnx.Rngs(0))
  params = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  flat = {k: v for k, v in release.to_release(params, model.num_heads).items() if not k.startswith('head/')}
  _, notes = model.load_pretrained(flat, params)
  assert any(n.startswith('head (64, 10) initialised: the source has none') for n in notes)


def hf_outputs(model, images):
  """Our outputs under the names of HF_ROWS: logits, pooled features, the final tokens (after the encoder's norm),
  and the tokens after the last block (CLIP's last_hidden_state, before its post_layernorm)."""
  tokens = model.tokens(images)
  return {
    'logits': lambda: model(images),
    'features': lambda: model.features(images),
    'tokens': lambda: model.encode(tokens),
    'blocks': lambda: model.encoder.through(tokens, len(model.encoder.blocks), train=False, rngs=None),
  }


@pytest.mark.parametrize('row', HF_ROWS)
def test_transformers_folder_gives_the_models_outputs(row):
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  model, notes, _, _ = folder_model(row)
  ours = hf_outputs(model, ref['images'])
  differences = {theirs: max_difference(ours[mine](), ref[theirs]) for mine, theirs in HF_ROWS[row]}
  print(f'{row}: max |ours - transformers| ' + ', '.join(f'{k} {v:.2e}' for k, v in differences.items()))
  assert all(d < 1e-5 for d in differences.values()), differences
  assert notes[0] == f'transformers {ref["name"]} read from its safetensors'
  assert not any('outputs differ' in n for n in notes)
  has_head = row in ('hf_vit', 'hf_clip_projection', 'hf_dinov2_cls', 'hf_dinov2_reg_cls', *SIGLIP_CLASSIFIERS)
  assert any('the source has none' in n for n in notes) == (not has_head)
  assert any('attention-pool head (head.*) left out' in n for n in notes) == (row in SIGLIP_CLASSIFIERS)
  if row in SIGLIP_CLASSIFIERS:
    assert (model.pool, hasattr(model, 'map_head')) == ('gap', False)


SIGLIP_CLASSIFIERS = ('hf_siglip_cls', 'hf_siglip2_cls')


def test_siglip2_classifier_at_a_grid_of_its_own():
  """NaFlex: transformers runs each image at its own patch grid, padded to max_num_patches and masked; our model
  built at that grid (2 x 6: its 4 x 4 table resized bilinear, antialiased) gives its logits without padding."""
  ref = np.load(os.path.join(DATA, 'hf_siglip2_cls', 'reference.npz'))
  model, notes, _, _ = folder_model('hf_siglip2_cls', input_shape=ref['wide_images'].shape[1:])
  difference = max_difference(model(ref['wide_images']), ref['wide_logits'])
  print(f'hf_siglip2_cls at a 2 x 6 grid: max |ours - transformers| logits {difference:.2e}')
  assert difference < 1e-5
  assert any("as transformers' SigLIP 2 resizes" in n for n in notes)


@pytest.mark.parametrize(
  'row,expected',
  [
    ('hf_vit', dict(layernorm_epsilon=1e-12, gelu_approximate=False, activation='gelu', pool='tok', num_classes=10)),
    ('hf_vit_model', dict(representation_size=32, num_classes=0)),
    ('hf_dinov2_reg', dict(layerscale=1.0, reg_tokens=4, posemb_prefix=False, patch_size=14)),
    ('hf_dinov2_reg_cls', dict(pool='tok_gap', reg_tokens=4, num_classes=10)),
    ('hf_siglip', dict(pool='map', gelu_approximate=True, layernorm_epsilon=1e-6, posemb_prefix=True)),
    ('hf_clip', dict(norm_pre=True, activation='quick_gelu', layernorm_epsilon=1e-5, num_classes=0)),
    ('hf_clip_projection', dict(num_classes=16, norm_pre=True)),
    ('clip', dict(norm_pre=True, activation='gelu', layernorm_epsilon=1e-5, num_classes=16)),
    ('clip_quickgelu', dict(norm_pre=True, activation='quick_gelu', layernorm_epsilon=1e-5)),
    ('vit', dict(norm_pre=False, activation='gelu', layernorm_epsilon=1e-6)),
  ],
)
def test_folder_options_come_from_its_config_and_tensors(row, expected):
  weights = hub.read(os.path.join(DATA, row))
  options = hub.reader(weights.layout).vit_options(weights.config, weights.tensors)
  assert {k: options[k] for k in expected} == expected
  assert (options['width'], options['depth'], options['mlp_dim'], options['num_heads']) == (32, 2, 64, 4)


@pytest.mark.parametrize(
  'row,mlp_dim,packed',
  [('dinov2_giant', 85, 'blocks.{}.mlp.fc1'), ('hf_dinov2_giant', 88, 'encoder.layer.{}.mlp.weights_in')],
)
def test_swiglu_folders_read_the_gate_first_and_keep_the_order(row, mlp_dim, packed):
  """DINOv2 giant's MLP: mlp='swiglu' with mlp_dim the width of each half of the packed fc1 (the gate's rows
  first, SiLU applied to them); the halves swapped, or the gate dropped, give another function."""
  weights = hub.read(os.path.join(DATA, row))
  options = hub.reader(weights.layout).vit_options(weights.config, weights.tensors)
  assert (options['mlp'], options['mlp_dim'], options['activation']) == ('swiglu', mlp_dim, 'gelu')
  model, _, _, params = folder_model(row)
  for i in (0, 1):
    mlp, w = params['encoder']['blocks'][i]['mlp'], weights.tensors[f'{packed.format(i)}.weight']
    assert set(mlp) == {'fc1', 'gate', 'fc2'} and w.shape == (2 * mlp_dim, 32)
    np.testing.assert_array_equal(mlp['gate']['kernel'], w[:mlp_dim].T)
    np.testing.assert_array_equal(mlp['fc1']['kernel'], w[mlp_dim:].T)
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  theirs = ref['features'] if 'features' in ref else ref['pooler_output']
  assert max_difference(model.features(ref['images']), theirs) < 1e-5
  block = model.encoder.blocks[0].mlp
  block.gate, block.fc1 = block.fc1, block.gate
  assert max_difference(model.features(ref['images']), theirs) > 1e-3
  block.gate, block.fc1 = block.fc1, block.gate
  block.activation = 'gelu'  # The plain MLP over fc1 alone.
  assert max_difference(model.features(ref['images']), theirs) > 1e-3


def test_a_swiglu_run_round_trips_and_packs_back_into_timms_fc1():
  """A SwiGLU run loads into the same model exactly (scanned too), and the release layout written back into timm's
  names (tools.export --layout timm) is the folder's own tensors."""
  kwargs = dict(width=32, depth=2, mlp_dim=24, num_heads=4, patch_size=4, mlp='swiglu', layerscale=0.1, scan=True)
  a, b = (vit.ViT(10, (16, 16, 3), rngs=nnx.Rngs(seed), **kwargs) for seed in (0, 1))
  pa, pb = (jax.device_get(nnx.state(m, nnx.Param).to_pure_dict()) for m in (a, b))
  assert pa['encoder']['blocks']['mlp']['gate']['kernel'].shape == (2, 32, 24)
  loaded, notes = b.load_pretrained(pa, pb)
  assert notes == []
  jax.tree.map(np.testing.assert_array_equal, loaded, pa)
  _, _, _, params = folder_model('dinov2_giant')
  written = timm_layout.from_release(release.to_release(params, 4))
  tensors = hub.read(os.path.join(DATA, 'dinov2_giant')).tensors
  assert written['blocks.1.mlp.fc1.weight'].shape == (170, 32)
  for name in tensors:
    np.testing.assert_array_equal(written[name], tensors[name], err_msg=name)


def test_quick_gelu_and_norm_pre_change_the_function():
  """The CLIP keys are no-ops neither way: loaded with the exact GELU or without norm_pre, timm's CLIP differs."""
  ref = np.load(os.path.join(DATA, 'clip_quickgelu', 'reference.npz'))
  with pytest.raises(ConfigError) as e:
    folder_model('clip_quickgelu', activation='gelu')
  assert "model.activation='quick_gelu', this model has model.activation='gelu'" in one_line(e)
  model, *_ = folder_model('clip_quickgelu')
  model.encoder.blocks[0].mlp.activation = 'gelu'
  assert max_difference(model(ref['images']), ref['logits']) > 1e-3


@pytest.mark.parametrize('row', ['hf_dinov2_reg', 'hf_vit_model', 'hf_dinov3', 'hf_siglip2'])
def test_transformers_resampling_at_another_image_size(row):
  """DINOv2 resamples its position embeddings bicubic, antialiased: ours equal. transformers' ViT
  (interpolate_pos_encoding) resamples bicubic without antialiasing, PyTorch's a=-0.75 kernel: close, not equal.
  DINOv3 has no table: its rotary positions are those of the larger grid, ours too. SigLIP 2 resizes its table
  bilinear, antialiased: ours equal."""
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  images = ref['resized_images']
  model, notes, _, _ = folder_model(row, input_shape=images.shape[1:])
  difference = max_difference(model.features(images), ref['resized_pooler_output'])
  print(f'{row} at {images.shape[1]}: max |ours - transformers| {difference:.2e}')
  assert difference < (1e-3 if row == 'hf_vit_model' else 1e-5)
  says = {'hf_dinov3': None, 'hf_siglip2': "as transformers' SigLIP 2 resizes"}.get(
    row, "as transformers' DINOv2 interpolates"
  )
  assert any(says in n for n in notes) if says else not any('resampled' in n for n in notes)


def test_a_transformers_4_folder_and_a_whole_clip_model_read_their_image_tower(tmp_path):
  """transformers 4 saved CLIPVisionModel under 'vision_model.'; a CLIPModel folder also holds the text tower and
  nests the image config in vision_config: the same model, the text tower left out (noted)."""
  folder = copy_row(tmp_path, 'hf_clip')
  path = os.path.join(folder, 'model.safetensors')
  tensors = {f'vision_model.{k}': v for k, v in safetensors.numpy.load_file(path).items()}
  tensors |= {'text_model.embeddings.token_embedding.weight': np.ones((5, 32), np.float32), 'logit_scale': np.ones(())}
  safetensors.numpy.save_file(tensors, path)
  with open(os.path.join(folder, 'config.json')) as f:
    vision = json.load(f)
  with open(os.path.join(folder, 'config.json'), 'w') as f:
    json.dump({'model_type': 'clip', 'architectures': ['CLIPModel'], 'vision_config': vision}, f)
  ref = np.load(os.path.join(DATA, 'hf_clip', 'reference.npz'))
  model, notes, _, _ = folder_model(folder)
  assert max_difference(model.features(ref['images']), ref['pooler_output']) < 1e-5
  assert notes[:2] == [
    'transformers CLIPModel read from its safetensors',
    'text tower left out (2 tensors): the ViT is the image tower',
  ]


def test_every_transformers_config_field_is_read_shown_by_the_tensors_or_neutral(tmp_path):
  """Never guessed: each field of the image and video configs transformers 5.24 writes (transformers_fields.json,
  made by make_references.py fields) has a stated handling; a field of another model is one line, and a neutral one
  (dropout, DINOv3's training-time position augmentation) changes nothing."""
  fields = json.load(open(os.path.join(DATA, 'transformers_fields.json')))
  assert fields.pop('transformers') == '5.24.0' and len(fields) == 13
  known = {'vivit': transformers_layout.VIDEO_FIELDS, 'videomae': transformers_layout.VIDEO_FIELDS}
  known['vjepa2'] = vjepa2_layout.CONFIG_FIELDS
  for model_type, names in fields.items():
    missing = set(names) - set(known.get(model_type, transformers_layout.CONFIG_FIELDS))
    assert not missing, (model_type, missing)
  for row in ('hf_videomae', 'hf_vjepa2'):
    weights = hub.read(os.path.join(DATA, row))
    with pytest.raises(ConfigError, match='config.json has use_rope, a field of another model'):
      hub.reader(weights.layout).vivit_options(weights.config | {'use_rope': True}, weights.tensors)
  for row, change, where in [
    ('hf_dinov2', {'use_rope_2d': True}, ''),
    ('hf_siglip2_cls', {'vision_config': {'num_patches': 16, 'patch_size': 8, 'qk_norm': True}}, "'s vision_config"),
  ]:
    weights = hub.read(os.path.join(DATA, row))
    with pytest.raises(ConfigError) as e:
      transformers_layout.vit_options(weights.config | change, weights.tensors)
    key = next(iter(change)) if not where else 'qk_norm'
    assert f'config.json{where} has {key}, a field of another model' in one_line(e)
  weights = hub.read(os.path.join(DATA, 'hf_dinov3'))
  neutral = dict(pos_embed_shift=0.1, pos_embed_jitter=0.2, attention_dropout=0.3, drop_path_rate=0.1, top_k=5)
  options = transformers_layout.vit_options(weights.config | neutral, weights.tensors)
  assert options == transformers_layout.vit_options(weights.config, weights.tensors)


def test_transformers_refusals_are_one_line(tmp_path):
  folder = copy_row(tmp_path, 'hf_dinov2')
  config_path = os.path.join(folder, 'config.json')
  with open(config_path) as f:
    config = json.load(f)
  for change, message in [
    (dict(use_swiglu_ffn=True), 'use_swiglu_ffn=True disagrees with the tensors, whose MLP is plain'),
    (dict(model_type='beit'), "a transformers model_type='beit' is not read into the ViT; read: vit, dinov2"),
    (dict(hidden_act='silu'), "hidden_act='silu' of the transformers config is not one of gelu"),
  ]:
    with open(config_path, 'w') as f:
      json.dump(config | change, f)
    with pytest.raises(ConfigError) as e:
      folder_model_from(folder)
    assert message in one_line(e)
  folder = copy_row(tmp_path, 'hf_dinov3_gated')
  config_path = os.path.join(folder, 'config.json')
  with open(config_path) as f:
    config = json.load(f)
  for change, message in [
    (dict(hidden_act='gelu'), "a gated MLP with hidden_act='gelu'; our ViT gates with SiLU"),
    (dict(use_gated_mlp=False), 'use_gated_mlp=False disagrees with the tensors, whose MLP is SwiGLU'),
  ]:
    with open(config_path, 'w') as f:
      json.dump(config | change, f)
    with pytest.raises(ConfigError) as e:
      folder_model_from(folder)
    assert message in one_line(e)


@pytest.mark.parametrize(
  'row,expected',
  [
    ('hf_dinov2_reg', dict(reg_tokens=4, posemb_prefix=False, layerscale=1.0, patch_size=14)),
    ('hf_siglip', dict(pool='map', gelu_approximate=True)),
    ('clip_quickgelu', dict(norm_pre=True, activation='quick_gelu', layernorm_epsilon=1e-5)),
    ('hf_dinov2_giant', dict(mlp='swiglu', mlp_dim=88, layerscale=1.0)),
  ],
)
def test_init_from_a_folder_sets_the_clip_and_transformers_keys(smoke_config, row, expected, capsys):
  """train.setup as `python -m main --config.init_from=DIR` runs it: the new keys, the GELU form and LayerNorm
  epsilon come from the folder when the config leaves them at their defaults, and the run starts from its weights."""
  config = smoke_config(init_from=os.path.join(DATA, row))
  config.model.update(dict.fromkeys(SIZES), dropout=0.0, drop_path=0.0)
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  size = ref['images'].shape[1]
  info, _ = tasks.build(config.task).synthetic_batch(f'{size},{size},3,10', config.data.batch_size)
  s = train.setup(config, data=(None, info))
  assert {k: config.model[k] for k in expected} == expected
  out = capsys.readouterr().out
  assert all(f'model.{k}={v!r} from the folder' in out for k, v in expected.items())
  model = nnx.merge(s.graphdef, train.init_state(s).params)
  theirs = ref['features'] if 'features' in ref else ref['pooler_output']
  assert max_difference(model.features(ref['images']), theirs) < 1e-5


def test_tensors_are_read_only_views_of_the_mapped_file(tmp_path):
  """No copy when a tensor is read (safetensors' own get_tensor copies); bfloat16 read as ml_dtypes' (JAX's)."""
  path = str(tmp_path / 'model.safetensors')
  tensors = {'a': np.arange(12, dtype=np.float32).reshape(3, 4), 'b': np.ones(5, ml_dtypes.bfloat16)}
  safetensors.numpy.save_file(tensors, path)
  (tmp_path / 'config.json').write_text('{}')
  read = hub.Tensors({'a': path, 'b': path})
  a = read['a']
  assert not a.flags.writeable and not a.flags.owndata and isinstance(a.base, np.ndarray)
  np.testing.assert_array_equal(a, tensors['a'])
  assert read['b'].dtype == ml_dtypes.bfloat16 and read.shape('b') == (5,)
  np.testing.assert_array_equal(read['b'].astype(np.float32), np.ones(5, np.float32))


def test_a_timm_qkv_stays_a_view_of_the_file_until_placed():
  """The release layout splits timm's fused qkv and the ViT fuses it again: a view of the mapped tensor, not a copy
  (release._join_columns); separate query / key / value (transformers') are joined by a copy."""
  weights = hub.read(os.path.join(DATA, 'vit'))
  model, *_ = folder_model('vit')
  params, _ = model.load_pretrained(weights, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))
  qkv = params['encoder']['blocks'][0]['attn']['qkv']['kernel']
  fused = weights.tensors['blocks.0.attn.qkv.weight']
  assert np.shares_memory(qkv, fused)
  np.testing.assert_array_equal(qkv, fused.T)
  _, _, _, params = folder_model('hf_vit')
  qkv = params['encoder']['blocks'][0]['attn']['qkv']['kernel']
  assert qkv.flags.owndata and qkv.shape == (32, 96)
  query = hub.read(os.path.join(DATA, 'hf_vit')).tensors['vit.encoder.layer.0.attention.attention.query.weight']
  np.testing.assert_array_equal(qkv[:, :32], query.T)


def test_place_puts_each_parameter_in_its_sharding():
  devices = jax.devices()
  mesh = jax.make_mesh((1, len(devices), 1), ('data', 'fsdp', 'model'))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('fsdp'))
  kernel = np.arange(8 * len(devices) * 3, dtype=np.float32).reshape(3, -1).T  # A transposed view, as from a file.
  tree = {'kernel': kernel, 'bias': np.ones(3, np.float32)}
  shardings = {'kernel': sharding, 'bias': jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())}
  placed = hub.place(tree, shardings)
  assert placed['kernel'].sharding == sharding and placed['bias'].sharding == shardings['bias']
  np.testing.assert_array_equal(placed['kernel'], kernel)
  np.testing.assert_array_equal(placed['bias'], tree['bias'])
  tree['block'] = {'scale': np.array([1.0, np.inf, 2.0], jax.numpy.bfloat16)}
  shardings['block'] = {'scale': shardings['bias']}
  with pytest.raises(ConfigError, match=r'hold NaN or infinite values \(in block\.scale\)'):
    hub.place(tree, shardings)


def test_hub_benchmark_loads_a_random_timm_folder(tmp_path):
  """`python -m vit_jax_lab.tools.hub_benchmark write` / `measure` on a ViT-Ti-sized folder (23 MB)."""
  size = hub_benchmark.write(str(tmp_path), 'Ti/16')
  result = hub_benchmark.measure(str(tmp_path))
  assert result['file_bytes'] == size == os.path.getsize(tmp_path / 'model.safetensors')
  assert result['parameters'] == 5_717_416  # timm's vit_tiny_patch16_224 with a 1000-class head.
  assert result['placed_bytes'] == 4 * result['parameters']
  assert result['read_and_convert_s'] > 0 and result['peak_rss_bytes'] > result['placed_bytes']


@pytest.mark.parametrize('row', ['clip_quickgelu', 'hf_dinov2_reg', 'hf_siglip'])
def test_a_scanned_model_loads_the_folder_alike(row):
  """model.scan=True: the blocks' parameters stacked on a layer axis (release.scanned_like), the same outputs."""
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  model, _, _, params = folder_model(row, scan=True)
  assert params['encoder']['blocks']['attn']['qkv']['kernel'].shape == (2, 32, 96)
  theirs = ref['features'] if 'features' in ref else ref['pooler_output']
  assert max_difference(model.features(ref['images']), theirs) < 1e-5


def test_hub_benchmark_measures_a_video_folder_in_the_vivit():
  result = hub_benchmark.measure(os.path.join(DATA, 'hf_vjepa2_cls'))
  _, _, _, params = video_model('hf_vjepa2_cls')
  assert result['parameters'] == sum(np.size(a) for a in jax.tree.leaves(params))
  assert result['placed_bytes'] == 4 * result['parameters'] and result['place_s'] > 0


def test_a_bfloat16_folder_loads_as_the_models_float32(tmp_path):
  """Hub checkpoints are often saved in bfloat16: read (ml_dtypes' bfloat16), cast to the parameters' dtype, noted."""
  folder = copy_row(tmp_path, 'vit')
  path = os.path.join(folder, 'model.safetensors')
  tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in safetensors.numpy.load_file(path).items()}
  safetensors.numpy.save_file(tensors, path)
  model, notes, _, params = folder_model(folder)
  assert "bfloat16 tensors cast to the model's parameter dtype" in notes
  assert {a.dtype for a in jax.tree.leaves(params)} == {np.dtype(np.float32)}
  np.testing.assert_array_equal(params['cls'], tensors['cls_token'].astype(np.float32))
  ref = np.load(os.path.join(DATA, 'vit', 'reference.npz'))
  assert max_difference(model(ref['images']), ref['logits']) < 0.1  # bfloat16's 8 bits of mantissa.


# transformers video classifier rows (make_references.py HF_VIDEO_ROWS): clips of 4 frames of 16 x 24, tubelets
# 2 x 8 x 8, a 2 x 2 x 3 token grid.
VIDEO_ROWS = {
  'hf_vivit': 'VivitForVideoClassification (model 1, class token, learned positions, gelu_fast)',
  'hf_videomae': 'VideoMAEForVideoClassification (fixed sine-cosine positions, mean pooling + fc_norm, q_bias/v_bias)',
}


def video_model(row, num_classes=None, input_shape=None, **overrides):
  """Our ViViT of a video folder's shape with its weights, and the load notes (`folder_model`)."""
  return folder_model(row, num_classes, input_shape, family=vivit.ViViT, **overrides)


@pytest.mark.parametrize('row', VIDEO_ROWS)
def test_transformers_video_folder_gives_the_librarys_logits(row):
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  model, notes, _, _ = video_model(row)
  difference = max_difference(model(ref['videos']), ref['logits'])
  print(f'{row}: max |ours - transformers| logits {difference:.2e} (logits up to {np.abs(ref["logits"]).max():.2f})')
  assert difference < 1e-5
  assert np.abs(ref['logits']).max() > 0.1  # Random weights, not a zero head.
  assert notes == [f'transformers {ref["name"]} read from its safetensors']


@pytest.mark.parametrize(
  'row,expected',
  [
    ('hf_vivit', dict(pool='tok', posemb='learn', fc_norm=None, gelu_approximate=True, layernorm_epsilon=1e-6)),
    ('hf_videomae', dict(pool='gap', posemb='sincos_flat', fc_norm=1e-5, gelu_approximate=False)),
  ],
)
def test_video_folder_options_come_from_its_config_and_tensors(row, expected):
  weights = hub.read(os.path.join(DATA, row))
  options = transformers_layout.vivit_options(weights.config, weights.tensors)
  assert {k: options[k] for k in expected} == expected
  assert options['input_shape'] == (4, 16, 24, 3) and (options['patch_size'], options['tubelet_time']) == (8, 2)
  assert (options['width'], options['depth'], options['mlp_dim'], options['num_heads']) == (32, 2, 64, 4)
  assert (options['model'], options['num_classes']) == ('spatiotemporal', 10)


def test_videomae_in_transformers_5_names_and_with_a_key_bias_loads_alike(tmp_path):
  """transformers 5 renames q_bias / v_bias to query.bias / value.bias when it loads; a zero key bias (what ours
  holds for VideoMAE's missing one) is the same function, a non-zero one is read."""
  folder = copy_row(tmp_path, 'hf_videomae')
  path = os.path.join(folder, 'model.safetensors')
  tensors = safetensors.numpy.load_file(path)
  renamed = {k.replace('.q_bias', '.query.bias').replace('.v_bias', '.value.bias'): v for k, v in tensors.items()}
  assert len(renamed) == len(tensors) and not any('q_bias' in k for k in renamed)
  safetensors.numpy.save_file(renamed, path)
  ref = np.load(os.path.join(DATA, 'hf_videomae', 'reference.npz'))
  model, _, _, params = video_model(folder)
  assert max_difference(model(ref['videos']), ref['logits']) < 1e-5
  qkv_bias = params['encoder']['blocks'][0]['attn']['qkv']['bias']
  np.testing.assert_array_equal(qkv_bias[32:64], np.zeros(32, np.float32))  # The key's.
  np.testing.assert_array_equal(qkv_bias[:32], tensors['videomae.encoder.layer.0.attention.attention.q_bias'])


def test_videomae_positions_and_fc_norm_are_the_function():
  """Neither new key is a no-op: VideoMAE's table is not the 2-D + 1-D 'sincos', and fc_norm's epsilon is used."""
  ref = np.load(os.path.join(DATA, 'hf_videomae', 'reference.npz'))
  with pytest.raises(ConfigError) as e:
    video_model('hf_videomae', posemb='sincos')
  assert "model.posemb='sincos_flat', this model has model.posemb='sincos'" in one_line(e)
  table = vivit.sincos_flat(12, 32)
  np.testing.assert_array_equal(table[0], np.tile([0.0, 1.0], 16).astype(np.float32))
  np.testing.assert_allclose(table[5, :2], [np.sin(5), np.cos(5)], rtol=1e-6)
  model, notes, _, _ = video_model('hf_videomae', fc_norm=0.5)
  assert any(
    "computes with {'gelu_approximate': False, 'layernorm_epsilon': 1e-12, 'fc_norm': 1e-05}" in n for n in notes
  )
  assert max_difference(model(ref['videos']), ref['logits']) > 1e-3


def test_a_video_head_of_another_class_count_is_replaced_and_fc_norm_kept():
  ref = np.load(os.path.join(DATA, 'hf_videomae', 'reference.npz'))
  model, notes, initial, params = video_model('hf_videomae', num_classes=5)
  assert 'head (32, 10) re-initialised for (32, 5)' in notes
  np.testing.assert_array_equal(params['head']['kernel'], initial['head']['kernel'])
  tensors = hub.read(os.path.join(DATA, 'hf_videomae')).tensors
  np.testing.assert_array_equal(params['fc_norm']['scale'], tensors['fc_norm.weight'])
  assert model.features(ref['videos']).shape == (2, 32)


def test_another_clip_size_resamples_learned_positions_and_recomputes_fixed_ones():
  """ViViT's learned positions (2 x 2 x 3 tubelets) to 4 x 3 x 3: bicubic over space, linear over time, the class
  token's row kept; VideoMAE's fixed table is computed for the new grid (as VideoMAE at that size)."""
  model, notes, _, params = video_model('hf_vivit', input_shape=(8, 24, 24, 3))
  (note,) = [n for n in notes if n.startswith('position embeddings resampled')]
  assert '(1, 13, 32) -> (1, 37, 32)' in note and 'bicubic' in note
  folder = hub.read(os.path.join(DATA, 'hf_vivit')).tensors['vivit.embeddings.position_embeddings']
  np.testing.assert_array_equal(params['pos_embedding'][:, :1], folder[:, :1])
  assert model(np.zeros((1, 8, 24, 24, 3), np.float32)).shape == (1, 10)
  model, notes, _, _ = video_model('hf_videomae', input_shape=(8, 24, 24, 3))
  assert not any('resampled' in n for n in notes)
  assert model(np.zeros((1, 8, 24, 24, 3), np.float32)).shape == (1, 10)


def test_a_resampled_grid_of_the_same_size_is_the_same_table():
  model, *_ = video_model('hf_vivit')
  pos = hub.read(os.path.join(DATA, 'hf_vivit')).tensors['vivit.embeddings.position_embeddings']
  np.testing.assert_allclose(model._resample_positions(pos, (2, 2, 3)), pos, atol=1e-6)


@pytest.mark.parametrize(
  'row,key,value,message',
  [
    (
      'hf_vivit',
      'model',
      'factorised_encoder',
      "model.model='spatiotemporal', this model has model.model='factorised_",
    ),
    ('hf_vivit', 'tubelet_time', 1, 'model.tubelet_time=2, this model has model.tubelet_time=1'),
    ('hf_videomae', 'fc_norm', None, 'model.fc_norm=1e-05, this model has model.fc_norm=None'),
    ('hf_videomae', 'pool', 'tok', "model.fc_norm=1e-05 normalises the average pool: it needs model.pool='gap'"),
  ],
)
def test_a_video_model_of_another_shape_is_one_line_naming_the_key(row, key, value, message):
  with pytest.raises(ConfigError) as e:
    video_model(row, **{key: value})
  assert message in one_line(e)


def test_image_and_video_folders_go_to_their_family():
  with pytest.raises(ConfigError) as e:
    folder_model('hf_vivit')
  assert "model_type='vivit' is a video model: read it into model.name='vivit'" in one_line(e)
  with pytest.raises(ConfigError) as e:
    video_model('hf_vit')
  assert "model_type='vit' is not read into the ViViT; read: vivit, videomae" in one_line(e)


def test_a_videomae_without_mean_pooling_is_refused(tmp_path):
  folder = copy_row(tmp_path, 'hf_videomae')
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  with open(os.path.join(folder, 'config.json'), 'w') as f:
    json.dump(config | dict(use_mean_pooling=False), f)
  with pytest.raises(ConfigError) as e:
    video_model(folder)
  assert 'use_mean_pooling=False (its classifier reads the first patch token' in one_line(e)


@pytest.mark.parametrize(
  'kwargs,message',
  [
    (dict(fc_norm='small'), "model.fc_norm='small' must be a positive number"),
    (dict(fc_norm=True), 'model.fc_norm=True must be a positive number'),
    (dict(fc_norm=1e-5, pool='tok'), "needs model.pool='gap'"),
    (dict(posemb='sincos_flat', model='factorised_encoder'), "model.posemb='sincos_flat' numbers the tokens"),
    (dict(posemb='sincos1d'), "model.posemb='sincos1d' is not one of 'learn', 'sincos', 'sincos_flat'"),
  ],
)
def test_new_vivit_keys_are_validated(kwargs, message):
  with pytest.raises(ConfigError, match=message):
    vivit.ViViT(10, (4, 16, 16, 3), variant='mu/8x2', rngs=nnx.Rngs(0), **kwargs)


# V-JEPA 2 rows (make_references.py VJEPA2_ROWS): clips of 4 frames of 24 x 24, tubelets 2 x 8 x 8 (a 2 x 3 x 3
# grid), heads 26 wide (8 channels turned per axis, 2 not); references also at crop_size 40 on 6-frame clips.
def test_vjepa2_classifier_gives_the_librarys_logits_at_its_size_and_another():
  ref = np.load(os.path.join(DATA, 'hf_vjepa2_cls', 'reference.npz'))
  model, notes, _, _ = video_model('hf_vjepa2_cls')
  difference = max_difference(model(ref['videos']), ref['logits'])
  resized, _, _, _ = video_model('hf_vjepa2_cls', input_shape=(6, 40, 40, 3))
  other = max_difference(resized(ref['resized_videos']), ref['resized_logits'])
  print(f'hf_vjepa2_cls: max |ours - transformers| logits {difference:.2e}; 6 x 40 x 40 clips {other:.2e}')
  assert difference < 1e-5 and other < 1e-5
  assert np.abs(ref['logits']).max() > 0.1
  assert notes == [
    'transformers VJEPA2ForVideoClassification read from its safetensors',
    'predictor left out (23 tensors: masked pretraining only)',
  ]


def test_vjepa2_backbone_gives_the_librarys_tokens_under_any_pool():
  """A VJEPA2Model folder (encoder and predictor, no pool, no head): last_hidden_state, with a new attentive pool
  (V-JEPA 2's frozen evaluation) or the average."""
  ref = np.load(os.path.join(DATA, 'hf_vjepa2', 'reference.npz'))
  model, notes, initial, params = video_model('hf_vjepa2', pool='attentive', pool_depth=1)
  difference = max_difference(model.encode(ref['videos']), ref['last_hidden_state'])
  assert 'the attentive pool initialised: the source has none (a backbone)' in notes
  jax.tree.map(np.testing.assert_array_equal, params['pooler'], initial['pooler'])
  resized, _, _, _ = video_model('hf_vjepa2', input_shape=(6, 40, 40, 3), pool='gap')
  other = max_difference(resized.encode(ref['resized_videos']), ref['resized_last_hidden_state'])
  print(f'hf_vjepa2: max |ours - transformers| last_hidden_state {difference:.2e}; 6 x 40 x 40 clips {other:.2e}')
  assert difference < 1e-5 and other < 1e-5


def test_vjepa2_folder_into_the_config_and_its_refusals():
  """pretrained_config, as train.setup runs it for --config.init_from=DIR: rope, posemb, pool and the sizes from the
  folder; a backbone leaves the pool to the config; a key set otherwise is one line."""
  config = models.config('vivit')
  notes = vivit.ViViT.pretrained_config(config, hub.read(os.path.join(DATA, 'hf_vjepa2_cls')))
  expected = dict(rope='vjepa2', posemb='none', pool='attentive', pool_depth=2, pool_mlp_dim=208, mlp_dim=104)
  assert {k: config[k] for k in expected} == expected and "model.rope='vjepa2' from the folder" in notes
  assert config.num_heads == 2 and config.tubelet_time == 2 and config.gelu_approximate is False
  backbone = models.config('vivit', pool='gap')
  vivit.ViViT.pretrained_config(backbone, hub.read(os.path.join(DATA, 'hf_vjepa2')))
  assert backbone.pool == 'gap' and backbone.rope == 'vjepa2'
  with pytest.raises(ConfigError) as e:
    vivit.ViViT.pretrained_config(models.config('vivit', pool='tok'), hub.read(os.path.join(DATA, 'hf_vjepa2_cls')))
  assert "is a model with model.pool='attentive', the config sets model.pool='tok'" in one_line(e)
  with pytest.raises(ConfigError) as e:
    video_model('hf_vjepa2_cls', pool_depth=3)
  assert 'model.pool_depth=2, this model has model.pool_depth=3' in one_line(e)


@pytest.mark.parametrize(
  'kwargs,message',
  [
    (dict(rope='vjepa2', model='factorised_self_attention'), "model.rope='vjepa2' turns the queries and keys of"),
    (dict(rope='vjepa2', attention='linear'), "this is model 'spatiotemporal' with model.attention='linear'"),
    (dict(rope='axial'), "model.rope='axial' is not one of None, 'vjepa2'"),
    (dict(rope='vjepa2', num_heads=8), 'the head width 4 must be at least 6'),
    (dict(posemb='none'), "model.posemb='none' leaves the tokens without positions: set model.rope"),
    (dict(pool='attentive', model='factorised_encoder'), "model.pool='attentive' is not one of 'tok', 'gap'"),
    (dict(pool='attentive', pool_depth=-1), 'model.pool_depth=-1 must be a non-negative integer'),
    (dict(pool='attentive', pool_mlp_dim=0), 'model.pool_mlp_dim=0 must be a positive integer or None'),
  ],
)
def test_vivit_rope_and_attentive_pool_keys_are_validated(kwargs, message):
  with pytest.raises(ConfigError) as e:
    vivit.ViViT(10, (4, 16, 16, 3), variant='mu/8x2', rngs=nnx.Rngs(0), **(dict(width=32, num_heads=4) | kwargs))
  assert message in one_line(e)


def test_a_vivit_with_rope_and_the_attentive_pool_trains_scanned_alike():
  """Gradients reach the pool's query, and model.scan=True computes what the unscanned blocks do."""
  kwargs = dict(variant='mu/8x2', width=48, num_heads=4, rope='vjepa2', posemb='none', pool='attentive', pool_depth=1)
  plain = vivit.ViViT(3, (4, 16, 16, 3), head_zero_init=False, rngs=nnx.Rngs(0), **kwargs)
  scanned = vivit.ViViT(3, (4, 16, 16, 3), head_zero_init=False, scan=True, rngs=nnx.Rngs(0), **kwargs)
  params = jax.device_get(nnx.state(plain, nnx.Param).to_pure_dict())
  state = nnx.state(scanned, nnx.Param)
  state.replace_by_pure_dict(layers.scanned_like(params, state.to_pure_dict()))
  nnx.update(scanned, state)
  videos = np.random.RandomState(0).randn(2, 4, 16, 16, 3).astype(np.float32)
  assert max_difference(plain(videos), scanned(videos)) < 1e-5
  grads = nnx.grad(lambda m: m(videos).sum())(plain)
  assert np.abs(grads['pooler']['query'][...]).max() > 0


def test_default_vivit_parameters_are_unchanged():
  model = vivit.ViViT(10, (4, 16, 16, 3), variant='mu/8x2', rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param).to_pure_dict()
  assert set(params) == {'embedding', 'cls', 'pos_embedding', 'encoder', 'head'}
  assert set(params['encoder']) == {'blocks', 'norm'}


def test_a_scanned_vivit_loads_the_folder_alike():
  ref = np.load(os.path.join(DATA, 'hf_videomae', 'reference.npz'))
  model, _, _, params = video_model('hf_videomae', scan=True)
  assert params['encoder']['blocks']['attn']['qkv']['kernel'].shape == (2, 32, 96)
  assert max_difference(model(ref['videos']), ref['logits']) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize('row', VIDEO_ROWS)
def test_init_from_a_video_folder_in_a_run_takes_the_folders_shape(tmp_path, row, capsys):
  """train.setup / init_state as `python -m main --config configs/vivit/moving_digits.py --config.init_from=DIR`
  runs them: sizes left unset and keys at their defaults come from the folder (noted); the run starts from its
  weights."""
  config = load_config(
    'configs/vivit/moving_digits.py:spatiotemporal,smoke', str(tmp_path), init_from=os.path.join(DATA, row)
  )
  config.model.update(dict.fromkeys((*SIZES, 'tubelet_time', 'pool')), dropout=0.0, drop_path=0.0)
  info, _ = tasks.build(config.task).synthetic_batch('4,16,24,3,10', config.data.batch_size)
  s = train.setup(config, data=(None, info))
  out = capsys.readouterr().out
  model = nnx.merge(s.graphdef, train.init_state(s).params)
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  assert max_difference(model(ref['videos']), ref['logits']) < 1e-5
  assert (config.model.width, config.model.patch_size, config.model.tubelet_time) == (32, 8, 2)
  assert 'model.width=32 from the folder' in out
  if row == 'hf_videomae':
    assert (config.model.pool, config.model.posemb, config.model.fc_norm) == ('gap', 'sincos_flat', 1e-5)
    assert "model.posemb='sincos_flat' from the folder" in out and 'model.layernorm_epsilon=1e-12 from' in out


@pytest.mark.slow
def test_init_from_a_vjepa2_folder_in_a_run_takes_rope_and_the_attentive_pool(tmp_path, capsys):
  """`python -m main --config configs/vivit/moving_digits.py --config.init_from=DIR` of a V-JEPA 2 classifier:
  rope, posemb and the attentive pool come from the folder, and the run starts from its logits."""
  config = load_config(
    'configs/vivit/moving_digits.py:spatiotemporal,smoke', str(tmp_path), init_from=os.path.join(DATA, 'hf_vjepa2_cls')
  )
  config.model.update(dict.fromkeys((*SIZES, 'tubelet_time', 'pool')), dropout=0.0, drop_path=0.0)
  info, _ = tasks.build(config.task).synthetic_batch('4,24,24,3,10', config.data.batch_size)
  s = train.setup(config, data=(None, info))
  model = nnx.merge(s.graphdef, train.init_state(s).params)
  out = capsys.readouterr().out
  ref = np.load(os.path.join(DATA, 'hf_vjepa2_cls', 'reference.npz'))
  assert max_difference(model(ref['videos']), ref['logits']) < 1e-5
  assert (config.model.rope, config.model.posemb, config.model.pool) == ('vjepa2', 'none', 'attentive')
  assert "model.rope='vjepa2' from the folder" in out and 'predictor left out' in out


def test_a_video_key_the_config_sets_otherwise_is_one_line(tmp_path):
  config = load_config(
    'configs/vivit/moving_digits.py:spatiotemporal,smoke', str(tmp_path), init_from=os.path.join(DATA, 'hf_vivit')
  )
  config.model.update(dict.fromkeys(SIZES))  # The smoke config sets pool='gap'; the folder has a class token.
  info, _ = tasks.build(config.task).synthetic_batch('4,16,24,3,10', config.data.batch_size)
  with pytest.raises(ConfigError) as e:
    train.setup(config, data=(None, info))
  assert "is a model with model.pool='tok', the config sets model.pool='gap': set --config.model.pool='tok'" in (
    one_line(e)
  )


# Tracker rows: an image folder whose patch grid is the search grid; the template grid is smaller (resampled).
TRACKER_ROWS = ('mae', 'vit', 'dinov2', 'dinov2_reg4', 'dinov2_giant', 'hf_dinov2_reg', 'hf_dinov2_giant', 'hf_vit')
TRACKER_KEYS = (*vit.SIZES, *tracker.Tracker.STRUCTURE, *vit.FOLDER_OPTIONS)


def folder_tracker(row, template=None, **overrides):
  """A tracker of the folder's backbone shape (template crop of 2 patches unless given, search crop at the folder's
  image size) with the folder's weights: (model, notes, initial parameters, loaded parameters, the folder's options)."""
  weights = hub.read(os.path.join(DATA, row))
  options = vit.folder_options(weights)
  kwargs = {k: options[k] for k in TRACKER_KEYS} | overrides
  height, _, channels = options['input_shape']
  model = tracker.Tracker(template or 2 * options['patch_size'], height, channels, rngs=nnx.Rngs(0), **kwargs)
  initial = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  params, notes = model.load_pretrained(weights, initial)
  return model, notes, initial, params, options


@pytest.mark.parametrize('row', TRACKER_ROWS)
def test_a_folder_into_the_tracker_gives_the_vits_backbone(row):
  """The tracker reads a timm or transformers image folder through the ViT's own readers: its patch embedding and
  encoder are the ViT's loaded from the folder, array for array; its search positions the ViT's at the search size,
  its template positions the ViT's at the template size (both resampled by the library's own method); cls, reg and
  the heads keep their initialisation."""
  model, notes, initial, params, options = folder_tracker(row)
  _, _, _, image = folder_model(row)
  for part in ('embedding', 'encoder'):
    jax.tree.map(np.testing.assert_array_equal, params[part], image[part])
  if options['mlp'] == 'swiglu':
    assert set(params['encoder']['blocks'][1]['mlp']) == {'fc1', 'gate', 'fc2'}
  prefix = options['posemb_prefix'] and 1 + options['reg_tokens']  # The ViT's rows before its patches.
  np.testing.assert_array_equal(params['search_pos'], image['pos_embedding'][:, prefix:])
  template = model.template_grid[0] * options['patch_size']
  _, _, _, small = folder_model(row, input_shape=(template, template, 3))
  np.testing.assert_array_equal(params['template_pos'], small['pos_embedding'][:, prefix:])
  assert params['template_pos'].shape == (1, 4, 32)
  for fresh in ('cls', 'reg', 'class_head', 'box_mlp'):
    jax.tree.map(np.testing.assert_array_equal, params[fresh], initial[fresh])
  assert any(f'template grid (2, 2) and the search grid {model.search_grid}' in n for n in notes)
  assert notes[-1].startswith("the image model's ") and notes[-1].endswith('the box head start fresh')
  assert ('register tokens' in notes[-1]) == bool(options['reg_tokens'])
  state = nnx.state(model, nnx.Param)
  state.replace_by_pure_dict(params)
  nnx.update(model, state)
  x = np.random.RandomState(0).randn(2, model.search_grid[0] * options['patch_size'], *options['input_shape'][1:])
  logit, box = model(x[:, :template, :template].astype(np.float32), x.astype(np.float32))
  assert logit.shape == (2,) and box.shape == (2, 4) and np.isfinite(box).all()


ROTARY_TRACKER_ROWS = ('rope_axial', 'rope_mixed_ape', 'rope_sbb', 'dinov3', 'eva02_base', 'hf_dinov3')


@pytest.mark.parametrize('row', ROTARY_TRACKER_ROWS)
def test_a_rotary_folder_into_the_tracker_turns_the_search_crop_as_the_image(row):
  """RoPE ViTs, DINOv3, EVA-02 (sub-LN, separate q/k/v) into the tracker: patch embedding, encoder and RoPE-Mixed's
  frequencies are the ViT's loaded from the folder (fc_norm becomes the encoder's final LayerNorm); the search
  crop's patches (at the folder's size) turn by the image model's angles, the template's span the same extent."""
  model, notes, initial, params, options = folder_tracker(row)
  image_model, _, _, image = folder_model(row)
  encoder = image['encoder'] | ({'norm': image['fc_norm']} if 'fc_norm' in image else {})
  for part, theirs in (('embedding', image['embedding']), ('encoder', encoder), ('rope', image.get('rope'))):
    jax.tree.map(np.testing.assert_array_equal, params.get(part), theirs)
  assert ('search_pos' in params) == (options['posemb'] == 'learn')
  if options['posemb'] == 'learn':
    np.testing.assert_array_equal(params['search_pos'], image['pos_embedding'][:, options['posemb_prefix'] :])
  state = nnx.state(model, nnx.Param)
  state.replace_by_pure_dict(params)
  nnx.update(model, state)
  ours, theirs = model.rope(), image_model.rope()
  template = model.template_grid[0] * model.template_grid[1]
  np.testing.assert_allclose(ours.sin[:, template:], theirs.sin, atol=1e-6)
  np.testing.assert_allclose(ours.cos[:, template:], theirs.cos, atol=1e-6)
  side = model.search_grid[0]
  if options['rope'] != 'dinov3':  # The template's patch (1, 1) of 2 x 2 sits where the search's (S/2, S/2) does.
    np.testing.assert_allclose(ours.sin[:, template - 1], theirs.sin[:, side // 2 * (side + 1)], atol=1e-5)
  assert any(n.startswith('rotary positions: the template grid (2, 2)') for n in notes)
  x = np.random.RandomState(0).randn(2, side * options['patch_size'], side * options['patch_size'], 3)
  x = x.astype(np.float32)
  logit, box = model(x[:, : 2 * options['patch_size'], : 2 * options['patch_size']], x)
  assert logit.shape == (2,) and np.isfinite(box).all()
  cls, _ = model.search_attention(x[:, : 2 * options['patch_size'], : 2 * options['patch_size']], x)
  np.testing.assert_allclose(cls.sum((1, 2)), 1.0, atol=0.5)  # Most of the class token's attention, on the search.


def test_a_rotary_tracker_config_takes_the_folders_rope():
  config = models.config('tracker', variant=None, patch_size=None)
  notes = tracker.Tracker.pretrained_config(config, hub.read(os.path.join(DATA, 'eva02_base')))
  assert (config.rope, config.mlp_norm, config.mlp, config.rope_ref_grid) == ('axial', True, 'swiglu', 16)
  assert "model.rope='axial' from the folder" in notes
  with pytest.raises(ConfigError, match="model.posemb='none' leaves the patches without positions"):
    tracker.Tracker(32, 64, 3, variant='mu/8', posemb='none', rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='write it as a timm folder'):
    model = tracker.Tracker(32, 64, 3, variant='mu/8', rope='axial', rngs=nnx.Rngs(0))
    model.load_pretrained({'embedding': {}}, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))


def test_a_scanned_tracker_loads_the_folder_alike():
  _, _, _, params, _ = folder_tracker('dinov2_giant')
  _, _, _, scanned, _ = folder_tracker('dinov2_giant', scan=True)
  assert scanned['encoder']['blocks']['mlp']['gate']['kernel'].shape == (2, 32, 85)
  np.testing.assert_array_equal(scanned['encoder']['blocks']['ls1'][1], params['encoder']['blocks'][1]['ls1'])
  np.testing.assert_array_equal(scanned['search_pos'], params['search_pos'])


@pytest.mark.parametrize(
  'row,overrides,message',
  [
    ('hf_vivit', {}, "a transformers model_type='vivit' is a video model: read it into model.name='vivit'"),
    ('dinov2', dict(width=64), 'is a model with model.width=32, this tracker has model.width=64: set'),
    ('dinov2', dict(layerscale=None), 'is a model with model.layerscale=1e-05, this tracker has model.layerscale=None'),
    ('dinov2_giant', dict(mlp='plain'), "model.mlp='swiglu', this tracker has model.mlp='plain'"),
    ('clip', {}, "a LayerNorm before the encoder (model.norm_pre: CLIP's, Perception Encoder's), which the tracker"),
    ('pe_core', {}, 'a LayerNorm before the encoder (model.norm_pre'),
    ('rope_mixed_ape', dict(rope=None), "is a model with model.rope='mixed', this tracker has model.rope=None"),
    ('dinov3', dict(rope='axial'), "model.rope='dinov3', this tracker has model.rope='axial'"),
    ('dinov2', dict(stem='conv', patch_size=16), "fits model.stem='patch' only"),
  ],
)
def test_the_tracker_refuses_what_it_cannot_start_from_in_one_line(row, overrides, message):
  path = os.path.join(DATA, row)
  with pytest.raises(ConfigError) as e:
    if row == 'hf_vivit':  # As train.setup meets it: the folder's shape is read first.
      tracker.Tracker.pretrained_config(models.config('tracker'), hub.read(path))
    elif 'stem' in overrides:
      model = tracker.Tracker(
        32, 64, 3, width=32, depth=2, mlp_dim=64, num_heads=4, layerscale=1e-5, rngs=nnx.Rngs(0), **overrides
      )
      model.load_pretrained(hub.read(path), jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))
    else:
      folder_tracker(row, **overrides)
  assert message in one_line(e)


def test_a_grey_tracker_refuses_a_colour_folder_in_one_line():
  weights = hub.read(os.path.join(DATA, 'mae'))
  options = vit.folder_options(weights)
  model = tracker.Tracker(16, 32, 1, rngs=nnx.Rngs(0), **{k: options[k] for k in TRACKER_KEYS})
  with pytest.raises(ConfigError) as e:
    model.load_pretrained(weights, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))
  assert "is a model of 3-channel images, and this tracker's have 1 channels" in one_line(e)


def test_a_tracker_config_takes_the_folders_backbone_shape():
  """Tracker.pretrained_config, as train.setup runs it for --config.init_from=DIR: the sizes, layerscale, mlp, GELU
  form and LayerNorm epsilon the config leaves unset come from the folder; a size it sets otherwise is one line."""
  config = models.config('tracker', variant=None, patch_size=None)
  notes = tracker.Tracker.pretrained_config(config, hub.read(os.path.join(DATA, 'hf_dinov2_giant')))
  expected = dict(patch_size=14, width=32, depth=2, mlp_dim=88, num_heads=4, layerscale=1.0, mlp='swiglu')
  assert {k: config[k] for k in expected} == expected and config.layernorm_epsilon == 1e-6
  assert "model.mlp='swiglu' from the folder" in notes and 'model.layerscale=1.0 from the folder' in notes
  siglip = models.config('tracker', variant=None, patch_size=None)
  tracker.Tracker.pretrained_config(siglip, hub.read(os.path.join(DATA, 'hf_siglip')))
  assert siglip.gelu_approximate and siglip.layerscale is None  # SigLIP's tanh GELU, as the ViT takes it.
  model = models.build(config, nnx.Rngs(0), template_size=28, search_size=42, channels=3)
  _, load_notes = model.load_pretrained(
    hub.read(os.path.join(DATA, 'hf_dinov2_giant')), jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  )
  assert not any('outputs differ' in n for n in load_notes)
  with pytest.raises(ConfigError) as e:
    tracker.Tracker.pretrained_config(models.config('tracker', variant='mu/14'), hub.read(os.path.join(DATA, 'dinov2')))
  assert 'model.width=32, the config sets model.width=64 (by model.variant)' in one_line(e)
  with pytest.raises(ConfigError) as e:
    tracker.Tracker(32, 64, 3, variant='mu/8', mlp='geglu', rngs=nnx.Rngs(0))
  assert "model.mlp='geglu' is not one of 'plain', 'swiglu'" in one_line(e)


def test_a_transformers_classifier_of_another_width_is_refused_not_dropped():
  """A classifier reading neither the width nor twice it (Dinov2ForImageClassification's [class token, patch
  mean]: hf_dinov2_cls) is refused. Dropped, predict --pretrained printed uniform probabilities and exited 0."""
  weights = hub.read(os.path.join(DATA, 'hf_dinov2'))
  width = weights.tensors['embeddings.cls_token'].shape[-1]
  tensors = dict(weights.tensors) | {'classifier.weight': np.zeros((10, 3 * width), np.float32)}
  with pytest.raises(ConfigError, match=f'its classifier reads {3 * width} features of a {width}-wide model'):
    transformers_layout.vit_options(weights.config, tensors)
  twice = tensors | {'classifier.weight': np.zeros((10, 2 * width), np.float32)}
  assert transformers_layout.vit_options(weights.config, twice)['pool'] == 'tok_gap'


def test_timm_heads_without_model_args_are_timms_for_every_vit_architecture():
  """A hub folder's config.json often has no model_args: its heads come from the architecture's name
  (timm_layout.heads_of), the same as timm 1.0.31 builds for each of its 241 ViT, DeiT and EVA architectures
  (tests/data/pretrained/timm_heads.json, written by timm); a name it cannot tell is one line, never a guess."""
  reference = json.load(open(os.path.join(DATA, 'timm_heads.json')))
  assert reference['timm'] == '1.0.31' and len(reference['heads']) > 200
  wrong = {a: (timm_layout.heads_of(a), h) for a, h in reference['heads'].items() if timm_layout.heads_of(a) != h}
  assert not wrong, wrong
  assert timm_layout.heads_of('vit_huge_plus_patch16_dinov3.lvd1689m') == 20
  assert timm_layout.heads_of('vitamin_xlarge_256') is None


@pytest.mark.parametrize(
  'field, value, message',
  [
    ('frames_per_clip', 0, 'has frames_per_clip=0; it must be a positive integer'),  # Before: ZeroDivisionError.
    ('crop_size', 10**6, 'crop_size=1000000 and frames_per_clip=.* must be at most 4,096'),  # Before: 33 lines.
    ('num_attention_heads', 'x', "has num_attention_heads='x'; it must be a positive integer"),
  ],
)
def test_vjepa2_config_sizes_out_of_range_are_one_line(field, value, message):
  weights = hub.read(os.path.join(DATA, 'hf_vjepa2'))
  with pytest.raises(ConfigError, match=f'init_from: the V-JEPA 2 config.*{message}') as e:
    vjepa2_layout.vivit_options(weights.config | {field: value}, weights.tensors)
  assert '\n' not in str(e.value)


def test_dinov3_without_registers_loads_as_a_model_without_them(tmp_path):
  """transformers' DINOv3ViTConfig defaults to num_register_tokens=0, which leaves a (1, 0, D) register tensor: a
  model without registers, whose other weights are the folder's (before: refused with "unexpected: reg")."""
  import safetensors.numpy

  folder = tmp_path / 'dinov3_no_registers'
  shutil.copytree(os.path.join(DATA, 'hf_dinov3'), folder)
  tensors = safetensors.numpy.load_file(str(folder / 'model.safetensors'))
  tensors['embeddings.register_tokens'] = tensors['embeddings.register_tokens'][:, :0]
  safetensors.numpy.save_file(tensors, str(folder / 'model.safetensors'))
  config = json.loads((folder / 'config.json').read_text()) | {'num_register_tokens': 0}
  (folder / 'config.json').write_text(json.dumps(config))
  model, _, _, params = folder_model(str(folder))
  assert model.num_prefix == 1 and 'reg' not in params
  np.testing.assert_array_equal(params['cls'], tensors['embeddings.cls_token'])


def test_a_vjepa2_backbone_under_the_class_token_pool_names_the_pools_that_fit():
  """A VJEPA2Model folder has no class token: the ViViT's default pool ('tok', also what model.pool=None gives) is
  one line naming 'gap' and 'attentive' (before: "missing: cls"); 'gap' loads."""
  for pool in (None, 'tok'):
    with pytest.raises(ConfigError, match="no class token for model.pool='tok' to read: set --config.model.pool='gap'"):
      video_model('hf_vjepa2', pool=pool)
  model, _, _, _ = video_model('hf_vjepa2', pool='gap')
  assert model.pool == 'gap'
