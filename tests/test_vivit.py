"""ViViT: shapes and token counts, factorised attention against masked full attention, and initialisation
from an image ViT (a static clip is classified as its image)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import release, vit, vivit

TINY = dict(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=4)


def clip(shape, seed=0):
  return jax.random.normal(jax.random.key(seed), (2, *shape))


@pytest.mark.parametrize('model', vivit.MODELS)
@pytest.mark.parametrize('embedding', ['tubelet', 'frames'])
@pytest.mark.slow
def test_every_model_and_embedding_gives_logits(model, embedding):
  shape = (4, 8, 12, 3)
  net = vivit.ViViT(
    7,
    shape,
    model=model,
    embedding=embedding,
    tubelet_time=2,
    temporal_depth=1,
    **TINY,
    dropout=0.1,
    attention_dropout=0.1,
    drop_path=0.1,
    rngs=nnx.Rngs(0),
  )
  logits = net(clip(shape), train=True, rngs=nnx.Rngs(dropout=1))
  assert logits.shape == (2, 7) and np.isfinite(logits).all()


@pytest.mark.parametrize(
  'shape,time,patch,grid',
  [
    ((8, 16, 16, 3), 2, 4, (4, 16)),
    ((8, 16, 16, 3), 4, 8, (2, 4)),
    ((6, 8, 12, 1), 3, 4, (2, 6)),
    ((32, 224, 224, 3), 2, 16, (16, 196)),
  ],
)
def test_tubelet_token_counts(shape, time, patch, grid):
  embed = nnx.eval_shape(lambda: vivit.TubeletEmbedding(time, patch, shape[-1], 32, rngs=nnx.Rngs(0)))
  tokens = jax.eval_shape(lambda e, x: e(x), embed, jax.ShapeDtypeStruct((1, *shape), jnp.float32))
  assert tokens.shape == (1, *grid, 32)
  net = nnx.eval_shape(
    lambda: vivit.ViViT(5, shape, tubelet_time=time, **TINY | {'patch_size': patch}, rngs=nnx.Rngs(0))
  )
  assert net.grid == grid
  frames = vivit.TubeletEmbedding(None, patch, shape[-1], 32, rngs=nnx.Rngs(0))
  assert jax.eval_shape(frames, jax.ShapeDtypeStruct((1, *shape), jnp.float32)).shape == (1, shape[0], grid[1], 32)


def test_tubelet_embedding_is_a_strided_3d_convolution():
  embed = vivit.TubeletEmbedding(2, 4, 3, 16, rngs=nnx.Rngs(0))
  x = clip((4, 8, 12, 3))
  conv = (
    jax.lax.conv_general_dilated(
      x, embed.kernel[...], window_strides=(2, 4, 4), padding='VALID', dimension_numbers=('NTHWC', 'THWIO', 'NTHWC')
    )
    + embed.bias[...]
  )
  np.testing.assert_allclose(embed(x), conv.reshape(2, 2, 6, 16), atol=1e-5)


def test_factorised_dot_product_equals_full_attention_with_block_masks():
  nt, ns, heads, d = 3, 4, 4, 16
  attn = vivit.FactorisedDotProductAttention(d, heads, grid=(nt, ns), rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, nt * ns, d))
  q, k, v = attn.heads(x)
  t, s = np.divmod(np.arange(nt * ns), ns)  # Token i is at time t[i], place s[i].
  same_frame = jnp.asarray(t[:, None] == t[None, :])
  same_place = jnp.asarray(s[:, None] == s[None, :])
  half = heads // 2
  y_space = jax.nn.dot_product_attention(q[:, :, :half], k[:, :, :half], v[:, :, :half], mask=same_frame)
  y_time = jax.nn.dot_product_attention(q[:, :, half:], k[:, :, half:], v[:, :, half:], mask=same_place)
  expected = attn.out(jnp.concatenate([y_space, y_time], axis=2).reshape(2, nt * ns, d))
  np.testing.assert_allclose(attn(x), expected, atol=1e-5)
  # And it is not full attention: the masks matter.
  assert not np.allclose(attn(x), attn.out(jax.nn.dot_product_attention(q, k, v).reshape(2, -1, d)), atol=1e-3)


def test_factorised_self_attention_block_attends_over_time_then_space():
  nt, ns, d = 3, 4, 16
  kw = dict(
    dropout=0.0,
    attention_dropout=0.0,
    drop_path=0.0,
    prenorm=True,
    gelu_approximate=False,
    layernorm_epsilon=1e-6,
    rngs=nnx.Rngs(0),
  )
  block = vivit.FactorisedSelfAttentionBlock(d, 32, 4, grid=(nt, ns), time_first=True, **kw)
  x = jax.random.normal(jax.random.key(1), (2, nt * ns, d))
  grid = x.reshape(2, nt, ns, d)
  y = grid + block.temporal_attn(block.temporal_norm(grid).swapaxes(1, 2).reshape(2 * ns, nt, d)).reshape(
    2, ns, nt, d
  ).swapaxes(1, 2)
  y = y + block.attn(block.norm1(y).reshape(2 * nt, ns, d)).reshape(2, nt, ns, d)
  y = y.reshape(2, nt * ns, d)
  y = y + block.mlp(block.norm2(y), train=False, rngs=None)
  np.testing.assert_allclose(block(x, train=False, rngs=None), y, atol=1e-5)


def test_published_parameter_counts_and_gmacs():
  """ViViT-B/16x2, 32 frames, 224 px, 400 classes: Arnab et al. 2021, Table 2 (0.1M and 3%)."""
  from vit_jax_lab import cost

  shape = (32, 224, 224, 3)
  published = {
    'spatiotemporal': (88.9, 455.2),
    'factorised_encoder': (115.1, 284.4),
    'factorised_self_attention': (117.3, 372.3),
    'factorised_dot_product': (88.9, 277.1),
  }
  for model, (params, gmacs) in published.items():
    fn, args = cost.forward(lambda: vivit.ViViT(400, shape, variant='B/16x2', model=model, rngs=nnx.Rngs(0)), shape)
    assert abs(cost.param_count(args[0]) / 1e6 - params) <= 0.1, model
    assert abs(cost.matmul_macs(fn, *args) / 1e9 / gmacs - 1) <= 0.03, model


def _image_vit(pool, **kw):
  return vit.ViT(10, (16, 16, 3), **TINY, pool=pool, head_zero_init=False, rngs=nnx.Rngs(3), **kw)


def _video_from_image(image_model, frames, **kw):
  net = vivit.ViViT(10, (frames, 16, 16, 3), **TINY, rngs=nnx.Rngs(4), **kw)
  params = nnx.state(net, nnx.Param)
  loaded, _ = net.load_pretrained(nnx.state(image_model, nnx.Param).to_pure_dict(), params.to_pure_dict())
  params.replace_by_pure_dict(loaded)
  nnx.update(net, params)
  return net


@pytest.mark.parametrize(
  'kw',
  [
    dict(model='spatiotemporal', tubelet_time=2, tubelet_init='central_frame'),
    dict(model='spatiotemporal', tubelet_time=2, tubelet_init='inflate'),
    dict(model='spatiotemporal', embedding='frames'),
    dict(model='factorised_self_attention', tubelet_time=2, temporal_attention_init='zero'),
  ],
  ids=['central_frame', 'inflate', 'frames', 'model3_zero'],
)
def test_static_clip_is_classified_as_its_image(kw):
  """With average pooling and the image's position embeddings repeated over time, a clip of T copies of an
  image gives exactly the image model's probabilities: every token is duplicated nt times, which leaves
  softmax attention and the average unchanged."""
  image_model = _image_vit('gap')
  images = jax.random.normal(jax.random.key(5), (2, 16, 16, 3))
  video_model = _video_from_image(image_model, 6, pool='gap', **kw)
  clips = jnp.repeat(images[:, None], 6, axis=1)
  np.testing.assert_allclose(jax.nn.softmax(video_model(clips)), jax.nn.softmax(image_model(images)), atol=2e-6)


def test_static_clip_with_class_token():
  """With a class token the duplicates outweigh it in attention (nt : 1), so equality needs nt = 1: a clip
  of one tubelet. With more tubelets the outputs differ, which the test also checks."""
  image_model = _image_vit('tok')
  images = jax.random.normal(jax.random.key(5), (2, 16, 16, 3))
  expected = jax.nn.softmax(image_model(images))
  one = _video_from_image(image_model, 2, model='spatiotemporal', tubelet_time=2)
  np.testing.assert_allclose(jax.nn.softmax(one(jnp.repeat(images[:, None], 2, axis=1))), expected, atol=2e-6)
  three = _video_from_image(image_model, 6, model='spatiotemporal', tubelet_time=2)
  assert not np.allclose(jax.nn.softmax(three(jnp.repeat(images[:, None], 6, axis=1))), expected, atol=1e-4)


def test_tubelet_initialisation_values():
  image_model = _image_vit('tok')
  k2 = np.asarray(image_model.embedding.kernel[...])
  central = _video_from_image(image_model, 6, tubelet_time=3, tubelet_init='central_frame')
  np.testing.assert_array_equal(central.embedding.kernel[...], np.stack([np.zeros_like(k2), k2, np.zeros_like(k2)]))
  inflated = _video_from_image(image_model, 6, tubelet_time=3, tubelet_init='inflate')
  np.testing.assert_allclose(inflated.embedding.kernel[...], np.stack([k2 / 3] * 3), rtol=1e-6)
  # Position embeddings: the class-token row, then the image's grid once per time step.
  pos = np.asarray(image_model.pos_embedding[...])
  np.testing.assert_array_equal(central.pos_embedding[...], np.concatenate([pos[:, :1], pos[:, 1:], pos[:, 1:]], 1))


def test_model3_and_model2_initialisation():
  image_model = _image_vit('gap', posemb='learn')
  image = nnx.state(image_model, nnx.Param).to_pure_dict()
  copy = _video_from_image(
    image_model, 4, model='factorised_self_attention', tubelet_time=2, temporal_attention_init='copy'
  )
  zero = _video_from_image(image_model, 4, model='factorised_self_attention', tubelet_time=2)
  for i, block in image['encoder']['blocks'].items():
    for net in (copy, zero):
      b = nnx.state(net, nnx.Param).to_pure_dict()['encoder']['blocks'][i]
      jax.tree.map(np.testing.assert_array_equal, b['attn'], block['attn'])
      jax.tree.map(np.testing.assert_array_equal, b['temporal_norm'], block['norm1'])
      jax.tree.map(np.testing.assert_array_equal, b['temporal_attn']['qkv'], block['attn']['qkv'])
    copied = nnx.state(copy, nnx.Param).to_pure_dict()['encoder']['blocks'][i]['temporal_attn']['out']
    zeroed = nnx.state(zero, nnx.Param).to_pure_dict()['encoder']['blocks'][i]['temporal_attn']['out']
    jax.tree.map(np.testing.assert_array_equal, copied, block['attn']['out'])
    assert not np.any(zeroed['kernel']) and not np.any(zeroed['bias'])
  # Model 2: the spatial encoder is the image encoder; the temporal encoder keeps its initialisation.
  net = vivit.ViViT(
    10,
    (4, 16, 16, 3),
    **TINY,
    model='factorised_encoder',
    pool='gap',
    temporal_depth=1,
    tubelet_time=2,
    rngs=nnx.Rngs(4),
  )
  initial = nnx.state(net, nnx.Param).to_pure_dict()
  loaded, _ = net.load_pretrained(image, initial)
  jax.tree.map(np.testing.assert_array_equal, loaded['encoder'], image['encoder'])
  jax.tree.map(np.testing.assert_array_equal, loaded['temporal_encoder'], initial['temporal_encoder'])
  np.testing.assert_array_equal(loaded['pos_embedding'], image['pos_embedding'])


def test_release_checkpoint_with_class_token_into_a_pooled_model():
  """A released ViT has a class token; models 3 and 4 have none: it is dropped with its position row."""
  image_model = _image_vit('tok')
  flat = release.to_release(nnx.state(image_model, nnx.Param).to_pure_dict(), 4)
  net = vivit.ViViT(10, (4, 16, 16, 3), **TINY, model='factorised_dot_product', tubelet_time=2, rngs=nnx.Rngs(4))
  loaded, notes = net.load_pretrained(flat, nnx.state(net, nnx.Param).to_pure_dict())
  assert any('class token dropped' in n for n in notes)
  pos = flat['Transformer/posembed_input/pos_embedding']
  np.testing.assert_array_equal(loaded['pos_embedding'], np.tile(pos[:, 1:], (1, 2, 1)))


@pytest.mark.parametrize(
  'kw,shape,message',
  [
    (dict(tubelet_time=3), (4, 16, 16, 3), 'model.tubelet_time=3 must be a positive divisor'),
    (dict(tubelet_time=2, patch_size=5), (4, 16, 16, 3), 'model.patch_size=5 must divide'),
    (dict(tubelet_time=2, model='factorised'), (4, 16, 16, 3), "model.model='factorised' is not one of"),
    (dict(tubelet_time=2, model='factorised_dot_product', num_heads=1, width=32), (4, 16, 16, 3), 'must be even'),
    (dict(tubelet_time=2, model='factorised_self_attention', pool='tok'), (4, 16, 16, 3), "model.pool='tok'"),
    (dict(tubelet_time=2), (16, 16, 3), 'ViViT takes clips'),
    (dict(variant='B/16y2'), (4, 16, 16, 3), 'SIZE[/PATCH[xTIME]]'),
  ],
)
def test_bad_options_are_config_errors(kw, shape, message):
  with pytest.raises(ConfigError, match=message.replace('[', r'\[').replace('(', r'\(')):
    vivit.ViViT(3, shape, **(TINY | kw), rngs=nnx.Rngs(0))


def test_variant_strings():
  assert vivit.decode_variant('B/16x2') == dict(
    width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=16, tubelet_time=2
  )
  assert vivit.decode_variant('Ti/16') == dict(width=192, depth=12, mlp_dim=768, num_heads=3, patch_size=16)
