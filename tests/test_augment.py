"""DeiT / AugReg augmentations: RandAugment's ops against their definitions (PIL's, where PIL has them), its stateless
seeding, random erasing, CutMix and the mixup/CutMix switch, repeated augmentation in the stream, exact resume with
all of them on, and the ImageNet recipes' configs."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from flax import nnx
from PIL import Image, ImageEnhance, ImageOps

import main
from test_data import stream
from vit_jax_lab import config as config_lib, models, tasks
from vit_jax_lab.data import augment, device
from vit_jax_lab.tasks import classification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)


def images(shape=(9, 7, 3), count=6):
  return [RNG.integers(0, 256, shape, dtype=np.uint8) for _ in range(count)]


def ours(fn, image, *args):
  out = fn(tf.constant(image), *args)
  assert out.dtype == tf.uint8 and tuple(out.shape) == image.shape
  return out.numpy()


# --- RandAugment's ops -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'op, pil',
  [
    (augment.autocontrast, ImageOps.autocontrast),
    (augment.equalize, ImageOps.equalize),
    *[(lambda x, b=b: augment.posterize(x, b), lambda im, b=b: ImageOps.posterize(im, b)) for b in (1, 4, 7, 8)],
    *[(lambda x, t=t: augment.solarize(x, t), lambda im, t=t: ImageOps.solarize(im, t)) for t in (0, 100, 256)],
    *[
      (lambda x, f=f, o=o: o(x, f), lambda im, f=f, e=e: e(im).enhance(f))
      for o, e in [
        (augment.color, ImageEnhance.Color),
        (augment.contrast, ImageEnhance.Contrast),
        (augment.brightness, ImageEnhance.Brightness),
        (augment.sharpness, ImageEnhance.Sharpness),
      ]
      for f in (0.0, 0.37, 1.0, 1.9)
    ],
  ],
)
def test_pixel_ops_equal_pil(op, pil):
  """The colour and histogram ops are PIL's (the definitions timm uses and big_vision reimplements), to the bit."""
  for image in images():
    np.testing.assert_array_equal(ours(op, image), np.asarray(pil(Image.fromarray(image))))


def test_pixel_ops_by_hand():
  image = np.array([[0, 1, 127, 128], [129, 200, 254, 255]], np.uint8)[:, :, None]
  np.testing.assert_array_equal(ours(augment.identity, image), image)
  # Solarize inverts exactly the pixels at or above the threshold.
  np.testing.assert_array_equal(ours(augment.solarize, image, 128)[:, :, 0], [[0, 1, 127, 127], [126, 55, 1, 0]])
  # Posterize keeps the top bits: 3 bits are multiples of 32.
  np.testing.assert_array_equal(ours(augment.posterize, image, 3)[:, :, 0], [[0, 0, 96, 128], [128, 192, 224, 224]])
  np.testing.assert_array_equal(ours(augment.posterize, image, 8), image)
  # Autocontrast of a channel spanning [0, 51] spans [0, 255] (x 5); a flat one is kept.
  ramp = np.array([[0, 17, 51]], np.uint8)[:, :, None]
  np.testing.assert_array_equal(ours(augment.autocontrast, ramp)[0, :, 0], [0, 85, 255])
  flat = np.full((2, 2, 1), 7, np.uint8)
  for op in (augment.autocontrast, augment.equalize):
    np.testing.assert_array_equal(ours(op, flat), flat)
  # Brightness 0 is black, 2 doubles and clips; colour leaves a grey image alone.
  np.testing.assert_array_equal(ours(augment.brightness, image, 0.0), 0 * image)
  np.testing.assert_array_equal(ours(augment.brightness, image, 2.0), np.minimum(2 * image.astype(int), 255))
  np.testing.assert_array_equal(ours(augment.color, image, 0.0), image)


