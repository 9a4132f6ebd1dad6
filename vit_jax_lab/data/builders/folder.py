"""A user's own files as a TFDS dataset: `data.name='folder:PATH'`. The folder is prepared once into data.data_dir
(as TFDS records, so sharding, exact resume and evaluation work as for every other dataset), and again when its
files change.

Layouts of PATH (files and folders whose names start with '.' are ignored everywhere; empty folders too):
  images  PATH/train/<class>/*.jpg|.jpeg|.png and PATH/test/<class>/... (or val/: the split is named after its
          folder); or just PATH/<class>/..., where TEST_PERCENT % of the files, chosen by a hash of their relative
          path (the same on every machine and in every file order), are the `test` split and the rest `train`.
          Every image under a class folder counts, at any depth: the class is the top folder.
  videos  the same, where each video is a folder of frames (JPEG/PNG, in natural order: 2.png before 10.png) or a
          video file (VIDEO_EXTENSIONS, decoded with PyAV). A dataset is one of videos when no class folder holds
          an image file at its top.
  text    PATH/train.tsv and PATH/test.tsv (or val.tsv): one `source<TAB>target` pair per line, UTF-8, no quoting.

Classes are the class folders' names, sorted; eval class folders must also be in train/. Images and frames are
RGB (grey ones get three equal channels; alpha is dropped) of any size (data.image_size resizes them). JPEG and
PNG files are stored as they are, but a JPEG whose EXIF orientation says it was taken sideways is stored upright
(`upright`); frames of video files are stored as JPEG (quality 95). A video's frames are files of their own in the
prepared copy (frames/<split>/<n>/<t>.jpg|png), its record their paths: a clip reads the frames it takes, not the
video (a 10-second Kinetics clip is 15 MB of JPEGs, of which a 32-frame clip takes 2 MB). A file that does not
decode (as tf.io.decode_image, which reads them in training, decodes it) is skipped and reported.

Each folder has its own dataset, data_dir/folder/<name>_<hash of its real path>/, whose metadata records the path
and a fingerprint of what was read: every relative path, size and modification time. When the fingerprint of the
folder differs from the prepared one, the prepared copy is deleted and the folder prepared again; but a run that
continues from a checkpoint refuses it (its model was trained on the old copy), which is kept until the user decides.
"""

import concurrent.futures
import dataclasses
import hashlib
import io
import os
import re
import shutil
import warnings
from typing import Iterator, NamedTuple

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image, ImageOps

from vit_jax_lab import errors
from vit_jax_lab.errors import ConfigError, check

PREFIX = 'folder:'  # data.name = PREFIX + the folder's path.
TEST_PERCENT = 20  # Class folders at the top: the files whose path hashes below this percentage are `test`.
EVAL_SPLITS = ('test', 'val')  # Folders (or .tsv files) besides train that are splits.
JPEG_PNG_EXTENSIONS = ('.jpg', '.jpeg', '.png')  # What TensorFlow decodes: a tracking benchmark's frames.
# Images and frames, compared in lower case: the other formats are re-encoded as PNG where they are read (`upright`).
IMAGE_EXTENSIONS = (*JPEG_PNG_EXTENSIONS, '.webp', '.bmp', '.gif', '.tif', '.tiff')
IMAGE_FORMATS = 'JPEG, PNG, WebP, BMP, GIF or TIFF'
VIDEO_EXTENSIONS = ('.mp4', '.avi', '.mov', '.mkv', '.webm')  # Video files, decoded with PyAV.
LISTED = 50  # Skipped files listed by path after preparing; further ones are only counted.
_WORKERS = 8  # Threads that read and check files while preparing (TF and PyAV decode outside the GIL).


class Item(NamedTuple):
  """An image, or a video: a frame folder (its frames, in order) or a file. Paths are relative to the root."""

  path: str
  label: int
  frames: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, repr=False)
