"""The run directory: one run at a time (`lock`), and its record of the config (`config.json` written,
compared on resume, and read back).

A rerun in the same workdir resumes the run, so its config must be the one the checkpoints were trained
with, except for the keys in RESUMABLE_CHANGES, which change neither the model nor the results, and the
optimizer or schedule keys a user names in `resume_changes`.
"""

import contextlib
import json
import os
import socket
from typing import Any, Iterator

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from vit_jax_lab import config as config_lib, errors, hosts, models, tasks
from vit_jax_lab.errors import ConfigError, check

# Keys a resumed run may change: cadence, length, where data lives and how many processes read it, how devices are
# laid out and how a batch is split into micro-batches (none changes results), and the few-shot evaluation, which
# only reads the model, and the metric the last line ranks by. Entries ending in '.' cover a group.
RESUMABLE_CHANGES = (
  'total_steps',
  'log_every',
  'eval_every',
  'checkpoint_every',
  'keep',
  'data.data_dir',
  'data.workers',
  'accum_steps',
  'mesh.',
  'distributed.',
  'resume_changes',
  'eval.fewshot.',
  'task.headline',
)


@contextlib.contextmanager
def lock(workdir: str) -> Iterator[list[str]]:
  """Holds `<workdir>/lock` (the holder's host and pid) while a run uses `workdir`; yields notes for the user.

  A second run on the same workdir is refused in one line before it touches anything. A lock whose holder
  is gone (same host, no such process) is taken over with a note. A workdir this call created is removed
  again if the run never got to record its config (a rejected config leaves nothing behind).
  """
  check(workdir.strip() != '', '--workdir is empty: name a folder for the run (it is created if missing)')
  check(
    not os.path.exists(workdir) or os.path.isdir(workdir),
    f'--workdir {workdir} is a file, not a folder: name a folder for the run (it is created if missing)',
  )
  _check_layout(workdir)
  created = _first_missing(workdir)  # The outermost folder this call makes, if any: removed again if unused.
  path, notes, refused = os.path.join(workdir, 'lock'), [], None
  if jax.process_index() == 0:
    try:
      os.makedirs(workdir, exist_ok=True)
      notes = _acquire(path)
    except ConfigError as e:
      refused = e
    except OSError as e:  # Read-only, full, too long a name, under /proc: the path's problem, not the run's.
      refused = ConfigError(
        f'--workdir {errors.foreign(workdir)} cannot be written ({e.strerror}): name a folder that can'
      )
  if jax.process_count() > 1:  # Every process learns whether process 0 holds the lock.
    if not multihost_utils.broadcast_one_to_all(np.int32(refused is None)) and refused is None:
      refused = ConfigError(f'--workdir {workdir}: process 0 could not lock it (see its message)')
  if refused is not None:
    if jax.process_index() == 0:
      _remove_empty(workdir, created)
    raise refused
  try:
    yield notes
  finally:
    if jax.process_index() == 0:
      _release(path)
      if not os.path.exists(os.path.join(workdir, 'config.json')):
        _remove_empty(workdir, created)


def _first_missing(path: str) -> str | None:
  """The outermost folder of `path` that does not exist (None: `path` exists)."""
  path, missing = os.path.abspath(path), None
  while not os.path.lexists(path):
    missing, parent = path, os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return missing


def _remove_empty(path: str, top: str | None) -> None:
  """Removes the folders from `path` up to `top` that are empty (those a refused run made; nothing else)."""
  if top is None:
    return
  path = os.path.abspath(path)
  while len(path) >= len(top):
    if os.path.lexists(path):  # Not, where making it failed.
      try:
        os.rmdir(path)  # Only if empty.
      except OSError:
        return
    path = os.path.dirname(path)


# What a run keeps in its workdir, and whether each is a folder: anything else in its place (a metrics.jsonl folder,
# a checkpoints file) is refused before the run starts, not met as a traceback (or a hang) later.
LAYOUT = {'config.json': False, 'metrics.jsonl': False, 'lock': False, 'checkpoints': True, 'tensorboard': True}


