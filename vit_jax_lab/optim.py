"""Optimizer and learning-rate schedule from `config.optim` and `config.schedule`."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax
from ml_collections import config_dict

import vit_jax_lab.models.layers as layers
from vit_jax_lab.errors import check

DECAYS = ('cosine', 'linear', 'rsqrt', 'constant')


def config() -> ml_collections.ConfigDict:
  """`config.optim`."""
  return ml_collections.ConfigDict(
    dict(
      name='adamw',  # 'adamw' or 'sgd' (with momentum).
      lr=1e-3,  # Peak learning rate, reached after warm-up.
      weight_decay=1e-4,  # Decoupled weight decay; never applied to biases, norms or position embeddings.
      b1=0.9,  # Adam beta1.
      b2=0.999,  # Adam beta2.
      eps=1e-8,  # Adam epsilon.
      # Adam's first moment or SGD's momentum in this dtype, e.g. 'bfloat16' (less memory; vision_transformer's
      # fine-tuning); None: float32 like the parameters.
      mu_dtype=config_dict.placeholder(str),
      momentum=0.9,  # SGD momentum.
      nesterov=False,  # SGD Nesterov momentum.
      clip_norm=1.0,  # Clip gradients to this global norm; 0 turns clipping off.
    )
  )


def schedule_config() -> ml_collections.ConfigDict:
  """`config.schedule`."""
  return ml_collections.ConfigDict(
    dict(
      warmup_steps=100,  # Linear warm-up from 0 to optim.lr.
      decay='cosine',  # After warm-up: one of DECAYS.
      end_factor=0.0,  # cosine/linear: the final learning rate as a fraction of optim.lr.
      rsqrt_timescale=10_000,  # rsqrt: lr * sqrt(timescale / (timescale + steps after warm-up)).
    )
  )


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks `config.optim` and `config.schedule`."""
  o, s = config.optim, config.schedule
  check(o.name in ('adamw', 'sgd'), f"optim.name={o.name!r} is not one of 'adamw', 'sgd'")
  check(o.lr > 0, f'optim.lr={o.lr} must be positive')
  check(o.weight_decay >= 0, f'optim.weight_decay={o.weight_decay} must be >= 0')
  for key in ('b1', 'b2', 'momentum'):  # Outside [0, 1) a moment grows without bound: NaN within steps.
    check(o[key] is None or 0 <= o[key] < 1, f'optim.{key}={o[key]} must be in [0, 1)')
  check(o.eps > 0, f"optim.eps={o.eps} must be positive (Adam divides by its moment's root plus eps)")
  check(o.clip_norm >= 0, f'optim.clip_norm={o.clip_norm} must be >= 0 (0 turns clipping off)')
  check(
    o.mu_dtype in (None, 'float32', 'bfloat16'),
    f"optim.mu_dtype={o.mu_dtype!r} is not one of None, 'float32', 'bfloat16'",
  )
  check(s.decay in DECAYS, f'schedule.decay={s.decay!r} is not one of {", ".join(map(repr, DECAYS))}')
  check(
    0 <= s.warmup_steps <= config.total_steps,
    f'schedule.warmup_steps={s.warmup_steps} must be between 0 and total_steps={config.total_steps}',
  )
  check(0 <= s.end_factor <= 1, f'schedule.end_factor={s.end_factor} must be in [0, 1]')


def schedule(config) -> optax.Schedule:
  """Linear warm-up to optim.lr, then the configured decay over the remaining steps."""
  s, lr = config.schedule, config.optim.lr
  decay_steps = max(config.total_steps - s.warmup_steps, 1)

  def rsqrt(t):
    return lr * jnp.sqrt(s.rsqrt_timescale / (s.rsqrt_timescale + t))

  def decay_schedule(kind: str) -> optax.Schedule:
    if kind == 'cosine':
      return optax.cosine_decay_schedule(lr, decay_steps, alpha=s.end_factor)
    if kind == 'linear':
      return optax.linear_schedule(lr, lr * s.end_factor, decay_steps)
    if kind == 'rsqrt':
      return rsqrt
    if kind == 'constant':
      return optax.constant_schedule(lr)
    raise KeyError(kind)

  decay = decay_schedule(s.decay)
  if s.warmup_steps == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, lr, s.warmup_steps), decay], [s.warmup_steps])


def decay_mask(params, no_decay: tuple[str, ...] = ()):
  """True for the weights that get weight decay: matrices, not biases, norms, nor the parameters named in
  `no_decay` (the model family's NO_DECAY: position embeddings, class tokens). Scanned blocks' arrays
  (`blocks` not followed by a layer number) have a leading layer axis."""

  def decays(path, x):
    keys = layers.path_keys(path)
    scanned = any(k == 'blocks' and not isinstance(nxt, int) for k, nxt in zip(keys, keys[1:]))
    return x.ndim - scanned > 1 and not {str(k) for k in keys}.intersection(no_decay)

  return jax.tree_util.tree_map_with_path(decays, params)


def optimizer(config, no_decay: tuple[str, ...] = ()) -> optax.GradientTransformation:
  """The configured optimizer, with gradient clipping and weight decay (not on 1-D arrays nor `no_decay`)."""
  o, lr = config.optim, schedule(config)
  mask = functools.partial(decay_mask, no_decay=no_decay)
  if o.name == 'adamw':
    update = optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=mask, mu_dtype=o.mu_dtype)
  else:  # sgd: weight decay added to the gradient, the classic form.
    update = optax.chain(
      optax.add_decayed_weights(o.weight_decay, mask=mask),
      optax.sgd(lr, momentum=o.momentum, nesterov=o.nesterov, accumulator_dtype=o.mu_dtype),
    )
  return optax.chain(optax.clip_by_global_norm(o.clip_norm), update) if o.clip_norm else update
