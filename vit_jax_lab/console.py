"""What a command prints: its own lines, not the libraries' start-up logging, and every way it ends in one line.

TensorFlow, absl, TFDS and orbax log to the terminal by default (C++ banners at import, progress bars,
INFO lines). Commands call `quiet_libraries()` first, and `command` runs them with file descriptor 2 filtered
(`library_lines_dropped`); VIT_JAX_LAB_VERBOSE=1 in the environment keeps them.
"""

import argparse
import ast
import contextlib
import ctypes
import functools
import glob
import importlib
import importlib.abc
import importlib.util
import io
import logging
import os
import re
import select
import sys
import tempfile
import textwrap
import threading
import traceback
import warnings
from typing import Any, Callable, Iterator

from absl import logging as absl_logging

from vit_jax_lab import errors

VERBOSE = os.environ.get('VIT_JAX_LAB_VERBOSE', '') not in ('', '0')


@contextlib.contextmanager
def held_stderr() -> Iterator[dict]:
  """Holds back what is written to file descriptor 2 in the block (C++ libraries write there directly, past
  Python's sys.stderr) and to sys.stderr (which a notebook or a test's capture points elsewhere), and writes it out
  at the end unless the block sets held['replay'] = False; held['text'] has it after the block."""
  held: dict = {'replay': True}
  python_stderr = sys.stderr
  python_stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as buffer:
    os.dup2(buffer.fileno(), 2)
    # Line-buffered into the same file as descriptor 2, so the two keep their order.
    sys.stderr = open(buffer.fileno(), 'w', buffering=1, closefd=False, errors='backslashreplace')
    try:
      yield held
    finally:
      held_stream, sys.stderr = sys.stderr, python_stderr
      held_stream.close()
      os.dup2(saved, 2)
      os.close(saved)
      buffer.seek(0)
      held['text'] = buffer.read()
      if held['replay']:
        python_stderr.write(held['text'].decode(errors='replace'))
        python_stderr.flush()


_FD2 = threading.Lock()  # One capture of file descriptor 2 at a time; `say` waits for it.
# How the image libraries' own lines begin (libjpeg's warnings and errors, libpng's): what a decode prints on the
# terminal past Python, e.g. "Premature end of JPEG data", "Improper call to JPEG library in state 201".
IMAGE_LIBRARY_LINES = re.compile(
  r'(Premature end of JPEG|Corrupt JPEG|Improper call to JPEG|Invalid JPEG|Not a JPEG|Bogus |Unsupported (JPEG|marker)'
  r'|Warning: unknown JFIF|JPEG datastream|libpng (warning|error))'
)


@contextlib.contextmanager
def captured_fd2() -> Iterator[list[str]]:
  """The lines written to file descriptor 2 in the block (a C library's, which bypass sys.stderr), kept off the
  terminal and given in the list after the block. Captures are one at a time, and `say` waits for them, so a
  thread's capture holds only what the block's own call printed (and any other C library line of that moment)."""
  lines: list[str] = []
  with _FD2, tempfile.TemporaryFile() as buffer:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(buffer.fileno(), 2)
    try:
      yield lines
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      buffer.seek(0)
      lines += [line for line in buffer.read().decode(errors='replace').splitlines() if line.strip()]


def say(text: str) -> None:
  """A line on stderr that no capture of file descriptor 2 can take."""
  with _FD2:
    print(text, file=sys.stderr, flush=True)


