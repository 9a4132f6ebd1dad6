"""Published-checkpoint layouts: import, adaptation (head, pre-logits, position embeddings), export."""

import jax
import numpy as np
import pytest
from flax import nnx

from vit_jax_lab import checkpoints, train
from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import release, vit
from vit_jax_lab.tools import export

IMAGES = np.random.RandomState(0).randn(2, 16, 16, 3).astype(np.float32)


def make(num_classes=10, input_shape=(16, 16, 3), seed=0, **kwargs):
  kwargs = dict(variant='mu/4', head_zero_init=False) | kwargs
  model = vit.ViT(num_classes, input_shape, rngs=nnx.Rngs(seed), **kwargs)
  return model, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())


def load(model, params, source):
  loaded, notes = model.load_pretrained(source, params)
  state = nnx.state(model, nnx.Param)
  state.replace_by_pure_dict(loaded)
  nnx.update(model, state)
  return loaded, notes


def to_big_vision(flat, scanned=False, class_token_row=False):
  """The vision_transformer layout written in big_vision's names (what big_vision releases look like)."""
  names = {
    'MultiHeadDotProductAttention_1': 'MultiHeadDotProductAttention_0',
    'LayerNorm_2': 'LayerNorm_1',
    'MlpBlock_3': 'MlpBlock_0',
  }
  out = {}
  for k, v in flat.items():
    parts = k.split('/')
    if len(parts) > 2 and parts[1].startswith('encoderblock_'):
      parts[2] = names.get(parts[2], parts[2])
    out['/'.join(parts)] = v
  if 'Transformer/posembed_input/pos_embedding' in out:
    pos = out.pop('Transformer/posembed_input/pos_embedding')
    out['pos_embedding'] = pos[:, 1:] if class_token_row else pos  # No class-token row in big_vision.
  if scanned:
    blocks = sorted(
      {k.split('/')[1] for k in out if k.startswith('Transformer/encoderblock_')}, key=lambda b: int(b.split('_')[1])
    )
    for key in [k for k in out if k.startswith('Transformer/encoderblock_0/')]:
      rest = key.split('/', 2)[2]
      out[f'Transformer/encoderblock/{rest}'] = np.stack([out.pop(f'Transformer/{b}/{rest}') for b in blocks])
  return out


