"""The commands on hub folders: `tools.predict --pretrained DIR` gives the library's own eval-pipeline
probabilities (tests/data/pretrained/predict/, made by make_references.py with timm 1.0.31 and transformers 5.24),
and `tools.export --format safetensors --layout timm|transformers` writes a folder that loads back exactly and gives
the library our logits (a ViT; a ViViT as transformers' ViViT or VideoMAE)."""

import io
import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
from flax import nnx
from PIL import Image

from conftest import load_config
from vit_jax_lab import checkpoints, hub, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import timm_layout, transformers_layout, vit, vivit
from vit_jax_lab.tools import export, predict, pretrained

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'pretrained')
IMAGE = os.path.join(DATA, 'predict', 'image.png')  # 32x32: the folders' input size.


def max_difference(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _folder(tmp_path, row, crop_pct=1.0):
  """The row's folder with label names; a timm one at its model's size (input_size) and `crop_pct` (1: its eval
  pipeline the identity at 32x32, as image.png's references were made; None: the folder's own)."""
  if row.startswith('hf_'):
    return os.path.join(DATA, row)
  folder = tmp_path / row
  shutil.copytree(os.path.join(DATA, row), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['pretrained_cfg']['input_size'] = [3, *config['model_args']['img_size']]
  if crop_pct is not None:
    config['pretrained_cfg']['crop_pct'] = crop_pct
  config['label_names'] = [f'class {i}' for i in range(config['num_classes'])]
  (folder / 'config.json').write_text(json.dumps(config))
  return str(folder)


# make_references.py's PREDICT rows: image.png's references (timm's at crop_pct 1) and image_large.png's (40 x 48,
# resized and cropped by each folder's own pipeline; timm's at its own crop_pct).
PREDICT_ROWS = (
  'vit',
  'deit_distilled',
  'clip_ft',
  'hf_vit',
  'rope_mixed_ape',
  'rope_sbb',
  'dinov3',
  'eva02_tiny',
  'eva02_base',
  'hf_dinov2_cls',
  'hf_dinov2_reg_cls',
  'hf_siglip_cls',
  'hf_siglip2_cls',
)
IMAGES = {'image.png': '', 'image_large.png': '_large', 'image_wide.png': '_wide'}


@pytest.mark.parametrize('images', [('image.png',), ('image_large.png', 'image_wide.png')])
@pytest.mark.parametrize('row', PREDICT_ROWS)
def test_predict_pretrained_gives_the_librarys_probabilities(row, images, tmp_path, capsys):
  """clip_ft: a CLIP tower fine-tuned into a classifier (tag laion2b_ft_in12k_in1k): its head classifies; the clip
  row's (tag openai) is CLIP's projection (test_predict_pretrained_without_a_head_is_one_line). rope_*: timm's
  RoPE ViTs (the SBB one normalised by mean and std 0.5); dinov3 and eva02_*: rotary (EVA-02's 28 x 28, so that
  image.png is resized too); hf_dinov2_*: the linear probes, through BitImageProcessor (bicubic, to 42 x 42);
  hf_siglip*_cls: SigLIP's classifiers, SigLIP 2's NaFlex reading image_wide.png (24 x 64) at a 2 x 6 patch grid.
  Pillow resizes timm's inputs, torchvision transformers' (tools.pretrained.pil_resize). image.png through a timm
  folder at crop_pct 1, the others at the folder's own."""
  large = images != ('image.png',)
  out = str(tmp_path / 'out.jsonl')
  paths = [os.path.join(DATA, 'predict', image) for image in images]
  assert (
    predict.main(
      ['--pretrained', _folder(tmp_path, row, None if large else 1.0), *paths, '--top_k', '10', '--out', out]
    )
    == 0
  )
  resized = len(images) if large or row.startswith(('eva02', 'hf_dinov2')) else 0  # Models at 28 and 42 pixels.
  err = capsys.readouterr().err
  assert (f'note: {resized} inputs resized' in err) if resized else 'resized' not in err
  names = [f'LABEL_{i}' if row.startswith('hf_') else f'class {i}' for i in range(10)]
  for image, line in zip(images, [json.loads(x) for x in open(out)], strict=True):
    reference = np.load(os.path.join(DATA, 'predict', f'{row}{IMAGES[image]}.npy'))[0]
    ours = np.array([dict(line['top_k'])[name] for name in names])
    print(f'{row} {image}: max |ours - library| probability {np.max(np.abs(ours - reference)):.2e}')
    np.testing.assert_allclose(ours, reference, atol=1e-6, rtol=0)
    assert [label for label, _ in line['top_k']] == [names[i] for i in np.argsort(-reference)]


def test_predict_pretrained_preprocessing_follows_the_folder():
  p = pretrained.preprocessing_of(
    os.path.join(DATA, 'vit'), json.load(open(os.path.join(DATA, 'vit', 'config.json'))), 'timm_vit'
  )
  assert (p.resize, p.crop, p.method, p.mean, p.std) == (35, (32, 32), 'bicubic', (0.5,) * 3, (0.5,) * 3)
  assert p.library == 'pil'
  hf = os.path.join(DATA, 'hf_vit')
  p = pretrained.preprocessing_of(hf, {}, 'transformers_vit')
  assert (p.resize, p.crop, p.method, p.scale, p.library) == ((32, 32), None, 'bilinear', 1 / 255, 'torchvision')
  config = json.load(open(os.path.join(DATA, 'vit', 'config.json')))
  for missing in ({}, {'interpolation': None, 'crop_mode': None}):  # timm's defaults: bicubic, centre crop.
    cfg = {k: v for k, v in config['pretrained_cfg'].items() if k not in ('interpolation', 'crop_mode')} | missing
    p = pretrained.preprocessing_of(os.path.join(DATA, 'vit'), config | {'pretrained_cfg': cfg}, 'timm_vit')
    assert (p.resize, p.crop, p.method) == (35, (32, 32), 'bicubic')
  config['pretrained_cfg']['interpolation'] = 'nearest'  # Pillow's nearest is not reproduced: refused.
  with pytest.raises(ConfigError, match="interpolation='nearest' is not read"):
    pretrained.preprocessing_of(os.path.join(DATA, 'vit'), config, 'timm_vit')


VIDEO_ROWS = ('hf_vivit', 'hf_videomae')  # make_references.py's predict_video_references.


def _video_probabilities(folder, video, tmp_path):
  out = str(tmp_path / f'out{len(list(tmp_path.glob("out*.jsonl")))}.jsonl')  # A new file: predict overwrites none.
  assert (
    predict.main(['--pretrained', folder, os.path.join(DATA, 'predict', video), '--top_k', '10', '--out', out]) == 0
  )
  (line,) = [json.loads(x) for x in open(out)]
  return line['top_k']


@pytest.mark.parametrize('row', VIDEO_ROWS)
def test_predict_pretrained_video_gives_the_librarys_probabilities(row, tmp_path, capsys):
  """A clip of 6 frames at the folder's 16 x 24: num_frames=4 of them sampled evenly (0, 1, 3, 4), each frame's
  preprocessing the identity's size, as transformers' video processor reads them."""
  reference = np.load(os.path.join(DATA, 'predict', f'{row}_clip.npy'))[0]
  top_k = _video_probabilities(os.path.join(DATA, row), 'clip.mov', tmp_path)
  ours = np.array([dict(top_k)[f'LABEL_{i}'] for i in range(10)])
  assert 'resized' not in capsys.readouterr().err
  print(f'{row}: max |ours - library| probability {max_difference(ours, reference):.2e}')
  np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
  assert [label for label, _ in top_k] == [f'LABEL_{i}' for i in np.argsort(-reference)]


@pytest.mark.slow
@pytest.mark.parametrize('row', VIDEO_ROWS)
def test_predict_pretrained_video_resizes_and_crops_as_the_folder_says(row, tmp_path, capsys):
  """A 24 x 40 clip read by a folder whose processor resizes the shorter side to 16 and crops 16 x 24: TensorFlow's
  bilinear resize, not the library's (torchvision's), so the probabilities differ slightly, and a note says so."""
  folder = tmp_path / row
  shutil.copytree(os.path.join(DATA, row), folder)
  processor = json.loads((folder / 'preprocessor_config.json').read_text())
  (folder / 'preprocessor_config.json').write_text(json.dumps(processor | dict(size=dict(shortest_edge=16))))
  reference = np.load(os.path.join(DATA, 'predict', f'{row}_clip_large.npy'))[0]
  ours = np.array(
    [dict(_video_probabilities(str(folder), 'clip_large.mov', tmp_path))[f'LABEL_{i}'] for i in range(10)]
  )
  difference = max_difference(ours, reference)
  assert '1 inputs resized or cut' in capsys.readouterr().err
  print(f'{row} resized 24x40 -> 16x26 -> crop 16x24: max |ours - library| probability {difference:.2e}')
  assert difference < LARGE_CLIP_TOLERANCE


def test_predict_pretrained_vjepa2_gives_the_librarys_probabilities(tmp_path, capsys):
  """V-JEPA 2's classifier on a 24 x 40 clip, its processor's shorter side at 24 (the identity) and its central
  24 x 24 crop, 4 of 6 frames sampled evenly: transformers' probabilities (make_references.py predict_vjepa2)."""
  folder = tmp_path / 'hf_vjepa2_cls'
  shutil.copytree(os.path.join(DATA, 'hf_vjepa2_cls'), folder)
  processor = json.loads((folder / 'video_preprocessor_config.json').read_text())
  (folder / 'video_preprocessor_config.json').write_text(json.dumps(processor | dict(size=dict(shortest_edge=24))))
  reference = np.load(os.path.join(DATA, 'predict', 'hf_vjepa2_cls_clip_large.npy'))[0]
  top_k = _video_probabilities(str(folder), 'clip_large.mov', tmp_path)
  ours = np.array([dict(top_k)[f'LABEL_{i}'] for i in range(10)])
  assert '1 inputs resized or cut' in capsys.readouterr().err  # The crop cut 16 columns.
  print(f'hf_vjepa2_cls: max |ours - library| probability {max_difference(ours, reference):.2e}')
  np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)


LARGE_CLIP_TOLERANCE = 1e-3  # Measured 1.7e-4 (ViViT) and 1.5e-4 (VideoMAE) with TF 2 and torchvision 0.29.


def test_predict_pretrained_video_samples_and_preprocesses_as_the_library():
  np.testing.assert_array_equal(pretrained.sampled_frames(6, 4), [0, 1, 3, 4])  # The library's on the reference clip.
  np.testing.assert_array_equal(pretrained.sampled_frames(4, 4), [0, 1, 2, 3])
  np.testing.assert_array_equal(pretrained.sampled_frames(33, 16), [2 * i for i in range(16)])  # i * 33 // 16.
  vivit_p = pretrained.preprocessing_of(os.path.join(DATA, 'hf_vivit'), {}, 'transformers_vit')
  videomae_p = pretrained.preprocessing_of(os.path.join(DATA, 'hf_videomae'), {}, 'transformers_vit')
  assert (vivit_p.scale, vivit_p.offset, vivit_p.mean) == (1 / 127.5, 1.0, (0.5,) * 3)  # VivitImageProcessor's offset.
  assert (videomae_p.scale, videomae_p.offset, videomae_p.crop) == (1 / 255, 0.0, (16, 24))


def test_predict_pretrained_video_mistakes_are_one_line(tmp_path, capsys):
  clip = os.path.join(DATA, 'predict', 'clip.mov')
  frames = tmp_path / 'short'  # A clip of 3 frames: fewer than num_frames=4.
  frames.mkdir()
  for i in range(3):
    tf.io.write_file(str(frames / f'{i}.png'), tf.io.encode_png(np.full((16, 24, 3), 9 * i, np.uint8)))
  for folder, given, message, code in [
    ('hf_vit', clip, 'is a video, and this model reads images: give image files (JPEG, PNG', 2),
    ('hf_vivit', IMAGE, 'is an image, and this model classifies videos', 2),
    ('hf_videomae', str(frames), 'the clip has 3 frames, and the model reads num_frames=4 sampled evenly', 2),
  ]:
    assert predict.main(['--pretrained', os.path.join(DATA, folder), given]) == code
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith('error')]
    assert len(err) == 1 and message in err[0], (folder, err)


