"""The built-in digits dataset and the input pipeline's determinism."""

import collections

import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax_lab import parallel
from vit_jax_lab.data import device, images, info as data_info, labels, pipeline
from vit_jax_lab.data.labels import preprocess_fn


def test_digits_builder_split_sizes_and_values(data_dir):
  builder = tfds.builder('digits', data_dir=data_dir)
  assert builder.info.splits['train'].num_examples == 1437
  assert builder.info.splits['test'].num_examples == 360
  for split, n in (('train', 1437), ('test', 360)):
    data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
    assert data['image'].shape == (n, 8, 8, 1) and data['image'].dtype == np.uint8
    assert data['image'].min() == 0 and data['image'].max() == 255
    assert set(data['label'].tolist()) == set(range(10))
  # The split is the documented one: example i of scikit-learn's order is a test example when i % 5 == 0.
  from sklearn.datasets import load_digits

  digits = load_digits()
  test = tfds.as_numpy(builder.as_dataset(split='test', batch_size=-1, shuffle_files=False))
  expected = np.round(digits.images[::5] * 255 / 16).astype(np.uint8)
  assert sorted(map(bytes, test['image'][..., 0])) == sorted(map(bytes, expected))


def test_preprocessing_value_range(smoke_config):
  config = smoke_config(data__value_range=(0.0, 1.0), data__crop_padding=2, data__flip=True)
  _, info = pipeline.load(config.data, data_info.label_info)
  fn = preprocess_fn(config.data, info, train=True)
  image = tf.constant(np.full((8, 8, 1), 255, np.uint8))
  out = fn({'image': image, 'label': 3}, tf.constant([0, 7], tf.int64))
  assert out['inputs'].shape == (8, 8, 1) and out['inputs'].dtype == tf.uint8  # Pixels, scaled in the step.
  scaled = np.asarray(device.eval_inputs({'inputs': out['inputs'].numpy()}, config.data)['inputs'])
  assert scaled.dtype == np.float32 and scaled.max() == 1.0
  assert scaled.min() == 0.0  # The padding came into the crop at this seed.


def test_resize_small_then_central_crop_keeps_the_aspect_ratio(smoke_config):
  """data.resize_size: the shorter side to resize_size, then the centre (evaluation); without it, a squash."""
  ramp = np.tile((np.arange(16) * 16).astype(np.uint8), (8, 1))[..., None]  # 8 x 16, brighter to the right.
  config = smoke_config(data__image_size=4, data__resize_size=4, data__value_range=(0.0, 255.0))
  cropped = images.preprocess_fn(config.data, (4, 4, 1), train=False)(ramp, tf.zeros([2], tf.int64)).numpy()
  expected = tf.image.resize(ramp.astype(np.float32), (4, 8), antialias=True).numpy()[:, 2:6]
  np.testing.assert_allclose(cropped, expected, rtol=1e-6)
  config = smoke_config(data__image_size=4, data__value_range=(0.0, 255.0))
  squashed = images.preprocess_fn(config.data, (4, 4, 1), train=False)(ramp, tf.zeros([2], tf.int64)).numpy()
  assert squashed.min() < cropped.min() and cropped.max() < squashed.max()  # The crop lost both ends of the ramp.
  train = smoke_config(data__image_size=4, data__resize_size=5, data__value_range=(0.0, 255.0))
  crops = {
    images.preprocess_fn(train.data, (4, 4, 1), train=True)(ramp, tf.constant([0, s], tf.int64)).numpy().tobytes()
    for s in range(10)
  }
  assert len(crops) > 1  # Training crops at random.


def stream(config, start_step, num_batches):
  builder, info = pipeline.load(config.data, data_info.label_info)
  sharding = jax.sharding.NamedSharding(parallel.make_mesh(config.mesh), parallel.BATCH)
  it = pipeline.train_iterator(
    builder,
    config.data,
    preprocess_fn(config.data, info, train=True),
    sharding,
    seed=config.seed,
    start_step=start_step,
    prepare=labels.prepare_fn(info),
  )
  return [jax.device_get(next(it)) for _ in range(num_batches)]


def test_train_stream_restarts_exactly_at_any_step(smoke_config):
  """Batch k of a stream started at step s is batch s + k of the stream started at 0, across epochs."""
  config = smoke_config(
    data__batch_size=128, data__flip=True, data__crop_padding=1, data__shards=2, data__color_augment=0.8
  )
  full = stream(config, 0, 26)  # 1,437 examples: an epoch is ~11 batches of 128.
  for start in (9, 13):
    for a, b in zip(stream(config, start, 26 - start), full[start:]):
      np.testing.assert_array_equal(a['inputs'], b['inputs'])
      np.testing.assert_array_equal(a['label'], b['label'])
  other_seed = stream(smoke_config(data__batch_size=128, seed=1), 0, 1)
  assert not np.array_equal(other_seed[0]['label'], full[0]['label'])


def test_each_epoch_is_a_permutation(smoke_config):
  config = smoke_config(data__batch_size=16, data__crop_padding=0, data__value_range=(0.0, 255.0))
  batches = stream(config, 0, 2 * 1437 // 16)  # Two epochs, less the remainders.
  images = np.concatenate([b['inputs'] for b in batches]).round().astype(np.uint8)
  train = tfds.as_numpy(pipeline.load(config.data, data_info.label_info)[0].as_dataset(split='train', batch_size=-1))[
    'image'
  ]
  first, second = images[: 1437 // 16 * 16], images[1437:]
  full = collections.Counter(map(bytes, train))
  for epoch in (first, second):  # No example of an epoch appears more often than in the split.
    assert not collections.Counter(map(bytes, epoch)) - full
  assert not np.array_equal(first[:64], second[:64])  # Reshuffled.
