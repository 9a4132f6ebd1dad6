"""Speed and memory options change how a step runs, not what it computes: bf16, remat, scanned layers,
FSDP and tensor-parallel layouts against the plain float32 data-parallel step."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.extend import core as jax_core

from test_train import run_steps
from vit_jax_lab import optim, parallel, train
from vit_jax_lab.models import layers, release, seq2seq, text_classifier, tracker, vit, vivit
from vit_jax_lab.tools import bench


def assert_same_run(a, b, rtol=1e-5, atol=1e-5):
  np.testing.assert_allclose(a[0], b[0], rtol=rtol, atol=1e-6)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a[1], b[1])


@pytest.mark.slow
def test_remat_policies_give_the_same_steps(smoke_config):
  """With dropout, stochastic depth and mixup on: rematerialisation recomputes the same random masks."""
  devices = jax.devices()[:2]
  reference = run_steps(smoke_config(), devices, num_steps=3)
  assert_same_run(run_steps(smoke_config(model__remat='full'), devices, num_steps=3), reference)


@pytest.mark.slow
def test_scanned_layers_give_the_same_steps(smoke_config):
  """Scanned layers draw their dropout keys per layer, so the comparison runs without dropout; the scanned
  run starts from the unscanned run's initial parameters (converted) and ends with the same ones."""
  plain = dict(model__dropout=0.0, model__drop_path=0.0)
  devices = jax.devices()[:2]
  losses, params, _ = run_steps(smoke_config(**plain), devices, num_steps=3)
  scan_losses, scan_params, _ = run_steps(
    smoke_config(model__scan=True, **plain), devices, num_steps=3, initial_from=smoke_config(**plain)
  )
  np.testing.assert_allclose(scan_losses, losses, rtol=1e-5)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5), layers.unscanned(scan_params), params
  )


@pytest.mark.slow
def test_bfloat16_and_float16_compute_are_close_to_float32(smoke_config):
  """Parameters stay float32; float16's dynamic loss scale doubles after `loss_scale_period` finite steps."""
  devices = jax.devices()[:2]
  losses, params, _ = run_steps(smoke_config(), devices, num_steps=3)
  runs = {
    'bfloat16': run_steps(smoke_config(compute_dtype='bfloat16'), devices, num_steps=3),
    'float16': run_steps(smoke_config(compute_dtype='float16', loss_scale_period=2), devices, num_steps=3),
  }
  for dtype, (low_losses, low_params, _) in runs.items():
    np.testing.assert_allclose(low_losses, losses, rtol=2e-2, err_msg=dtype)
    # It really ran in low precision (the first losses agree closely: the head starts at zero).
    assert not all(jax.tree.leaves(jax.tree.map(lambda a, b: np.allclose(a, b, rtol=1e-4), low_params, params)))
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(low_params))
  state = runs['float16'][2]
  assert float(state.loss_scale.scale) == 2.0**16 and int(state.loss_scale.finite_steps) == 1  # 2**15, doubled once.
  _, _, state = run_steps(smoke_config(optim__mu_dtype='bfloat16'), devices, num_steps=1)
  assert {x.dtype for x in jax.tree.leaves(state.opt_state[1][0].mu)} == {jax.numpy.dtype('bfloat16')}


@pytest.mark.slow
def test_float16_overflow_skips_the_step_and_halves_the_loss_scale(smoke_config):
  """A scale of 2**24 overflows float16 gradients: the steps leave the parameters alone and halve the scale
  until the gradients fit, then training goes on (total_steps: the learning rate is not yet 0 then)."""
  config = smoke_config(compute_dtype='float16', loss_scale_init=2.0**24, total_steps=100)
  s = train.setup(config, jax.devices()[:2])
  state = train.init_state(s)
  initial = jax.device_get(state.params.to_pure_dict())
  step, batches = train.make_train_step(s), train.train_batches(s)
  state, metrics = step(state, next(batches))
  assert float(metrics['skipped']) == 1.0 and float(state.loss_scale.scale) == 2.0**23
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params.to_pure_dict()), initial)
  skipped = [1.0]
  while skipped[-1] and len(skipped) < 20:
    state, metrics = step(state, next(batches))
    skipped.append(float(metrics['skipped']))
  assert not skipped[-1] and int(state.loss_scale.skipped) == len(skipped) - 1
  state, metrics = step(state, next(batches))  # The optimizer has taken one step: its schedule says so.
  assert float(metrics['lr']) == float(optim.schedule(config)(1))
  assert not np.allclose(jax.device_get(state.params.to_pure_dict())['head']['kernel'], initial['head']['kernel'])
  metrics = train.evaluate(s, train.make_eval_step(s), state.params)  # Evaluation runs in float16 too.
  assert metrics['eval/examples'] == 360 and 0 <= metrics['eval/accuracy'] <= 1