class Layout:
  """What a folder holds, as read by `scan`."""

  root: str  # The real path of the folder.
  kind: str  # 'images', 'videos' or 'text'.
  classes: tuple[str, ...]  # Label names (no text).
  splits: dict[str, list[Item]]  # Split -> its items (text: one Item, the .tsv file, label -1).
  fingerprint: str  # Of every relative path, size and modification time read.
  ignored: tuple[str, ...]  # Files in class folders that are neither images nor videos (relative paths).

  def __repr__(self) -> str:  # TFDS logs the builder config; the items would be long.
    return f'Layout({self.root!r}, {self.kind})'


def _images():
  """vit_jax_lab.data.images, imported when a folder is prepared, not when a prepared one is read: it loads
  TensorFlow (5.4 s), which runs on the grain backend do without."""
  from vit_jax_lab.data import images

  return images


def is_folder(name: str) -> bool:
  return name.startswith(PREFIX)


def natural_key(name: str) -> tuple:
  """Sorts numbered names by their numbers: 'f2.png' before 'f10.png'."""
  return [int(part) if i % 2 else part for i, part in enumerate(re.split(r'(\d+)', name))], name


def held_out(relative_path: str) -> bool:
  """Whether a file of a folder without split folders is in `test`: a hash of its relative path (with '/')."""
  digest = hashlib.sha256(relative_path.encode('utf-8', 'surrogateescape')).digest()
  return int.from_bytes(digest[:8], 'big') % 100 < TEST_PERCENT


def config_name(root: str) -> str:
  """A TFDS config name for the folder: its base name (for people) and a hash of its real path (to be unique)."""
  base = re.sub(r'[^a-z0-9_]+', '_', os.path.basename(root).lower()).strip('_')[:40] or 'root'
  return f'{base}_{hashlib.sha256(root.encode("utf-8")).hexdigest()[:12]}'


def _entries(path: str) -> list[os.DirEntry]:
  with os.scandir(path) as it:
    return sorted((e for e in it if not e.name.startswith('.')), key=lambda e: natural_key(e.name))


def _has_extension(name: str, extensions: tuple[str, ...]) -> bool:
  return name.lower().endswith(extensions)


class _Scan:
  """Walks the class folders, collecting items, the fingerprint's lines and the ignored files."""

  def __init__(self, root: str):
    self.root, self.stats, self.ignored = root, [], []

  def stat(self, entry: os.DirEntry) -> None:
    s = entry.stat()
    self.stats.append(f'{os.path.relpath(entry.path, self.root)}\t{s.st_size}\t{s.st_mtime_ns}')

  def class_folder(self, path: str, label: int, kind: str) -> list[Item]:
    """The items of one class folder of a dataset of `kind`: every image at any depth ('images'; the class is the
    top folder), or videos ('videos': frame folders and video files). Empty folders are passed over."""
    items = []
    for e in _entries(path):
      rel = os.path.relpath(e.path, self.root).replace(os.sep, '/')
      if e.is_dir():
        if kind == 'images':
          real = os.path.realpath(e.path)
          check(  # A link to a folder above it would be walked until the OS refuses (a 51-line OSError).
            not (os.path.realpath(path) + os.sep).startswith(real + os.sep),
            f'{e.path} links back to {real}, a folder that holds it: remove the link',
          )
          items += self.class_folder(e.path, label, kind)
        elif frames := self.frames(e.path):
          items.append(Item(rel, label, frames))
      elif _has_extension(e.name, IMAGE_EXTENSIONS + VIDEO_EXTENSIONS):
        check(
          _has_extension(e.name, IMAGE_EXTENSIONS if kind == 'images' else VIDEO_EXTENSIONS),
          f'{e.path} is {"a video" if kind == "images" else "an image"} in a dataset of {kind} (a class folder '
          'with images makes it one of images; without, its sub-folders are videos): a dataset is one or the '
          'other; move one kind out',
        )
        self.stat(e)
        items.append(Item(rel, label))
      else:
        self.ignored.append(rel)
    return items

  def class_items(self, path: str, label: int, kind: str) -> list[Item]:
    """`class_folder`'s items; a class folder without any is a one-line error."""
    items = self.class_folder(path, label, kind)
    check(
      items,
      f'class folder {path} has no images ({IMAGE_FORMATS}) or videos: add them, or remove the folder',
    )
    if kind == 'videos' and any(not item.frames for item in items):
      _import_av(path)
    return items

  def frames(self, path: str) -> tuple[str, ...]:
    """The frames of a frame folder, in natural order; () for a folder without any (passed over)."""
    frames = []
    for e in _entries(path):
      rel = os.path.relpath(e.path, self.root).replace(os.sep, '/')
      if e.is_file() and _has_extension(e.name, IMAGE_EXTENSIONS):
        self.stat(e)
        frames.append(rel)
      else:
        self.ignored.append(rel)
    return tuple(frames)

  def fingerprint(self, kind: str) -> str:
    lines = '\n'.join([f'{kind} test_percent={TEST_PERCENT}', *self.stats])
    return hashlib.sha256(lines.encode('utf-8', 'surrogateescape')).hexdigest()[:16]