def test_predict_pretrained_checks_the_inputs_before_reading_the_weights(tmp_path, capsys):
  """A missing input is the one error line, before the folder's weights are read (no load notes before it)."""
  missing = str(tmp_path / 'cat.jpg')
  for row in ('hf_siglip2_cls', 'hf_vivit'):
    assert predict.main(['--pretrained', os.path.join(DATA, row), missing]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f'error: {missing}: no such file or folder']


@pytest.mark.parametrize(
  'row,message',
  [
    ('mae', 'has no classification head (a backbone)'),
    ('clip', 'embedding projection'),
    ('pe_core', 'embedding projection'),
    ('hf_dinov3', 'has no classification head (a backbone)'),
    ('hf_siglip2', 'has no classification head (a backbone)'),
  ],
)
def test_predict_pretrained_without_a_head_is_one_line(row, message, capsys):
  assert predict.main(['--pretrained', os.path.join(DATA, row), IMAGE]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err


@pytest.mark.parametrize('says', ['label_names', 'num_classes'])
def test_a_clip_tower_fine_tuned_with_a_classifier_predicts(says, tmp_path, capsys):
  """A Perception Encoder folder whose head was replaced to classify (its num_classes other than its
  pretrained_cfg's projection width) or that names its labels is a classifier, not refused as a projection."""
  folder = tmp_path / 'pe_core'
  shutil.copytree(os.path.join(DATA, 'pe_core'), folder)
  config = json.loads((folder / 'config.json').read_text())
  if says == 'label_names':
    config['label_names'] = [f'kind {i}' for i in range(config['num_classes'])]
  else:
    config['pretrained_cfg']['num_classes'] = 1024  # The released tower's projection width.
  (folder / 'config.json').write_text(json.dumps(config))
  out = str(tmp_path / 'out.jsonl')
  assert predict.main(['--pretrained', str(folder), IMAGE, '--out', out]) == 0
  (line,) = [json.loads(x) for x in open(out)]
  assert len(line['top_k']) == 5 and (says != 'label_names' or line['top_k'][0][0].startswith('kind '))


# Exported models: ViT constructor keys beyond the sizes (width 32, 2 blocks, 4 heads, MLP 64, patches of 8).
EXPORTED = {
  'tok': dict(),
  'map_layerscale_registers_tanh': dict(
    pool='map', layerscale=0.1, reg_tokens=2, gelu_approximate=True, posemb_prefix=False
  ),
  'distilled_quickgelu': dict(distilled=True, activation='quick_gelu'),
  'swiglu_layerscale': dict(mlp='swiglu', layerscale=0.1),
  'mlp_norm': dict(mlp_norm=True),  # timm's scale_mlp_norm.
  # Rotary ViTs, written as timm's Eva class (vit_base_patch16_rope_224; vit_base_patch16_dinov3 for epsilon 1e-5).
  # Their architectures have LayerScale, as every rotary timm ViT (one without: test_export_timm_eva_without_...).
  'rope_axial': dict(rope='axial', posemb='none', layerscale=0.1),
  'rope_mixed_gap': dict(
    rope='mixed', rope_axes='ij', pool='gap', fc_norm=True, reg_tokens=1, posemb_prefix=False, layerscale=0.2
  ),
  'rope_ref_grid': dict(
    rope='axial', rope_temperature=1e4, rope_axes='ij', rope_ref_grid=16, posemb='none', pool='map', layerscale=0.3
  ),
  'rope_map_prefix': dict(  # Perception Encoder's pool: over every token, heads and MLP of its own; RoPE offset.
    rope='axial',
    rope_offset=1.0,
    pool='map',
    class_token=True,
    map_prefix=True,
    map_heads=2,
    map_mlp_dim=48,
    layerscale=0.1,
  ),
  'rope_dinov3': dict(
    rope='dinov3',
    rope_axes='ij',
    posemb='none',
    pool='gap',
    class_token=True,
    reg_tokens=2,
    layernorm_epsilon=1e-5,
    layerscale=0.1,
  ),
  # EVA-02 (written as Eva: SwiGLU with the hidden LayerNorm as fc1_g / fc1_x / norm, or packed without it) and
  # Perception Encoder (norm_pre: timm's patch embedding has no bias beside it; the row's is zero).
  'eva02_swiglu_norm': dict(rope='axial', posemb='none', mlp='swiglu', mlp_norm=True, rope_ref_grid=16, layerscale=0.1),
  'eva02_packed': dict(rope='axial', mlp='swiglu', rope_temperature=1e4, layerscale=0.2),
  'pe_norm_pre': dict(
    rope='axial',
    rope_offset=1.0,
    norm_pre=True,
    pool='map',
    class_token=True,
    map_prefix=True,
    map_heads=2,
    map_mlp_dim=48,
    layernorm_epsilon=1e-5,
    layerscale=0.3,
  ),
}


# Exported to transformers' ViTForImageClassification (a class token, learned positions; its LayerNorm epsilon and
# GELU are config keys there).
EXPORTED_TRANSFORMERS = {
  'hf_tok': dict(),
  'hf_tanh_eps12': dict(gelu_approximate=True, layernorm_epsilon=1e-12),
}


def _with_params(model: nnx.Module, params: dict) -> None:
  """`params` (a pure dict) set in `model`."""
  state = nnx.state(model, nnx.Param)
  state.replace_by_pure_dict(params)
  nnx.update(model, state)


def _numpy_params(model: nnx.Module) -> dict:
  """Every parameter of `model` drawn by NumPy (seed 0), the same on every JAX version: set in the model, and
  returned."""
  rs = np.random.RandomState(0)
  initial = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  params = jax.tree.map(lambda x: (0.3 * rs.randn(*x.shape)).astype(np.float32), initial)
  _with_params(model, params)
  return params


def _random_vit(name):
  """A ViT whose every parameter is drawn by NumPy (seed 0): the same on every JAX version."""
  keys = EXPORTED[name] if name in EXPORTED else EXPORTED_TRANSFORMERS[name]
  model = vit.ViT(10, (32, 32, 3), width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8, rngs=nnx.Rngs(0), **keys)
  params = _numpy_params(model)
  if keys.get('norm_pre'):  # timm's patch embedding has none beside norm_pre (a non-zero one: a test of its own).
    params['embedding']['bias'] = np.zeros_like(params['embedding']['bias'])
    _with_params(model, params)
  return model, params


@pytest.mark.parametrize('name', EXPORTED)
def test_export_timm_round_trip_is_exact_and_gives_timms_logits(name, tmp_path):
  """ours -> model.safetensors -> ours: the same parameters, bit for bit; and timm 1.0.31 loading the folder
  (timm.create_model(architecture, pretrained=True, pretrained_cfg_overlay=dict(file=...), **model_args), by hand
  in a torch environment: export/timm_logits_NAME.npy) gives our logits."""
  model, params = _random_vit(name)
  folder = str(tmp_path / name)
  data = ml_collections.ConfigDict(dict(value_range=(-1.0, 1.0), resize_size=40))
  config = export.write_folder(folder, *timm_layout.folder(model, params, data))
  assert config['pretrained_cfg']['crop_pct'] == 0.8 and config['pretrained_cfg']['mean'] == [0.5] * 3
  weights = hub.read(folder)
  assert weights.layout == 'timm_vit' and set(weights.tensors) >= {'patch_embed.proj.weight', 'head.weight'}
  options = vit.folder_options(weights)
  assert {k: options[k] for k in model.structure} == model.structure
  fresh = vit.ViT(
    10, (32, 32, 3), rngs=nnx.Rngs(1), **{k: v for k, v in options.items() if k not in ('num_classes', 'input_shape')}
  )
  loaded, _ = fresh.load_pretrained(weights, jax.device_get(nnx.state(fresh, nnx.Param).to_pure_dict()))
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  images = np.load(os.path.join(DATA, 'export', 'images.npy'))
  difference = max_difference(model(images), np.load(os.path.join(DATA, 'export', f'timm_logits_{name}.npy')))
  print(f'{name}: max |ours - timm| logits {difference:.2e}')
  assert difference < 1e-5


def test_export_timm_eva_without_layerscale_writes_unit_gammas(tmp_path):
  """timm's rotary architectures all set init_values (and timm drops a None argument): a rotary ViT without
  LayerScale is written with gammas of ones, the same function; a key Eva does not compute is one line."""
  kwargs = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8, rope='axial', posemb='none')
  model = vit.ViT(10, (32, 32, 3), rngs=nnx.Rngs(0), **kwargs)
  _numpy_params(model)
  data = ml_collections.ConfigDict(dict(value_range=(-1.0, 1.0), resize_size=None))
  params = jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
  config = export.write_folder(str(tmp_path / 'a'), *timm_layout.folder(model, params, data))
  assert config['model_args']['init_values'] == 1.0
  weights = hub.read(str(tmp_path / 'a'))
  np.testing.assert_array_equal(weights.tensors['blocks.1.gamma_2'], np.ones(32, np.float32))
  options = vit.folder_options(weights)
  assert options['layerscale'] == 1.0 and options['rope'] == 'axial'
  fresh = vit.ViT(10, (32, 32, 3), rngs=nnx.Rngs(1), **(kwargs | {'layerscale': 1.0}))
  loaded, _ = fresh.load_pretrained(weights, jax.device_get(nnx.state(fresh, nnx.Param).to_pure_dict()))
  _with_params(fresh, loaded)
  images = np.load(os.path.join(DATA, 'export', 'images.npy'))
  assert max_difference(fresh(images), model(images)) < 1e-6
  for extra, message in [
    (dict(activation='quick_gelu'), "model.activation='gelu'; this model has model.activation='quick_gelu'"),
    (dict(layernorm_epsilon=1e-12), 'LayerNorm epsilon 1e-6 or 1e-5; this model has 1e-12'),
    (dict(pool='tok_gap'), "pool 'tok', 'gap' or 'map': this model has"),
  ]:
    other = vit.ViT(10, (32, 32, 3), rngs=nnx.Rngs(0), **(kwargs | extra))
    with pytest.raises(ConfigError, match=message):
      timm_layout.folder_config(other, data)


