"""Config groups made from constructor signatures: a model's or task's keyword arguments and their defaults are its
config keys (`config.model`, `config.task`), documented once, in the constructor. Imports nothing of ours but the
errors leaf, so the registries (models, tasks) and the config composer (config.py) can both use it."""

import dataclasses
import inspect
import types
import typing
from typing import Any, Callable

import ml_collections
from ml_collections import config_dict

from vit_jax_lab.errors import ConfigError


def config_from_signature(
  fn: Callable[..., Any], name: str, skip: tuple[str, ...] = (), options: type | None = None
) -> ml_collections.ConfigDict:
  """A ConfigDict with `name` plus every keyword argument of `fn` and its default, then the init fields of the
  dataclass `options` (what `fn` takes as `**kwargs`, e.g. a model's encoder options) and theirs.

  Models and tasks document their hyperparameters once, in their constructors; this turns them into
  config keys, so a typo in `--config.model.widht=...` is an unknown key, not a silent no-op.
  """
  cfg = ml_collections.ConfigDict({'name': name})
  fn = fn.__init__ if isinstance(fn, type) else fn  # A module's metaclass hides its __init__ signature.
  hints = typing.get_type_hints(fn)
  for p in inspect.signature(fn).parameters.values():
    if p.name in skip or p.name in ('self', 'rngs') or p.default is inspect.Parameter.empty:
      continue
    _add(cfg, p.name, p.default, hints.get(p.name, str))
  if options is not None:
    hints = typing.get_type_hints(options)
    for f in dataclasses.fields(options):
      if f.init and f.name not in skip:
        _add(cfg, f.name, f.default, hints[f.name])
  return cfg


def check_keys(
  part: str, group: ml_collections.ConfigDict, fn: Callable[..., Any], options: type | None = None
) -> None:
  """One line for the keys of config.<part> (model, task) that its constructor `fn` does not take: a group made for
  another name keeps that constructor's keys when only <part>.name changes on the command line."""
  known = config_from_signature(fn, group.name, options=options)
  unknown = [key for key in group if key not in known]
  if unknown:
    raise ConfigError(
      f'{part}.name={group.name!r} takes no {", ".join(f"{part}.{k}" for k in unknown[:4])}: the config made '
      f'config.{part} for another {part}; make it with {part}s.config({group.name!r}) in the config file'
    )


def _add(cfg: ml_collections.ConfigDict, key: str, default: Any, hint: Any) -> None:
  cfg[key] = config_dict.placeholder(_base_type(hint)) if default is None else default


def constructor_config(
  fn: Callable[..., Any], name: str, overrides: dict[str, Any], options: type | None = None
) -> ml_collections.ConfigDict:
  """`config_from_signature(fn, name, options=options)`, locked (a misspelt keyword is an error here too), with
  `overrides`."""
  cfg = config_from_signature(fn, name, options=options)
  cfg.lock()
  cfg.update(overrides)
  return cfg


def _base_type(hint: Any) -> type:
  """`int | None` -> int, for typed placeholders."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
    return _base_type(args[0])
  return typing.get_origin(hint) or hint
