"""The contract between a model family and everything else: what a family declares, and what it may offer.

A family is a subclass of `Model` registered in `models/__init__.py`; its constructor keywords are its config keys
(`config.model`). The trainer, the evaluators and the tools ask a family these questions, never its name; a new
family declares what it has and implements the optional methods it offers.
"""

import inspect
from typing import Any, ClassVar

import jax
import numpy as np
from flax import nnx

import vit_jax_lab.hub as hub
import vit_jax_lab.models.layers as layers


class Model(nnx.Module):
  """Declarations (class attributes) and optional abilities (methods; `offers` tells which a family has)."""

  # Sub-layer name -> the kernel dimension the mesh's 'model' axis splits ('outputs' or 'inputs'; Megatron style).
  TENSOR_PARALLEL: ClassVar[dict[str, str]] = layers.TENSOR_PARALLEL
  # Parameter names kept out of weight decay, besides every 1-D array (biases, norms).
  NO_DECAY: ClassVar[tuple[str, ...]] = ()
  # The weights `load_pretrained` reads besides hub folders, for init_from: 'npz' (a vision_transformer / big_vision
  # release .npz), 'run' (one of our workdirs of another shape or family). The hub layouts a family reads are the
  # rows of hub.LAYOUTS that name its class (`pretrained()` gives both). (): none, nor a layout: the family resumes
  # only its own runs.
  PRETRAINED: ClassVar[tuple[str, ...]] = ()
  # The encoder options the family takes as `**encoder` keywords, with its defaults (layers.EncoderOptions, or a
  # subclass): config keys beside its constructor's own.
  ENCODER: ClassVar[type[layers.EncoderOptions]] = layers.EncoderOptions
  # The .npz layout `release_params` writes (`tools.export --format npz`); None: the family has none.
  RELEASE_LAYOUT: ClassVar[str | None] = None

  @classmethod
  def pretrained(cls) -> tuple[str, ...]:
    """Every kind of weights init_from may name for this family: PRETRAINED, then the hub layouts whose rows name
    its class."""
    return (*cls.PRETRAINED, *hub.reads(cls.__name__))

  @classmethod
  def offers(cls, ability: str) -> bool:
    """Whether the family implements the optional method `ability` ('features', 'attention_maps',
    'load_pretrained', 'release_params', 'pretrained_config')."""
    if ability not in _ABILITIES:
      raise KeyError(f'{ability!r} is not one of the optional abilities {", ".join(_ABILITIES)}')
    return inspect.getattr_static(cls, ability) is not inspect.getattr_static(Model, ability)

  def features(self, *inputs: jax.Array, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    """(batch, dim): the pooled representation the head reads; what few-shot linear evaluation fits on."""
    raise NotImplementedError

  def attention_maps(self, *inputs: jax.Array) -> list[jax.Array]:
    """Every block's attention probabilities (batch, heads, tokens, tokens) in inference mode; what
    `tools.attention_map` draws."""
    raise NotImplementedError

  def load_pretrained(self, source: dict[str, Any], params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(this model's parameters from `source`, notes of what was adapted). `source` is a release .npz's flat dict,
    another run's parameters (a pure nested dict) or a hub folder (hub.HubWeights) of a layout in PRETRAINED;
    `params` are the model's initial ones, kept where the source has nothing (a head for another class count)."""
    raise NotImplementedError

  @classmethod
  def release_params(cls, params: dict[str, Any], model_config: Any) -> dict[str, np.ndarray]:
    """The parameters (a pure nested dict) of a run whose `config.model` is `model_config`, in the flat naming of
    RELEASE_LAYOUT: from the run alone, without its data."""
    raise NotImplementedError

  @classmethod
  def pretrained_config(cls, model_config: Any, weights: Any) -> list[str]:
    """Sets the keys of `model_config` (config.model) that the hub folder `weights` (hub.HubWeights) fixes and the
    config leaves unset or at the constructor's default, so the model takes the folder's shape; a key the config
    sets to another value is a ConfigError naming it and both values. Returns notes of what was set."""
    raise NotImplementedError


_ABILITIES = ('features', 'attention_maps', 'load_pretrained', 'release_params', 'pretrained_config')
