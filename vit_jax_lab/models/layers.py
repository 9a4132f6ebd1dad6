"""Transformer building blocks shared by every model family (Flax NNX)."""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import vit_jax_lab.models.attention as attention
import vit_jax_lab.models.rope as rope
from vit_jax_lab.errors import ConfigError

xavier = nnx.initializers.xavier_uniform()


def resolve_dims(preset: dict[str, int], given: dict[str, int | None], example: str) -> dict[str, int]:
  """A variant's (or preset's) dimensions with the explicitly given ones on top; every one of `given` must end
  up set and positive (a depth of 0 would train a model without blocks), and `width` divisible by `num_heads`.
  `example`: a variant to suggest when one is missing."""
  dims = preset | {k: v for k, v in given.items() if v is not None}
  missing = [k for k in given if k not in dims]
  if missing:
    raise ConfigError(f'model.{missing[0]} is not set: give model.variant (e.g. "{example}") or model.{missing[0]}')
  for key in given:
    if dims[key] < 1:
      raise ConfigError(f'model.{key}={dims[key]} must be a positive integer')
  if dims['width'] % dims['num_heads']:
    raise ConfigError(f'model.width={dims["width"]} must be divisible by model.num_heads={dims["num_heads"]}')
  return dims


def check_patch(patch_size: int, image_size: tuple[int, int]) -> None:
  """Patches must tile the image exactly."""
  if patch_size < 1:
    raise ConfigError(f'model.patch_size={patch_size} must be a positive integer')
  if image_size[0] % patch_size or image_size[1] % patch_size:
    raise ConfigError(
      f'model.patch_size={patch_size} must divide the image size {image_size[0]}x{image_size[1]}: '
      'change model.patch_size or data.image_size'
    )


ATTENTION_IMPLS = (None, 'xla', 'cudnn')


def check_options(choices: dict[str, tuple[Any, tuple[Any, ...]]], rates: dict[str, float]) -> None:
  """`choices`: key -> (value, valid values); `rates`: key -> a dropout-like rate in [0, 1)."""
  for key, (value, valid) in choices.items():
    if value not in valid:
      raise ConfigError(f'model.{key}={value!r} is not one of {", ".join(map(repr, valid))}')
  if choices.get('attention_impl', (None,))[0] == 'cudnn' and jax.default_backend() != 'gpu':
    raise ConfigError(
      f"model.attention_impl='cudnn' needs an NVIDIA GPU (backend: {jax.default_backend()}); use None or 'xla'"
    )
  for key, rate in rates.items():
    if not 0.0 <= rate < 1.0:
      raise ConfigError(f'model.{key}={rate} must be in [0, 1)')


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderOptions:
  """The options of a family's Transformer blocks, documented and checked here once. Each is a config key
  model.<name> of every family that takes it: a family's constructor takes them as `**encoder`, and its `ENCODER`
  (this class, or a subclass with the family's defaults whose `init=False` fields it does not offer) says which.

  Attributes:
    prenorm: LayerNorm before each residual branch (ViT) or after the residual sum (the original Transformer).
    dropout: dropout rate after the embedding, in the MLP and on each residual branch.
    attention_dropout: dropout rate on the attention probabilities.
    drop_path: stochastic-depth rate of the last block (rising linearly from 0 in the first).
    gelu_approximate: tanh-approximate GELU, as in the released ViT checkpoints; False is the exact one.
    layernorm_epsilon: epsilon of every LayerNorm.
    remat: rematerialisation policy of every block, one of REMAT_POLICIES ('none', 'full', 'dots',
      'dots_no_batch'): less activation memory for recomputation in the backward pass.
    scan: stack the blocks' parameters on a leading layer axis and apply them with one `lax.scan`, so compile time
      does not grow with depth. Checkpoints and releases load into either layout.
    attention_impl: `jax.nn.dot_product_attention`'s implementation: None (JAX picks), 'xla', or 'cudnn' (fused
      flash attention; NVIDIA GPUs with compute_dtype='bfloat16').
    attention: the self-attention kind (attention.KINDS): 'full' (O(n^2)); 'local', blocks of attention_window
      tokens along each axis of the token grid (patches, tubelets, text) attending to their block and the adjacent
      ones, the class token global (O(n)); 'sparse', 'local' plus attention_random_blocks random blocks (BigBird;
      O(n)); 'linear', kernelised linear attention (elu + 1; O(n)).
    attention_window: block side in tokens along each grid axis, for 'local' and 'sparse'.
    attention_random_blocks: random key blocks per query block, for 'sparse'.
  """

  prenorm: bool = True
  dropout: float = 0.0
  attention_dropout: float = 0.0
  drop_path: float = 0.0
  gelu_approximate: bool = False
  layernorm_epsilon: float = 1e-6
  remat: str = 'none'
  scan: bool = False
  attention_impl: str | None = None
  attention: str = 'full'
  attention_window: int = 4
  attention_random_blocks: int = 2

  def __post_init__(self):
    check_options(
      dict(remat=(self.remat, tuple(REMAT_POLICIES)), attention_impl=(self.attention_impl, ATTENTION_IMPLS)),
      dict(dropout=self.dropout, attention_dropout=self.attention_dropout, drop_path=self.drop_path),
    )
    attention.check(self.attention, self.attention_window, self.attention_random_blocks, self.attention_dropout)
    if not self.layernorm_epsilon >= 0:  # A negative one makes a constant token's variance negative: NaN.
      raise ConfigError(f'model.layernorm_epsilon={self.layernorm_epsilon} must be a non-negative number (e.g. 1e-6)')

  @classmethod
  def keys(cls) -> tuple[str, ...]:
    """The options a family with this ENCODER takes: its config keys beside the constructor's own."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)

  @classmethod
  def of(cls, given: dict[str, Any]) -> 'EncoderOptions':
    """The options given to a family's constructor as `**encoder`; one it does not take is a one-line error."""
    unknown = sorted(set(given) - set(cls.keys()))
    if unknown:
      raise ConfigError(
        f'model.{unknown[0]} is not an option of this model; its encoder options: {", ".join(cls.keys())}'
      )
    return cls(**given)

  def pattern(self, grid: tuple[int, ...] | None, num_global: int) -> 'attention.Pattern':
    """The self-attention pattern of tokens that are `num_global` leading ones (class token), then `grid` (None: a
    1-D sequence)."""
    return attention.Pattern(self.attention, self.attention_window, self.attention_random_blocks, grid, num_global)

  def stack(self) -> dict[str, Any]:
    """The keywords of `Encoder` these options set."""
    return dict(
      dropout=self.dropout,
      attention_dropout=self.attention_dropout,
      drop_path=self.drop_path,
      prenorm=self.prenorm,
      gelu_approximate=self.gelu_approximate,
      layernorm_epsilon=self.layernorm_epsilon,
      remat=self.remat,
      scan=self.scan,
      attention_impl=self.attention_impl,
    )


