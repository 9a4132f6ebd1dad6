"""TFDS builders of this project: generated locally, no network. Name -> module that registers it."""

import importlib

BUILTIN = {
    'digits': 'vit_jax_lab.data.builders.digits',
    'moving_digits': 'vit_jax_lab.data.builders.moving_digits',
}


def register(name: str) -> None:
  """Imports the builder module, which registers `name` with TFDS."""
  importlib.import_module(BUILTIN[name])
