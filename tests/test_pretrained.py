"""timm hub folders (config.json + model.safetensors) into our ViT: each row's logits and features equal timm's own
on the same inputs (reference folders written by tests/data/pretrained/make_references.py with timm 1.0.31; torch
is never imported here), what fine-tuning adapts, and every refusal as one line."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx

from vit_jax_lab import checkpoints, hub, tasks, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import release, timm_layout, vit

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
}


def folder_model(row, num_classes=None, input_shape=None, **overrides):
  """Our ViT of the folder's shape (its class count and input size unless given) with the folder's weights, and
  the load notes."""
  weights = hub.read(os.path.join(DATA, row))
  options = timm_layout.vit_options(weights.config, weights.tensors)
  classes, shape = options.pop('num_classes'), options.pop('input_shape')
  model = vit.ViT(num_classes or classes or 7, input_shape or shape, rngs=nnx.Rngs(0), **(options | overrides))
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
  model, notes, _, _ = folder_model(row)
  features = max_difference(model.features(ref['images']), ref['features'])
  has_head = ref['logits'].shape != ref['features'].shape or 'head.weight' in hub.read(os.path.join(DATA, row)).tensors
  logits = max_difference(model(ref['images']), ref['logits']) if has_head else None
  print(f'{row}: max |ours - timm| features {features:.2e}, logits {logits if logits is None else f"{logits:.2e}"}')
  assert features < 1e-5
  assert logits is None or logits < 1e-5
  assert notes[0].startswith('timm ') and str(ref['name']).split('.')[0] in notes[0]
  assert any('the source has none' in n for n in notes) == (not has_head)


@pytest.mark.parametrize('row', ['vit', 'dinov2_reg4'])
def test_another_image_size_resamples_bicubic_as_timm(row):
  """timm's own model at the larger size, loading the same state dict (its checkpoint_filter_fn resamples)."""
  ref = np.load(os.path.join(DATA, row, 'reference.npz'))
  images = ref['resized_images']
  model, notes, _, _ = folder_model(row, input_shape=images.shape[1:])
  assert max_difference(model(images), ref['resized_logits']) < 1e-5
  assert max_difference(model.features(images), ref['resized_features']) < 1e-5
  (note,) = [n for n in notes if n.startswith('position embeddings resampled')]
  assert "'bicubic', timm's own" in note


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
  kwargs |= dict(posemb_prefix=False, layerscale=0.1, scan=True)
  a = vit.ViT(10, (16, 16, 3), rngs=nnx.Rngs(0), **kwargs)
  b = vit.ViT(10, (16, 16, 3), rngs=nnx.Rngs(1), **kwargs)
  pa, pb = (jax.device_get(nnx.state(m, nnx.Param).to_pure_dict()) for m in (a, b))
  assert pa['pos_embedding'].shape == (1, 16, 32) and pa['reg'].shape == (1, 2, 32)
  assert pa['encoder']['blocks']['ls1'].shape == (2, 32)  # Scanned: a leading layer axis.
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
  assert message.count('encoder.layer.') == 5 and "known layouts: timm's VisionTransformer" in message


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


def test_misshaped_and_unexpected_tensors_are_named(tmp_path):
  folder = copy_row(tmp_path)
  path = os.path.join(folder, 'model.safetensors')
  tensors = safetensors.numpy.load_file(path)
  tensors['blocks.1.mlp.fc2.bias'] = np.zeros(31, np.float32)
  tensors['norm_pre.weight'] = np.ones(32, np.float32)  # CLIP's LayerNorm before the encoder: not a ViT key.
  safetensors.numpy.save_file(tensors, path)
  with pytest.raises(ConfigError) as e:
    folder_model_from(folder)
  message = one_line(e)
  assert 'unexpected: norm_pre.weight' in message
  assert 'mis-shaped: Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias (from blocks.1.mlp.fc2) (31,)' in message


def folder_model_from(folder, **overrides):
  weights = hub.read(folder)
  options = timm_layout.vit_options(weights.config, weights.tensors) | overrides
  classes, shape = options.pop('num_classes'), options.pop('input_shape')
  model = vit.ViT(classes or 7, shape, rngs=nnx.Rngs(0), **options)
  return model.load_pretrained(weights, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))


@pytest.mark.parametrize(
  'row,key,value,message',
  [
    ('vit', 'depth', 3, 'is a model with model.depth=2, this model has model.depth=3: set --config.model.depth=2'),
    ('dinov2_reg4', 'reg_tokens', 0, 'model.reg_tokens=4, this model has model.reg_tokens=0'),
    ('dinov2', 'layerscale', None, 'model.layerscale=1e-05, this model has model.layerscale=None'),
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


@pytest.mark.parametrize('row,shape', [('vit', '32,32,3,10'), ('dinov2_reg4', '42,42,3,10')])
def test_init_from_a_timm_folder_in_a_run_takes_the_folders_shape(smoke_config, row, shape, capsys):
  """train.setup / init_state, as `python -m main --config.init_from=DIR` runs them: sizes the config leaves unset
  and keys at their defaults come from the folder (noted), and the run starts from timm's weights."""
  config = smoke_config(init_from=os.path.join(DATA, row))
  config.model.update(dict.fromkeys(SIZES), dropout=0.0, drop_path=0.0)
  info, _ = tasks.build(config.task).synthetic_batch(shape, config.data.batch_size)
  s = train.setup(config, data=(None, info))
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


def test_a_release_without_a_head_keeps_the_models_head():
  """A release .npz without a head (a backbone) now keeps the model's head, with a note."""
  model = vit.ViT(10, (16, 16, 3), variant='mu/4', rngs=nnx.Rngs(0))
  params = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  flat = {k: v for k, v in release.to_release(params, model.num_heads).items() if not k.startswith('head/')}
  _, notes = model.load_pretrained(flat, params)
  assert any(n.startswith('head (64, 10) initialised: the source has none') for n in notes)
