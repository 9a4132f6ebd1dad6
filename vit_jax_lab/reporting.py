"""What a run tells its user: metrics.jsonl, TensorBoard, the console line, the parameter overview."""

import collections
import contextlib
import glob
import json
import os
import socket
import time
from typing import Any, Mapping

import jax
import jax.monitoring
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from vit_jax_lab import tfrecord


class JsonlWriter:
  """`metrics.jsonl`: one JSON object per written step, e.g. {"step": 100, "train/loss": 0.41}."""

  def __init__(self, path: str):
    self.path = path

  def truncate_after(self, step: int) -> None:
    """Drops lines past `step`, written by a run that stopped before its next checkpoint, and a last line cut
    short by a crash."""
    if not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = [line for line in f if _step(line) is not None and _step(line) <= step]
    with open(self.path, 'w') as f:
      f.writelines(lines)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    with open(self.path, 'a') as f:
      f.write(json.dumps({'step': int(step), **{k: float(v) for k, v in scalars.items()}}) + '\n')

  def close(self) -> None:
    pass


def _step(line: str) -> int | None:
  """The step of a metrics.jsonl line; None for a partial one."""
  try:
    return json.loads(line)['step'] if line.endswith('\n') else None
  except (json.JSONDecodeError, KeyError, TypeError):
    return None


class EventWriter:
  """TensorBoard's event file, written with the `tensorboard` package's protos and record format alone (no
  TensorFlow, which a run on the grain backend never imports): a scalar is a `simple_value`."""

  def __init__(self, directory: str):
    os.makedirs(directory, exist_ok=True)
    name = f'events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}'
    self.records = RecordWriter(open(os.path.join(directory, name), 'ab'))
    self._write(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))

  def _write(self, event: event_pb2.Event) -> None:
    self.records.write(event.SerializeToString())
    self.records.flush()  # Few and small; a killed run keeps what it logged.

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
    self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)))

  def close(self) -> None:
    self.records.close()


def truncate_events(directory: str, step: int) -> None:
  """Drops the TensorBoard events past `step` from the event files in `directory` (TensorBoard would show the
  steps logged after the last checkpoint twice once the resumed run logs them again)."""
  for path in glob.glob(os.path.join(glob.escape(directory), 'events.out.tfevents.*')):
    kept = []
    with contextlib.suppress(tfrecord.CutShort):  # A record cut short by a crash ends the file.
      for record in tfrecord.records(path):  # Those before the cut are kept.
        if event_pb2.Event.FromString(record).step <= step:
          kept.append(record)
    with open(path + '.tmp', 'wb') as f:
      records = RecordWriter(f)
      for record in kept:
        records.write(record)
    os.replace(path + '.tmp', path)


class Writers(list):
  """Writes to each of its writers."""

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for w in self:
      w.write_scalars(step, scalars)

  def close(self) -> None:
    for w in self:
      w.close()


def writer(workdir: str, start_step: int) -> Writers:
  """JSONL and TensorBoard on process 0; nothing on the others."""
  if jax.process_index() != 0:
    return Writers()
  jsonl = JsonlWriter(os.path.join(workdir, 'metrics.jsonl'))
  jsonl.truncate_after(start_step)
  truncate_events(os.path.join(workdir, 'tensorboard'), start_step)
  return Writers([jsonl, EventWriter(os.path.join(workdir, 'tensorboard'))])


def parameter_overview(params, depth: int = 2) -> str:
  """Parameter count per module of an `nnx.State`, `depth` levels deep, and the total."""
  counts = collections.Counter()
  for path, x in jax.tree_util.tree_leaves_with_path(params.to_pure_dict()):
    names = [str(k.key) for k in path]
    counts['.'.join(names[:depth])] += int(np.prod(x.shape))
  width = max(map(len, counts))
  rows = [f'  {name:<{width}}  {n:>13,}' for name, n in counts.items()]
  return '\n'.join(['parameters:', *rows, f'  {"total":<{width}}  {sum(counts.values()):>13,}'])


# What JAX reports of its compilations (tracing, lowering, compiling or reading the compilation cache): time the
# console line's steps/s and ETA leave out, as a later step does not pay it again.
COMPILE_EVENTS = (
  '/jax/core/compile/jaxpr_trace_duration',
  '/jax/core/compile/jaxpr_to_mlir_module_duration',
  '/jax/core/compile/backend_compile_duration',
)
_compiling = {'seconds': 0.0, 'listening': False}


def _count_compilation(event: str, seconds: float, **kwargs) -> None:
  del kwargs
  if event in COMPILE_EVENTS:
    _compiling['seconds'] += seconds


def compile_seconds() -> float:
  """Seconds this process has spent compiling since the first Progress (JAX's monitoring events)."""
  if not _compiling['listening']:
    jax.monitoring.register_event_duration_secs_listener(_count_compilation)
    _compiling['listening'] = True
  return _compiling['seconds']


class Progress:
  """The console line: step, loss, steps/s, examples/s and the time left; compilation is not counted, so the first
  line's ETA is that of the steps to come."""

  def __init__(self, total_steps: int, batch_size: int | None, start_step: int):
    self.total, self.batch = total_steps, batch_size  # None: batches vary in size (a token budget).
    self.last_step, self.last_time, self.last_compiling = start_step, time.perf_counter(), compile_seconds()

  def rate(self, step: int) -> float:
    """Steps per second since the previous call, time spent compiling left out."""
    now, compiling = time.perf_counter(), compile_seconds()
    seconds = now - self.last_time - (compiling - self.last_compiling)
    rate = (step - self.last_step) / max(seconds, 1e-9)
    self.last_step, self.last_time, self.last_compiling = step, now, compiling
    return rate

  def line(self, step: int, loss: float, steps_per_sec: float) -> str:
    eta = (self.total - step) / max(steps_per_sec, 1e-9)
    examples = '' if self.batch is None else f'{steps_per_sec * self.batch:.0f} examples/s  '
    return (
      f'step {step:>{len(str(self.total))}}/{self.total}  loss {loss:.4f}  {steps_per_sec:.2f} steps/s  '
      f'{examples}ETA {duration(eta)}'
    )


# The metric that ranks a run's evaluations, the first one its metrics have: higher is better but for the loss.
HEADLINE = ('eval/accuracy', 'eval/cider_d', 'eval/bleu', 'eval/exact_match', 'eval/auc', 'eval/ao', 'eval/loss')


def best_eval(metrics_path: str, prefer: str | None = None) -> str:
  """'best eval/accuracy 0.9322 at step 500' of the evaluations in a run's metrics.jsonl (the steps before a resume
  included); '' without one."""
  if not os.path.exists(metrics_path):
    return ''
  with open(metrics_path) as f:
    evals = [m for m in map(json.loads, f) if any(k in m for k in (prefer, *HEADLINE))]
  if not evals:
    return ''
  key = next(k for k in (prefer, *HEADLINE) if k is not None and any(k in m for m in evals))
  scored = [m for m in evals if key in m]
  best = (min if key == 'eval/loss' else max)(scored, key=lambda m: m[key])
  return f'best {key} {best[key]:.4f} at step {best["step"]}'


def duration(seconds: float) -> str:
  """'HH:MM:SS', with days in front past 24 hours ('3d 04:05:06')."""
  days, rest = divmod(int(seconds), 86_400)
  clock = time.strftime('%H:%M:%S', time.gmtime(rest))
  return f'{days:,}d {clock}' if days else clock
