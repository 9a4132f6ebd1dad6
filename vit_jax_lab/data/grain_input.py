"""The grain backend (data.backend='grain'): image classification batches from an ArrayRecord copy of the prepared
dataset, read by index with grain and preprocessed with NumPy and PIL (pil_images.py), without TensorFlow.

Determinism, as pipeline.py's: the examples of a data shard form a stream of epochs; epoch e is a permutation of
the shard's n examples drawn from (seed, shard, e), and each copy of an example (data.repeated_augment = r copies)
is augmented by a generator seeded with (seed, shard, its stream index). Batch s of a shard holds stream positions
s * b to (s + 1) * b - 1, so a batch is a function of its step alone: grain makes batch s as element s of a
MapDataset of batches, the same batches come from 0 or N worker processes, and a resumed run starts at its step
with nothing read or skipped before it (and nothing added to checkpoints). There is no shuffle buffer.

The shuffles and augmentations differ from tf.data's (other generators), so a run keeps its backend on resume.
TFDS 4.9 reads ArrayRecord only as a data source, not with as_dataset, and prepares data as TFRecord; the first
run on this backend copies the prepared TFRecord files, record for record, into ArrayRecord files in an
`array_record` folder inside the dataset's folder (about the same bytes again; made once, again when the dataset is
prepared anew).
"""

import errno
import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
from typing import Any, Callable, Iterator

import grain
import jax
import numpy as np
import tensorflow_datasets as tfds
from absl import flags
from array_record.python import array_record_module
from jax.experimental import multihost_utils

from vit_jax_lab import data as data_lib, errors, supervisor, tfrecord
from vit_jax_lab.data import builders, info as data_info, pil_images
from vit_jax_lab.data.info import LabelInfo
from vit_jax_lab.errors import ConfigError, check

ARRAY_RECORD = 'array_record'  # The copy's folder, inside the prepared dataset's folder.
SOURCE = 'source.json'  # In the copy: what it was copied from, so a dataset prepared anew is copied anew.
FINGERPRINT_BYTES = 65_536  # Of each end of each copied record file, hashed into source.json.
ALIGN = 64  # Bytes: the alignment of a batch's arrays (`zeros`).

Batch = dict[str, jax.Array]


def load(data_config, info_fn: Callable[[Any, Any], LabelInfo], *, resuming: bool = False) -> tuple[Any, LabelInfo]:
  """The dataset's ArrayRecord copy as a TFDS builder (made once, by process 0 first) and what the task knows of
  it. A dataset not yet prepared is prepared as the tf.data backend prepares it, which needs TensorFlow."""
  builder = builders.find(data_config, resuming)
  if not builder.is_prepared():  # Prepared as the tf.data backend prepares it (and found again, prepared).
    check(
      importlib.util.find_spec('tensorflow') is not None,
      f'data.name={data_config.name!r} is not prepared yet in data.data_dir={data_config.data_dir!r}, and preparing '
      'it needs TensorFlow (TFDS writes its records with it), which is not installed here: prepare it once where it '
      'is (a run of this config does, on either backend), then copy that data_dir here',
    )
    builder = builders.load(data_config, lambda b, d: None, resuming=resuming)[0]
  kind = data_info.input_key(builder.info.features)  # Before anything is copied (a video dataset: terabytes).
  check(
    kind in ('image', None),
    f"data.backend='grain' reads images, and data.name={data_config.name!r} has {kind}: use data.backend='tfdata'",
  )
  copy = os.path.join(builder.data_dir, ARRAY_RECORD)
  # TFDS reads the copy from its files alone: a features.json naming a foreign class would have it import that
  # module (code run by a data file); tf.data's builders know their features without it.
  builders.check_feature_files(builder.data_dir)
  if jax.process_index() == 0 and not _current(builder.data_dir, copy):
    _copy(builder.data_dir, copy)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('array_record copied')
    if not _current(builder.data_dir, copy):  # Hosts without a shared disk make their own copy.
      _copy(builder.data_dir, copy)
  builders.check_feature_files(copy)  # Written by another host, or changed since.
  source = tfds.builder_from_directory(copy)
  builders.check_splits(source, data_config)
  info = info_fn(source, data_config)
  check(
    info.input_key == 'image',
    f"data.backend='grain' reads images, and data.name={data_config.name!r} has {info.input_key}: use "
    "data.backend='tfdata'",
  )
  return source, info


