"""TFDS builders of this project (generated locally, no network; name -> module that registers it), and finding,
preparing and loading any dataset by its data.* keys, without TensorFlow unless data is generated."""

import contextlib
import errno
import fcntl
import glob
import importlib
import io
import os
import shutil
import socket
import stat
from typing import Any, Callable, Iterator

import jax
from google.protobuf import json_format
from jax.experimental import multihost_utils

from vit_jax_lab import console, errors, hosts
from vit_jax_lab.errors import ConfigError, check

BUILTIN = {
  'digit_scenes': 'vit_jax_lab.data.builders.digit_scenes',
  'digits': 'vit_jax_lab.data.builders.digits',
  'listops': 'vit_jax_lab.data.builders.listops',
  'moving_digits': 'vit_jax_lab.data.builders.moving_digits',
  'scan': 'vit_jax_lab.data.builders.scan',
  'tracking_benchmarks': 'vit_jax_lab.data.builders.tracking_benchmarks',
  'tracking_digits': 'vit_jax_lab.data.builders.tracking_digits',
}


def is_builtin(name: str) -> bool:
  """Whether `name` ('scan' or with a config, 'scan/length') is one of ours."""
  return name.split('/')[0] in BUILTIN


def register(name: str) -> None:
  """Imports the builder module, which registers `name` (less any '/config') with TFDS; a config it does not
  have is a ConfigError."""
  base, _, config = name.partition('/')
  module = importlib.import_module(BUILTIN[base])
  configs = [c.name for b in vars(module).values() if hasattr(b, 'BUILDER_CONFIGS') for c in b.BUILDER_CONFIGS]
  config = config.partition(':')[0]  # 'scan/simple:1.0.0' names a version too.
  check(
    not config or config in configs,
    f'data.name={name!r}: the built-in {base} has no config {config!r}; its configs: {", ".join(configs) or "none"}',
  )


def check_data_dir(data_config) -> None:
  """`data.data_dir` must exist unless the dataset is one of ours or a folder (generated into it on first use)."""
  d = data_config.data_dir
  check(
    d is None or not os.path.exists(d) or os.path.isdir(d),
    f'data.data_dir={d!r} is a file, not a folder: name the folder that holds (or is to hold) the prepared data',
  )
  check(
    d is None or os.path.isdir(d) or is_builtin(data_config.name) or data_config.name.startswith('folder:'),
    f'data.data_dir={d!r} does not exist; point it at the folder holding prepared TFDS data',
  )


@contextlib.contextmanager
def preparing(prepared_dir: str) -> Iterator[None]:
  """Marks the block where this process prepares the dataset of `prepared_dir` (a `.preparing_*` file beside it);
  once it succeeded, removes the folders a killed preparation left (TFDS's `incomplete.XXXXXX_<version>`), unless
  another live process (or one on another host, which cannot be asked) is preparing the same dataset."""
  parent, version = os.path.split(os.path.normpath(prepared_dir))
  os.makedirs(parent, exist_ok=True)
  marker = os.path.join(parent, f'.preparing_{version}.{socket.gethostname()}.{os.getpid()}')
  open(marker, 'w').close()
  try:
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(marker)
  _remove_killed(parent, version)


def _remove_killed(parent: str, version: str) -> None:
  markers = [n for n in os.listdir(parent) if n.startswith(f'.preparing_{version}.')]
  for name in markers:
    host, _, pid = name[len(f'.preparing_{version}.') :].rpartition('.')
    if host != socket.gethostname() or not pid.isdigit() or hosts.alive(int(pid)):
      return  # Someone may be preparing it now: its unfinished folder is not ours to remove.
    os.remove(os.path.join(parent, name))
  left = sorted(n for n in os.listdir(parent) if n.startswith('incomplete.') and n.endswith(f'_{version}'))
  for name in left:
    shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
  if left:
    first = os.path.join(parent, left[0])
    print(f'removed {len(left)} unfinished preparation(s) left by a stopped run: {first}', flush=True)