class _WithoutDeadLoopTracebacks(io.TextIOBase):
  """sys.stderr without the tracebacks of 'RuntimeError: Event loop is closed': after a failed checkpoint write
  orbax's abandoned asynchronous writes print dozens of them from their threads; the failure itself is
  reported in one line. Each thread's lines are followed apart: the threads print their tracebacks at once, and
  interleaved, a traceback's lines escaped the filter (a full disk's run printed 16 of them)."""

  def __init__(self, stream: io.TextIOBase):
    self.stream, self.pending, self.blocks, self.lock = stream, {}, {}, threading.Lock()

  def write(self, text: str) -> int:
    thread = threading.get_ident()
    with self.lock:
      *lines, self.pending[thread] = (self.pending.get(thread, '') + text).split('\n')
      for line in lines:
        self._line(thread, line + '\n')
    return len(text)

  def _line(self, thread: int, line: str) -> None:
    block = self.blocks.get(thread)
    if line.startswith('Traceback (most recent call last):'):
      self.blocks[thread] = [line]
    elif block is None:
      self.stream.write(line)
    elif line[:1].isspace():
      block.append(line)
    else:  # The exception line ends the traceback.
      del self.blocks[thread]
      if 'Event loop is closed' not in line:
        self.stream.write(''.join(block + [line]))

  def flush(self) -> None:
    self.stream.flush()

  def fileno(self) -> int:
    return self.stream.fileno()


def _in_orbax(filename: str) -> bool:
  return f'{os.sep}orbax{os.sep}' in filename


def _unraisable_unless_abandoned_read(unraisable) -> None:
  """sys.unraisablehook that drops orbax's abandoned reads (coroutines collected after a failed restore, which
  is reported in one line) and reports everything else as Python does."""
  code = getattr(unraisable.object, 'cr_code', None)
  if code is not None and _in_orbax(code.co_filename):
    return
  sys.__unraisablehook__(unraisable)


def _unless_abandoned_read(record: logging.LogRecord) -> bool:
  """A filter for asyncio's logger: drops 'exception was never retrieved' for a failure raised in orbax (the
  abandoned reads' futures, collected after the failed restore is reported)."""
  error = record.exc_info[1] if record.exc_info else None
  while error is not None:
    frames = traceback.extract_tb(error.__traceback__)
    if any(_in_orbax(frame.filename) for frame in frames):
      return False
    error = error.__cause__ or error.__context__
  return True


# What TensorFlow's C++ libraries print on file descriptor 2 before absl's log is set up, so whatever
# TF_CPP_MIN_LOG_LEVEL says, on CPUs where it turns oneDNN on (as they load, or at their first op, as a CPU has it):
# absl's notice, then its INFO and WARNING lines (oneDNN's, the CPU feature guard's, any other C++ file's) and the
# second line of the feature guard's banner. Errors (E, F) are kept.
TENSORFLOW_START_UP_LINES = re.compile(
  r'(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR'
  r'|[IW]\d{4} [\d:.]+ +\d+ [\w./-]+:\d+\]'
  r'|To enable the following instructions: .* in other operations, rebuild TensorFlow)'
)


@contextlib.contextmanager
def library_lines_dropped() -> Iterator[None]:
  """A command's whole run with file descriptor 2 read by a thread that drops TENSORFLOW_START_UP_LINES and passes
  every other line on: whenever a CPU's TensorFlow writes them (as it loads, at its first op, when tf.data or a
  dataset's generation first runs its kernels), none comes before or among the command's own lines. At the end fd 2
  is the terminal again and everything read is written out. VIT_JAX_LAB_VERBOSE=1 keeps them."""
  with _lines_dropped(2, sys.stderr, _start_up_line):
    yield


GLOO_LINES = re.compile(r'\[Gloo\] Rank \d+ is connected to \d+ peer ranks')


@contextlib.contextmanager
def gloo_lines_dropped() -> Iterator[None]:
  """A multi-process run with file descriptor 1 read by a thread that drops Gloo's connection lines ("[Gloo] Rank 0
  is connected to 1 peer ranks...", printed by its C++ on stdout at each new communicator's first collective) and
  passes every other line on, as library_lines_dropped does for fd 2."""
  with _lines_dropped(1, sys.stdout, lambda line: bool(GLOO_LINES.match(line.decode(errors='replace')))):
    yield


