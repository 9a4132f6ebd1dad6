"""What `tools.predict` reads and what scores it: the inputs (image and video files, folders of frames, text lines)
as `Item`s, read as the run's data is (`read_input`), and a run's model with its evaluation preprocessing and
compiled step (`Predictor`), batches read by threads while the device runs the one before."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
from typing import Any, Callable, Iterator

import jax
import numpy as np
from flax import nnx

from vit_jax_lab import (
  console,
  data as data_lib,
  errors,
  parallel,
  train,
)
from vit_jax_lab.data import device
from vit_jax_lab.data.builders import folder
from vit_jax_lab.errors import ConfigError, check

# Loaded at their first use (console.lazy): they import TensorFlow, which --help and a mistake in the arguments
# need not wait for.
tf = console.lazy('tensorflow')
images = console.lazy('vit_jax_lab.data.images')

try:
  import av
except ImportError:  # PyAV is optional: only video files need it.
  av = None

JPEG_PNG = data_lib.JPEG_PNG
_WORKERS = min(8, os.cpu_count() or 1)  # Threads reading and preprocessing inputs (TF works outside the GIL).


OTHER_IMAGES = ('.heic', '.heif', '.avif', '.jxl')  # Photos no decoder here reads: left out of folders, with a note.


@dataclasses.dataclass(frozen=True)
class Item:
  """One input: what the output calls it (a path or the text), its form and its files."""

  name: str
  form: str  # 'image' (a file), 'frames' (a folder of frames), 'video' (a video file) or 'text'.
  files: tuple[str, ...] = ()


class Unreadable(Exception):
  """An input that exists but cannot be read: reported in one line, the other inputs go on."""


def fit(raw: tf.Tensor, data_config, input_shape: tuple[int, ...]) -> tuple[tf.Tensor, tf.Tensor]:
  """(an image or frames, whether resized): of another size than the run's data, when its config resizes nothing
  (no data.image_size or resize_size; its preprocessing then takes the dataset's size only), squashed to that size
  first."""
  if data_config.image_size is not None or data_config.resize_size is not None:
    return raw, tf.constant(False)
  height, width = input_shape[-3:-1]
  same = (tf.shape(raw)[-3] == height) & (tf.shape(raw)[-2] == width)

  def resized():
    x = tf.image.resize(tf.cast(raw, tf.float32), (height, width), antialias=data_config.antialias)
    return tf.cast(tf.clip_by_value(tf.round(x), 0, 255), tf.uint8)

  return tf.cond(same, lambda: raw, resized), ~same


# --- The inputs ---------------------------------------------------------------------------------------------------


def _has(name: str, kind: str) -> bool:
  """Whether a file name is an image ('image': folder.IMAGE_FORMATS) or a video file ('video'), by its extension
  (the file kinds of folder datasets)."""
  return name.lower().endswith(folder.IMAGE_EXTENSIONS if kind == 'image' else folder.VIDEO_EXTENSIONS)


def _walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
  """(folder, its visible files, its visible subfolders) below the folder `top`, each in natural order, depth
  first."""
  for root, dirs, names in os.walk(top):
    dirs[:] = sorted((d for d in dirs if not d.startswith('.')), key=folder.natural_key)
    files = sorted((n for n in names if not n.startswith('.')), key=folder.natural_key)
    yield root, [os.path.join(root, n) for n in files], dirs


def collect(kind: str, inputs: list[str], lines: str | None) -> tuple[list[Item], bool]:
  """The items of the command line for a model reading `kind` ('image', 'video' or 'text'), and whether a folder
  of several was given (then the output is JSON lines). Every mistake is a ConfigError, before anything compiles."""
  items, folders = [], False
  if lines is not None:
    check(kind == 'text', f'--lines {lines}: this model reads {kind}s, not text; give its files as arguments')
    check(os.path.isfile(lines), f'--lines {lines}: no such file')
    try:
      with open(lines, encoding='utf-8') as f:
        items += [Item(line, 'text') for line in f.read().splitlines()]
    except UnicodeDecodeError as e:
      raise ConfigError(f'--lines {lines} is not UTF-8 text ({e.reason} at byte {e.start})') from None
  for given in inputs:
    if kind == 'text':
      check(
        not os.path.exists(given),
        f'{given} is a file or folder, and this model reads text: give the text itself, or --lines FILE for a file '
        'of lines',
      )
      items.append(Item(given, 'text'))
      continue
    check(os.path.exists(given), f'{given}: no such file or folder')
    if os.path.isdir(given):
      found = _folder_items(kind, given)
      folders |= not (len(found) == 1 and found[0].name == given)  # A frame folder is one video.
      items += found
    else:
      items.append(_file_item(kind, given))
  check(items, 'no inputs: give image or video files, folders of them, text (seq2seq), or --lines FILE')
  if any(item.form == 'video' for item in items):
    _av(next(item.name for item in items if item.form == 'video'))
  return items, folders


def _file_item(kind: str, path: str) -> Item:
  if _has(path, 'image'):
    check(
      kind == 'image',
      f'{path} is an image, and this model classifies videos: give a folder of its frames or a video file',
    )
    return Item(path, 'image', (path,))
  if _has(path, 'video'):
    check(kind == 'video', f'{path} is a video, and this model reads images: give image files ({folder.IMAGE_FORMATS})')
    return Item(path, 'video', (path,))
  wanted = (
    f'an image ({folder.IMAGE_FORMATS})' if kind == 'image' else f'a video file ({" ".join(folder.VIDEO_EXTENSIONS)})'
  )
  raise ConfigError(f'{path} is not {wanted} (by its extension)')


def _folder_items(kind: str, given: str) -> list[Item]:
  """Images: every image below the folder `given`. Videos: the folder itself if it holds frames, else every frame
  folder and video file below it."""
  walked = list(_walk(given))
  images = [f for _, files, _ in walked for f in files if _has(f, 'image')]
  videos = [f for _, files, _ in walked for f in files if _has(f, 'video')]
  if kind == 'image':
    check(
      images or not videos,
      f'{given} holds videos, and this model reads images: give a folder of images ({folder.IMAGE_FORMATS})',
    )
    others = [f for _, files, _ in walked for f in files if f.lower().endswith(OTHER_IMAGES)]
    check(
      images,
      f'{given} holds no images ({folder.IMAGE_FORMATS})' + (f' ({len(others)} of other formats)' if others else ''),
    )
    if others:  # Training reads the same formats, and so does prediction: said, not silently passed over.
      console.say(f'{given}: {len(others)} images of formats not read left out, e.g. {errors.foreign(others[0])}')
    return [Item(path, 'image', (path,)) for path in images]
  frames_here = [f for f in walked[0][1] if _has(f, 'image')]
  if frames_here:
    return [Item(given, 'frames', tuple(frames_here))]
  items = []
  for root, files, _ in walked[1:]:
    frames = [f for f in files if _has(f, 'image')]
    if frames:
      items.append(Item(root, 'frames', tuple(frames)))
    items += [Item(f, 'video', (f,)) for f in files if _has(f, 'video')]
  items += [Item(f, 'video', (f,)) for f in walked[0][1] if _has(f, 'video')]
  check(items, f'{given} holds no videos: frame folders (image frames) or video files')
  return sorted(items, key=lambda item: folder.natural_key(item.name))


def _av(path: str):
  check(av is not None, f'{path}: video files need PyAV (`pip install av`); or give a folder of its frames instead')
  return av


def read_input(item: Item, channels: int) -> Any:
  """The raw input: a file's bytes, a video's uint8 frames (T, H, W, C), or the text. Raises Unreadable."""

  def data(path: str) -> bytes:
    try:
      errors.regular_file(path, 'the image', errors.IMAGE_LIMIT)  # A pipe would block, /dev/zero never end.
      with open(path, 'rb') as f:
        raw = f.read()
    except OSError as e:
      raise Unreadable(f'{path}: {e.strerror}') from None
    except ConfigError as e:
      raise Unreadable(str(e)) from None
    why = folder.size_problem(raw)
    if why is not None:
      raise Unreadable(f'{errors.foreign(path)}: {why}')
    return raw

  if item.form == 'text':
    return item.name
  if item.form == 'image':
    raw = folder.upright(data(item.files[0]))  # A photo taken sideways, turned as its EXIF says, as in training.
    if not raw.startswith(JPEG_PNG):
      raise Unreadable(f'{item.name}: not an image file ({folder.IMAGE_FORMATS})')
    _check_image(raw, item.name, channels)
    return raw
  if item.form == 'video':
    av = _av(item.name)
    try:
      with av.open(item.name) as container:
        pixels = 'gray' if channels == 1 else 'rgb24'
        frames = [f.to_ndarray(format=pixels) for f in container.decode(video=0)]
    except (av.FFmpegError, ValueError, IndexError) as e:
      raise Unreadable(f'{item.name}: not a readable video ({_first_line(e)})') from None
    if not frames:
      raise Unreadable(f'{item.name}: the video has no frames')
    return np.stack(frames).reshape(len(frames), *frames[0].shape[:2], channels)
  frames = []
  for path in item.files:
    raw = folder.upright(data(path))
    if not raw.startswith(JPEG_PNG):
      raise Unreadable(f'{item.name}: frame {path} is not an image file ({folder.IMAGE_FORMATS})')
    _check_image(raw, f'{item.name}: frame {path}', channels)
    try:
      frames.append(tf.io.decode_image(raw, channels=channels, expand_animations=False).numpy())
    except tf.errors.OpError as e:
      raise Unreadable(f'{item.name}: frame {path} is not a readable image ({_first_line(e)})') from None
  sizes = sorted({f.shape[:2] for f in frames})
  if len(sizes) > 1:
    raise Unreadable(f'{item.name}: its frames differ in size {sizes}')
  return np.stack(frames)


def _check_image(raw: bytes, name: str, channels: int) -> None:
  """Refuses an image TensorFlow's decoders cannot read or complain of (images.decode_problem) as Unreadable."""
  why = images.decode_problem(raw, channels)[1]
  if why is not None:
    raise Unreadable(f'{name}: {why}')


def _first_line(e: BaseException) -> str:
  """The line of an error that says what is wrong (TF's graph errors wrap it in node names and call sites)."""
  text = getattr(e, 'message', None) or str(e)
  skip = ('Graph execution error', 'Detected at node', 'File "', '[[')
  lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(skip)]
  return lines[-1][:120] if lines else type(e).__name__


