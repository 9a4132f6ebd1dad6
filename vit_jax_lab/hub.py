"""Hub-style weight folders (timm's and Hugging Face's): config.json + model.safetensors, or
model.safetensors.index.json + its shards. safetensors checks each file's header; a tensor is a read-only view of the
memory-mapped file, made when asked for (safetensors' own NumPy `get_tensor` copies it, twice over while reading), so
converting a folder copies only what its layout reshapes, and `place` reads each device's shard of a parameter alone.
Nothing is ever unpickled and torch is never imported.

A folder's layout is recognised from its tensor names (LAYOUTS, one row per layout: its description, the tensors
that tell it, its reader module and the model classes that read it); the reader maps the layout onto the model's
names, and the model's `load_pretrained` takes a `HubWeights`. A new layout is its row and its reader.
"""

import collections.abc
import contextlib
import copy
import dataclasses
import importlib
import json
import os
import types
from typing import Any, Iterator

import jax
import ml_dtypes
import numpy as np
import safetensors

from vit_jax_lab import errors
from vit_jax_lab.errors import ConfigError

CONFIG = 'config.json'
WEIGHTS = 'model.safetensors'
INDEX = 'model.safetensors.index.json'
PICKLED = ('.bin', '.pt', '.pth', '.ckpt', '.pkl')


@dataclasses.dataclass(frozen=True)
class Layout:
  """A hub folder layout: its row in LAYOUTS and its reader module are all a new layout needs.

  Attributes:
    description: what the folder is, for messages (its library's classes and the tensor names that tell it).
    identifying: tensor names the folder has (also under a module prefix such as 'vit.' or 'vision_model.').
    reader: the module (dotted path) that reads it and writes it: for an image or video layout `vit_options(config,
      tensors)` (or `vivit_options`: the model keys), `to_release(tensors, num_heads)` (names onto the release
      layout, and each one's origin), `notes(config, tensors)`, `posemb_resize(config)` (how its library resamples
      position embeddings), `preprocessing(path, config)` (what `predict --pretrained` applies), and optionally
      `adapt(config, tensors)` (the tensors renamed to what they compute, as `read` hands them on) and
      `projection(config)` (whether its head is an embedding projection, not a classifier); Marian's its own. A
      module that `tools.export --layout` writes with (its tools.export.HUB_LAYOUTS entry) also has `EXPORTS` (the
      model families, config.model.name, whose runs it writes) and `folder(model, params, data_config, labels)` ->
      (JSON files by name, model.safetensors' tensors), which tools.export writes; Marian's `folder` takes the run's
      parameters, configs and vocabulary (a model builder and Marian folder reader from tools.export) and also
      returns the tokenizer files to copy and notes.
    families: the model classes that read it (their `pretrained()`: ViT, ViViT, Tracker, Transformer).
  """

  description: str
  identifying: tuple[str, ...]
  reader: str
  families: tuple[str, ...]


