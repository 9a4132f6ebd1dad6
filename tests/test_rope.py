"""Rotary position embeddings (models/rope.py, model.rope): what makes them rotary, and the ViT keys around them.
That they equal timm's RoPE ViTs and DINOv3 is tests/test_pretrained.py's (the rope_* and dinov3 rows)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_jax_lab import config as config_lib, optim, tasks, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import layers, rope, vit

GRID = (5, 6)


def scores(rotary: rope.Rotary, q: jax.Array, k: jax.Array, layer: int = 0) -> np.ndarray:
  """(tokens, tokens) dot products of the turned queries and keys of one head."""
  return np.asarray(jnp.einsum('bqhd,bkhd->bqk', rotary(q, layer), rotary(k, layer))[0])


@pytest.mark.parametrize('kind', ['axial', 'mixed', 'dinov3'])
def test_scores_depend_on_the_positions_difference_alone(kind):
  """The same query and key at every patch: a score is a function of the two patches' offset, whatever kind; the
  leading (class) token is not turned."""
  head_dim = 8
  model = rope.Rope(
    kind, GRID, 2, 1, head_dim, temperature=10.0, axes='ij', ref_grid=None, offset=1.5, skip=1, rngs=nnx.Rngs(0)
  )
  rotary = model()
  n = GRID[0] * GRID[1]
  q = jnp.broadcast_to(jax.random.normal(jax.random.key(1), (head_dim,)), (1, n + 1, 1, head_dim))
  k = jnp.broadcast_to(jax.random.normal(jax.random.key(2), (head_dim,)), (1, n + 1, 1, head_dim))
  np.testing.assert_array_equal(np.asarray(rotary(q, 1))[0, 0], np.asarray(q)[0, 0])
  s = scores(rotary, q, k, layer=1)[1:, 1:].reshape(*GRID, *GRID)
  by_offset = {}
  for r, c, r2, c2 in np.ndindex(*GRID, *GRID):
    by_offset.setdefault((r2 - r, c2 - c), []).append(s[r, c, r2, c2])
  spread = max(np.ptp(v) for v in by_offset.values())
  assert spread < 1e-5, spread
  assert np.ptp([v[0] for v in by_offset.values()]) > 0.1  # And it does depend on the offset.


def test_axial_pairs_turn_with_one_coordinate_each():
  """'xy': the first half of the pairs turns with the column, the second with the row; 'ij' the other way."""
  xy = rope.axial_angles(GRID, 8, 'axial', 100.0, 'xy', None)[:, 0]
  ij = rope.axial_angles(GRID, 8, 'axial', 100.0, 'ij', None)[:, 0]
  rows, cols = np.divmod(np.arange(GRID[0] * GRID[1]), GRID[1])
  bands = 100.0 ** -(np.arange(2) / 2)
  np.testing.assert_allclose(xy, np.concatenate([np.outer(cols, bands), np.outer(rows, bands)], axis=1), rtol=1e-6)
  np.testing.assert_allclose(ij, np.concatenate([np.outer(rows, bands), np.outer(cols, bands)], axis=1), rtol=1e-6)
  # A reference grid rescales positions: 6 columns spanning 12 patches are 2 apart.
  ref = rope.axial_angles((6, 6), 8, 'axial', 100.0, 'xy', 12)[:, 0]
  np.testing.assert_allclose(ref[:6, 0], 2.0 * np.arange(6), rtol=1e-6)


def small(**kwargs) -> vit.ViT:
  return vit.ViT(10, (24, 24, 3), variant='mu/4', head_zero_init=False, rngs=nnx.Rngs(0), **kwargs)


def test_mixed_frequencies_are_learned_and_round_trip_through_run_parameters():
  """RoPE-Mixed's frequencies get gradients; a run with every new key loads into the same model exactly."""
  kwargs = dict(rope='mixed', posemb='none', pool='gap', class_token=True, fc_norm=True, reg_tokens=2)
  model = small(**kwargs)
  images = jax.random.normal(jax.random.key(0), (2, 24, 24, 3))
  grads = nnx.grad(lambda m: jnp.sum(m(images) ** 2))(model)
  assert float(jnp.abs(grads['rope']['freqs'][...]).max()) > 0
  params = nnx.state(model, nnx.Param).to_pure_dict()
  assert not optim.decay_mask(params, vit.ViT.NO_DECAY)['rope']['freqs']  # As timm: no weight decay on them.
  a, b = small(**kwargs), vit.ViT(10, (24, 24, 3), variant='mu/4', rngs=nnx.Rngs(1), **kwargs)
  pa, pb = (jax.device_get(nnx.state(m, nnx.Param).to_pure_dict()) for m in (a, b))
  assert pa['rope']['freqs'].shape == (2, 4, 4, 8) and 'fc_norm' in pa and 'cls' in pa
  assert 'norm' not in pa['encoder']  # fc_norm replaces the encoder's final LayerNorm.
  loaded, notes = b.load_pretrained(pa, pb)
  assert notes == []
  jax.tree.map(np.testing.assert_array_equal, loaded, pa)


