"""Classification: one label per example, softmax cross-entropy, top-1 accuracy.

The data module (TensorFlow) is imported where it is used, so that a config file naming this task loads
without TensorFlow and a mistake in it is reported at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tasks.base import Batch, Preprocess, Task

if TYPE_CHECKING:
  from vit_jax_lab.data import labels


class Classification(Task):
  """Attributes:
  label_smoothing: mass spread uniformly over all classes in the training targets.
  mixup: alpha of the Beta distribution for mixup (Zhang et al. 2018); 0 turns it off. One mixing
    weight per batch; each example is mixed with its neighbour in the global batch.
  """

  def __init__(self, *, label_smoothing: float = 0.0, mixup: float = 0.0):
    if not 0.0 <= label_smoothing < 1.0:
      raise ConfigError(f'task.label_smoothing={label_smoothing} must be in [0, 1)')
    if mixup < 0.0:
      raise ConfigError(f'task.mixup={mixup} must be >= 0 (0 turns it off)')
    self.label_smoothing = label_smoothing
    self.mixup = mixup

  def dataset_info(self, builder, data_config, workdir: str | None) -> labels.LabelInfo:
    del workdir  # Nothing is derived from the data.
    from vit_jax_lab.data import labels

    return labels.dataset_info(builder, data_config)

  def model_kwargs(self, info: labels.LabelInfo) -> dict[str, Any]:
    return dict(num_classes=info.num_classes, input_shape=info.input_shape)

  def prepare(self, info: labels.LabelInfo, train: bool) -> Callable:
    from vit_jax_lab.data import labels

    return labels.prepare_fn(info)

  def preprocess(self, data_config, info: labels.LabelInfo, train: bool) -> Preprocess:
    from vit_jax_lab.data import labels

    return labels.preprocess_fn(data_config, info, train)

  def loss(
    self, model: nnx.Module, batch: Batch, rng: jax.Array, step: jax.Array
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean training loss over the batch, and metrics to log."""
    del step  # No schedule of its own.
    x, labels = batch['inputs'], batch['label']
    mix_rng, dropout_rng = jax.random.split(rng)
    lam = jax.random.beta(mix_rng, self.mixup, self.mixup) if self.mixup > 0.0 else None
    if lam is not None:
      x = lam * x + (1.0 - lam) * jnp.roll(x, 1, axis=0)
    logits = model(x, train=True, rngs=nnx.Rngs(dropout=dropout_rng))
    targets = jax.nn.one_hot(labels, logits.shape[-1])
    if lam is not None:
      targets = lam * targets + (1.0 - lam) * jnp.roll(targets, 1, axis=0)
    targets = optax.smooth_labels(targets, self.label_smoothing)
    loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets).mean()
    accuracy = (logits.argmax(-1) == labels).mean()
    return loss, {'loss': loss, 'accuracy': accuracy}

  def eval_sums(self, model: nnx.Module, batch: Batch) -> dict[str, jax.Array]:
    """Sums over the real (mask=1) examples; the trainer divides each by `count`. An example with several
    views ('views': (batch, views, ...), e.g. clips x crops of a video) is scored by their mean logits."""
    if 'views' in batch:
      views = batch['views']
      logits = model(views.reshape(-1, *views.shape[2:]), train=False).astype(jnp.float32)
      logits = logits.reshape(*views.shape[:2], -1).mean(1)
    else:
      logits = model(batch['inputs'], train=False).astype(jnp.float32)
    mask = batch['mask']
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'])
    correct = logits.argmax(-1) == batch['label']
    return {'loss': (loss * mask).sum(), 'accuracy': (correct * mask).sum(), 'count': mask.sum()}

  def summarize(self, sums: dict[str, Any]) -> dict[str, float]:
    """Summed metrics over the eval split -> means per example."""
    count = float(sums['count'])
    return {k: float(v) / count for k, v in sums.items() if k != 'count'} | {'examples': count}
