"""Train-state checkpoints with orbax (saved asynchronously, restored straight into their shardings),
and the flat .npz files of published checkpoints."""

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from vit_jax_lab.errors import ConfigError


class Checkpointer:
  """`workdir/checkpoints/<step>/state`, the newest `keep` of them, one every `every` steps."""

  def __init__(self, workdir: str, *, every: int, keep: int):
    self.manager = ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, 'checkpoints')),
      options=ocp.CheckpointManagerOptions(
        save_interval_steps=every, max_to_keep=keep, create=True, enable_async_checkpointing=True
      ),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, *, force: bool = False) -> bool:
    """Saves when `step` is on the interval (or `force`); the write finishes in the background."""
    return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=force)

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores into the structure, dtypes and shardings of `abstract_state` (ShapeDtypeStructs)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return restored.state

  def close(self) -> None:
    """Waits for writes in flight; call before the process ends."""
    self.manager.wait_until_finished()
    self.manager.close()


def abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def read_npz(path: str) -> dict[str, np.ndarray]:
  """A flat .npz of arrays; never unpickles."""
  with np.load(path, allow_pickle=False) as f:
    return {k: f[k] for k in f.files}


def write_npz(path: str, flat: dict[str, np.ndarray]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'wb') as f:
    np.savez(f, **flat)


def read_params(path: str) -> dict:
  """Parameters (a pure nested dict of numpy arrays) of one of our orbax checkpoints.

  `path` is a workdir (its newest checkpoint), its `checkpoints/` folder or one `checkpoints/<step>`.
  """
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, 'checkpoints')):
    path = os.path.join(path, 'checkpoints')
  if not os.path.isdir(os.path.join(path, 'state')):
    steps = sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []
    if not steps:
      raise ConfigError(
        f'{path} holds no orbax checkpoint: give a workdir, its checkpoints/ folder or a '
        'checkpoints/<step> folder (or, for init_from, a .npz file)'
      )
    path = os.path.join(path, str(steps[-1]))
  restored = ocp.StandardCheckpointer().restore(os.path.join(path, 'state'))
  return _pure(restored['params'])


def _pure(tree: Any) -> Any:
  """Orbax's view of an nnx.State -> plain nested dicts: {'value': x} leaves unwrapped, '0' keys -> 0."""
  if isinstance(tree, dict):
    if tree.keys() == {'value'}:
      return np.asarray(tree['value'])
    return {int(k) if k.isdigit() else k: _pure(v) for k, v in tree.items()}
  return np.asarray(tree)