@pytest.mark.parametrize('mesh', [dict(data=4, fsdp=1, model=2), dict(data=2, fsdp=2, model=2)])  # FSDP alone:
# tests/test_train.py.
@pytest.mark.slow
def test_fsdp_and_tensor_parallel_layouts_give_the_same_steps(smoke_config, mesh):
  reference = run_steps(smoke_config(), jax.devices()[:1], num_steps=3)
  config = smoke_config(**{f'mesh__{k}': v for k, v in mesh.items()})
  losses, params, state = run_steps(config, jax.devices(), num_steps=3)
  assert_same_run((losses, params), reference)
  qkv = state.params['encoder']['blocks'][0]['attn']['qkv']['kernel'][...]
  fc2 = state.params['encoder']['blocks'][0]['mlp']['fc2']['kernel'][...]
  if mesh['model'] > 1:  # Megatron: qkv split over its outputs, fc2 over its inputs.
    assert qkv.sharding.spec[1] == 'model' and fc2.sharding.spec[0] == 'model'
    assert qkv.addressable_shards[0].data.shape[1] == qkv.shape[1] // 2


def test_scanned_and_unscanned_layouts_convert_exactly():
  kw = dict(width=32, depth=3, mlp_dim=64, num_heads=4, patch_size=4, drop_path=0.0)
  scanned = vit.ViT(10, (16, 16, 3), scan=True, rngs=nnx.Rngs(0), **kw)
  plain = vit.ViT(10, (16, 16, 3), rngs=nnx.Rngs(1), **kw)
  scanned_params = nnx.state(scanned, nnx.Param).to_pure_dict()
  state = nnx.state(plain, nnx.Param)
  state.replace_by_pure_dict(layers.unscanned(scanned_params))
  nnx.update(plain, state)
  x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
  np.testing.assert_allclose(plain(x), scanned(x), rtol=1e-5, atol=1e-6)
  back = layers.scanned_like(nnx.state(plain, nnx.Param).to_pure_dict(), scanned_params)
  jax.tree.map(np.testing.assert_array_equal, back, scanned_params)
  # A release .npz loads into both layouts alike.
  flat = release.to_release(scanned_params, 4)
  into_plain, _ = plain.load_pretrained(flat, nnx.state(plain, nnx.Param).to_pure_dict())
  into_scanned, _ = scanned.load_pretrained(flat, scanned_params)
  jax.tree.map(np.testing.assert_array_equal, layers.unscanned(into_scanned), into_plain)
  # Weight decay skips biases and norms of scanned blocks too (their leading axis is the layer).
  mask = optim.decay_mask(nnx.state(scanned, nnx.Param)).to_pure_dict()
  assert not mask['encoder']['blocks']['attn']['qkv']['bias'] and mask['encoder']['blocks']['attn']['qkv']['kernel']
  assert not mask['encoder']['blocks']['norm1']['scale']


def test_scanned_vivit_initialises_from_an_image_vit():
  image = vit.ViT(
    10, (16, 16, 3), width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=4, pool='gap', rngs=nnx.Rngs(0)
  )
  video = vivit.ViViT(
    10,
    (4, 16, 16, 3),
    width=32,
    depth=2,
    mlp_dim=64,
    num_heads=4,
    patch_size=4,
    tubelet_time=2,
    model='factorised_self_attention',
    scan=True,
    rngs=nnx.Rngs(1),
  )
  params = nnx.state(video, nnx.Param)
  loaded, _ = video.load_pretrained(nnx.state(image, nnx.Param).to_pure_dict(), params.to_pure_dict())
  params.replace_by_pure_dict(loaded)
  nnx.update(video, params)
  images = jax.random.normal(jax.random.key(5), (2, 16, 16, 3))
  np.testing.assert_allclose(video(np.repeat(images[:, None], 4, axis=1)), image(images), rtol=1e-5, atol=2e-6)


def dot_dtypes(jaxpr) -> set[str]:
  """The operand dtypes of every matrix product in `jaxpr` and the jaxprs nested in it (jit, scan, remat, ...)."""
  found = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      found |= {str(v.aval.dtype) for v in eqn.invars}
    for sub in jax_core.jaxprs_in_params(eqn.params):
      found |= dot_dtypes(sub)
  return found


def images(*shape):
  return jnp.zeros(shape, jnp.bfloat16)


def tokens(*shape):
  return jnp.zeros(shape, jnp.int32)


