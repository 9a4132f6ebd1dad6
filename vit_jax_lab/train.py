"""The one training loop: config -> data -> sharded jit step -> eval -> checkpoint -> report.

Everything a user can get wrong is checked in `setup`, before anything compiles. The loop itself
works on `(graphdef, TrainState)`: the NNX model is split once, and the compiled step merges it
inside, so the step is a pure function of (state, batch) with its buffers donated.
"""

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time
import types
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterator

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils

from vit_jax_lab import (
  checkpoints,
  config as config_lib,
  console,
  data as data_lib,
  errors,
  hosts,
  hub,
  models,
  optim,
  parallel,
  tasks,
  workdir as workdir_lib,
)
from vit_jax_lab.data import builders as data_builders, device as data_device
from vit_jax_lab.errors import check

if TYPE_CHECKING:
  import tensorflow_datasets as tfds


def _io(data_config: ml_collections.ConfigDict | None = None) -> types.SimpleNamespace:
  """The data pipeline of `data_config`'s backend, the evaluators and the report writers, imported at their first
  use, never with this module: the tf.data pipeline and the evaluators load TensorFlow (5.4 s, `python -X
  importtime`), which a step on synthetic input (`tools.bench --synthetic`, the lowering tests) never needs, which
  some accelerator machines do not have, and which the grain backend (data.backend='grain') does without."""
  from vit_jax_lab import reporting

  if data_config is not None and data_config.backend == 'grain':
    from vit_jax_lab.data import grain_input

    return types.SimpleNamespace(pipeline=grain_input, evaluators=None, reporting=reporting)
  from vit_jax_lab.data import pipeline
  from vit_jax_lab.evaluators import common as evaluators

  return types.SimpleNamespace(pipeline=pipeline, evaluators=evaluators, reporting=reporting)


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: nnx.State
  opt_state: optax.OptState
  rng: jax.Array  # Raw key data; step i draws from fold_in(rng, i). A value, not a constant of the
  # compiled step, so runs that differ only in their seed share one compilation.
  diverged_at: jax.Array  # 0, or the first step whose loss or gradient norm was not finite; no update is
  # applied from it on, and the host, which reads it only when it logs or saves, stops without saving.
  loss_scale: 'LossScale | None' = None  # float16 compute only.
  ema: nnx.State | None = None  # config.ema_decay set: the moving average of `params`, what evaluation uses.

  def eval_params(self) -> nnx.State:
    """The parameters a run evaluates and exports: the moving average when there is one."""
    return self.params if self.ema is None else self.ema


@flax.struct.dataclass
class LossScale:
  """Dynamic loss scaling for float16, whose small gradients would otherwise underflow to zero."""

  scale: jax.Array  # The loss is multiplied by this before the backward pass, the gradients divided after.
  finite_steps: jax.Array  # Steps in a row whose gradients were finite; at loss_scale_period the scale doubles.
  skipped: jax.Array  # Steps skipped so far: the optimizer (and its learning-rate schedule) is that many behind.

  def update(self, finite: jax.Array, period: int) -> 'LossScale':
    """Halved after an overflow (the step is skipped), doubled after `period` finite steps in a row."""
    grow = finite & (self.finite_steps + 1 >= period)
    scale = jnp.where(finite, jnp.where(grow, 2 * self.scale, self.scale), jnp.maximum(self.scale / 2, 1.0))
    return LossScale(scale, jnp.where(finite & ~grow, self.finite_steps + 1, 0), self.skipped + 1 - finite)