def _check_layout(workdir: str) -> None:
  link = os.path.join(workdir, 'checkpoints')
  if os.path.islink(link):  # On another disk is fine; in another run's workdir it would continue that run's weights.
    target = os.path.realpath(link)
    other = os.path.dirname(target)
    check(
      other == os.path.realpath(workdir) or not os.path.isfile(os.path.join(other, 'config.json')),
      f'{link} links to {target}, the checkpoints of the run in {other}: a run keeps its own (remove the link, or '
      f'continue that run with --workdir {other})',
    )
  for name, folder in LAYOUT.items():
    path = os.path.join(workdir, name)
    check(
      not os.path.exists(path) or os.path.isdir(path) == folder,
      f'{path} is a {"file" if folder else "folder"} where the run keeps its {name} {"folder" if folder else "file"}: '
      'move it away (or use another --workdir)',
    )


def trained(workdir: str) -> bool:
  """Whether the run in `workdir` saved a checkpoint (a workdir without one holds no run to continue)."""
  directory = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(directory) and any(d.isdigit() for d in os.listdir(directory))


def release_lock(workdir: str) -> None:
  """Removes `<workdir>/lock` if this process holds it (a process that ends without leaving the `lock` block)."""
  _release(os.path.join(workdir, 'lock'))


def _holder() -> str:
  return f'{socket.gethostname()} {os.getpid()}'


def _acquire(path: str) -> list[str]:
  """Creates the lock file with its content in one step (a hard link of a written temporary file)."""
  temporary = f'{path}.{os.getpid()}'
  with open(temporary, 'w') as f:
    f.write(_holder())
  try:
    os.link(temporary, path)
    return []
  except FileExistsError:
    with open(path, errors='replace') as f:
      holder = f.read(4096).split()
    if not (len(holder) == 2 and holder[1].isdigit()):  # Never one of ours (it is written whole): taken over.
      os.replace(temporary, path)
      return [f'took over {path}, which named no host and process (it was not written by a run)']
    host, pid = holder[0], int(holder[1])
    if host != socket.gethostname() or hosts.alive(pid):
      raise ConfigError(
        f'--workdir {os.path.dirname(path)} is in use by process {pid} on {host}: wait for it or use another '
        f'--workdir (if that process is gone, delete {path})'
      ) from None
    os.replace(temporary, path)
    return [f'took over the lock of process {pid} on {host}, which is no longer running']
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(temporary)


