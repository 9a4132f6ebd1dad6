"""Runs a trained model on your own files: the top-k labels of images and videos, the decoded text of seq2seq runs.

python -m vit_jax_lab.tools.predict --workdir runs/vit_digits digit.png more_digits/ --top_k 3
python -m vit_jax_lab.tools.predict --workdir runs/vivit_fe clip_frames/ videos/ --out videos.jsonl
python -m vit_jax_lab.tools.predict --workdir runs/scan_simple 'jump twice and walk left'
python -m vit_jax_lab.tools.predict --workdir runs/scan_simple --lines commands.txt > actions.txt
python -m vit_jax_lab.tools.predict --config configs/vit/finetune.py:cifar10,B/16 --config.init_from=ViT-B_16.npz \
    --config.data.data_dir=/datasets/tfds cat.jpg

Every input goes through the run's own evaluation preprocessing (the task's `prepare` and `preprocess(train=False)`,
as `train.evaluate` applies them): a video is scored by the mean logits of its eval_clips x eval_crops views. An
image is a JPEG or PNG file; a video a folder of frames (natural order: 2.png before 10.png) or, with PyAV, a video
file. A folder of images, or of videos, gives one JSON line per file: {"input": path, "top_k": [[label, p], ...]}
({"input", "output"} for seq2seq). Labels are the class names of the run's dataset.

python -m vit_jax_lab.tools.predict --pretrained vit_base_patch16_224.augreg_in21k_ft_in1k/ cat.jpg

Weights: the newest checkpoint of --workdir (its parameter average with ema_decay, as evaluation uses), or, with
--config, those of --config.init_from (a release .npz or a run), loaded as training loads them. With --pretrained,
a timm or Hugging Face transformers classifier folder (config.json + model.safetensors) runs as it is: the ViT of
its shape, its label names (timm's label_names, transformers' id2label) and its own preprocessing (timm's
pretrained_cfg, transformers' preprocessor_config.json). A transformers video classifier folder (ViViT, VideoMAE)
runs as the ViViT of its shape on num_frames frames sampled evenly from each clip, as the library's video processor
samples them. A transformers Marian folder (opus-mt) translates its inputs as the library's greedy `generate` does
(its tokenizer, up to generation_config.json's max_length):

python -m vit_jax_lab.tools.predict --pretrained opus-mt-en-de/ 'the cat sits on the mat'

The model is compiled once, for batches of --batch_size (the last one padded).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable, Iterator, Sequence, TextIO

import jax
import numpy as np
from flax import nnx

from vit_jax_lab import (
  config as config_lib,
  console,
  data as data_lib,
  decode,
  errors,
  hub,
  models,
  parallel,
  tasks,
  tokens,
  train,
)
from vit_jax_lab.data import device
from vit_jax_lab.data.builders import folder
from vit_jax_lab.data.info import MarianVocab
from vit_jax_lab.errors import ConfigError, check
from vit_jax_lab.models import marian_layout, seq2seq, timm_layout, transformers_layout, vit, vivit
from vit_jax_lab.tools import common

# Loaded at their first use (console.lazy): they import TensorFlow, which --help and a mistake in the arguments
# need not wait for.
tf = console.lazy('tensorflow')
images = console.lazy('vit_jax_lab.data.images')

try:
  import av
except ImportError:  # PyAV is optional: only video files need it.
  av = None

DEFAULT_BATCH = {'image': 64, 'video': 8, 'text': 64}  # Inputs per compiled batch (videos: x their views).
JPEG_PNG = data_lib.JPEG_PNG
_WORKERS = min(8, os.cpu_count() or 1)  # Threads reading and preprocessing inputs (TF works outside the GIL).


OTHER_IMAGES = ('.webp', '.gif', '.bmp', '.tif', '.tiff', '.heic', '.avif')  # Left out of folders, with a note.


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
  """Whether a file name is an image ('image': JPEG or PNG) or a video file ('video'), by its extension (the file
  kinds of folder datasets)."""
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
    check(kind == 'video', f'{path} is a video, and this model reads images: give JPEG or PNG files')
    return Item(path, 'video', (path,))
  wanted = 'a JPEG or PNG image' if kind == 'image' else f'a video file ({" ".join(folder.VIDEO_EXTENSIONS)})'
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
      f'{given} holds videos, and this model reads images: give a folder of JPEG or PNG files',
    )
    others = [f for _, files, _ in walked for f in files if f.lower().endswith(OTHER_IMAGES)]
    check(images, f'{given} holds no JPEG or PNG images' + (f' ({len(others)} of other formats)' if others else ''))
    if others:  # Training reads JPEG and PNG only, and so does prediction: said, not silently passed over.
      console.say(f'{given}: {len(others)} images not JPEG or PNG left out, e.g. {errors.foreign(others[0])}')
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
  check(items, f'{given} holds no videos: frame folders (JPEG or PNG frames) or video files')
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
      raise Unreadable(f'{item.name}: not a JPEG or PNG file')
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
      raise Unreadable(f'{item.name}: frame {path} is not a JPEG or PNG file')
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


# --- Loading a run ------------------------------------------------------------------------------------------------


def _config(args: argparse.Namespace, overrides: list[str]):
  """The run's config (or the given one), on one device, with batches of one for the trainer's checks."""
  config = common.config_of(args.workdir, args.config, overrides)
  if args.config is not None:
    check(
      config.init_from is not None,
      f'--config {args.config}: give the weights with --config.init_from=PATH (a .npz or a run); without them the '
      'model would predict with random ones',
    )
  config_lib.validate(common.one_device_one_example(config))
  predicts = tasks.get(config.task.name).predicts
  check(
    predicts in ('classes', 'text'),
    f'task.name={config.task.name!r} predicts {predicts}, and this command prints classes or text: a tracking run '
    'is drawn by python -m vit_jax_lab.tools.track and run on a split by python -m vit_jax_lab.tools.results',
  )
  return config


def _vocab_dir(config, workdir: str | None) -> str | None:
  """Where the run keeps a trained SentencePiece vocabulary: its workdir, or the run init_from names. Predicting
  must use the run's, never train another."""
  if config.data.vocab != 'sentencepiece':
    return workdir
  candidates = [workdir] if workdir else []
  if config.init_from and not config.init_from.endswith('.npz'):
    path = os.path.abspath(config.init_from)
    candidates += [path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))]
  for directory in candidates:
    if os.path.isfile(os.path.join(directory, 'sentencepiece.model')):
      return directory
  raise ConfigError(
    "data.vocab='sentencepiece': the run's trained vocabulary (sentencepiece.model in its workdir) is not there; "
    'give --workdir of the run, or --config.data.vocab=PATH/sentencepiece.model'
  )