def _fingerprint(prepared: str) -> dict:
  """What a copy is made from: the prepared dataset's info and its record files' names and sizes."""
  with open(os.path.join(prepared, 'dataset_info.json'), 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  files = sorted(glob.glob(os.path.join(glob.escape(prepared), '*.tfrecord-*')))
  return {'dataset_info': digest, 'files': {os.path.basename(p): os.path.getsize(p) for p in files}}


def _copy_fingerprint(copy: str) -> dict:
  """The copy's own record files: each one's size and a hash of its first and last FINGERPRINT_BYTES, so that a file
  cut short, emptied or overwritten is told from the one written (without reading the whole copy)."""
  found = {}
  for path in sorted(glob.glob(os.path.join(glob.escape(copy), '*.array_record-*'))):
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
      head = f.read(FINGERPRINT_BYTES)
      f.seek(max(size - FINGERPRINT_BYTES, 0))
      tail = f.read()
    found[os.path.basename(path)] = [size, hashlib.sha256(head + tail).hexdigest()]
  return found


def _current(prepared: str, copy: str) -> bool:
  """Whether `copy` is a whole copy of the dataset as `prepared` holds it now (else it is made again)."""
  check(
    not os.path.isfile(copy) and not os.path.islink(copy),
    f'{copy} is a file, where the grain backend keeps its ArrayRecord copy of the dataset: move it away',
  )
  try:
    with open(os.path.join(copy, SOURCE)) as f:
      source = json.load(f)
    mine = {k: v for k, v in source.items() if k != 'copy'}
    return mine == _fingerprint(prepared) and source.get('copy') == _copy_fingerprint(copy)
  except (OSError, ValueError, AttributeError):
    return False


def _copy(prepared: str, copy: str) -> None:
  """The TFRecord files of `prepared` as ArrayRecord files in `copy` (one record per chunk, for reads by index),
  with its other files and a dataset_info.json naming the format; written beside and renamed into place, so an
  interrupted copy is never taken for a whole one."""
  with open(os.path.join(prepared, 'dataset_info.json')) as f:
    info = json.load(f)
  check(
    info.get('fileFormat', 'tfrecord') == 'tfrecord',
    f'{prepared} holds {info.get("fileFormat")} files; the grain backend copies TFRecord ones',
  )
  print(f'copying {prepared} to ArrayRecord for the grain backend, once', flush=True)
  partial = f'{copy}.partial-{os.getpid()}'
  shutil.rmtree(partial, ignore_errors=True)
  try:
    _write_copy(prepared, partial, info)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  shutil.rmtree(copy, ignore_errors=True)
  try:
    os.replace(partial, copy)
  except OSError:  # Another process on this disk put a copy in place first.
    shutil.rmtree(partial, ignore_errors=True)
    if not _current(prepared, copy):
      raise


def _write_copy(prepared: str, partial: str, info: dict) -> None:
  with errors.disk_errors(prepared, 'to copy the data to ArrayRecord'):
    try:
      os.makedirs(partial)
    except OSError as e:  # Read-only or not ours (a shared dataset folder).
      if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
        raise
      raise ConfigError(
        f'the grain backend copies {prepared} to ArrayRecord once, beside it, and cannot write there '
        f'({e.strerror}): prepare or copy the dataset into a data.data_dir you can write, once'
      ) from None
    for path in sorted(glob.glob(os.path.join(glob.escape(prepared), '*'))):
      name = os.path.basename(path)
      if '.tfrecord-' in name:
        writer = array_record_module.ArrayRecordWriter(
          os.path.join(partial, name.replace('.tfrecord-', '.array_record-')), 'group_size:1'
        )
        try:
          for record in tfrecord.records(path):
            writer.write(record)
        except tfrecord.CutShort:
          raise ConfigError(
            f'the prepared data file {path} is cut short: delete its dataset folder and run again'
          ) from None
        finally:
          writer.close()
      elif os.path.isfile(path) and name != 'dataset_info.json':
        shutil.copy(path, partial)
    with open(os.path.join(partial, 'dataset_info.json'), 'w') as f:
      json.dump(info | {'fileFormat': 'array_record'}, f)
    with open(os.path.join(partial, SOURCE), 'w') as f:
      json.dump(_fingerprint(prepared) | {'copy': _copy_fingerprint(partial)}, f)


def zeros(shape: tuple[int, ...], dtype=np.uint8) -> np.ndarray:
  """Zeros at a 64-byte aligned address, as TensorFlow's tensors are: JAX's CPU client then takes the batch without
  a copy (NumPy's own 16-byte alignment cost a 28 ms copy per batch of 96 DeiT canvases, a sixth of the host's
  time; tf.data's batches never paid it)."""
  size = int(np.prod(shape)) * np.dtype(dtype).itemsize
  buffer = np.zeros(size + ALIGN, np.uint8)
  start = -buffer.ctypes.data % ALIGN
  return buffer[start : start + size].view(dtype).reshape(shape)


def _concatenate(arrays: list[np.ndarray]) -> np.ndarray:
  """np.concatenate on the first axis, into an aligned array (`zeros`)."""
  out = zeros((sum(len(a) for a in arrays), *arrays[0].shape[1:]), arrays[0].dtype)
  return np.concatenate(arrays, out=out)


def _source(builder, split: str):
  return builder.as_data_source(split, decoders={'image': tfds.decode.SkipDecoding()})


def _read_options(threads: int) -> grain.ReadOptions:
  """Threads that each make a whole batch, and as many batches read ahead (grain's defaults, 16 threads x 500
  elements ahead, are sized for examples: 34-38 s to a first batch of batches)."""
  return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=threads)