def test_export_timm_folds_a_patch_bias_beside_norm_pre_into_the_positions(tmp_path):
  """timm's patch embedding has no bias beside norm_pre (CLIP, Perception Encoder): ours goes into the patches' rows
  of the position table, the same function; without a table it is one line."""
  model, params = _random_vit('pe_norm_pre')
  params['embedding']['bias'] = np.random.RandomState(1).randn(32).astype(np.float32)
  _with_params(model, params)
  data = ml_collections.ConfigDict(dict(value_range=(-1.0, 1.0), resize_size=None))
  export.write_folder(str(tmp_path / 'a'), *timm_layout.folder(model, params, data))
  weights = hub.read(str(tmp_path / 'a'))
  assert 'patch_embed.proj.bias' not in weights.tensors
  np.testing.assert_allclose(
    weights.tensors['pos_embed'][0, 1:] - params['pos_embedding'][0, 1:],
    params['embedding']['bias'][None].repeat(16, 0),
    atol=1e-6,
  )
  np.testing.assert_array_equal(weights.tensors['pos_embed'][0, 0], params['pos_embedding'][0, 0])
  options = vit.folder_options(weights)
  fresh = vit.ViT(
    10, (32, 32, 3), rngs=nnx.Rngs(1), **{k: v for k, v in options.items() if k not in ('num_classes', 'input_shape')}
  )
  loaded, _ = fresh.load_pretrained(weights, jax.device_get(nnx.state(fresh, nnx.Param).to_pure_dict()))
  _with_params(fresh, loaded)
  images = np.load(os.path.join(DATA, 'export', 'images.npy'))
  assert max_difference(fresh(images), model(images)) < 1e-5
  bare = vit.ViT(
    10,
    (32, 32, 3),
    width=32,
    depth=2,
    mlp_dim=64,
    num_heads=4,
    patch_size=8,
    rngs=nnx.Rngs(0),
    **(EXPORTED['pe_norm_pre'] | dict(posemb='none')),
  )
  bare_params = _numpy_params(bare)
  with pytest.raises(ConfigError, match='beside norm_pre has no bias, and this model'):
    timm_layout.folder(bare, bare_params, data)