def _import_av(path: str):
  try:
    import av
  except ImportError:
    raise ConfigError(
      f'{path} holds video files ({" ".join(VIDEO_EXTENSIONS)}), which need PyAV: `pip install av`, or turn '
      'each video into a folder of its frames'
    ) from None
  return av


def scan(name: str) -> Layout:
  """The layout of folder `name` ('folder:PATH'): cheap, it lists and stats files but reads none. A folder that
  fits no layout is a ConfigError naming the path and the fix."""
  given = name[len(PREFIX) :]
  check(given.strip() != '', f'data.name={name!r} names no folder: use folder:/path/to/your/data')
  root = os.path.realpath(os.path.expanduser(given))
  check(
    os.path.isdir(root),
    f'data.name={name!r}: {root} is not a folder; give the folder holding one folder per class (or train.tsv)',
  )
  top = _entries(root)
  files = {e.name: e for e in top if e.is_file()}
  dirs = {e.name: e for e in top if e.is_dir()}
  walk = _Scan(root)
  if 'train.tsv' in files or any(f'{s}.tsv' in files for s in EVAL_SPLITS):
    check('train.tsv' in files, f'{root} has no train.tsv: text pairs need train.tsv besides test.tsv (or val.tsv)')
    evals = [s for s in EVAL_SPLITS if f'{s}.tsv' in files]
    check(evals, f'{root} has train.tsv but neither test.tsv nor val.tsv: add one (source<TAB>target lines)')
    splits = {}
    for split in ('train', *evals):
      walk.stat(files[f'{split}.tsv'])
      splits[split] = [Item(f'{split}.tsv', -1)]
    return Layout(root, 'text', (), splits, walk.fingerprint('text'), ())
  check(
    dirs,
    f'{root} has no class subfolders: put the files of each class in a folder named after it (e.g. '
    f'{os.path.join(root, "cats", "1.jpg")}), or give train.tsv and test.tsv for text pairs',
  )
  check(
    'train' in dirs or not any(s in dirs for s in EVAL_SPLITS),
    f'{root} has {"/ ".join(s for s in EVAL_SPLITS if s in dirs)}/ but no train/: add train/ with the class '
    'folders, or put the class folders at the top',
  )
  if 'train' in dirs:
    evals = [s for s in EVAL_SPLITS if s in dirs]
    check(
      evals,
      f'{root} has train/ but neither test/ nor val/: add one with the same class folders, or put the class '
      f'folders at the top to hold out {TEST_PERCENT}% of the files as test',
    )
    other = [d for d in dirs if d not in ('train', *EVAL_SPLITS)]
    check(
      not other,
      f'{os.path.join(root, other[0]) if other else ""} is none of train/, test/, val/: with split folders, the '
      'class folders go inside them; move it',
    )
    classes = tuple(sorted(e.name for e in _entries(dirs['train'].path) if e.is_dir()))
    folders_of = {
      split: {e.name: e.path for e in _entries(dirs[split].path) if e.is_dir()} for split in ('train', *evals)
    }
    kind = _kind([path for folders in folders_of.values() for path in folders.values()])
    splits = {}
    for split in ('train', *evals):
      folders = folders_of[split]
      check(
        folders,
        f'{dirs[split].path} has no class subfolders: put the files of each class in a folder named after it',
      )
      unknown = sorted(set(folders) - set(classes))
      check(
        not unknown,
        f'{folders[unknown[0]] if unknown else ""} is a class missing from {dirs["train"].path}: add training '
        'files of it, or remove it',
      )
      splits[split] = [item for c in sorted(folders) for item in walk.class_items(folders[c], classes.index(c), kind)]
  else:
    classes = tuple(sorted(dirs))
    kind = _kind([dirs[c].path for c in classes])
    items = [item for label, c in enumerate(classes) for item in walk.class_items(dirs[c].path, label, kind)]
    splits = {'train': [i for i in items if not held_out(i.path)], 'test': [i for i in items if held_out(i.path)]}
    check(
      splits['test'] and splits['train'],
      f'{root}: holding out {TEST_PERCENT}% of its {len(items)} files by hash left a split empty; add files, or '
      'make train/ and test/ folders',
    )
  return Layout(root, kind, classes, splits, walk.fingerprint(kind), tuple(walk.ignored))


