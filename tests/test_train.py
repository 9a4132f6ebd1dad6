"""The generic trainer: equal results on any mesh, exact resume, whole-split evaluation."""

import json
import os

import jax
import numpy as np
import pytest
import tensorflow as tf
from flax import nnx

from vit_jax_lab import checkpoints, parallel, reporting, train
from vit_jax_lab.config import ConfigError
from vit_jax_lab.models import layers


def run_steps(config, devices, num_steps=5, initial_from=None):
  """Losses of `num_steps` train steps and the final parameters, on a mesh over `devices`; with
  `initial_from` (a config), starting from the initial parameters of that config's model."""
  s = train.setup(config, devices)
  state = train.init_state(s)
  if initial_from is not None:
    initial = jax.device_get(train.init_state(train.setup(initial_from, devices)).params.to_pure_dict())
    params = state.params
    params.replace_by_pure_dict(layers.scanned_like(initial, params.to_pure_dict()))
    state = state.replace(params=jax.device_put(params, s.state_shardings.params))
  step = train.make_train_step(s)
  batches = train.train_batches(s)
  losses = []
  for _ in range(num_steps):
    state, metrics = step(state, next(batches))
    losses.append(float(metrics['loss']))
  return np.array(losses), jax.device_get(state.params.to_pure_dict()), state


@pytest.mark.slow
def test_same_steps_on_1_device_8_devices_and_fsdp(smoke_config):
  devices = jax.devices()
  assert len(devices) == 8
  reference_losses, reference_params, _ = run_steps(smoke_config(), devices[:1])
  for mesh in ({'data': 8, 'fsdp': 1}, {'data': 4, 'fsdp': 2}):
    config = smoke_config(mesh__data=mesh['data'], mesh__fsdp=mesh['fsdp'])
    losses, params, state = run_steps(config, devices)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5, atol=1e-6, err_msg=str(mesh))
    # To 1e-5: sums run in another order on 8 devices, and Adam rescales the resulting tiny gradient
    # differences of near-zero gradients (the MLP biases start at ~1e-6) to a few 1e-6.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), params, reference_params)
  assert np.all(np.diff(reference_losses) != 0)  # The steps really trained.
  # Under fsdp=2 the large matrices are split: each device holds half of them.
  qkv = state.params['encoder']['blocks'][0]['attn']['qkv']['kernel'][...]
  assert qkv.sharding.spec == jax.sharding.PartitionSpec(None, 'fsdp')
  assert qkv.addressable_shards[0].data.shape == (32, 48)


def read_metrics(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    lines = [json.loads(line) for line in f]
  return [{k: v for k, v in line.items() if k != 'train/steps_per_sec'} for line in lines]


def final_params(config, workdir):
  s = train.setup(config)
  ckpt = checkpoints.Checkpointer(workdir, every=config.checkpoint_every, keep=config.keep)
  step = ckpt.latest_step()
  state = ckpt.restore(step, checkpoints.abstract(s.abstract_state, s.state_shardings))
  ckpt.close()
  return step, jax.device_get(state.params.to_pure_dict()), jax.device_get((state.opt_state, state.ema))


def crash_after_logging(config, workdir, step, monkeypatch):
  """Runs `config` in `workdir` until it has logged `step`, then crashes (KeyboardInterrupt), between checkpoints."""
  line = reporting.Progress.line

  def crash(self, logged_step, *args):
    if logged_step == step:
      raise KeyboardInterrupt
    return line(self, logged_step, *args)

  with monkeypatch.context() as patch:
    patch.setattr(reporting.Progress, 'line', crash)
    with pytest.raises(KeyboardInterrupt):
      train.train_and_evaluate(config, workdir)


@pytest.mark.slow
def test_interrupted_then_resumed_run_equals_uninterrupted(smoke_config, tmp_path, monkeypatch, capsys):
  config = smoke_config(ema_decay=0.9)  # 6 steps, checkpoints at 3 and 6, logs every step; a parameter average.
  whole, resumed = str(tmp_path / 'whole'), str(tmp_path / 'resumed')
  train.train_and_evaluate(config, whole)

  crash_after_logging(config, resumed, 5, monkeypatch)
  assert [m['step'] for m in read_metrics(resumed)][-1] == 5  # Steps 4-5 were logged, not checkpointed.
  train.train_and_evaluate(config, resumed)
  assert 'resumed from step 3' in capsys.readouterr().out

  assert read_metrics(resumed) == read_metrics(whole)
  step_a, params_a, opt_a = final_params(config, whole)
  step_b, params_b, opt_b = final_params(config, resumed)
  assert step_a == step_b == 6
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
  jax.tree.map(np.testing.assert_array_equal, opt_a, opt_b)  # Optimizer state and parameter average.
  assert opt_a[1] is not None

  train.train_and_evaluate(config, resumed)  # Once more: nothing to do.
  assert 'the run is complete' in capsys.readouterr().out


@pytest.mark.slow
def test_parameter_average_is_the_running_average_of_the_parameters(smoke_config):
  """ema_decay=d keeps d * ema + (1 - d) * params after every step, from the initial parameters; d = 0 is the
  parameters themselves. Evaluation, export and init_from read the average."""
  for decay in (0.0, 0.5):
    s = train.setup(smoke_config(ema_decay=decay), jax.devices()[:1])
    state = train.init_state(s)
    step, batches = train.make_train_step(s), train.train_batches(s)
    expected = jax.device_get(state.params.to_pure_dict())
    for _ in range(3):
      state, _ = step(state, next(batches))
      params = jax.device_get(state.params.to_pure_dict())
      expected = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, expected, params)
    ema = jax.device_get(state.ema.to_pure_dict())
    if decay == 0.0:
      jax.tree.map(np.testing.assert_array_equal, ema, params)
    else:
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ema, expected)
      assert not np.allclose(ema['head']['kernel'], params['head']['kernel'])
    assert state.eval_params() is state.ema
  # Sharded like the parameters: under FSDP each device holds its part of the average too.
  s = train.setup(smoke_config(ema_decay=0.9, mesh__data=4, mesh__fsdp=2))
  assert jax.tree.leaves(s.state_shardings.ema) == jax.tree.leaves(s.state_shardings.params)
  assert any(sharding.spec != jax.sharding.PartitionSpec() for sharding in jax.tree.leaves(s.state_shardings.ema))