@pytest.mark.parametrize('shape', [(6, 6, 3), (7, 7, 1), (8, 8, 2)])
def test_geometric_ops(shape):
  image = RNG.integers(0, 256, shape, dtype=np.uint8)
  # A square rotated by +-90 degrees about its centre is np.rot90 (counterclockwise), pixel for pixel.
  np.testing.assert_array_equal(ours(augment.rotate, image, 90.0), np.rot90(image))
  np.testing.assert_array_equal(ours(augment.rotate, image, -90.0), np.rot90(image, -1))
  np.testing.assert_array_equal(ours(augment.rotate, image, 180.0), np.rot90(image, 2))
  for op in (augment.rotate, augment.shear_x, augment.shear_y, augment.translate_x, augment.translate_y):
    np.testing.assert_array_equal(ours(op, image, 0.0), image)
  # Whole-pixel translations shift the content and fill grey.
  moved = ours(augment.translate_x, image, 2.0)
  np.testing.assert_array_equal(moved[:, 2:], image[:, :-2])
  assert (moved[:, :2] == augment.FILL).all()
  moved = ours(augment.translate_y, image, -3.0)
  np.testing.assert_array_equal(moved[:-3], image[3:])
  assert (moved[-3:] == augment.FILL).all()
  # Shear x by 1: row y is the input's row shifted left by y pixels.
  sheared = ours(augment.shear_x, image, 1.0)
  for y in range(shape[0]):
    np.testing.assert_array_equal(sheared[y, : shape[1] - y], image[y, y:])


def test_magnitude_zero_changes_only_autocontrast_and_equalize():
  image = RNG.integers(30, 200, (32, 32, 3), dtype=np.uint8)  # Enough pixels per level for equalize to act.
  for sign in (-1.0, 1.0):
    for name, fn in zip(augment.OPS, augment._op_fns(0.0, tf.constant(sign))):
      assert np.array_equal(ours(fn, image), image) == (name not in ('autocontrast', 'equalize')), name


def test_magnitude_sets_the_strength():
  """At m = 9: rotations of 27 degrees, solarize above 25.6, 5 bits; ten is the top of the scale."""
  image = RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)
  fns = dict(zip(augment.OPS, augment._op_fns(9.0, tf.constant(-1.0))))
  np.testing.assert_array_equal(ours(fns['rotate'], image), ours(augment.rotate, image, -27.0))
  np.testing.assert_array_equal(ours(fns['solarize'], image), ours(augment.solarize, image, 25.6))
  np.testing.assert_array_equal(ours(fns['posterize'], image), ours(augment.posterize, image, 5))
  np.testing.assert_array_equal(
    ours(fns['contrast'], image), ours(augment.contrast, image, 1 + tf.constant(-1.0) * 0.9 * 0.9)
  )
  np.testing.assert_array_equal(ours(fns['translate_x'], image), ours(augment.translate_x, image, -0.405 * 8))


# --- RandAugment as a whole --------------------------------------------------------------------------------------


def seed(k):
  return tf.constant([7, k], tf.int64)


@pytest.mark.parametrize('channels', [1, 3])
def test_randaugment_is_a_function_of_its_seed(channels):
  image = tf.constant(RNG.integers(0, 256, (8, 8, channels), dtype=np.uint8))
  outs = [augment.randaugment(image, seed(k), 2, 9.0).numpy() for k in range(24)]
  again = [augment.randaugment(image, seed(k), 2, 9.0).numpy() for k in range(24)]
  for a, b in zip(outs, again):
    np.testing.assert_array_equal(a, b)
  distinct = {o.tobytes() for o in outs}
  assert len(distinct) >= 16  # 14 ops x 2 layers x signs: different seeds give different images.
  np.testing.assert_array_equal(augment.randaugment(image, seed(0), 0, 9.0), image)


def test_randaugment_draws_every_op_uniformly():
  """Over many seeds each op is drawn about 1/14 of the time (checked through the op draws themselves)."""
  draws = []
  for k in range(1400):
    layer_seed = tf.random.experimental.stateless_fold_in(seed(k), 0)
    op_seed, _ = tf.unstack(tf.random.experimental.stateless_split(layer_seed, 2))
    draws.append(int(tf.random.stateless_uniform([], op_seed, 0, len(augment.OPS), dtype=tf.int32)))
  counts = np.bincount(draws, minlength=len(augment.OPS))
  assert (np.abs(counts - 100) < 4 * np.sqrt(100)).all(), counts