@contextlib.contextmanager
def _lines_dropped(fd: int, stream, drop: Callable[[bytes], bool]) -> Iterator[None]:
  """File descriptor `fd` read by a thread that passes on every line but those `drop` says, until the block ends."""
  try:
    stream.flush()
    terminal = os.dup(fd)
  except (OSError, ValueError):  # Nothing to filter.
    terminal = None
  if VERBOSE or terminal is None:
    yield
    return
  read, write = os.pipe()
  os.dup2(write, fd)
  os.close(write)
  done = threading.Event()
  forwarding = threading.Thread(target=_forward, args=(read, terminal, done, drop), daemon=True)
  forwarding.start()

  def finish() -> None:
    try:
      stream.flush()
      _flush_c_stdio()  # A C library's buffered lines go through the filter, not out at exit.
    finally:
      os.dup2(terminal, fd)
      done.set()
      forwarding.join()
      os.close(read)
      os.close(terminal)

  _FILTERS.append(finish)
  try:
    yield
  finally:
    if finish in _FILTERS:
      _FILTERS.remove(finish)
      finish()


def _flush_c_stdio() -> None:
  try:
    ctypes.CDLL(None).fflush(None)
  except (OSError, AttributeError):  # No C library to ask (not a POSIX system).
    pass


_FILTERS: list[Callable[[], None]] = []  # The running filters' ends, for `terminal_again`.


def terminal_again() -> None:
  """Ends the running filters now, everything read written out: before os._exit, which no `finally` outlives."""
  while _FILTERS:
    _FILTERS.pop()()


def _forward(read: int, terminal: int, done: threading.Event, drop: Callable[[bytes], bool]) -> None:
  """Lines from `read` to `terminal`, less those `drop` says, until `done` and nothing is left to read (a copy of
  the pipe's end a library kept cannot hold it open)."""
  pending = b''
  while True:
    stopping = done.is_set()  # Seen before the look: all that was written before it was set is read after.
    readable, _, _ = select.select([read], [], [], 0 if stopping else 0.05)
    if not readable:
      if stopping:
        break
      continue
    chunk = os.read(read, 1 << 16)
    if not chunk:  # Every writer gone.
      break
    *lines, pending = (pending + chunk).split(b'\n')
    kept = b''.join(line + b'\n' for line in lines if not drop(line))
    if kept:
      os.write(terminal, kept)
  if pending and not drop(pending):
    os.write(terminal, pending)