def _kind(class_folders: list[str]) -> str:
  """'images' when a class folder holds an image file at its top, else 'videos' (frame folders, video files)."""
  for path in class_folders:
    if any(e.is_file() and _has_extension(e.name, IMAGE_EXTENSIONS) for e in _entries(path)):
      return 'images'
  return 'videos'


def read_tsv(path: str) -> list[tuple[str, str]]:
  """(source, target) of each line; a line without exactly one tab is a ConfigError naming it."""
  try:
    with open(path, encoding='utf-8', newline=None) as f:
      lines = f.read().split('\n')
  except UnicodeDecodeError as e:
    raise ConfigError(f'{path} is not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8') from None
  if lines and lines[-1] == '':
    lines.pop()  # The newline ending the last line.
  pairs = []
  for number, line in enumerate(lines, 1):
    tabs = line.count('\t')
    check(
      tabs == 1,
      f'{path}:{number} has {tabs} tabs: each line must be source<TAB>target (one tab; no empty lines)',
    )
    pairs.append(tuple(line.split('\t')))
  check(pairs, f'{path} has no lines: add source<TAB>target pairs')
  return pairs


EXIF_ORIENTATION = 0x0112  # The EXIF tag saying how a camera held sideways turned the picture.


def upright(data: bytes) -> bytes:
  """An image file's bytes as the pipelines decode them: a JPEG with its EXIF orientation applied, as a phone's
  photo is meant to be seen (re-encoded at quality 95, the tag gone); a WebP, BMP, GIF (its first frame) or TIFF
  re-encoded as PNG, which is lossless (TensorFlow decodes JPEG and PNG); an upright JPEG, a PNG and every other
  file unchanged (the checks report what is not an image). TensorFlow's decoders ignore EXIF."""
  if not data.startswith(b'\xff\xd8'):
    if data.startswith(b'\x89PNG'):
      return data
    try:
      with Image.open(io.BytesIO(data)) as image:
        if image.format not in ('WEBP', 'BMP', 'GIF', 'TIFF'):
          return data
        out = io.BytesIO()
        (image if image.mode in ('L', 'RGB') else image.convert('RGB')).save(out, 'PNG')
        return out.getvalue()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
      return data
  try:
    with Image.open(io.BytesIO(data)) as image:
      if image.getexif().get(EXIF_ORIENTATION, 1) == 1:
        return data
      turned = ImageOps.exif_transpose(image)
      out = io.BytesIO()
      (turned if turned.mode in ('L', 'RGB') else turned.convert('RGB')).save(out, 'JPEG', quality=95)
      return out.getvalue()
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):  # Left to the checks, which report it.
    return data


