"""Rotary position embeddings (RoPE, Su et al. 2021) over a 2-D patch grid, as timm's and DINOv3's ViTs define them,
and over a video's 3-D tubelet grid, as V-JEPA 2 does.

Each attention head's queries and keys are turned, pair of channels by pair, by angles that grow with the patch's
position; their dot product then depends on the positions' difference alone. The leading tokens (class, register)
are not turned. The kinds (model.rope):

- 'axial' (Heo et al. 2024 "RoPE-ViT"; timm's `rope_type='cat'`): the first half of the pairs turns with one
  coordinate, the second half with the other, at frequencies temperature^(-k / n), k < n = head_dim / 4; pairs are
  adjacent channels (2i, 2i + 1). Coordinates are patch indices, rescaled to `ref_grid` patches when set (EVA's
  `ref_feat_shape`: fine-tuned at another size, positions span the pre-training grid).
- 'mixed' (RoPE-Mixed): every block and head has learned frequencies for both coordinates (`freqs`, which a
  checkpoint holds), each pair turning by f_x x + f_y y.
- 'dinov3' (Siméoni et al. 2025): the axial frequencies on coordinates centred in their patch and spread over
  [-1, 1], times 2 pi; pair i is channels (i, i + head_dim / 2) (rotate-half).
- 'vjepa2' (Assran et al. 2025, the ViViT's): three equal slices of d = 2 floor(head_dim / 6) channels turn with the
  tubelet's time, row and column index, the rest unturned. In each slice channel j turns at 10000^(-(j mod d/2) /
  (d/2)) and pairs are adjacent channels, so the two channels of a pair turn at different rates: V-JEPA 2's own
  (and transformers') arithmetic, which is not a rotation; its scores are not a function of offsets alone.

Another image size computes the angles of its own grid, as timm does for a model built at that size.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_jax_lab.errors import ConfigError

KINDS = ('axial', 'mixed', 'dinov3')  # Over an image's patches (the ViT's).
VIDEO_KINDS = ('vjepa2',)  # Over a video's tubelets (the ViViT's).
AXES = ('xy', 'ij')


def check_kind(kind: str | None, kinds: tuple[str, ...]) -> None:
  """model.rope is None or one of `kinds` (the family's), in one line."""
  if kind is not None and kind not in kinds:
    raise ConfigError(f'model.rope={kind!r} is not one of None, {", ".join(map(repr, kinds))}')


# Bounds past every model's values, within float32: a larger offset loses the patch indices' precision, a larger
# base overflows the frequencies (1e300 trained with NumPy's overflow warnings; an offset of 1e300 died at step 1).
MAX_OFFSET = 10_000
MAX_BASE = 1e9


def check(kind: str | None, head_dim: int, temperature: float, axes: str, ref_grid: int | None, offset: float) -> None:
  """The rope keys of a ViT, each mistake one line, whether or not model.rope is set."""
  if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not abs(offset) <= MAX_OFFSET:
    raise ConfigError(
      f'model.rope_offset={offset!r} must be a number from -{MAX_OFFSET:,} to {MAX_OFFSET:,} (added to each patch '
      'index; Perception Encoder: 1)'
    )
  check_kind(kind, KINDS)
  if axes not in AXES:
    raise ConfigError(f'model.rope_axes={axes!r} is not one of {", ".join(map(repr, AXES))}')
  if kind is not None and head_dim % 4:
    raise ConfigError(
      f'model.rope={kind!r} turns pairs of channels by two coordinates: the head width {head_dim} '
      'must be a multiple of 4 (model.width / model.num_heads)'
    )
  if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature <= MAX_BASE:
    raise ConfigError(
      f'model.rope_temperature={temperature!r} must be a positive number up to {MAX_BASE:.0e} (the base of the '
      'frequencies: 100 for RoPE-ViT, 10,000 for timm)'
    )
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


def vjepa2_angles(grid: tuple[int, int, int], head_dim: int) -> np.ndarray:
  """(tokens, 1, head_dim) float32 angles of each channel of V-JEPA 2's tubelets on `grid` (time, rows, columns),
  time-major: for each axis a slice of d = 2 floor(head_dim / 6) channels, channel j at its index times
  10000^(-(j mod d/2) / (d/2)); zero (unturned) past the three slices."""
  d = 2 * (head_dim // 6)
  bands = np.float32(1) / np.float32(10_000) ** (np.arange(d // 2, dtype=np.float32) / np.float32(d // 2))
  coords = np.stack(np.meshgrid(*(np.arange(s, dtype=np.float32) for s in grid), indexing='ij'), -1).reshape(-1, 3)
  angles = np.zeros((len(coords), 1, head_dim), np.float32)
  for axis in range(3):
    angles[:, 0, axis * d : (axis + 1) * d] = coords[:, axis : axis + 1] * np.tile(bands, 2)
  return angles


def per_channel(angles: jax.Array | np.ndarray, half: bool) -> jax.Array | np.ndarray:
  """Angles per pair (..., head_dim / 2) -> per channel (..., head_dim): both channels of pair i, (2i, 2i + 1), or
  (i, i + head_dim / 2) when `half`."""
  xp = jnp if isinstance(angles, jax.Array) else np
  return xp.concatenate([angles, angles], axis=-1) if half else xp.repeat(angles, 2, axis=-1)


class Rotary:
  """The angles of one model's tokens, applied to the queries and keys of every block (`layers.Attention`):
  `sin`, `cos` (depth or 1, tokens, heads or 1, head_dim), per channel; channel c is turned with its partner, c's
  pair (2i, 2i + 1), or (i, i + head_dim / 2) when `half`, as x_c cos_c -+ x_partner sin_c; `skip`: the leading
  tokens left unturned."""

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
      partner = jnp.concatenate([-b, a], axis=-1)
    else:
      pairs = tail.reshape(*tail.shape[:-1], -1, 2)
      partner = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(tail.shape)
    return jnp.concatenate([head, tail * cos + partner * sin], axis=1)


class Rope(nnx.Module):
  """A model's rotary embedding: the fixed angles of 'axial', 'dinov3' and 'vjepa2' (`grid`: time, rows, columns),
  or 'mixed''s learned frequencies `freqs` (2, depth, heads, head_dim / 2). `grids`: the tokens lie on several 2-D
  grids one after the other (the tracker's template and search crops), each one's coordinates spanning `ref_grid`
  patches ('mixed''s too), as a position table resampled to each grid spans the image; None: `grid` alone."""

  def __init__(
    self,
    kind: str,
    grid: tuple[int, ...],
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
    grids: tuple[tuple[int, int], ...] | None = None,
  ):
    # Only static values: the angles are computed when called (constants of the trace), never state.
    self.kind, self.skip, self.grid, self.head_dim = kind, skip, tuple(grid), head_dim
    self.grids = None if grids is None else tuple(tuple(g) for g in grids)
    self.temperature, self.axes, self.ref_grid, self.offset = temperature, axes, ref_grid, offset
    if kind == 'mixed':
      self.freqs = nnx.Param(mixed_init(rngs.params(), depth, num_heads, head_dim, temperature))

  def __call__(self) -> Rotary:
    grids, ref = self.grids or (self.grid,), self.ref_grid
    if self.kind == 'mixed':  # timm's RoPE-Mixed has no reference grid: only the tracker's crops give one.
      coords = np.concatenate(
        [coordinates(g, 'mixed', self.axes, ref if self.grids else None, self.offset) for g in grids]
      )
      f = self.freqs[...].astype(jnp.float32)
      x, y = (jnp.asarray(coords[:, i])[None, :, None, None] for i in (0, 1))
      return Rotary(per_channel(x * f[0][:, None] + y * f[1][:, None], False), half=False, skip=self.skip)
    if self.kind == 'vjepa2':
      angles = vjepa2_angles(self.grid, self.head_dim)
    else:
      pairs = np.concatenate(
        [axial_angles(g, self.head_dim, self.kind, self.temperature, self.axes, ref, self.offset) for g in grids]
      )
      angles = per_channel(pairs, self.kind == 'dinov3')
    return Rotary(jnp.asarray(angles)[None], half=self.kind == 'dinov3', skip=self.skip)