class _Shard:
  """One data shard's examples: its slice of the split (tfds.split_for_jax_process, as tf.data's shards are), read
  by index, each made into its model input by `preprocess`."""

  def __init__(self, builder, split: str, shard: int, count: int, info: LabelInfo, preprocess: Callable):
    self.source = _source(builder, tfds.split_for_jax_process(split, process_index=shard, process_count=count))
    self.shard, self.preprocess, self.key, self.shape = shard, preprocess, info.input_key, info.input_shape

  def __len__(self) -> int:
    return len(self.source)

  def examples(self, indices, seeds=None) -> dict[str, np.ndarray]:
    """The examples at `indices`, each preprocessed with a generator seeded by its entry of `seeds` (None: without
    one, for evaluation's preprocessing, which draws nothing)."""
    canvas = getattr(self.preprocess, 'canvas', None)  # Windows the jitted step resizes, made in the batch's rows.
    inputs, labels, resize = [] if canvas is None else zeros((len(indices), *canvas)), [], []
    for row, (i, seed) in enumerate(zip(indices, seeds or [None] * len(indices))):
      example = self.source[int(i)]
      rng = None if seed is None else np.random.default_rng(seed)
      if canvas is None:
        inputs.append(self.preprocess(example[self.key], rng))
      else:
        resize.append(self.preprocess(example[self.key], rng, inputs[row])[1])
      labels.append(example['label'])
    pixels = inputs if canvas is not None else _concatenate([i[None] for i in inputs] or [zeros((0, *self.shape))])
    batch = {'inputs': pixels, 'label': np.asarray(labels, np.int32)}
    return batch | ({'resize': np.stack(resize)} if resize else {})


@functools.lru_cache(maxsize=8)
def order(seed: int, shard: int, epoch: int, n: int) -> np.ndarray:
  """Epoch `epoch`'s permutation of a data shard's n examples."""
  return np.random.default_rng([seed, shard, epoch]).permutation(n)