def size_problem(data: bytes) -> str | None:
  """Why an image file is refused before it is decoded, from its header: more pixels than errors.IMAGE_PIXELS (a
  decompression bomb: a small file of a huge canvas), or one side over errors.IMAGE_ASPECT times the other (a strip
  that resizing blows up); None otherwise, or when PIL cannot read the header (the decode check says why)."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', Image.DecompressionBombWarning)
      with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
  except Image.DecompressionBombError:
    return f'more than {errors.IMAGE_PIXELS:,} pixels'
  except Exception:  # Not an image PIL reads: the decode check says why.
    return None
  if width * height > errors.IMAGE_PIXELS:
    return f'{width}x{height} pixels, more than {errors.IMAGE_PIXELS:,}'
  if max(width, height) > errors.IMAGE_ASPECT * max(min(width, height), 1):
    return f'{width}x{height} pixels, one side over {errors.IMAGE_ASPECT} times the other'
  return None


@dataclasses.dataclass(eq=False)
class FolderConfig(tfds.core.BuilderConfig):
  layout: Layout | None = None


class Folder(tfds.core.GeneratorBasedBuilder):
  """The files of one folder (see the module docstring). Features: 'image' (uint8 RGB, any size) or 'video' (the
  paths of its frame files in frames_root()), 'label' (the class folders' names) and 'file_name' (relative to the
  folder); or 'source' and 'target' text."""

  VERSION = tfds.core.Version('2.0.0')
  RELEASE_NOTES = {
    '1.0.0': 'Images, frame folders, video files (PyAV), TSV text pairs; test held out by hash.',
    '2.0.0': "Videos' frames as files beside the records, which hold their paths.",
  }

  @property
  def layout(self) -> Layout:
    return self.builder_config.layout

  def _info(self) -> tfds.core.DatasetInfo:
    layout = self.layout
    metadata = tfds.core.MetadataDict(root=layout.root, fingerprint=layout.fingerprint)
    if layout.kind == 'text':
      features = {'source': tfds.features.Text(), 'target': tfds.features.Text()}
      supervised = ('source', 'target')
    else:
      key = 'image' if layout.kind == 'images' else 'video'
      if key == 'image':
        feature = tfds.features.Image(shape=(None, None, 3))
      else:
        feature = tfds.features.Tensor(shape=(None,), dtype=np.str_)
      features = {
        key: feature,
        'label': tfds.features.ClassLabel(names=layout.classes),
        'file_name': tfds.features.Text(),
      }
      supervised = (key, 'label')
    return self.dataset_info_from_configs(
      description=f'The {layout.kind} of {layout.root}.',
      features=tfds.features.FeaturesDict(features),
      supervised_keys=supervised,
      metadata=metadata,
    )

  def frames_root(self) -> str:
    """The folder of the videos' frame files, which the 'video' paths are relative to."""
    return os.path.join(self.data_dir, 'frames')

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    self._skipped, self._read = [], 0
    return {split: self._generate_examples(split, items) for split, items in self.layout.splits.items()}

  def _generate_examples(self, split: str, items: list[Item]):
    layout = self.layout
    if layout.kind == 'text':
      for number, (source, target) in enumerate(read_tsv(os.path.join(layout.root, items[0].path)), 1):
        yield number, {'source': source, 'target': target}
      return
    read = self._image if layout.kind == 'images' else self._video
    key = 'image' if layout.kind == 'images' else 'video'
    for number, (item, (data, why)) in enumerate(_in_threads(read, items)):
      self._read += 1
      if why is not None:
        self._skipped.append(f'skipped {why}')
        continue
      if key == 'video':
        data = self._write_frames(os.path.join(split, str(number)), data)
      name = item.path.encode('utf-8', 'surrogateescape')  # Names need not be UTF-8.
      yield name, {key: data, 'label': item.label, 'file_name': name}

  def _write_frames(self, folder: str, frames: list[bytes]) -> list[str]:
    """The paths, relative to frames_root() (here the copy being prepared), of a video's encoded frames written as
    files in `folder`."""
    os.makedirs(os.path.join(self.frames_root(), folder))
    paths = []
    for t, data in enumerate(frames):
      paths.append(os.path.join(folder, f'{t}.jpg' if data.startswith(b'\xff\xd8') else f'{t}.png'))
      with open(os.path.join(self.frames_root(), paths[-1]), 'wb') as f:
        f.write(data)
    return paths

  def _image(self, item: Item) -> tuple[bytes | None, str | None]:
    path = os.path.join(self.layout.root, item.path)
    if os.path.getsize(path) > errors.IMAGE_LIMIT:
      return None, f'{path}: over {errors.IMAGE_LIMIT:,} bytes'
    with open(path, 'rb') as f:
      data = f.read()
    why = size_problem(data)
    if why is not None:
      return None, f'{path}: {why}'
    data = upright(data)
    why = _images().decode_problem(data)[1]
    return (data, None) if why is None else (None, f'{path}: {why}')

  def _video(self, item: Item) -> tuple[list[bytes] | None, str | None]:
    if not item.frames:
      return self._video_file(os.path.join(self.layout.root, item.path))
    frames, shapes = [], set()
    for rel in item.frames:
      path = os.path.join(self.layout.root, rel)
      with open(path, 'rb') as f:
        frames.append(upright(f.read()))
      shape, why = _images().decode_problem(frames[-1])
      if why is not None:
        return None, f'{os.path.join(self.layout.root, item.path)}: frame {path}: {why}'
      shapes.add(shape)
    if len(shapes) > 1:
      return None, f'{os.path.join(self.layout.root, item.path)}: its frames differ in size {sorted(shapes)}'
    return frames, None

  def _video_file(self, path: str) -> tuple[list[bytes] | None, str | None]:
    av = _import_av(path)
    try:
      with av.open(path) as container:
        frames = [frame.to_ndarray(format='rgb24') for frame in container.decode(video=0)]
    except (av.FFmpegError, ValueError, IndexError) as e:
      return None, f'{path}: does not decode ({str(e).splitlines()[0][:80] if str(e) else type(e).__name__})'
    if not frames:
      return None, f'{path}: has no frames'
    return [_images().encode_jpeg(f) for f in frames], None

  def notes(self) -> list[str]:
    """Lines to print after preparing: the files skipped (the first LISTED by path) and their count, and how many
    were ignored."""
    layout, lines = self.layout, []
    skipped = getattr(self, '_skipped', [])
    lines += skipped[:LISTED]
    if skipped:
      unit = 'images' if layout.kind == 'images' else 'videos'
      more = f' ({len(skipped) - LISTED} more not listed)' if len(skipped) > LISTED else ''
      lines.append(f'skipped {len(skipped)} of {self._read} {unit} that do not decode{more}')
    if layout.ignored:
      lines.append(
        f'ignored {len(layout.ignored)} file(s) that are neither images ({IMAGE_FORMATS}) nor videos, '
        f'e.g. {os.path.join(layout.root, layout.ignored[0])}'
      )
    return lines


