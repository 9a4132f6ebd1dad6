"""Every family's train and evaluation steps lower for GPUs and TPUs without one: `jax.export` for the 'cuda' and
'tpu' platforms, as a cluster compiles them (XLA attention, bfloat16 compute, a data x fsdp mesh over 8 devices).
Exporting refuses a primitive with no lowering on a platform and a host callback inside a step, so either in a
step fails here, on CPU, before a GPU or TPU ever sees it. (cuDNN's attention needs a GPU to lower.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT
from vit_jax_lab import checkpoints, config as config_lib, train
from vit_jax_lab.data import info as info_lib

PLATFORMS = ('cuda', 'tpu')
BATCH = 8  # One example per device of the data x fsdp = 4 x 2 mesh.


def _classification(input_shape, classes=10, key='image', vocab_size=0):
  info = info_lib.LabelInfo(classes, key, input_shape, BATCH, BATCH, vocab_size)
  inputs = jax.ShapeDtypeStruct((BATCH, *input_shape), jnp.int32 if vocab_size else jnp.float32)
  label = jax.ShapeDtypeStruct((BATCH,), jnp.int32)
  return info, {'inputs': inputs, 'label': label}


def _seq2seq(length=12, size=40):
  vocab = info_lib.WordVocab([f'w{i}' for i in range(size - len(info_lib.SPECIALS))])
  info = info_lib.TextInfo('inputs', 'targets', vocab, vocab, (length,), length, BATCH, BATCH)
  tokens = jax.ShapeDtypeStruct((BATCH, length), jnp.int32)
  return info, {'inputs': tokens, 'targets': tokens}


def _tracking(config):
  d = config.data
  info = info_lib.TrackingInfo(1, 6, (48, 48), BATCH, BATCH, d.template_size, d.search_size, 2.0, 4.0)

  def crops(size):
    return jax.ShapeDtypeStruct((BATCH, size, size, 1), jnp.float32)

  floats = jax.ShapeDtypeStruct((BATCH,), jnp.float32)
  batch = {'template': crops(d.template_size), 'search': crops(d.search_size), 'present': floats}
  return info, batch | {'box': jax.ShapeDtypeStruct((BATCH, 4), jnp.float32)}


FAMILIES = {
  'vit': ('configs/vit/digits.py:smoke', lambda c: _classification((8, 8, 1))),
  'vivit': (
    'configs/vivit/moving_digits.py:spatiotemporal,smoke',
    lambda c: _classification((4, 16, 16, 1), key='video'),
  ),
  'transformer': ('configs/seq2seq/scan.py:simple,smoke', lambda c: _seq2seq()),
  'text_classifier': ('configs/lra/listops.py:smoke', lambda c: _classification((32,), key='inputs', vocab_size=20)),
  'tracker': ('configs/tracking/digits.py:mlp,smoke', _tracking),
}


def _setup(name):
  spec, data = FAMILIES[name]
  config = config_lib.load(f'{ROOT}/{spec}')
  config.compute_dtype = 'bfloat16'
  config.model.attention_impl = 'xla'
  config.mesh.data, config.mesh.fsdp, config.mesh.fsdp_min_size = 4, 2, 1
  config.data.batch_size = config.data.eval_batch_size = BATCH
  config.accum_steps = 1
  info, batch = data(config)
  s = train.setup(config, jax.devices(), data=(None, info))
  sharding = jax.sharding.NamedSharding(s.mesh, train.parallel.BATCH)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in batch.items()}
  return s, checkpoints.abstract(s.abstract_state, s.state_shardings), batch


@pytest.mark.parametrize('name', FAMILIES)
def test_train_step_lowers_for_gpus_and_tpus(name):
  s, state, batch = _setup(name)
  exported = jax.export.export(train.make_train_step(s), platforms=PLATFORMS)(state, batch)
  assert exported.platforms == PLATFORMS
  assert exported.nr_devices == 8


def _eval_batch(s, batch):
  """The eval batch of `_setup`'s task: the train batch and its mask, or for tracking whole sequences (frames scaled,
  a box and an absent flag per frame), tracked online inside the step by the task's geometry."""
  sharding = next(iter(batch.values())).sharding
  mask = {'mask': jax.ShapeDtypeStruct((BATCH,), jnp.float32, sharding=sharding)}
  if s.config.task.name != 'tracking':
    return batch | mask
  s.task.geometry = s.info  # What the task's dataset_info sets.
  frames, (height, width) = s.info.frames, s.info.frame_size
  sequences = {
    'frames': ((frames, height, width, s.info.channels), jnp.float32),
    'boxes': ((frames, 4), jnp.float32),
    'absent': ((frames,), jnp.bool_),
  }
  return mask | {k: jax.ShapeDtypeStruct((BATCH, *shape), d, sharding=sharding) for k, (shape, d) in sequences.items()}


@pytest.mark.parametrize('name', FAMILIES)
def test_eval_step_lowers_for_gpus_and_tpus(name):
  s, state, batch = _setup(name)
  batch = _eval_batch(s, batch)
  exported = jax.export.export(train.make_eval_step(s), platforms=PLATFORMS)(state.params, batch)
  assert exported.platforms == PLATFORMS


def test_a_host_round_trip_inside_a_step_does_not_lower():
  """What makes the tests above fail on a host callback: exporting for several platforms refuses it."""

  def step(x):
    return jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1

  with pytest.raises(NotImplementedError, match='callback'):
    jax.export.export(jax.jit(step), platforms=PLATFORMS)(jax.ShapeDtypeStruct((3,), jnp.float32))
