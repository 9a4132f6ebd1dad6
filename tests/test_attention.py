"""Attention patterns: each blocked pattern is full attention under its mask, each costs O(n), decoding with a
cache equals decoding without, and misuse is one line."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vit_jax_lab.models.attention as patterns
from vit_jax_lab import config as config_lib, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import layers, seq2seq, vit, vivit


def reference(q, k, v, mask):
  """Full softmax attention under a dense bool mask (B or 1, 1, N, N)."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', q / np.sqrt(q.shape[-1]), k)
  logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  return jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(logits, axis=-1), v)


def expected_mask(pattern: patterns.Pattern, n: int, causal: bool, layer: int) -> np.ndarray:
  """The pattern's (N, N) mask from its definition: grid coordinates, blocks of `window` per axis, neighbours
  within one block along every axis, the global tokens, and (sparse) the layer's random blocks."""
  g, grid = pattern.num_global, pattern.grid_for(n)
  sides = [min(pattern.window, a) for a in grid]
  counts = [-(-a // s) for a, s in zip(grid, sides)]
  coords = np.stack(np.unravel_index(np.arange(n - g), grid), axis=-1)
  block = coords // np.asarray(sides)
  flat_block = np.ravel_multi_index(tuple(block.T), counts)
  near = np.all(np.abs(block[:, None] - block[None]) <= 1, axis=-1)
  if causal:
    near &= flat_block[None] <= flat_block[:, None]
  if pattern.kind == 'sparse':
    drawn = np.asarray(patterns.random_blocks(int(np.prod(counts)), pattern.random_blocks, layer, causal))
    near |= np.any(drawn[flat_block][:, None, :] == flat_block[None, :, None], axis=-1)
  mask = np.ones((n, n), bool)
  mask[g:, g:] = near
  if causal:
    mask &= np.tril(np.ones((n, n), bool))
  return mask


CASES = [  # grid (None: 1-D), global tokens, tokens, causal, window; sizes that are not multiples of the block.
  ((37,), 1, 38, True, 5),
  (None, 0, 37, False, 4),
  ((5, 11), 1, 56, False, 2),
  ((3, 5, 4), 1, 61, False, 2),
  ((2, 7, 9), 0, 126, False, 2),
]


@pytest.mark.parametrize('kind', ['local', 'sparse'])
@pytest.mark.parametrize('grid,num_global,n,causal,window', CASES)
def test_blocked_patterns_equal_full_attention_under_their_mask(kind, grid, num_global, n, causal, window):
  pattern = patterns.Pattern(kind, window=window, random_blocks=2, grid=grid, num_global=num_global)
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, n, 3, 8)), jnp.float32) for _ in range(3))
  segments = np.ones((2, n), np.int32)
  segments[1, n - 5 :] = 0  # Padding.
  if causal:
    segments[0, 20:] = 2  # Two packed sequences.
  mask = patterns.Mask(jnp.asarray(segments), causal)
  layer = 3
  dense = expected_mask(pattern, n, causal, layer)
  assert 0.05 < dense.mean() < 0.9  # A real pattern, neither empty nor full.
  full_mask = jnp.asarray(dense)[None, None] & mask.dense(n)
  cotangent = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

  def blocked(q, k, v):
    return patterns.blocked_attention(q, k, v, pattern, mask, layer)

  def full(q, k, v):
    return reference(q, k, v, full_mask)

  @jax.jit
  def values_and_gradients(q, k, v):
    results = []
    for fn in (blocked, full):
      out, vjp = jax.vjp(fn, q, k, v)
      results.append((out, *vjp(cotangent)))
    return results

  got, want = values_and_gradients(q, k, v)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(patterns.dense_mask(pattern, n, causal, layer), dense)


def test_linear_attention_is_the_kernelised_formula_and_its_causal_prefix_sums():
  rng = np.random.default_rng(1)
  for n, causal in [(37, False), (150, True), (5, True)]:
    q, k, v = (jnp.asarray(rng.normal(size=(2, n, 2, 8)), jnp.float32) for _ in range(3))
    segments = np.ones((2, n), np.int32)
    segments[1, n - 3 :] = 0
    mask = patterns.Mask(jnp.asarray(segments), causal)
    fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    visible = mask.dense(n) if causal else jnp.asarray(segments)[:, None, None, :] > 0
    scores = jnp.einsum('bqhd,bkhd->bhqk', fq, fk) * visible
    want = jnp.einsum('bhqk,bkhd->bqhd', scores / scores.sum(-1, keepdims=True), v)
    got = jax.jit(patterns.linear_attention)(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(got)[segments > 0], np.asarray(want)[segments > 0], atol=1e-5, rtol=1e-5)


