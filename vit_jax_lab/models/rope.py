"""Rotary position embeddings (RoPE, Su et al. 2021) over a 2-D patch grid, as timm's and DINOv3's ViTs define them.

Each attention head's queries and keys are turned, pair of channels by pair, by angles that grow with the patch's
position; their dot product then depends on the positions' difference alone. The leading tokens (class, register)
are not turned. Three kinds (model.rope):

- 'axial' (Heo et al. 2024 "RoPE-ViT"; timm's `rope_type='cat'`): the first half of the pairs turns with one
  coordinate, the second half with the other, at frequencies temperature^(-k / n), k < n = head_dim / 4; pairs are
  adjacent channels (2i, 2i + 1). Coordinates are patch indices, rescaled to `ref_grid` patches when set (EVA's
  `ref_feat_shape`: fine-tuned at another size, positions span the pre-training grid).
- 'mixed' (RoPE-Mixed): every block and head has learned frequencies for both coordinates (`freqs`, which a
  checkpoint holds), each pair turning by f_x x + f_y y.
- 'dinov3' (Siméoni et al. 2025): the axial frequencies on coordinates centred in their patch and spread over
  [-1, 1], times 2 pi; pair i is channels (i, i + head_dim / 2) (rotate-half).

Another image size computes the angles of its own grid, as timm does for a model built at that size.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_jax_lab.errors import ConfigError

KINDS = ('axial', 'mixed', 'dinov3')
AXES = ('xy', 'ij')


def check(kind: str | None, head_dim: int, temperature: float, axes: str, ref_grid: int | None, offset: float) -> None:
  """The rope keys of a model, each mistake one line, whether or not model.rope is set."""
  if isinstance(offset, bool) or not isinstance(offset, (int, float)):
    raise ConfigError(f'model.rope_offset={offset!r} must be a number')
  if kind is not None and kind not in KINDS:
    raise ConfigError(f'model.rope={kind!r} is not one of None, {", ".join(map(repr, KINDS))}')
  if axes not in AXES:
    raise ConfigError(f'model.rope_axes={axes!r} is not one of {", ".join(map(repr, AXES))}')
  if kind is not None and head_dim % 4:
    raise ConfigError(
      f'model.rope={kind!r} turns pairs of channels by two coordinates: the head width {head_dim} '
      'must be a multiple of 4 (model.width / model.num_heads)'
    )
  if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
    raise ConfigError(f'model.rope_temperature={temperature!r} must be a positive number')
  if ref_grid is not None and (isinstance(ref_grid, bool) or not isinstance(ref_grid, int) or ref_grid <= 0):
    raise ConfigError(f'model.rope_ref_grid={ref_grid!r} must be a positive integer (patches per side) or None')


def coordinates(grid: tuple[int, int], kind: str, axes: str, ref_grid: int | None, offset: float = 0.0) -> np.ndarray:
  """(tokens, 2) float32 coordinates of the patches in row-major order: (column, row) for 'xy', (row, column) for
  'ij'; `offset` added to every index first (timm's rope_grid_offset). The turned patches' scores with the unturned
  class and register tokens see these absolute positions, so the offset matters where there are such tokens."""
  sides = grid[::-1] if axes == 'xy' else grid
  shift = np.float32(offset)
  if kind == 'dinov3':
    ticks = [(np.arange(s, dtype=np.float32) + np.float32(0.5) + shift) / np.float32(s) for s in sides]
    ticks = [np.float32(2) * t - np.float32(1) for t in ticks]
  else:
    ticks = [np.arange(s, dtype=np.float32) + shift for s in sides]
    if ref_grid is not None:
      ticks = [t / np.float32(s) * np.float32(ref_grid) for t, s in zip(ticks, sides)]
  mesh = np.meshgrid(*ticks, indexing=axes)  # Each (rows, columns).
  return np.stack(mesh, axis=-1).reshape(-1, 2)


def axial_angles(
  grid: tuple[int, int],
  head_dim: int,
  kind: str,
  temperature: float,
  axes: str,
  ref_grid: int | None,
  offset: float = 0.0,
) -> np.ndarray:
  """(tokens, 1, head_dim / 2) float32 angles of 'axial' or 'dinov3': the first coordinate's pairs, then the
  second's."""
  n = head_dim // 4
  bands = np.float32(1) / np.float32(temperature) ** (np.arange(n, dtype=np.float32) / np.float32(n))
  coords = coordinates(grid, kind, axes, ref_grid, offset)
  angles = (coords[:, :, None] * bands).reshape(len(coords), 1, 2 * n)
  return angles * np.float32(2 * math.pi) if kind == 'dinov3' else angles


def mixed_init(key: jax.Array, depth: int, num_heads: int, head_dim: int, temperature: float) -> jax.Array:
  """RoPE-Mixed's initial frequencies (2, depth, heads, head_dim / 2): the axial magnitudes, turned by a random
  angle per block and head (the x and y frequencies of pair k and k + head_dim / 4 are a quarter turn apart)."""
  magnitude = 1.0 / temperature ** (jnp.arange(0, head_dim, 4, dtype=jnp.float32) / head_dim)
  turn = jax.random.uniform(key, (depth, num_heads, 1)) * 2 * jnp.pi
  fx = jnp.concatenate([magnitude * jnp.cos(turn), magnitude * jnp.cos(turn + jnp.pi / 2)], axis=-1)
  fy = jnp.concatenate([magnitude * jnp.sin(turn), magnitude * jnp.sin(turn + jnp.pi / 2)], axis=-1)
  return jnp.stack([fx, fy])


class Rotary:
  """The angles of one model's tokens, applied to the queries and keys of every block (`layers.Attention`):
  `sin`, `cos` (depth or 1, tokens, heads or 1, head_dim / 2); `half`: pairs (i, i + head_dim / 2), else
  (2i, 2i + 1); `skip`: the leading tokens left unturned."""

  def __init__(self, angles: jax.Array, half: bool, skip: int):
    self.sin, self.cos, self.half, self.skip = jnp.sin(angles), jnp.cos(angles), half, skip

  def __call__(self, x: jax.Array, layer: int | jax.Array) -> jax.Array:
    """Queries or keys (batch, tokens, heads, head_dim), block `layer`'s angles applied to the tokens after
    `skip`."""
    pick = (lambda t: t[0]) if self.sin.shape[0] == 1 else (lambda t: jax.lax.dynamic_index_in_dim(t, layer, 0, False))
    sin, cos = pick(self.sin).astype(x.dtype), pick(self.cos).astype(x.dtype)
    head, tail = x[:, : self.skip], x[:, self.skip :]
    if self.half:
      a, b = jnp.split(tail, 2, axis=-1)
      turned = jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    else:
      pairs = tail.reshape(*tail.shape[:-1], -1, 2)
      a, b = pairs[..., 0], pairs[..., 1]
      turned = jnp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(tail.shape)
    return jnp.concatenate([head, turned], axis=1)


class Rope(nnx.Module):
  """A ViT's rotary embedding: the fixed angles of 'axial' and 'dinov3', or 'mixed''s learned frequencies
  `freqs` (2, depth, heads, head_dim / 2)."""

  def __init__(
    self,
    kind: str,
    grid: tuple[int, int],
    depth: int,
    num_heads: int,
    head_dim: int,
    *,
    temperature: float,
    axes: str,
    ref_grid: int | None,
    offset: float,
    skip: int,
    rngs: nnx.Rngs,
  ):
    self.kind, self.skip = kind, skip
    if kind == 'mixed':
      self.coords = coordinates(grid, kind, axes, None, offset)
      self.freqs = nnx.Param(mixed_init(rngs.params(), depth, num_heads, head_dim, temperature))
    else:
      self.angles = axial_angles(grid, head_dim, kind, temperature, axes, ref_grid, offset)

  def __call__(self) -> Rotary:
    if self.kind == 'mixed':
      f = self.freqs[...].astype(jnp.float32)
      x, y = (jnp.asarray(self.coords[:, i])[None, :, None, None] for i in (0, 1))
      return Rotary(x * f[0][:, None] + y * f[1][:, None], half=False, skip=self.skip)
    return Rotary(jnp.asarray(self.angles)[None], half=self.kind == 'dinov3', skip=self.skip)