def _in_threads(fn, items: list, chunk: int = 4 * _WORKERS) -> Iterator[tuple]:
  """(item, fn(item)) in order, computed by a few threads a chunk at a time (memory stays a chunk's)."""
  with concurrent.futures.ThreadPoolExecutor(_WORKERS) as pool:
    for start in range(0, len(items), chunk):
      part = items[start : start + chunk]
      yield from zip(part, pool.map(fn, part))


def builder(name: str, data_dir: str | None, resuming: bool = False) -> Folder:
  """The builder of `name` ('folder:PATH'), reading data_dir. A copy prepared from other files (the folder changed
  since) is deleted first, so that the builder prepares it anew; but not under a run that continues (`resuming`),
  which trained on that copy: that is refused, the copy kept until the user decides. Text pairs are checked here
  when unprepared."""
  layout = scan(name)
  config = FolderConfig(name=config_name(layout.root), description=f'The files of {layout.root}', layout=layout)
  made = Folder(config=config, data_dir=data_dir)
  stale = made.is_prepared() and made.info.metadata.get('fingerprint') != layout.fingerprint
  if layout.kind == 'text' and (stale or not made.is_prepared()):  # Mistakes first: a stale copy stays then.
    for items in layout.splits.values():
      read_tsv(os.path.join(layout.root, items[0].path))
  check(
    not (stale and resuming),
    f'{layout.root} changed since it was prepared in {made.data_dir}, on which this run trained: to train anew on '
    f'the changed files use another --workdir; to continue this run on them delete {made.data_dir}',
  )
  if stale:
    print(f'{layout.root} changed since it was prepared in {made.data_dir}: preparing it again', flush=True)
    shutil.rmtree(made.data_dir)
    made = Folder(config=config, data_dir=data_dir)
  return made
