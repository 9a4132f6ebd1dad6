"""The grain backend (data.backend='grain'): batches by step (the same from 0 or 2 workers, on 1 or 8 devices, and
after a resume), shards as tf.data's, the NumPy/PIL ops against the TF ones, a run without TensorFlow."""

import glob
import io
import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import ROOT, build_builtin, digits_renamed, load_config, wait_for_first_log, without_packages
from vit_jax_lab import train
from vit_jax_lab.data import augment, device, grain_input, info as data_info, labels, pil_images, pipeline
from vit_jax_lab.errors import ConfigError


@pytest.fixture(scope='module')
def digits_dir(tmp_path_factory) -> str:
  """Its own data_dir: the ArrayRecord copy is written inside the prepared dataset."""
  return build_builtin('digits', str(tmp_path_factory.mktemp('tfds')))


def grain_config(data_dir, **overrides):
  overrides = {'data__backend': 'grain', 'data__batch_size': 16, 'data__eval_batch_size': 64} | overrides
  return load_config('configs/vit/digits.py:smoke', data_dir, **overrides)


def sharding(devices=None):
  mesh = jax.sharding.Mesh(np.array(devices or jax.devices()), ('data',))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))


def batches(config, start_step=0, count=3, devices=None):
  builder, info = grain_input.load(config.data, data_info.label_info)
  it = grain_input.train_iterator(builder, config.data, info, sharding(devices), seed=0, start_step=start_step)
  return [jax.device_get(next(it)) for _ in range(count)]


def assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_batches_are_a_function_of_the_step(digits_dir):
  """Resumed at step 2 = batches 2.. of an uninterrupted stream; 8 devices = 1 device; uint8 pixels."""
  config = grain_config(digits_dir, data__flip=True, data__crop_padding=1)
  whole = batches(config, count=4)
  assert whole[0]['inputs'].dtype == np.uint8 and whole[0]['inputs'].shape == (16, 8, 8, 1)
  assert_same(batches(config, start_step=2, count=2), whole[2:])
  assert_same(batches(config, count=4, devices=jax.devices()[:1]), whole)
  assert not np.array_equal(whole[0]['inputs'], whole[1]['inputs'])


def test_with_augment_on_device_the_windows_are_resized_in_the_step(digits_dir):
  """data.augment_on='device' with inception crops: grain's batches hold each crop's window, in a canvas no larger
  than the digits' own 8x8 (at 12 px the canvas would be 24x24), and the resize's parameters; resized as the step
  resizes them they are the host's PIL-resized crops of the same draws, a level apart (PIL's 8-bit fixed point). A
  resumed stream has the same windows."""
  common = dict(data__inception_crop=True, data__image_size=12, data__crop_padding=0, data__flip=False)
  on_device = grain_config(digits_dir, data__augment_on='device', data__canvas=2.0, **common)
  windows = batches(on_device, count=2)
  host = batches(grain_config(digits_dir, **common), count=2)
  assert_same(batches(on_device, start_step=1, count=1), windows[1:])
  for w, h in zip(windows, host):
    assert w['inputs'].shape == (16, 8, 8, 1) and w['resize'].shape == (16, 8) and h['inputs'].shape == (16, 12, 12, 1)
    resized = np.asarray(jax.jit(device.resize_windows, static_argnums=2)(w['inputs'], w['resize'], (12, 12)))
    assert np.abs(resized.astype(int) - h['inputs'].astype(int)).max() <= 1


@pytest.mark.slow
def test_two_worker_processes_make_the_same_batches(digits_dir):
  config = grain_config(digits_dir, data__flip=True, data__inception_crop=True, data__image_size=8)
  two = grain_config(digits_dir, data__flip=True, data__inception_crop=True, data__image_size=8, data__workers=2)
  assert_same(batches(two, count=3), batches(config, count=3))


