"""Experiment configuration: every key, its default and its meaning, plus loading and validation.

A config file in `configs/` defines `get_config(arg: str | None) -> ConfigDict`, starting from
`base_config()` and changing what its experiment needs. The command line adds
`--config path.py:arg` and `--config.some.key=value`. Every mistake is a `ConfigError` whose
message names the key and what would be valid; `main` prints it as one line and exits with 2.
"""

import ast
import contextlib
import difflib
import importlib.util
import inspect
import math
import os
import traceback
from typing import Any, Iterator

import ml_collections
from ml_collections import config_dict

import vit_jax_lab.models.attention as attention
from vit_jax_lab import data, errors, evaluators, optim, parallel
from vit_jax_lab.errors import ConfigError, check


def base_config() -> ml_collections.ConfigDict:
  """The keys every experiment has. `model` and `task` keys come from their constructors
  (`models.config`, `tasks.config`)."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # Seeds initialisation, dropout, data order and augmentation.
  c.total_steps = 1000  # Optimizer steps of the whole run (a rerun continues up to this).
  c.log_every = 50  # Train metrics are averaged over and written every this many steps.
  c.eval_every = 500  # Evaluate on the whole eval split every this many steps, and at the end.
  c.checkpoint_every = 500  # Save a checkpoint every this many steps, and at the end.
  c.keep = 3  # Checkpoints kept on disk (the newest ones).
  c.init_from = config_dict.placeholder(str)  # Start from these weights: a published .npz, or one of our
  # workdirs / checkpoints/<step> folders. Heads and position embeddings are adapted to the model. A run
  # that has its own checkpoint resumes from that instead.
  c.resume_changes = ''  # Comma-separated optim.* / schedule.* keys (or the groups 'optim', 'schedule') whose
  # change a rerun may bring to the workdir's run and still continue from its newest checkpoint, e.g. 'optim.lr'
  # after a diverged run. Any other change of a run's config is refused.
  c.accum_steps = 1  # Split each batch into this many micro-batches and sum their gradients (less memory).
  c.compute_dtype = 'float32'  # 'float32', 'bfloat16' or 'float16': the forward and backward pass run in this
  # dtype; parameters, gradients and optimizer state stay float32 (mixed precision), losses are taken in float32.
  # float16 adds dynamic loss scaling: the loss is multiplied by a scale before the backward pass; a step whose
  # gradients overflow is skipped and halves the scale, `loss_scale_period` finite steps in a row double it.
  c.loss_scale_init = 2.0**15  # float16: the first loss scale.
  c.loss_scale_period = 2000  # float16: double the loss scale after this many finite steps in a row.
  c.ema_decay = config_dict.placeholder(float)  # Set: also keep an exponential moving average of the parameters
  # (Polyak averaging; the ViT paper's ImageNet fine-tunes: 0.9999), ema = decay * ema + (1 - decay) * params after
  # every update, starting from the initial parameters. It is checkpointed, sharded like the parameters, and it is
  # what evaluation, export and init_from use instead of the raw parameters. None: off.

  c.model = ml_collections.ConfigDict()  # Filled by `vit_jax_lab.models.config(name, ...)`.
  c.task = ml_collections.ConfigDict()  # Filled by `vit_jax_lab.tasks.config(name, ...)`.
  c.data = data.config()  # Each part of the input pipeline defines its keys: data/__init__.py.
  c.optim, c.schedule = optim.config(), optim.schedule_config()
  c.mesh, c.distributed = parallel.mesh_config(), parallel.distributed_config()
  c.eval = evaluators.config()  # Evaluations beside the task's own, each defined in its evaluator.
  return c


def smoke(
  c: ml_collections.ConfigDict, *, steps: int = 4, warmup: int = 1, batch_size: int = 32, eval_batch_size: int = 64
) -> None:
  """Makes `c` a run of seconds, for tests: `steps` steps logged each, evaluated and checkpointed halfway and at
  the end, small batches."""
  c.data.batch_size, c.data.eval_batch_size = batch_size, eval_batch_size
  c.total_steps, c.log_every, c.eval_every, c.checkpoint_every = steps, 1, steps // 2, steps // 2
  c.schedule.warmup_steps = warmup


def resume_changes(config: ml_collections.ConfigDict) -> list[str]:
  """The keys of `config.resume_changes`."""
  return [k.strip() for k in config.resume_changes.split(',') if k.strip()]


def _leaves(node: ml_collections.ConfigDict, prefix: str = '') -> list[tuple[str, Any]]:
  """(dotted key, value) of every leaf, tuples' items included."""
  out = []
  for key, value in node.items():
    if isinstance(value, ml_collections.ConfigDict):
      out += _leaves(value, f'{prefix}{key}.')
    else:
      out += [(f'{prefix}{key}', v) for v in (value if isinstance(value, (tuple, list)) else [value])]
  return out


# The clone's configs/ folder (installed with `pip install -e .`), where a config path is also looked up.
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')


