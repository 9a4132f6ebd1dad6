"""Experiment configuration: every key, its default and its meaning, plus loading and validation.

A config file in `configs/` defines `get_config(arg: str | None) -> ConfigDict`, starting from
`base_config()` and changing what its experiment needs. The command line adds
`--config path.py:arg` and `--config.some.key=value`. Every mistake is a `ConfigError` whose
message names the key and what would be valid; `main` prints it as one line and exits with 2.
"""

import ast
import importlib.util
import inspect
import math
import os
import types
import typing
from typing import Any, Callable

import ml_collections
from ml_collections import config_dict

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

  c.data = ml_collections.ConfigDict()
  c.data.name = 'digits'  # A TFDS dataset name: a built-in one (vit_jax_lab/data/builders) or any in data_dir.
  c.data.data_dir = config_dict.placeholder(str)  # TFDS data_dir; None: TFDS's default (~/tensorflow_datasets).
  c.data.train_split = 'train'  # TFDS split syntax, e.g. 'train[:90%]'.
  c.data.eval_split = 'test'
  c.data.batch_size = 128  # Global train batch, over all devices and hosts.
  c.data.eval_batch_size = 256  # Global eval batch; the last one is padded and masked.
  c.data.shuffle_buffer = 50_000  # Examples in the shuffle buffer (re-seeded every epoch).
  c.data.cache = False  # Keep decoded examples in memory (for small datasets).
  c.data.image_size = config_dict.placeholder(int)  # Images (and frames) end as this square size; None keeps theirs.
  c.data.resize_size = config_dict.placeholder(int)  # None: images are resized to image_size x image_size (squashed,
  # as vision_transformer does). Set: their shorter side is resized to this, then an image_size square is cropped,
  # at random for training and in the centre for evaluation (big_vision's resize_small + central_crop, e.g. 256 and
  # 224). Videos: see below.
  c.data.antialias = True  # Resizing a larger image smoothes it first (tf.image.resize(antialias=True)); False: plain
  # bilinear sampling, as vision_transformer's pipeline resizes.
  c.data.inception_crop = False  # Random-resized crop (Szegedy et al.) before resizing, for training.
  c.data.crop_padding = 0  # Pad by this many pixels (with zeros) and take a random crop, for training.
  c.data.flip = False  # Random horizontal flip, for training.
  c.data.scale_jitter = (1.0, 1.0)  # Training, with resize_size: after the shorter-side resize, height and width are
  # each scaled by a factor drawn from [low, high] before the random crop (scenic's ViViT: (0.9, 1.33)); (1, 1): off.
  c.data.color_augment = 0.0  # Training: probability of random brightness (+-32/255), saturation and contrast
  # (x 0.6-1.4) and hue (+-0.2), one draw for all frames of a clip (scenic's ViViT: 0.8).
  c.data.color_drop = 0.0  # Training: probability of turning an image or clip to grey (scenic's ViViT: 0.1).
  c.data.randaugment_layers = 0  # Training images: RandAugment (Cubuk et al. 2020), this many ops in a row, each drawn
  # from the paper's 14 (DeiT, AugReg: 2); 0: off. After crop and flip, before colour augmentation.
  c.data.randaugment_magnitude = 9.0  # Their strength m on the 0-10 scale of big_vision and timm, growing with m
  # (DeiT: 9; AugReg's light/medium/strong: 10/15/20; at most 30); the ops and their ranges: data/augment.py.
  c.data.random_erasing = 0.0  # Training images: probability of replacing a random rectangle (2%-1/3 of the area) by
  # noise, last (timm's RandomErasing, 'pixel' mode; DeiT: 0.25).
  c.data.repeated_augment = 1  # Training: each example appears this many times in its batch, each copy augmented
  # with its own seed (repeated augmentation, Hoffer et al. 2020; DeiT: 3); 1: off. Batches per data shard must
  # divide by it; copies are spread over the batch (not side by side), so mixup and cutmix pair different examples.
  c.data.value_range = (-1.0, 1.0)  # Pixel values are scaled to this range.
  # Videos (datasets with a "video" feature): a clip is `num_frames` frames, `frame_stride` apart. Frames are
  # resized so their shorter side is `resize_size` (None: image_size; both None: kept), then cropped to
  # image_size x image_size: at random for training, at `eval_crops` places for evaluation.
  c.data.num_frames = 8  # Frames per clip: the model's time axis.
  c.data.frame_stride = 1  # Take every this-many-th frame (the clip spans (num_frames - 1) * stride + 1).
  c.data.eval_clips = 1  # Evaluation views: this many evenly spaced temporal clips per video...
  c.data.eval_crops = 3  # ...times this many spatial crops (1: centre; 3: both ends and centre of the longer
  # side). The logits of all eval_clips x eval_crops views of a video are averaged.
  # Tracking (datasets with "frames" and "boxes"): training pairs of a template crop of the target in one frame and
  # a search crop around it in a frame at most max_gap away; evaluation crops the same way, online.
  c.data.template_size = 32  # Template crop side in pixels (ViTCRT and STARK: 128).
  c.data.search_size = 64  # Search crop side in pixels (ViTCRT and STARK: 320).
  c.data.template_factor = 2.0  # The template crop covers template_factor * sqrt(w * h) of the frame (STARK: 2).
  c.data.search_factor = 4.0  # The search crop covers search_factor * sqrt(w * h) (STARK: 5; OSTrack: 4).
  c.data.max_gap = 10  # Training: the search frame is at most this many frames before or after the template's.
  c.data.negative_fraction = 0.1  # Training: the fraction of search crops cut away from the target (class 0).
  c.data.distractor_fraction = 0.0  # Training, datasets with 'distractors' (tracking_digits): the fraction of
  # search crops cut around the distractor nearest the target instead: a positive with the target's box if its
  # centre is in the crop, else a negative. The tracker learns to pick the template's object rather than the one
  # in the middle of the crop, and the class token to tell them apart.
  c.data.centre_jitter = 3.0  # Training: the search crop's centre moves by up to +-centre_jitter / 2 times the
  # square root of the target's (jittered) area along each axis (OSTrack: 3).
  c.data.size_jitter = 0.25  # Training: the target's sides, for the search crop only, scale by exp(N(0, this))
  # (OSTrack: 0.25).
  # Text (the seq2seq task): which features, their vocabulary, and sequence lengths.
  c.data.source = config_dict.placeholder(str)  # Input feature (text, or an image); None: the dataset's first
  # supervised key.
  c.data.target = config_dict.placeholder(str)  # Target text feature; None: the second supervised key.
  c.data.vocab = 'words'  # 'words' (word-level, from the train split; one vocabulary per side), 'sentencepiece'
  # (trained on the train split's source and target text, one shared vocabulary, saved as
  # <workdir>/sentencepiece.model and reused on resume), or the path of a SentencePiece .model file.
  c.data.vocab_size = 32_000  # Pieces of a trained SentencePiece vocabulary.
  c.data.vocab_sentences = 1_000_000  # Train a SentencePiece vocabulary on this many training examples.
  c.data.max_input_length = 64  # Source tokens (EOS included). Longer training examples are left out; evaluation
  # keeps every example and cuts it to this. Classification of token sequences (an "inputs" feature, e.g. listops):
  # every sequence is padded to this length, a longer one cut; it must hold a dataset's declared longest.
  c.data.max_target_length = 64  # Target tokens (EOS included); the same rules.
  c.data.pack_factor = 1  # > 1: pack this many batches' worth of sequences into each training batch (sequence
  # packing: fewer padding tokens; sequences that do not fit are left out, see train/packed_fraction).
  c.data.token_budget = 0  # > 0: training batches by a token budget with length bucketing instead of batch_size
  # pairs (the Transformer paper's ~25k source + 25k target tokens): pairs of similar length are batched together,
  # each batch padded to its bucket's length and holding as many pairs as fit the budget on each side. Rows round
  # down to a multiple of batch shards x accum_steps (and data.shards) so batches divide: budgets whose rows need no
  # rounding give the same batches on any device count. data.batch_size is unused then; seq2seq, no packing.
  c.data.shards = -1  # Input shards, each a disjoint part of the split with its own stream; -1: one per
  # process. Fix it (to a multiple of the process count) to get the same batches on any host count.

  c.optim = ml_collections.ConfigDict()
  c.optim.name = 'adamw'  # 'adamw' or 'sgd' (with momentum).
  c.optim.lr = 1e-3  # Peak learning rate, reached after warm-up.
  c.optim.weight_decay = 1e-4  # Decoupled weight decay; never applied to biases, norms or position embeddings.
  c.optim.b1 = 0.9  # Adam beta1.
  c.optim.b2 = 0.999  # Adam beta2.
  c.optim.eps = 1e-8  # Adam epsilon.
  c.optim.mu_dtype = config_dict.placeholder(str)  # Adam's first moment or SGD's momentum in this dtype, e.g.
  # 'bfloat16' (less memory; vision_transformer's fine-tuning); None: float32 like the parameters.
  c.optim.momentum = 0.9  # SGD momentum.
  c.optim.nesterov = False  # SGD Nesterov momentum.
  c.optim.clip_norm = 1.0  # Clip gradients to this global norm; 0 turns clipping off.

  c.schedule = ml_collections.ConfigDict()
  c.schedule.warmup_steps = 100  # Linear warm-up from 0 to optim.lr.
  c.schedule.decay = 'cosine'  # After warm-up: 'cosine', 'linear', 'rsqrt' or 'constant'.
  c.schedule.end_factor = 0.0  # cosine/linear: the final learning rate as a fraction of optim.lr.
  c.schedule.rsqrt_timescale = 10_000  # rsqrt: lr * sqrt(timescale / (timescale + steps after warm-up)).

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # Data-parallel axis size; -1: the devices left over by the other axes.
  c.mesh.fsdp = 1  # Fully sharded data parallel: parameters and optimizer state are split over this axis.
  c.mesh.fsdp_min_size = 2**14  # Arrays with fewer elements stay replicated under FSDP.
  c.mesh.model = 1  # Tensor parallel: attention and MLP weights are split over this axis (Megatron style); the
  # batch is split over data x fsdp only.

  c.distributed = ml_collections.ConfigDict()  # Multi-host start-up; empty: detected from the environment.
  c.distributed.coordinator_address = config_dict.placeholder(str)  # 'host:port' of process 0.
  c.distributed.num_processes = config_dict.placeholder(int)
  c.distributed.process_id = config_dict.placeholder(int)

  c.eval = ml_collections.ConfigDict()  # Evaluations beside the task's own (which runs every eval_every steps).
  # Few-shot linear evaluation, as big_vision's fewshot_lsr: the model's frozen pre-logits features of a
  # dataset's train and test images; per draw, k random train images per class and a closed-form ridge regression
  # from their (standardised) features to {-1, 1} one-hot targets; the test accuracy, averaged over the draws.
  # Logged as eval/fewshot/<dataset>/<k>shot. Images are preprocessed as data.* says for evaluation.
  c.eval.fewshot = ml_collections.ConfigDict()
  c.eval.fewshot.datasets = ()  # TFDS dataset names (built-in or in data.data_dir), e.g. ('digits',); (): off.
  c.eval.fewshot.shots = (1, 5, 10, 25)  # k: training images per class of a draw.
  c.eval.fewshot.draws = 5  # Random draws per k (seeded by `seed`; the same on any device and host count).
  c.eval.fewshot.every = 0  # Evaluate every this many steps, and at the end; 0: whenever the run evaluates
  # (every eval_every steps and at the end).
  c.eval.fewshot.l2_reg = 2.0**10  # Ridge regularisation (big_vision's default, 1024).
  c.eval.fewshot.train_split = 'train'  # The split the k-shot examples are drawn from (TFDS split syntax)...
  c.eval.fewshot.test_split = 'test'  # ...and the one scored.
  c.eval.fewshot.max_train = 50_000  # Read at most this many of train_split's first examples (features of all of
  # them are computed at each evaluation; the draws come from them).
  return c