_TIMM, _TRANSFORMERS = 'vit_jax_lab.models.timm_layout', 'vit_jax_lab.models.transformers_layout'
_IMAGE = ('ViT', 'Tracker')
LAYOUTS = {
  'timm_vit': Layout(
    "timm's VisionTransformer (patch_embed.proj.weight, blocks.N.attn.qkv.weight)",
    ('patch_embed.proj.weight', 'blocks.0.attn.qkv.weight'),
    _TIMM,
    _IMAGE,
  ),
  'timm_eva': Layout(
    "timm's Eva with separate projections (patch_embed.proj.weight, blocks.N.attn.q_proj.weight: EVA-02 base, large)",
    ('patch_embed.proj.weight', 'blocks.0.attn.q_proj.weight'),
    _TIMM,
    _IMAGE,
  ),
  'transformers_vit': Layout(
    "transformers' ViT / DINOv2 / ViViT / VideoMAE (embeddings.patch_embeddings.projection.weight, encoder.layer.N"
    '.attention.attention.query.weight)',
    ('embeddings.patch_embeddings.projection.weight', 'encoder.layer.0.attention.attention.query.weight'),
    _TRANSFORMERS,
    (*_IMAGE, 'ViViT'),
  ),
  'transformers_clip': Layout(
    "transformers' CLIP / SigLIP image tower (embeddings.patch_embedding.weight, encoder.layers.N.self_attn.q_proj"
    '.weight)',
    ('embeddings.patch_embedding.weight', 'encoder.layers.0.self_attn.q_proj.weight'),
    _TRANSFORMERS,
    _IMAGE,
  ),
  'transformers_dinov3': Layout(
    "transformers' DINOv3ViTModel (embeddings.patch_embeddings.weight, layer.N.attention.q_proj.weight)",
    ('embeddings.patch_embeddings.weight', 'layer.0.attention.q_proj.weight'),
    _TRANSFORMERS,
    _IMAGE,
  ),
  'transformers_vjepa2': Layout(
    "transformers' VJEPA2Model / VJEPA2ForVideoClassification (encoder.embeddings.patch_embeddings.proj.weight, "
    'encoder.layer.N.attention.query.weight)',
    ('encoder.embeddings.patch_embeddings.proj.weight', 'encoder.layer.0.attention.query.weight'),
    'vit_jax_lab.models.vjepa2_layout',
    ('ViViT',),
  ),
  'transformers_marian': Layout(
    "transformers' MarianMTModel (opus-mt) (model.encoder.layers.N.self_attn.q_proj.weight, model.decoder.layers.N"
    '.encoder_attn.q_proj.weight)',
    ('encoder.layers.0.self_attn.q_proj.weight', 'decoder.layers.0.encoder_attn.q_proj.weight'),
    'vit_jax_lab.models.marian_layout',
    ('Transformer',),
  ),
}


MAX_SIDE = 16_384  # Pixels a side of a preprocessing's resize or crop (the largest releases read 1,024-ish).


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  """A hub folder's evaluation preprocessing of an image (or of each frame of a clip), as its library applies it:
  resize (an int: the shorter side to it; a pair: to that size; None: none), a central crop to `crop`, then
  (value * scale - offset - mean) / std per channel. `method` is one of Pillow's filters, resized as `library` does
  it (tools.pretrained.pil_resize)."""

  resize: int | tuple[int, int] | None
  crop: tuple[int, int] | None
  method: str
  scale: float
  mean: tuple[float, ...]
  std: tuple[float, ...]
  offset: float = 0.0  # Subtracted after the scale: VivitImageProcessor's `offset` (value * scale - 1).
  # The crop's offset rounded half to even, as torchvision's center_crop (timm) rounds it; else down (transformers).
  crop_round: bool = False
  # Whose uint8 resize: 'pil' (timm's pipeline) or 'torchvision' (transformers' image processors).
  library: str = 'pil'
  # SigLIP 2's NaFlex (Siglip2ImageProcessor): (patch_size, max_num_patches), each image resized to its own grid of
  # at most that many patches, its aspect ratio kept (tools.pretrained.naflex_size); `resize` and `crop` are None.
  naflex: tuple[int, int] | None = None

  def __post_init__(self):
    values = (*self.mean, *self.std, self.scale)
    errors.check(
      all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and min(self.std) > 0,
      f"--pretrained: the folder's preprocessing has mean {errors.foreign(self.mean, 60)} and std "
      f'{errors.foreign(self.std, 60)}: they must be numbers, the std positive',
    )
    sizes = {'resize': self.resize, 'crop': self.crop}
    sides = {f'{k}[{i}]': v for k, size in sizes.items() if size is not None for i, v in enumerate(size_pair(size))}
    errors.positive_ints("--pretrained: the folder's preprocessing", sides)
    for key, side in sides.items():  # Before, the resize it asked for was blamed on a good image.
      errors.check(
        side <= MAX_SIDE,
        f"--pretrained: the folder's preprocessing has {key}={side:,}; a side of more than {MAX_SIDE:,} pixels is no "
        'model input: is it the right file?',
      )


def size_pair(value: Any) -> tuple[int, int]:
  """(height, width) of an image size written as an int, a pair or transformers' {'height', 'width'}."""
  if isinstance(value, dict):
    return value['height'], value['width']
  return (value, value) if isinstance(value, int) else tuple(value)


