"""Transformer building blocks shared by every model family (Flax NNX)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

xavier = nnx.initializers.xavier_uniform()


def sincos_2d(height: int, width: int, features: int, temperature: float = 10_000.0) -> np.ndarray:
  """Fixed 2-D sine-cosine position embedding of shape (height * width, features) (MoCo v3)."""
  if features % 4:
    raise ValueError(f'width={features} must be divisible by 4 for sincos2d position embeddings')
  y, x = np.mgrid[:height, :width]
  omega = 1.0 / temperature ** (np.arange(features // 4) / (features // 4 - 1 or 1))
  y = y.reshape(-1, 1) * omega
  x = x.reshape(-1, 1) * omega
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


def gelu(x: jax.Array, approximate: bool) -> jax.Array:
  return jax.nn.gelu(x, approximate=approximate)


class Dropout(nnx.Module):
  """Dropout whose randomness comes from the call's `rngs`, so the train step stays a pure function.

  With `per_example=True` it drops whole examples of a residual branch: stochastic depth
  (Huang et al. 2016).
  """

  def __init__(self, rate: float, per_example: bool = False):
    self.rate = rate
    self.per_example = per_example

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None) -> jax.Array:
    if not train or self.rate == 0.0:
      return x
    shape = (x.shape[0],) + (1,) * (x.ndim - 1) if self.per_example else x.shape
    keep = jax.random.bernoulli(rngs.dropout(), 1.0 - self.rate, shape)
    return jnp.where(keep, x / (1.0 - self.rate), 0.0)


class SelfAttention(nnx.Module):
  """Multi-head self-attention through `jax.nn.dot_product_attention` (fused qkv projection)."""

  def __init__(self, width: int, num_heads: int, *, rngs: nnx.Rngs):
    self.num_heads = num_heads
    self.qkv = nnx.Linear(width, 3 * width, kernel_init=xavier, rngs=rngs)
    self.out = nnx.Linear(width, width, kernel_init=xavier, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    b, t, d = x.shape
    q, k, v = jnp.split(self.qkv(x).reshape(b, t, 3 * self.num_heads, d // self.num_heads), 3, axis=2)
    y = jax.nn.dot_product_attention(q, k, v, mask=mask)
    return self.out(y.reshape(b, t, d))


class Mlp(nnx.Module):
  """Two dense layers with GELU between them."""

  def __init__(self, width: int, mlp_dim: int, *, dropout: float, gelu_approximate: bool, rngs: nnx.Rngs):
    bias_init = nnx.initializers.normal(1e-6)
    self.fc1 = nnx.Linear(width, mlp_dim, kernel_init=xavier, bias_init=bias_init, rngs=rngs)
    self.fc2 = nnx.Linear(mlp_dim, width, kernel_init=xavier, bias_init=bias_init, rngs=rngs)
    self.dropout = Dropout(dropout)
    self.gelu_approximate = gelu_approximate

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None) -> jax.Array:
    x = self.dropout(gelu(self.fc1(x), self.gelu_approximate), train=train, rngs=rngs)
    return self.fc2(x)


class EncoderBlock(nnx.Module):
  """Self-attention and MLP, each in a residual branch; LayerNorm before (pre-norm) or after them."""

  def __init__(self, width: int, mlp_dim: int, num_heads: int, *, dropout: float, drop_path: float,
               prenorm: bool, gelu_approximate: bool, layernorm_epsilon: float, rngs: nnx.Rngs):
    self.prenorm = prenorm
    self.norm1 = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.attn = SelfAttention(width, num_heads, rngs=rngs)
    self.norm2 = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.mlp = Mlp(width, mlp_dim, dropout=dropout, gelu_approximate=gelu_approximate, rngs=rngs)
    self.dropout = Dropout(dropout)
    self.drop_path = Dropout(drop_path, per_example=True)

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None) -> jax.Array:
    def branch(y, fn):
      return self.drop_path(self.dropout(fn(y), train=train, rngs=rngs), train=train, rngs=rngs)

    if self.prenorm:
      x = x + branch(self.norm1(x), self.attn)
      return x + branch(self.norm2(x), lambda y: self.mlp(y, train=train, rngs=rngs))
    x = self.norm1(x + branch(x, self.attn))
    return self.norm2(x + branch(x, lambda y: self.mlp(y, train=train, rngs=rngs)))


class Encoder(nnx.Module):
  """A stack of encoder blocks; stochastic depth rises linearly from 0 to `drop_path` with depth."""

  def __init__(self, depth: int, width: int, mlp_dim: int, num_heads: int, *, dropout: float, drop_path: float,
               prenorm: bool, gelu_approximate: bool, layernorm_epsilon: float, rngs: nnx.Rngs):
    self.blocks = nnx.List([
        EncoderBlock(width, mlp_dim, num_heads, dropout=dropout, drop_path=drop_path * i / max(depth - 1, 1),
                     prenorm=prenorm, gelu_approximate=gelu_approximate, layernorm_epsilon=layernorm_epsilon,
                     rngs=rngs)
        for i in range(depth)])
    # Pre-norm stacks end with a LayerNorm; post-norm blocks already end with one.
    self.norm = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs) if prenorm else None

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None) -> jax.Array:
    for block in self.blocks:
      x = block(x, train=train, rngs=rngs)
    return self.norm(x) if self.norm is not None else x
