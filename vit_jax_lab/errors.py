"""What ends a run early, each as one line: a user mistake (`ConfigError`, exit status 2) or a run stopped on
purpose with its work saved (`Stopped` and its kinds, each with its own exit status).

A leaf of the import graph: every module may raise these; this one imports nothing of ours.
"""

import _thread
import contextlib
import errno
import json
import os
import stat
import sys
import threading
from typing import Any, Callable, Iterator


class ConfigError(ValueError):
  """A user mistake in the config, the command line, a path or the data (printed as one line, exit status 2)."""

  exit_status = 2


class Stopped(BaseException):
  """The run stopped before total_steps and kept everything up to its newest checkpoint. A BaseException, as
  KeyboardInterrupt is: signal handlers raise it wherever the program is, and a library's `except Exception` (in an
  import, a retry loop) must not take a stop for its own error and carry on."""

  exit_status = 1


class Preempted(Stopped):
  """SIGTERM, SIGINT or SIGHUP: a checkpoint of the current step was saved (or, before the first step, there was
  nothing to save); the same command continues the run."""

  exit_status = 75  # EX_TEMPFAIL (sysexits.h): try again. Schedulers can requeue on it.


class Diverged(Stopped):
  """The loss or the gradient norm became non-finite; nothing from that step on was saved."""

  exit_status = 3


class DiskFull(Stopped):
  """No space left on the disk of the workdir or of data.data_dir (the message names the path); the checkpoints
  already written are intact."""

  exit_status = 74  # EX_IOERR (sysexits.h).


def stopped_before_training(signal_name: str) -> Preempted:
  """The stop of a run signalled during start-up: nothing of this run of the command was trained or saved."""
  return Preempted(
    f'stopped by {signal_name} during start-up, before the first step: nothing was trained; run the same command '
    'to start again'
  )


def stop_from_handler(sig: int, exception: BaseException) -> None:
  """Raises `exception` from the handler of signal `sig`. Where Python cannot raise it (a garbage-collection callback
  such as JAX's _xla_gc_callback, a `__del__`, a weakref callback: it would print 'Exception ignored' and the run
  would go on), sys.unraisablehook (_Redeliver) delivers the signal again 50 ms later instead, until it lands where
  the exception stops the command."""
  if not isinstance(sys.unraisablehook, _Redeliver):
    sys.unraisablehook = _Redeliver(sys.unraisablehook)
  exception.signal_number = sig
  raise exception


class _Redeliver:
  """sys.unraisablehook: an exception of `stop_from_handler` that Python had to ignore becomes its signal again, 50 ms
  later (sent at once, Python would handle it in the same place); any other goes to the hook before."""

  def __init__(self, previous: Callable[[Any], None]):
    self.previous = previous

  def __call__(self, unraisable: Any) -> None:
    sig = getattr(unraisable.exc_value, 'signal_number', None)
    if sig is None:
      self.previous(unraisable)
    else:
      threading.Timer(0.05, _thread.interrupt_main, (sig,)).start()


SECOND_INTERRUPT_STATUS = 130  # 128 + SIGINT, what a shell reports for a process ended by Ctrl-C.


def check(condition: bool, message: str) -> None:
  """Raises ConfigError(message) unless `condition`."""
  if not condition:
    raise ConfigError(message)


def positive_ints(where: str, values: dict[str, Any]) -> None:
  """Refuses the first of a file's `values` (its key -> value) that is not a positive integer, naming the key as the
  file writes it: a size or count of 0 or below would otherwise surface later, under one of our names, or not at all."""
  for key, value in values.items():
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ConfigError(f'{where} has {key}={foreign(repr(value), 60)}; it must be a positive integer')


@contextlib.contextmanager
def disk_errors(path: str, then: str = 'to continue from the newest checkpoint') -> Iterator[None]:
  """Turns "no space left" from any layer (OSError, orbax or tensorstore's RESOURCE_EXHAUSTED) into DiskFull naming
  `path`, the disk that filled; `then`: what running the same command again does. The innermost names the path."""
  try:
    yield
  except DiskFull:
    raise
  except Exception as e:
    if no_space(e):
      if _out_of_inodes(path):
        raise DiskFull(
          f'no file entries (inodes) left at {path}: delete files there and run the same command again {then}'
        ) from None
      raise DiskFull(f'no space left at {path}: free space and run the same command again {then}') from None
    raise