def attention_layer_cost(kind: str, n: int) -> tuple[float, float]:
  """XLA's FLOPs and bytes of one self-attention layer's forward and backward pass over n tokens."""
  module = layers.Attention(64, 4, pattern=patterns.Pattern(kind, window=32, num_global=1), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(module)

  def grads(params, x):
    return jax.grad(lambda p, x: nnx.merge(graphdef, p)(x).sum(), argnums=(0, 1))(params, x)

  cost = jax.jit(grads).lower(params, jax.ShapeDtypeStruct((1, n, 64), jnp.float32)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return cost['flops'], cost['bytes accessed']


@pytest.mark.parametrize('kind', ['full', 'local', 'sparse', 'linear'])
def test_cost_of_an_attention_layer_grows_linearly_except_full(kind):
  (flops, bytes_), (flops4, bytes4) = attention_layer_cost(kind, 1024), attention_layer_cost(kind, 4096)
  if kind == 'full':
    assert flops4 / flops > 12 and bytes4 / bytes_ > 12
  else:
    assert flops4 / flops <= 4.4 and bytes4 / bytes_ <= 4.4, (flops4 / flops, bytes4 / bytes_)


@pytest.mark.parametrize('kind', ['local', 'sparse', 'linear'])  # 'full': tests/test_seq2seq.py.
def test_cached_decoding_equals_decoding_all_at_once(kind):
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(1, 20, (2, 23))).at[1, 18:].set(0)
  targets = jnp.asarray(rng.integers(1, 20, (2, 37))).at[1, 30:].set(0)
  model = seq2seq.Transformer(
    20, 20, None, 64, variant='tiny', attention=kind, attention_window=4, dropout=0.0, scan=True, rngs=nnx.Rngs(0)
  )
  logits = model(inputs, targets)
  encoded, segments = model.encode(inputs)
  cache = model.init_cache(encoded, segments, 40)
  stepped, decode_step = [], nnx.jit(lambda model, *args: model.decode_step(*args))
  for t in range(targets.shape[1]):
    step_logits, cache = decode_step(model, targets[:, t], jnp.asarray(t), cache)
    stepped.append(step_logits)
  real = np.asarray(targets) > 0
  np.testing.assert_allclose(np.asarray(jnp.stack(stepped, 1))[real], np.asarray(logits)[real], atol=1e-5)
  if kind in ('local', 'sparse'):  # The pattern really limits what the decoder sees.
    full = seq2seq.Transformer(
      20, 20, None, 64, variant='tiny', attention='full', dropout=0.0, scan=True, rngs=nnx.Rngs(0)
    )
    assert np.abs(np.asarray(full(inputs, targets) - logits))[real].max() > 1e-3


def test_scanned_and_unscanned_layers_draw_the_same_random_blocks():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 16, 16, 3)), jnp.float32)
  kwargs = dict(variant='mu/2', attention='sparse', attention_window=2, attention_random_blocks=3)
  plain = vit.ViT(4, (16, 16, 3), **kwargs, rngs=nnx.Rngs(0))
  scanned = vit.ViT(4, (16, 16, 3), **kwargs, scan=True, rngs=nnx.Rngs(1))
  state = nnx.state(scanned, nnx.Param)
  state.replace_by_pure_dict(layers.scanned_like(nnx.state(plain, nnx.Param).to_pure_dict(), state.to_pure_dict()))
  nnx.update(scanned, state)
  features = nnx.jit(lambda model, x: model.features(x))
  np.testing.assert_allclose(features(scanned, x), features(plain, x), atol=1e-5)
  layer0, layer1 = (patterns.dense_mask(plain.encoder.blocks[0].attn.pattern, 65, layer=i) for i in (0, 1))
  assert np.any(layer0 != layer1)  # Each layer has its own random blocks.


def test_attention_maps_keep_the_pattern_and_sum_to_one():
  images = jnp.asarray(np.random.default_rng(0).normal(size=(1, 16, 16, 3)), jnp.float32)
  model = vit.ViT(4, (16, 16, 3), variant='mu/2', attention='local', attention_window=2, rngs=nnx.Rngs(0))
  for i, weights in enumerate(model.attention_maps(images)):
    allowed = np.asarray(patterns.dense_mask(model.encoder.blocks[i].attn.pattern, 65, layer=i))
    assert np.all(np.asarray(weights)[0][:, ~allowed] == 0)
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1, atol=1e-5)