@pytest.mark.parametrize('name', EXPORTED_TRANSFORMERS)
def test_export_transformers_round_trip_is_exact_and_gives_the_librarys_logits(name, tmp_path):
  """ours -> a transformers folder -> ours: the same parameters, bit for bit; and transformers 5.24's
  `ViTForImageClassification.from_pretrained(folder)` (by hand in a torch environment:
  export/transformers_logits_NAME.npy) gives our logits."""
  model, params = _random_vit(name)
  folder = str(tmp_path / name)
  labels = [f'class {i}' for i in range(10)]
  data = ml_collections.ConfigDict(dict(value_range=(-1.0, 1.0), resize_size=None))
  config = export.write_folder(folder, *transformers_layout.folder(model, params, data, labels))
  assert config['id2label']['3'] == 'class 3' and config['architectures'] == ['ViTForImageClassification']
  weights = hub.read(folder)
  assert weights.layout == 'transformers_vit' and 'vit.embeddings.cls_token' in weights.tensors
  options = vit.folder_options(weights)
  assert {k: options[k] for k in model.structure} == model.structure
  fresh = vit.ViT(
    10, (32, 32, 3), rngs=nnx.Rngs(1), **{k: v for k, v in options.items() if k not in ('num_classes', 'input_shape')}
  )
  assert fresh.options == model.options
  loaded, _ = fresh.load_pretrained(weights, jax.device_get(nnx.state(fresh, nnx.Param).to_pure_dict()))
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  p = pretrained.preprocessing_of(
    folder, json.load(open(os.path.join(folder, 'preprocessor_config.json'))), weights.layout
  )
  assert (p.resize, p.crop, p.scale, p.mean, p.std) == ((32, 32), None, 1 / 255, (0.5,) * 3, (0.5,) * 3)
  images = np.load(os.path.join(DATA, 'export', 'images.npy'))
  reference = np.load(os.path.join(DATA, 'export', f'transformers_logits_{name}.npy'))
  difference = max_difference(model(images), reference)
  print(f'{name}: max |ours - transformers| logits {difference:.2e}')
  assert difference < 1e-5


