"""What the commands share: the config they work from, and the settings of running one example at a time."""

import os

import jax
import ml_collections
from flax import nnx

from vit_jax_lab import checkpoints, config as config_lib, train, workdir as workdir_lib
from vit_jax_lab.errors import ConfigError, check


def config_of(workdir: str | None, spec: str | None, overrides: list[str]) -> ml_collections.ConfigDict:
  """The config of the run in `workdir` (init_from cleared: its own checkpoint holds the weights), or of the config
  file `spec` (whose --config.init_from names the weights), with the command line's --config.KEY=VALUE applied."""
  if (workdir is None) == (spec is None):
    raise ConfigError('give --workdir (a run) or --config (with --config.init_from=...), not both')
  if workdir is not None:
    config = workdir_lib.load_run(workdir)
    config.init_from = None
  else:
    config = config_lib.load(spec)
  config_lib.apply_overrides(config, overrides)
  return config


def one_device_one_example(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` set for one device and batches of one, so the trainer's checks pass for a command that runs the
  model on its own inputs."""
  config.mesh.data, config.mesh.fsdp, config.mesh.model = 1, 1, 1
  config.data.batch_size = config.data.eval_batch_size = 1
  config.data.shards, config.accum_steps = 1, 1
  return config


def params_of(s: train.Setup, workdir: str | None) -> nnx.State:
  """The parameters of `s`, placed as training places them: the run's in `workdir` (its newest checkpoint), or,
  without one, as the config starts them (with --config.init_from applied)."""
  params = train.init_state(s).params
  if workdir:
    params.replace_by_pure_dict(checkpoints.read_params(workdir))
    params = jax.device_put(params, s.state_shardings.params)
  return params


def load_model(s: train.Setup, workdir: str | None) -> nnx.Module:
  """The model of `s` with `params_of(s, workdir)`."""
  return nnx.merge(s.graphdef, params_of(s, workdir))


def check_new(path: str) -> None:
  """A command's --out must not exist: what is already saved there is never overwritten."""
  check(not os.path.exists(path), f'--out {path} exists: name a new folder (nothing is overwritten)')
