"""Model families by config name. Models are Flax NNX modules and know nothing of data or training.

A family is a `base.Model` subclass whose constructor keywords are its config keys (`config`); base.py says what
it declares and what it may offer.
Family modules import their siblings by full name (`import vit_jax_lab.models.layers as layers`), so none
of them goes through this registry.
"""

from typing import Any

import ml_collections
from flax import nnx

from vit_jax_lab import signatures
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import base, cnn, seq2seq, text_classifier, tracker, vit, vivit

# The families by class name, for use as a library: `from vit_jax_lab.models import ViT`.
ViT, ViViT, Transformer = vit.ViT, vivit.ViViT, seq2seq.Transformer
TextClassifier, Tracker, CNN = text_classifier.TextClassifier, tracker.Tracker, cnn.CNN

MODELS: dict[str, type[base.Model]] = {
  'vit': vit.ViT,
  'vivit': vivit.ViViT,
  'transformer': seq2seq.Transformer,
  'text_classifier': text_classifier.TextClassifier,
  'tracker': tracker.Tracker,
  'cnn': cnn.CNN,
}


def get(name: str) -> type[base.Model]:
  if name not in MODELS:
    raise ConfigError(f'model.name={name!r} is not one of {", ".join(MODELS)}')
  return MODELS[name]


def config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
  """`config.model`: the model's constructor keywords and defaults, with `overrides` applied."""
  family = get(name)
  return signatures.constructor_config(family, name, overrides, options=family.ENCODER)


def build(model_config: ml_collections.ConfigDict, rngs: nnx.Rngs, **data_kwargs: Any) -> nnx.Module:
  """The model named by `model_config.name`; `data_kwargs` (e.g. num_classes) come from the task."""
  family = get(model_config.name)
  signatures.check_keys('model', model_config, family, options=family.ENCODER)
  kwargs = {k: v for k, v in model_config.items() if k != 'name'}
  return family(**data_kwargs, **kwargs, rngs=rngs)