def test_export_transformers_refuses_what_its_vit_cannot_compute():
  data = ml_collections.ConfigDict(dict(value_range=(0.0, 1.0), resize_size=None))
  for keys, message in [
    (dict(pool='gap'), "model.pool='gap'; transformers' ViT computes with model.pool='tok'"),
    (dict(reg_tokens=2), 'model.reg_tokens=2'),
    (dict(activation='quick_gelu', gelu_approximate=True), "model.activation='quick_gelu' with tanh GELU"),
    (dict(rope='axial'), "model.rope='axial'; transformers' ViT computes with model.rope=None"),  # Its table kept.
  ]:
    other = vit.ViT(10, (32, 32, 3), width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8, rngs=nnx.Rngs(0), **keys)
    with pytest.raises(ConfigError, match=message.replace('(', r'\(').replace(')', r'\)')):
      transformers_layout.folder_config(other, data)


# Exported ViViTs (model 1, clips of 4 frames of 16 x 24, tubelets 2 x 8 x 8: a 2 x 2 x 3 token grid, as the reading
# references), as transformers' VivitForVideoClassification and, with VideoMAE's options,
# VideoMAEForVideoClassification.
EXPORTED_VIDEO = {
  'hf_vivit_tanh': dict(pool='tok', posemb='learn', gelu_approximate=True),
  'hf_videomae_eps12': dict(pool='gap', posemb='sincos_flat', fc_norm=1e-5, layernorm_epsilon=1e-12),
}
VIDEO_SHAPE = (4, 16, 24, 3)