# --- The model ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Predictor:
  """A run's model with its evaluation parameters, the run's evaluation preprocessing of one input (a tf.function,
  traced once), and the compiled step from a batch to top-k probabilities or decoded token ids."""

  kind: str  # What the model reads: 'image', 'video' or 'text' (the task's input_kind).
  config: Any
  s: Any  # train.Setup on one device.
  params: Any  # Evaluation parameters, on the device.
  labels: list[str] | None  # Class names ('classes' predictions).
  top_k: int

  def __post_init__(self):
    info, task, data = self.s.info, self.s.task, self.config.data
    self.classify = task.predicts == 'classes'  # Else 'text'.
    prepare, preprocess = task.prepare(info, False), task.preprocess(data, info, train=False)
    channels = info.input_shape[-1]
    dummy = task.blank_targets(info)

    def model_input(raw: tf.Tensor) -> tuple[dict, tf.Tensor]:
      """The run's evaluation pipeline on one raw input; and whether it was adapted (resized, cut)."""
      changed = tf.constant(False)
      if self.kind != 'text':
        raw, changed = fit(raw, self.config.data, self.s.info.input_shape)
      example = prepare(tf.data.Dataset.from_tensors({info.input_key: raw} | dummy)).get_single_element()
      if self.kind == 'text':
        changed = tf.shape(example['inputs'])[0] > info.input_shape[0]
      features = preprocess(example, tf.zeros([2], tf.int64))
      return {k: v for k, v in features.items() if k not in ('label', 'targets')}, changed

    def image(data):
      return model_input(tf.io.decode_image(data, channels=channels, expand_animations=False))

    signature = {
      'image': (image, tf.TensorSpec([], tf.string)),
      'video': (model_input, tf.TensorSpec([None, None, None, channels], tf.uint8)),
      'text': (model_input, tf.TensorSpec([], tf.string)),
    }
    fn, spec = signature[self.kind]
    self.model_input = tf.function(fn, input_signature=[spec])
    self.step = self._compile()

  @property
  def channels(self) -> int:
    return self.s.info.input_shape[-1]

  @property
  def device(self) -> jax.Device:
    return self.s.mesh.devices.flat[0]

  def _compile(self) -> Callable:
    s, config = self.s, self.config

    def step(params, batch):
      model = nnx.merge(s.graphdef, train.in_compute_dtype(params, config))
      batch = device.eval_inputs(batch, config.data)
      return s.task.predict(model, train.in_compute_dtype(batch, config), s.info, self.top_k)

    return jax.jit(step, compiler_options=parallel.compiler_options(s.mesh))

  def batch_size(self, requested: int) -> int:
    """The batch the step is compiled for, given the one asked for."""
    return requested

  def results(self, items: list[Item], batch: int) -> Iterator[tuple[Item, Any, bool]]:
    """(item, its prediction or the one-line reason it could not be read, whether it was adapted), in order.
    Threads read and preprocess the inputs while the device runs the batch before."""
    channels = self.channels

    def prepared(item):
      try:
        features, changed = self.model_input(read_input(item, channels))
      except Unreadable as e:  # A reason found past reading (a clip too short) names the input here.
        return (e if str(e).startswith(item.name) else Unreadable(f'{item.name}: {e}')), False
      except tf.errors.OpError as e:
        what = 'image' if item.form == 'image' else 'input'
        return Unreadable(f'{item.name}: not a readable {what} ({_first_line(e)})'), False
      return {k: v.numpy() for k, v in features.items()}, bool(changed)

    def chunks():  # Items with `batch` readable ones among them (an unreadable one holds nothing back).
      pending = []
      for item, (value, changed) in _in_order(prepared, items, ahead=2 * batch):
        pending.append((item, value, changed))
        if sum(not isinstance(v, Unreadable) for _, v, _ in pending) == batch or len(pending) == 4 * batch:
          yield pending
          pending = []
      if pending:
        yield pending

    device, running = self.device, None
    for pending in chunks():
      rows = [v for _, v, _ in pending if not isinstance(v, Unreadable)]
      outputs = self.step(self.params, jax.device_put(_stacked(rows, batch), device)) if rows else None
      if running is not None:  # Fetched only now: the device ran it while the next chunk was read.
        yield from self._unpack(*running)
      running = outputs, pending
    if running is not None:
      yield from self._unpack(*running)

  def _unpack(self, outputs, pending) -> Iterator[tuple[Item, Any, bool]]:
    outputs = jax.device_get(outputs)
    row = 0
    for item, value, changed in pending:
      if isinstance(value, Unreadable):
        yield item, value, changed
        continue
      if self.classify:
        probabilities, classes = outputs
        yield item, [(self.labels[c], float(p)) for p, c in zip(probabilities[row], classes[row])], changed
      else:
        yield item, self.s.info.target_vocab.decode(outputs[row]), changed
      row += 1


def _stacked(rows: list[dict[str, np.ndarray]], batch: int) -> dict[str, np.ndarray]:
  """Rows stacked into a batch of `batch`, padded with zeros: every batch has the compiled shape."""
  out = {}
  for key in rows[0]:
    x = np.stack([r[key] for r in rows])
    out[key] = np.concatenate([x, np.zeros((batch - len(rows), *x.shape[1:]), x.dtype)]) if len(rows) < batch else x
  return out


def _in_order(fn: Callable, items: list, ahead: int) -> Iterator[tuple[Any, Any]]:
  """(item, fn(item)) in order, computed by threads at most `ahead` items in advance."""
  with concurrent.futures.ThreadPoolExecutor(_WORKERS) as pool:
    queue = collections.deque()
    for item in items:
      queue.append((item, pool.submit(fn, item)))
      if len(queue) > ahead:
        first, future = queue.popleft()
        yield first, future.result()
    while queue:
      first, future = queue.popleft()
      yield first, future.result()
