"""ViT shapes, variants and options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import layers, vit


def abstract_logits(num_classes, input_shape, batch=2, **kwargs):
  def forward(images):
    return vit.ViT(num_classes, input_shape, rngs=nnx.Rngs(0), **kwargs)(images)
  return jax.eval_shape(forward, jax.ShapeDtypeStruct((batch, *input_shape), jnp.float32))


@pytest.mark.parametrize('variant, input_shape, num_classes', [
    ('mu/2', (8, 8, 1), 10), ('mu/4', (16, 24, 3), 7), ('Ti/16', (224, 224, 3), 1000),
    ('S/16', (64, 96, 3), 5), ('B/32', (384, 384, 3), 100), ('L/14', (224, 224, 3), 21843)])
@pytest.mark.parametrize('pool', ['tok', 'gap'])
def test_output_shape(variant, input_shape, num_classes, pool):
  assert abstract_logits(num_classes, input_shape, variant=variant, pool=pool).shape == (2, num_classes)


@pytest.mark.parametrize('variant, params', [('Ti/16', 5_717_416), ('S/16', 22_050_664), ('B/16', 86_567_656),
                                             ('B/32', 88_224_232), ('L/16', 304_326_632)])
def test_parameter_count_matches_the_published_models(variant, params):
  model = nnx.eval_shape(lambda: vit.ViT(1000, (224, 224, 3), variant=variant, rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == params


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
  conv = jax.lax.conv_general_dilated(images, model.embedding[...], (4, 4), 'VALID',
                                      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  np.testing.assert_allclose(model.embed(images), conv.reshape(2, 4, 64) + model.embedding_bias[...], atol=1e-5)


def test_options_change_the_function():
  images = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))
  kwargs = dict(variant='mu/2', head_zero_init=False, dropout=0.2, drop_path=0.2)
  base = vit.ViT(10, (8, 8, 1), rngs=nnx.Rngs(0), **kwargs)
  logits = base(images)
  assert np.all(np.asarray(vit.ViT(10, (8, 8, 1), variant='mu/2', rngs=nnx.Rngs(0))(images)) == 0)  # Zero head.
  for option in (dict(prenorm=False), dict(gelu_approximate=True), dict(pool='gap'), dict(posemb='sincos2d')):
    other = vit.ViT(10, (8, 8, 1), rngs=nnx.Rngs(0), **(kwargs | option))(images)
    assert not np.allclose(other, logits, atol=1e-4), option
  # Dropout and stochastic depth act in training only, and depend on the rngs given.
  np.testing.assert_array_equal(base(images, train=False), logits)
  a = base(images, train=True, rngs=nnx.Rngs(dropout=1))
  b = base(images, train=True, rngs=nnx.Rngs(dropout=2))
  assert not np.allclose(a, logits) and not np.allclose(a, b)
  np.testing.assert_array_equal(a, base(images, train=True, rngs=nnx.Rngs(dropout=1)))


def test_stochastic_depth_rises_linearly():
  encoder = vit.ViT(10, (8, 8, 1), variant='mu/2', drop_path=0.3, rngs=nnx.Rngs(0)).encoder
  np.testing.assert_allclose([b.drop_path.rate for b in encoder.blocks], [0.0, 0.1, 0.2, 0.3])


def test_sincos_embedding_is_distinct_per_position():
  emb = layers.sincos_2d(4, 6, 32)
  assert emb.shape == (24, 32)
  assert len({tuple(np.round(row, 5)) for row in emb}) == 24