def smoke(
  c: ml_collections.ConfigDict, *, steps: int = 4, warmup: int = 1, batch_size: int = 32, eval_batch_size: int = 64
) -> None:
  """Makes `c` a run of seconds, for tests: `steps` steps logged each, evaluated and checkpointed halfway and at
  the end, small batches."""
  c.data.batch_size, c.data.eval_batch_size = batch_size, eval_batch_size
  c.total_steps, c.log_every, c.eval_every, c.checkpoint_every = steps, 1, steps // 2, steps // 2
  c.schedule.warmup_steps = warmup


def config_from_signature(fn: Callable[..., Any], name: str, skip: tuple[str, ...] = ()) -> ml_collections.ConfigDict:
  """A ConfigDict with `name` plus every keyword argument of `fn` and its default.

  Models and tasks document their hyperparameters once, in their constructors; this turns them into
  config keys, so a typo in `--config.model.widht=...` is an unknown key, not a silent no-op.
  """
  cfg = ml_collections.ConfigDict({'name': name})
  fn = fn.__init__ if isinstance(fn, type) else fn  # A module's metaclass hides its __init__ signature.
  hints = typing.get_type_hints(fn)
  for p in inspect.signature(fn).parameters.values():
    if p.name in skip or p.name in ('self', 'rngs') or p.default is inspect.Parameter.empty:
      continue
    if p.default is None:
      cfg[p.name] = config_dict.placeholder(_base_type(hints.get(p.name, str)))
    else:
      cfg[p.name] = p.default
  return cfg


