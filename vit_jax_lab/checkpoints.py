"""Train-state checkpoints with orbax (saved asynchronously, restored straight into their shardings),
and the flat .npz files of published checkpoints.

A damaged checkpoint (a truncated or missing file after a crash or a full disk) is never the end of a run:
the newest one that reads whole is restored and the damaged ones are moved to `checkpoints_damaged/`.
"""

import contextlib
import gc
import os
import shutil
import time
import warnings
import zipfile
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from vit_jax_lab import console, hub
from vit_jax_lab.errors import ConfigError, disk_errors


class Checkpointer:
  """`workdir/checkpoints/<step>/state`, the newest `keep` of them, one every `every` steps."""

  def __init__(self, workdir: str, *, every: int, keep: int):
    self.workdir, self.closed = workdir, False
    self.directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    with disk_errors(self.directory):
      self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
          save_interval_steps=every, max_to_keep=keep, create=True, enable_async_checkpointing=True
        ),
      )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def should_save(self, step: int) -> bool:
    return self.manager.should_save(step)

  def save(self, step: int, state: Any, *, force: bool = False) -> bool:
    """Saves when `step` is on the interval (or `force`); the write finishes in the background."""
    with disk_errors(self.directory):
      return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=force)

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores into the structure, dtypes and shardings of `abstract_state` (ShapeDtypeStructs)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return restored.state

  def read_whole(self, step: int, abstract_state: Any) -> tuple[Any, str | None]:
    """(state, None), or (None, the first line of why) when checkpoint `step` does not read whole."""
    # A failed restore leaves reads in flight on other threads that print dozens of tracebacks ("Event loop is
    # closed") as they die, and tasks that complain when collected: held back, as the failure is reported in one line.
    with console.held_stderr() as held:
      try:
        return self.restore(step, abstract_state), None
      except Exception as e:  # Whatever orbax or tensorstore raise for a bad file (a signal's stop is not one).
        failure = first_line(e)
      time.sleep(0.5)  # The reads still in flight end.
      with warnings.catch_warnings():  # Their tasks, kept alive by the exception's traceback until here, end now.
        warnings.filterwarnings('ignore', 'coroutine .* was never awaited', RuntimeWarning)
        gc.collect()
      held['replay'] = False
    return None, failure

  def restore_newest(self, abstract_state: Any, note: Callable[[str], None]) -> tuple[int, Any]:
    """(step, state) of the newest checkpoint that reads whole, or (0, None) when there is none. The damaged
    ones newer than it are moved to `<workdir>/checkpoints_damaged/` (kept, not deleted), each with a one-line
    `note`. When none reads, nothing is moved: that is a changed model, not damage, and a ConfigError."""
    failures = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      state, failure = self.read_whole(step, abstract_state)
      if _all_processes(failure is None):
        for damaged, reason in failures:
          note(f'checkpoint {damaged} does not read whole ({reason}); moved to {self._set_aside(damaged)}')
        return step, state
      failures.append((step, failure or 'on another process'))
    if failures:
      raise ConfigError(
        f'no checkpoint in {self.directory} fits this model (newest, {failures[0][0]}: {failures[0][1]}); if the '
        'code changed since, use a new --workdir'
      )
    return 0, None

  def _set_aside(self, step: int) -> str:
    target = os.path.join(self.workdir, 'checkpoints_damaged', f'{step}-{time.strftime("%Y%m%d-%H%M%S")}')
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices('damaged checkpoint moved')
    self.manager.reload()
    return target

  def close(self) -> None:
    """Waits for writes in flight; call before the process ends (again: nothing more happens)."""
    if self.closed:
      return
    self.closed = True
    with disk_errors(self.directory):
      self.manager.wait_until_finished()
      self.manager.close()