def load(args: argparse.Namespace, overrides: list[str], devices=None) -> Predictor:
  """The model of --workdir (or --config and its init_from) with its evaluation parameters on one device."""
  config = _config(args, overrides)
  with contextlib.redirect_stdout(sys.stderr):  # Dataset preparation and init_from notes: not predictions.
    s = train.setup(config, (devices or jax.devices())[:1], workdir=_vocab_dir(config, args.workdir))
    params = common.params_of(s, args.workdir)
  labels = None
  if s.task.predicts == 'classes':
    labels = [str(n) for n in s.builder.info.features['label'].names]
  kind = s.task.input_kind(s.info)
  return Predictor(kind, config, s, jax.device_put(params, s.mesh.devices.flat[0]), labels, args.top_k)


# --- A hub folder as it is ----------------------------------------------------------------------------------------


def preprocessing_of(path: str, config: dict, layout: str) -> hub.Preprocessing:
  """The folder's preprocessing, as its layout's reader reads it (timm's pretrained_cfg, transformers'
  preprocessor_config.json)."""
  return hub.reader(layout).preprocessing(path, config)


def _preprocess(p: hub.Preprocessing, image: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """An image (uint8, H x W x C) or a clip's frames (T x H x W x C) through `p`; and whether it was resized (or its
  crop cut or padded anything)."""
  x, shape = tf.cast(image, tf.float32), tf.shape(image)[-3:-1]
  if isinstance(p.resize, int):
    short, ratio = tf.reduce_min(shape), tf.cast(shape, tf.float32) / tf.cast(tf.reduce_min(shape), tf.float32)
    size = tf.where(shape == short, p.resize, tf.cast(ratio * p.resize, tf.int32))
  else:
    size = shape if p.resize is None else tf.constant(p.resize)
  same = tf.reduce_all(size == shape)

  def resized():
    y = tf.image.resize(x, size, method=p.method, antialias=True)
    return tf.clip_by_value(tf.round(y), 0, 255)

  x = tf.cond(same, lambda: x, resized)
  changed = ~same
  if p.crop is not None:
    here = tf.shape(x)[-3:-1]
    changed |= tf.reduce_any(here != p.crop)
    if p.crop_round:  # An image at least the crop's size: the offset rounded half to even (tf.round's too).
      top, left = (
        tf.cast(tf.round(tf.cast(n - c, tf.float32) / 2), tf.int32) for n, c in zip(tf.unstack(here), p.crop)
      )
      fits = tf.reduce_all(here >= p.crop)
      x = tf.cond(
        fits,
        lambda: x[..., top : top + p.crop[0], left : left + p.crop[1], :],
        lambda: tf.image.resize_with_crop_or_pad(x, *p.crop),
      )
    else:
      x = tf.image.resize_with_crop_or_pad(x, *p.crop)
  return (x * p.scale - p.offset - tf.constant(p.mean)) / tf.constant(p.std), changed


def _labels(config: dict, num_classes: int) -> list[str]:
  """timm's `label_names`, transformers' `id2label`; the class index where the folder has neither."""
  names = config.get('label_names') or []
  if 'id2label' in config:
    names = [str(config['id2label'].get(str(i), i)) for i in range(num_classes)]
  return [str(n) for n in names] if len(names) == num_classes else [str(i) for i in range(num_classes)]


def sampled_frames(frames: int, num_frames: int) -> np.ndarray:
  """The frames a clip of `frames` is read by: `num_frames` evenly spaced from the first, frame i * frames //
  num_frames, as transformers' video-classification pipeline samples them (its video processor's
  do_sample_frames)."""
  return np.arange(num_frames) * frames // num_frames


def library_decode(raw: tf.Tensor, channels: int) -> tf.Tensor:
  """uint8 pixels of an image file as timm's and transformers' pipelines get them from PIL: a JPEG by the accurate
  integer IDCT, which equals PIL's decode (TensorFlow's default differs by up to 4 levels); others as decode_image."""
  return tf.cond(
    tf.io.is_jpeg(raw),
    lambda: tf.io.decode_jpeg(raw, channels=channels, dct_method='INTEGER_ACCURATE'),
    lambda: tf.io.decode_image(raw, channels=channels, expand_animations=False),
  )


@dataclasses.dataclass
class HubPredictor(Predictor):
  """A timm or transformers classifier folder as its library runs it: its model, labels and preprocessing. A video
  classifier (kind 'video') reads num_frames frames sampled evenly from each clip (`sampled_frames`)."""

  model: Any = None
  input_shape: tuple[int, ...] = ()
  preprocessing: hub.Preprocessing | None = None

  def __post_init__(self):
    self.classify = True

    def image_input(raw):
      x, changed = _preprocess(self.preprocessing, library_decode(raw, self.channels))
      return {'images': x}, changed

    def clip_input(frames):
      return _preprocess(self.preprocessing, frames)

    if self.kind == 'video':
      clip = tf.function(clip_input, input_signature=[tf.TensorSpec([None, None, None, self.channels], tf.uint8)])
      num_frames = self.input_shape[0]

      def video_input(frames: np.ndarray):
        if len(frames) < num_frames:
          raise Unreadable(
            f'the clip has {len(frames)} frames, and the model reads num_frames={num_frames} sampled evenly from it: '
            'give a longer clip'
          )
        x, changed = clip(frames[sampled_frames(len(frames), num_frames)])
        return {'images': x}, changed

      self.model_input = video_input
    else:
      self.model_input = tf.function(image_input, input_signature=[tf.TensorSpec([], tf.string)])
    graphdef = nnx.graphdef(self.model)
    top_k = min(self.top_k, len(self.labels))

    def step(params, batch):
      logits = nnx.merge(graphdef, params)(batch['images'])
      return jax.lax.top_k(jax.nn.softmax(logits.astype(np.float32), axis=-1), top_k)

    self.step = jax.jit(step)

  @property
  def channels(self) -> int:
    return self.input_shape[-1]

  @property
  def device(self) -> jax.Device:
    return jax.devices()[0]


@dataclasses.dataclass
class MarianPredictor(Predictor):
  """A transformers Marian folder as its library translates: its tokenizer (source.spm, target.spm, vocab.json) and
  greedy decoding of up to `max_length` tokens (generation_config.json's, less the decoder start)."""

  model: Any = None
  source: MarianVocab | None = None
  target: MarianVocab | None = None
  max_length: int = 0

  def __post_init__(self):
    self.classify = False
    graphdef, length = nnx.graphdef(self.model), self.max_length

    def step(params, inputs):
      model = nnx.merge(graphdef, params)
      return decode.greedy(decode.stepper(model, inputs, length), inputs.shape[0], length)[0]

    self.step = jax.jit(step)

  def results(self, items: list[Item], batch: int) -> Iterator[tuple[Item, Any, bool]]:
    for start in range(0, len(items), batch):
      chunk = items[start : start + batch]
      ids = [self.source.encode(item.name) + [tokens.EOS] for item in chunk]
      width = 1 << (max(map(len, ids)) - 1).bit_length()  # A power of two: few shapes to compile.
      inputs = np.zeros((batch, width), np.int32)
      for row, x in enumerate(ids):
        inputs[row, : len(x)] = x
      out = jax.device_get(self.step(self.params, inputs))
      for row, item in enumerate(chunk):
        yield item, self.target.decode(out[row]), False


def _with_weights(model: nnx.Module, weights: hub.HubWeights, path: str, more_notes: Sequence[str] = ()) -> nnx.State:
  """`model` given the folder's weights (its initial parameters, on the device, read for shapes and dtypes alone),
  the load notes and `more_notes` printed; returns its state on the first device."""
  params = nnx.state(model, nnx.Param)
  loaded, notes = model.load_pretrained(weights, params.to_pure_dict())
  for note in [*notes, *more_notes]:
    print(f'--pretrained {path}: {note}', file=sys.stderr)
  params.replace_by_pure_dict(loaded)
  nnx.update(model, params)
  return jax.device_put(nnx.state(model), jax.devices()[0])


def load_marian(path: str, weights: hub.HubWeights) -> MarianPredictor:
  """A transformers Marian folder, as it is: the Transformer of its shape (Transformer.pretrained_config) with its
  weights and its tokenizer."""
  model_config = models.config('transformer', variant=None)
  seq2seq.Transformer.pretrained_config(model_config, weights)
  size = len(marian_layout.our_rows(weights))
  model = models.build(model_config, nnx.Rngs(0), vocab_size=size, input_vocab_size=size, input_shape=None, max_len=1)
  generation = {}
  if os.path.isfile(os.path.join(path, 'generation_config.json')):
    generation = errors.read_json(os.path.join(path, 'generation_config.json'), '--pretrained: the generation config')
  max_length = generation.get('max_length', weights.config.get('max_length', 512))
  positions = weights.config.get('max_position_embeddings', 512)
  check(
    isinstance(max_length, int) and isinstance(positions, int) and 1 < max_length <= max(positions, 2),
    f'--pretrained {errors.foreign(path)}: max_length={errors.foreign(max_length, 20)} must be an integer from 2 to '
    f"the model's max_position_embeddings={errors.foreign(positions, 20)}",
  )
  max_length -= 1  # Less the decoder start.
  beams = generation.get('num_beams', 1)
  greedy = [f"greedy decoding, not the folder's beam search of num_beams={beams}"] if beams > 1 else []
  params = _with_weights(model, weights, path, greedy)
  source, target = MarianVocab(path, 'source'), MarianVocab(path, 'target')
  return MarianPredictor('text', None, None, params, None, 1, model, source, target, max_length)


def _folder_predictor(path: str, weights: hub.HubWeights, top_k: int, kind: str) -> HubPredictor:
  """A hub folder with a classification head as it is: for `kind` 'image' the ViT, for 'video' the ViViT, of its
  shape (the family's pretrained_config), input and class count with its weights, label names and preprocessing."""
  name, family = ('vit', vit.ViT) if kind == 'image' else ('vivit', vivit.ViViT)
  reader = hub.reader(weights.layout)
  options = (reader.vit_options if kind == 'image' else reader.vivit_options)(weights.config, weights.tensors)
  num_classes, input_shape = options['num_classes'], options['input_shape']
  projection = timm_layout.clip_projection(weights.config) or 'Projection' in str(weights.config.get('architectures'))
  what = 'its head is an embedding projection' if projection else 'a backbone'
  check(
    num_classes and not projection,
    f'--pretrained {path} has no classification head ({what}): fine-tune it with --config.init_from={path}, then '
    'predict with --workdir',
  )
  model_config = models.config(name)
  family.pretrained_config(model_config, weights)  # The folder's shape into the defaults.
  model = models.build(model_config, nnx.Rngs(0), num_classes=num_classes, input_shape=input_shape)
  params = _with_weights(model, weights, path)
  labels = _labels(weights.config, num_classes)
  preprocessing = preprocessing_of(path, weights.config, weights.layout)
  return HubPredictor(kind, None, None, params, labels, top_k, model, input_shape, preprocessing)


def load_hub(path: str, top_k: int) -> Predictor:
  """A hub folder as it is: an image classifier (the ViT), a transformers video classifier (ViViT, VideoMAE: the
  ViViT), or a Marian translation folder."""
  with hub.config_values(path, '--pretrained'):
    return _load_hub(path, top_k)


def _load_hub(path: str, top_k: int) -> Predictor:
  weights = hub.read(path)
  if weights.layout in seq2seq.Transformer.pretrained():
    return load_marian(path, weights)
  image, video = weights.layout in vit.ViT.pretrained(), weights.layout in vivit.ViViT.pretrained()
  check(image or video, f'--pretrained {path}: {hub.LAYOUTS[weights.layout].description} is not read')
  if video and (not image or weights.config.get('model_type') in transformers_layout.VIDEO_TYPES):
    return _folder_predictor(path, weights, top_k, 'video')
  return _folder_predictor(path, weights, top_k, 'image')


# --- The command --------------------------------------------------------------------------------------------------


def _write(out: TextIO, item: Item, value: Any, jsonl: bool, classify: bool) -> None:
  if isinstance(value, Unreadable):
    console.say(f'error: {value}')
    if jsonl:
      out.write(json.dumps({'input': item.name, 'error': str(value)}, ensure_ascii=False) + '\n')
    return
  if jsonl:
    out.write(json.dumps({'input': item.name, 'top_k' if classify else 'output': value}, ensure_ascii=False) + '\n')
  elif classify:
    out.write(item.name + '\n' + ''.join(f'  {p:.4f}  {label}\n' for label, p in value))
  elif item.form == 'text':
    out.write(value + '\n')
  else:
    out.write(f'{item.name}\t{value}\n')


def _notes(predictor: Predictor, adapted: int) -> str | None:
  if not adapted:
    return None
  if isinstance(predictor, HubPredictor):
    p = predictor.preprocessing
    return (
      f"note: {adapted} inputs resized or cut to the folder's size by TensorFlow's {p.method} resize (antialiased), "
      "not the library's PIL one: their probabilities differ slightly from the library's"
    )
  if predictor.kind == 'text':
    return (
      f'note: {adapted} inputs have more than data.max_input_length={predictor.s.info.input_shape[0]} tokens (EOS '
      'included): cut to it, as evaluation cuts them'
    )
  height, width = predictor.s.info.input_shape[-3:-1]
  return (
    f"note: {adapted} inputs are not {height}x{width}, the size of the run's data, and its config resizes nothing "
    f'(data.image_size, data.resize_size): squashed to {height}x{width} first'
  )


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.predict', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', help='a run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file, with --config.init_from=WEIGHTS, instead of --workdir')
  parser.add_argument(
    '--pretrained', help='a timm or transformers classifier folder, or a Marian one, run as it is (no config)'
  )
  parser.add_argument('--top_k', type=int, default=5, help='labels printed per input (classification)')
  parser.add_argument('--lines', help='a UTF-8 text file: one input per line (seq2seq models reading text)')
  parser.add_argument('--out', help='write JSON lines to this new file (default: stdout)')
  parser.add_argument('--batch_size', type=int, help='inputs per compiled batch (default: 64; videos 8)')
  args, rest = parser.parse_known_args(argv)
  inputs = rest[rest.index('--') + 1 :] if '--' in rest else []
  rest = rest[: rest.index('--')] if '--' in rest else rest
  overrides = [a for a in rest if a.startswith('--config.')]
  for a in rest:
    if not a.startswith('--config.'):
      check(
        not a.startswith('-') or os.path.exists(a),
        f'unrecognised option {a!r}: see --help; overrides look like --config.data.data_dir=DIR',
      )
      inputs.append(a)
  check(args.top_k >= 1, f'--top_k={args.top_k} must be a positive integer')
  check(args.batch_size is None or args.batch_size >= 1, f'--batch_size={args.batch_size} must be positive')
  check(inputs or args.lines, 'no inputs: give image or video files, folders of them, text (seq2seq), or --lines FILE')
  if args.out is not None:  # Never a file of the user's (nor one of the inputs) overwritten.
    common.check_new(args.out)
  parallel.enable_compilation_cache()
  start = time.perf_counter()
  if args.pretrained is not None:
    check(
      args.workdir is None and args.config is None and not overrides,
      '--pretrained DIR runs the folder as it is: give no --workdir, --config nor --config.KEY overrides',
    )
    predictor = load_hub(args.pretrained, args.top_k)
  else:
    predictor = load(args, overrides)
  items, folders = collect(predictor.kind, inputs, args.lines)
  loaded = time.perf_counter()
  batch = min(args.batch_size or DEFAULT_BATCH[predictor.kind], len(items))
  try:
    if args.out:
      os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    out = open(args.out, 'w', encoding='utf-8') if args.out else sys.stdout  # noqa: SIM115
  except OSError as e:
    raise ConfigError(f'--out {args.out}: cannot write it ({e.strerror})') from None
  failed = adapted = 0
  try:
    for item, value, changed in predictor.results(items, batch):
      failed += isinstance(value, Unreadable)
      adapted += changed
      _write(out, item, value, folders or args.out is not None, predictor.classify)
      out.flush()
  finally:
    if out is not sys.stdout:
      out.close()
  note = _notes(predictor, adapted)
  if note:
    print(note, file=sys.stderr)
  done, seconds = len(items) - failed, time.perf_counter() - loaded
  print(
    f'{done:,} of {len(items):,} inputs in {seconds:.1f}s ({done / seconds:.1f}/s, batches of {batch}, compiling '
    f'included; loading the run {loaded - start:.1f}s)' + (f'; wrote {args.out}' if args.out else ''),
    file=sys.stderr,
  )
  return 2 if failed else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
