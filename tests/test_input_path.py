"""The input path at the scale of real data: images and videos are shuffled as their files and decoded after the
shuffle, a JPEG's inception crop decodes only its window, and the host memory a run's buffers need is checked
before anything runs."""

import io
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import load_config
from vit_jax_lab import config as config_lib, hosts, parallel, train
from vit_jax_lab.data import device, images, info as data_info, labels, pipeline


def photo_tree(root, per_class=6, classes=3) -> None:
  """JPEGs of three chroma subsamplings (4:4:4, 4:2:2, 4:2:0) and sizes, and a PNG per class, in train/ and test/."""
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for c in range(classes):
      os.makedirs(root / split / f'c{c}', exist_ok=True)
      for i in range(per_class):
        height, width = (int(n) for n in rng.integers(24, 61, 2))
        pixels = np.clip(rng.normal(128, 60, (height, width, 3)), 0, 255).astype(np.uint8)
        if i == 0:
          Image.fromarray(pixels).save(root / split / f'c{c}' / f'{i}.png')
        else:
          Image.fromarray(pixels).save(root / split / f'c{c}' / f'{i}.jpg', quality=90, subsampling=i % 3)


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
  root = tmp_path_factory.mktemp('photos')
  photo_tree(root)
  return root


def deit_like(photos, data_dir, **data):
  """The digits smoke config on the photo folder with the DeiT recipe's input settings."""
  config = load_config('configs/vit/digits.py:smoke', str(data_dir))
  config.data.update(
    dict(
      name=f'folder:{photos}',
      image_size=16,
      resize_size=18,
      inception_crop=True,
      flip=True,
      randaugment_layers=2,
      randaugment_magnitude=9.0,
      batch_size=8,
      shuffle_buffer=7,
    )
  )
  config.data.update(data)
  return config


def stream(config, start_step: int, num_batches: int) -> list[dict]:
  builder, info = pipeline.load(config.data, data_info.label_info)
  sharding = jax.sharding.NamedSharding(parallel.make_mesh(config.mesh), parallel.BATCH)
  it = pipeline.train_iterator(
    builder,
    config.data,
    labels.preprocess_fn(config.data, info, train=True),
    sharding,
    seed=config.seed,
    start_step=start_step,
    prepare=labels.prepare_fn(info),
  )
  return [jax.device_get(next(it)) for _ in range(num_batches)]


def test_images_are_shuffled_as_files_and_decoded_after_into_the_same_batches(photos, tmp_path, monkeypatch):
  config = deit_like(photos, tmp_path)
  builder, _ = pipeline.load(config.data, data_info.label_info)
  read = pipeline._read(builder, 'train', False, lambda ds: ds)
  assert read.element_spec['image'].dtype == tf.string  # What the shuffle buffer holds: files.
  late = stream(config, 0, 5)  # 15 training images: three epochs and more.
  monkeypatch.setattr(pipeline, 'encoded_features', lambda builder: [])  # TFDS decodes before the shuffle.
  early = stream(config, 0, 5)
  for a, b in zip(late, early):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
    np.testing.assert_array_equal(a['label'], b['label'])


def test_a_resumed_stream_of_encoded_images_equals_the_uninterrupted_one(photos, tmp_path):
  config = deit_like(photos, tmp_path, random_erasing=0.25, repeated_augment=2)
  full = stream(config, 0, 6)
  for a, b in zip(stream(config, 3, 3), full[3:]):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
    np.testing.assert_array_equal(a['label'], b['label'])


def test_a_cache_holds_small_images_decoded_and_every_batch_is_the_same(smoke_config, monkeypatch):
  """digits' 8x8 images take no more than twice their records' bytes as pixels, so data.cache holds them decoded
  (one decode for the run, not one an epoch); the batches of several epochs, shuffled and augmented, and a resumed
  stream are those of the uncached pipeline. ImageNet-like photos of varying size stay files in a cache."""
  common = dict(data__flip=True, data__crop_padding=1, data__batch_size=256, data__shuffle_buffer=300)
  cached, uncached = smoke_config(data__cache=True, **common), smoke_config(**common)
  builder, _ = pipeline.load(cached.data, data_info.label_info)
  assert pipeline.pixels_fit(builder, 'image') and pipeline.pixel_bytes(builder, 'image') == 64
  with monkeypatch.context() as m:
    m.setattr(pipeline, 'record_bytes', lambda builder: 31.9)  # 64 bytes of pixels: over twice a record.
    assert not pipeline.pixels_fit(builder, 'image')
  assert pipeline._read(builder, 'train', True, lambda ds: ds).element_spec['image'].dtype == tf.uint8
  assert pipeline._read(builder, 'train', False, lambda ds: ds).element_spec['image'].dtype == tf.string
  assert 15 * 256 > 2 * builder.info.splits[cached.data.train_split].num_examples  # Over two epochs.
  ours = stream(cached, 0, 15)
  for a, b in zip(ours, stream(uncached, 0, 15)):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
    np.testing.assert_array_equal(a['label'], b['label'])
  for a, b in zip(stream(cached, 9, 6), ours[9:]):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])


def test_a_cache_keeps_images_of_many_sizes_as_their_files(photos, tmp_path):
  builder, _ = pipeline.load(deit_like(photos, tmp_path, cache=True).data, data_info.label_info)
  assert not pipeline.pixels_fit(builder, 'image')
  assert pipeline._read(builder, 'train', True, lambda ds: ds).element_spec['image'].dtype == tf.string