def _start_up_line(line: bytes) -> bool:
  return bool(TENSORFLOW_START_UP_LINES.match(line.decode(errors='replace')))


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` as Python would and loads it through library_lines_dropped: its start-up lines are dropped,
  any other line it prints passed on. Wherever code that called quiet_libraries() first imports it (within a
  command, whose run is filtered already, it adds nothing), and only if it does."""

  finding = False  # While it asks the other finders for the real spec.

  def find_spec(self, name, path, target=None):
    if name != 'tensorflow' or self.finding:
      return None
    self.finding = True  # A spec may be asked for without an import (TFDS asks whether TensorFlow is installed).
    try:
      spec = importlib.util.find_spec(name)
    finally:
      self.finding = False
    if spec is None or spec.loader is None:
      return spec
    load = spec.loader.exec_module

    def exec_module(module):
      if self in sys.meta_path:  # Loaded once: the finder's work is done.
        sys.meta_path.remove(self)
      with library_lines_dropped():
        load(module)

    spec.loader.exec_module = exec_module
    return spec


class _Deferred:
  """A module's stand-in that imports it at the first use of one of its attributes."""

  def __init__(self, name: str):
    self._name, self._module = name, None

  def __getattr__(self, attr: str):
    if self._module is None:
      self._module = importlib.import_module(self._name)
    return getattr(self._module, attr)


def lazy(name: str) -> Any:
  """The module `name`, imported at the first use of one of its attributes: the commands' TensorFlow and the modules
  that load it (5.4 s, `python -X importtime`), which their --help and argument mistakes need not wait for. The one
  place a command imports something late."""
  return sys.modules.get(name) or _Deferred(name)


def quiet_libraries() -> None:
  """Silences the libraries' logging unless VIT_JAX_LAB_VERBOSE: their start-up banners, progress bars and log
  lines (absl's, up to ERROR: orbax logs a failed write before it raises it, and we report it in one line)."""
  if VERBOSE:
    return
  # TensorFlow is not imported here: a command that reads no dataset never loads it (tools.bench --synthetic), so
  # its quieting waits in the environment, in the import system and in Python's logging: its C++ log level, the
  # start-up lines it prints regardless where oneDNN is on (_QuietTensorFlowImport), its Python logger (AutoGraph's
  # "could not transform" lines). TFDS's progress bars: data/pipeline.py.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  if 'tensorflow' not in sys.modules and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietTensorFlowImport())
  logging.getLogger('tensorflow').setLevel(logging.ERROR)
  absl_logging.set_verbosity(absl_logging.FATAL)
  if not isinstance(sys.stderr, _WithoutDeadLoopTracebacks):
    sys.stderr = _WithoutDeadLoopTracebacks(sys.stderr)
  sys.unraisablehook = _unraisable_unless_abandoned_read
  # The same abandoned reads, collected later than the failed restore's gc.collect (a loaded machine, a trace),
  # warn that they were never awaited or that their futures' exceptions were never retrieved.
  warnings.filterwarnings('ignore', "coroutine '_read_array_index_and_device_put' was never awaited", RuntimeWarning)
  logging.getLogger('asyncio').addFilter(_unless_abandoned_read)


class Parser(argparse.ArgumentParser):
  """argparse for the commands: a mistake on the command line (an unknown option, a missing argument, a value not
  among the choices) is one `error:` line naming --help (exit status 2, through `command`), not its usage block."""

  def error(self, message: str):
    raise errors.ConfigError(f'{message}: see {self.prog} --help')


def command(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
  """Decorates a command's `main(argv)`: a ConfigError becomes one line `error: ...` on stderr and exit status 2;
  a stopped run one line and its own status (errors.Stopped)."""

  @functools.wraps(main)
  def run(argv: list[str]) -> int:
    with library_lines_dropped():
      try:
        return main(argv)
      except errors.ConfigError as e:
        print(f'error: {e}', file=sys.stderr)
        return e.exit_status
      except errors.Stopped as e:
        print(e if isinstance(e, errors.Preempted) else f'error: {e}', file=sys.stderr)
        return e.exit_status

  return run


def config_argument(doc: str, path: str) -> str:
  """What a config file's `:ARG` takes, from its docstring: the form its 'Argument:' line gives (e.g.
  'SPLIT[,beam][,smoke]'), else the arguments its example commands use, else ''."""
  found = re.search(r'^Argument:\s*(.+?)(?:[.:](?:\s|$)|$)', doc, re.MULTILINE)
  if found:
    words = found.group(1).split()
    # The form ends where prose starts: "[smoke] makes it tiny" is the form "[smoke]".
    cut = next((i for i, w in enumerate(words) if i and re.fullmatch(r'[a-z]{3,}', w)), len(words))
    return ' '.join(words[:cut])
  used = dict.fromkeys(re.findall(re.escape(path) + r':(\S+)', doc))
  return '[' + '|'.join(used) + ']' if used else ''


def _sentences(text: str, count: int) -> str:
  """The first `count` sentences of a paragraph, on one line."""
  parts = re.split(r'(?<=[.!?])\s+(?=[A-Z`(])', ' '.join(text.split()))
  return ' '.join(parts[:count])


def configs_overview(root: str) -> str:
  """The config files under root/configs: each one's `:ARG` form, the first sentence of its docstring and what its
  argument chooses (its 'Argument:' paragraph, first sentences)."""
  blocks = []
  for path in sorted(glob.glob(os.path.join(root, 'configs', '*', '*.py'))):
    with open(path) as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ''
    rel = os.path.relpath(path, root)
    argument = config_argument(doc, rel)
    paragraphs = doc.split('\n\n')
    lines = [rel + (f':{argument}' if argument else ''), '    ' + _sentences(paragraphs[0], 1)]
    for paragraph in paragraphs:
      if paragraph.startswith(('Argument:', 'ARG:')):
        lines.append('    ' + textwrap.shorten(_sentences(paragraph, 2), 240, placeholder=' ... (its docstring)'))
    blocks.append('\n'.join(textwrap.fill(line, 118, subsequent_indent='    ') for line in lines))
  return '\n'.join(blocks)
