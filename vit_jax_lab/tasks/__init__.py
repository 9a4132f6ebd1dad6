"""What a model is trained to do, by config name: inputs it needs, loss, metrics."""

from vit_jax_lab.config import ConfigError
from vit_jax_lab.tasks import classification, seq2seq

TASKS = {'classification': classification.Classification, 'seq2seq': seq2seq.Seq2Seq}


def get(name: str) -> type:
  if name not in TASKS:
    raise ConfigError(f'task.name={name!r} is not one of {", ".join(TASKS)}')
  return TASKS[name]


def build(task_config):
  return get(task_config.name)(**{k: v for k, v in task_config.items() if k != 'name'})