def find(data_config, resuming: bool = False):
  """The TFDS builder of data.name, prepared or not (built-in datasets and folders are generated on first use, by
  load). `resuming`: a run continues, so a folder whose files changed since it was prepared is refused
  (folder.builder). Another TFDS dataset must be prepared already. A prepared dataset_info.json that is not JSON
  (emptied, cut short) is one line, not protobuf's ParseError."""
  try:
    return _find(data_config, resuming)
  except json_format.ParseError as e:
    name, data_dir = data_config.name, data_config.data_dir
    reason = str(e).split('Failed to load JSON: ')[-1].rstrip('.')[:120]
    fix = "delete the dataset's folder there and run again: it is prepared anew"
    if not name.startswith('folder:') and not is_builtin(name):
      fix = f'rebuild it (`tfds build {name} --data_dir DIR`)'
    raise ConfigError(
      f'data.name={name!r}: the dataset_info.json of its prepared data in data.data_dir={data_dir!r} is damaged '
      f'({reason}): {fix}'
    ) from None


def _find(data_config, resuming: bool):
  # Here, not at the top: config checks import this package, and a mistake is reported before TFDS loads (0.6 s).
  import tensorflow_datasets as tfds

  from vit_jax_lab.data.builders import folder

  check_data_dir(data_config)
  name, data_dir = data_config.name, data_config.data_dir
  if folder.is_folder(name):  # The user's own files, prepared once (and again when they change).
    return folder.builder(name, data_dir, resuming=resuming)
  if is_builtin(name):
    register(name)
    return tfds.builder(name, data_dir=data_dir)
  check_features(data_dir, name)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError(
      f'data.name={name!r} is not a TFDS dataset; built-in ones: {", ".join(BUILTIN)}; your own files: '
      'folder:/path/to/them'
    ) from None
  except (ValueError, AssertionError) as e:  # A name TFDS cannot parse, a config or version the dataset lacks.
    why = str(e).splitlines()[0].rsplit('": ', 1)[-1].split('. ')[0].rstrip('.: ')
    raise ConfigError(f'data.name={name!r}: {why}; a TFDS name is NAME[/CONFIG][:VERSION]') from None
  check(
    builder.is_prepared(),
    f'data.name={name!r} is not prepared in data.data_dir={data_dir!r}: run `tfds build {name} --data_dir DIR` '
    'where there is network, then set data.data_dir=DIR',
  )
  return builder


def check_splits(builder, data_config) -> None:
  """data.train_split and eval_split are splits of the dataset (TFDS slicing allowed) that hold examples."""
  for key in ('train_split', 'eval_split'):
    try:
      examples = builder.info.splits[data_config[key]].num_examples
    except (KeyError, ValueError) as e:
      raise ConfigError(
        f'data.{key}={data_config[key]!r} is not a split of {data_config.name}: '
        f'valid ones are {", ".join(builder.info.splits)} (TFDS slicing allowed)'
      ) from e
    if examples == 0:
      sizes = ', '.join(f'{name} ({split.num_examples})' for name, split in builder.info.splits.items())
      raise ConfigError(
        f'data.{key}={data_config[key]!r} of {data_config.name} holds no examples: choose a slice that does, of {sizes}'
      )


def load(
  data_config,
  info_fn: Callable[[Any, Any], Any],
  *,
  resuming: bool = False,
  before_generating: Callable[[Any], None] | None = None,
) -> tuple[Any, Any]:
  """The TFDS builder (built-in datasets and folders are generated on first use) and what the task needs to know
  of the data: `info_fn(builder, data_config)`. `resuming`: a run continues, so a folder whose files changed since
  it was prepared is refused (folder.builder). TensorFlow loads only if the data is generated (TFDS writes its
  records with it), so a prepared dataset's mistakes (and the model's, checked next) are answered without it.
  `before_generating(builder)`: called with a builder whose data is not there yet, before it is written."""
  builder = find(data_config, resuming)
  if not builder.is_prepared():  # Generated (a built-in dataset, a folder), by process 0 first.
    if before_generating is not None:
      before_generating(builder)
    builder = _prepare_once(lambda: find(data_config, resuming))
  check_splits(builder, data_config)
  return builder, info_fn(builder, data_config)


def _prepare_once(make: Callable[[], Any]) -> Any:
  """The builder `make()` returns, its data generated by process 0 first, so hosts that share a disk do not race;
  the other processes make theirs after it, so they read what it generated."""
  make = _writable(make)
  if jax.process_index() == 0:
    builder = _prepared(make)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('data prepared')
    if jax.process_index() > 0:
      builder = _prepared(make)  # Hosts without a shared disk build their own copy.
  return builder