def _out_of_inodes(path: str) -> bool:
  """Whether the disk of `path` (its nearest existing folder) has bytes left but no free inodes: ENOSPC says both."""
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  try:
    disk = os.statvfs(path)
  except OSError:
    return False
  return disk.f_files > 0 and disk.f_favail == 0 and disk.f_bavail > 0


# Why a disk refuses a write, as the libraries that write (numpy, safetensors' Rust, TensorFlow) word it.
_REFUSED = tuple(os.strerror(e) for e in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG))


@contextlib.contextmanager
def output_errors(path: str) -> Iterator[None]:
  """Writing the output `path` a user named (an export, a prediction file) failing for its disk's reasons (full,
  read-only, not permitted, a name too long) as one line naming it; the writer leaves no part of it behind."""
  with disk_errors(path, then='(nothing of this one was kept)'):
    try:
      yield
    except Exception as e:
      reason = next((r for r in _REFUSED if r in str(e) or r == getattr(e, 'strerror', None)), None)
      if isinstance(e, FileNotFoundError) and str(e.filename).startswith(os.path.splitext(path)[0]):
        reason = e.strerror  # The output itself (its folder refuses new files: /proc), not a file being read.
      if reason is None:
        raise
      raise ConfigError(f'{path} cannot be written ({reason}): name a place that can') from None


def write_output(out: str, write: Callable[[str], Any]) -> Any:
  """`write(path)` of the output file `out` a user named (a figure, an animation), whole or not at all: written
  beside it (with its extension, which picks the format) and renamed into place; a disk's refusal is one line."""
  stem, extension = os.path.splitext(out)
  partial = f'{stem}.partial-{os.getpid()}{extension}'
  try:
    with output_errors(out):
      result = write(partial)
      os.replace(partial, out)
    return result
  finally:
    if os.path.exists(partial):
      os.remove(partial)


def no_space(error: BaseException) -> bool:
  """Whether `error`, or an error it was raised from, says the disk is full."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    if 'No space left' in str(error) or 'RESOURCE_EXHAUSTED' in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


# Files handed over (hub and Marian folders, images to predict, prepared datasets) are read within these bounds, so
# that a wrong or hostile file is one line, not a hang or the host's memory (docs/reliability.md, hostile files).
JSON_LIMIT = 16 * 2**20  # Bytes of a JSON config, vocabulary or index (opus-mt's vocab.json: 1.7 MB).
IMAGE_LIMIT = 256 * 2**20  # Bytes of an image file.
IMAGE_PIXELS = 2**27  # Pixels of an image (134 M, 11,585 squared), read from its header before it is decoded.
IMAGE_ASPECT = 64  # Longer side over shorter: a 1 x 999,999 strip resized to a 224 shorter side is 50 G pixels.


def foreign(text: object, limit: int = 300) -> str:
  """A string from a file handed over, fit to print: control characters (a terminal's escape sequences) escaped,
  and cut to `limit` characters."""
  text = str(text)
  shown = ''.join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
  return shown + ('...' if len(text) > limit else '')


def regular_file(path: str, what: str, limit: int) -> None:
  """Refuses, in one line, a `path` that is not a regular file (a FIFO would block a read forever, /dev/zero never
  end it) or holds more than `limit` bytes."""
  try:
    info = os.stat(path)
  except OSError as e:
    raise ConfigError(f'{what} {foreign(path)} cannot be read ({e.strerror})') from None
  check(stat.S_ISREG(info.st_mode), f'{what} {foreign(path)} is not a regular file (a pipe or a device): give a file')
  check(
    info.st_size <= limit,
    f'{what} {foreign(path)} holds {info.st_size:,} bytes, more than such a file can ({limit:,}): is it the right '
    'file?',
  )


def read_json(path: str, what: str, kind: type = dict) -> Any:
  """The JSON value of `path`, read within JSON_LIMIT, and of type `kind`; anything else is one line."""
  regular_file(path, what, JSON_LIMIT)
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ConfigError(f'{what} {foreign(path)} is not JSON ({foreign(e, 80)})') from None
  except RecursionError:  # Lists or objects nested thousands deep: no file a library writes.
    raise ConfigError(f'{what} {foreign(path)} nests its JSON too deep to read: is it the right file?') from None
  check(
    isinstance(value, kind),
    f'{what} {foreign(path)} holds a JSON {type(value).__name__}, not {"an object" if kind is dict else kind.__name__}',
  )
  return value
