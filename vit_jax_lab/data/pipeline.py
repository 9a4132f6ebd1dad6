"""TFDS -> per-process shards -> shuffled, preprocessed, batched -> global `jax.Array`s.

Determinism: the train stream of a shard is a pure function of (seed, shard, example index). Epoch e
is the shard's examples shuffled with a seed derived from (seed, shard, e), and each example's
augmentation is seeded by its index in the stream. A run resumed at step s rebuilds the stream from
epoch floor(s * b / n) and skips the rest of that epoch's consumed examples (reading, not decoding: images and
videos are read as their files and decoded by the preprocessing, after the shuffle). With
repeated augmentation (`data.repeated_augment` = r), each example of an epoch comes r times in a row, copy k of the
example at index i seeded by i * r + k, so an epoch is n * r long.

With a token budget (`data.token_budget`), examples are put in length buckets, and each shard has one such
stream per bucket, of that bucket's examples only, batched to as many rows as fit the budget at the bucket's
length. A shard's prepared examples (token ids) are read and prepared once and held in memory, and each epoch of a
bucket's stream is a whole permutation of them (data.shuffle_buffer is not used). Which bucket step s takes is a
fixed schedule, the same on every process (so global batch shapes agree), that gives each bucket its share of the
steps by its batches per epoch; a resumed run starts each bucket's stream after the batches the schedule gave that
bucket before step s.
"""

import contextlib
import dataclasses
import itertools
import math
import re
from typing import Callable, Iterator

import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from jax.experimental import multihost_utils

from vit_jax_lab import data as data_lib
from vit_jax_lab.data import builders
from vit_jax_lab.data.builders import folder
from vit_jax_lab.errors import ConfigError, check

# TensorFlow only feeds data; an accelerator it grabbed would be taken from JAX.
tf.config.set_visible_devices([], 'GPU')

Batch = dict[str, jax.Array]
Preprocess = Callable[[dict, tf.Tensor], dict]  # May carry .padded_to: {key: length} when all it does is pad ids.
Prepare = Callable[[tf.data.Dataset], tf.data.Dataset]  # May carry .batches: the same as ragged batches (Held).


load = builders.load  # The tf.data backend reads what the TF-free loader finds and prepares.


@contextlib.contextmanager
def _readable(builder: tfds.core.DatasetBuilder) -> Iterator[None]:
  """A prepared record file cut short or corrupted (a full disk or a crash while it was written, a bad copy) is a
  ConfigError naming the dataset and the fix, not TensorFlow's DataLossError (or, for a file cut between two records,
  TFDS's count of the examples it read, a FailedPreconditionError)."""
  try:
    yield
  except (tf.errors.NotFoundError, tf.errors.PermissionDeniedError) as e:  # A file read by path (frames_root).
    reason = re.sub(r'^\{\{.*?\}\}\s*|\s*\[Op:.*$', '', e.message.splitlines()[0])[:300]
    if isinstance(builder, folder.Folder):  # Its videos' frames, in the prepared copy.
      fix = f'delete {builder.data_dir} and run again: it is prepared anew'
    else:
      fix = 'put it back where the data was prepared from'
    where = f'{builder.name} in {builder.data_dir}'
    raise ConfigError(f'{where} reads a file that cannot be read ({reason}): {fix}') from None
  except (tf.errors.DataLossError, tf.errors.FailedPreconditionError) as e:
    if isinstance(e, tf.errors.FailedPreconditionError) and 'was expected to contain' not in e.message:
      raise
    if isinstance(builder, folder.Folder) or builders.is_builtin(builder.name):
      fix = f'delete {builder.data_dir} and run again: it is prepared anew'
    else:
      fix = f'rebuild it (`tfds build {builder.name} --data_dir DIR`) or delete {builder.data_dir} and build it again'
    reason = re.sub(r'^\{\{.*?\}\}\s*|\s*\[Op:.*$', '', e.message.splitlines()[0]).replace("'", '')[:120]
    where = f'{builder.name} in {builder.data_dir}'
    raise ConfigError(f'the prepared data of {where} is damaged ({reason}): {fix}') from None