def initial_loss_scale(config: ml_collections.ConfigDict) -> LossScale | None:
  if config.compute_dtype != 'float16':
    return None
  return LossScale(jnp.asarray(config.loss_scale_init, jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything built from the config before the first compile."""

  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  task: tasks.Task
  builder: 'tfds.core.DatasetBuilder | None'  # None: synthetic input, no dataset.
  info: Any  # What the task's dataset_info returned (shapes, classes, vocabularies).
  graphdef: nnx.GraphDef
  tx: optax.GradientTransformation
  abstract_state: TrainState  # ShapeDtypeStructs.
  state_shardings: TrainState  # NamedShardings.


def build_model(config: ml_collections.ConfigDict, task: tasks.Task, info: Any, key: jax.Array) -> nnx.Module:
  return models.build(config.model, nnx.Rngs(params=key), **task.model_kwargs(info))


def _keys(seed: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(initialisation key, raw data of the training key) of a seed."""
  init_key, train_key = jax.random.split(jax.random.key(seed))
  return init_key, jax.random.key_data(train_key)


def setup(
  config: ml_collections.ConfigDict,
  devices: list[jax.Device] | None = None,
  data: 'tuple[tfds.core.DatasetBuilder | None, Any] | None' = None,
  workdir: str | None = None,
  resuming: bool = False,
  given: Collection[str] = (),
) -> Setup:
  """Validates the config against the devices (default: all) and the data; builds the model abstractly.
  `data`: (builder, info) instead of the dataset of `config.data` (the benchmark's random inputs).
  `workdir`: where the task keeps what it derives from the data (a trained vocabulary). `resuming`: the run
  continues from a checkpoint, so data prepared from files that changed since is refused, not prepared again.
  `given`: the keys the command line set (config.given_keys), which are refused rather than adapted to the data."""
  config_lib.validate(config)
  mesh = parallel.make_mesh(config.mesh, parallel.devices(config)[0] if devices is None else devices)
  shards = mesh.shape['data'] * mesh.shape['fsdp']
  by_tokens = config.data.token_budget > 0  # Training batches are sized by the budget, not data.batch_size.
  for key in ('eval_batch_size',) if by_tokens else ('batch_size', 'eval_batch_size'):
    batch = config.data[key]
    check(
      batch % shards == 0,
      f'data.{key}={batch} must be divisible by the {shards} batch shards '
      f'(mesh data x fsdp = {mesh.shape["data"]} x {mesh.shape["fsdp"]})',
    )
    data_lib.shards(config.data, key)
  check(
    by_tokens or config.data.batch_size % (shards * config.accum_steps) == 0,
    f'data.batch_size={config.data.batch_size} must be divisible by accum_steps={config.accum_steps} '
    f'x {shards} batch shards',
  )
  task = tasks.build(config.task)
  # Without TensorFlow for a prepared dataset of images (tf.data's loader is TF-free too): the data's and the
  # model's mistakes are answered before it loads (5.4 s).
  load = _io(config.data).pipeline.load if config.data.backend == 'grain' else data_builders.load
  if data is None:
    # Not with init_from: a hub folder sets model keys (pretrained_config, below) that the early check would lack.
    early = config.data.backend != 'grain' and config.init_from is None
    hook = {'before_generating': _model_checker(config, task)} if early else {}
    builder, info = load(config.data, lambda b, d: task.dataset_info(b, d, workdir), resuming=resuming, **hook)
  else:
    builder, info = data
  buckets = task.buckets(config.data, info)  # Refuses a token budget the task cannot batch by.
  if buckets is not None:
    _io().pipeline.bucket_rows(config.data, buckets.lengths(), shards * config.accum_steps)  # A budget too small.
  family = models.get(config.model.name)
  if config.init_from is not None and hub.is_folder(config.init_from) and family.offers('pretrained_config'):
    with hub.config_values(config.init_from):
      notes = family.pretrained_config(config.model, hub.read(config.init_from))  # The folder's shape.
    for note in notes:
      log(f'init_from {config.init_from}: {note}')
  tx = optim.optimizer(config, family.NO_DECAY)
  abstract_model = nnx.eval_shape(lambda: build_model(config, task, info, _keys(0)[0]))
  graphdef, params = nnx.split(abstract_model, nnx.Param)
  abstract_state = TrainState(
    step=jax.ShapeDtypeStruct((), jnp.int32),
    params=params,
    opt_state=jax.eval_shape(tx.init, params),
    rng=jax.eval_shape(lambda: _keys(0)[1]),
    diverged_at=jax.ShapeDtypeStruct((), jnp.int32),
    loss_scale=jax.eval_shape(lambda: initial_loss_scale(config)),
    ema=None if config.ema_decay is None else params,
  )
  state_shardings = parallel.shardings(abstract_state, mesh, config.mesh.fsdp_min_size, family.TENSOR_PARALLEL)
  if data is None:
    config = _fit_eval_batch(config, info, math.lcm(shards, data_lib.shards(config.data, 'eval_batch_size')[1]), given)
    _check_sizes(config, mesh, parallel.per_device_bytes(abstract_state, state_shardings))
    if config.data.backend == 'tfdata':  # grain holds no shuffle buffer: a few batches per thread and worker.
      _check_host_memory(config.data, builder, task, info, buckets)
  if config.init_from is not None:
    check(
      family.offers('load_pretrained'),
      f'init_from: a {config.model.name} model cannot start from other weights (it has no load_pretrained): unset '
      'init_from, or rerun the run itself in its own workdir to continue it',
    )
    checkpoints.check_init_from(config.init_from, family.pretrained())
  return Setup(config, mesh, task, builder, info, graphdef, tx, abstract_state, state_shardings)


def _model_checker(config: ml_collections.ConfigDict, task: tasks.Task) -> Callable[[Any], None]:
  """For a dataset about to be generated (seconds, and TensorFlow): the model's mistakes answered first, the model
  built abstractly on the shapes and classes its builder declares. Data whose declaration says too little (a
  vocabulary trained on the examples, images of varying size) is checked once generated, as before."""

  def check_model(builder) -> None:
    try:
      info = task.dataset_info(builder, config.data, None)
    except Exception:  # noqa: BLE001 (a question for the generated data; asked again then)
      return
    nnx.eval_shape(lambda: build_model(config, task, info, _keys(0)[0]))

  return check_model


def _fit_eval_batch(
  config: ml_collections.ConfigDict, info: Any, multiple: int, given: Collection[str]
) -> ml_collections.ConfigDict:
  """`config`, or a copy whose data.eval_batch_size is what the eval split needs when it is larger (a small
  dataset of one's own): the same sums over the real examples, less padding; noted. A value given on the command
  line is refused instead, and so is one no split could fill (`multiple`: what batches must divide by)."""
  needed = max(-(-info.num_eval // multiple) * multiple, multiple)
  batch = config.data.eval_batch_size
  if batch <= needed:
    return config
  check(
    'data.eval_batch_size' not in given,
    f'data.eval_batch_size={batch} is larger than the eval split needs ({info.num_eval:,} examples): use at most '
    f'{needed:,}',
  )
  log(f'data.eval_batch_size={batch} -> {needed}: the eval split has {info.num_eval:,} examples')
  config = config.copy_and_resolve_references()
  config.data.eval_batch_size = needed
  config.lock()
  return config


def _check_sizes(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, state_bytes: int) -> None:
  """What would take the machine down: parameters plus optimizer state larger than a device's memory."""
  capacity = parallel.device_memory(mesh)
  check(
    capacity is None or state_bytes <= capacity,
    f'the parameters and optimizer state need {state_bytes / 2**30:,.1f} GiB per device, more than the '
    f'{(capacity or 0) / 2**30:,.1f} GiB a device has: use a smaller model, or shard them (--config.mesh.fsdp)',
  )


def _check_host_memory(data_config: ml_collections.ConfigDict, builder, task: tasks.Task, info: Any, buckets) -> None:
  """Refuses a run whose input pipeline would hold more host memory than this host has available (its shuffle
  buffers, at the recipe's size, are the usual cause), and notes one that would take over half of it."""
  have = hosts.available_memory()
  if have is None:
    return
  pipeline = _io().pipeline
  need = pipeline.host_memory(
    builder, data_config, task.prepare(info, True), task.preprocess(data_config, info, train=True), buckets, have / 4
  )
  what = (
    f'~{_size(need.total)} of host memory (data.shuffle_buffer={data_config.shuffle_buffer:,} examples of '
    f'~{_size(need.example_bytes)}{", all cached too" if data_config.cache else ""}, {need.shards} data '
    f'shard{"s" * (need.shards > 1)}, and batches of {_size(need.batch_bytes)} in flight)'
  )
  if need.total <= have:
    if need.total > have / 2:
      log(f'the input pipeline will hold {what}: over half of the {_size(have)} available')
    return
  spare = 0.8 * have - need.shards * pipeline.BATCHES_IN_FLIGHT * need.batch_bytes
  fits = int(spare / max(need.example_bytes * need.shards, 1)) if spare > 0 else 0
  if fits == 0:  # The batches in flight leave no room for a buffered example.
    fix = 'lower data.batch_size'
  elif data_config.cache and fits < need.buffered // need.shards:
    fix = 'set data.cache=False'
  elif fits >= 1_000:
    fix = f'lower data.shuffle_buffer (to at most {fits // 1000 * 1000:,} here)'
  else:
    fix = f'lower data.shuffle_buffer (to at most {fits:,} here)'
  raise errors.ConfigError(
    f'the input pipeline would hold {what}, more than the {_size(have)} this host has available: {fix}'
  )


def _size(n: float) -> str:
  """Bytes as a short size: '3.2 GiB', '410 MiB', '107 KiB'."""
  for unit, scale in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if n >= scale:
      return f'{n / scale:,.1f} {unit}' if unit == 'GiB' else f'{n / scale:,.0f} {unit}'
  return f'{n:,.0f} B'


def init_state(s: Setup) -> TrainState:
  """The initial state, created directly in its shardings (never whole on one device), with the
  weights of `config.init_from` when it is set."""

  def fresh(params, seed):
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=s.tx.init(params),
      rng=_keys(seed)[1],
      diverged_at=jnp.zeros((), jnp.int32),
      loss_scale=initial_loss_scale(s.config),
      ema=None if s.config.ema_decay is None else params,
    )

  def initial(seed):
    return nnx.state(build_model(s.config, s.task, s.info, _keys(seed)[0]), nnx.Param)

  seed = jnp.asarray(s.config.seed, jnp.uint32)
  path = s.config.init_from  # Checked in `setup`.
  if path is None:
    return jax.jit(lambda seed: fresh(initial(seed), seed), out_shardings=s.state_shardings)(seed)
  # The initial parameters alone, no optimizer state yet: the state is built once, from the loaded parameters (two
  # states at once took 3.1x a ViT-L/16 folder's size above a fresh start).
  params = jax.jit(initial, out_shardings=s.state_shardings.params)(seed)
  source = checkpoints.read_init_from(path)
  model = nnx.merge(s.graphdef, s.abstract_state.params)
  # The initial parameters stay on the devices: a loader keeps those it does not replace (a new head) as they are,
  # and copies to the host only one it reads (one tensor), so no host holds the whole initial model.
  with hub.config_values(path) if hub.is_folder(path) else contextlib.nullcontext():
    loaded, notes = model.load_pretrained(source, params.to_pure_dict())
  log(f'init_from {path}' + ''.join(f'\n  {note}' for note in notes))
  # Each parameter placed in its sharded layout, shard by shard (no whole-model host copy).
  params.replace_by_pure_dict(hub.place(loaded, s.state_shardings.params.to_pure_dict()))
  return jax.jit(fresh, out_shardings=s.state_shardings)(params, seed)


def train_batches(s: Setup, start_step: int = 0) -> Iterator[dict[str, jax.Array]]:
  """The task's global train batches (prepared, preprocessed, packed or bucketed as it asks), from `start_step` on."""
  data = s.config.data
  sharding = jax.sharding.NamedSharding(s.mesh, parallel.BATCH)
  if data.backend == 'grain':
    return _io(data).pipeline.train_iterator(
      s.builder, data, s.info, sharding, seed=s.config.seed, start_step=start_step
    )
  rows_multiple = s.mesh.shape['data'] * s.mesh.shape['fsdp'] * s.config.accum_steps
  return _io().pipeline.train_iterator(
    s.builder,
    data,
    s.task.preprocess(data, s.info, train=True),
    sharding,
    seed=s.config.seed,
    start_step=start_step,
    prepare=s.task.prepare(s.info, True),
    pack=s.task.pack(data),
    buckets=s.task.buckets(data, s.info),
    rows_multiple=rows_multiple,
  )


def in_compute_dtype(tree: Any, config: ml_collections.ConfigDict, keep: Collection[str] = ()) -> Any:
  """Floating-point arrays of `tree` (parameters, a batch) cast to `config.compute_dtype`, but for the batch
  entries named in `keep` (a task's `float32_keys`)."""
  dtype = jnp.dtype(config.compute_dtype)
  if dtype == jnp.float32:
    return tree

  def cast(t):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, t)

  return {k: v if k in keep else cast(v) for k, v in tree.items()} if keep else cast(tree)


def make_train_step(s: Setup):
  """(state, batch) -> (state, metrics), jit-compiled with donated state."""
  lr_schedule = optim.schedule(s.config)
  k = s.config.accum_steps

  def metrics_and_grads(params, batch, rng, step, scale):
    batch = in_compute_dtype(batch, s.config, s.task.float32_keys)

    def loss_fn(p):
      loss, metrics = s.task.loss(nnx.merge(s.graphdef, in_compute_dtype(p, s.config)), batch, rng, step)
      return loss if scale is None else loss * scale, metrics

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return metrics, grads if scale is None else jax.tree.map(lambda g: g / scale, grads)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    batch = data_device.train_inputs(batch, s.config.data, rng)
    scale = None if state.loss_scale is None else state.loss_scale.scale
    if k == 1:
      metrics, grads = metrics_and_grads(state.params, batch, rng, state.step, scale)
    else:  # Micro-batch i is rows i, i + k, ...: every device keeps its own rows.
      micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), batch)

      def accumulate(total, i):
        mb = jax.tree.map(lambda x: x[i], micro)
        return jax.tree.map(
          jnp.add, total, metrics_and_grads(state.params, mb, jax.random.fold_in(rng, i), state.step, scale)
        ), None

      zeros = jax.tree.map(
        lambda x: jnp.zeros(x.shape, x.dtype),
        jax.eval_shape(metrics_and_grads, state.params, jax.tree.map(lambda x: x[0], micro), rng, state.step, scale),
      )
      total, _ = jax.lax.scan(accumulate, zeros, jnp.arange(k))
      metrics, grads = jax.tree.map(lambda x: x / k, total)
    updates, opt_state = s.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    metrics |= {'grad_norm': grad_norm}
    loss_scale = state.loss_scale
    # Divergence: a non-finite loss, or gradient norm (under float16 loss scaling an overflow is expected and
    # skipped instead). From the first such step on nothing is updated, so the state stays the last finite one.
    finite = jnp.isfinite(metrics['loss']) & (jnp.isfinite(grad_norm) | (loss_scale is not None))
    diverged_at = jnp.where((state.diverged_at == 0) & ~finite, state.step + 1, state.diverged_at)
    update = diverged_at == 0
    if loss_scale is None:
      metrics['lr'] = lr_schedule(state.step)
    else:  # An overflowing step changes nothing but the scale.
      grads_finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
      update &= grads_finite
      metrics |= {
        'lr': lr_schedule(state.step - loss_scale.skipped),
        'loss_scale': scale,
        'skipped': 1.0 - grads_finite,
      }
      loss_scale = loss_scale.update(grads_finite, s.config.loss_scale_period)
    ema = state.ema
    if ema is not None:
      decay = s.config.ema_decay
      ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
    params, opt_state, ema = jax.tree.map(
      lambda new, old: jnp.where(update, new, old), (params, opt_state, ema), (state.params, state.opt_state, state.ema)
    )
    state = state.replace(
      step=state.step + 1, params=params, opt_state=opt_state, diverged_at=diverged_at, loss_scale=loss_scale, ema=ema
    )
    return state, metrics

  batch_sharding = jax.sharding.NamedSharding(s.mesh, parallel.BATCH)
  return jax.jit(
    train_step,
    in_shardings=(s.state_shardings, batch_sharding),
    out_shardings=(s.state_shardings, None),
    donate_argnums=0,
    compiler_options=parallel.compiler_options(s.mesh),
  )