def reader(layout: str) -> types.ModuleType:
  """The module that reads and writes `layout` (its row's `reader`), imported when first asked for."""
  return importlib.import_module(LAYOUTS[layout].reader)


def reads(family: str) -> tuple[str, ...]:
  """The layouts the model class named `family` reads (the rows that name it)."""
  return tuple(name for name, row in LAYOUTS.items() if family in row.families)


def reader_of(weights: 'HubWeights', family: str, name: str) -> types.ModuleType:
  """The reader of the folder `weights` for the model class `family` (called `name` in messages); a layout it does
  not read is one line."""
  if weights.layout not in reads(family):
    raise ConfigError(
      f'init_from={weights.path!r} holds {LAYOUTS[weights.layout].description} weights, which the {name} does not read'
    )
  return reader(weights.layout)


def cast_like(loaded: Any, params: Any) -> tuple[Any, list[str]]:
  """A folder's parameters `loaded` in the dtypes of the model's `params` (a folder saved in bfloat16 or float16
  trains in the model's own dtype), copied tensor by tensor where they differ; and the note that says so."""
  cast = {str(a.dtype) for a, p in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)) if a.dtype != p.dtype}
  if not cast:
    return loaded, []
  loaded = jax.tree.map(lambda a, p: a if a.dtype == p.dtype else np.asarray(a).astype(p.dtype), loaded, params)
  return loaded, [f"{' and '.join(sorted(cast))} tensors cast to the model's parameter dtype"]


def _conversion_hint(name: str) -> str:
  return (
    f'{name} is a pickled PyTorch file, which is never unpickled here: convert it to model.safetensors in a '
    "PyTorch environment (safetensors.torch.save_file(torch.load(f, weights_only=True), 'model.safetensors'); "
    'timm: timm.models.save_for_hf(model, DIR, safe_serialization=True))'
  )


# What one of our workdirs holds beside its own config.json: such a folder is never taken for a hub folder.
_WORKDIR = ('checkpoints', 'metrics.jsonl', 'lock', 'tensorboard')


def is_folder(path: str) -> bool:
  """Whether `path` is meant as a hub folder: a folder with config.json or (safetensors or pickled) weights, and
  nothing of one of our workdirs."""
  if not os.path.isdir(path):
    return False
  names = os.listdir(path)
  if any(n in _WORKDIR for n in names):
    return False
  return CONFIG in names or any(n.endswith('.safetensors') or n.endswith(PICKLED) for n in names)


# safetensors dtype names -> NumPy's (bfloat16: ml_dtypes', which JAX uses).
_DTYPES = {
  'F64': np.float64,
  'F32': np.float32,
  'F16': np.float16,
  'BF16': ml_dtypes.bfloat16,
  'I64': np.int64,
  'I32': np.int32,
  'I16': np.int16,
  'I8': np.int8,
  'U8': np.uint8,
  'BOOL': np.bool_,
}


def _header(file: str) -> tuple[dict[str, Any], int]:
  """A safetensors file's header (name -> dtype, shape, data_offsets) and where its data begins: an 8-byte
  little-endian length, then that much JSON."""
  with open(file, 'rb') as f:
    size = int.from_bytes(f.read(8), 'little')
    header = json.loads(f.read(size))
  header.pop('__metadata__', None)
  return header, 8 + size


class Tensors(collections.abc.Mapping):
  """name -> np.ndarray, a read-only view of the memory-mapped file holding it, made when asked for; iterates in
  file order."""

  def __init__(self, files: dict[str, str]):
    self._files = files  # name -> the file holding it.
    self._stored: dict[str, str] = {}  # A name shown -> its name in the file, where `renamed` changed it.
    self._headers = {file: _header(file) for file in dict.fromkeys(files.values())}
    self._maps: dict[str, np.memmap] = {}

  def renamed(self, names: dict[str, str]) -> 'Tensors':
    """The same tensors, those named in `names` (name -> new name) under their new names."""
    view = copy.copy(self)
    view._files = {names.get(n, n): f for n, f in self._files.items()}
    view._stored = {names.get(n, n): self._stored.get(n, n) for n in self._files}
    return view

  def __getitem__(self, name: str) -> np.ndarray:
    file = self._files[name]
    header, start = self._headers[file]
    entry = header[self._stored.get(name, name)]
    if entry['dtype'] not in _DTYPES:
      raise ConfigError(f'{os.path.basename(file)}: tensor {name} has dtype {entry["dtype"]}, which is not read')
    if file not in self._maps:
      self._maps[file] = np.memmap(file, dtype=np.uint8, mode='r')
    begin, end = entry['data_offsets']
    return self._maps[file][start + begin : start + end].view(_DTYPES[entry['dtype']]).reshape(entry['shape'])

  def shape(self, name: str) -> tuple[int, ...]:
    """A tensor's shape, from the file's header alone."""
    return tuple(self._headers[self._files[name]][0][self._stored.get(name, name)]['shape'])

  def __iter__(self) -> Iterator[str]:
    return iter(self._files)

  def __len__(self) -> int:
    return len(self._files)


