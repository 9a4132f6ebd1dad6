"""The run directory's record of its config: `config.json` written, compared on resume, and read back.

A rerun in the same workdir resumes the run, so its config must be the one the checkpoints were trained
with, except for the keys in RESUMABLE_CHANGES, which change neither the model nor the results.
"""

import json
import os
from typing import Any

import jax
import ml_collections
from jax.experimental import multihost_utils

from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.errors import ConfigError, check

# Keys a resumed run may change: cadence, length, where data lives, how devices are laid out and how a
# batch is split into micro-batches (neither changes results). Entries ending in '.' cover a group.
RESUMABLE_CHANGES = (
  'total_steps',
  'log_every',
  'eval_every',
  'checkpoint_every',
  'keep',
  'data.data_dir',
  'accum_steps',
  'mesh.',
  'distributed.',
)


def record_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes `config.json`; refuses a workdir whose earlier run used a different config."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, 'config.json')
  resolved = config.to_dict()
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    new, old = _flatten(resolved), _flatten(saved)
    changed = sorted(
      k for k in new.keys() | old.keys() if new.get(k) != old.get(k) and not k.startswith(RESUMABLE_CHANGES)
    )
    check(
      not changed,
      f'workdir {workdir} holds a run with a different config ({", ".join(changed)}); '
      'use a new --workdir, or the same config to resume it',
    )
  if jax.process_count() > 1:  # Every process has read the old file before it is replaced.
    multihost_utils.sync_global_devices('config checked')
  if jax.process_index() == 0:
    with open(path, 'w') as f:
      json.dump(resolved, f, indent=2, sort_keys=True, default=list)


def load_run(workdir: str) -> ml_collections.ConfigDict:
  """The config a run in `workdir` was trained with (its config.json)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise ConfigError(f'--workdir {workdir} has no config.json: give the workdir of a run')
  with open(path) as f:
    return from_resolved(json.load(f))


def from_resolved(resolved: dict[str, Any]) -> ml_collections.ConfigDict:
  """A run's `config.json` back into a locked config; keys added to the code since take their defaults."""
  config = config_lib.base_config()
  config.model = models.config(resolved['model']['name'])
  config.task = tasks.config(resolved['task']['name'])
  _update(config, resolved, '')
  config.lock()
  return config


def _update(node: ml_collections.ConfigDict, values: dict[str, Any], prefix: str) -> None:
  for key, value in values.items():
    if key not in node:
      raise ConfigError(f'config.json has key {prefix}{key}, which this code does not know')
    if isinstance(node[key], ml_collections.ConfigDict):
      _update(node[key], value, f'{prefix}{key}.')
    else:
      node[key] = tuple(value) if isinstance(node[key], tuple) else value


def _flatten(d: dict, prefix: str = '') -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out |= _flatten(v, f'{prefix}{k}.')
    else:
      out[f'{prefix}{k}'] = list(v) if isinstance(v, tuple) else v
  return out