def make_eval_step(s: Setup):
  """(params, batch) -> sums of the task's metrics over the batch's real examples."""

  def eval_step(params, batch):
    batch = data_device.eval_inputs(batch, s.config.data)
    return s.task.eval_sums(
      nnx.merge(s.graphdef, in_compute_dtype(params, s.config)), in_compute_dtype(batch, s.config, s.task.float32_keys)
    )

  batch_sharding = jax.sharding.NamedSharding(s.mesh, parallel.BATCH)
  return jax.jit(
    eval_step,
    in_shardings=(s.state_shardings.params, batch_sharding),
    compiler_options=parallel.compiler_options(s.mesh),
  )


def evaluate(s: Setup, eval_step, params) -> dict[str, float]:
  """Task metrics over the whole eval split, from sums over all batches. Outputs a task scores on the host
  (decoded text for BLEU) come under the sums' 'host' key and are turned into more sums there."""
  if s.task.sequential(s.info):
    return {f'eval/{k}': v for k, v in s.task.summarize(_sequential_sums(s, params)).items()}
  sharding, data = jax.sharding.NamedSharding(s.mesh, parallel.BATCH), s.config.data
  if data.backend == 'grain':
    batches = _io(data).pipeline.eval_batches(s.builder, data, s.info, sharding)
  else:
    preprocess = s.task.preprocess(data, s.info, train=False)
    batches = _io().pipeline.eval_batches(s.builder, data, preprocess, sharding, s.task.prepare(s.info, False))
  totals = None
  for batch in batches:
    sums = eval_step(params, batch)
    host = sums.pop('host', None)
    sums = jax.device_get(sums)
    if host is not None:
      sums |= s.task.host_sums(multihost_utils.process_allgather(host, tiled=True), s.info)
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
  return {f'eval/{k}': v for k, v in s.task.summarize(totals).items()}


