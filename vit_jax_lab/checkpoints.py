"""Train-state checkpoints with orbax: saved asynchronously, restored straight into their shardings."""

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """`workdir/checkpoints/<step>/state`, the newest `keep` of them, one every `every` steps."""

  def __init__(self, workdir: str, *, every: int, keep: int):
    self.manager = ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, 'checkpoints')),
        options=ocp.CheckpointManagerOptions(save_interval_steps=every, max_to_keep=keep, create=True,
                                             enable_async_checkpointing=True))

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