@dataclasses.dataclass(frozen=True)
class Buckets:
  """Token-budget batching (`data.token_budget`) as a task defines it: what an example's length is, and how a
  batch of examples of one bucket is cut to that bucket's length. The pipeline knows no features."""

  longest: int  # Tokens of the longest bucket; the shorter ones are the powers of two from 8 below it.
  length: Callable[[dict], tf.Tensor]  # A batch of prepared examples (ragged) -> (B,) lengths in tokens.
  cut: Callable[[dict, int], dict]  # A preprocessed batch and a bucket length -> the batch at that length.

  def lengths(self) -> list[int]:
    return [2**k for k in range(3, self.longest.bit_length()) if 2**k < self.longest] + [self.longest]


def bucket_rows(data_config, lengths: list[int], multiple: int) -> list[int]:
  """Rows of a batch of each bucket length: as many as fit `data.token_budget` padded tokens, rounded down to a
  multiple of `multiple` (batch shards x accum_steps) and of the data shards, so that every batch divides."""
  budget, unit = data_config.token_budget, math.lcm(multiple, data_lib.shard_ids(data_config)[1])
  check(
    budget // max(lengths) >= unit,
    f'data.token_budget={budget} is too small: a batch of the longest bucket ({max(lengths)} tokens) needs at '
    f'least {unit} rows (a multiple of batch shards x accum_steps and of data.shards); use at least '
    f'{unit * max(lengths)}',
  )
  return [budget // length // unit * unit for length in lengths]


def _read(builder, split: str, cache: bool, prepare: Prepare, encoded: bool = True) -> tf.data.Dataset:
  """The split's examples in order, after the task's `prepare` (deterministic: feature selection,
  tokenisation, length filtering). `encoded`: images and videos stay the files they are stored as (a string, or
  a string per frame) until the task's preprocessing decodes them (images.decode), after the shuffle: the
  shuffle buffer and the cache hold files, not pixels (~8x smaller for ImageNet's JPEGs), and a resume skips
  examples without decoding them. A `cache` holds images decoded where their pixels take at most twice their
  records' bytes (`pixels_fit`)."""
  keys = [k for k in encoded_features(builder) if not (cache and pixels_fit(builder, k))]
  decoders = {k: tfds.decode.SkipDecoding() for k in keys} if encoded else None
  ds = builder.as_dataset(
    split=split,
    shuffle_files=False,
    decoders=decoders,
    read_config=tfds.ReadConfig(add_tfds_id=False, try_autocache=False),
  )
  ds = prepare(ds)
  return ds.cache() if cache else ds


DECODED_CACHE = 2.0  # data.cache holds images decoded where their pixels are at most this many records' bytes.


def pixel_bytes(builder, key: str) -> int | None:
  """The bytes of an image of feature `key` decoded, when all its images have one size; else None."""
  feature = builder.info.features[key]
  if not isinstance(feature, tfds.features.Image) or None in feature.shape:
    return None
  return math.prod(feature.shape) * np.dtype(feature.np_dtype).itemsize


def record_bytes(builder) -> float:
  """The mean bytes of a record of the dataset, over its splits."""
  splits = builder.info.splits.values()
  return sum(s.num_bytes for s in splits) / max(sum(s.num_examples for s in splits), 1)


def pixels_fit(builder, key: str) -> bool:
  """Whether the images of feature `key` all have one size whose pixels take at most DECODED_CACHE times the bytes
  of a record (CIFAR's 32x32: 3,072 bytes against 2.3 KB records of PNG; a 64-pixel JPEG ImageNet's 5x). A cache
  then holds them decoded, and every epoch after the first decodes nothing (as FFCV stores small images raw)."""
  pixels = pixel_bytes(builder, key)
  return pixels is not None and pixels <= DECODED_CACHE * record_bytes(builder)


def encoded_features(builder) -> list[str]:
  """The image and video features of a dataset, which `_read` keeps encoded."""
  features = builder.info.features
  return [k for k, f in features.items() if isinstance(f, (tfds.features.Image, tfds.features.Video))]


ELEMENT_BYTES = 400  # tf.data's cost of a buffered element besides its data (measured: ~360 for one small tensor).
BATCHES_IN_FLIGHT = 4  # Prefetched and in-flight batches counted per data shard (AUTOTUNE holds a few).


@dataclasses.dataclass(frozen=True)
class HostMemory:
  """What a run's input pipeline holds in host memory, estimated before it runs."""

  example_bytes: float  # A training example as the shuffle buffer holds it: its record's bytes, images encoded.
  buffered: int  # Examples in shuffle buffers (and the cache, with data.cache), over this process's data shards.
  batch_bytes: int  # A preprocessed per-shard training batch; 0 where not worked out (see host_memory).
  shards: int  # This process's data shards.

  @property
  def total(self) -> float:
    return self.buffered * self.example_bytes + self.shards * BATCHES_IN_FLIGHT * self.batch_bytes


def host_memory(
  builder, data_config, prepare: Prepare, preprocess: Preprocess, buckets: Buckets | None, batches_from: float = 0.0
) -> HostMemory:
  """The host memory the training input pipeline will hold, from its buffer sizes and the dataset's recorded bytes
  per example (TFDS's split sizes: images and videos as their files, which is how the buffers hold them), and,
  when the buffers or the batches at their records' size come to `batches_from` bytes or more, from its batch (the
  preprocessing is traced for its output shapes, ~1 s for the DeiT recipe, so small runs skip it)."""
  local_shards, num_shards, shard_batch = data_lib.shards(data_config, 'batch_size')
  example_bytes = ELEMENT_BYTES + record_bytes(builder)
  if data_config.cache:  # Its images held decoded (pixels_fit): the shuffle buffers, after the cache, hold them so.
    decoded = [pixel_bytes(builder, k) for k in encoded_features(builder) if pixels_fit(builder, k)]
    example_bytes = max(example_bytes, ELEMENT_BYTES + sum(decoded))
  per_shard = builder.info.splits[data_config.train_split].num_examples // num_shards
  if buckets is None:
    buffered = (min(data_config.shuffle_buffer, per_shard) + per_shard * data_config.cache) * len(local_shards)
  else:  # The prepared split is held in memory (Held), and shuffled there.
    buffered = per_shard * len(local_shards)
  batch_bytes = 0
  # Traced where the buffers, or the batches in flight at the records' own size or at data.image_size (small
  # records enlarged: 8x8 digits at 224), come near the limit.
  frames = data_config.num_frames if 'video' in builder.info.features else 1
  enlarged = (data_config.image_size or 0) ** 2 * 3 * frames
  in_flight = BATCHES_IN_FLIGHT * shard_batch * len(local_shards) * max(example_bytes, enlarged)
  if buffered * example_bytes + in_flight >= batches_from and not buckets:
    ds = _read(builder, data_config.train_split, False, prepare)
    spec = ds.map(lambda ex: preprocess(ex, tf.zeros([2], tf.int64)))
    shapes = [s for s in tf.nest.flatten(spec.element_spec) if s.shape.is_fully_defined()]
    batch_bytes = shard_batch * sum(math.prod(s.shape) * s.dtype.size for s in shapes)
  return HostMemory(example_bytes, buffered, batch_bytes, len(local_shards))


def _count(ds: tf.data.Dataset, builder) -> int:
  """Examples in `ds`; a filtered dataset is read once to count them."""
  n = int(ds.cardinality())
  if n >= 0:
    return n
  with _readable(builder):
    return int(ds.reduce(0, lambda count, _: count + 1))


def _to_global(ds: tf.data.Dataset, sharding: jax.sharding.Sharding, builder) -> Iterator[Batch]:
  with _readable(builder):
    for local in ds.as_numpy_iterator():
      yield data_lib.global_batch(local, sharding)


def _example_seed(seed: int, shard: int, index: tf.Tensor) -> tf.Tensor:
  return tf.stack([tf.constant(seed * 1_000_003 + shard, tf.int64), tf.cast(index, tf.int64)])


def train_iterator(
  builder,
  data_config,
  preprocess: Preprocess,
  sharding: jax.sharding.Sharding,
  *,
  seed: int,
  start_step: int,
  prepare: Prepare,
  pack: tuple[int, Callable[[dict, int], dict]] | None = None,
  buckets: Buckets | None = None,
  rows_multiple: int = 1,
) -> Iterator[Batch]:
  """Endless global train batches, starting at `start_step` exactly as an uninterrupted run would.
  `pack`: (k, fn): fn(examples, rows) packs k batches' worth of examples into a batch of `rows` rows.
  `buckets`: batches by `data.token_budget` instead, with rows a multiple of `rows_multiple` (see `bucket_rows`)."""
  if buckets is not None:
    ds = _bucketed(builder, data_config, preprocess, buckets, rows_multiple, seed, start_step, prepare)
    return _to_global(ds.prefetch(tf.data.AUTOTUNE), sharding, builder)
  local_shards, num_shards, shard_batch = data_lib.shards(data_config, 'batch_size')
  per_batch = shard_batch * (pack[0] if pack else 1)
  repeats = data_config.repeated_augment  # Each example this many times in a row, a seed (stream index) per copy.
  check(
    per_batch % repeats == 0,
    f'data.batch_size={data_config.batch_size} is {per_batch} examples per data shard, which does not divide by '
    f'data.repeated_augment={repeats}',
  )
  streams = []
  for shard in local_shards:
    split = tfds.split_for_jax_process(data_config.train_split, process_index=shard, process_count=num_shards)
    base = _read(builder, split, data_config.cache, prepare)
    n = _count(base, builder)
    check(n > 0, f'data shard {shard} of {data_config.train_split} has no examples: use fewer data.shards')
    # The stream runs over the epochs back to back and is batched after, so a batch larger than the shard (a small
    # dataset of one's own) holds an epoch and more: the same examples, each augmented with its own seed.
    buffer = min(data_config.shuffle_buffer, n)

    def epoch(e, base=base, n=n, shard=shard, buffer=buffer):
      order = base.shuffle(buffer, seed=(seed * 1_000_003 + shard) * 1_000_003 + e, reshuffle_each_iteration=False)
      return tf.data.Dataset.zip(tf.data.Dataset.range(e * n, (e + 1) * n), order)

    start_epoch, offset = divmod(start_step * per_batch, n * repeats)
    ds = tf.data.Dataset.range(start_epoch, 2**62).flat_map(epoch)
    if repeats > 1:
      ds = ds.flat_map(
        lambda i, ex: tf.data.Dataset.zip(
          tf.data.Dataset.range(i * repeats, (i + 1) * repeats), tf.data.Dataset.from_tensors(ex).repeat(repeats)
        )
      )
    ds = ds.skip(offset).map(
      lambda i, ex, shard=shard: preprocess(ex, _example_seed(seed, shard, i)),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )
    ds = ds.batch(per_batch, drop_remainder=True)
    if repeats > 1:
      ds = ds.map(lambda b: _spread(b, repeats), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if pack:
      ds = ds.map(lambda b: pack[1](b, shard_batch), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    streams.append(ds)
  ds = _concat(streams).prefetch(tf.data.AUTOTUNE)
  return _to_global(ds, sharding, builder)


def _spread(batch: dict, repeats: int) -> dict:
  """Rows (example j, copy k) at j * repeats + k moved to k * (rows / repeats) + j: the copies of an example lie
  apart, on other devices (as DeiT's sampler sends them to other GPUs), and a row's neighbour is another example."""

  def spread(x):
    x = tf.reshape(x, tf.concat([[-1, repeats], tf.shape(x)[1:]], 0))
    return tf.reshape(tf.experimental.numpy.swapaxes(x, 0, 1), tf.concat([[-1], tf.shape(x)[2:]], 0))

  return tf.nest.map_structure(spread, batch)


def _bucketed(
  builder,
  data_config,
  preprocess: Preprocess,
  buckets: Buckets,
  rows_multiple: int,
  seed: int,
  start_step: int,
  prepare: Prepare,
) -> tf.data.Dataset:
  """Local train batches by token budget: per shard and bucket group, the shard's epochs of that group's examples
  (each a permutation drawn from (seed, shard, group, epoch): Held.stream; augmentations seeded by epoch and
  example), batched; step s takes the bucket `_schedule` gives it."""
  local_shards, num_shards = data_lib.shard_ids(data_config)
  lengths = tf.constant(buckets.lengths(), tf.int32)
  padded_to = getattr(preprocess, 'padded_to', None)

  def with_buckets(batch):
    return tf.searchsorted(lengths, tf.cast(buckets.length(batch), tf.int32)), batch

  # The examples are read, prepared and bucketed a batch at a time: per-example tf.data ops (unbatch, filter, map)
  # cost WMT's 4.5M pairs more than tokenising them does.
  batches = getattr(prepare, 'batches', None) or (lambda ds: prepare(ds).ragged_batch(Held.READ_BATCH))
  held = []  # Each shard's prepared examples (e.g. token ids), read and prepared once, in memory, with their buckets.
  for shard in local_shards:
    split = tfds.split_for_jax_process(data_config.train_split, process_index=shard, process_count=num_shards)
    prepared = _read(builder, split, False, batches)
    with _readable(builder):
      held.append(Held(prepared.map(with_buckets, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)))
  counts = np.stack(
    [np.bincount(h.buckets, minlength=len(buckets.lengths())) for h in held]
  )  # (shard, bucket): examples of each bucket length; every process needs all.
  if jax.process_count() > 1:
    counts = np.asarray(multihost_utils.process_allgather(counts.astype(np.int32))).reshape(num_shards, -1)
  groups = _groups(counts)
  rows = bucket_rows(data_config, [buckets.lengths()[last] for _, last in groups], rows_multiple)
  per_epoch = [counts[:, first : last + 1].sum() / r for (first, last), r in zip(groups, rows)]  # Batches.
  weights = [max(1, round(4096 * b / max(per_epoch))) for b in per_epoch]  # Proportions to 1/4096 of the largest.
  period = _schedule(weights)
  cycles, into = divmod(start_step, len(period))
  used = cycles * np.array(weights) + np.bincount(period[:into], minlength=len(groups))  # Batches before start.
  per_group = []
  for g, ((first, last), r) in enumerate(zip(groups, rows)):
    length, per_batch, streams = buckets.lengths()[last], r // num_shards, []
    for shard, h in zip(local_shards, held):
      mine = np.flatnonzero((h.buckets >= first) & (h.buckets <= last))
      start_epoch, offset = divmod(int(used[g]) * per_batch, len(mine))
      if padded_to:  # Token ids only: whole batches padded in NumPy, no tf.data op per example.
        widths = {k: min(length, width) for k, width in padded_to.items()}
        streams.append(h.padded(mine, (seed, shard, first), start_epoch, offset, per_batch, widths))
        continue
      ds = h.stream(mine, (seed, shard, first), start_epoch, offset)
      ds = ds.map(
        lambda i, ex, shard=shard: preprocess(ex, _example_seed(seed, shard, i)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
      )
      streams.append(ds.batch(per_batch, drop_remainder=True).map(lambda b, length=length: buckets.cut(b, length)))
    per_group.append(_concat(streams))
  schedule = tf.data.Dataset.from_tensor_slices(np.roll(period, -into)).repeat()
  return tf.data.Dataset.choose_from_datasets(per_group, schedule)


class Held:
  """A data shard's prepared examples with their buckets, read once into memory as NumPy (a variable-length feature
  as one flat array and offsets: O(tokens), no Python object per example), so that each bucket group's stream picks
  its examples by index instead of reading, tokenising and filtering the split again. Its epochs are whole
  permutations (the examples are all in memory: no shuffle buffer to fill before the first batch)."""

  READ_BATCH = 4096

  def __init__(self, ds: tf.data.Dataset):
    """`ds`: batches of (buckets (B,), prepared examples: ragged where their length varies)."""
    self.spec = {  # One example's.
      k: tf.TensorSpec([None], v.dtype) if isinstance(v, tf.RaggedTensorSpec) else tf.TensorSpec(v.shape[1:], v.dtype)
      for k, v in ds.element_spec[1].items()
    }
    buckets, parts = [], {k: [] for k in self.spec}
    for b, ex in ds:
      buckets.append(b.numpy())
      for k, v in ex.items():
        parts[k].append(
          (v.flat_values.numpy(), v.row_lengths().numpy()) if isinstance(v, tf.RaggedTensor) else v.numpy()
        )
    self.buckets = np.concatenate(buckets) if buckets else np.zeros(0, np.int32)
    self.features = {}
    for k, chunks in parts.items():
      if chunks and isinstance(chunks[0], tuple):
        lengths = np.concatenate([c[1] for c in chunks])
        self.features[k] = (np.concatenate([c[0] for c in chunks]), np.concatenate([[0], np.cumsum(lengths)]))
      else:
        self.features[k] = np.concatenate(chunks) if chunks else np.zeros((0,), self.spec[k].dtype.as_numpy_dtype)

  def rows(self, indices: np.ndarray) -> dict:
    """The examples at `indices` as a batch: variable-length features as ragged tensors (gathered in NumPy)."""
    out = {}
    for k, v in self.features.items():
      if isinstance(v, tuple):
        flat, offsets = v
        starts, lengths = offsets[indices], offsets[indices + 1] - offsets[indices]
        ends = np.cumsum(lengths)
        gather = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lengths - starts, lengths)
        out[k] = tf.RaggedTensor.from_row_lengths(flat[gather], lengths)
      else:
        out[k] = v[indices]
    return out

  @staticmethod
  def epochs(indices: np.ndarray, key: tuple[int, ...], start_epoch: int, offset: int) -> Iterator:
    """(epoch, the examples at `indices` in its order), from `start_epoch` on, `offset` examples into it."""
    for e in itertools.count(start_epoch):
      order = indices[np.random.default_rng([*key, e]).permutation(len(indices))]
      yield e, order[offset:] if e == start_epoch else order

  def padded(
    self, indices: np.ndarray, key: tuple[int, ...], start_epoch: int, offset: int, batch: int, widths: dict
  ) -> tf.data.Dataset:
    """`stream`'s examples in batches of `batch`, each feature of `widths` cut or padded with zeros (PAD) to its
    width there: what `stream`, a padding preprocess, .batch(batch) and the bucket's cut give, made in NumPy."""

    def batches():
      pending = np.zeros(0, np.int64)
      for _, order in self.epochs(indices, key, start_epoch, offset):
        pending = np.concatenate([pending, order])
        while len(pending) >= batch:
          rows, pending = pending[:batch], pending[batch:]
          yield {k: self.dense(k, rows, width) for k, width in widths.items()}

    signature = {k: tf.TensorSpec([batch, width], self.spec[k].dtype) for k, width in widths.items()}
    return tf.data.Dataset.from_generator(batches, output_signature=signature)

  def dense(self, k: str, rows: np.ndarray, width: int) -> np.ndarray:
    """Variable-length feature `k` of the examples at `rows`, each cut or zero-padded to `width`."""
    flat, offsets = self.features[k]
    lengths = np.minimum(offsets[rows + 1] - offsets[rows], width)
    out = np.zeros((len(rows), width), flat.dtype)
    mask = np.arange(width) < lengths[:, None]
    out[mask] = flat[(offsets[rows][:, None] + np.arange(width))[mask]]
    return out

  def stream(self, indices: np.ndarray, key: tuple[int, ...], start_epoch: int, offset: int) -> tf.data.Dataset:
    """(stream index, example) of the examples at `indices`, epoch after epoch from `start_epoch`, `offset` examples
    into it: epoch e is a permutation drawn from (*key, e); the stream index e * n + i, with i the example's index in
    the shard (of n), seeds its augmentation. Made by a generator a chunk of examples at a time (the data stays out
    of tf.data's graph, which holds at most 2 GB)."""
    n = len(self.buckets)

    def chunks():
      for e, order in self.epochs(indices, key, start_epoch, offset):
        for c in range(0, len(order), self.READ_BATCH):
          rows = order[c : c + self.READ_BATCH]
          yield e * n + rows.astype(np.int64), self.rows(rows)

    signature = {
      k: tf.RaggedTensorSpec([None, None], v.dtype, 1, tf.int64)
      if v.shape.rank == 1 and v.shape[0] is None
      else tf.TensorSpec([None, *v.shape], v.dtype)
      for k, v in self.spec.items()
    }
    ds = tf.data.Dataset.from_generator(chunks, output_signature=(tf.TensorSpec([None], tf.int64), signature))
    return ds.unbatch()


def _groups(counts: np.ndarray) -> list[tuple[int, int]]:
  """The buckets batched together, as (first, last) bucket ranges padded to the last's length: a bucket some shard
  has no example of joins the next longer one (the longest such joins the one before), since a stream that
  filters for examples that never come never yields. `counts`: (shard, bucket) examples."""
  empty = counts.sum(1) == 0
  check(not empty.any(), f'data shard {int(np.argmax(empty))} has no training examples')
  top = int(np.flatnonzero(counts.sum(0))[-1])  # Longer buckets have no example anywhere.
  groups, first = [], 0
  for last in range(top + 1):
    if (counts[:, first : last + 1].sum(1) > 0).all():
      groups.append((first, last))
      first = last + 1
  if first <= top:
    groups[-1] = (groups[-1][0], top)
  return groups


def _schedule(weights: list[int]) -> np.ndarray:
  """One period of the step -> bucket schedule, which repeats: at each step the bucket furthest behind its share
  (smooth weighted round-robin, as nginx's). Bucket g takes weights[g] of the sum(weights) steps, evenly spread;
  with weights in proportion to batches per epoch, all buckets go through their epochs at the same pace."""
  credit, total, period = np.zeros(len(weights), np.int64), sum(weights), []
  for _ in range(total):
    credit += weights
    period.append(int(np.argmax(credit)))  # The first of equals.
    credit[period[-1]] -= total
  return np.array(period, np.int64)


def eval_batches(
  builder, data_config, preprocess: Preprocess, sharding: jax.sharding.Sharding, prepare: Prepare
) -> Iterator[Batch]:
  """The whole eval split once, in order; the last batches are padded with `mask` = 0."""
  local_shards, num_shards, shard_batch = data_lib.shards(data_config, 'eval_batch_size')
  splits = [
    tfds.split_for_jax_process(data_config.eval_split, process_index=s, process_count=num_shards)
    for s in range(num_shards)
  ]
  num_batches = max(math.ceil(builder.info.splits[s].num_examples / shard_batch) for s in splits)
  streams = []
  for shard in local_shards:
    ds = _read(builder, splits[shard], data_config.cache, prepare).map(
      lambda ex: preprocess(ex, tf.zeros([2], tf.int64)) | {'mask': tf.constant(1.0)},
      num_parallel_calls=tf.data.AUTOTUNE,
    )
    padding = tf.data.Dataset.from_tensors(
      tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), ds.element_spec)
    ).repeat()
    streams.append(ds.concatenate(padding).take(num_batches * shard_batch).batch(shard_batch))
  return _to_global(_concat(streams).prefetch(tf.data.AUTOTUNE), sharding, builder)


def eval_examples(builder, data_config, prepare: Prepare) -> Iterator[dict[str, np.ndarray]]:
  """This process's share of the eval split, one example at a time, as NumPy (for sequential evaluation)."""
  split = tfds.split_for_jax_process(data_config.eval_split)
  with _readable(builder):
    yield from _read(builder, split, False, prepare, encoded=False).as_numpy_iterator()


def _concat(streams: list[tf.data.Dataset]) -> tf.data.Dataset:
  """Batches of the local shards side by side: rows of shard k follow those of shard k - 1."""
  if len(streams) == 1:
    return streams[0]
  return tf.data.Dataset.zip(tuple(streams)).map(lambda *b: {k: tf.concat([x[k] for x in b], axis=0) for k in b[0]})