def host_predict(s: Setup, params) -> Callable[..., Any]:
  """The model as one compiled function of its inputs, on this process's whole copy of `params` in the compute
  dtype: what sequential evaluation and the tracking tools call a frame at a time on the host."""
  model_params = in_compute_dtype(params, s.config)
  if jax.process_count() > 1:  # Each process tracks its own sequences: a whole copy, no collective per frame.
    model_params = multihost_utils.process_allgather(model_params, tiled=True)
  predict = jax.jit(lambda p, *inputs: nnx.merge(s.graphdef, p)(*in_compute_dtype(inputs, s.config), train=False))
  return lambda *inputs: predict(model_params, *inputs)


def _sequential_sums(s: Setup, params) -> dict[str, np.ndarray]:
  """The task's `sequential_sums` over each process's share of the eval split, added up over processes."""
  examples = _io().pipeline.eval_examples(s.builder, s.config.data, s.task.prepare(s.info, False))
  sums = s.task.sequential_sums(host_predict(s, params), examples)
  if jax.process_count() > 1:
    sums = jax.tree.map(lambda x: x.sum(0), multihost_utils.process_allgather(sums))
  return sums


def log(message: str) -> None:
  """Prints on process 0 only."""
  if jax.process_index() == 0:
    print(message, flush=True)


