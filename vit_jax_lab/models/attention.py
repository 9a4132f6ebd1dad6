"""Attention patterns that cost O(n): local windows, BigBird-style sparse attention and linear attention.

'full'    every token attends to every token: O(n^2) time and memory (`layers.Attention`'s own path).
'local'   the tokens after the global ones lie on a grid (1-D text, 2-D patches, 3-D tubelets), cut into blocks of
          `window` tokens along each axis; each block of queries attends to its block and the adjacent ones
          (3, 3x3 or 3x3x3 blocks), so a token sees between `window` and 2 `window` - 1 neighbours on either side
          along every axis. The global tokens (class token, the decoder's first token) attend to and are attended
          by every token (Longformer). O(n * 3^d * window^d).
'sparse'  BigBird (Zaheer et al. 2020): 'local' plus `random_blocks` random key blocks per query block, drawn
          once per layer (a fixed key folded with the layer number: the same in every step, run and device).
          O(n * (3^d + random_blocks) * window^d).
'linear'  kernelised attention (Katharopoulos et al. 2020): softmax(q k^T) v becomes phi(q) (phi(k)^T v) /
          phi(q) sum phi(k) with phi = elu + 1; causal attention uses prefix sums over chunks. O(n d^2).

The blocked patterns never build the n x n scores: keys are gathered per query block, scores are
(blocks, block, keys per block). `dense_mask` gives the equivalent n x n boolean mask (tests, attention maps).
"""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax_lab.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Kind:
  """What an attention kind supports. Models and checks ask this table, never a kind's name."""

  weights: bool  # Forms attention probabilities: attention maps, attention dropout, supervised attention.
  packing: bool  # Keeps sequences packed into one row apart (a mask over token pairs).
  blocked: bool  # Attends within blocks of a token grid: needs `window` and one grid of tokens.
  random: bool  # Adds `random_blocks` random key blocks per query block.
  cache: str  # Cached decoding keeps 'keys' (every past key and value) or 'sums' (running sums, constant size).
  # Every kind has a causal form and cached decoding.


KINDS = {
  'full': Kind(weights=True, packing=True, blocked=False, random=False, cache='keys'),
  'local': Kind(weights=True, packing=True, blocked=True, random=False, cache='keys'),
  'sparse': Kind(weights=True, packing=True, blocked=True, random=True, cache='keys'),
  'linear': Kind(weights=False, packing=False, blocked=False, random=False, cache='sums'),
}
PATTERNS = tuple(KINDS)
RANDOM_SEED = 0  # Sparse attention's random blocks: jax.random.key(RANDOM_SEED) folded with the layer number.
LINEAR_CHUNK = 64  # Causal linear attention: tokens per chunk of the quadratic within-chunk part.


def check(kind: str, window: int, random_blocks: int, attention_dropout: float = 0.0) -> None:
  """The attention options of a model's config, as one-line errors."""
  if kind not in KINDS:
    raise ConfigError(f'model.attention={kind!r} is not one of {", ".join(map(repr, KINDS))}')
  if KINDS[kind].blocked and (not isinstance(window, int) or window < 1):
    raise ConfigError(f'model.attention_window={window!r} must be a positive integer (tokens per block and axis)')
  if KINDS[kind].random and (not isinstance(random_blocks, int) or random_blocks < 0):
    raise ConfigError(f'model.attention_random_blocks={random_blocks!r} must be a non-negative integer')
  if not KINDS[kind].weights and attention_dropout > 0:
    raise ConfigError(
      f'model.attention_dropout={attention_dropout}: model.attention={kind!r} has no attention weights to drop; '
      'set it to 0'
    )


def attend(
  q: jax.Array, k: jax.Array, v: jax.Array, pattern: 'Pattern', mask: 'Mask | None', layer: int | jax.Array, dropout
) -> jax.Array:
  """Self-attention of heads (batch, tokens, heads, head_dim) in a pattern other than 'full'. `dropout`: None, or
  a function applied to the attention probabilities."""
  if KINDS[pattern.kind].blocked:
    return blocked_attention(q, k, v, pattern, mask, layer, dropout=dropout)
  return linear_attention(q, k, v, mask)


