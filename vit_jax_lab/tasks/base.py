"""The contract between the trainer, the commands and a task: everything `train.py` and `tools/` ask of one.

A task owns what a model is trained to do: what it must know of the data, how examples become batches, the
loss, the evaluation metrics, and what a prediction is. A new objective is a class with these methods, registered
in `tasks/__init__.py`; its constructor keywords are its config keys (`config.task`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Protocol

import jax
import numpy as np
from flax import nnx

from vit_jax_lab.errors import ConfigError, check

if TYPE_CHECKING:  # Type names only: a task module loads without TensorFlow.
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from vit_jax_lab.data import pipeline

Batch = dict[str, jax.Array]
Preprocess = Callable[[dict, 'tf.Tensor'], dict]  # (example, per-example seed) -> model-ready features.


class Task(Protocol):
  """What the trainer calls, in the order it calls it, then what the commands call. `info` is whatever
  `dataset_info` returns."""

  # Batch entries the trainer leaves in float32 under a lower `compute_dtype`, which it casts the rest to:
  # coordinates, which bfloat16's 8-bit mantissa would round (a box edge at 1,000 px by up to 4 px).
  float32_keys: tuple[str, ...] = ()

  def dataset_info(self, builder: tfds.core.DatasetBuilder, data_config: Any, workdir: str | None) -> Any:
    """What the model and the task need to know of the data (shapes, classes, vocabularies) before building."""

  def model_kwargs(self, info: Any) -> dict[str, Any]:
    """The model's data-dependent constructor arguments (e.g. num_classes, input_shape)."""

  def prepare(self, info: Any, train: bool) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """The split's raw examples -> the features the task reads (deterministic: selection, tokenisation)."""

  def preprocess(self, data_config: Any, info: Any, train: bool) -> Preprocess:
    """One example -> model-ready arrays; randomness only from the given seed, so resumed streams repeat."""

  def pack(self, data_config: Any) -> tuple[int, Callable[[dict, int], dict]] | None:
    """(k, fn) to pack k batches' worth of examples into one batch with fn(examples, rows); None: no packing."""
    return None

  def buckets(self, data_config: Any, info: Any) -> pipeline.Buckets | None:
    """With `data.token_budget` > 0: the example lengths to batch by (checking the config allows it); else None.
    A task whose examples have no length refuses a budget."""
    check(
      data_config.token_budget == 0,
      f'data.token_budget={data_config.token_budget} batches sequences by their length, and the '
      f'{type(self).__name__} task has none: set it to 0 (data.batch_size sizes its batches)',
    )
    return None

  def loss(self, model: nnx.Module, batch: Batch, rng: jax.Array, step: jax.Array) -> tuple[jax.Array, dict]:
    """(mean training loss, metrics to log) of one batch; runs inside the compiled train step."""

  def eval_sums(self, model: nnx.Module, batch: Batch) -> dict[str, Any]:
    """Metric sums over the batch's real (mask = 1) examples, inside the compiled eval step; arrays to score
    on the host go under 'host'."""

  def sequential(self, info: Any) -> bool:
    """Whether evaluation runs an example at a time on the host (`sequential_sums`) instead of `eval_sums`: for
    examples no fixed-shape batch holds, each step's input depending on the last output (online tracking of
    videos of any length and size)."""
    return False

  def sequential_sums(self, predict: Callable, examples: Iterator[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Metric sums over this process's share of the eval split, given one at a time; `predict(*inputs)` is the
    model, compiled, with the evaluated parameters."""
    raise NotImplementedError

  def host_sums(self, host: dict[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
    """More sums from the gathered 'host' arrays of `eval_sums` (e.g. BLEU statistics of decoded text)."""
    return {}

  def summarize(self, sums: dict[str, Any]) -> dict[str, float]:
    """Sums over the whole eval split -> the reported metrics."""

  # --- Inference: what the commands (tools/) call ---------------------------------------------------------------

  # What one prediction is: 'classes' (`logits`; tools.predict prints the top k, tools.export serves them), 'text'
  # (`generate`; tools.predict prints it, tools.bench --decode times it), 'boxes' (one per frame, tracked online by
  # tasks.tracking.track: tools.track, tools.results); None: the commands run none.
  predicts: ClassVar[str | None] = None
  # The eval metric a run's last line ranks its evaluations by (reporting.best_eval); None: the first of
  # reporting.HEADLINE the run logged.
  headline: str | None = None

  def logits(self, model: nnx.Module, batch: Batch) -> jax.Array:
    """(batch, classes) float32 evaluation logits, what a 'classes' prediction and a served model score by."""
    raise NotImplementedError

  def generate(self, model: nnx.Module, inputs: jax.Array, length: int) -> jax.Array:
    """(batch, length) token ids decoded from `inputs` as evaluation decodes them ('text')."""
    raise NotImplementedError

  def predict(self, model: nnx.Module, batch: Batch, info: Any, top_k: int) -> Any:
    """One prediction per example of `batch` as arrays, inside a compiled step ('classes': (top_k probabilities,
    their class ids); 'text': token ids)."""
    raise NotImplementedError

  def input_kind(self, info: Any) -> str:
    """What one input of a prediction is, for commands that read the user's files: 'image', 'video' or 'text'."""
    raise NotImplementedError

  def chance(self, info: Any) -> str:
    """What guessing would score, for a run's last line beside its evaluation ('' where it says nothing useful): a
    newcomer's first run on their own photos is read against it."""
    return ''

  def blank_targets(self, info: Any) -> dict[str, Any]:
    """An example's target features, blank: what `prepare` and `preprocess` read besides the input, for inputs
    that have no target (the user's files)."""
    raise NotImplementedError

  def synthetic_batch(self, shape: str, batch_size: int) -> tuple[Any, Batch]:
    """(info, a batch of random inputs) of `shape` (e.g. '224,224,3,1000'), to time the model without a dataset
    (tools.bench --synthetic); a ConfigError that names the form the task takes for another shape."""
    raise ConfigError(f'the {type(self).__name__} task has no synthetic inputs: time it on its dataset')


def synthetic_dims(shape: str, ranks: tuple[int, ...], form: str) -> tuple[int, ...]:
  """`shape` ('16,16,3,10') as positive integers, `ranks` of them; a ConfigError naming `form` otherwise."""
  try:
    dims = tuple(int(n) for n in shape.split(','))
  except ValueError:
    dims = ()
  check(len(dims) in ranks and min(dims) >= 1, f'expected {form}')
  return dims