def test_video_local_attention_is_local_over_time_and_space():
  video = jnp.asarray(np.random.default_rng(0).normal(size=(1, 8, 16, 16, 1)), jnp.float32)
  model = vivit.ViViT(
    3, (8, 16, 16, 1), variant='mu/4x2', attention='local', attention_window=1, dropout=0.0, rngs=nnx.Rngs(0)
  )
  pattern = model.encoder.blocks[0].attn.pattern
  assert pattern.grid == (4, 4, 4) and pattern.num_global == 1
  touched = video.at[:, :2, :4, :4].add(1.0)  # Changes only the first tubelet.
  tokens, touched_tokens = (
    model.embedding(v).reshape(1, -1, model.encoder.norm.num_features) for v in (video, touched)
  )
  x = layers.add_positions(tokens, cls=model.cls, learned=model.pos_embedding)
  y = layers.add_positions(touched_tokens, cls=model.cls, learned=model.pos_embedding)
  changed = (
    np.abs(
      np.asarray(
        model.encoder.blocks[0](y, train=False, rngs=None) - model.encoder.blocks[0](x, train=False, rngs=None)
      )
    ).max(-1)[0, 1:]
    > 1e-6
  )
  coords = np.stack(np.unravel_index(np.arange(64), (4, 4, 4)), -1)
  np.testing.assert_array_equal(changed, np.all(coords <= 1, axis=-1))  # Its 2 x 2 x 2 neighbourhood, no more.


@pytest.mark.slow
def test_sparse_train_steps_are_equal_on_1_and_8_devices(smoke_config):
  config = smoke_config(model__patch_size=2, model__attention='sparse', model__attention_window=1)
  results = []
  for devices in (jax.devices()[:1], jax.devices()):
    s = train.setup(config, devices)
    state, step, batches = train.init_state(s), train.make_train_step(s), train.train_batches(s)
    losses = []
    for _ in range(3):
      state, metrics = step(state, next(batches))
      losses.append(float(metrics['loss']))
    results.append(losses)
  np.testing.assert_allclose(results[0], results[1], rtol=1e-5)


@pytest.mark.parametrize(
  'build,message',
  [
    (lambda: vit.ViT(3, (8, 8, 1), variant='mu/2', attention='flash', rngs=nnx.Rngs(0)), "model.attention='flash'"),
    (
      lambda: vit.ViT(3, (8, 8, 1), variant='mu/2', attention='local', attention_window=0, rngs=nnx.Rngs(0)),
      'model.attention_window=0',
    ),
    (
      lambda: vit.ViT(3, (8, 8, 1), variant='mu/2', attention='linear', attention_dropout=0.1, rngs=nnx.Rngs(0)),
      'model.attention_dropout=0.1',
    ),
    (
      lambda: vivit.ViViT(
        3, (4, 8, 8, 1), variant='mu/4x2', model='factorised_self_attention', attention='local', rngs=nnx.Rngs(0)
      ),
      "model.attention='local' applies to models",
    ),
  ],
)
def test_bad_attention_options_are_one_line_errors(build, message):
  with pytest.raises(ConfigError, match=message) as error:
    build()
  assert '\n' not in str(error.value)


def test_linear_attention_refuses_packed_sequences_and_attention_maps():
  config = config_lib.load('configs/seq2seq/scan.py')
  config.model.attention = 'linear'
  config.data.pack_factor = 4
  with pytest.raises(ConfigError, match='data.pack_factor=4'):
    config_lib.validate(config)
  model = vit.ViT(3, (8, 8, 1), variant='mu/2', attention='linear', rngs=nnx.Rngs(0))
  with pytest.raises(ConfigError, match='no attention weights'):
    model.attention_maps(jnp.zeros((1, 8, 8, 1)))


@pytest.mark.slow
def test_every_pattern_runs_in_every_family():
  images, video = jnp.ones((2, 8, 8, 1)), jnp.ones((2, 4, 8, 8, 1))
  apply = nnx.jit(lambda model, x: model(x))  # Compiled: eager, the blocked patterns' many small ops took 20 s.
  for kind in ['local', 'sparse', 'linear']:
    for family in ('spatiotemporal', 'factorised_encoder'):
      model = vivit.ViViT(
        3, (4, 8, 8, 1), variant='mu/2x2', model=family, attention=kind, attention_window=2, rngs=nnx.Rngs(0)
      )
      assert np.all(np.isfinite(apply(model, video)))
    assert np.all(np.isfinite(apply(vit.ViT(3, (8, 8, 1), variant='mu/2', attention=kind, rngs=nnx.Rngs(0)), images)))


@pytest.mark.slow
def test_attention_map_command_draws_sparse_maps_and_refuses_linear(data_dir, tmp_path, capsys):
  from vit_jax_lab.tools import attention_map

  out = str(tmp_path / 'attention.png')
  args = ['--config', 'configs/vit/digits.py:smoke', f'--config.data.data_dir={data_dir}', '--out', out]
  sparse = ['--config.model.patch_size=2', '--config.model.attention=sparse', '--config.model.attention_window=1']
  assert attention_map.main([*args, *sparse]) == 0
  assert os.path.getsize(out) > 0
  assert attention_map.main([*args, '--config.model.attention=linear']) == 2
  assert 'no attention weights' in capsys.readouterr().err