# Tensor parallelism (Megatron): the kernel dimension of each sub-layer that the mesh's 'model' axis splits.
# The query/key/value and first MLP kernels are split along their outputs, the layers after them along their
# inputs, so each attention or MLP needs one all-reduce. Model families declare this as TENSOR_PARALLEL.
TENSOR_PARALLEL = {'qkv': 'outputs', 'fc1': 'outputs', 'gate': 'outputs', 'out': 'inputs', 'fc2': 'inputs'}


class Embed(nnx.Embed):
  """`nnx.Embed` that computes in its table's dtype when called: nnx.Embed fixes its dtype when built (float32), so
  under `compute_dtype=bfloat16` its table, cast to bf16, would still give float32 tokens and every layer after them
  would run in float32."""

  def __init__(self, num_embeddings: int, features: int, **kwargs: Any):
    super().__init__(num_embeddings, features, **kwargs)
    self.dtype = None


class PatchEmbedding(nnx.Module):
  """Non-overlapping p x p patches -> tokens: a strided convolution, computed as one matmul."""

  def __init__(self, patch_size: int, channels: int, width: int, *, rngs: nnx.Rngs):
    self.patch_size = patch_size
    self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (patch_size, patch_size, channels, width)))
    self.bias = nnx.Param(jnp.zeros((width,)))

  def __call__(self, images: jax.Array) -> jax.Array:
    b, h, w, c = images.shape
    p = self.patch_size
    patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, p * p * c)
    kernel = self.kernel[...]
    return patches @ kernel.reshape(-1, kernel.shape[-1]) + self.bias[...]


