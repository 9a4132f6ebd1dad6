"""What the commands share: the config they work from, and the settings of running one example at a time."""

import ml_collections
from flax import nnx

from vit_jax_lab import checkpoints, config as config_lib, train, workdir as workdir_lib
from vit_jax_lab.errors import ConfigError


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


def load_model(s: train.Setup, workdir: str | None) -> nnx.Module:
  """The model of `s` with the weights of the run in `workdir` (its newest checkpoint), or, without one, as the
  config starts it (with --config.init_from applied)."""
  model = nnx.merge(s.graphdef, train.init_state(s).params)
  if workdir:
    state = nnx.state(model, nnx.Param)
    state.replace_by_pure_dict(checkpoints.read_params(workdir))
    nnx.update(model, state)
  return model