def resolve(path: str) -> str | None:
  """The config file `path` names: a file from the working folder, or else from the clone (configs/vit/digits.py)
  or from its configs/ folder, with or without .py (vit/digits); None if none exists."""
  root = os.path.dirname(CONFIGS)
  for candidate in (path, os.path.join(root, path), os.path.join(CONFIGS, path), os.path.join(CONFIGS, path + '.py')):
    if os.path.isfile(candidate):
      return candidate
  return None


def load(spec: str) -> ml_collections.ConfigDict:
  """Loads `path/to/config.py[:arg]` (found by `resolve`) by calling its `get_config(arg)` (or `get_config()`,
  ml_collections' plain form, when no arg is given). A mistake in the file is one line: its own last frame and the
  message."""
  given, _, arg = spec.partition(':')
  path = resolve(given)
  if path is None and not os.path.isdir(CONFIGS):  # `pip install .` copies the package, not the clone's configs.
    raise ConfigError(
      f'--config: no config file {given!r} here, and this install has no configs folder (they live in the clone): '
      'install with pip install -e . from the clone, or give the config file by its path'
    )
  if path is None:
    raise ConfigError(
      f'--config: no config file {given!r} here or in {CONFIGS}; e.g. --config vit/digits (its configs/vit/digits.py)'
    )
  module_spec = importlib.util.spec_from_file_location('_experiment_config', path)
  if module_spec is None:  # Not a Python file (README.md): Python finds no loader for it.
    raise ConfigError(f'--config: {path} is not a Python file; a config is a .py file defining get_config(arg)')
  module = importlib.util.module_from_spec(module_spec)
  with _config_file_errors(path):
    module_spec.loader.exec_module(module)
  if not hasattr(module, 'get_config'):
    raise ConfigError(f'--config: {path} defines no get_config(arg)')
  try:
    takes_arg = bool(inspect.signature(module.get_config).parameters)
  except (TypeError, ValueError):
    takes_arg = True
  check(takes_arg or not arg, f'--config {spec}: get_config() of {path} takes no argument; drop :{arg}')
  with _config_file_errors(path):
    config = module.get_config(arg or None) if takes_arg else module.get_config()
  check(
    isinstance(config, ml_collections.ConfigDict),
    f'--config: get_config of {path} returned {type(config).__name__}, not a ConfigDict',
  )
  config.lock()
  return config


@contextlib.contextmanager
def _config_file_errors(path: str) -> Iterator[None]:
  """What the config file raises (a syntax error, its own exception) as one ConfigError: the file's deepest frame
  (`file:line`) and the message; ours pass as they are."""
  try:
    yield
  except ConfigError:  # Ours, as it is (a signal's stop, a BaseException, passes by itself).
    raise
  except SyntaxError as e:
    raise ConfigError(f'--config: {e.filename}:{e.lineno}: SyntaxError: {e.msg}') from None
  except Exception as e:
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)] or frames
    message = str(e).strip().splitlines()[0] if str(e).strip() else ''
    raise ConfigError(
      f'--config: {own[-1].filename}:{own[-1].lineno}: {type(e).__name__}' + (f': {message}' if message else '')
    ) from None


def override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
  """Sets `config.<key>` from command-line text, parsed to the key's existing type."""
  parts = key.split('.')
  node = config
  for i, part in enumerate(parts):
    if part not in node:
      where = '.'.join(parts[:i]) or 'the top level'
      near = difflib.get_close_matches(part, list(node.keys()), n=1)
      likely = f'did you mean {".".join([*parts[:i], near[0]])!r}? ' if near else ''
      raise ConfigError(
        f'unknown config key {errors.foreign(key, 80)!r}: {likely}valid keys at {where} are '
        f'{", ".join(sorted(node.keys()))}'
      )
    if i < len(parts) - 1:
      node = node[part]
      if not isinstance(node, ml_collections.ConfigDict):
        raise ConfigError(f'unknown config key {key!r}: {".".join(parts[: i + 1])} has no sub-keys')
  leaf = parts[-1]
  if isinstance(node[leaf], ml_collections.ConfigDict):
    raise ConfigError(f'--config.{key} is a group: set its keys, e.g. --config.{key}.{next(iter(node[leaf]))}=...')
  field_type = node.get_type(leaf)
  try:
    node[leaf] = _parse(text, field_type)
  except (TypeError, ValueError, SyntaxError) as e:
    raise ConfigError(f'--config.{key}={errors.foreign(text, 60)}: expected {field_type.__name__}') from e


def apply_overrides(config: ml_collections.ConfigDict, args: list[str]) -> None:
  """Applies command-line `--config.KEY=VALUE` arguments; anything else is a ConfigError."""
  for item in args:
    key, eq, value = item.partition('=')
    if not key.startswith('--config.') or not eq:
      raise ConfigError(f'unrecognised argument {item!r}: overrides look like --config.data.batch_size=64')
    override(config, key[len('--config.') :], value)


