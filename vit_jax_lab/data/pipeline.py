"""TFDS -> per-process shards -> shuffled, preprocessed, batched -> global `jax.Array`s.

Determinism: the train stream of a shard is a pure function of (seed, shard, example index). Epoch e
is the shard's examples shuffled with a seed derived from (seed, shard, e), and each example's
augmentation is seeded by its index in the stream. A run resumed at step s rebuilds the stream from
epoch floor(s * b / n) and skips the rest of that epoch's consumed examples (reading, not decoding).
"""

import contextlib
import io
import math
from typing import Any, Callable, Iterator

import jax
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax_lab.data import builders
from vit_jax_lab.errors import ConfigError, check

Batch = dict[str, jax.Array]
Preprocess = Callable[[dict, tf.Tensor], dict]
Prepare = Callable[[tf.data.Dataset], tf.data.Dataset]


def load(data_config, info_fn: Callable[[tfds.core.DatasetBuilder, Any], Any]) -> tuple[tfds.core.DatasetBuilder, Any]:
  """The TFDS builder (built-in datasets are generated on first use) and what the task needs to know of the
  data: `info_fn(builder, data_config)`."""
  builders.check_data_dir(data_config)
  name, data_dir = data_config.name, data_config.data_dir
  if builders.is_builtin(name):
    builders.register(name)
    builder = tfds.builder(name, data_dir=data_dir)
    _prepare_once(builder)
  else:
    try:
      builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
      raise ConfigError(
        f'data.name={name!r} is not a TFDS dataset; built-in ones: {", ".join(builders.BUILTIN)}'
      ) from None
    check(
      builder.is_prepared(),
      f'data.name={name!r} is not prepared in data.data_dir={data_dir!r}: run `tfds build {name} '
      '--data_dir DIR` where there is network, then set data.data_dir=DIR',
    )
  for key in ('train_split', 'eval_split'):
    try:
      builder.info.splits[data_config[key]]
    except (KeyError, ValueError) as e:
      raise ConfigError(
        f'data.{key}={data_config[key]!r} is not a split of {name}: '
        f'valid ones are {", ".join(builder.info.splits)} (TFDS slicing allowed)'
      ) from e
  return builder, info_fn(builder, data_config)


def _prepare_once(builder: tfds.core.DatasetBuilder) -> None:
  """Process 0 generates a built-in dataset first, so hosts that share a disk do not race."""
  if jax.process_index() == 0 and not builder.is_prepared():
    _generate(builder)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices('data prepared')
    if not builder.is_prepared():  # Hosts without a shared disk build their own copy.
      _generate(builder)


def _generate(builder: tfds.core.DatasetBuilder) -> None:
  """One line of ours instead of TFDS's two bold ones about downloads that do not happen."""
  print(f'generating the built-in dataset {builder.name} in {builder.data_dir} (once, without network)', flush=True)
  with contextlib.redirect_stdout(io.StringIO()):
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def shards(data_config, batch_key: str) -> tuple[list[int], int, int]:
  """(this process's shard ids, number of shards, examples per shard in a `data.<batch_key>` batch)."""
  global_batch = data_config[batch_key]
  count = jax.process_count() if data_config.shards == -1 else data_config.shards
  check(
    count % jax.process_count() == 0,
    f'data.shards={count} must be a multiple of the process count {jax.process_count()}',
  )
  check(global_batch % count == 0, f'data.{batch_key}={global_batch} must be divisible by data.shards={count}')
  per_process = count // jax.process_count()
  first = jax.process_index() * per_process
  return list(range(first, first + per_process)), count, global_batch // count


def _read(builder, split: str, cache: bool, prepare: Prepare) -> tf.data.Dataset:
  """The split's examples in order, after the task's `prepare` (deterministic: feature selection,
  tokenisation, length filtering)."""
  ds = builder.as_dataset(
    split=split, shuffle_files=False, read_config=tfds.ReadConfig(add_tfds_id=False, try_autocache=False)
  )
  ds = prepare(ds)
  return ds.cache() if cache else ds


def _count(ds: tf.data.Dataset) -> int:
  """Examples in `ds`; a filtered dataset is read once to count them."""
  n = int(ds.cardinality())
  return n if n >= 0 else int(ds.reduce(0, lambda count, _: count + 1))


def _to_global(ds: tf.data.Dataset, sharding: jax.sharding.Sharding) -> Iterator[Batch]:
  for local in ds.as_numpy_iterator():
    yield {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}


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
) -> Iterator[Batch]:
  """Endless global train batches, starting at `start_step` exactly as an uninterrupted run would.
  `pack`: (k, fn): fn(examples, rows) packs k batches' worth of examples into a batch of `rows` rows."""
  local_shards, num_shards, shard_batch = shards(data_config, 'batch_size')
  per_batch = shard_batch * (pack[0] if pack else 1)
  streams = []
  for shard in local_shards:
    split = tfds.split_for_jax_process(data_config.train_split, process_index=shard, process_count=num_shards)
    base = _read(builder, split, data_config.cache, prepare)
    n = _count(base)
    check(n >= per_batch, f'data shard {shard} has {n} examples, fewer than its batch {per_batch}')
    buffer = min(data_config.shuffle_buffer, n)

    def epoch(e, base=base, n=n, shard=shard):
      order = base.shuffle(buffer, seed=(seed * 1_000_003 + shard) * 1_000_003 + e, reshuffle_each_iteration=False)
      return tf.data.Dataset.zip(tf.data.Dataset.range(e * n, (e + 1) * n), order)

    start_epoch, offset = divmod(start_step * per_batch, n)
    ds = tf.data.Dataset.range(start_epoch, 2**62).flat_map(epoch).skip(offset)
    ds = ds.map(
      lambda i, ex, shard=shard: preprocess(ex, _example_seed(seed, shard, i)),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )
    ds = ds.batch(per_batch, drop_remainder=True)
    if pack:
      ds = ds.map(lambda b: pack[1](b, shard_batch), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    streams.append(ds)
  ds = _concat(streams).prefetch(tf.data.AUTOTUNE)
  return _to_global(ds, sharding)


def eval_batches(
  builder, data_config, preprocess: Preprocess, sharding: jax.sharding.Sharding, prepare: Prepare
) -> Iterator[Batch]:
  """The whole eval split once, in order; the last batches are padded with `mask` = 0."""
  local_shards, num_shards, shard_batch = shards(data_config, 'eval_batch_size')
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
  return _to_global(_concat(streams).prefetch(tf.data.AUTOTUNE), sharding)


def _concat(streams: list[tf.data.Dataset]) -> tf.data.Dataset:
  """Batches of the local shards side by side: rows of shard k follow those of shard k - 1."""
  if len(streams) == 1:
    return streams[0]
  return tf.data.Dataset.zip(tuple(streams)).map(lambda *b: {k: tf.concat([x[k] for x in b], axis=0) for k in b[0]})