class ConvStem(nnx.Module):
  """Tokens on PatchEmbedding's p x p grid from log2(p) stride-2 3 x 3 convolutions (ReLU; channels doubling up to
  `width`) and a linear projection (Xiao et al. 2021, "Early convolutions help transformers see better"): the
  receptive fields overlap, so a shift within a patch changes its token less than a linear patch projection's."""

  def __init__(self, patch_size: int, channels: int, width: int, *, rngs: nnx.Rngs):
    if patch_size & (patch_size - 1):
      raise ConfigError(
        f"model.stem='conv' halves the crops log2(patch_size) times: patch_size={patch_size} must be a power of 2"
      )
    n = patch_size.bit_length() - 1
    outs = [max(width >> (n - 1 - i), 8) for i in range(n)]
    self.convs = nnx.List(
      [nnx.Conv(c, o, (3, 3), strides=(2, 2), padding='SAME', rngs=rngs) for c, o in zip([channels, *outs], outs)]
    )
    self.projection = nnx.Linear(outs[-1], width, rngs=rngs)

  def __call__(self, images: jax.Array) -> jax.Array:
    x = images
    for conv in self.convs:
      x = jax.nn.relu(conv(x))
    return self.projection(x.reshape(x.shape[0], -1, x.shape[-1]))


