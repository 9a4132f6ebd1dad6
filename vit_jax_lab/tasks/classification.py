"""Classification: one label per example (an image, a video or a token sequence), softmax cross-entropy, top-1
accuracy.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vit_jax_lab.data import info as data_info
from vit_jax_lab.data.info import LabelInfo
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tasks.base import Batch, Preprocess, Task, synthetic_dims

if TYPE_CHECKING:
  pass


def _labels() -> types.ModuleType:
  """vit_jax_lab.data.labels, imported at its first use, never with this module: it loads TensorFlow (6.7 s of its
  6.9 s import, `python -X importtime`), and a config file naming this task loads without it (1.5 s), so a
  mistake in the config is reported at once."""
  from vit_jax_lab.data import labels

  return labels


class Classification(Task):
  """Attributes:
  label_smoothing: mass spread uniformly over all classes in the training targets.
  mixup: alpha of the Beta distribution for mixup (Zhang et al. 2018); 0 turns it off. One mixing
    weight per batch; each example is mixed with its neighbour in the global batch.
  cutmix: alpha of the Beta distribution for CutMix (Yun et al. 2019; DeiT: 1.0); 0 turns it off. Per batch, a
    box of area 1 - lambda at a uniformly random centre (clipped at the borders) is pasted from each example's
    neighbour, and the labels are mixed by the area actually kept.
  mix_switch_prob: with both mixup and cutmix on, the probability that a batch uses cutmix rather than mixup (one
    of the two per batch, as timm's Mixup that DeiT uses: 0.5).
  """

  predicts = 'classes'

  def __init__(
    self, *, label_smoothing: float = 0.0, mixup: float = 0.0, cutmix: float = 0.0, mix_switch_prob: float = 0.5
  ):
    if not 0.0 <= label_smoothing < 1.0:
      raise ConfigError(f'task.label_smoothing={label_smoothing} must be in [0, 1)')
    if mixup < 0.0:
      raise ConfigError(f'task.mixup={mixup} must be >= 0 (0 turns it off)')
    if cutmix < 0.0:
      raise ConfigError(f'task.cutmix={cutmix} must be >= 0 (0 turns it off)')
    if not 0.0 <= mix_switch_prob <= 1.0:
      raise ConfigError(f'task.mix_switch_prob={mix_switch_prob} is a probability: it must be in [0, 1]')
    self.label_smoothing = label_smoothing
    self.mixup = mixup
    self.cutmix = cutmix
    self.mix_switch_prob = mix_switch_prob

  def dataset_info(self, builder, data_config, workdir: str | None) -> LabelInfo:
    del workdir  # Nothing is derived from the data.
    info = data_info.label_info(builder, data_config)
    if info.input_key == 'inputs' and (self.mixup or self.cutmix):
      raise ConfigError(
        f'task.mixup={self.mixup} and task.cutmix={self.cutmix} mix images, and data.name={data_config.name!r} has '
        'token sequences: set both to 0'
      )
    return info

  def model_kwargs(self, info: LabelInfo) -> dict[str, Any]:
    """Images and videos: num_classes and input_shape; token sequences: num_classes, vocab_size and max_len."""
    if info.input_key == 'inputs':
      return dict(num_classes=info.num_classes, vocab_size=info.vocab_size, max_len=info.input_shape[0])
    return dict(num_classes=info.num_classes, input_shape=info.input_shape)

  def prepare(self, info: LabelInfo, train: bool) -> Callable:
    return _labels().prepare_fn(info)

  def preprocess(self, data_config, info: LabelInfo, train: bool) -> Preprocess:
    return _labels().preprocess_fn(data_config, info, train)

  def loss(
    self, model: nnx.Module, batch: Batch, rng: jax.Array, step: jax.Array
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean training loss over the batch, and metrics to log."""
    del step  # No schedule of its own.
    x, labels = batch['inputs'], batch['label']
    mix_rng, dropout_rng = jax.random.split(rng)
    mixed = mix(x, mix_rng, self.mixup, self.cutmix, self.mix_switch_prob)
    x = x if mixed is None else mixed[0]
    logits = model(x, train=True, rngs=nnx.Rngs(dropout=dropout_rng))
    targets = jax.nn.one_hot(labels, logits.shape[-1])
    if mixed is not None:
      lam = mixed[1]
      targets = lam * targets + (1.0 - lam) * jnp.roll(targets, 1, axis=0)
    targets = optax.smooth_labels(targets, self.label_smoothing)
    loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets).mean()
    accuracy = (logits.argmax(-1) == labels).mean()
    return loss, {'loss': loss, 'accuracy': accuracy}

  def logits(self, model: nnx.Module, batch: Batch) -> jax.Array:
    """(batch, classes) float32 evaluation logits (also what a served model scores by): an example with several
    views ('views': (batch, views, ...), e.g. clips x crops of a video) is scored by their mean logits."""
    if 'views' in batch:
      views = batch['views']
      logits = model(views.reshape(-1, *views.shape[2:]), train=False).astype(jnp.float32)
      return logits.reshape(*views.shape[:2], -1).mean(1)
    return model(batch['inputs'], train=False).astype(jnp.float32)

  def eval_sums(self, model: nnx.Module, batch: Batch) -> dict[str, jax.Array]:
    """Sums over the real (mask=1) examples of `logits`; the trainer divides each by `count`."""
    logits = self.logits(model, batch)
    mask = batch['mask']
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'])
    correct = logits.argmax(-1) == batch['label']
    return {'loss': (loss * mask).sum(), 'accuracy': (correct * mask).sum(), 'count': mask.sum()}

  def summarize(self, sums: dict[str, Any]) -> dict[str, float]:
    """Summed metrics over the eval split -> means per example."""
    count = float(sums['count'])
    return {k: float(v) / count for k, v in sums.items() if k != 'count'} | {'examples': count}

  # --- Inference ---------------------------------------------------------------------------------------------

  def predict(self, model: nnx.Module, batch: Batch, info: LabelInfo, top_k: int) -> tuple[jax.Array, ...]:
    """(the top_k class probabilities, their class ids), each (batch, top_k), highest first."""
    probabilities = jax.nn.softmax(self.logits(model, batch))
    return jax.lax.top_k(probabilities, min(top_k, probabilities.shape[-1]))

  def input_kind(self, info: LabelInfo) -> str:
    return info.input_key

  def chance(self, info: LabelInfo) -> str:
    return f'chance eval/accuracy {1 / info.num_classes:.4f} ({info.num_classes} classes)'

  def blank_targets(self, info: LabelInfo) -> dict[str, Any]:
    return {'label': np.int64(0)}

  def synthetic_batch(self, shape: str, batch_size: int) -> tuple[LabelInfo, Batch]:
    """H,W,C,CLASSES (images), T,H,W,C,CLASSES (videos) or LENGTH,VOCAB,CLASSES (token ids, none of them padding):
    uniform uint8 pixels (as the pipeline sends them: the step scales them, and augments them with
    data.augment_on='device') or uniform ids, and uniform labels."""
    *input_shape, classes = synthetic_dims(shape, (3, 4, 5), 'H,W,C,CLASSES, T,H,W,C,CLASSES or LENGTH,VOCAB,CLASSES')
    keys = jax.random.split(jax.random.key(0))
    label = jax.random.randint(keys[1], (batch_size,), 0, classes)
    if len(input_shape) == 2:
      (length, vocab), key = input_shape, 'inputs'
      info = LabelInfo(classes, key, (length,), 0, 0, vocab)
      return info, {'inputs': jax.random.randint(keys[0], (batch_size, length), 1, max(vocab, 2)), 'label': label}
    info = LabelInfo(classes, 'image' if len(input_shape) == 3 else 'video', tuple(input_shape), 0, 0)
    pixels = jax.random.randint(keys[0], (batch_size, *input_shape), 0, 256).astype(jnp.uint8)
    return info, {'inputs': pixels, 'label': label}