def _average(metrics: list[dict[str, jax.Array]], prefix: str) -> dict[str, float]:
  host = jax.device_get(metrics)
  return {prefix + k: float(np.mean([m[k] for m in host])) for k in host[0]}


class StopSignals:
  """SIGTERM (what schedulers send before they preempt), SIGHUP (a closed terminal or ssh session) and SIGINT
  (Ctrl-C) stop a run: during start-up at once, as there is nothing to save yet (errors.stopped_before_training);
  from `begin_training` on after the current step, with a checkpoint of it. A second Ctrl-C then interrupts at once,
  a save in progress included: one line, exit status 130, the lock released; a checkpoint cut short is never
  restored (orbax finalises a checkpoint only when it is whole), so the rerun continues from the newest whole one.
  With several processes, JAX's preemption service owns SIGTERM and makes every process stop at the same step;
  SIGINT and SIGHUP are passed on to it."""

  def __init__(self, workdir: str):
    self.workdir, self.received, self.training, self.previous = workdir, None, False, {}

  def __enter__(self) -> 'StopSignals':
    signals = (signal.SIGINT, signal.SIGHUP)
    if jax.process_count() == 1:
      signals += (signal.SIGTERM,)
    if threading.current_thread() is threading.main_thread():  # Python handles signals there only.
      self.previous = {sig: signal.signal(sig, self._handle) for sig in signals}
    return self

  def __exit__(self, *exc_info) -> None:
    for sig, handler in self.previous.items():
      signal.signal(sig, handler)

  def begin_training(self) -> None:
    """From here on a signal stops the run after the current step, with a checkpoint of it."""
    self.training = True

  def _handle(self, sig: int, frame) -> None:
    del frame
    name = signal.Signals(sig).name
    if not self.training and jax.process_count() == 1:
      errors.stop_from_handler(sig, errors.stopped_before_training(name))
    if self.received is None:
      self.received = name
      if jax.process_count() > 1:
        os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption service tells the other processes.
    elif sig == signal.SIGINT:
      self._interrupt()

  def _interrupt(self) -> None:
    """Ends the process now: waiting for the save (or for anything) is what a second Ctrl-C refuses."""
    sys.stdout.flush()
    print(
      f'interrupted at once by a second Ctrl-C (after {self.received}): a checkpoint being written is not kept; run '
      'the same command to continue from the newest whole one',
      file=sys.stderr,
      flush=True,
    )
    workdir_lib.release_lock(self.workdir)
    console.terminal_again()  # The line above reaches the terminal before the process ends at once.
    os._exit(errors.SECOND_INTERRUPT_STATUS)

  def stop_at(self, step: int) -> bool:
    """Whether to stop after `step`; the same answer on every process."""
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step)
    return self.received is not None


