"""Few-shot linear evaluation of a model's frozen features, as big_vision's `evaluators/fewshot_lsr.py` does it.

The model's pre-logits features (`model.features`: the pooled representation its head classifies) of a dataset's
train and test images, preprocessed as the run evaluates (`data.*`, no augmentation). A draw takes k random
train images per class; a linear classifier is fitted to their features in closed form, and scored by its top-1
accuracy on the whole test split. As big_vision: features are standardised with the mean and standard deviation
(+ 1e-5) of the draw's own examples, a constant feature BIAS = 100 stands in for the bias (so that the
regularisation barely shrinks it), the targets are the one-hot labels scaled to {-1, 1}, and the weights are the
ridge regression (least squares with l2_reg ||w||^2, default 2^10) of those targets; the prediction is the
argmax. Unlike big_vision, which logs every seed apart, the reported metric is the mean over `draws` draws.

Draw i is a pure function of (config seed, i) and the train labels in the split's order (big_vision seeds them
0, 1, 2): the k-shot examples are the first k of a seeded permutation of each class, so larger k extend smaller
ones. The features are put back into the split's order whatever the device, shard and host count, so the same
config draws the same images everywhere. Solves run on the host in float64 (numpy).
"""

import copy
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from flax import nnx

from vit_jax_lab import data as data_lib, models, parallel
from vit_jax_lab.data import device as data_device, info as data_info, labels as labels_lib, pipeline
from vit_jax_lab.data.info import LabelInfo
from vit_jax_lab.errors import ConfigError, check

BIAS = 100.0  # big_vision's BIAS_CONSTANT.


def ridge(x: np.ndarray, y: np.ndarray, l2_reg: float) -> np.ndarray:
  """argmin_w ||x w - y||^2 + l2_reg ||w||^2 = (x^T x + l2_reg I)^-1 x^T y, which equals
  x^T (x x^T + l2_reg I)^-1 y: solved in whichever of the (d, d) and (n, n) systems is smaller. float64."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  n, d = x.shape
  if n >= d:
    return np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ y)
  return x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), y)


@dataclasses.dataclass(frozen=True)
class LinearProbe:
  """A linear classifier of features, fitted as big_vision's few-shot evaluator fits it (see the module)."""

  mean: np.ndarray  # (d,) of the training features.
  std: np.ndarray  # (d,), + 1e-5.
  weights: np.ndarray  # (d + 1, classes): the last row weighs the constant BIAS feature.

  @classmethod
  def fit(cls, features: np.ndarray, labels: np.ndarray, num_classes: int, l2_reg: float) -> 'LinearProbe':
    features = np.asarray(features, np.float64)
    mean, std = features.mean(0), features.std(0) + 1e-5
    targets = 2.0 * np.eye(num_classes)[labels] - 1.0
    return cls(mean, std, ridge(_inputs(features, mean, std), targets, l2_reg))

  def scores(self, features: np.ndarray) -> np.ndarray:
    return _inputs(np.asarray(features, np.float64), self.mean, self.std) @ self.weights

  def accuracy(self, features: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(self.scores(features).argmax(-1) == labels))