def sincos_2d(height: int, width: int, features: int, temperature: float = 10_000.0) -> np.ndarray:
  """Fixed 2-D sine-cosine position embedding of shape (height * width, features) (MoCo v3)."""
  if features % 4:
    raise ValueError(f'width={features} must be divisible by 4 for sincos2d position embeddings')
  y, x = np.mgrid[:height, :width]
  omega = 1.0 / temperature ** (np.arange(features // 4) / (features // 4 - 1 or 1))
  y = y.reshape(-1, 1) * omega
  x = x.reshape(-1, 1) * omega
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


def sincos_1d(length: int, features: int, temperature: float = 10_000.0) -> np.ndarray:
  """Fixed sine-cosine position embedding of shape (length, features) (Vaswani et al. 2017)."""
  if features % 2:
    raise ValueError(f'width={features} must be even for sin-cos position embeddings')
  omega = 1.0 / temperature ** (np.arange(features // 2) / (features // 2))
  t = np.arange(length).reshape(-1, 1) * omega
  return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def add_positions(
  x: jax.Array, *, fixed: np.ndarray | None = None, cls: nnx.Param | None = None, learned: nnx.Param | None = None
) -> jax.Array:
  """Tokens (B, N, D) -> [class token] + tokens, plus position embeddings: `fixed` ones (N, D) are added
  to the N tokens only; `learned` ones (1, N [+ 1], D) cover the class token too, as vision_transformer."""
  if fixed is not None:
    x = x + fixed.astype(x.dtype)  # A float32 constant would promote bf16 tokens, and every layer after them.
  if cls is not None:
    x = jnp.concatenate([jnp.broadcast_to(cls[...], (x.shape[0], 1, x.shape[-1])), x], axis=1)
  if learned is not None:
    x = x + learned[...]
  return x


def gelu(x: jax.Array, approximate: bool) -> jax.Array:
  """GELU; the exact one as x (1 + erf(x / sqrt 2)) / 2, the same function as jax.nn.gelu's erfc form to 1e-6,
  whose fused forward and backward XLA:CPU runs about 4x faster (ViT-Ti/16's MLP: 9 against 36 ms)."""
  if approximate:
    return jax.nn.gelu(x, approximate=True)
  return x * (1 + jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype))) / 2


ACTIVATIONS = ('gelu', 'relu')  # Of the MLPs: GELU (ViT, BERT) or ReLU (the original Transformer).


class Dropout(nnx.Module):
  """Dropout whose randomness comes from the call's `rngs`, so the train step stays a pure function.

  With `per_example=True` it drops whole examples of a residual branch: stochastic depth
  (Huang et al. 2016).
  """

  def __init__(self, rate: float, per_example: bool = False):
    self.rate = rate
    self.per_example = per_example

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None, rate: jax.Array | None = None) -> jax.Array:
    """`rate` overrides `self.rate` with a traced value (a scanned layer's own stochastic-depth rate)."""
    if not train or self.rate == 0.0:
      return x
    if rngs is None:
      raise ValueError(
        'train=True with dropout or stochastic depth needs rngs: call model(x, train=True, rngs=nnx.Rngs(dropout=0))'
      )
    rate = self.rate if rate is None else rate
    shape = (x.shape[0],) + (1,) * (x.ndim - 1) if self.per_example else x.shape
    keep = jax.random.bernoulli(rngs.dropout(), 1.0 - rate, shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def heads_major(x: jax.Array) -> jax.Array:
  """(batch, tokens, heads, head_dim) <-> (batch, heads, tokens, head_dim)."""
  return x.swapaxes(1, 2)


CUDNN_MULTIPLE = 64  # cuDNN attention pads unmasked sequences to a multiple of this many tokens (padded_attention).


def padded_attention(q: jax.Array, k: jax.Array, v: jax.Array, multiple: int, implementation: str | None) -> jax.Array:
  """Unmasked `jax.nn.dot_product_attention` of heads (batch, tokens, heads, head_dim) on queries and keys padded to
  a multiple of `multiple` tokens, their true lengths passed along. cuDNN's training kernels refuse an odd length
  (ViT's 197 tokens) and ran faster padded: on an H100, ViT-B/16's attention forward and backward at batch 256 took
  1.17 ms on 197 tokens padded to 256 against 1.33 ms on 196 unpadded."""
  b, n, m = q.shape[0], q.shape[1], k.shape[1]
  if n % multiple == 0 and m % multiple == 0:
    return jax.nn.dot_product_attention(q, k, v, implementation=implementation)

  def pad(x):
    return jnp.pad(x, ((0, 0), (0, -x.shape[1] % multiple), (0, 0), (0, 0)))

  out = jax.nn.dot_product_attention(
    pad(q),
    pad(k),
    pad(v),
    query_seq_lengths=jnp.full((b,), n, jnp.int32),
    key_value_seq_lengths=jnp.full((b,), m, jnp.int32),
    implementation=implementation,
  )
  return out[:, :n]


class Attention(nnx.Module):
  """Multi-head dot-product attention with one fused query/key/value projection.

  Self-attention by default; with `context`, queries come from `x` and keys/values from `context`
  (the same weights, sliced). Uses `jax.nn.dot_product_attention` (its `implementation`: None picks,
  'xla', or 'cudnn', fused flash attention on NVIDIA GPUs in bf16/fp16) except when attention dropout
  is active, which needs the weights explicitly, and on CPU, where explicit heads-major products run faster.
  `pattern` makes self-attention 'local', 'sparse' or 'linear' (models/attention.py); cross-attention is full.
  `projection=False`: the heads are concatenated with no output projection (V-JEPA 2's pooling cross-attention).
  """

  def __init__(
    self,
    width: int,
    num_heads: int,
    *,
    dropout: float = 0.0,
    implementation: str | None = None,
    pattern: attention.Pattern | None = None,
    projection: bool = True,
    rngs: nnx.Rngs,
  ):
    self.num_heads, self.implementation, self.width = num_heads, implementation, width
    self.pattern = pattern if pattern is not None and pattern.kind != 'full' else None
    self.qkv = nnx.Linear(width, 3 * width, kernel_init=xavier, rngs=rngs)
    self.out = nnx.Linear(width, width, kernel_init=xavier, rngs=rngs) if projection else None
    self.dropout = Dropout(dropout)

  def heads(self, x: jax.Array, context: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries, keys and values as (batch, tokens, heads, head_dim)."""
    if context is None:
      return jnp.unstack(self._split(self.qkv(x)), axis=-3)
    return self.queries(x), *self.keys_values(context)

  def _split(self, y: jax.Array) -> jax.Array:
    """(..., k * width) -> (..., k, heads, head_dim)."""
    return y.reshape(*y.shape[:-1], -1, self.num_heads, self.width // self.num_heads)

  def queries(self, x: jax.Array) -> jax.Array:
    """The queries of tokens `x` alone (cross-attention), (batch, tokens, heads, head_dim)."""
    d = x.shape[-1]
    return self._split(x @ self.qkv.kernel[:, :d] + self.qkv.bias[:d])[..., 0, :, :]

  def keys_values(self, context: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values of `context` alone: computed once per sequence for cached cross-attention."""
    d = context.shape[-1]
    return jnp.unstack(self._split(context @ self.qkv.kernel[:, d:] + self.qkv.bias[d:]), axis=-3)

  @staticmethod
  def _probabilities(q: jax.Array, k: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    q, k = heads_major(q * (1 / np.sqrt(q.shape[-1])).astype(q.dtype)), heads_major(k)
    logits = jnp.einsum('bhqd,bhkd->bhqk', q, k)
    if mask is not None:
      logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)

  def weights(
    self, x: jax.Array, context: jax.Array | None = None, layer: int = 0, rotary: rope.Rotary | None = None
  ) -> jax.Array:
    """Attention probabilities (batch, heads, queries, keys): zero outside a local or sparse pattern."""
    q, k, _ = self.turned(*self.heads(x, context), rotary, layer)
    if self.pattern is not None and not attention.KINDS[self.pattern.kind].weights:
      with_weights = ', '.join(repr(k) for k, kind in attention.KINDS.items() if kind.weights)
      raise ConfigError(f'model.attention={self.pattern.kind!r} has no attention weights to show; use {with_weights}')
    mask = None if self.pattern is None else attention.dense_mask(self.pattern, x.shape[1], layer=layer)
    return self._probabilities(q, k, mask)

  def attend(
    self,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    train: bool,
    rngs: nnx.Rngs | None,
    mask: jax.Array | attention.Mask | None = None,
    layer: int | jax.Array = 0,
  ) -> jax.Array:
    """Heads (batch, tokens, heads, head_dim) -> attention outputs of the same shape. `mask`: an `attention.Mask`
    (or None) for self-attention in this module's pattern; a bool array broadcastable to (batch, heads, queries,
    keys), True where a query may attend to a key, for full attention under that mask (cross-attention, cached
    decoding). `layer`: the block's depth, which seeds a sparse pattern's random blocks."""
    if self.pattern is not None and (mask is None or isinstance(mask, attention.Mask)):
      drop = (lambda p: self.dropout(p, train=train, rngs=rngs)) if train and self.dropout.rate > 0.0 else None
      return attention.attend(q, k, v, self.pattern, mask, layer, drop)
    if isinstance(mask, attention.Mask):
      mask = mask.dense(k.shape[1])
    # The explicit path also serves float16 without cuDNN (jax.nn.dot_product_attention's XLA path asks for a
    # float16 dot with float32 accumulation, which XLA:CPU lacks) and CPUs, where its heads-major products
    # made ViT-Ti/16's train step about 5% faster than jax.nn.dot_product_attention's token-major ones.
    explicit = self.implementation != 'cudnn' and (q.dtype == jnp.float16 or jax.default_backend() == 'cpu')
    if (train and self.dropout.rate > 0.0) or explicit:
      probs = self.dropout(self._probabilities(q, k, mask), train=train, rngs=rngs)
      return heads_major(jnp.einsum('bhqk,bhkd->bhqd', probs, heads_major(v)))
    if self.implementation == 'cudnn' and mask is None:
      return padded_attention(q, k, v, CUDNN_MULTIPLE, 'cudnn')
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=self.implementation)

  def __call__(
    self,
    x: jax.Array,
    context: jax.Array | None = None,
    *,
    train: bool = False,
    rngs: nnx.Rngs | None = None,
    mask: jax.Array | attention.Mask | None = None,
    layer: int | jax.Array = 0,
    rotary: rope.Rotary | None = None,
  ) -> jax.Array:
    """`rotary`: rotary position embeddings turning the queries and keys (models/rope.py)."""
    q, k, v = self.turned(*self.heads(x, context), rotary, layer)
    return self.output(self.attend(q, k, v, train=train, rngs=rngs, mask=mask, layer=layer))

  @staticmethod
  def turned(
    q: jax.Array, k: jax.Array, v: jax.Array, rotary: rope.Rotary | None, layer: int | jax.Array
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    return (q, k, v) if rotary is None else (rotary(q, layer), rotary(k, layer), v)

  def output(self, y: jax.Array) -> jax.Array:
    """Attention outputs (batch, tokens, heads, head_dim) -> the output projection (batch, tokens, width)."""
    y = y.reshape(*y.shape[:-2], -1)
    return y if self.out is None else self.out(y)


class Mlp(nnx.Module):
  """Two dense layers with GELU (or ReLU, or CLIP's quick-GELU) between them; activation 'swiglu': a third, `gate`,
  whose SiLU multiplies fc1's output (SwiGLU, Shazeer 2020; DINOv2 giant), mlp_dim wide each. `norm_epsilon`: a
  LayerNorm of this epsilon on the hidden activations before fc2 (NormFormer's; EVA-02's sub-LN, timm's
  scale_mlp_norm)."""

  def __init__(
    self,
    width: int,
    mlp_dim: int,
    *,
    dropout: float,
    gelu_approximate: bool,
    rngs: nnx.Rngs,
    activation: str = 'gelu',
    norm_epsilon: float | None = None,
  ):
    bias_init = nnx.initializers.normal(1e-6)
    self.fc1 = nnx.Linear(width, mlp_dim, kernel_init=xavier, bias_init=bias_init, rngs=rngs)
    if activation == 'swiglu':
      self.gate = nnx.Linear(width, mlp_dim, kernel_init=xavier, bias_init=bias_init, rngs=rngs)
    self.fc2 = nnx.Linear(mlp_dim, width, kernel_init=xavier, bias_init=bias_init, rngs=rngs)
    self.dropout = Dropout(dropout)
    self.gelu_approximate, self.activation = gelu_approximate, activation
    if norm_epsilon is not None:
      self.norm = nnx.LayerNorm(mlp_dim, epsilon=norm_epsilon, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None) -> jax.Array:
    h = self.fc1(x)
    if self.activation == 'swiglu':
      h = jax.nn.silu(self.gate(x)) * h
    elif self.activation == 'quick_gelu':  # CLIP's sigmoid approximation of GELU, which its weights were trained with.
      h = h * jax.nn.sigmoid(1.702 * h)
    elif self.activation == 'silu':  # Swish (opus-mt's Marian models).
      h = jax.nn.silu(h)
    else:
      h = jax.nn.relu(h) if self.activation == 'relu' else gelu(h, self.gelu_approximate)
    h = self.dropout(h, train=train, rngs=rngs)
    return self.fc2(self.norm(h) if hasattr(self, 'norm') else h)


class EncoderBlock(nnx.Module):
  """Self-attention and MLP, each in a residual branch; LayerNorm before (pre-norm) or after them.

  `attention` builds the token mixer (default: `Attention` over all tokens); subclasses that mix tokens
  differently override `mix`.
  """

  def __init__(
    self,
    width: int,
    mlp_dim: int,
    num_heads: int,
    *,
    dropout: float,
    attention_dropout: float,
    drop_path: float,
    prenorm: bool,
    gelu_approximate: bool,
    layernorm_epsilon: float,
    rngs: nnx.Rngs,
    attention: Callable[..., Attention] = Attention,
    attention_impl: str | None = None,
    activation: str = 'gelu',
    pattern: attention.Pattern | None = None,
    mlp_norm: bool = False,
  ):
    self.prenorm = prenorm
    self.norm1 = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.attn = attention(
      width, num_heads, dropout=attention_dropout, implementation=attention_impl, pattern=pattern, rngs=rngs
    )
    self.norm2 = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.mlp = Mlp(
      width,
      mlp_dim,
      dropout=dropout,
      gelu_approximate=gelu_approximate,
      activation=activation,
      norm_epsilon=layernorm_epsilon if mlp_norm else None,
      rngs=rngs,
    )
    self.dropout = Dropout(dropout)
    self.drop_path = Dropout(drop_path, per_example=True)

  def residual(
    self,
    x: jax.Array,
    norm: nnx.LayerNorm,
    fn: Callable[[jax.Array], jax.Array],
    *,
    train: bool,
    rngs: nnx.Rngs | None,
    drop_path: jax.Array | None = None,
  ) -> jax.Array:
    """x + fn(x) with dropout and stochastic depth on the branch, normalised before fn or after the sum."""

    def branch(y):
      y = self.dropout(fn(y), train=train, rngs=rngs)
      return self.drop_path(y, train=train, rngs=rngs, rate=drop_path)

    return x + branch(norm(x)) if self.prenorm else norm(x + branch(x))

  def mix(
    self,
    x: jax.Array,
    *,
    train: bool,
    rngs: nnx.Rngs | None,
    drop_path: jax.Array | None,
    mask: attention.Mask | None = None,
    layer: int | jax.Array = 0,
    rotary: rope.Rotary | None = None,
  ) -> jax.Array:
    """The token-mixing residual branch: self-attention (over the keys `mask` allows)."""
    return self.residual(
      x,
      self.norm1,
      lambda y: self.attn(y, train=train, rngs=rngs, mask=mask, layer=layer, **({'rotary': rotary} if rotary else {})),
      train=train,
      rngs=rngs,
      drop_path=drop_path,
    )

  def feed_forward(
    self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None, drop_path: jax.Array | None = None
  ) -> jax.Array:
    """The MLP residual branch."""
    return self.residual(
      x, self.norm2, lambda y: self.mlp(y, train=train, rngs=rngs), train=train, rngs=rngs, drop_path=drop_path
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    train: bool,
    rngs: nnx.Rngs | None,
    drop_path: jax.Array | None = None,
    mask: attention.Mask | None = None,
    layer: int | jax.Array = 0,
    rotary: rope.Rotary | None = None,
  ) -> jax.Array:
    """`drop_path`: this layer's stochastic-depth rate when it differs from the static one (scanned layers).
    `mask`: which tokens attend to which (padding, packed sequences, causal). `layer`: this block's depth.
    `rotary`: rotary position embeddings of the tokens (models/rope.py)."""
    turn = {'rotary': rotary} if rotary else {}  # Only the ViT's blocks and attention take it (not ViViT's).
    x = self.mix(x, train=train, rngs=rngs, drop_path=drop_path, mask=mask, layer=layer, **turn)
    return self.feed_forward(x, train=train, rngs=rngs, drop_path=drop_path)

  def attention_weights(self, x: jax.Array, layer: int = 0, rotary: rope.Rotary | None = None) -> jax.Array:
    """This block's attention probabilities for input tokens `x` (batch, heads, tokens, tokens)."""
    return self.attn.weights(self.norm1(x) if self.prenorm else x, layer=layer, rotary=rotary)


REMAT_POLICIES = {  # Which activations of a block are kept for the backward pass; the rest is recomputed.
  'none': None,  # No rematerialisation: everything is kept.
  None: None,  # The same: the command line reads --config.model.remat=none as None.
  'full': jax.checkpoint_policies.nothing_saveable,  # Only the block's input: least memory.
  'dots': jax.checkpoint_policies.dots_saveable,  # Matmul outputs kept; norms and activations recomputed.
  'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # Weight matmuls only.
}


class Encoder(nnx.Module):
  """A stack of encoder blocks (`block`: EncoderBlock or a subclass); stochastic depth rises linearly from
  0 to `drop_path` with depth.

  `remat` names a policy of REMAT_POLICIES applied to every block. With `scan`, the blocks are one module
  whose parameters have a leading layer axis, applied by `jax.lax.scan`: one block is compiled, whatever
  the depth. Scanned layers draw their dropout keys differently, so only their dropout-free results equal
  the unscanned ones; `unscanned`/`scanned_like` convert parameters between the two layouts.
  """

  def __init__(
    self,
    depth: int,
    width: int,
    mlp_dim: int,
    num_heads: int,
    *,
    dropout: float,
    attention_dropout: float,
    drop_path: float,
    prenorm: bool,
    gelu_approximate: bool,
    layernorm_epsilon: float,
    rngs: nnx.Rngs,
    block: Callable[..., EncoderBlock] = EncoderBlock,
    remat: str = 'none',
    scan: bool = False,
    attention_impl: str | None = None,
    activation: str = 'gelu',
    pattern: attention.Pattern | None = None,
    mlp_norm: bool = False,
  ):
    self.remat, self.scan = remat, scan
    self.drop_path_rates = tuple(drop_path * i / max(depth - 1, 1) for i in range(depth))

    def make(rate, block_rngs):
      return block(
        width,
        mlp_dim,
        num_heads,
        dropout=dropout,
        attention_dropout=attention_dropout,
        drop_path=rate,
        prenorm=prenorm,
        gelu_approximate=gelu_approximate,
        layernorm_epsilon=layernorm_epsilon,
        attention_impl=attention_impl,
        activation=activation,
        pattern=pattern,
        rngs=block_rngs,
        **({'mlp_norm': True} if mlp_norm else {}),  # Only EncoderBlock's own MLP has one (the ViT's).
      )

    if scan:
      keys = jax.random.split(rngs.params(), depth)
      self.blocks = nnx.vmap(lambda key: make(drop_path, nnx.Rngs(params=key)))(keys)
    else:
      self.blocks = nnx.List([make(rate, rngs) for rate in self.drop_path_rates])
    # Pre-norm stacks end with a LayerNorm; post-norm blocks already end with one.
    self.norm = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs) if prenorm else None

  def __call__(self, x: jax.Array, *, train: bool, rngs: nnx.Rngs | None, **block_kwargs) -> jax.Array:
    """`block_kwargs` (attention masks, the encoder output of a decoder, ...) go to every block."""
    if self.scan:
      policy = REMAT_POLICIES[self.remat]
      graphdef, params = nnx.split(self.blocks)
      depth = len(self.drop_path_rates)
      keys = jax.random.split(rngs.dropout() if train and rngs is not None else jax.random.key(0), depth)

      def layer(y, inputs):
        layer_params, key, rate, i = inputs
        block = nnx.merge(graphdef, layer_params)
        return block(y, train=train, rngs=nnx.Rngs(dropout=key), drop_path=rate, layer=i, **block_kwargs), None

      if policy is not None:
        layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
      x, _ = jax.lax.scan(layer, x, (params, keys, jnp.asarray(self.drop_path_rates), jnp.arange(depth)))
    else:
      x = self.through(x, len(self.blocks), train=train, rngs=rngs, **block_kwargs)
    return self.norm(x) if self.norm is not None else x

  def through(self, x: jax.Array, stop: int, *, train: bool, rngs: nnx.Rngs | None, **block_kwargs) -> jax.Array:
    """`x` through the first `stop` unscanned blocks as `__call__` applies them, rematerialised alike: what enters
    block `stop` (a model reading that block's attention applies it itself)."""

    def apply(block, y, r, i):
      return block(y, train=train, rngs=r, layer=i, **block_kwargs)

    policy = REMAT_POLICIES[self.remat]
    if policy is not None:
      apply = nnx.remat(apply, policy=policy, static_argnums=3)
    for i in range(stop):
      x = apply(self.blocks[i], x, rngs, i)
    return x


def path_keys(path: tuple) -> list:
  """The names in a `jax.tree_util` key path of a parameter tree: strings, and ints for layer numbers."""
  return [getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k))) for k in path]


