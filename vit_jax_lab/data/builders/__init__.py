"""TFDS builders of this project: generated locally, no network. Name -> module that registers it."""

import importlib
import os

from vit_jax_lab.errors import check

BUILTIN = {
  'digit_scenes': 'vit_jax_lab.data.builders.digit_scenes',
  'digits': 'vit_jax_lab.data.builders.digits',
  'listops': 'vit_jax_lab.data.builders.listops',
  'moving_digits': 'vit_jax_lab.data.builders.moving_digits',
  'scan': 'vit_jax_lab.data.builders.scan',
  'tracking_benchmarks': 'vit_jax_lab.data.builders.tracking_benchmarks',
  'tracking_digits': 'vit_jax_lab.data.builders.tracking_digits',
}


def is_builtin(name: str) -> bool:
  """Whether `name` ('scan' or with a config, 'scan/length') is one of ours."""
  return name.split('/')[0] in BUILTIN


def register(name: str) -> None:
  """Imports the builder module, which registers `name` (less any '/config') with TFDS; a config it does not
  have is a ConfigError."""
  base, _, config = name.partition('/')
  module = importlib.import_module(BUILTIN[base])
  configs = [c.name for b in vars(module).values() if hasattr(b, 'BUILDER_CONFIGS') for c in b.BUILDER_CONFIGS]
  config = config.partition(':')[0]  # 'scan/simple:1.0.0' names a version too.
  check(
    not config or config in configs,
    f'data.name={name!r}: the built-in {base} has no config {config!r}; its configs: {", ".join(configs) or "none"}',
  )


def check_data_dir(data_config) -> None:
  """`data.data_dir` must exist unless the dataset is one of ours or a folder (generated into it on first use)."""
  d = data_config.data_dir
  check(
    d is None or os.path.isdir(d) or is_builtin(data_config.name) or data_config.name.startswith('folder:'),
    f'data.data_dir={d!r} does not exist; point it at the folder holding prepared TFDS data',
  )