@dataclasses.dataclass(frozen=True)
class HubWeights:
  """A read folder: its config.json, its tensors (read lazily) and the layout they are in (a key of LAYOUTS)."""

  path: str
  config: dict[str, Any]
  tensors: Tensors
  layout: str


@contextlib.contextmanager
def config_values(path: str, option: str = 'init_from') -> Iterator[None]:
  """A folder's config.json values of a type or range its reader cannot take (a list for an object, a string for a
  size) as one ConfigError naming the folder: the files are the user's, not our code's mistake."""
  try:
    yield
  except ConfigError:
    raise
  except KeyError as e:
    raise ConfigError(
      f'{option}={errors.foreign(path)}: its config.json lacks the key {errors.foreign(e, 60)}'
    ) from None
  except (TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as e:
    raise ConfigError(
      f'{option}={errors.foreign(path)}: its config.json holds a value of a type or range it cannot be read with '
      f'({type(e).__name__}: {errors.foreign(e, 120)})'
    ) from None


def refuse_pickled(path: str) -> None:
  """A pickled PyTorch file (.bin, .pt, .pth, ...) is one error line with the conversion hint."""
  if path.endswith(PICKLED):
    raise ConfigError(f'init_from={path!r}: ' + _conversion_hint(os.path.basename(path)))


def _weight_files(path: str) -> tuple[list[str], dict[str, str] | None]:
  """The safetensors files of a folder: the index's shards, or model.safetensors (or the only .safetensors); and
  the index's weight map (tensor name -> shard file name), None without one."""
  names = sorted(os.listdir(path))
  if INDEX in names:
    weight_map = errors.read_json(os.path.join(path, INDEX), 'init_from: the index').get('weight_map')
    errors.check(
      isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values()),
      f'init_from={errors.foreign(path)}: {INDEX} has no weight_map of tensor names to shard files',
    )
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if s not in names]
    if missing:
      raise ConfigError(f'init_from={path!r}: {INDEX} names shards the folder lacks: {", ".join(missing)}')
    return [os.path.join(path, s) for s in shards], weight_map
  found = [WEIGHTS] if WEIGHTS in names else [n for n in names if n.endswith('.safetensors')]
  if len(found) == 1:
    return [os.path.join(path, found[0])], None
  pickled = [n for n in names if n.endswith(PICKLED)]
  if pickled:
    raise ConfigError(f'init_from={path!r} holds only pickled weights: ' + _conversion_hint(pickled[0]))
  what = f'{len(found)} .safetensors files and no {INDEX}' if found else f'no {WEIGHTS}'
  raise ConfigError(f'init_from={path!r} is not a weights folder: it has {what}')


def check(path: str, accepted: tuple[str, ...] | None = None) -> None:
  """Checks a hub folder from its config and the tensors' names alone (nothing read): before a run writes.
  `accepted`: the layouts the model reads (its PRETRAINED); None: any known one."""
  layout = read(path).layout
  if accepted is not None and layout not in accepted:
    raise ConfigError(
      f'init_from={path!r} holds {LAYOUTS[layout].description} weights, which this model does not read (it reads: '
      f'{", ".join(accepted) or "nothing"})'
    )