def _all_processes(ok: bool) -> bool:
  """Whether `ok` holds on every process (the same answer everywhere)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def first_line(error: BaseException) -> str:
  """`Type: the first line of the message` (cut to 160 characters), for one-line reports."""
  text = str(error).strip().split(' See full TensorStore details')[0]
  return f'{type(error).__name__}: {text.splitlines()[0][:160]}' if text else type(error).__name__


def abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def read_npz(path: str) -> dict[str, np.ndarray]:
  """A flat .npz of arrays; never unpickles. A file that is not one is a ConfigError naming it."""
  with _npz(path) as f:
    return {k: f[k] for k in f.files}


def check_init_from(path: str, accepted: tuple[str, ...] | None = None) -> None:
  """Checks, without reading the weights, that `path` is an .npz archive, a hub folder (config.json +
  model.safetensors) of a layout in `accepted` (a model's PRETRAINED; None: any) or holds one of our checkpoints:
  a mistake is reported before the run writes anything into its workdir."""
  if path.endswith('.npz'):
    with _npz(path):
      pass
  elif hub.is_folder(path) or path.endswith(hub.PICKLED):
    hub.check(path, accepted)
  else:
    _checkpoint_dir(path)


def read_init_from(path: str) -> Any:
  """The weights `init_from` names, for a model's load_pretrained: a release .npz's flat dict, a hub folder
  (hub.HubWeights, read lazily) or a run's parameters."""
  if path.endswith('.npz'):
    return read_npz(path)
  return hub.read(path) if hub.is_folder(path) else read_params(path)


@contextlib.contextmanager
def _npz(path: str) -> Iterator[Any]:
  """The open archive; a file that is not an .npz archive (empty, cut short, text, pickle) is a ConfigError."""
  try:
    with np.load(path, allow_pickle=False) as f:
      if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError('a single array, not an archive of named arrays')
      yield f
  except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
    reason = 'empty' if os.path.getsize(path) == 0 else str(e).splitlines()[0] if str(e) else type(e).__name__
    if 'pickled' in reason:
      reason = 'not an .npz archive'
    raise ConfigError(
      f'init_from={path!r} is not a readable .npz file ({reason}): give a released .npz checkpoint or a workdir'
    ) from None


def write_npz(path: str, flat: dict[str, np.ndarray]) -> None:
  """`flat` as an .npz at `path`, which must not exist: written beside it and linked into place whole, so a write
  cut short (a kill, a full disk) leaves nothing that looks complete, and of two writers one wins, the other is
  refused."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  partial = f'{path}.partial-{os.getpid()}'
  try:
    with open(partial, 'wb') as f:
      np.savez(f, **flat)
    try:
      os.link(partial, path)
    except FileExistsError:
      raise ConfigError(f'{path} was written by another process meanwhile; it is kept as that one wrote it') from None
  finally:
    if os.path.exists(partial):
      os.remove(partial)


def read_params(path: str) -> dict:
  """Parameters (a pure nested dict of numpy arrays) of one of our orbax checkpoints: the run's parameter
  average when it keeps one (config.ema_decay), as evaluation uses.

  `path` is a workdir (its newest checkpoint), its `checkpoints/` folder or one `checkpoints/<step>`.
  """
  directory, checkpointer = os.path.join(_checkpoint_dir(path), 'state'), ocp.StandardCheckpointer()
  target = None
  if jax.process_count() == 1:  # Onto one device, whatever devices wrote it (a GPU cluster's run, on a laptop).
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    metadata = checkpointer.metadata(directory).item_metadata
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)
  restored = checkpointer.restore(directory, target)
  return _pure(restored.get('ema') or restored['params'])


def _checkpoint_dir(path: str) -> str:
  """The `checkpoints/<step>` folder `path` names: itself, or the newest of a workdir or its checkpoints/."""
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, 'checkpoints')):
    path = os.path.join(path, 'checkpoints')
  if os.path.isdir(os.path.join(path, 'state')):
    return path
  steps = sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []
  if not steps:
    raise ConfigError(
      f'{path} holds no orbax checkpoint: give a workdir, its checkpoints/ folder or a '
      'checkpoints/<step> folder (or, for init_from, a .npz file)'
    )
  return os.path.join(path, str(steps[-1]))


def _pure(tree: Any) -> Any:
  """Orbax's view of an nnx.State -> plain nested dicts: {'value': x} leaves unwrapped, '0' keys -> 0."""
  if isinstance(tree, dict):
    if tree.keys() == {'value'}:
      return np.asarray(tree['value'])
    return {int(k) if k.isdigit() else k: _pure(v) for k, v in tree.items()}
  return np.asarray(tree)