def first_mismatch(got: dict, want: dict, names: tuple[str, str] = ('checkpoint', 'model')) -> str | None:
  """The first difference of names or shapes between two pure parameter trees, as 'a/b/c: <names[0]> (shape),
  <names[1]> (shape)' (or 'missing'), or None where they agree."""

  def shapes(tree):
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {'/'.join(map(str, path_keys(path))): tuple(np.shape(x)) for path, x in leaves}

  a, b = shapes(got), shapes(want)
  for key in sorted(a.keys() | b.keys()):
    if a.get(key) != b.get(key):
      return f'{key}: {names[0]} {a.get(key, "missing")}, {names[1]} {b.get(key, "missing")}'
  return None


def unscanned(params: dict) -> dict:
  """A pure parameter dict with every scanned `blocks` (arrays with a leading layer axis) split into
  {0: ..., 1: ...}, the unscanned layout; unscanned input is returned as it is."""
  if not isinstance(params, dict):
    return params
  out = {k: unscanned(v) for k, v in params.items()}
  blocks = params.get('blocks')
  if isinstance(blocks, dict) and blocks and not all(isinstance(k, int) for k in blocks):
    depth = jax.tree.leaves(blocks)[0].shape[0]
    out['blocks'] = {i: jax.tree.map(lambda a: a[i], blocks) for i in range(depth)}
  return out