def test_an_epoch_holds_each_example_once_per_copy(digits_dir):
  """Every epoch is a permutation of the shard's examples, reshuffled per epoch; with repeated augmentation each
  comes r times, every copy with its own seed, and the copies of an example lie half a batch apart."""
  config = grain_config(digits_dir, data__repeated_augment=2, data__flip=True)
  builder, info = grain_input.load(config.data, data_info.label_info)
  make = grain_input.TrainBatches(builder, config.data, info, seed=0)
  shard = make.shards[0]
  n = len(shard)
  first, seeds = make.stream(shard, np.arange(2 * n))
  second, _ = make.stream(shard, np.arange(2 * n, 4 * n))
  assert (np.bincount(first, minlength=n) == 2).all() and (np.bincount(second, minlength=n) == 2).all()
  assert first != second and len(set(seeds)) == 2 * n
  batch = make(0)
  np.testing.assert_array_equal(batch['label'][:8], batch['label'][8:])
  assert not np.array_equal(batch['inputs'][:8], batch['inputs'][8:])  # Each copy flipped on its own.


@pytest.mark.parametrize('shards', [1, 2])
def test_eval_batches_and_shards_equal_tf_data(digits_dir, shards):
  """The eval split, shard for shard, in order and padded alike: digits need no resize, so pixels are exact."""
  config = grain_config(digits_dir, data__shards=shards)
  builder, info = grain_input.load(config.data, data_info.label_info)
  ours = [jax.device_get(b) for b in grain_input.eval_batches(builder, config.data, info, sharding())]
  config.data.backend = 'tfdata'
  tf_builder, tf_info = pipeline.load(config.data, data_info.label_info)
  assert info == tf_info  # The copy's split sizes too: evaluation's batch size is fitted to them.
  theirs = pipeline.eval_batches(
    tf_builder, config.data, labels.preprocess_fn(config.data, tf_info, False), sharding(), labels.prepare_fn(tf_info)
  )
  assert_same(ours, [jax.device_get(b) for b in theirs])


def test_train_shards_hold_tf_datas_examples(digits_dir):
  """Data shard k's train examples are tf.data's shard k (tfds.split_for_jax_process)."""
  config = grain_config(digits_dir, data__shards=2)
  builder, info = grain_input.load(config.data, data_info.label_info)
  make = grain_input.TrainBatches(builder, config.data, info, seed=0)
  config.data.backend = 'tfdata'
  tf_builder, _ = pipeline.load(config.data, data_info.label_info)
  for shard in make.shards:
    split = pipeline.tfds.split_for_jax_process('train', process_index=shard.shard, process_count=2)
    expected = [ex['image'] for ex in tf_builder.as_dataset(split=split).as_numpy_iterator()]
    ours = [np.asarray(Image.open(io.BytesIO(shard.source[i]['image']))) for i in range(len(shard))]
    assert [e[..., 0].tobytes() for e in expected] == [o.tobytes() for o in ours]


def natural_image(seed=0, height=120, width=160):
  x = np.cumsum(np.cumsum(np.random.default_rng(seed).normal(size=(height, width, 3)), 0), 1)
  return ((x - x.min()) / (x.max() - x.min()) * 255).astype(np.uint8)


def test_pil_resize_is_within_a_level_of_tf():
  """Antialiased: within a level of tf.image.resize; plain bilinear too, but for an image that grows along one axis
  and shrinks along the other (two 8-bit passes): two levels."""
  x = natural_image()
  for size in [(56, 40), (224, 224), (97, 61), (200, 100), (100, 200)]:
    for antialias in (True, False):
      ours = np.asarray(pil_images.resize(Image.fromarray(x), size, antialias)).astype(int)
      tf_resized = tf.image.resize(tf.cast(x, tf.float32), size[::-1], antialias=antialias)
      theirs = np.clip(np.round(tf_resized.numpy()), 0, 255).astype(int)
      mixed = not antialias and (size[0] >= x.shape[1]) != (size[1] >= x.shape[0])
      assert np.abs(ours - theirs).max() <= (2 if mixed else 1), (size, antialias)


def test_pil_randaugment_ops_match_the_tf_ops():
  """Colour ops agree to a level; geometric ops sample half a pixel apart (PIL's pixel centres are at +0.5),
  which moves the mean pixel by under a level."""
  assert pil_images.OPS == augment.OPS
  x = natural_image()
  for sign in (-1.0, 1.0):
    tf_ops = dict(zip(augment.OPS, augment._op_fns(9.0, tf.constant(sign))))
    pil_ops = pil_images._ops(9.0, sign)
    for op in augment.OPS:
      diff = np.abs(tf_ops[op](tf.constant(x)).numpy().astype(int) - np.asarray(pil_ops[op](Image.fromarray(x))))
      geometric = op.startswith(('rotate', 'shear', 'translate'))
      assert (diff.mean() < 1.0) if geometric else (diff.max() <= 1), (op, sign, diff.max(), diff.mean())