@dataclasses.dataclass(frozen=True)
class Pattern:
  """Which keys each query sees, fixed when the model is built.

  Attributes:
    kind: one of PATTERNS.
    window: block side along every grid axis ('local', 'sparse'); clipped to each axis's length.
    random_blocks: random key blocks per query block ('sparse').
    grid: the shape of the token grid after the global tokens, e.g. (14, 14) for a ViT's patches or (8, 14, 14)
      for a video's tubelets; None: one axis as long as the sequence (text).
    num_global: leading tokens that attend to, and are attended by, every token.
  """

  kind: str = 'full'
  window: int = 16
  random_blocks: int = 2
  grid: tuple[int, ...] | None = None
  num_global: int = 0

  def grid_for(self, n: int) -> tuple[int, ...]:
    """The grid of a sequence of n tokens."""
    if self.grid is None:
      return (n - self.num_global,)
    if math.prod(self.grid) + self.num_global != n:
      raise ValueError(f'{n} tokens do not fit the attention grid {self.grid} plus {self.num_global} global tokens')
    return self.grid


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Mask:
  """Which keys exist and may be seen, in factored form, so that no pattern has to build an n x n mask.

  Attributes:
    segments: (B, N) int ids of the sequence each token belongs to (0: padding); a query sees only keys of its
      own segment. None: every token is real and in one sequence.
    causal: a query sees only keys at or before it.
    packed: the rows may hold several sequences (segments beyond 1); 'linear' refuses them.
  """

  segments: jax.Array | None = None
  causal: bool = dataclasses.field(default=False, metadata=dict(static=True))
  packed: bool = dataclasses.field(default=False, metadata=dict(static=True))

  def dense(self, n: int) -> jax.Array | None:
    """The bool (B or 1, 1, N, N) mask of full attention; None when every key is visible."""
    mask = None
    if self.segments is not None:
      mask = self.segments[:, None, :, None] == self.segments[:, None, None, :]
    if self.causal:
      tril = jnp.tril(jnp.ones((n, n), bool))[None, None]
      mask = tril if mask is None else mask & tril
    return mask


# --- Blocked patterns: local and sparse --------------------------------------------------------------------------


