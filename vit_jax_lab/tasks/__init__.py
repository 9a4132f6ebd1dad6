"""What a model is trained to do, by config name: inputs it needs, loss, metrics (the contract: base.Task)."""

from typing import Any

import ml_collections

from vit_jax_lab import signatures
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tasks import classification, seq2seq, tracking
from vit_jax_lab.tasks.base import Task

TASKS: dict[str, type[Task]] = {
  'classification': classification.Classification,
  'seq2seq': seq2seq.Seq2Seq,
  'tracking': tracking.Tracking,
}


def get(name: str) -> type[Task]:
  if name not in TASKS:
    raise ConfigError(f'task.name={name!r} is not one of {", ".join(TASKS)}')
  return TASKS[name]


def config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
  """`config.task`: the task's constructor keywords and defaults, with `overrides` applied."""
  return signatures.constructor_config(get(name), name, overrides)


def build(task_config: ml_collections.ConfigDict) -> Task:
  task = get(task_config.name)
  signatures.check_keys('task', task_config, task)
  return task(**{k: v for k, v in task_config.items() if k != 'name'})