def test_randaugment_fn_off_is_the_identity_and_on_keeps_float_pixels():
  config = config_lib.base_config()
  image = tf.constant(RNG.uniform(0, 255, (8, 8, 3)), tf.float32)
  assert augment.randaugment_fn(config.data)(image, seed(0)) is image
  config.data.randaugment_layers = 2
  out = augment.randaugment_fn(config.data)(image, seed(0))
  assert out.dtype == tf.float32 and float(tf.reduce_min(out)) >= 0 and float(tf.reduce_max(out)) <= 255
  np.testing.assert_array_equal(out, tf.round(out))  # uint8 values.


def test_random_erasing_in_the_step_is_one_rectangle_per_image_at_its_probability():
  blank = jnp.zeros((300, 16, 16, 3))
  key = jax.random.key(0)
  np.testing.assert_array_equal(device.random_erase(blank, key, 0.0, (-1.0, 1.0)), blank)
  out = np.asarray(device.random_erase(blank[:40], key, 1.0, (-1.0, 1.0)))
  np.testing.assert_array_equal(out, device.random_erase(blank[:40], key, 1.0, (-1.0, 1.0)))
  np.testing.assert_array_equal(out[:5], device.random_erase(blank[:5], key, 1.0, (-1.0, 1.0)))  # Row b: its own.
  areas = []
  for image in out:
    changed = (image != 0).any(-1)
    rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
    if changed.any():  # One rectangle, all channels, inside 2%-1/3 of the area (rounding allowed).
      box = changed[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
      assert box.all() and changed.sum() == box.size
      areas.append(box.size / 256)
  assert len(areas) >= 36 and 0.01 <= min(areas) and max(areas) <= 0.4
  assert len({a for a in areas}) > 10  # Boxes differ from image to image.
  erased = (np.asarray(device.random_erase(blank, key, 0.25, (-1.0, 1.0))) != 0).reshape(300, -1).any(1)
  assert abs(np.mean(erased) - 0.25) < 4 * np.sqrt(0.25 * 0.75 / 300)
  noise = np.asarray(device.random_erase(blank[:40], key, 1.0, (0.0, 4.0)))[out != 0]
  assert abs(noise.mean() - 2.0) < 0.1 and abs(noise.std() - 2.0) < 0.1  # The range's centre, half its width.


# --- The image pipeline ------------------------------------------------------------------------------------------

AUGMENTED = dict(
  data__randaugment_layers=2,
  data__randaugment_magnitude=9.0,
  data__random_erasing=0.25,
  data__flip=True,
  data__crop_padding=1,
)


@pytest.mark.slow
def test_stream_restarts_exactly_with_all_augmentations(smoke_config):
  """Batch k of a stream started at step s is batch s + k of the one started at 0, across epochs, with RandAugment,
  random erasing and repeated augmentation on (every draw is seeded by the example's stream index)."""
  config = smoke_config(
    data__batch_size=48, data__shards=2, data__train_split='train[:200]', data__repeated_augment=3, **AUGMENTED
  )
  full = stream(config, 0, 28)  # 100 examples per shard, 300 copies: an epoch is 12.5 batches of 24 per shard.
  for start in (13, 26):  # 12 copies into the second epoch; 24 into the third.
    for a, b in zip(stream(config, start, 28 - start), full[start:]):
      np.testing.assert_array_equal(a['inputs'], b['inputs'])
      np.testing.assert_array_equal(a['label'], b['label'])
  plain = stream(smoke_config(data__batch_size=48, data__shards=2, data__train_split='train[:200]'), 0, 1)
  assert not np.array_equal(plain[0]['inputs'], full[0]['inputs'])  # The augmentations did something.


def test_randaugment_keeps_the_other_augmentations_draws(smoke_config):
  """Magnitude 0 and layers that only draw identities aside: with RandAugment on, crop, flip and padding draws are the
  ones without it (RandAugment's seed is folded in apart), seen through an op that changes nothing at m = 0."""
  base = dict(data__batch_size=16, data__flip=True, data__crop_padding=1, data__value_range=(0.0, 255.0))
  without = stream(smoke_config(**base), 0, 2)
  with_m0 = stream(smoke_config(data__randaugment_layers=2, data__randaugment_magnitude=0.0, **base), 0, 2)
  same = [np.array_equal(a, b) for x, y in zip(without, with_m0) for a, b in zip(x['inputs'], y['inputs'])]
  # At m = 0 only autocontrast and equalize (2 of 14 ops) change pixels: most images come out identical.
  assert np.mean(same) > 0.5
  for x, y in zip(without, with_m0):
    np.testing.assert_array_equal(x['label'], y['label'])


def test_repeated_augmentation_puts_each_example_r_times_in_its_batch(smoke_config):
  r, batch = 3, 48
  base = dict(data__batch_size=batch, data__shards=1, data__value_range=(0.0, 255.0), data__crop_padding=0)
  plain = np.concatenate([b['inputs'] for b in stream(smoke_config(**base), 0, 3)])
  repeated = stream(smoke_config(data__repeated_augment=r, **base), 0, 3)
  groups = batch // r
  for step, b in enumerate(repeated):
    # Unaugmented, copy k of example j sits at row k * groups + j, and the examples are the plain stream's, in order.
    blocks = b['inputs'].reshape(r, groups, *b['inputs'].shape[1:])
    for k in range(r):
      np.testing.assert_array_equal(blocks[k], plain[step * groups : (step + 1) * groups])
      np.testing.assert_array_equal(b['label'].reshape(r, groups)[k], b['label'][:groups])
  augmented = stream(smoke_config(data__repeated_augment=r, **(base | AUGMENTED)), 0, 3)
  for b in augmented:
    blocks = b['inputs'].reshape(r, groups, -1)
    labels = b['label'].reshape(r, groups)
    assert (labels == labels[0]).all()
    for k in range(1, r):  # Every copy augmented with its own draws.
      assert np.mean([not np.array_equal(blocks[0, j], blocks[k, j]) for j in range(groups)]) > 0.9


def test_repeated_augmentation_needs_whole_groups_per_shard(smoke_config):
  with pytest.raises(config_lib.ConfigError, match='examples per data shard, which does not divide by'):
    stream(smoke_config(data__batch_size=64, data__repeated_augment=3), 0, 1)


# --- CutMix and the switch ---------------------------------------------------------------------------------------


def constant_batch(batch=6, height=8, width=10, frames=()):
  """Example i is all (i + 1): which pixels came from the neighbour is visible."""
  values = jnp.arange(1, batch + 1, dtype=jnp.float32).reshape(batch, *([1] * (len(frames) + 3)))
  return jnp.broadcast_to(values, (batch, *frames, height, width, 3))


@pytest.mark.parametrize('frames', [(), (2,)])
def test_cutmix_lambda_is_the_kept_area(frames):
  x = constant_batch(frames=frames)
  partial = 0
  for k in range(60):
    out, lam, used = classification.mix(x, jax.random.key(k), 0.0, 1.0, 0.5)
    assert bool(used)
    kept = np.asarray(out == x)  # (batch, ..., h, w, c)
    from_neighbour = np.asarray(out == jnp.roll(x, 1, axis=0))
    assert (kept | from_neighbour).all()
    mask = kept[(0,) * (1 + len(frames))][..., 0]
    np.testing.assert_allclose(lam, mask.mean(), atol=1e-6)
    for i in range(x.shape[0]):  # The same box for every example (and frame).
      np.testing.assert_array_equal(kept[i], kept[0])
    cut = ~mask
    if cut.any():  # One rectangle.
      rows, cols = np.flatnonzero(cut.any(1)), np.flatnonzero(cut.any(0))
      assert cut[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].all()
      partial += 0 < lam < 1
  assert partial > 40


def test_cutmix_labels_follow_the_kept_area_and_sum_to_one():
  """Through the task's loss: a model that sees the mixed images and answers log q, q = 1/2 on the example's own
  label and 1/4 on its neighbour's, has loss log 2 * (2 - lambda) exactly when the targets are lambda on the own
  label and 1 - lambda on the neighbour's; lambda measured from the pixels the model was given."""
  num_classes, x = 10, constant_batch(batch=6)
  labels = jnp.arange(6, dtype=jnp.int32)
  q = np.full((6, num_classes), 0.25 / (num_classes - 2))
  q[np.arange(6), labels] = 0.5
  q[np.arange(6), np.roll(labels, 1)] = 0.25
  seen = []

  def model(inputs, train, rngs):
    seen.append(inputs)
    return jnp.log(jnp.asarray(q, jnp.float32))

  task = classification.Classification(cutmix=1.0)
  for k in range(10):
    loss, _ = task.loss(model, {'inputs': x, 'label': labels}, jax.random.key(k), jnp.array(0))
    kept = float(jnp.mean(seen[-1][0] == x[0]))
    np.testing.assert_allclose(loss, np.log(2) * (2 - kept), rtol=1e-5)
  uniform = classification.Classification(cutmix=1.0, mixup=0.8)
  for k in range(10):  # Uniform logits cost log C times the targets' sum.
    loss, _ = uniform.loss(
      lambda i, train, rngs: jnp.zeros((6, num_classes)),
      {'inputs': x, 'label': labels},
      jax.random.key(k),
      jnp.array(0),
    )
    np.testing.assert_allclose(loss, np.log(num_classes), rtol=1e-5)


@pytest.mark.parametrize('switch_prob', [0.0, 0.3, 0.5, 1.0])
def test_switch_probability(switch_prob):
  x, n = constant_batch(batch=4, height=4, width=4), 1000
  used = jax.vmap(lambda k: classification.mix(x, k, 0.8, 1.0, switch_prob)[2])(jax.random.split(jax.random.key(1), n))
  rate = float(jnp.mean(used))
  assert abs(rate - switch_prob) <= 4 * np.sqrt(switch_prob * (1 - switch_prob) / n) + 1e-9, rate
  only_mixup = jax.vmap(lambda k: classification.mix(x, k, 0.8, 0.0, switch_prob)[2])(
    jax.random.split(jax.random.key(2), 50)
  )
  assert not only_mixup.any()


def test_mixup_alone_keeps_its_draws():
  """Adding CutMix changed nothing for mixup-only runs: lambda is Beta(alpha, alpha) drawn from the same key."""
  x, rng = constant_batch(), jax.random.key(3)
  out, lam, used = classification.mix(x, rng, 0.2, 0.0, 0.5)
  expected = jax.random.beta(rng, 0.2, 0.2)
  np.testing.assert_allclose(lam, expected)
  np.testing.assert_allclose(out, expected * x + (1 - expected) * jnp.roll(x, 1, axis=0))
  assert not bool(used) and classification.mix(x, rng, 0.0, 0.0, 0.5) is None


# --- Configs -----------------------------------------------------------------------------------------------------


def build_abstract(c):
  config_lib.validate(c)
  tasks.get(c.task.name)(**{k: v for k, v in c.task.items() if k != 'name'})
  model = nnx.eval_shape(lambda: models.build(c.model, nnx.Rngs(0), num_classes=1000, input_shape=(224, 224, 3)))
  return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize('size, params', [('Ti', 5_717_416), ('S', 22_050_664), ('B', 86_567_656)])
def test_deit_config(size, params):
  c = config_lib.load(os.path.join(ROOT, f'configs/vit/imagenet_deit.py:{size}'))
  assert build_abstract(c) == params  # DeiT's models are the ViT paper's sizes.
  assert (c.data.randaugment_layers, c.data.randaugment_magnitude, c.data.repeated_augment) == (2, 9.0, 3)
  assert (c.task.mixup, c.task.cutmix, c.task.mix_switch_prob, c.task.label_smoothing) == (0.8, 1.0, 0.5, 0.1)
  assert (c.data.random_erasing, c.model.drop_path, c.model.dropout, c.optim.weight_decay) == (0.25, 0.1, 0.0, 0.05)
  assert (c.data.image_size, c.data.resize_size, c.data.inception_crop, c.data.flip) == (224, 256, True, True)
  assert c.optim.lr == pytest.approx(5e-4 * c.data.batch_size / 512) and c.data.batch_size % 3 == 0
  steps_per_epoch = 1_281_167 // c.data.batch_size
  assert (c.total_steps, c.schedule.warmup_steps) == (300 * steps_per_epoch, 5 * steps_per_epoch)
  assert c.optim.lr * c.schedule.end_factor == pytest.approx(1e-5) and c.optim.clip_norm == 0


@pytest.mark.parametrize(
  'arg, layers, magnitude, mixup, reg',
  [
    ('Ti/16', 2, 0.0, 0.0, False),
    ('S/16', 2, 15.0, 0.5, False),
    ('B/16,none', 0, 0.0, 0.0, False),
    ('B/32,medium2,reg', 2, 15.0, 0.5, True),
    ('B/16,strong2,reg', 2, 20.0, 0.8, True),
    ('L/16,light2', 2, 10.0, 0.2, False),
  ],
)
def test_augreg_config(arg, layers, magnitude, mixup, reg):
  c = config_lib.load(os.path.join(ROOT, f'configs/vit/imagenet_augreg.py:{arg}'))
  build_abstract(c)
  assert (c.data.randaugment_layers, c.data.randaugment_magnitude, c.task.mixup) == (layers, magnitude, mixup)
  assert (c.model.dropout, c.model.drop_path) == ((0.1, 0.1) if reg else (0.0, 0.0))
  assert c.model.representation_size == models.vit.decode_variant(c.model.variant)['width']
  assert (c.data.batch_size, c.total_steps, c.schedule.warmup_steps, c.optim.lr) == (4096, 92_897, 10_000, 1e-3)
  assert (c.optim.weight_decay * c.optim.lr, c.optim.clip_norm, c.data.train_split) == (1e-4, 1.0, 'train[:99%]')


@pytest.mark.parametrize(
  'spec, message',
  [
    ('configs/vit/imagenet_deit.py:L', "takes Ti, S or B, got 'L'"),
    ('configs/vit/imagenet_augreg.py:B/16,ultra', 'takes VARIANT[,AUG][,reg]'),
    ('configs/vit/imagenet_augreg.py', 'takes VARIANT[,AUG][,reg]'),
  ],
)
def test_bad_recipe_arguments(spec, message):
  with pytest.raises(config_lib.ConfigError, match=message.replace('[', r'\[').replace(']', r'\]')):
    config_lib.load(os.path.join(ROOT, spec))


@pytest.mark.parametrize(
  'override, message',
  [
    ('data.randaugment_layers=-1', 'data.randaugment_layers=-1 must be >= 0'),
    ('data.randaugment_magnitude=31', 'data.randaugment_magnitude=31.0 must be in [0, 30]'),
    ('data.random_erasing=1.5', 'data.random_erasing=1.5 is a probability'),
    ('data.repeated_augment=0', 'data.repeated_augment=0 must be a positive integer'),
    ('data.repeated_augment=3', 'data.batch_size=128 is 128 examples per data shard, which does not divide by'),
    ('task.cutmix=-1', 'task.cutmix=-1.0 must be >= 0'),
    ('task.mix_switch_prob=2', 'task.mix_switch_prob=2.0 is a probability'),
  ],
)
def test_bad_values_are_one_line(override, message, data_dir, tmp_path, capsys):
  workdir = str(tmp_path / 'run')
  argv = ['--config', os.path.join(ROOT, 'configs/vit/digits.py'), '--workdir', workdir]
  assert main.main([*argv, f'--config.data.data_dir={data_dir}', f'--config.{override}']) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1, err
  assert message in err
  assert not os.path.exists(workdir)