def test_rope_is_applied_alike_in_scanned_and_local_attention():
  """Scanned blocks turn as unscanned ones do; local attention over all tokens (window = grid) is full attention."""
  images = jax.random.normal(jax.random.key(0), (2, 24, 24, 3))
  for kind in ('axial', 'mixed'):
    plain = small(rope=kind)
    scanned = small(rope=kind, scan=True)
    state = nnx.state(scanned, nnx.Param)
    params = nnx.state(plain, nnx.Param).to_pure_dict()
    state.replace_by_pure_dict(layers.scanned_like(params, state.to_pure_dict()))
    nnx.update(scanned, state)
    np.testing.assert_allclose(scanned(images), plain(images), atol=2e-5)
    local = small(rope=kind, attention='local', attention_window=6)
    nnx.update(local, nnx.state(plain, nnx.Param))
    np.testing.assert_allclose(local(images), plain(images), atol=2e-5)
    assert len(plain.attention_maps(images)) == 4


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(rope='spiral'), "model.rope='spiral' is not one of None, 'axial', 'mixed', 'dinov3'"),
    (dict(rope='axial', num_heads=8, width=48), 'the head width 6 must be a multiple of 4'),
    (dict(rope='axial', attention='linear'), "model.attention='linear' \\(kernelised\\) has no such scores"),
    (dict(rope='axial', rope_axes='yx'), "model.rope_axes='yx' is not one of 'xy', 'ij'"),
    (dict(rope='axial', rope_ref_grid=0), 'model.rope_ref_grid=0 must be a positive integer'),
    (dict(rope='axial', rope_temperature=-1.0), 'model.rope_temperature=-1.0 must be a positive number'),
    (dict(rope='axial', rope_offset='one'), "model.rope_offset='one' must be a number"),
    (dict(rope_temperature=-1.0), 'model.rope_temperature=-1.0 must be a positive number'),  # Without model.rope too.
    (dict(rope='axial', rope_temperature=float('inf')), 'model.rope_temperature=inf must be a positive number up to'),
    (dict(rope='axial', rope_temperature=1e300), 'model.rope_temperature=1e\\+300 must be a positive number up to'),
    (dict(rope='axial', rope_offset=1e300), 'model.rope_offset=1e\\+300 must be a number from -10,000 to 10,000'),
    (dict(rope='axial', rope_offset=float('nan')), 'model.rope_offset=nan must be a number from'),
    (dict(rope_axes='yx'), "model.rope_axes='yx' is not one of 'xy', 'ij'"),
    (dict(map_heads=2), 'model.map_heads, model.map_mlp_dim and model.map_prefix set the attention pool: they need'),
    (dict(pool='map', map_heads=0), 'model.map_heads=0 must be a positive integer or None'),
    (dict(fc_norm=True), "model.fc_norm=True normalises the average pool: it needs model.pool='gap'"),
    (dict(class_token=False), "model.class_token=False, but model.pool='tok' reads the class token"),
  ],
)
def test_rope_and_pool_keys_refuse_in_one_line(kwargs, message):
  with pytest.raises(ConfigError, match=message):
    small(**kwargs)


def test_vjepa2_turns_three_slices_by_time_row_and_column_and_leaves_the_rest():
  """'vjepa2' (the ViViT's): head_dim 26 -> slices of 8 channels turned by the tubelet's time, row and column index,
  the last 2 channels as they are; a slice's output depends on its own coordinate alone."""
  grid, head_dim = (2, 3, 4), 26
  rotary = rope.Rope(
    'vjepa2', grid, 1, 1, head_dim, temperature=1e4, axes='ij', ref_grid=None, offset=0.0, skip=0, rngs=nnx.Rngs(0)
  )()
  n = int(np.prod(grid))
  q = jnp.broadcast_to(jax.random.normal(jax.random.key(1), (head_dim,)), (1, n, 1, head_dim))
  turned = np.asarray(rotary(q, 0))[0, :, 0].reshape(*grid, head_dim)
  np.testing.assert_array_equal(turned[..., 24:], np.broadcast_to(np.asarray(q)[0, 0, 0, 24:], (*grid, 2)))
  for axis in range(3):
    part = np.moveaxis(turned[..., axis * 8 : (axis + 1) * 8], axis, 0)
    assert np.ptp(part.reshape(grid[axis], -1, 8), axis=1).max() < 1e-6  # The same wherever the other two are.
    assert np.ptp(part[:, ...].reshape(grid[axis], -1)[:, :8], axis=0).max() > 1e-3  # And turns with its own.
  np.testing.assert_allclose(turned[0, 0, 0], np.asarray(q)[0, 0, 0], atol=1e-7)  # Index (0, 0, 0): angle 0.


def test_vjepa2_is_the_videos_and_the_others_the_images():
  with pytest.raises(ConfigError, match="model.rope='vjepa2' is not one of None, 'axial', 'mixed', 'dinov3'"):
    vit.ViT(10, (32, 32, 3), variant='mu/8', rope='vjepa2', rngs=nnx.Rngs(0))


def test_a_rotary_vit_sets_up_as_a_run_from_the_command_line(smoke_config):
  """train.setup / init_state as `python -m main --config.model.rope=axial --config.model.posemb=none` runs them
  (the command line reads none as None: the same key): the angles are no state of the run, the rotary model trains."""
  config = smoke_config()
  config_lib.apply_overrides(config, ['--config.model.rope=axial', '--config.model.posemb=none'])
  info, _ = tasks.build(config.task).synthetic_batch('32,32,3,10', config.data.batch_size)
  s = train.setup(config, data=(None, info))
  params = jax.device_get(train.init_state(s).params.to_pure_dict())
  assert 'rope' not in params and 'pos_embedding' not in params
  assert nnx.merge(s.graphdef, train.init_state(s).params).posemb_type == 'none'
