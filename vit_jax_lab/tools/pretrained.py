"""`tools.predict --pretrained`: a timm or transformers classifier folder, or a Marian one, run as it is: the model of
its shape (its family's pretrained_config) with its weights, label names and the preprocessing its library applies
(`HubPredictor`), or Marian's tokenizer and greedy decoding (`MarianPredictor`)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx

from vit_jax_lab import (
  console,
  decode,
  errors,
  hub,
  models,
  tokens,
)
from vit_jax_lab.data.info import MarianVocab
from vit_jax_lab.errors import check
from vit_jax_lab.models import marian_layout, release, seq2seq, transformers_layout, vit, vivit
from vit_jax_lab.tools.predictors import Item, Predictor, Unreadable

# Loaded at its first use (console.lazy): --help and a mistake in the arguments need not wait for TensorFlow.
tf = console.lazy('tensorflow')

# --- A hub folder as it is ----------------------------------------------------------------------------------------


def preprocessing_of(path: str, config: dict, layout: str) -> hub.Preprocessing:
  """The folder's preprocessing, as its layout's reader reads it (timm's pretrained_cfg, transformers'
  preprocessor_config.json)."""
  return hub.reader(layout).preprocessing(path, config)


# Pillow's resampling filters (libImaging/Resample.c): support (input pixels at scale 1) and kernel.
def _cubic(x: np.ndarray) -> np.ndarray:
  a, x = -0.5, np.abs(x)
  return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1, np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _hamming(x: np.ndarray) -> np.ndarray:
  x = np.abs(x) * np.pi
  safe = np.where(x == 0, 1.0, x)
  # Pillow's constants are C floats (0.54f, 0.46f).
  window = np.sin(safe) / safe * (np.float32(0.54).item() + np.float32(0.46).item() * np.cos(safe))
  return np.where(x == 0, 1.0, np.where(x >= np.pi, 0.0, window))


PIL_FILTERS = {
  'box': (0.5, lambda x: ((x > -0.5) & (x <= 0.5)).astype(np.float64)),
  'bilinear': (1.0, lambda x: np.maximum(0.0, 1.0 - np.abs(x))),
  'hamming': (1.0, _hamming),
  'bicubic': (2.0, _cubic),
  'lanczos': (3.0, lambda x: np.where((x >= -3) & (x < 3), np.sinc(x) * np.sinc(x / 3), 0.0)),
}
PRECISION_BITS = 22  # Pillow's fixed point for 8-bit images: 32 - 8 - 2.


def _weights(size_in: int, size_out: int, method: str, library: str) -> tuple[np.ndarray, int]:
  """The (size_out, size_in) resampling matrix of one axis in fixed point (integers held by float64, so that sums
  of products of uint8 pixels are exact), and its bits: Pillow's 22; torchvision's uint8 resize (a port of
  Pillow-SIMD) the most that keep the largest weight within int16."""
  support, kernel = PIL_FILTERS[method]
  scale = size_in / size_out
  filterscale = max(scale, 1.0)
  support *= filterscale
  weights = np.zeros((size_out, size_in))
  for i in range(size_out):
    center = (i + 0.5) * scale
    low, high = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), size_in)
    k = kernel((np.arange(low, high) - center + 0.5) / filterscale)
    total = k.sum()
    weights[i, low:high] = k / total if total != 0 else k
  bits = PRECISION_BITS
  if library == 'torchvision':
    bits = next((b for b in range(PRECISION_BITS) if int(0.5 + weights.max() * (1 << (b + 1))) >= 1 << 15), bits)
  return np.trunc(weights * (1 << bits) + np.where(weights < 0, -0.5, 0.5)), bits


def pil_resize(pixels: np.ndarray, size: Sequence[int], method: str, library: str = 'pil') -> np.ndarray:
  """uint8 pixels (..., H, W, C) resized to `size` (height, width) exactly as Pillow 13's Image.resize (timm's eval
  pipeline), or with `library='torchvision'` as torchvision's resize of a uint8 tensor (transformers' image
  processors): separable, each pass rounded and clipped to uint8. Pillow runs the rows' pass first where the height
  shrinks by more than twice as many pixels as the width, else the columns' (torchvision always the columns');
  'nearest' takes pixel floor((i + 0.5) * scale) (torchvision's nearest-exact)."""
  pixels = np.asarray(pixels)
  (height, width), (new_height, new_width) = pixels.shape[-3:-1], size
  passes = [(-2, width, new_width), (-3, height, new_height)]
  if library == 'pil' and height >= new_height and height - new_height > 2 * (width - new_width):
    passes.reverse()
  for axis, n, m in passes:
    if n == m:
      continue
    if method == 'nearest':
      pixels = np.take(pixels, np.minimum(((np.arange(m) + 0.5) * n / m).astype(int), n - 1), axis=axis)
      continue
    weights, bits = _weights(n, m, method, library)
    summed = np.moveaxis(pixels.astype(np.float64), axis, -1) @ weights.T + (1 << (bits - 1))
    pixels = np.moveaxis(np.clip(np.floor(summed / (1 << bits)), 0, 255).astype(np.uint8), -1, axis)
  return pixels


def naflex_size(height: int, width: int, patch: int, max_patches: int) -> tuple[int, int]:
  """The size Siglip2ImageProcessor resizes an image to: both sides scaled by the largest factor (found by its
  bisection, to 1e-5) at which the sides, each rounded up to whole patches (at least one), hold at most
  `max_patches` patches."""

  def scaled(scale: float, size: int) -> int:
    return int(max(patch, math.ceil(size * scale / patch) * patch))

  low, high = 1e-6, 100.0
  while high - low >= 1e-5:
    scale = (low + high) / 2
    if (scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= max_patches:
      low = scale
    else:
      high = scale
  return scaled(low, height), scaled(low, width)


def _preprocess(p: hub.Preprocessing, image: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """An image (uint8, H x W x C) or a clip's frames (T x H x W x C) through `p`; and whether it was resized (or its
  crop cut or padded anything)."""
  x, shape = image, tf.shape(image)[-3:-1]
  if p.naflex:
    size = tf.numpy_function(lambda s: np.array(naflex_size(*s, *p.naflex), np.int32), [shape], tf.int32)
    size = tf.ensure_shape(size, [2])
  elif isinstance(p.resize, int):
    short = tf.reduce_min(shape)  # The longer side to int(resize * long / short), as both libraries size it.
    size = tf.where(shape == short, p.resize, shape * p.resize // short)
  else:
    size = shape if p.resize is None else tf.constant(p.resize)
  same = tf.reduce_all(size == shape)

  def resized():
    y = tf.numpy_function(lambda v, s: pil_resize(v, s, p.method, p.library), [x, size], tf.uint8, stateful=False)
    return tf.ensure_shape(y, [*x.shape[:-3], None, None, x.shape[-1]])

  x = tf.cast(tf.cond(same, lambda: x, resized), tf.float32)
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
  # The model's graph at another input shape (height, width, channels): NaFlex's per-image grids.
  rebuild: Callable[[tuple[int, ...]], Any] | None = None

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
    top_k = min(self.top_k, len(self.labels))

    def compiled(graphdef):
      def step(params, batch):
        logits = nnx.merge(graphdef, params)(batch['images'])
        return jax.lax.top_k(jax.nn.softmax(logits.astype(np.float32), axis=-1), top_k)

      return jax.jit(step)

    self.step = compiled(nnx.graphdef(self.model))
    if self.preprocessing.naflex:
      self.step = self._per_grid(compiled)

  def _per_grid(self, compiled: Callable) -> Callable:
    """The step for batches of one image at its own patch grid (NaFlex): the model at that grid, its position table
    resized as SigLIP 2 resizes it (transformers_layout.SIGLIP2_RESIZE); one per grid, compiled once."""
    steps, patch = {}, self.preprocessing.naflex[0]

    def step(params, batch):
      shape = tuple(batch['images'].shape[1:])
      if shape not in steps:
        grid = (shape[0] // patch, shape[1] // patch)
        table = np.asarray(jax.device_get(params['pos_embedding'][...]))
        resized = release.resample_posemb(
          table, grid, self.model.posemb_prefix_rows, transformers_layout.SIGLIP2_RESIZE[0]
        )
        at_grid = jax.tree.map(lambda x: x, params)
        at_grid['pos_embedding'] = nnx.Param(jax.device_put(resized, self.device))
        steps[shape] = compiled(self.rebuild(shape)), at_grid
      run, at_grid = steps[shape]
      return run(at_grid, batch)

    return step

  def batch_size(self, requested: int) -> int:
    """NaFlex reads each image alone, at its own grid (no padding, so no mask)."""
    return 1 if self.preprocessing.naflex else requested

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
  hub.check_finite(loaded)
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
    isinstance(max_length, int) and not isinstance(max_length, bool) and max_length > 1,
    f'--pretrained {errors.foreign(path)}: max_length={errors.foreign(max_length, 20)} must be an integer of at '
    'least 2',
  )
  check(
    isinstance(positions, int) and not isinstance(positions, bool) and positions > 1,
    f'--pretrained {errors.foreign(path)}: max_position_embeddings={errors.foreign(positions, 20)} must be an integer '
    'of at least 2',
  )
  notes = []
  if max_length > positions:  # transformers' default 512 on a small model: it stops at its end token first.
    notes.append(f'translations cut at max_position_embeddings={positions} tokens (max_length={max_length})')
  max_length = min(max_length, positions) - 1  # Less the decoder start.
  beams = generation.get('num_beams', 1)
  notes += [f"greedy decoding, not the folder's beam search of num_beams={beams}"] if beams > 1 else []
  params = _with_weights(model, weights, path, notes)
  source, target = MarianVocab(path, 'source'), MarianVocab(path, 'target')
  return MarianPredictor('text', None, None, params, None, 1, model, source, target, max_length)


def _folder_predictor(path: str, weights: hub.HubWeights, top_k: int, kind: str) -> HubPredictor:
  """A hub folder with a classification head as it is: for `kind` 'image' the ViT, for 'video' the ViViT, of its
  shape (the family's pretrained_config), input and class count with its weights, label names and preprocessing."""
  name, family = ('vit', vit.ViT) if kind == 'image' else ('vivit', vivit.ViViT)
  reader = hub.reader(weights.layout)
  options = (reader.vit_options if kind == 'image' else reader.vivit_options)(weights.config, weights.tensors)
  num_classes, input_shape = options['num_classes'], options['input_shape']
  projection = getattr(reader, 'projection', lambda config: False)(weights.config)
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

  def rebuild(shape: tuple[int, ...]) -> Any:
    return nnx.graphdef(
      nnx.eval_shape(lambda: models.build(model_config, nnx.Rngs(0), num_classes=num_classes, input_shape=shape))
    )

  return HubPredictor(kind, None, None, params, labels, top_k, model, input_shape, preprocessing, rebuild)


def load_hub(path: str, top_k: int) -> Predictor:
  """A hub folder as it is: an image classifier (the ViT), a transformers video classifier (ViViT, VideoMAE: the
  ViViT), or a Marian translation folder."""
  with hub.config_values(path, '--pretrained'):
    return _load_hub(path, top_k)


def kind_of(path: str) -> str:
  """What the folder's model reads, 'image', 'video' or 'text' (Marian), from its config.json and tensor names
  alone: the inputs are checked before any weight is read."""
  with hub.config_values(path, '--pretrained'):
    return input_kind(path, hub.read(path))


def input_kind(path: str, weights: hub.HubWeights) -> str:
  """'text' for a Marian folder, 'video' for a video classifier or backbone (the ViViT reads it), else 'image'."""
  if weights.layout in seq2seq.Transformer.pretrained():
    return 'text'
  image, video = weights.layout in vit.ViT.pretrained(), weights.layout in vivit.ViViT.pretrained()
  check(image or video, f'--pretrained {path}: {hub.LAYOUTS[weights.layout].description} is not read')
  video = video and (not image or weights.config.get('model_type') in transformers_layout.VIDEO_TYPES)
  return 'video' if video else 'image'


def _load_hub(path: str, top_k: int) -> Predictor:
  weights = hub.read(path)
  kind = input_kind(path, weights)
  return load_marian(path, weights) if kind == 'text' else _folder_predictor(path, weights, top_k, kind)