def _random_vivit(name, **keys):
  """A ViViT model 1 whose every parameter is drawn by NumPy (seed 0)."""
  model = vivit.ViViT(
    10,
    VIDEO_SHAPE,
    patch_size=8,
    tubelet_time=2,
    width=32,
    depth=2,
    mlp_dim=64,
    num_heads=4,
    rngs=nnx.Rngs(0),
    **(EXPORTED_VIDEO[name] if name else {}) | keys,
  )
  return model, _numpy_params(model)


def _videos():
  """export/videos.npy: 2 random uint8 clips of VIDEO_SHAPE, in the value range (-1, 1) as the folders' processor
  maps them."""
  return np.load(os.path.join(DATA, 'export', 'videos.npy')).astype(np.float32) / 127.5 - 1


@pytest.mark.parametrize('name', EXPORTED_VIDEO)
def test_export_transformers_video_round_trip_is_exact_and_gives_the_librarys_logits(name, tmp_path):
  """A ViViT -> a transformers folder -> a ViViT: the same parameters, bit for bit (VideoMAE's attention has no key
  bias: ours comes back zero, the same function); and transformers 5.24's `VivitForVideoClassification` /
  `VideoMAEForVideoClassification.from_pretrained(folder)` (by hand in a torch environment:
  export/transformers_logits_NAME.npy) gives our logits."""
  model, params = _random_vivit(name)
  folder = str(tmp_path / name)
  labels = [f'class {i}' for i in range(10)]
  data = ml_collections.ConfigDict(dict(value_range=(-1.0, 1.0), resize_size=None, image_size=None))
  config = export.write_folder(folder, *transformers_layout.folder(model, params, data, labels))
  videomae = name.startswith('hf_videomae')
  architecture = 'VideoMAEForVideoClassification' if videomae else 'VivitForVideoClassification'
  assert config['architectures'] == [architecture] and config['id2label']['3'] == 'class 3'
  assert (config['num_frames'], config['image_size']) == (4, [16, 24])
  assert config['hidden_act'] == ('gelu' if videomae else 'gelu_fast')
  weights = hub.read(folder)
  assert weights.layout == 'transformers_vit'
  options = transformers_layout.vivit_options(weights.config, weights.tensors)
  assert (options.pop('num_classes'), options.pop('input_shape')) == (10, VIDEO_SHAPE)
  fresh = vivit.ViViT(10, VIDEO_SHAPE, rngs=nnx.Rngs(1), **options)
  assert (fresh.structure, fresh.options) == (model.structure, model.options)
  loaded, notes = fresh.load_pretrained(weights, jax.device_get(nnx.state(fresh, nnx.Param).to_pure_dict()))
  assert notes == [f'transformers {architecture} read from its safetensors']
  expected = jax.tree.map(np.copy, params)
  if videomae:  # No key bias there: the middle third of our fused query, key, value bias comes back zero.
    for block in expected['encoder']['blocks'].values():
      assert np.abs(block['attn']['qkv']['bias'][32:64]).max() > 0.1
      block['attn']['qkv']['bias'][32:64] = 0
  jax.tree.map(np.testing.assert_array_equal, loaded, expected)
  assert videomae == ('videomae.encoder.layer.0.attention.attention.q_bias' in weights.tensors)
  with open(os.path.join(folder, 'preprocessor_config.json')) as f:
    processor = json.load(f)
  assert (processor['size'], processor['do_center_crop'], processor['rescale_factor']) == (
    dict(height=16, width=24),
    False,
    1 / 255,
  )
  assert (processor['image_mean'], processor['image_std']) == ([0.5] * 3, [0.5] * 3)
  videos = _videos()
  reference = np.load(os.path.join(DATA, 'export', f'transformers_logits_{name}.npy'))
  difference = max_difference(model(videos), reference)
  _with_params(fresh, loaded)
  print(
    f'{name}: max |ours - transformers| logits {difference:.2e}, of the reloaded model '
    f'{max_difference(fresh(videos), reference):.2e} (logits up to {np.abs(reference).max():.2f})'
  )
  assert difference < 1e-5 and max_difference(fresh(videos), reference) < 1e-5
  assert np.abs(reference).max() > 0.1


def test_export_transformers_video_preprocessing_is_the_runs_evaluation():
  """A run that resizes the shorter side and crops the centre: the image processor does the same."""
  model, _ = _random_vivit('hf_vivit_tanh')
  data = ml_collections.ConfigDict(dict(value_range=(0.0, 1.0), resize_size=20, image_size=16))
  _, processor = transformers_layout.video_folder_config(model, data)
  assert processor['image_processor_type'] == 'VivitImageProcessor' and processor['offset'] is False
  assert (processor['size'], processor['do_center_crop'], processor['crop_size']) == (
    dict(shortest_edge=20),
    True,
    dict(height=16, width=24),
  )
  assert (processor['image_mean'], processor['image_std']) == ([0.0] * 3, [1.0] * 3)