def test_grain_refuses_what_it_does_not_do(digits_dir, moving_digits_dir):
  with pytest.raises(ConfigError, match=r"eval.fewshot.datasets=\('digits',\) reads its datasets with tf.data"):
    config = grain_config(digits_dir)
    config.eval.fewshot.datasets = ('digits',)
    train.config_lib.validate(config)
  with pytest.raises(ConfigError, match='data.color_augment is not implemented on the grain backend'):
    train.config_lib.validate(grain_config(digits_dir, data__color_augment=0.5))
  with pytest.raises(ConfigError, match="data.backend='grain' reads images, and data.name='moving_digits' has video"):
    config = grain_config(moving_digits_dir, data__name='moving_digits')
    grain_input.load(config.data, data_info.label_info)
  prepared = glob.glob(os.path.join(moving_digits_dir, 'moving_digits', '*', 'dataset_info.json'))
  assert prepared and not glob.glob(os.path.join(moving_digits_dir, 'moving_digits', '*', grain_input.ARRAY_RECORD))
  with pytest.raises(ConfigError, match="data.backend='grain' makes image classification batches, and task.name="):
    train.config_lib.validate(load_config('configs/seq2seq/scan.py', digits_dir, data__backend='grain'))


def test_a_damaged_record_file_is_one_line_and_a_new_preparation_is_copied_anew(tmp_path):
  data_dir = build_builtin('digits', str(tmp_path))
  prepared = os.path.join(data_dir, 'digits', '1.0.0')
  config = grain_config(data_dir)
  grain_input.load(config.data, data_info.label_info)
  copy = os.path.join(prepared, grain_input.ARRAY_RECORD)
  assert grain_input._current(prepared, copy)
  path = os.path.join(prepared, 'digits-test.tfrecord-00000-of-00001')
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 10)
  assert not grain_input._current(prepared, copy)  # The prepared files changed: copied again, which finds the cut.
  with pytest.raises(ConfigError, match=f'the prepared data file {path} is cut short: delete its dataset folder'):
    grain_input.load(config.data, data_info.label_info)
  assert os.path.exists(os.path.join(copy, grain_input.SOURCE))  # The old copy stays until a whole one replaces it.
  assert not [p for p in os.listdir(prepared) if '.partial-' in p]