def _release(path: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    with open(path) as f:
      mine = f.read() == _holder()
    if mine:
      os.remove(path)


def record_config(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  """Writes `config.json`; refuses a workdir whose run used a different config (but for RESUMABLE_CHANGES and
  the keys named in `resume_changes`). Returns notes on what a resumed run now does differently. A run that never
  saved a checkpoint holds nothing to continue: its config.json is replaced, with a note."""
  path = os.path.join(workdir, 'config.json')
  resolved, notes = config.to_dict(), []
  if os.path.exists(path) and not trained(workdir):
    try:
      new, old = _flatten(resolved), _flatten(from_resolved(_read_json(path)).to_dict())
      changed = sorted(k for k in new.keys() | old.keys() if new.get(k) != old.get(k))
    except ConfigError:  # Damaged, or of keys this code does not know: replaced all the same.
      changed = ['(unreadable)']
    if changed:
      shown = ', '.join(changed[:4]) + (f' and {len(changed) - 4} more' if len(changed) > 4 else '')
      notes.append(f'{path} was of a run that saved no checkpoint ({shown} differ): replaced by this config')
  elif os.path.exists(path):
    # Keys the code gained since the run started take their defaults, which keep the old behaviour: not changes.
    new, old = _flatten(resolved), _flatten(from_resolved(_read_json(path)).to_dict())
    allowed = tuple(k if '.' in k else f'{k}.' for k in config_lib.resume_changes(config))
    changed = sorted(k for k in new.keys() | old.keys() if new.get(k) != old.get(k))
    refused = [k for k in changed if not k.startswith(RESUMABLE_CHANGES + allowed)]
    check(
      not refused,
      f'workdir {workdir} holds a run with a different config ({", ".join(refused)}); use a new --workdir, the '
      'same config to resume it, or name changed optim.*/schedule.* keys in --config.resume_changes',
    )
    notes += [
      f'{k} changed {old.get(k)} -> {new.get(k)} (resume_changes): from here on the run differs from the one it '
      'started as'
      for k in changed
      if k.startswith(allowed)
    ]
    if old.get('total_steps') != new['total_steps'] and new['schedule.decay'] in ('cosine', 'linear'):
      notes.append(
        f'total_steps changed {old.get("total_steps")} -> {new["total_steps"]}: the {new["schedule.decay"]} '
        f'learning-rate schedule now spans {new["total_steps"]} steps, so the steps from here on follow another '
        'schedule than the run started with'
      )
  if jax.process_count() > 1:  # Every process has read the old file before it is replaced.
    multihost_utils.sync_global_devices('config checked')
  if jax.process_index() == 0:
    _write_json(path, resolved)
  return notes


def _read_json(path: str) -> dict[str, Any]:
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConfigError(
      f'{path} is damaged ({e}): restore it from a copy, or delete it to continue the run with the config given now'
    ) from None


def _write_json(path: str, value: dict[str, Any]) -> None:
  """Writes a whole file or nothing: a crash mid-write leaves the previous file, a failed write (a full disk) no
  part of this one."""
  temporary = f'{path}.tmp'
  try:
    with open(temporary, 'w') as f:
      json.dump(value, f, indent=2, sort_keys=True, default=list)
    os.replace(temporary, path)
  finally:
    if os.path.lexists(temporary):
      os.remove(temporary)


def load_run(workdir: str) -> ml_collections.ConfigDict:
  """The config a run in `workdir` was trained with (its config.json)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise ConfigError(f'--workdir {workdir} has no config.json: give the workdir of a run')
  return from_resolved(_read_json(path))


def from_resolved(resolved: dict[str, Any]) -> ml_collections.ConfigDict:
  """A run's `config.json` back into a locked config; keys added to the code since take their defaults."""
  names = [
    resolved.get(part, {}).get('name') if isinstance(resolved, dict) and isinstance(resolved.get(part), dict) else None
    for part in ('model', 'task')
  ]
  check(
    all(isinstance(n, str) for n in names),
    "config.json is not a run's config (it names no model.name and task.name): restore it from a copy",
  )
  config = config_lib.base_config()
  config.model = models.config(names[0])
  config.task = tasks.config(names[1])
  _update(config, resolved, '')
  config.lock()
  return config


def _update(node: ml_collections.ConfigDict, values: dict[str, Any], prefix: str) -> None:
  for key, value in values.items():
    if key not in node:
      raise ConfigError(f'config.json has key {prefix}{key}, which this code does not know')
    if isinstance(node[key], ml_collections.ConfigDict):
      check(isinstance(value, dict), f'config.json has {prefix}{key} = {str(value)[:40]}, not a group of keys')
      _update(node[key], value, f'{prefix}{key}.')
    else:
      node[key] = tuple(value) if isinstance(node[key], tuple) else value


SAME_EVERYWHERE_BUT = ('distributed.process_id',)  # Keys the processes of one run set differently.


def agree_on_config(config: ml_collections.ConfigDict) -> None:
  """In a run of several processes, before anything is written: every process's resolved config, all-gathered,
  must equal every other's (but its process_id). Processes started with different configs would otherwise train
  apart until a collective's shapes disagreed, or one finished while the others waited."""
  if jax.process_count() == 1:
    return
  configs = _gathered_configs(_flatten(config.to_dict()))  # As record_config compares a resumed run's.
  keys = sorted({k for c in configs for k in c} - set(SAME_EVERYWHERE_BUT))
  differ = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]
  if differ:
    k = differ[0]
    values = ', '.join(f'process {i}: {json.dumps(c.get(k), default=str)[:40]}' for i, c in enumerate(configs))
    more = f' (and {len(differ) - 1} more: {", ".join(differ[1:4])})' if len(differ) > 1 else ''
    raise ConfigError(
      f'the {len(configs)} processes of this run have different configs: {k} differs ({values}){more}; start '
      'every process with the same config and overrides'
    )


def _gathered_configs(mine: dict) -> list[dict]:
  """Every process's `mine`, in process order (JSON bytes all-gathered, padded to the longest)."""
  data = np.frombuffer(json.dumps(mine, sort_keys=True, default=str).encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[: data.size] = data
  rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
  return [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, lengths)]


def _flatten(d: dict, prefix: str = '') -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out |= _flatten(v, f'{prefix}{k}.')
    else:
      out[f'{prefix}{k}'] = list(v) if isinstance(v, tuple) else v
  return out