BF16_MODELS = {  # (model, inputs): fixed position embeddings (constants, not parameters), blocked attention's own
  # arrays, token embeddings. Linear attention is left out: it sums over the keys in float32 by design.
  'vit sincos2d': lambda r: (
    vit.ViT(10, (16, 16, 3), variant='mu/4', posemb='sincos2d', rngs=r),
    [images(2, 16, 16, 3)],
  ),
  'vit local': lambda r: (
    vit.ViT(10, (16, 16, 3), variant='mu/4', attention='local', attention_window=2, rngs=r),
    [images(2, 16, 16, 3)],
  ),
  'vivit sincos': lambda r: (
    vivit.ViViT(10, (4, 16, 16, 3), variant='mu/4x2', posemb='sincos', rngs=r),
    [images(2, 4, 16, 16, 3)],
  ),
  'transformer sincos': lambda r: (
    seq2seq.Transformer(20, 20, None, 64, variant='tiny', rngs=r),
    [tokens(2, 8), tokens(2, 8)],
  ),
  'text_classifier sincos': lambda r: (
    text_classifier.TextClassifier(10, 20, 16, variant='tiny', posemb='sincos', rngs=r),
    [tokens(2, 16)],
  ),
  'tracker sincos2d': lambda r: (
    tracker.Tracker(32, 64, 3, variant='mu/8', posemb_init='sincos2d', rngs=r),
    [images(2, 32, 32, 3), images(2, 64, 64, 3)],
  ),
}


@pytest.mark.parametrize('name', BF16_MODELS)
def test_bfloat16_compute_runs_every_matmul_in_bfloat16(name):
  """compute_dtype=bfloat16 casts the parameters and inputs: no float32 constant (a fixed position embedding, a
  mask, an embedding's fixed dtype) may promote the activations back to float32, forward or backward."""
  model, inputs = BF16_MODELS[name](nnx.Rngs(0))
  graphdef, params = nnx.split(model)

  def loss(params):
    outputs = nnx.merge(graphdef, params)(*inputs, train=True, rngs=nnx.Rngs(0))
    return sum(jnp.sum(y.astype(jnp.float32)) for y in jax.tree.leaves(outputs))

  params = train.in_compute_dtype(params, ml_collections.ConfigDict({'compute_dtype': 'bfloat16'}))
  assert dot_dtypes(jax.make_jaxpr(jax.grad(loss))(params).jaxpr) == {'bfloat16'}


def test_attention_implementation_is_selectable():
  """'xla' and the default give the same CPU step; 'cudnn' (flash attention) is refused without a GPU."""
  kw = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=4)
  x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
  auto = vit.ViT(10, (16, 16, 3), head_zero_init=False, rngs=nnx.Rngs(0), **kw)
  xla = vit.ViT(10, (16, 16, 3), head_zero_init=False, attention_impl='xla', rngs=nnx.Rngs(0), **kw)
  assert xla.encoder.blocks[0].attn.implementation == 'xla'
  np.testing.assert_array_equal(xla(x), auto(x))
  video = vivit.ViViT(
    10, (4, 16, 16, 3), tubelet_time=2, model='factorised_self_attention', attention_impl='xla', rngs=nnx.Rngs(0), **kw
  )
  assert video.encoder.blocks[0].temporal_attn.implementation == 'xla'
  from vit_jax_lab.config import ConfigError

  with pytest.raises(ConfigError, match="model.attention_impl='cudnn' needs an NVIDIA GPU"):
    vit.ViT(10, (16, 16, 3), attention_impl='cudnn', rngs=nnx.Rngs(0), **kw)


@pytest.mark.slow
def test_cpu_steps_compile_their_matmuls_without_ynnpack(smoke_config, monkeypatch):
  """parallel.compiler_options keeps XLA:CPU's matmuls on its Eigen kernels (YNNPACK, the default, ran them
  slower here), for the train and eval steps; an XLA_FLAGS that sets the option itself wins."""
  s, batch = bench.synthetic_setup(smoke_config(), '16,16,3,10')

  def compiled(fn, *args):
    return fn.lower(*args).compile().as_text()

  def matmul(x):
    return x @ x

  a = jax.numpy.ones((64, 64))
  assert 'ynn_fusion' in compiled(jax.jit(matmul), a)  # What the option turns off.
  assert 'ynn_fusion' not in compiled(jax.jit(matmul, compiler_options=parallel.compiler_options(s.mesh)), a)
  state = train.init_state(s)
  eval_batch = batch | {'mask': batch['label'] >= 0}
  for text in (
    compiled(train.make_train_step(s), state, batch),
    compiled(train.make_eval_step(s), state.params, eval_batch),
  ):
    assert ' dot(' in text and 'ynn_fusion' not in text
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_experimental_ynn_fusion_type=individual_dot')
  assert parallel.compiler_options(s.mesh) is None