def mix(
  x: jax.Array, rng: jax.Array, mixup: float, cutmix: float, switch_prob: float
) -> tuple[jax.Array, jax.Array, jax.Array] | None:
  """Inputs (batch, ..., height, width, channels) mixed with their neighbours (`jnp.roll` by 1 on the batch axis):
  (mixed inputs, lambda: the weight of each example's own label, whether cutmix was used), or None with both off.
  Mixup: x * lambda + neighbour * (1 - lambda), lambda ~ Beta(mixup, mixup), drawn from `rng` itself (as before
  cutmix existed, so mixup-only runs keep their draws). CutMix: lambda ~ Beta(cutmix, cutmix); a box of sides
  floor(side * sqrt(1 - lambda)) centred at a uniformly random pixel, clipped to the image, is taken from the
  neighbour, and lambda becomes the fraction of the image outside the box (timm's rand_bbox and correction)."""
  if mixup == 0.0 and cutmix == 0.0:
    return None
  if cutmix == 0.0:
    lam = jax.random.beta(rng, mixup, mixup)
    return lam * x + (1.0 - lam) * jnp.roll(x, 1, axis=0), lam, jnp.array(False)
  beta_rng, cut_rng, row_rng, col_rng, switch_rng = jax.random.split(rng, 5)
  height, width = x.shape[-3], x.shape[-2]
  ratio = jnp.sqrt(1.0 - jax.random.beta(cut_rng, cutmix, cutmix))
  half_h, half_w = jnp.floor(height * ratio).astype(jnp.int32) // 2, jnp.floor(width * ratio).astype(jnp.int32) // 2
  cy, cx = jax.random.randint(row_rng, (), 0, height), jax.random.randint(col_rng, (), 0, width)
  top, bottom = jnp.clip(cy - half_h, 0, height), jnp.clip(cy + half_h, 0, height)
  left, right = jnp.clip(cx - half_w, 0, width), jnp.clip(cx + half_w, 0, width)
  rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
  box = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
  cut_x = jnp.where(box[:, :, None], jnp.roll(x, 1, axis=0), x)
  cut_lam = 1.0 - ((bottom - top) * (right - left)).astype(jnp.float32) / (height * width)
  if mixup == 0.0:
    return cut_x, cut_lam, jnp.array(True)
  use_cutmix = jax.random.uniform(switch_rng) < switch_prob
  mix_lam = jax.random.beta(beta_rng, mixup, mixup)
  mix_x = mix_lam * x + (1.0 - mix_lam) * jnp.roll(x, 1, axis=0)
  return jnp.where(use_cutmix, cut_x, mix_x), jnp.where(use_cutmix, cut_lam, mix_lam), use_cutmix