def scanned_like(params: dict, target: dict) -> dict:
  """Unscanned `params` in the layout of `target`: stacked wherever `target`'s blocks are scanned."""
  out = dict(params)
  for k, v in target.items():
    if k == 'blocks' and v and not all(isinstance(i, int) for i in v):
      out[k] = jax.tree.map(lambda *a: np.stack(a), *[params[k][i] for i in sorted(params[k])])
    elif k in params and isinstance(v, dict) and isinstance(params[k], dict):
      out[k] = scanned_like(params[k], v)
  return out


class MAPHead(nnx.Module):
  """Multi-head attention pooling: a learned probe attends over the tokens, then a residual MLP
  (Lee et al. 2019; big_vision's MAPHead)."""

  def __init__(
    self, width: int, mlp_dim: int, num_heads: int, *, gelu_approximate: bool, layernorm_epsilon: float, rngs: nnx.Rngs
  ):
    self.probe = nnx.Param(xavier(rngs.params(), (1, 1, width)))
    self.attn = Attention(width, num_heads, rngs=rngs)
    self.norm = nnx.LayerNorm(width, epsilon=layernorm_epsilon, rngs=rngs)
    self.mlp = Mlp(width, mlp_dim, dropout=0.0, gelu_approximate=gelu_approximate, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    probe = jnp.broadcast_to(self.probe[...], (x.shape[0], 1, x.shape[-1]))
    y = self.attn(probe, context=x)
    return (y + self.mlp(self.norm(y), train=False, rngs=None))[:, 0]