def _tiling(pattern: Pattern, grid: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Block sides and blocks per axis of `grid`."""
  sides = tuple(min(pattern.window, n) for n in grid)
  return sides, tuple(-(-n // s) for n, s in zip(grid, sides))


def _to_tiles(x: jax.Array, grid: tuple[int, ...], sides: tuple[int, ...], counts: tuple[int, ...]) -> jax.Array:
  """(B, prod(grid), ...) in row-major grid order -> (B, blocks, tokens per block, ...), the grid padded."""
  b, rest = x.shape[0], x.shape[2:]
  d = len(grid)
  x = x.reshape(b, *grid, *rest)
  x = jnp.pad(x, [(0, 0)] + [(0, c * s - n) for n, s, c in zip(grid, sides, counts)] + [(0, 0)] * len(rest))
  x = x.reshape(b, *itertools.chain(*zip(counts, sides)), *rest)
  order = [0] + [1 + 2 * i for i in range(d)] + [2 + 2 * i for i in range(d)]
  x = x.transpose(*order, *range(1 + 2 * d, x.ndim))
  return x.reshape(b, math.prod(counts), math.prod(sides), *rest)


def _from_tiles(x: jax.Array, grid: tuple[int, ...], sides: tuple[int, ...], counts: tuple[int, ...]) -> jax.Array:
  """The inverse of `_to_tiles`: (B, blocks, tokens per block, ...) -> (B, prod(grid), ...)."""
  b, rest = x.shape[0], x.shape[3:]
  d = len(grid)
  x = x.reshape(b, *counts, *sides, *rest)
  order = [0] + list(itertools.chain(*((1 + i, 1 + d + i) for i in range(d))))
  x = x.transpose(*order, *range(1 + 2 * d, x.ndim))
  x = x.reshape(b, *(c * s for c, s in zip(counts, sides)), *rest)
  x = x[(slice(None), *(slice(0, n) for n in grid))]
  return x.reshape(b, math.prod(grid), *rest)


def _slot_positions(pattern: Pattern, grid, sides, counts) -> np.ndarray:
  """(blocks, tokens per block): each tile slot's position in the sequence (globals first), -1 for padding."""
  return _np_tiles(pattern.num_global + np.arange(math.prod(grid)), grid, sides, counts)


def _np_tiles(x: np.ndarray, grid, sides, counts) -> np.ndarray:
  """`_to_tiles` in numpy for static index tables, with -1 in the padding."""
  d = len(grid)
  x = x.reshape(*grid) + 1
  x = np.pad(x, [(0, c * s - n) for n, s, c in zip(grid, sides, counts)])
  x = x.reshape(*itertools.chain(*zip(counts, sides)))
  x = x.transpose(*[2 * i for i in range(d)], *[2 * i + 1 for i in range(d)])
  return x.reshape(math.prod(counts), math.prod(sides)) - 1


def window_blocks(counts: tuple[int, ...], causal: bool) -> np.ndarray:
  """(blocks, neighbours): the blocks each query block attends to (its own and the adjacent ones along every
  axis, diagonals included), -1 where a neighbour falls off the grid. Causal (1-D) drops the block after."""
  offsets = [o for o in itertools.product((-1, 0, 1), repeat=len(counts)) if not (causal and o > (0,) * len(o))]
  coords = np.stack(np.unravel_index(np.arange(math.prod(counts)), counts), axis=-1)  # (blocks, d)
  table = []
  for offset in offsets:
    c = coords + np.asarray(offset)
    inside = np.all((c >= 0) & (c < np.asarray(counts)), axis=-1)
    table.append(np.where(inside, np.ravel_multi_index(tuple(np.clip(c, 0, np.asarray(counts) - 1).T), counts), -1))
  return np.stack(table, axis=-1)


def random_blocks(num_blocks: int, count: int, layer: int | jax.Array, causal: bool) -> jax.Array:
  """(num_blocks, count) random key blocks per query block of one layer; causal: blocks at or before the query's.
  Row i depends only on i and the layer, so a causal decoder draws the same blocks at every length."""
  key = jax.random.fold_in(jax.random.key(RANDOM_SEED), layer)
  rows = jnp.arange(num_blocks)
  u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i), (count,)))(rows)
  high = (rows + 1)[:, None] if causal else num_blocks
  return jnp.minimum(jnp.floor(u * high), high - 1).astype(jnp.int32)


def key_blocks(pattern: Pattern, counts: tuple[int, ...], causal: bool, layer: int | jax.Array) -> jax.Array:
  """(blocks, K) the key blocks of each query block, -1 for none (off the grid, or a repeat: each block once)."""
  table = jnp.asarray(window_blocks(counts, causal))
  if pattern.kind == 'sparse' and pattern.random_blocks:
    table = jnp.concatenate([table, random_blocks(math.prod(counts), pattern.random_blocks, layer, causal)], axis=1)
  k = table.shape[1]
  repeat = jnp.any((table[:, :, None] == table[:, None, :]) & jnp.tril(jnp.ones((k, k), bool), -1), axis=-1)
  return jnp.where(repeat, -1, table)