def test_export_transformers_refuses_what_its_vivit_and_videomae_cannot_compute():
  data = ml_collections.ConfigDict(dict(value_range=(0.0, 1.0), resize_size=None, image_size=None))
  for keys, message in [
    (
      dict(model='factorised_encoder'),
      "model.model='factorised_encoder'; transformers' ViViT and VideoMAE compute with model.model='spatiotemporal'",
    ),
    (dict(model='factorised_self_attention'), "model.model='factorised_self_attention'"),
    (dict(embedding='frames'), "model.embedding='frames'"),
    (dict(pool='gap'), "model.pool='gap' with model.posemb='learn' and model.fc_norm=None; transformers' ViViT"),
    (dict(pool='tok', posemb='sincos'), "model.pool='tok' with model.posemb='sincos'"),
    (dict(pool='gap', posemb='sincos_flat'), "model.posemb='sincos_flat' and model.fc_norm=None"),
    (dict(pool='gap', posemb='sincos_flat', fc_norm=0.5), "model.fc_norm=0.5; VideoMAE's fc_norm computes with"),
    (dict(attention='local'), "model.attention='local', model.prenorm=True"),
    (dict(prenorm=False), 'model.prenorm=False'),
  ]:
    other, _ = _random_vivit(None, **keys)
    with pytest.raises(ConfigError, match=message.replace('(', r'\(').replace(')', r'\)')) as error:
      transformers_layout.video_folder_config(other, data)
    assert '\n' not in str(error.value)


@pytest.mark.slow
def test_export_command_writes_a_run_as_a_timm_and_a_transformers_folder(data_dir, tmp_path):
  """`tools.export --format safetensors --layout timm --workdir RUN`: the run's evaluation parameters, and its
  preprocessing (digits: kept at the dataset's 8x8, value range (-1, 1)) in pretrained_cfg; `--layout transformers`
  likewise, and `predict --pretrained` on either folder gives the run's own predictions."""
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'timm')
  config = load_config('configs/vit/digits.py:smoke', data_dir, total_steps=2, eval_every=2, checkpoint_every=2)
  train.train_and_evaluate(config, workdir)
  assert export.main(['--format', 'safetensors', '--layout', 'timm', '--workdir', workdir, '--out', out]) == 0
  written = json.load(open(os.path.join(out, 'config.json')))
  cfg = written['pretrained_cfg']
  assert (cfg['input_size'][1:], cfg['crop_pct'], cfg['crop_mode'], cfg['mean']) == ([8, 8], 1.0, 'squash', [0.5])
  weights = hub.read(out)
  options = vit.folder_options(weights)
  model = vit.ViT(rngs=nnx.Rngs(1), **options)
  loaded, _ = model.load_pretrained(weights, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))
  jax.tree.map(np.testing.assert_array_equal, loaded, checkpoints.read_params(workdir))
  assert export.main(['--format', 'safetensors', '--layout', 'timm', '--workdir', workdir, '--out', out]) == 2

  # predict --pretrained on the folder: the run's own predictions, with its class names (an 8x8 digit: the
  # identity in both pipelines).
  image = str(tmp_path / 'digit.png')
  tf.io.write_file(image, tf.io.encode_png(np.random.RandomState(0).randint(0, 256, (8, 8, 1), np.uint8)))
  assert written['label_names'] == [str(i) for i in range(10)]
  hf = str(tmp_path / 'transformers')
  assert export.main(['--format', 'safetensors', '--layout', 'transformers', '--workdir', workdir, '--out', hf]) == 0
  predicted = {}
  for name, flag, source in (('run', '--workdir', workdir), ('timm', '--pretrained', out), ('hf', '--pretrained', hf)):
    path = str(tmp_path / f'{name}.jsonl')
    assert predict.main([flag, source, image, '--top_k', '10', '--out', path]) == 0
    predicted[name] = dict(json.loads(open(path).read())['top_k'])
  for folder in ('timm', 'hf'):
    assert predicted['run'].keys() == predicted[folder].keys()
    for label, p in predicted['run'].items():
      assert abs(p - predicted[folder][label]) < 1e-5, (folder, label, p, predicted[folder][label])