@pytest.mark.parametrize('damage', ['cut', 'noise', 'empty', 'file'])
def test_a_damaged_arrayrecord_copy_is_made_again_before_the_workdir_is_written(tmp_path, damage):
  """The copy's record files are fingerprinted when written (size, and a hash of each end): one cut in half, filled
  with random bytes or emptied is copied anew, and the batches are the sound copy's; `array_record` made a file is
  one line. Before, each was a grain traceback after the workdir was written."""
  data_dir = build_builtin('digits', str(tmp_path))
  prepared = os.path.join(data_dir, 'digits', '1.0.0')
  config = grain_config(data_dir)
  grain_input.load(config.data, data_info.label_info)
  before = batches(config, count=2)
  copy = os.path.join(prepared, grain_input.ARRAY_RECORD)
  path = sorted(glob.glob(os.path.join(copy, '*train.array_record-*')))[0]
  size = os.path.getsize(path)
  if damage == 'file':
    shutil.rmtree(copy)
    open(copy, 'w').close()
    with pytest.raises(ConfigError, match=f'{copy} is a file, where the grain backend keeps its ArrayRecord copy'):
      grain_input.load(config.data, data_info.label_info)
    return
  with open(path, 'r+b') as f:
    if damage == 'cut':
      f.truncate(size // 2)
    elif damage == 'noise':
      f.write(np.random.default_rng(0).bytes(size))
    else:
      f.truncate(0)
  assert not grain_input._current(prepared, copy)
  assert_same(batches(config, count=2), before)  # load (in batches) made the copy again.
  assert grain_input._current(prepared, copy) and os.path.getsize(path) == size


@pytest.mark.slow
def test_a_run_without_tensorflow_trains_evaluates_and_resumes(digits_dir, tmp_path):
  """TensorFlow made unimportable: the grain backend trains, evaluates, writes TensorBoard events and resumes."""
  config = grain_config(digits_dir)  # The ArrayRecord copy is made here, where TensorFlow is.
  grain_input.load(config.data, data_info.label_info)
  env = without_packages(tmp_path, names=('tensorflow',))
  workdir = str(tmp_path / 'run')
  command = [sys.executable, '-m', 'main', '--config', 'configs/vit/digits.py:smoke', '--workdir', workdir]
  command += [f'--config.data.data_dir={digits_dir}', '--config.data.backend=grain']
  first = subprocess.run([*command, '--config.total_steps=4'], cwd=ROOT, env=env, capture_output=True, text=True)
  assert first.returncode == 0, first.stderr[-2000:]
  second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
  assert second.returncode == 0 and 'resumed from step 4' in second.stdout, second.stderr[-2000:]
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    metrics = [json.loads(line) for line in f]
  assert metrics[-1]['step'] == 6 and 0 <= metrics[-1]['eval/accuracy'] <= 1
  events = os.listdir(os.path.join(workdir, 'tensorboard'))
  steps = [
    tf.compat.v1.Event.FromString(r.numpy()).step
    for e in events
    for r in tf.data.TFRecordDataset(os.path.join(workdir, 'tensorboard', e))
  ]
  assert 6 in steps and 4 in steps


@pytest.mark.slow
def test_a_prepared_catalog_dataset_trains_on_grain_without_tensorflow(digits_dir, tmp_path):
  """A TFDS catalog name (mnist: its builder class is TFDS's own) prepared elsewhere, here the digits' files under
  that name: tfds.builder reads its info, grain its ArrayRecord copy, and TensorFlow is never imported."""
  from test_reliability import command

  digits_renamed(digits_dir, tmp_path / 'tfds', 'mnist', '3.0.1')  # The run makes its ArrayRecord copy, TF-free.
  run = command(
    str(tmp_path / 'run'), str(tmp_path / 'tfds'), '--config.data.name=mnist', '--config.data.backend=grain'
  )
  env = without_packages(tmp_path, names=('tensorflow',))
  done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True)
  assert done.returncode == 0 and 'done: step 6' in done.stdout, done.stderr[-2000:]


@pytest.mark.slow
def test_an_interrupted_grain_run_resumed_equals_the_uninterrupted_one(digits_dir, tmp_path, monkeypatch):
  """Killed between checkpoints (after step 5 logged, checkpoint 3), resumed: the same metrics and parameters."""
  from test_train import crash_after_logging, final_params, read_metrics

  config = grain_config(digits_dir, data__flip=True, data__inception_crop=True, data__image_size=8)
  whole, resumed = str(tmp_path / 'whole'), str(tmp_path / 'resumed')
  train.train_and_evaluate(config, whole)
  crash_after_logging(config, resumed, 5, monkeypatch)
  train.train_and_evaluate(config, resumed)
  assert read_metrics(resumed) == read_metrics(whole)
  (step_a, params_a, _), (step_b, params_b, _) = final_params(config, whole), final_params(config, resumed)
  assert step_a == step_b == 6
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)


def test_a_read_only_prepared_dataset_is_one_line(mount):
  """A shared, read-only dataset folder: the ArrayRecord copy cannot go beside it, which is said in one line."""
  data_dir = mount('size=8m')
  build_builtin('digits', data_dir)
  subprocess.run(['mount', '-o', 'remount,ro', data_dir], check=True)
  with pytest.raises(ConfigError, match='the grain backend copies .* to ArrayRecord once, beside it, and cannot write'):
    grain_input.load(grain_config(data_dir).data, data_info.label_info)


def children(pid: int) -> list[int]:
  """The processes whose parent is `pid` (from /proc)."""
  found = []
  for entry in os.listdir('/proc'):
    try:
      with open(f'/proc/{entry}/stat') as f:
        ppid = int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    if ppid == pid:
      found.append(int(entry))
  return found


