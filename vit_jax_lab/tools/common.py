"""What the commands share: the config they work from, and the settings of running one example at a time."""

import os

import jax
import ml_collections
import numpy as np
from flax import nnx

from vit_jax_lab import checkpoints, config as config_lib, models, train, workdir as workdir_lib
from vit_jax_lab.errors import ConfigError, check
from vit_jax_lab.models import layers


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
  """The parameters a command evaluates, placed as training places them: the newest checkpoint of the run in
  `workdir` (its parameter average, with ema_decay), or, without one, those of --config.init_from: one of our runs
  whose parameters fit the model exactly is taken as it is, other weights are loaded as training loads them (the
  family's load_pretrained); without init_from, the config's initialisation."""
  source = workdir or s.config.init_from
  if source is not None and (workdir is not None or not source.endswith('.npz')):
    read = _read_checkpoint(source)
    mismatch = layers.first_mismatch(read, s.abstract_state.params.to_pure_dict())
    if mismatch is None:
      params = jax.tree.map(lambda x: x, s.abstract_state.params)
      params.replace_by_pure_dict(jax.tree.map(lambda x, a: np.asarray(x, a.dtype), read, params.to_pure_dict()))
      return jax.device_put(params, s.state_shardings.params)
    check(
      workdir is None,
      f'--workdir {workdir}: its checkpoint does not fit the model of its config.json ({mismatch}); was a '
      '--config.model key overridden?',
    )
  check(
    source is None or models.get(s.config.model.name).offers('load_pretrained'),
    f'init_from={source!r}: model.name={s.config.model.name!r} loads only its own runs whose parameters fit it '
    'exactly; this one does not: give --workdir of the run instead',
  )
  return train.init_state(s).eval_params()


def _read_checkpoint(path: str) -> dict:
  """The parameters of the newest checkpoint of the run `path`; one line for a damaged one."""
  try:
    return checkpoints.read_params(path)
  except ConfigError:
    raise
  except Exception as e:  # Whatever orbax raises for a damaged checkpoint.
    raise ConfigError(f'{path}: the newest checkpoint does not read ({checkpoints.first_line(e)})') from None


def load_model(s: train.Setup, workdir: str | None) -> nnx.Module:
  """The model of `s` with `params_of(s, workdir)`."""
  return nnx.merge(s.graphdef, params_of(s, workdir))


def check_new(path: str, makes_folder: bool = False) -> None:
  """A command's --out must not exist: what is already saved there is never overwritten. Its folder must, unless
  the command makes it (`makes_folder`): found missing only when written, the work before would be lost."""
  check(not os.path.lexists(path), f'--out {path} exists: name a new file or folder (nothing is overwritten)')
  folder = os.path.dirname(path) or '.'
  check(makes_folder or os.path.isdir(folder), f'--out {path}: its folder {folder} does not exist (make it first)')


def class_names(builder, num_classes: int) -> list[str]:
  """The dataset's class names in class order (its label feature's; the class index where it has none)."""
  label = builder.info.features['label'] if 'label' in builder.info.features else None
  names = [str(n) for n in getattr(label, 'names', None) or []]
  if len(names) != num_classes:
    names = [str(i) for i in range(num_classes)]
  return [n.replace('\n', ' ') for n in names]