def _stop_if_diverged(state: TrainState, checkpointer: checkpoints.Checkpointer) -> None:
  """Raises Diverged when the state records a non-finite step (one scalar read: only at logging and saving)."""
  step = int(jax.device_get(state.diverged_at))
  if step:
    checkpointer.close()  # Writes in flight are of earlier, finite states.
    newest = checkpointer.latest_step()
    kept = f'checkpoint {newest} is the newest and finite' if newest else 'no checkpoint was saved'
    raise errors.Diverged(
      f'the loss or gradient norm is not finite at step {step}; nothing from it on was saved ({kept}). Lower '
      'optim.lr or raise schedule.warmup_steps, and continue with --config.resume_changes=optim,schedule'
    )


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, given: Collection[str] = ()
) -> dict[str, float]:
  """Trains to `config.total_steps` (resuming from the newest readable checkpoint) and returns the last eval.
  `given`: the keys the command line set, which `setup` refuses rather than adapts.

  Ends early, with everything up to its newest checkpoint kept, on a signal (errors.Preempted, after saving a
  checkpoint of the current step), a non-finite loss (errors.Diverged) or a full disk (errors.DiskFull)."""
  started = time.perf_counter()
  with workdir_lib.lock(workdir) as lock_notes, errors.disk_errors(workdir), StopSignals(workdir) as signals:
    for note in lock_notes:
      log(note)
    trained = workdir_lib.trained(workdir)
    # Everything is checked before the workdir records the run.
    s = setup(config, workdir=workdir, resuming=trained, given=given)
    io = _io(config.data)  # After the checks, which mostly need no TensorFlow.
    evals = io.evaluators.build(config, s.mesh, s.graphdef, s.state_shardings.params, s.info) if io.evaluators else []
    # A new run's initial weights (init_from's) are read and fitted before anything is recorded: a rejected
    # init_from leaves the workdir as it was.
    state = None if trained else init_state(s)
    notes = workdir_lib.record_config(config, workdir)
    checkpointer = checkpoints.Checkpointer(workdir, every=config.checkpoint_every, keep=config.keep)
    abstract_state = checkpoints.abstract(s.abstract_state, s.state_shardings)
    start, restored = checkpointer.restore_newest(abstract_state, log)
    if start >= config.total_steps:
      log(f'{workdir}: the run is complete (checkpoint at step {start}, total_steps={config.total_steps})')
      checkpointer.close()
      return {}
    for note in notes:
      log(note)
    if start:
      log(f'resumed from step {start}')
      state = restored
    elif state is None:
      state = init_state(s)
    log(io.reporting.parameter_overview(state.params))
    device_note = parallel.devices(config)[1]
    log(
      f'mesh {dict(s.mesh.shape)}{f" ({device_note})" if device_note else ""}; parameters + optimizer state per '
      f'device: {parallel.per_device_bytes(s.abstract_state, s.state_shardings) / 2**20:.1f} MiB'
    )
    batches = train_batches(s, start)
    train_step, eval_step = make_train_step(s), make_eval_step(s)
    writer = io.reporting.writer(workdir, start)
    batch = None if config.data.token_budget else config.data.batch_size  # A token budget: batches vary.
    progress = io.reporting.Progress(config.total_steps, batch, start)
    pending, eval_metrics = [], {}
    signals.begin_training()
    try:
      for step in range(start + 1, config.total_steps + 1):
        state, metrics = train_step(state, next(batches))
        pending.append(metrics)
        last, stop = step == config.total_steps, signals.stop_at(step)
        if step % config.log_every == 0 or last or stop:
          logged = _average(pending, prefix='train/')
          pending = []
          logged['train/steps_per_sec'] = progress.rate(step)
          writer.write_scalars(step, logged)
          log(progress.line(step, logged['train/loss'], logged['train/steps_per_sec']))
          _stop_if_diverged(state, checkpointer)
        if step % config.eval_every == 0 or last:
          t0 = time.perf_counter()
          eval_metrics = evaluate(s, eval_step, state.eval_params())
          writer.write_scalars(step, eval_metrics)
          log(
            f'eval at step {step}: '
            + '  '.join(f'{k} {v:.4f}' for k, v in eval_metrics.items())
            + f'  ({time.perf_counter() - t0:.1f}s)'
          )
          progress.rate(step)  # Eval time does not count against steps/s.
        for evaluator in (e for e in evals if e.due(step, last)):
          extra = evaluator.evaluate(state.eval_params())
          writer.write_scalars(step, extra)
          log(f'{evaluator.name} at step {step}: {evaluator.summary(extra)}')
          progress.rate(step)
        if last or stop or checkpointer.should_save(step):
          _stop_if_diverged(state, checkpointer)
          checkpointer.save(step, state, force=last or stop)
        if stop and not last:
          checkpointer.close()
          raise errors.Preempted(
            f'stopped by {signals.received or "a preemption notice"} at step {step}: checkpoint {step} saved in '
            f'{checkpointer.directory}; run the same command to continue'
          )
    finally:
      writer.close()
      checkpointer.close()
    newest = f'{checkpointer.directory}/{config.total_steps}'
    scores = '  '.join(f'{k} {v:.4f}' for k, v in eval_metrics.items() if k != 'eval/examples')
    best = io.reporting.best_eval(os.path.join(workdir, 'metrics.jsonl'), s.task.headline)
    wall = io.reporting.duration(time.perf_counter() - started)
    chance = s.task.chance(s.info) if 'eval/accuracy' in scores else ''
    parts = (
      f'step {config.total_steps}',
      scores,
      best,
      chance,
      f'wall {wall}',
      f'workdir {workdir}',
      f'checkpoint {newest}',
    )
    log('done: ' + '  '.join(p for p in parts if p))
  return eval_metrics
