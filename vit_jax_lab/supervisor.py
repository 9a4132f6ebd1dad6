"""Each process of a multi-process run runs its training in a child and watches it, so that a lost peer ends every
process in one line with exit status 75, which schedulers retry.

When a process of the run dies, JAX's distributed service ends the others from a C++ thread (absl's fatal log, then
SIGABRT: about a hundred lines), which Python cannot catch: the coordinator's heartbeat check gives up on a silent
process after HEARTBEAT_S, and a process whose coordinator (process 0) is gone stops at its next call to it. The
parent sees the child end that way, reads from the child's last lines which process was lost, and says it.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

CHILD = 'VIT_JAX_LAB_SUPERVISED'  # Set in the child's environment: it trains, and ends when its parent is gone.
HEARTBEAT_S = 30  # A process silent this long is lost (JAX's default: 100 s).
CONNECT_S = 60  # Every process must have connected within this (JAX's default: 300 s).
SHUTDOWN_S = 60  # The processes' wait for each other at the end (JAX's default: 300 s).
LOST_STATUS = 75  # EX_TEMPFAIL, as for a stop by a signal: the same command resumes from the newest checkpoint.
WATCH_SECONDS = 0.5
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What JAX's distributed runtime (absl, gRPC) prints as it ends a process: kept from the terminal, where the
# parent's one line says it.
_RUNTIME_LINE = re.compile(rb'^([EFW]\d{4} \d\d:\d\d:\d\d|Additional GRPC error|:UNKNOWN:Error received)')
_CONTINUED = re.compile(rb'^(\*\*\* Check failure|    @ |RPC: |Additional GRPC|:UNKNOWN:|[\d,\s]*$|The tasks have)')
_GLOO = re.compile(rb'\[Gloo\]|peer ranks')
_TRACEBACK = b'Traceback (most recent call last):\n'
_FATAL = b'Terminating process because the JAX distributed service detected fatal errors'


def supervised() -> bool:
  """Whether this process is the child that trains (or a single-process run, which needs no parent)."""
  return os.environ.get(CHILD) == '1'


def end_with_parent() -> None:
  """A thread that ends this process once its parent is gone: a process killed outright (SIGKILL, the
  out-of-memory killer) runs no cleanup, and its children, adopted by init, would stay on the node."""
  parent = os.getppid()

  def watch() -> None:
    while os.getppid() == parent:
      time.sleep(WATCH_SECONDS)
    os._exit(1)

  threading.Thread(target=watch, daemon=True, name='end_with_parent').start()


def run(argv: list[str], workdir: str, process_id: int | None, num_processes: int | None) -> int:
  """This command again as a child (`main.cli` with `argv`), its stderr relayed but for the runtime's own lines;
  its exit status, or LOST_STATUS and one line when the distributed service ended it."""
  child = subprocess.Popen(
    [sys.executable, '-c', 'import main; main.cli()', *argv],
    env=os.environ
    | {CHILD: '1', 'PYTHONPATH': os.pathsep.join(filter(None, [_root(), os.environ.get('PYTHONPATH')]))}
    | {'PYTHONUNBUFFERED': '1'},  # Its lines pass through here as they come.
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    start_new_session=True,  # Ctrl-C reaches the parent alone, which passes it on once.
  )
  for sig in _FORWARDED:
    signal.signal(sig, lambda sig, frame: child.send_signal(sig))
  out = threading.Thread(target=_relay_stdout, args=(child.stdout,), daemon=True)
  out.start()
  block: list[bytes] = []  # The runtime's lines since its last one of ours: shown unless they end the process.
  for line in iter(child.stderr.readline, b''):
    # A traceback is held to the end as well: a lost peer can fail a call in flight (an orbax barrier) first.
    if _RUNTIME_LINE.match(line) or block and (_CONTINUED.match(line) or _TRACEBACK in block) or line == _TRACEBACK:
      block.append(line)
      continue
    if block and _FATAL not in b''.join(block):
      os.write(2, b''.join(block))
      block = []
    os.write(2, line)
  status = child.wait()
  out.join()
  said, code = ending(status, b''.join(block), workdir, process_id, num_processes)
  os.write(2, said)
  return code


def ending(
  status: int, text: bytes, workdir: str, process_id: int | None, num_processes: int | None
) -> tuple[bytes, int]:
  """(what to print, the exit status) once the child ended with `status` and the runtime's held `text`: the
  runtime's fatal abort, or an abort with nothing said (seen once in a dozen kills of a peer mid-step: a signal
  with no log), is a lost process, one line and LOST_STATUS so that a scheduler reruns; anything else as it was."""
  if status != -signal.SIGABRT or (_FATAL not in text and text.strip()):
    return text, status if status >= 0 else 128 - status
  return f'error: {_lost(text, process_id, num_processes)}; {_newest_checkpoint(workdir)}\n'.encode(), LOST_STATUS


def _relay_stdout(stream) -> None:
  """The child's stdout but Gloo's connection lines, which a child ended by the runtime leaves (its own filter,
  console.gloo_lines_dropped, has no time to drop them)."""
  for line in iter(stream.readline, b''):
    if not _GLOO.search(line):
      os.write(1, line)


def _root() -> str:
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lost(text: bytes, process_id: int | None, num_processes: int | None) -> str:
  """Which process the runtime's lines say was lost, as a sentence."""
  of = f' of {num_processes}' if num_processes else ''
  me = f'process {process_id}' if process_id is not None else 'this process'
  silent = re.search(rb'stopped sending heartbeats\):\s*([\d,\s]+)', text)
  if silent:
    who = ', '.join(n.decode() for n in re.findall(rb'\d+', silent.group(1)))
    return f'process {who}{of} stopped answering (no heartbeat for {HEARTBEAT_S} s), so {me} stopped too'
  if b'leader task was preempted/died' in text or b'Socket closed' in text:
    return f'process 0{of}, the coordinator, is gone, so {me} stopped too'
  if b'DEADLINE_EXCEEDED' in text or b'Barrier timed out' in text:
    return f'not every process{of} connected within {CONNECT_S} s, so {me} stopped'
  return f"JAX's distributed service lost a process{of}, so {me} stopped too"


def _newest_checkpoint(workdir: str) -> str:
  """Where a rerun of all the processes continues from."""
  try:
    steps = [int(name) for name in os.listdir(os.path.join(workdir, 'checkpoints')) if name.isdigit()]
  except OSError:
    steps = []
  where = f'from the checkpoint of step {max(steps)}' if steps else 'from the start (no checkpoint yet)'
  return f'start every process again with the same command to continue {where}'