class TrainBatches:
  """Local train batch s (this process's shards side by side) as a function of s: see the module docstring."""

  def __init__(self, builder, data_config, info: LabelInfo, seed: int):
    local, count, self.per_shard = data_lib.shards(data_config, 'batch_size')
    canvas = data_lib.device_canvas(data_config, *info.input_shape[-3:-1], True, info.source_size)
    preprocess = pil_images.preprocess_fn(data_config, info.input_shape, train=True, canvas=canvas)
    self.shards = [_Shard(builder, data_config.train_split, s, count, info, preprocess) for s in local]
    for shard in self.shards:
      check(
        len(shard) > 0, f'data shard {shard.shard} of {data_config.train_split} has no examples: use fewer data.shards'
      )
    self.seed, self.repeats = seed, data_config.repeated_augment

  def stream(self, shard: '_Shard', positions: np.ndarray) -> tuple[list[int], list[tuple[int, int, int]]]:
    """(example indices, augmentation seeds) at stream `positions` of `shard`."""
    n, r = len(shard), self.repeats
    epoch, within = np.divmod(positions, n * r)
    j, copy = np.divmod(within, r)  # Example j of the epoch's order, its copy-th copy.
    indices = [int(order(self.seed, shard.shard, int(e), n)[k]) for e, k in zip(epoch, j)]
    return indices, [(self.seed, shard.shard, int(e * n + k) * r + int(c)) for e, k, c in zip(epoch, j, copy)]

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    parts, r = [], self.repeats
    # Copies of an example apart, as pipeline._spread puts them: the stream's positions reordered before they are
    # made, rather than the made batch (a copy of every image).
    positions = np.arange(step * self.per_shard, (step + 1) * self.per_shard).reshape(-1, r).T.reshape(-1)
    for shard in self.shards:
      parts.append(shard.examples(*self.stream(shard, positions)))
    if len(parts) == 1:
      return parts[0]
    return {k: _concatenate([p[k] for p in parts]) for k in parts[0]}


def train_iterator(
  builder, data_config, info: LabelInfo, sharding: jax.sharding.Sharding, *, seed: int, start_step: int
) -> Iterator[Batch]:
  """Endless global train batches from `start_step` on, as an uninterrupted run has them there."""
  ds = grain.MapDataset.range(start_step, 2**62).map(TrainBatches(builder, data_config, info, seed))
  workers = data_config.workers
  threads = max(1, min(16, (os.cpu_count() or 1) // max(workers, 1)))
  ds = ds.to_iter_dataset(_read_options(threads))
  if workers:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags, which this program does not parse.
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2), worker_init_fn=end_with_parent
    )
  return _to_global(ds, sharding)


def end_with_parent(worker_index: int, worker_count: int) -> None:
  """Runs first in each grain worker: it ends once its parent is gone (supervisor.end_with_parent), as a training
  process killed outright runs no cleanup and its workers would stay on the node forever."""
  del worker_index, worker_count
  supervisor.end_with_parent()


class EvalBatches:
  """Local eval batch t: examples t * b to (t + 1) * b - 1 of each shard, in order, past its end zeros with mask 0."""

  def __init__(self, builder, data_config, info: LabelInfo):
    local, count, self.per_shard = data_lib.shards(data_config, 'eval_batch_size')
    preprocess = pil_images.preprocess_fn(data_config, info.input_shape, train=False)
    self.shards = [_Shard(builder, data_config.eval_split, s, count, info, preprocess) for s in local]
    self.shape = info.input_shape
    splits = [
      tfds.split_for_jax_process(data_config.eval_split, process_index=s, process_count=count) for s in range(count)
    ]
    self.batches = max(-(-builder.info.splits[s].num_examples // self.per_shard) for s in splits)

  def __call__(self, t: int) -> dict[str, np.ndarray]:
    parts = []
    for shard in self.shards:
      indices = range(t * self.per_shard, min((t + 1) * self.per_shard, len(shard)))
      batch = shard.examples(indices)
      pad = self.per_shard - len(indices)
      batch = {
        'inputs': _concatenate([batch['inputs'], np.zeros((pad, *self.shape), np.uint8)]),
        'label': np.concatenate([batch['label'], np.zeros(pad, np.int32)]),
        'mask': np.concatenate([np.ones(len(indices), np.float32), np.zeros(pad, np.float32)]),
      }
      parts.append(batch)
    return {k: _concatenate([p[k] for p in parts]) for k in parts[0]}


def eval_batches(builder, data_config, info: LabelInfo, sharding: jax.sharding.Sharding) -> Iterator[Batch]:
  """The whole eval split once, in order; the last batches are padded with `mask` = 0."""
  make = EvalBatches(builder, data_config, info)
  ds = grain.MapDataset.range(make.batches).map(make)
  return _to_global(ds.to_iter_dataset(_read_options(max(1, min(16, os.cpu_count() or 1)))), sharding)


def _to_global(batches, sharding: jax.sharding.Sharding) -> Iterator[Batch]:
  for local in batches:
    yield data_lib.global_batch(local, sharding)