def constructor_config(fn: Callable[..., Any], name: str, overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """`config_from_signature(fn, name)`, locked (a misspelt keyword is an error here too), with `overrides`."""
  cfg = config_from_signature(fn, name)
  cfg.lock()
  cfg.update(overrides)
  return cfg


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


def _base_type(hint: Any) -> type:
  """`int | None` -> int, for typed placeholders."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
    return _base_type(args[0])
  return typing.get_origin(hint) or hint


def load(spec: str) -> ml_collections.ConfigDict:
  """Loads `path/to/config.py[:arg]` by calling its `get_config(arg)`."""
  path, _, arg = spec.partition(':')
  if not os.path.isfile(path):
    raise ConfigError(f'--config: no file {path!r}; pass a config file such as configs/vit/digits.py')
  module_spec = importlib.util.spec_from_file_location('_experiment_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, 'get_config'):
    raise ConfigError(f'--config: {path} defines no get_config(arg)')
  config = module.get_config(arg or None)
  config.lock()
  return config


def override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
  """Sets `config.<key>` from command-line text, parsed to the key's existing type."""
  parts = key.split('.')
  node = config
  for i, part in enumerate(parts):
    if part not in node:
      where = '.'.join(parts[:i]) or 'the top level'
      raise ConfigError(f'unknown config key {key!r}: valid keys at {where} are {", ".join(sorted(node.keys()))}')
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
    raise ConfigError(f'--config.{key}={text}: expected {field_type.__name__}') from e


def apply_overrides(config: ml_collections.ConfigDict, args: list[str]) -> None:
  """Applies command-line `--config.KEY=VALUE` arguments; anything else is a ConfigError."""
  for item in args:
    key, eq, value = item.partition('=')
    if not key.startswith('--config.') or not eq:
      raise ConfigError(f'unrecognised argument {item!r}: overrides look like --config.data.batch_size=64')
    override(config, key[len('--config.') :], value)


def _parse(text: str, field_type: type) -> Any:
  if text.lower() in ('none', 'null'):
    return None
  if field_type is str:
    return text
  if field_type is bool:
    if text.lower() not in ('true', 'false', '1', '0'):
      raise ValueError(text)
    return text.lower() in ('true', '1')
  value = ast.literal_eval(text)
  if field_type is float and isinstance(value, int):
    value = float(value)
  if field_type in (tuple, list) and isinstance(value, (tuple, list)):
    value = field_type(value)
  if not isinstance(value, field_type) or (field_type is int and isinstance(value, bool)):
    raise TypeError(text)
  return value


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
  check(config.data.name.strip() != '', 'data.name is empty: name a TFDS dataset, e.g. digits')
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
  supervised = config.task.get('attention_weight')
  check(
    not (supervised and config.model.get('scan')),
    f"task.attention_weight={supervised} supervises the last block's attention, which scanned blocks do not give: "
    'set model.scan=False or task.attention_weight=0',
  )
  check(
    not (supervised and config.model.get('attention') == 'linear'),
    f"task.attention_weight={supervised} supervises the last block's attention, which linear attention does not "
    "form: set model.attention='full' or task.attention_weight=0",
  )
  check(
    config.loss_scale_init >= 1 and config.loss_scale_period > 0,
    f'loss_scale_init={config.loss_scale_init} must be >= 1 and loss_scale_period={config.loss_scale_period} '
    'a positive integer',
  )
  check(
    config.optim.mu_dtype in (None, 'float32', 'bfloat16'),
    f"optim.mu_dtype={config.optim.mu_dtype!r} is not one of None, 'float32', 'bfloat16'",
  )
  check(
    config.init_from is None or os.path.exists(config.init_from),
    f'init_from={config.init_from!r} does not exist; give a .npz file or a workdir',
  )
  d, o, s = config.data, config.optim, config.schedule
  check(d.batch_size > 0, f'data.batch_size={d.batch_size} must be positive')
  check(d.eval_batch_size > 0, f'data.eval_batch_size={d.eval_batch_size} must be positive')
  check(d.image_size is None or d.image_size > 0, f'data.image_size={d.image_size} must be positive or None')
  check(d.crop_padding >= 0, f'data.crop_padding={d.crop_padding} must be >= 0')
  check(
    len(d.value_range) == 2 and d.value_range[0] < d.value_range[1],
    f'data.value_range={d.value_range} must be (low, high) with low < high',
  )
  check(d.num_frames > 0, f'data.num_frames={d.num_frames} must be a positive integer')
  check(d.frame_stride > 0, f'data.frame_stride={d.frame_stride} must be a positive integer')
  check(d.resize_size is None or d.resize_size > 0, f'data.resize_size={d.resize_size} must be positive or None')
  check(
    d.resize_size is None or d.image_size is None or d.resize_size >= d.image_size,
    f'data.resize_size={d.resize_size} must be >= data.image_size={d.image_size}: images are resized, then cropped',
  )
  check(
    len(d.scale_jitter) == 2 and 0 < d.scale_jitter[0] <= d.scale_jitter[1],
    f'data.scale_jitter={d.scale_jitter} must be (low, high) with 0 < low <= high; (1, 1) turns it off',
  )
  for key in ('color_augment', 'color_drop', 'random_erasing'):
    check(0 <= d[key] <= 1, f'data.{key}={d[key]} is a probability: it must be in [0, 1]')
  check(
    d.randaugment_layers >= 0,
    f'data.randaugment_layers={d.randaugment_layers} must be >= 0 (ops per image; 0 turns RandAugment off)',
  )
  check(
    0 <= d.randaugment_magnitude <= 30,
    f'data.randaugment_magnitude={d.randaugment_magnitude} must be in [0, 30] (0-10 is the scale, e.g. 9)',
  )
  check(d.repeated_augment >= 1, f'data.repeated_augment={d.repeated_augment} must be a positive integer (1: off)')
  per_shard = d.batch_size // d.shards if d.shards > 0 else d.batch_size  # Processes are counted in the pipeline.
  check(
    per_shard % d.repeated_augment == 0,
    f'data.batch_size={d.batch_size} is {per_shard} examples per data shard, which does not divide by '
    f'data.repeated_augment={d.repeated_augment} (each batch holds whole groups of copies)',
  )
  check(
    d.repeated_augment == 1 or (d.token_budget == 0 and d.pack_factor == 1),
    f'data.repeated_augment={d.repeated_augment} works with batches of data.batch_size only: set it to 1, or '
    'data.token_budget=0 and data.pack_factor=1',
  )
  check(d.eval_clips > 0, f'data.eval_clips={d.eval_clips} must be a positive integer')
  check(d.eval_crops in (1, 3), f'data.eval_crops={d.eval_crops} must be 1 (centre) or 3 (both ends and centre)')
  check(
    d.vocab in ('words', 'sentencepiece') or d.vocab.endswith('.model'),
    f"data.vocab={d.vocab!r} is not 'words', 'sentencepiece' or the path of a SentencePiece .model file",
  )
  for key in ('vocab_size', 'vocab_sentences', 'max_input_length', 'max_target_length', 'pack_factor'):
    check(d[key] > 0, f'data.{key}={d[key]} must be a positive integer')
  check(d.token_budget >= 0, f'data.token_budget={d.token_budget} must be >= 0 (0: batches of data.batch_size)')
  check(
    d.pack_factor == 1 or config.model.get('attention') != 'linear',
    f"data.pack_factor={d.pack_factor} with model.attention='linear': linear attention sums over the whole row, "
    'so it cannot keep packed sequences apart; set data.pack_factor=1',
  )
  for key in ('template_size', 'search_size', 'max_gap'):
    check(d[key] > 0, f'data.{key}={d[key]} must be a positive integer')
  for key in ('template_factor', 'search_factor'):
    check(d[key] > 0, f"data.{key}={d[key]} must be positive (the crop side in units of the target's size)")
  check(0 <= d.negative_fraction < 1, f'data.negative_fraction={d.negative_fraction} must be in [0, 1)')
  check(0 <= d.distractor_fraction <= 1, f'data.distractor_fraction={d.distractor_fraction} must be in [0, 1]')
  for key in ('centre_jitter', 'size_jitter'):
    check(d[key] >= 0, f'data.{key}={d[key]} must be >= 0 (0 turns it off)')
  check(d.shards == -1 or d.shards > 0, f'data.shards={d.shards} must be -1 (one per process) or positive')
  check(o.name in ('adamw', 'sgd'), f"optim.name={o.name!r} is not one of 'adamw', 'sgd'")
  check(o.lr > 0, f'optim.lr={o.lr} must be positive')
  check(o.weight_decay >= 0, f'optim.weight_decay={o.weight_decay} must be >= 0')
  check(o.clip_norm >= 0, f'optim.clip_norm={o.clip_norm} must be >= 0 (0 turns clipping off)')
  check(
    s.decay in ('cosine', 'linear', 'rsqrt', 'constant'),
    f"schedule.decay={s.decay!r} is not one of 'cosine', 'linear', 'rsqrt', 'constant'",
  )
  check(
    0 <= s.warmup_steps <= config.total_steps,
    f'schedule.warmup_steps={s.warmup_steps} must be between 0 and total_steps={config.total_steps}',
  )
  check(0 <= s.end_factor <= 1, f'schedule.end_factor={s.end_factor} must be in [0, 1]')
  sizes = {k: config.mesh[k] for k in ('data', 'fsdp', 'model')}
  check(list(sizes.values()).count(-1) <= 1, f'mesh: at most one axis may be -1, got {sizes}')
  check(all(v == -1 or v > 0 for v in sizes.values()), f'mesh: axis sizes must be positive or -1, got {sizes}')
  dist = config.distributed
  given = [dist.coordinator_address is not None, dist.num_processes is not None, dist.process_id is not None]
  check(
    all(given) or not any(given),
    'distributed: set coordinator_address, num_processes and process_id together, or none of them',
  )
  _validate_fewshot(config.eval.fewshot)


def _validate_fewshot(f: ml_collections.ConfigDict) -> None:
  names = f.datasets
  check(
    all(isinstance(n, str) and n.strip() for n in names) and len(set(names)) == len(names),
    f'eval.fewshot.datasets={names} must be distinct TFDS dataset names, e.g. ("digits",); () turns it off',
  )
  check(
    len(f.shots) > 0
    and all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in f.shots)
    and len(set(f.shots)) == len(f.shots),
    f'eval.fewshot.shots={f.shots} must be distinct positive integers (training images per class), e.g. (1, 5, 10, 25)',
  )
  check(f.draws > 0, f'eval.fewshot.draws={f.draws} must be a positive integer')
  check(f.every >= 0, f'eval.fewshot.every={f.every} must be >= 0 (0: whenever the run evaluates)')
  check(f.l2_reg > 0, f'eval.fewshot.l2_reg={f.l2_reg} must be positive')
  check(f.max_train > 0, f'eval.fewshot.max_train={f.max_train} must be a positive integer')
  for key in ('train_split', 'test_split'):
    check(f[key].strip() != '', f'eval.fewshot.{key} is empty: name a split, e.g. train')


# Moved to the registries and the workdir module: a config file or script that still calls them learns where.
_MOVED = {
  'model_config': 'vit_jax_lab.models.config',
  'task_config': 'vit_jax_lab.tasks.config',
  'load_run': 'vit_jax_lab.workdir.load_run',
  'from_resolved': 'vit_jax_lab.workdir.from_resolved',
}


def __getattr__(name: str):
  if name in _MOVED:
    raise AttributeError(f'vit_jax_lab.config.{name} has moved: use {_MOVED[name]}')
  raise AttributeError(f'module vit_jax_lab.config has no attribute {name!r}')
