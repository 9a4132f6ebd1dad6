"""Model families by config name. Models are Flax NNX modules and know nothing of data or training."""

from flax import nnx

from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import seq2seq, vit, vivit

MODELS: dict[str, type[nnx.Module]] = {'vit': vit.ViT, 'vivit': vivit.ViViT, 'transformer': seq2seq.Transformer}


def get(name: str) -> type[nnx.Module]:
  if name not in MODELS:
    raise ConfigError(f'model.name={name!r} is not one of {", ".join(MODELS)}')
  return MODELS[name]


def build(model_config, rngs: nnx.Rngs, **data_kwargs) -> nnx.Module:
  """The model named by `model_config.name`; `data_kwargs` (e.g. num_classes) come from the task."""
  kwargs = {k: v for k, v in model_config.items() if k != 'name'}
  return get(model_config.name)(**data_kwargs, **kwargs, rngs=rngs)