def assert_same_function(a, b):
  np.testing.assert_allclose(np.asarray(a(IMAGES)), np.asarray(b(IMAGES)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('layout', ['vision_transformer', 'big_vision', 'big_vision_scanned'])
@pytest.mark.parametrize('pool', ['tok', 'gap', 'map'])
def test_release_layouts_load_to_identical_outputs(layout, pool, tmp_path):
  source, source_params = make(pool=pool, seed=1)
  if layout != 'vision_transformer' and pool == 'tok':
    # big_vision adds position embeddings before the class token: equal to a zero class-token row here.
    source.pos_embedding[...] = source.pos_embedding[...].at[:, 0].set(0.0)
    source_params = jax.device_get(nnx.state(source, nnx.Param).to_pure_dict())
  flat = release.to_release(source_params, source.num_heads)
  if layout != 'vision_transformer':
    flat = to_big_vision(flat, scanned=layout.endswith('scanned'), class_token_row=pool == 'tok')
  path = str(tmp_path / 'release.npz')
  checkpoints.write_npz(path, flat)
  target, params = make(pool=pool, seed=2)
  loaded, notes = load(target, params, checkpoints.read_npz(path))
  jax.tree.map(np.testing.assert_array_equal, loaded, source_params)
  assert_same_function(target, source)


def test_missing_unexpected_and_misshaped_keys_are_named():
  model, params = make()
  flat = release.to_release(params, model.num_heads)
  del flat['Transformer/encoderblock_1/LayerNorm_0/scale']
  flat['Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel'] = np.zeros((64, 99), np.float32)
  flat['extra/kernel'] = np.zeros(3, np.float32)
  with pytest.raises(ConfigError) as e:
    model.load_pretrained(flat, params)
  message = str(e.value)
  assert 'missing: Transformer/encoderblock_1/LayerNorm_0/scale' in message
  assert 'unexpected: extra/kernel' in message
  assert 'mis-shaped: Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel (64, 99) (model: (64, 128))' in message
  assert '\n' not in message
  flat |= {f'extra_{i}/kernel': np.zeros(3, np.float32) for i in range(200)}  # A folder of another model's names.
  with pytest.raises(ConfigError) as e:
    model.load_pretrained(flat, params)
  assert 'unexpected: extra/kernel, extra_0/kernel, extra_1/kernel, extra_10/kernel and 197 more' in str(e.value)
  assert len(str(e.value)) < 500


def test_fine_tuning_adaptations():
  """Another class count keeps the fresh head; pre-logits are dropped; a 2x2 grid is resampled to 4x4."""
  source, source_params = make(num_classes=1000, input_shape=(8, 8, 3), representation_size=64, seed=1)
  target, params = make(num_classes=10, input_shape=(16, 16, 3), seed=2)
  loaded, notes = target.load_pretrained(release.to_release(source_params, 4), params)
  assert any('head' in n for n in notes) and any('pre-logits' in n for n in notes)
  assert any('resampled (1, 5, 64) -> (1, 17, 64)' in n for n in notes)
  np.testing.assert_array_equal(loaded['head']['kernel'], params['head']['kernel'])
  np.testing.assert_array_equal(loaded['pos_embedding'][:, 0], source_params['pos_embedding'][:, 0])
  np.testing.assert_array_equal(
    loaded['encoder']['blocks'][3]['mlp']['fc2']['kernel'],
    source_params['encoder']['blocks'][3]['mlp']['fc2']['kernel'],
  )


def test_posemb_resampling():
  pos = np.random.RandomState(0).randn(1, 1 + 16, 8).astype(np.float32)
  np.testing.assert_array_equal(release.resample_posemb(pos, (4, 4), class_token_row=True), pos)  # Same grid.
  wide = release.resample_posemb(pos, (6, 10), class_token_row=True)
  assert wide.shape == (1, 61, 8)
  np.testing.assert_array_equal(wide[:, 0], pos[:, 0])  # The class token is kept apart.
  constant = np.ones((1, 16, 8), np.float32)
  np.testing.assert_allclose(release.resample_posemb(constant, (7, 7), class_token_row=False), 1.0, rtol=1e-6)
  with pytest.raises(ConfigError, match='not a square grid'):
    release.resample_posemb(pos[:, :15], (4, 4), class_token_row=False)


def test_release_options_mismatch_is_reported():
  model, params = make(gelu_approximate=False)
  _, notes = model.load_pretrained(release.to_release(params, model.num_heads), params)
  assert any("'gelu_approximate': True" in n for n in notes)
  model, params = make(**release.RELEASE_OPTIONS)
  _, notes = model.load_pretrained(release.to_release(params, model.num_heads), params)
  assert notes == []


@pytest.mark.slow
def test_export_import_round_trip_and_init_from(smoke_config, tmp_path):
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'vit.npz')
  config = smoke_config()
  train.train_and_evaluate(config, workdir)
  assert export.main(['--workdir', workdir, '--out', out]) == 0
  trained = checkpoints.read_params(workdir)
  flat = checkpoints.read_npz(out)
  assert 'Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel' in flat

  # init_from a .npz and init_from a workdir both start from exactly the trained parameters.
  for source in (out, workdir):
    s = train.setup(smoke_config(init_from=source))
    state = train.init_state(s)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params.to_pure_dict()), trained)
    assert int(state.step) == 0
  # load -> export -> load gives identical arrays.
  model = nnx.merge(s.graphdef, s.abstract_state.params)
  again = release.to_release(model.load_pretrained(flat, trained)[0], model.num_heads)
  assert again.keys() == flat.keys()
  jax.tree.map(np.testing.assert_array_equal, again, flat)
