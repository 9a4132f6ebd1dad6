"""ViT shapes, variants and options."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_jax_lab import cost
from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import layers, vit


def abstract_logits(num_classes, input_shape, batch=2, **kwargs):
  def forward(images):
    return vit.ViT(num_classes, input_shape, rngs=nnx.Rngs(0), **kwargs)(images)

  return jax.eval_shape(forward, jax.ShapeDtypeStruct((batch, *input_shape), jnp.float32))


@pytest.mark.parametrize(
  'variant, input_shape, num_classes',
  [
    ('mu/2', (8, 8, 1), 10),
    ('mu/4', (16, 24, 3), 7),
    ('Ti/16', (224, 224, 3), 1000),
    ('S/16', (64, 96, 3), 5),
    ('B/32', (384, 384, 3), 100),
    ('L/14', (224, 224, 3), 21843),
  ],
)
@pytest.mark.parametrize('pool', ['tok', 'gap'])
def test_output_shape(variant, input_shape, num_classes, pool):
  assert abstract_logits(num_classes, input_shape, variant=variant, pool=pool).shape == (2, num_classes)


PUBLISHED = {
  'Ti/16': (5_717_416, 1.25),
  'S/16': (22_050_664, 4.60),
  'B/16': (86_567_656, 17.56),
  'B/32': (88_224_232, 4.41),
  'L/16': (304_326_632, 61.55),
  'L/32': (306_535_400, None),
  'H/14': (632_045_800, 167.3),
}


@pytest.mark.parametrize('variant', PUBLISHED)
def test_parameters_and_macs_match_the_published_models(variant):
  params, gmacs = PUBLISHED[variant]
  fn, args = cost.forward(lambda: vit.ViT(1000, (224, 224, 3), variant=variant, rngs=nnx.Rngs(0)), (224, 224, 3))
  assert cost.param_count(args[0]) == params
  if gmacs is not None:
    assert abs(cost.matmul_macs(fn, *args) / 1e9 / gmacs - 1) < 0.03


def test_macs_count_matmuls_exactly():
  """A hand-counted case: one 3x4 @ 4x5 matmul inside a scan of length 2, and a 1x1 convolution."""
  x, w = jnp.ones((3, 4)), jnp.ones((4, 5))

  def scanned(x, w):
    return jax.lax.scan(lambda c, _: (c, x @ w), 0.0, None, length=2)[1]

  assert cost.matmul_macs(scanned, x, w) == 2 * 3 * 4 * 5

  def conv(x, k):
    return jax.lax.conv_general_dilated(x, k, (1, 1), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))

  assert cost.matmul_macs(conv, jnp.ones((2, 6, 6, 3)), jnp.ones((1, 1, 3, 8))) == 2 * 36 * 8 * 3


def test_variant_string_and_overrides():
  assert vit.decode_variant('B/16') == dict(width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=16)
  assert 'patch_size' not in vit.decode_variant('L')
  model = nnx.eval_shape(lambda: vit.ViT(10, (32, 32, 3), variant='Ti/16', depth=2, patch_size=8, rngs=nnx.Rngs(0)))
  assert len(model.encoder.blocks) == 2 and model.grid == (4, 4)
  with pytest.raises(ConfigError, match='model.patch_size is not set'):
    vit.ViT(10, (32, 32, 3), variant='Ti', rngs=nnx.Rngs(0))


def test_token_layout():
  tok = vit.ViT(10, (8, 12, 1), variant='mu/2', pool='tok', rngs=nnx.Rngs(0))
  gap = vit.ViT(10, (8, 12, 1), variant='mu/2', pool='gap', rngs=nnx.Rngs(0))
  assert tok.pos_embedding.shape == (1, 4 * 6 + 1, 64)  # Class token first, then a 4x6 grid.
  assert gap.pos_embedding.shape == (1, 4 * 6, 64)
  sincos = vit.ViT(10, (8, 12, 1), variant='mu/2', posemb='sincos2d', rngs=nnx.Rngs(0))
  assert not hasattr(sincos, 'pos_embedding')


def test_patch_embedding_equals_strided_convolution():
  model = vit.ViT(10, (8, 8, 3), variant='mu/4', rngs=nnx.Rngs(0))
  images = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  conv = jax.lax.conv_general_dilated(
    images, model.embedding.kernel[...], (4, 4), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
  )
  np.testing.assert_allclose(model.embedding(images), conv.reshape(2, 4, 64) + model.embedding.bias[...], atol=1e-5)


@pytest.mark.slow
def test_options_change_the_function():
  images = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))
  kwargs = dict(variant='mu/2', head_zero_init=False, dropout=0.2, drop_path=0.2)
  base = vit.ViT(10, (8, 8, 1), rngs=nnx.Rngs(0), **kwargs)
  logits = base(images)
  assert np.all(np.asarray(vit.ViT(10, (8, 8, 1), variant='mu/2', rngs=nnx.Rngs(0))(images)) == 0)  # Zero head.
  for option in (
    dict(prenorm=False),
    dict(gelu_approximate=True),
    dict(pool='gap'),
    dict(pool='map'),
    dict(posemb='sincos2d'),
    dict(representation_size=16),
    dict(layernorm_epsilon=1e-2),
  ):
    other = vit.ViT(10, (8, 8, 1), rngs=nnx.Rngs(0), **(kwargs | option))(images)
    assert not np.allclose(other, logits, atol=1e-4), option
  # Dropout and stochastic depth act in training only, and depend on the rngs given.
  np.testing.assert_array_equal(base(images, train=False), logits)
  a = base(images, train=True, rngs=nnx.Rngs(dropout=1))
  b = base(images, train=True, rngs=nnx.Rngs(dropout=2))
  assert not np.allclose(a, logits) and not np.allclose(a, b)
  np.testing.assert_array_equal(a, base(images, train=True, rngs=nnx.Rngs(dropout=1)))


def test_explicit_attention_equals_fused_attention():
  """The explicit heads-major path (attention dropout; float16 without cuDNN; every CPU) equals
  jax.nn.dot_product_attention in value and gradient, with and without a mask; dropout changes it."""
  attn = layers.Attention(32, 4, dropout=0.0, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 5, 32))
  heads = attn.heads(x)
  cotangent = jax.random.normal(jax.random.key(3), heads[0].shape)
  for mask in (None, jnp.tril(jnp.ones((5, 5), bool))[None, None]):

    def ours(q, k, v):
      return attn.attend(q, k, v, train=False, rngs=None, mask=mask)

    def fused(q, k, v):
      return jax.nn.dot_product_attention(q, k, v, mask=mask)

    np.testing.assert_allclose(ours(*heads), fused(*heads), atol=1e-5)

    def grad(f):
      return jax.grad(lambda *a: jnp.sum(f(*a) * cotangent), argnums=(0, 1, 2))(*heads)

    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grad(ours), grad(fused))
  explicit = jnp.einsum('bhqk,bkhd->bqhd', attn.weights(x), heads[2]).reshape(2, 5, 32)
  np.testing.assert_allclose(attn(x), attn.out(explicit), atol=1e-5)
  attn.dropout.rate = 0.5
  dropped = attn(x, train=True, rngs=nnx.Rngs(dropout=0))
  assert not np.allclose(dropped, attn(x)) and np.allclose(attn(x, train=False), attn.out(explicit), atol=1e-5)
  probs = attn.weights(x)
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  context = jax.random.normal(jax.random.key(2), (2, 7, 32))
  assert attn(x, context).shape == (2, 5, 32) and attn.weights(x, context).shape == (2, 4, 5, 7)


def test_padded_attention_equals_unpadded_attention():
  """What cuDNN attention runs (layers.padded_attention), through XLA here: the padded keys get no weight, in the
  outputs and their gradients; self- and cross-attention lengths."""
  q = jax.random.normal(jax.random.key(0), (2, 13, 3, 8))
  kv = jax.random.normal(jax.random.key(1), (2, 2, 21, 3, 8))

  def loss(attend, q, k, v):
    return jnp.sum(jnp.sin(attend(q, k, v)))

  padded = functools.partial(layers.padded_attention, multiple=16, implementation='xla')
  plain = functools.partial(jax.nn.dot_product_attention, implementation='xla')
  grads = jax.jit(jax.grad(loss, argnums=(1, 2, 3)), static_argnums=0)
  for k, v in [(q, q), tuple(kv)]:
    np.testing.assert_allclose(jax.jit(padded)(q, k, v), jax.jit(plain)(q, k, v), rtol=1e-5, atol=1e-6)
    got, want = grads(padded, q, k, v), grads(plain, q, k, v)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


def test_attention_maps_one_per_block():
  model = vit.ViT(10, (8, 8, 1), variant='mu/2', pool='tok', rngs=nnx.Rngs(0))
  maps = model.attention_maps(jnp.ones((3, 8, 8, 1)))
  assert len(maps) == 4 and maps[0].shape == (3, 4, 17, 17)
  np.testing.assert_allclose(maps[-1].sum(-1), 1.0, rtol=1e-5)


def test_stochastic_depth_rises_linearly():
  encoder = vit.ViT(10, (8, 8, 1), variant='mu/2', drop_path=0.3, rngs=nnx.Rngs(0)).encoder
  np.testing.assert_allclose([b.drop_path.rate for b in encoder.blocks], [0.0, 0.1, 0.2, 0.3])


def test_sincos_embedding_is_distinct_per_position():
  emb = layers.sincos_2d(4, 6, 32)
  assert emb.shape == (24, 32)
  assert len({tuple(np.round(row, 5)) for row in emb}) == 24


def test_the_families_import_by_class_name_and_say_what_a_call_lacks():
  """The library use docs/models.md shows: `from vit_jax_lab.models import ViT`; a wrong image size and a training
  call without rngs are errors that say what the model needs."""
  import vit_jax_lab
  from vit_jax_lab.models import ViT, ViViT

  assert ViT is vit.ViT and ViViT.__name__ == 'ViViT'
  assert vit_jax_lab.__version__ not in ('', None)
  model = ViT(num_classes=3, input_shape=(8, 8, 1), variant='mu/2', dropout=0.1, rngs=nnx.Rngs(0))
  assert model(jnp.ones((2, 8, 8, 1))).shape == (2, 3)
  with pytest.raises(ValueError, match=r'this ViT takes a batch of images \(B, \*\(8, 8, 1\)\), got \(1, 16, 16, 1\)'):
    model(jnp.ones((1, 16, 16, 1)))
  with pytest.raises(ValueError, match=r'got \(8, 8, 1\)'):  # No batch axis.
    model(jnp.ones((8, 8, 1)))
  clips = ViViT(
    num_classes=3,
    input_shape=(4, 8, 8, 1),
    patch_size=4,
    tubelet_time=2,
    width=8,
    depth=1,
    mlp_dim=8,
    num_heads=2,
    rngs=nnx.Rngs(0),
  )
  assert clips(jnp.ones((2, 4, 8, 8, 1))).shape == (2, 3)
  with pytest.raises(
    ValueError, match=r'this ViViT takes a batch of clips \(B, \*\(4, 8, 8, 1\)\), got \(1, 8, 8, 8, 1\)'
  ):
    clips(jnp.ones((1, 8, 8, 8, 1)))  # 8 frames, not 4: was a broadcasting TypeError.
  with pytest.raises(ValueError, match=r'train=True with dropout or stochastic depth needs rngs: call model\(x, '):
    model(jnp.ones((1, 8, 8, 1)), train=True)
  assert model(jnp.ones((1, 8, 8, 1)), train=True, rngs=nnx.Rngs(dropout=1)).shape == (1, 3)


def test_the_cnn_predicts_each_image_alone_and_alike_on_1_and_8_devices():
  """models/cnn.py, configs/vit/folder.py's model from scratch: GroupNorm keeps no batch statistics, so an image's
  logits do not depend on the batch it comes in nor on how the batch is sharded; its sizes are config keys, and a
  too-small image or a width the groups do not divide is one line."""
  from vit_jax_lab import models
  from vit_jax_lab.models import CNN

  config = models.config('cnn', widths=(8, 16, 16), groups=4, head_zero_init=False)
  model = models.build(config, nnx.Rngs(0), num_classes=3, input_shape=(16, 16, 3))
  assert isinstance(model, CNN) and model.offers('features') and not model.offers('attention_maps')
  images = jax.random.normal(jax.random.key(1), (8, 16, 16, 3))
  together = np.asarray(model(images))
  alone = np.concatenate([np.asarray(model(images[i : i + 1])) for i in range(8)])
  np.testing.assert_allclose(alone, together, atol=1e-5)
  assert together.shape == (8, 3) and np.ptp(together, axis=0).min() > 1e-3  # Different images, different logits.
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('data',))
  spread = jax.device_put(images, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')))
  sharded = nnx.jit(lambda m, x: m(x))(model, spread)
  assert len(sharded.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(sharded), together, atol=1e-5)
  with pytest.raises(ConfigError, match=r'3 stages halve the images 3 times: 4x4 is too small; raise data.image_size'):
    models.build(config, nnx.Rngs(0), num_classes=3, input_shape=(4, 4, 3))
  with pytest.raises(ConfigError, match=r'model.widths=\(8, 6\) must be positive integers, each divisible by'):
    models.build(models.config('cnn', widths=(8, 6), groups=4), nnx.Rngs(0), num_classes=3, input_shape=(16, 16, 3))