@pytest.mark.slow
def test_export_command_writes_a_vivit_run_as_a_transformers_folder(moving_digits_dir, tmp_path, capsys):
  """`tools.export --format safetensors --layout transformers --workdir RUN` of a ViViT model 1 run: the run's
  parameters come back bit for bit from the folder, its shape and clip from config.json; --layout timm, which writes
  ViT runs, is one line."""
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'hf')
  config = load_config(
    'configs/vivit/moving_digits.py:spatiotemporal,smoke',
    moving_digits_dir,
    total_steps=2,
    eval_every=2,
    checkpoint_every=2,
  )
  config.model.pool = 'tok'
  train.train_and_evaluate(config, workdir)
  assert export.main(['--format', 'safetensors', '--layout', 'transformers', '--workdir', workdir, '--out', out]) == 0
  assert 'wrote a transformers folder (VivitForVideoClassification)' in capsys.readouterr().out
  written = json.load(open(os.path.join(out, 'config.json')))
  assert (written['num_frames'], written['tubelet_size'], written['hidden_size']) == (4, [2, 4, 4], 32)
  weights = hub.read(out)
  options = transformers_layout.vivit_options(weights.config, weights.tensors)
  model = vivit.ViViT(rngs=nnx.Rngs(1), **options)
  loaded, _ = model.load_pretrained(weights, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict()))
  jax.tree.map(np.testing.assert_array_equal, loaded, checkpoints.read_params(workdir))
  assert (
    export.main(['--format', 'safetensors', '--layout', 'timm', '--workdir', workdir, '--out', str(tmp_path / 't')])
    == 2
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "holds a 'vivit' model: --layout timm writes vit runs" in err[0], err


def test_export_safetensors_mistakes_are_one_line(tmp_path, capsys):
  for argv, message in [
    (['--format', 'safetensors', '--workdir', str(tmp_path), '--out', str(tmp_path / 'x')], 'give --layout timm'),
  ]:
    assert export.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
  model, params = _random_vit('tok')
  other = vit.ViT(
    10, (32, 32, 3), width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8, pool='gap', rngs=nnx.Rngs(0)
  )
  with pytest.raises(ConfigError, match="model.pool='gap'; timm's ViT pools 'tok' or 'map'"):
    timm_layout.folder_config(other, ml_collections.ConfigDict(dict(value_range=(0.0, 1.0), resize_size=None)))


if __name__ == '__main__':  # The folders make_references.py's `export DIR` mode loads with timm or transformers.
  import sys

  for name in [*EXPORTED, *EXPORTED_TRANSFORMERS, *EXPORTED_VIDEO]:
    layout = timm_layout if name in EXPORTED else transformers_layout
    model, params = _random_vivit(name) if name in EXPORTED_VIDEO else _random_vit(name)
    data = ml_collections.ConfigDict(dict(value_range=(-1.0, 1.0), resize_size=None, image_size=None))
    export.write_folder(f'{sys.argv[1]}/{name}', *layout.folder(model, params, data))


def test_predict_pretrained_decodes_jpegs_as_pil_does():
  """The libraries' pipelines decode with PIL: --pretrained's JPEG pixels are PIL's (TF's default IDCT: 4 levels)."""
  rng = np.random.default_rng(0)
  x = np.cumsum(np.cumsum(rng.normal(size=(60, 80, 3)), 0), 1)
  x = ((x - x.min()) / (x.max() - x.min()) * 255).astype(np.uint8)
  for subsampling in (0, 2):
    data = io.BytesIO()
    Image.fromarray(x).save(data, 'JPEG', quality=85, subsampling=subsampling)
    ours = pretrained.library_decode(tf.constant(data.getvalue()), 3).numpy()
    np.testing.assert_array_equal(ours, np.asarray(Image.open(io.BytesIO(data.getvalue())).convert('RGB')))


def test_predict_pretrained_resizes_as_pillow_and_torchvision_do():
  """timm's pipeline resizes with Pillow, transformers' image processors with torchvision's uint8 resize: the same
  pixels, every filter, up and down on each axis, both of Pillow's pass orders (make_references.py resize)."""
  cases = np.load(os.path.join(DATA, 'predict', 'resize.npz'))
  assert (str(cases['pillow']), str(cases['torchvision'])) == ('13.0.0', '0.28.0+cu130')
  outputs = [k for k in cases.files if k.count('_') == 2]
  assert len(outputs) == 6 * 7
  for key in outputs:
    case, library, method = key.split('_')
    expected = cases[key]
    ours = pretrained.pil_resize(cases[f'{case}_image'], expected.shape[:2], method, library)
    np.testing.assert_array_equal(ours, expected, err_msg=key)
  # TensorFlow's antialiased resize (what predict used before) is not Pillow's: 1 level or more in most pixels.
  x, expected = cases['3_image'], cases['3_pil_bicubic']
  theirs = np.round(tf.image.resize(x, expected.shape[:2], 'bicubic', antialias=True).numpy())
  assert np.mean(np.clip(theirs, 0, 255) != expected) > 0.1


def test_predict_pretrained_crops_a_timm_folder_as_torchvision_rounds():
  """torchvision's center_crop (timm's eval pipeline) rounds the offset half to even: 7 rows of room leave 4 above
  (round(3.5) = 4); transformers' image processors leave 3 (floor)."""
  image = tf.constant(np.arange(12 * 4, dtype=np.float32).reshape(12, 4, 1) % 256)
  timm_like = hub.Preprocessing(None, (5, 4), 'bilinear', 1.0, (0.0,), (1.0,), crop_round=True)
  hf_like = hub.Preprocessing(None, (5, 4), 'bilinear', 1.0, (0.0,), (1.0,))
  assert float(pretrained._preprocess(timm_like, image)[0][0, 0, 0]) == 4 * 4  # Row 4 first.
  assert float(pretrained._preprocess(hf_like, image)[0][0, 0, 0]) == 3 * 4  # Row 3 first.


def test_weights_holding_nan_are_one_line_not_nan_probabilities(tmp_path, capsys):
  """A folder whose weights hold a NaN (a damaged or diverged file): predict --pretrained names the parameter and
  exits 2; before, it printed nan probabilities with exit status 0."""
  import safetensors.numpy

  folder = tmp_path / 'hf_vit'
  shutil.copytree(os.path.join(DATA, 'hf_vit'), folder)
  tensors = safetensors.numpy.load_file(str(folder / 'model.safetensors'))
  name = next(k for k in tensors if k.endswith('layer.0.output.dense.bias'))
  tensors[name] = np.where(np.arange(tensors[name].size) == 3, np.nan, tensors[name]).astype(tensors[name].dtype)
  safetensors.numpy.save_file(tensors, str(folder / 'model.safetensors'))
  assert predict.main(['--pretrained', str(folder), IMAGE]) == 2
  err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith('error')]
  assert err == [
    'error: the weights given hold NaN or infinite values (in encoder.blocks.0.mlp.fc2.bias): the file is damaged or '
    'diverged'
  ], err