def _inputs(features: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
  """Standardised features and the constant bias feature."""
  return np.pad((features - mean) / std, ((0, 0), (0, 1)), constant_values=BIAS)


def draw(labels: np.ndarray, num_classes: int, shots: tuple[int, ...], index: int, seed: int) -> dict[int, np.ndarray]:
  """Draw `index`: for each k in `shots`, the positions in `labels` of k examples of every class (the first k of one
  permutation per class, seeded by (seed, index))."""
  rng = np.random.default_rng([seed, index])
  per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  return {k: np.concatenate([p[:k] for p in per_class]) for k in shots}


def accuracies(
  draws: list[dict[int, np.ndarray]],
  train: tuple[np.ndarray, np.ndarray],
  test: tuple[np.ndarray, np.ndarray],
  num_classes: int,
  l2_reg: float,
) -> dict[int, np.ndarray]:
  """k -> the test accuracy of each draw's probe. `train`, `test`: (features, labels)."""
  (x, y), shots = train, draws[0].keys()

  def score(idx: np.ndarray) -> float:
    return LinearProbe.fit(x[idx], y[idx], num_classes, l2_reg).accuracy(*test)

  return {k: np.array([score(d[k]) for d in draws]) for k in shots}


def first_examples(builder: tfds.core.DatasetBuilder, split: str, count: int) -> str:
  """A TFDS split spec of the first `count` examples of `split` (which may itself be sliced or a union)."""
  parts, left = [], count
  for a in tfds.core.ReadInstruction.from_spec(split).to_absolute(builder.info.splits):
    start = a.from_ or 0
    stop = builder.info.splits[a.splitname].num_examples if a.to is None else a.to
    take = min(stop - start, left)
    if take > 0:
      parts.append(f'{a.splitname}[{start}:{start + take}]')
      left -= take
  return '+'.join(parts)


@dataclasses.dataclass(frozen=True)
class _Dataset:
  name: str
  builder: tfds.core.DatasetBuilder
  data_config: ml_collections.ConfigDict  # config.data for this dataset (name, data_dir, preprocessing).
  info: LabelInfo
  train_split: str  # eval.fewshot.train_split cut to max_train.
  train_labels: np.ndarray  # Its labels, in order.
  draws: list[dict[int, np.ndarray]]  # Positions in train_split of every draw's k-shot examples.


class Evaluator:
  """`config.eval.fewshot` during a run (and for tools/fewshot.py). Everything a user can get wrong (datasets,
  splits, input shapes, too few examples of a class) is checked when it is built, before anything compiles.

  `param_shardings`: how the parameters passed to `evaluate` are sharded; `info`: what the run's task knows of its
  data (the model's input shape). `fit_shots`: leave out the k a dataset's rarest class cannot fill (noted in
  `notes`) instead of refusing them, for shots the user did not choose (tools.fewshot's defaults)."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    mesh: jax.sharding.Mesh,
    graphdef: nnx.GraphDef,
    param_shardings: Any,
    info: Any,
    fit_shots: bool = False,
  ):
    f = config.eval.fewshot
    self.config, self.mesh, self.datasets, self.seconds = config, mesh, [], 0.0
    self.fit_shots, self.notes = fit_shots, []
    if not f.datasets:
      return
    family = models.get(config.model.name)
    check(
      family.offers('features'),
      f"eval.fewshot.datasets={f.datasets}: few-shot evaluation reads a model's features, and "
      f'model.name={config.model.name!r} has none; use an image or video classifier (vit, vivit) or set it to ()',
    )
    self.datasets = [self._dataset(name, getattr(info, 'input_shape', None)) for name in f.datasets]
    self._features = _features_fn(config, mesh, graphdef, param_shardings)

  def _dataset(self, name: str, input_shape: tuple[int, ...] | None) -> _Dataset:
    f = self.config.eval.fewshot
    data_config = copy.deepcopy(self.config.data)
    data_config.name, data_config.train_split, data_config.eval_split = name, f.train_split, f.test_split
    data_config.cache = False
    try:
      builder, info = pipeline.load(data_config, data_info.label_info)
    except ConfigError as e:  # Its messages name the few-shot data's keys as data.*.
      message = str(e).replace('data.train_split', 'eval.fewshot.train_split')
      raise ConfigError(
        'eval.fewshot.datasets: ' + message.replace('data.eval_split', 'eval.fewshot.test_split')
      ) from None
    channels = input_shape is not None and tuple(info.input_shape[:-1]) == tuple(input_shape[:-1])
    check(
      input_shape is None or tuple(info.input_shape) == tuple(input_shape),
      f'eval.fewshot.datasets: {name} gives inputs of shape {info.input_shape} (preprocessed as data.* says), but '
      f'the model takes {tuple(input_shape or ())}: '
      + (
        f'its images have {info.input_shape[-1]} channels, the model {input_shape[-1]}: evaluate data of as many'
        if channels
        else 'set data.image_size, or evaluate data of that shape'
      ),
    )
    train_split = first_examples(builder, f.train_split, f.max_train)
    train_labels = _labels(builder, train_split, info)
    counts = np.bincount(train_labels, minlength=info.num_classes)
    fewest = int(np.argmin(counts))
    label = builder.info.features['label']
    names = getattr(label, 'names', None) or []
    called = f'class {names[fewest]!r}' if len(names) == info.num_classes else f'class {fewest}'
    shots = tuple(k for k in f.shots if k <= counts[fewest]) if self.fit_shots else tuple(f.shots)
    capped = counts.sum() >= f.max_train  # Only then would more training examples help.
    check(
      shots and counts[fewest] >= max(shots),
      f'eval.fewshot: {called} of {name} has {counts[fewest]} examples in {train_split}, fewer than '
      f'{max(f.shots) if self.fit_shots else max(shots)} shots: lower the shots (eval.fewshot.shots, --shots)'
      + (' or raise eval.fewshot.max_train' if capped else ''),
    )
    if shots != tuple(f.shots):
      self.notes.append(
        f'{name}: {", ".join(str(k) for k in f.shots if k not in shots)}-shot left out: its {called} has '
        f'{counts[fewest]} examples in {train_split}'
      )
    draws = [draw(train_labels, info.num_classes, shots, i, self.config.seed) for i in range(f.draws)]
    return _Dataset(name, builder, data_config, info, train_split, train_labels, draws)

  name = 'few-shot'

  def due(self, step: int, last: bool) -> bool:
    """Whether the run evaluates few-shot after `step`: every eval.fewshot.every steps (0: eval_every), and last."""
    every = self.config.eval.fewshot.every or self.config.eval_every
    return bool(self.datasets) and (last or step % every == 0)

  def results(self, params: nnx.State) -> dict[str, dict[int, np.ndarray]]:
    """dataset -> k -> the test accuracy of every draw."""
    start, out = time.perf_counter(), {}
    for d in self.datasets:
      x, y = self._split_features(params, d, d.train_split)
      test = self._split_features(params, d, self.config.eval.fewshot.test_split)
      out[d.name] = accuracies(d.draws, (x, y), test, d.info.num_classes, self.config.eval.fewshot.l2_reg)
    self.seconds = time.perf_counter() - start
    return out

  def evaluate(self, params: nnx.State) -> dict[str, float]:
    """{'eval/fewshot/<dataset>/<k>shot': mean test accuracy over the draws}."""
    results = self.results(params)
    return {f'eval/fewshot/{name}/{k}shot': float(a.mean()) for name, by_k in results.items() for k, a in by_k.items()}

  def summary(self, metrics: dict[str, float]) -> str:
    """One line of `evaluate`'s metrics and the time it took."""
    scores = '  '.join(f'{k.removeprefix("eval/fewshot/")} {v:.4f}' for k, v in metrics.items())
    return f'{scores}  ({self.seconds:.1f}s)'

  def _split_features(self, params: nnx.State, d: _Dataset, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of every example of `split`, in the split's order."""
    data_config = copy.deepcopy(d.data_config)
    data_config.eval_split = split
    batches = pipeline.eval_batches(
      d.builder,
      data_config,
      labels_lib.preprocess_fn(data_config, d.info, train=False),
      jax.sharding.NamedSharding(self.mesh, parallel.BATCH),
      labels_lib.prepare_fn(d.info),
    )
    rows = [jax.device_get(self._features(params, batch)) for batch in batches]
    num_shards = data_lib.shards(data_config, 'eval_batch_size')[1]
    # Batch j holds rows j*b... of every shard side by side, each shard a contiguous part of the split padded at
    # its end: ordered by shard, then batch, the real rows are the split in order.
    x, y, mask = (
      np.stack([r[i] for r in rows]).reshape(len(rows), num_shards, -1, *rows[0][i].shape[1:]).swapaxes(0, 1)
      for i in range(3)
    )
    keep = mask.reshape(-1) > 0
    x, y = x.reshape(keep.size, -1)[keep], y.reshape(-1)[keep]
    if split == d.train_split and not np.array_equal(y, d.train_labels):
      raise RuntimeError(f"few-shot features of {d.name} {split} are not in the split's order")  # A bug of ours.
    return x, y


def _labels(builder: tfds.core.DatasetBuilder, split: str, info: LabelInfo) -> np.ndarray:
  """The labels of `split` in order, read without decoding the images."""
  ds = builder.as_dataset(
    split=split,
    shuffle_files=False,
    decoders={info.input_key: tfds.decode.SkipDecoding()},
    read_config=tfds.ReadConfig(add_tfds_id=False, try_autocache=False),
  )
  batches = ds.map(lambda ex: ex['label']).batch(65_536).as_numpy_iterator()
  return np.concatenate([np.zeros([0], np.int64), *batches]).astype(np.int32)


def _features_fn(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, graphdef: nnx.GraphDef, param_shardings):
  """(params, batch) -> (features float32, label, mask), each gathered whole on every process. A video's views
  ('views': clips x crops) are represented by their mean features, as evaluation averages their logits."""
  dtype = jnp.dtype(config.compute_dtype)

  def cast(tree):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

  def features(params, batch):
    model = nnx.merge(graphdef, cast(params))
    batch = data_device.eval_inputs(batch, config.data)
    if 'views' in batch:
      views = batch['views']
      x = model.features(cast(views.reshape(-1, *views.shape[2:])), train=False).astype(jnp.float32)
      x = x.reshape(*views.shape[:2], -1).mean(1)
    else:
      x = model.features(cast(batch['inputs']), train=False).astype(jnp.float32)
    return x, batch['label'], batch['mask']

  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(
    features,
    in_shardings=(param_shardings, jax.sharding.NamedSharding(mesh, parallel.BATCH)),
    out_shardings=replicated,
    compiler_options=parallel.compiler_options(mesh),
  )