def blocked_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  pattern: Pattern,
  mask: Mask | None,
  layer: int | jax.Array = 0,
  dropout=None,
) -> jax.Array:
  """'local' or 'sparse' self-attention of heads (B, N, H, D) -> (B, N, H, D), in O(N).
  `dropout`: applied to the attention probabilities (a function of them)."""
  b, n, h, hd = q.shape
  g = pattern.num_global
  causal = mask is not None and mask.causal
  segments = None if mask is None else mask.segments
  grid = pattern.grid_for(n)
  if causal and len(grid) != 1:
    raise ValueError('causal blocked attention needs a 1-D token grid')
  sides, counts = _tiling(pattern, grid)
  scale = (1 / np.sqrt(hd)).astype(q.dtype)
  q = q * scale

  slots = jnp.asarray(_slot_positions(pattern, grid, sides, counts))  # (NB, BS)
  blocks = key_blocks(pattern, counts, causal, layer)  # (NB, K)
  key_pos = jnp.where(blocks[:, :, None] >= 0, slots[jnp.maximum(blocks, 0)], -1).reshape(blocks.shape[0], -1)
  q_pos = slots

  def tiles(x):
    return _to_tiles(x[:, g:], grid, sides, counts)

  def gather(t):  # (B, NB, BS, ...) -> (B, NB, K * BS, ...)
    y = t[:, jnp.maximum(blocks, 0)]
    return y.reshape(y.shape[0], y.shape[1], -1, *y.shape[4:])

  qt, kt, vt = tiles(q), tiles(k), tiles(v)
  keys, values = gather(kt), gather(vt)
  allowed = (key_pos >= 0)[None, :, None, :]  # (1 or B, blocks, queries, keys)
  if causal:
    allowed = allowed & (key_pos[:, None, :] <= q_pos[:, :, None])[None]
  if segments is not None:
    q_seg = _to_tiles(segments[:, g:, None], grid, sides, counts)[..., 0]  # (B, NB, BS)
    allowed = allowed & (q_seg[:, :, :, None] == gather(q_seg[..., None])[..., 0][:, :, None, :])
  if g:  # Every query also sees the global keys (of its segment).
    seen = jnp.ones((1, 1, 1, g), bool) if segments is None else q_seg[..., None] == segments[:, None, None, :g]
    shape = jnp.broadcast_shapes(allowed.shape[:-1], seen.shape[:-1])
    allowed = jnp.concatenate(
      [jnp.broadcast_to(allowed, (*shape, allowed.shape[-1])), jnp.broadcast_to(seen, (*shape, g))], axis=-1
    )
    keys = jnp.concatenate([keys, jnp.broadcast_to(k[:, None, :g], (b, keys.shape[1], g, h, hd))], axis=2)
    values = jnp.concatenate([values, jnp.broadcast_to(v[:, None, :g], (b, values.shape[1], g, h, hd))], axis=2)
  logits = jnp.einsum('bnqhd,bnkhd->bhnqk', qt, keys)
  logits = jnp.where(allowed[:, None], logits, jnp.finfo(logits.dtype).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if dropout is not None:
    probs = dropout(probs)
  out = _from_tiles(jnp.einsum('bhnqk,bnkhd->bnqhd', probs, values), grid, sides, counts)
  if g:  # The global queries see every key (a few full rows).
    rows = jnp.ones((1, g, n), bool)
    if causal:
      rows = rows & (jnp.arange(n)[None, :] <= jnp.arange(g)[:, None])[None]
    if segments is not None:
      rows = rows & (segments[:, :g, None] == segments[:, None, :])
    glogits = jnp.einsum('bqhd,bkhd->bhqk', q[:, :g], k)
    glogits = jnp.where(rows[:, None], glogits, jnp.finfo(glogits.dtype).min)
    gprobs = jax.nn.softmax(glogits, axis=-1)
    if dropout is not None:
      gprobs = dropout(gprobs)
    out = jnp.concatenate([jnp.einsum('bhqk,bkhd->bqhd', gprobs, v), out], axis=1)
  return out


def dense_mask(pattern: Pattern, n: int, causal: bool = False, layer: int | jax.Array = 0) -> jax.Array:
  """The (N, N) bool mask of full attention equivalent to a blocked pattern (before segments)."""
  g = pattern.num_global
  grid = pattern.grid_for(n)
  sides, counts = _tiling(pattern, grid)
  slots = _slot_positions(pattern, grid, sides, counts)
  block_of = np.zeros(n, np.int32)
  for i, row in enumerate(slots):
    block_of[row[row >= 0]] = i
  blocks = key_blocks(pattern, counts, causal, layer)  # (NB, K)
  qb, kb = jnp.asarray(block_of)[:, None], jnp.asarray(block_of)[None, :]
  mask = jnp.any(blocks[qb] == kb[..., None], axis=-1)
  is_global = jnp.arange(n) < g
  mask = mask | is_global[:, None] | is_global[None, :]
  if causal:
    mask = mask & jnp.tril(jnp.ones((n, n), bool))
  return mask


def causal_row(pattern: Pattern, index: jax.Array, length: int, layer: int | jax.Array = 0) -> jax.Array:
  """(length,) bool: the keys query `index` of a causal 1-D sequence sees (cached decoding)."""
  g = pattern.num_global
  positions = jnp.arange(length)
  sides, counts = _tiling(pattern, (length - g,))
  block = (positions - g) // sides[0]
  query_block = (index - g) // sides[0]
  seen = (block == query_block) | (block == query_block - 1)
  if pattern.kind == 'sparse' and pattern.random_blocks:
    drawn = random_blocks(counts[0], pattern.random_blocks, layer, causal=True)[jnp.maximum(query_block, 0)]
    seen = seen | jnp.any(block[:, None] == drawn[None, :], axis=-1)
  seen = seen | (positions < g) | (index < g)
  return seen & (positions <= index)


# --- Linear attention ----------------------------------------------------------------------------------------------


def feature_map(x: jax.Array) -> jax.Array:
  """phi(x) = elu(x) + 1 > 0, in float32 (sums over many tokens)."""
  return jax.nn.elu(x.astype(jnp.float32)) + 1


def linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: Mask | None) -> jax.Array:
  """Heads (B, N, H, D) -> (B, N, H, D): phi(q) (sum_k phi(k) v^T) / (phi(q) . sum_k phi(k)), over the keys the
  mask allows (padding dropped; causal: keys at or before the query, by prefix sums over chunks)."""
  if mask is not None and mask.packed:
    raise ValueError("model.attention='linear' does not take packed sequences")
  fq, fk, vf = feature_map(q), feature_map(k), v.astype(jnp.float32)
  if mask is not None and mask.segments is not None:
    fk = fk * (mask.segments > 0)[:, :, None, None]
  if mask is None or not mask.causal:
    kv = jnp.einsum('bkhd,bkhe->bhde', fk, vf)
    num = jnp.einsum('bqhd,bhde->bqhe', fq, kv)
    den = jnp.einsum('bqhd,bhd->bqh', fq, fk.sum(axis=1))
  else:
    b, n, h, d = q.shape
    c = min(LINEAR_CHUNK, n)
    pad = -n % c
    fq, fk, vf = (
      jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, -1, c, h, x.shape[-1]) for x in (fq, fk, vf)
    )
    scores = jnp.einsum('bcqhd,bckhd->bchqk', fq, fk) * jnp.tril(jnp.ones((c, c), jnp.float32))
    states = jnp.einsum('bckhd,bckhe->bchde', fk, vf)
    sums = fk.sum(axis=2)  # (b, chunks, h, d)
    before = jnp.cumsum(states, axis=1) - states
    sums_before = jnp.cumsum(sums, axis=1) - sums
    num = jnp.einsum('bchqk,bckhe->bcqhe', scores, vf) + jnp.einsum('bcqhd,bchde->bcqhe', fq, before)
    den = scores.sum(-1).transpose(0, 1, 3, 2) + jnp.einsum('bcqhd,bchd->bcqh', fq, sums_before)
    num, den = num.reshape(b, -1, h, num.shape[-1])[:, :n], den.reshape(b, -1, h)[:, :n]
  return (num / jnp.where(den > 0, den, 1.0)[..., None]).astype(v.dtype)


def linear_cache(batch: int, heads: int, head_dim: int) -> dict[str, jax.Array]:
  """Causal linear attention's decoding state: sum phi(k) v^T and sum phi(k) of the tokens so far."""
  return {'kv': jnp.zeros((batch, heads, head_dim, head_dim), jnp.float32), 'z': jnp.zeros((batch, heads, head_dim))}


def linear_step(
  q: jax.Array, k: jax.Array, v: jax.Array, cache: dict[str, jax.Array]
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """One token per row, heads (B, 1, H, D): its causal linear attention output and the state with it added."""
  fq, fk = feature_map(q[:, 0]), feature_map(k[:, 0])
  kv = cache['kv'] + jnp.einsum('bhd,bhe->bhde', fk, v[:, 0].astype(jnp.float32))
  z = cache['z'] + fk
  out = jnp.einsum('bhd,bhde->bhe', fq, kv) / jnp.einsum('bhd,bhd->bh', fq, z)[..., None]
  return out[:, None].astype(v.dtype), {'kv': kv, 'z': z}