def _prepared(make: Callable[[], Any]) -> Any:
  """`make()`'s builder with its data generated, by one run of this machine at a time: two runs started together on
  one data_dir would both generate it, and the second's TFDS fails to move its copy into place. The one that waited
  reads what the first one generated."""
  builder = make()
  if builder.is_prepared():
    return builder
  parent, version = os.path.split(os.path.normpath(builder.data_dir))
  _writable(lambda: os.makedirs(parent, exist_ok=True))()
  lock_path = os.path.join(parent, f'.lock_{version}')
  check(  # A pipe there would block the open forever; a folder fail it.
    not os.path.lexists(lock_path) or stat.S_ISREG(os.lstat(lock_path).st_mode),
    f'{errors.foreign(lock_path)} is not a regular file: runs take turns preparing {builder.data_dir} by locking it; '
    'remove it',
  )
  with _writable(lambda: open(lock_path, 'a'))() as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      print(f'waiting for another run that prepares {builder.data_dir}', flush=True)
      fcntl.flock(lock, fcntl.LOCK_EX)  # Released when that run's preparation ends (or the run does).
    builder = make()
    if not builder.is_prepared():
      _writable(lambda: _generate(builder))()
  return builder


def _generate(builder) -> None:
  """One line of ours instead of TFDS's two bold ones about downloads that do not happen."""
  import tensorflow_datasets as tfds  # As in find.

  from vit_jax_lab.data.builders import folder

  if not console.VERBOSE:
    tfds.disable_progress_bar()  # It would draw one per split.
  if isinstance(builder, folder.Folder):
    print(
      f'preparing {builder.layout.root} as a dataset in {builder.data_dir} (once, and again when its files change)',
      flush=True,
    )
  else:
    print(f'generating the built-in dataset {builder.name} in {builder.data_dir} (once, without network)', flush=True)
  with errors.disk_errors(builder.data_dir, 'to prepare the data'), preparing(builder.data_dir):
    with contextlib.redirect_stdout(io.StringIO()):
      builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  for line in builder.notes() if isinstance(builder, folder.Folder) else ():
    print(line, flush=True)


def _writable(fn: Callable[[], Any]) -> Callable[[], Any]:
  """`fn`, but a data_dir it cannot write to (read-only, no permission) is a ConfigError saying so."""

  def call():
    try:
      return fn()
    except Exception as e:  # OSError, or TensorFlow's PermissionDeniedError (TFDS writes with it).
      if not isinstance(e, OSError) and type(e).__name__ != 'PermissionDeniedError':
        raise
      text = str(e)
      if getattr(e, 'errno', None) in (errno.EROFS, errno.EACCES, errno.EPERM) or 'Read-only file system' in text:
        where = getattr(e, 'filename', None) or text.splitlines()[0][:160]
        raise ConfigError(
          f'the data cannot be prepared: {where} cannot be written ({getattr(e, "strerror", None) or "read-only"}); '
          'give a writable data.data_dir, or one where the dataset is prepared already'
        ) from None
      raise

  return call


FEATURE_CLASSES = 'tensorflow_datasets.core.features.'  # The module TFDS's own feature classes live in.


def check_features(data_dir: str | None, name: str) -> None:
  """Refuses a prepared dataset whose features.json names a class outside TFDS's own features: TFDS imports the
  module it names to read the dataset, so a data_dir handed over could otherwise run code (a `payload.py` beside the
  working folder, or any installed module). Every features.json under the dataset's folder is read (as JSON)."""
  check_feature_files(
    os.path.join(os.path.expanduser(data_dir or os.path.join('~', 'tensorflow_datasets')), name.split('/')[0])
  )


def check_feature_files(root: str) -> None:
  """`check_features` of every features.json under the folder `root` (the grain backend's copy read with
  tfds.builder_from_directory, a built-in dataset's folder too)."""
  for path in glob.glob(os.path.join(glob.escape(root), '**', 'features.json'), recursive=True):
    names = _class_names(errors.read_json(path, "the prepared dataset's features"))
    foreign = [n for n in names if not (isinstance(n, str) and n.startswith(FEATURE_CLASSES))]
    check(
      not foreign,
      f'{errors.foreign(path)} names the feature class {errors.foreign(foreign[0] if foreign else "", 80)!r}, which '
      f'TFDS would import to read the data: only its own ({FEATURE_CLASSES}*) are read; rebuild the dataset',
    )


def _class_names(node: Any) -> list[Any]:
  """Every pythonClassName value in a features.json tree."""
  if isinstance(node, dict):
    own = [node['pythonClassName']] if 'pythonClassName' in node else []
    return own + [n for key, value in node.items() if key != 'pythonClassName' for n in _class_names(value)]
  if isinstance(node, list):
    return [n for value in node for n in _class_names(value)]
  return []