def given_keys(args: list[str]) -> frozenset[str]:
  """The keys a command line sets (`--config.KEY=VALUE`): values the user chose, which the run never adapts."""
  return frozenset(a.partition('=')[0].removeprefix('--config.') for a in args if a.startswith('--config.'))


def _parse(text: str, field_type: type) -> Any:
  if text.lower() in ('none', 'null'):
    return None
  if field_type is str:
    return text
  if field_type is bool:
    if text.lower() not in ('true', 'false', '1', '0'):
      raise ValueError(text)
    return text.lower() in ('true', '1')
  if field_type is float and text.strip().lower().lstrip('+-') in ('nan', 'inf', 'infinity'):
    return float(text)  # Parsed, for validate to name it: not a finite number.
  value = ast.literal_eval(text)
  if field_type is float and isinstance(value, int):
    value = float(value)
  if field_type in (tuple, list) and isinstance(value, (tuple, list)):
    value = field_type(value)
  if not isinstance(value, field_type) or (field_type is int and isinstance(value, bool)):
    raise TypeError(text)
  return value


def check_parts(config: ml_collections.ConfigDict) -> None:
  """A run's config names its model and task (base_config leaves them for get_config to set)."""
  for part, example in (('model', "models.config('vit', variant='S/16')"), ('task', "tasks.config('classification')")):
    check(
      'name' in config[part],
      f'the config sets no {part}: its get_config sets c.{part} = {example}, as configs/vit/digits.py does',
    )


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the values that need no devices and no data (the rest is checked where they are known)."""
  for key, value in _leaves(config):
    check(not isinstance(value, float) or math.isfinite(value), f'{key}={value} is not a finite number')
  for key in resume_changes(config):
    group, _, leaf = key.partition('.')
    check(
      group in ('optim', 'schedule') and (not leaf or leaf in config[group]),
      f'resume_changes: {key!r} is not an optim.* or schedule.* key (nor the group optim or schedule); only '
      'those may change when a run continues',
    )
  for key in ('total_steps', 'log_every', 'eval_every', 'checkpoint_every', 'keep'):
    check(config[key] > 0, f'{key}={config[key]} must be a positive integer')
  check(0 <= config.seed < 2**32, f'seed={config.seed} must be in [0, 2**32)')
  check(
    config.ema_decay is None or 0 <= config.ema_decay < 1,
    f'ema_decay={config.ema_decay} must be in [0, 1), or None to keep no average',
  )
  check(config.accum_steps > 0, f'accum_steps={config.accum_steps} must be a positive integer')
  check(
    config.compute_dtype in ('float32', 'bfloat16', 'float16'),
    f"compute_dtype={config.compute_dtype!r} is not one of 'float32', 'bfloat16', 'float16'",
  )
  check(
    config.model.get('attention_impl') != 'cudnn' or config.compute_dtype != 'float32',
    "model.attention_impl='cudnn' takes bf16 or fp16 only; add --config.compute_dtype=bfloat16 "
    "or use model.attention_impl='xla'",
  )
  kind = attention.KINDS.get(config.model.get('attention', 'full'))  # An unknown one: the model's own check.
  supervised = config.task.get('attention_weight')
  check(
    not (supervised and config.model.get('scan')),
    f"task.attention_weight={supervised} supervises the last block's attention, which scanned blocks do not give: "
    'set model.scan=False or task.attention_weight=0',
  )
  check(
    not (supervised and kind is not None and not kind.weights),
    f"task.attention_weight={supervised} supervises the last block's attention, which "
    f"model.attention={config.model.get('attention')!r} does not form: set model.attention='full' or "
    'task.attention_weight=0',
  )
  check(
    config.loss_scale_init >= 1 and config.loss_scale_period > 0,
    f'loss_scale_init={config.loss_scale_init} must be >= 1 and loss_scale_period={config.loss_scale_period} '
    'a positive integer',
  )
  check(
    config.init_from is None or os.path.exists(config.init_from),
    f'init_from={config.init_from!r} does not exist; give a .npz file or a workdir',
  )
  data.validate(config.data)
  grain = config.data.backend == 'grain'
  check(
    not grain or config.task.get('name') == 'classification',
    f"data.backend='grain' makes image classification batches, and task.name={config.task.get('name')!r}: use "
    "data.backend='tfdata'",
  )
  check(
    not grain or not config.eval.fewshot.datasets,
    f'eval.fewshot.datasets={tuple(config.eval.fewshot.datasets)} reads its datasets with tf.data: set it to (), or '
    "use data.backend='tfdata'",
  )
  check(
    kind is None or kind.packing or config.data.pack_factor == 1,
    f'data.pack_factor={config.data.pack_factor} with model.attention={config.model.get("attention")!r}: this '
    'attention kind cannot keep packed sequences apart; set data.pack_factor=1',
  )
  optim.validate(config)
  parallel.validate(config)
  evaluators.validate(config.eval)