def test_cpu_runs_take_a_device_per_core_unless_told_otherwise(smoke_config, monkeypatch):
  parallel.use_cpu_cores(smoke_config())  # This process set jax_num_cpu_devices (conftest): that wins.
  assert parallel.CPU_CORES is None and len(jax.devices()) == 8
  assert parallel.devices(smoke_config()) == (jax.devices(), '')
  monkeypatch.setattr(parallel, 'CPU_CORES', 8)  # As if use_cpu_cores had made the 8 devices, one per core.
  assert parallel.devices(smoke_config()) == (jax.devices(), '8 CPU devices, one per core')
  devices, note = parallel.devices(smoke_config(data__batch_size=36))  # 36 and 64 both divide by 4, not by 8.
  assert devices == jax.devices()[:4] and note.startswith('4 of 8 CPU devices (one per core): data.batch_size')
  assert train.setup(smoke_config(data__batch_size=36)).mesh.shape['data'] == 4
  assert len(parallel.devices(smoke_config(data__batch_size=36, mesh__fsdp=2))[0]) == 8  # A mesh set by hand.
  assert parallel.physical_cores() >= 1


def test_eval_covers_every_example_once(smoke_config):
  """360 test images in global batches of 64 on 8 devices: padded, masked, none dropped or doubled."""
  config = smoke_config()
  s = train.setup(config)
  state = train.init_state(s)
  metrics = train.evaluate(s, train.make_eval_step(s), state.params)
  assert metrics['eval/examples'] == 360

  # The same accuracy computed directly, on all test images at once.
  data = s.builder.as_dataset(split='test', batch_size=-1)
  preprocess = s.task.preprocess(config.data, s.info, train=False)
  images = np.stack([preprocess({'image': im, 'label': 0}, tf.zeros([2], tf.int64))['inputs'] for im in data['image']])
  model = nnx.merge(s.graphdef, jax.device_get(state.params))
  accuracy = np.mean(np.argmax(model(images), -1) == data['label'].numpy())
  np.testing.assert_allclose(metrics['eval/accuracy'], accuracy, rtol=1e-6)


@pytest.mark.slow
def test_workdir_of_another_config_is_refused_and_kept(smoke_config, tmp_path):
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(smoke_config(total_steps=3), workdir)
  with pytest.raises(ConfigError, match='different config .*optim.lr'):
    train.train_and_evaluate(smoke_config(total_steps=3, optim__lr=0.5), workdir)
  assert checkpoints.Checkpointer(workdir, every=3, keep=3).latest_step() == 3