@pytest.mark.slow
def test_grains_workers_end_with_a_run_killed_outright(digits_dir, tmp_path):
  """SIGKILL of a run with data.workers=2 (no cleanup runs in it): its workers, adopted by init, end within seconds
  by themselves (grain_input.end_with_parent); before, they stayed on the host."""
  workdir = str(tmp_path / 'run')
  command = [sys.executable, '-m', 'main', '--config', 'configs/vit/digits.py:smoke', '--workdir', workdir]
  command += [f'--config.data.data_dir={digits_dir}', '--config.data.backend=grain', '--config.data.workers=2']
  command += ['--config.total_steps=100000', '--config.log_every=1', '--config.eval_every=100000']
  run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    wait_for_first_log(workdir, timeout=240)
    workers = [p for p in children(run.pid) if 'multiprocessing' in open(f'/proc/{p}/cmdline').read()]
    assert len(workers) >= 2, children(run.pid)
  finally:
    run.kill()
    run.wait()
  deadline = time.time() + 15
  while any(os.path.exists(f'/proc/{p}') for p in workers) and time.time() < deadline:
    time.sleep(0.2)
  alive = [p for p in workers if os.path.exists(f'/proc/{p}') and open(f'/proc/{p}/stat').read().split()[2] != 'Z']
  assert not alive


def test_workers_beyond_the_hosts_cores_or_memory_are_one_line(digits_dir, monkeypatch):
  from vit_jax_lab import data as data_lib, hosts

  config = grain_config(digits_dir, data__workers=(os.cpu_count() or 1) + 1)
  with pytest.raises(ConfigError, match=rf'data.workers={os.cpu_count() + 1} is more than the {os.cpu_count()} cores'):
    data_lib.validate(config.data)
  config.data.workers = 1
  data_lib.validate(config.data)
  monkeypatch.setattr(hosts, 'available_memory', lambda: 2**27)  # 128 MiB free: not room for one worker.
  with pytest.raises(ConfigError, match=r'data.workers=1 would take about 0.3 GiB .* use fewer') as e:
    data_lib.validate(config.data)
  assert '\n' not in str(e.value)


def test_jpegs_decode_with_simplejpeg_to_pils_pixels():
  """pil_images.decode reads a JPEG with simplejpeg (faster) and gets PIL's pixels, grey or colour; a CMYK JPEG,
  which simplejpeg converts a level apart from PIL, is PIL's."""
  ys, xs = np.mgrid[0:37, 0:53]
  rgb = np.stack([xs * 4, ys * 6, (xs * ys) % 256], -1).astype(np.uint8)
  for mode, channels in (('RGB', 3), ('L', 1), ('L', 3), ('RGB', 1), ('CMYK', 3)):
    buffer = io.BytesIO()
    Image.fromarray(rgb).convert(mode).save(buffer, 'JPEG', quality=90)
    data = buffer.getvalue()
    expected = np.asarray(Image.open(io.BytesIO(data)).convert('L' if channels == 1 else 'RGB'))
    np.testing.assert_array_equal(np.asarray(pil_images.decode(data, channels)), expected)
    np.testing.assert_array_equal(pil_images.pixels_of(data, channels).reshape(expected.shape), expected)
  assert pil_images._jpeg(data, 3) is None  # The CMYK one: PIL's.


@pytest.mark.parametrize('shards', [1, 2])
def test_batches_are_handed_to_the_cpu_devices_without_a_copy(digits_dir, shards):
  """The images of train batches (a canvas, or whole crops), 1 or 2 shards, and padded eval batches are 64-byte
  aligned, so JAX's CPU client makes the device array on their memory; a NumPy-aligned (16-byte) batch was copied (a
  sixth of the DeiT host's time)."""
  one = jax.devices()[:1]
  for overrides in (dict(data__augment_on='device', data__inception_crop=True, data__image_size=12), {}):
    config = grain_config(digits_dir, data__shards=shards, **overrides)
    builder, info = grain_input.load(config.data, data_info.label_info)
    made = [grain_input.TrainBatches(builder, config.data, info, seed=0)(0)]
    made.append(grain_input.EvalBatches(builder, config.data, info)(0))
    for images in (batch['inputs'] for batch in made):
      on_device = jax.make_array_from_process_local_data(sharding(one), images)
      assert on_device.addressable_data(0).unsafe_buffer_pointer() == images.ctypes.data