@pytest.mark.parametrize('subsampling', [0, 1, 2])
def test_a_jpeg_inception_crop_decodes_its_window_into_a_whole_decodes_pixels(subsampling):
  rng, cropped = np.random.default_rng(subsampling), 0
  for k in range(12):
    height, width = (int(n) for n in rng.integers(40, 300, 2))
    pixels = np.clip(rng.normal(128, 50, (height, width, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, 'JPEG', quality=85, subsampling=subsampling)
    data, seed = tf.constant(buffer.getvalue()), tf.constant([subsampling, k], tf.int64)
    fused = images.decode_inception_crop(data, 3, seed).numpy()
    whole = images.inception_crop(images.decode(data, 3), seed).numpy()
    np.testing.assert_array_equal(fused, whole)
    cropped += fused.shape[:2] != (height, width)
  assert cropped >= 6  # Windows inside the image, where libjpeg's cropped decoding is what is compared.


def test_pixels_travel_as_uint8_and_the_step_scales_them_as_the_host_did(smoke_config):
  """A batch of uint8 pixels trains to the same loss and gradients as the same batch scaled to float32 on the host
  with the preprocessing's formula (what went to the device before): the step's scaling is that formula, to float32
  rounding (XLA may multiply by 1/255 where TensorFlow divided)."""
  config = smoke_config(data__value_range=(-0.5, 2.0))
  s = train.setup(config, jax.devices()[:1])
  batch = jax.device_get(next(train.train_batches(s)))
  assert batch['inputs'].dtype == np.uint8
  low, high = config.data.value_range
  host = dict(batch, inputs=(tf.cast(batch['inputs'], tf.float32) / 255.0 * (high - low) + low).numpy())
  scaled = jax.jit(lambda b: device.eval_inputs(b, config.data))(batch)['inputs']
  np.testing.assert_allclose(
    np.asarray(scaled), host['inputs'], rtol=0, atol=2 * np.finfo(np.float32).eps * high
  )  # An ulp.
  step = train.make_train_step(s)
  (_, from_pixels), (_, from_floats) = (step(train.init_state(s), b) for b in (batch, host))
  for key in ('loss', 'grad_norm', 'accuracy'):
    np.testing.assert_allclose(float(from_pixels[key]), float(from_floats[key]), rtol=1e-6, err_msg=key)


def test_random_erasing_in_the_step_is_the_same_on_1_and_8_devices():
  images = jnp.zeros((16, 12, 12, 3))
  key = jax.random.key(3)
  one = jax.jit(device.random_erase, static_argnums=(2, 3))(images, key, 1.0, (-1.0, 1.0))
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('data',))
  spread = jax.device_put(images, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')))
  eight = jax.jit(device.random_erase, static_argnums=(2, 3))(spread, key, 1.0, (-1.0, 1.0))
  assert len(eight.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(one), np.asarray(eight))
  assert (np.asarray(one) != 0).any()


def test_a_run_whose_buffers_exceed_the_hosts_memory_is_refused_before_anything_runs(photos, tmp_path, monkeypatch):
  """The DeiT recipe's input settings on the photo folder: ~15 training files of ~1 KB each; a host with room for
  5 of them in its shuffle buffer refuses the run in one line naming data.shuffle_buffer, and nothing is written."""
  config = deit_like(photos, tmp_path / 'tfds', shuffle_buffer=250_000, cache=False)
  builder, _ = pipeline.load(config.data, data_info.label_info)
  per_example = sum(s.num_bytes for s in builder.info.splits.values()) / 18 + pipeline.ELEMENT_BYTES
  monkeypatch.setattr(hosts, 'available_memory', lambda: int(per_example * 9))
  workdir = tmp_path / 'run'
  with pytest.raises(config_lib.ConfigError, match=r'data\.shuffle_buffer=250,000 .* lower data\.shuffle_buffer') as e:
    train.train_and_evaluate(config, str(workdir))
  assert '\n' not in str(e.value) and not workdir.exists()
  monkeypatch.setattr(hosts, 'available_memory', lambda: int(per_example * 9) + 2**30)  # Room: it runs.
  train.setup(config, jax.devices()[:1])


def test_small_records_enlarged_by_image_size_count_at_their_batch(photos, tmp_path, monkeypatch):
  """~1 KB files made 224 px: batches of 2,048 hold ~1.2 GB in flight though their records come to ~10 MB, and a
  600 MB host (a job's cgroup) refuses the run in one line (it was estimated at the records' size and ran)."""
  config = deit_like(photos, tmp_path / 'tfds', image_size=224, resize_size=256, batch_size=2048, shuffle_buffer=16)
  monkeypatch.setattr(hosts, 'available_memory', lambda: 600 * 2**20)
  with pytest.raises(config_lib.ConfigError, match=r'batches of .* in flight.* lower data\.batch_size') as e:
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert '\n' not in str(e.value) and not (tmp_path / 'run').exists()


def test_a_batch_beyond_the_hosts_memory_is_refused_before_anything_runs(photos, tmp_path):
  """data.batch_size=10**12 on a small folder: one line naming data.batch_size (before, the run started and hung
  building its first batch, with no line)."""
  config = deit_like(photos, tmp_path / 'tfds', batch_size=10**12, shuffle_buffer=16, cache=False)
  workdir = tmp_path / 'run'
  with pytest.raises(config_lib.ConfigError, match=r'batches of .* in flight.* lower data\.batch_size') as e:
    train.train_and_evaluate(config, str(workdir))
  assert '\n' not in str(e.value) and not workdir.exists()