def read(path: str) -> HubWeights:
  """The folder at `path`, its layout recognised; every way it is not one we read is one ConfigError line."""
  refuse_pickled(path)
  if not os.path.isdir(path):
    raise ConfigError(f'init_from={path!r} is not a folder with config.json and model.safetensors')
  if not os.path.lexists(os.path.join(path, CONFIG)):  # Anything else there is refused as it is read.
    raise ConfigError(
      f'init_from={path!r} has no {CONFIG}: a hub folder holds config.json and model.safetensors (or its shards)'
    )
  files, weight_map = _weight_files(path)
  for file in files:
    errors.regular_file(file, 'init_from: the weights', 2**44)  # A pipe or device would block or never end.
  config = errors.read_json(os.path.join(path, CONFIG), 'init_from: the config')
  names = {}
  for file in files:
    try:
      with safetensors.safe_open(file, framework='np') as f:
        names |= dict.fromkeys(f.keys(), file)
    except Exception as e:  # safetensors raises its own SafetensorError for a damaged header.
      name = os.path.basename(file)
      raise ConfigError(f'init_from={path!r}: {name} is not a readable safetensors file ({e})') from None
  if weight_map is not None:  # The index is what transformers and timm load by: a tensor elsewhere is not theirs.
    for name, file in weight_map.items():
      where = os.path.basename(names.get(name, ''))
      errors.check(
        where == file,
        f'init_from={errors.foreign(path)}: {INDEX} puts {errors.foreign(name, 80)} in {errors.foreign(file, 80)}, '
        f'which does not hold it' + (f' ({where} does)' if where else ''),
      )
    unmapped = sorted(set(names) - set(weight_map))
    if unmapped:
      raise ConfigError(
        f'init_from={errors.foreign(path)}: {errors.foreign(unmapped[0], 80)} is in '
        f'{os.path.basename(names[unmapped[0]])} but not in {INDEX} ({len(unmapped)} such)'
      )
  tensors = Tensors(names)
  layout = layout_of(path, tensors)
  adapt = getattr(reader(layout), 'adapt', None)  # A layout's tensors under the names of what they compute.
  return HubWeights(path, config, adapt(config, tensors) if adapt else tensors, layout)


def layout_of(path: str, names: collections.abc.Iterable[str]) -> str:
  """The key of LAYOUTS whose identifying tensors the folder has; otherwise the first names and the known layouts."""
  names = list(names)
  for layout, row in LAYOUTS.items():
    if all(any(name == n or name.endswith('.' + n) for name in names) for n in row.identifying):
      return layout
  first = ', '.join(sorted(names)[:5]) or 'no tensors'
  known = '; '.join(row.description for row in LAYOUTS.values())
  raise ConfigError(f'init_from={path!r}: weights of an unknown layout (first names: {first}); known layouts: {known}')


def place(tree: Any, shardings: Any) -> Any:
  """Host arrays (views of a folder's memory-mapped files among them) -> jax.Arrays laid out by `shardings` (a tree
  of the same structure), one parameter at a time (`jax.make_array_from_callback`): no host copy of the whole model
  is made, only of one tensor at a time where the layout reshapes it; each checked by check_finite's rule."""

  def one(path: Any, array: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    if isinstance(array, jax.Array):  # Kept from the initial state, already on the devices.
      return jax.device_put(array, sharding)
    # A strided view (a transposed kernel) is copied whole first, one tensor: sliced shard by shard, it is read
    # from the mapped file column by column, several times slower.
    array = np.ascontiguousarray(array)
    _check_finite(path, array)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

  return jax.tree_util.tree_map_with_path(one, tree, shardings)


def check_finite(tree: Any) -> None:
  """Loaded weights (host arrays; those on the devices are the model's own) hold no NaN or infinity: a damaged or
  diverged file would otherwise predict NaN without a word. One line naming the first parameter that does."""
  jax.tree_util.tree_map_with_path(lambda path, x: None if isinstance(x, jax.Array) else _check_finite(path, x), tree)


def _check_finite(path: Any, array: np.ndarray) -> None:
  if array.dtype.kind in 'fV' and not np.isfinite(array).all():  # 'V': bfloat16 (ml_dtypes).
    name = jax.tree_util.keystr(path, simple=True, separator='.')
    raise ConfigError(f'the weights given hold NaN or infinite values (in {name}): the file is damaged or diverged')
