"""The augmentations that data.augment_on='device' runs in the jitted step: each device op against its host twin
(augment.py's RandAugment ops, images.color_augment's colour changes: TensorFlow) on the same parameters, the
per-example draws, 1 vs 8 devices, and a host that then leaves them to the device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import load_config
from test_input_path import photos, stream  # noqa: F401 (photos: the fixture)
from vit_jax_lab import config as config_lib
from vit_jax_lab.data import augment, device, images, pil_images
from vit_jax_lab.errors import ConfigError

RNG = np.random.default_rng(1)


def sample_images():
  """Noise (every level, hard edges), a smooth gradient, a flat image and one of two levels (equalize's step 0)."""
  h, w, rng = 13, 11, np.random.default_rng(0)
  ys, xs = np.mgrid[0:h, 0:w]
  smooth = np.stack([xs * 20, ys * 18, (xs + ys) * 9], -1).clip(0, 255).astype(np.uint8)
  return [
    rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
    rng.integers(40, 200, (h, w, 3), dtype=np.uint8),
    smooth,
    np.full((h, w, 3), 77, np.uint8),
    np.where(rng.random((h, w, 1)) < 0.5, 10, 200).astype(np.uint8).repeat(3, -1),
    rng.integers(0, 256, (h, w, 1), dtype=np.uint8),
  ]


@pytest.mark.parametrize('magnitude', [0.0, 4.0, 9.0, 20.0])
@pytest.mark.parametrize('op', device.RANDAUGMENT_OPS)
def test_each_randaugment_op_on_the_device_equals_the_host_op(op, magnitude):
  """Every op at both signs on the same images: the host's TensorFlow op and the device's layer (lookup table, blend
  and warp in one) give the same pixels, but for autocontrast's exact integers (PIL's and TensorFlow's float64
  falls below some whole numbers: a level, at a few percent of pixels), and bilinear samples, lumas and means
  rounded at a half the other way (a level, at most 3 pixels of 143)."""
  assert device.RANDAUGMENT_OPS == augment.OPS
  index = device.RANDAUGMENT_OPS.index(op)
  layer = jax.jit(device.randaugment_layer, static_argnums=3)
  for sign in (-1.0, 1.0):
    host_op = augment._op_fns(magnitude, tf.constant(sign))[index]
    for image in sample_images():
      host = host_op(tf.constant(image)).numpy()
      ours = np.asarray(layer(jnp.asarray(image), jnp.int32(index), jnp.float32(sign), magnitude))
      assert ours.dtype == np.uint8 and ours.shape == image.shape
      diff = np.abs(ours.astype(int) - host.astype(int))
      assert diff.max() <= 1, (op, sign, diff.max())
      assert (diff > 0).mean() <= (0.05 if op == 'autocontrast' else 0.03), (op, sign, (diff > 0).mean())


def layer_ops(key, b):
  """The RandAugment ops of image b's two layers (device.randaugment's draws)."""
  return jnp.stack(
    [
      jax.random.randint(jax.random.split(jax.random.fold_in(jax.random.fold_in(key, b), layer))[0], (), 0, 14)
      for layer in (0, 1)
    ]
  )


def test_randaugment_draws_each_op_uniformly_per_image_and_layer():
  """The op of image b's layer l comes from fold_in(fold_in(key, b), l): 14 ops about equally often over 2,000
  images, and the two layers of an image independent (as often equal as chance says)."""
  drawn = np.asarray(jax.jit(jax.vmap(lambda b: layer_ops(jax.random.key(0), b)))(jnp.arange(2000)))
  counts = np.bincount(drawn[:, 0], minlength=14)
  assert counts.min() > 2000 / 14 * 0.7 and counts.max() < 2000 / 14 * 1.3
  assert abs((drawn[:, 0] == drawn[:, 1]).mean() - 1 / 14) < 0.03


def test_randaugment_of_an_image_is_its_layers_in_a_row():
  """device.randaugment applies, to image b, the layers its draws name, in order (the ops checked above)."""
  images = jnp.asarray(np.stack([sample_images()[i] for i in (0, 1, 2, 0)]))
  key = jax.random.key(4)
  out = np.asarray(jax.jit(device.randaugment, static_argnums=(2, 3))(images, key, 2, 9.0))
  for b in range(4):
    image = images[b]
    for layer in range(2):
      op_key, sign_key = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, b), layer))
      op = jax.random.randint(op_key, (), 0, 14)
      sign = jnp.where(jax.random.uniform(sign_key) < 0.5, -1.0, 1.0)
      image = device.randaugment_layer(image, op, sign, 9.0)
    assert (out[b] != np.asarray(image)).mean() < 0.02  # One program and another: a half rounded apart, rarely.
  assert not np.array_equal(out[0], out[3])  # Same image, other row: other draws.


@pytest.mark.parametrize('channels', [3, 1])
def test_colour_jitter_on_the_device_equals_tensorflows(channels):
  """images.color_augment's changes (tf.image's brightness, saturation, contrast, hue) and dm-pix's, on the same
  parameters, for images and clips (contrast about each frame's mean): within float32 rounding, less than a level."""
  for shape in ((13, 11, channels), (3, 9, 7, channels)):
    x = RNG.integers(0, 256, shape).astype(np.float32)
    for brightness, saturation, contrast, hue in [(0.1, 1.3, 0.7, 0.15), (-0.12, 0.6, 1.4, -0.2), (0.0, 1.0, 1.0, 0.0)]:
      t = tf.image.adjust_brightness(tf.constant(x) / 255.0, brightness)
      if channels == 3:
        t = tf.image.adjust_saturation(t, saturation)
      t = tf.image.adjust_contrast(t, contrast)
      if channels == 3:
        t = tf.image.adjust_hue(t, hue)
      host = (tf.clip_by_value(t, 0.0, 1.0) * 255.0).numpy()
      ours = np.asarray(device.color_jitter(jnp.asarray(x), brightness, saturation, contrast, hue))
      np.testing.assert_allclose(ours, host, atol=0.05)


def test_colour_augment_and_flip_draw_per_example_at_their_probability():
  x = jnp.asarray(RNG.integers(0, 256, (400, 2, 4, 5, 3), dtype=np.uint8))  # Clips of 2 frames.
  key = jax.random.key(2)
  flipped = np.asarray(device.flip(x, key))
  mirrored = (flipped == np.asarray(x)[:, :, :, ::-1]).all(axis=(1, 2, 3, 4))
  kept = (flipped == np.asarray(x)).all(axis=(1, 2, 3, 4))
  assert (mirrored ^ kept).all() and 0.4 < mirrored.mean() < 0.6  # Whole clips, both frames alike.
  grey = np.asarray(device.color_augment(x, key, 0.0, 0.3))
  greyed = (grey[..., 0] == grey[..., 1]).all(axis=(1, 2, 3)) & (grey[..., 1] == grey[..., 2]).all(axis=(1, 2, 3))
  assert 0.22 < greyed.mean() < 0.38 and (grey[~greyed] == np.asarray(x)[~greyed]).all()
  jittered = np.asarray(device.color_augment(x, key, 0.5, 0.0))
  changed = (jittered != np.asarray(x)).any(axis=(1, 2, 3, 4))
  assert 0.4 < changed.mean() < 0.6


def augmenting_config(data_dir, **data):
  config = load_config('configs/vit/digits.py:smoke', str(data_dir))
  config.data.update(
    dict(augment_on='device', flip=True, randaugment_layers=2, color_augment=0.8, color_drop=0.2, random_erasing=0.25)
  )
  config.data.update(data)
  return config


def test_the_steps_augmentation_is_the_same_on_1_and_8_devices(tmp_path):
  """Row b of a step draws from fold_in(step key, b), and the ops' constants are worked out outside the step
  (device.op_parameters), so the augmented batch does not depend on how it is sharded: equal under the suite's XLA
  flags (conftest: LLVM's optimisations off). Optimised, XLA may fuse a multiply-add in a program of 64 rows and not
  in one of 8: measured on 4 batches, 0.1-0.7% of the pixels of 5-8 rows of 64 a level or two apart."""
  config = augmenting_config(tmp_path)
  batch = {'inputs': jnp.asarray(RNG.integers(0, 256, (64, 16, 16, 3), dtype=np.uint8)), 'label': jnp.arange(64)}
  key = jax.random.key(7)
  fn = jax.jit(lambda b, k: device.train_inputs(b, config.data, k))
  one = np.asarray(fn(batch, key)['inputs'])
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('data',))
  spread = jax.device_put(batch, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')))
  eight = fn(spread, key)['inputs']
  assert len(eight.sharding.device_set) == 8
  np.testing.assert_array_equal(one, np.asarray(eight))
  # Windows the step resizes first (data.canvas): 20x20 canvases holding windows of 12-20 pixels a side. The resize
  # sums exactly (fixed point), so its pixels are the same on 1 and 8 devices; RandAugment is left out here, as its
  # own float blends of these pixels round a level apart at rare ties.
  config.data.image_size, config.data.randaugment_layers = 16, 0
  sides = RNG.integers(12, 21, (64, 2)).astype(np.float32)
  params = np.concatenate([sides, 16 / sides, np.zeros((64, 2)), np.maximum(sides / 16, 1)], 1).astype(np.float32)
  windows = dict(batch, inputs=jnp.asarray(RNG.integers(0, 256, (64, 20, 20, 3), dtype=np.uint8)), resize=params)
  one = np.asarray(fn(windows, key)['inputs'])
  eight = fn(jax.device_put(windows, spread['label'].sharding), key)['inputs']
  assert one.shape == (64, 16, 16, 3)
  np.testing.assert_array_equal(one, np.asarray(eight))
  config.data.augment_on = 'host'  # The same step with the host's augmentation: only scaled and erased.
  plain = np.asarray(jax.jit(lambda b, k: device.train_inputs(b, config.data, k))(batch, key)['inputs'])
  assert (np.abs(one - plain) > 0.01).mean() > 0.3


@pytest.mark.parametrize('crop', ['inception_crop', 'resize_size'])
def test_with_augment_on_device_the_host_only_decodes_and_cuts_the_window(photos, tmp_path, crop):  # noqa: F811
  """The host's batches with data.augment_on='device' are each crop's source window in its canvas and the resize's
  parameters; resized in the step they are the host-resized crops of the same recipe without flip, RandAugment and
  colours (its draws unchanged), to a level (the device resizes in fixed point: at a few percent of pixels)."""
  common = dict(name=f'folder:{photos}', image_size=16, batch_size=8, shuffle_buffer=7, random_erasing=0.0)
  common |= dict(crop_padding=0)
  common |= dict(inception_crop=True) if crop == 'inception_crop' else dict(resize_size=20, scale_jitter=(0.9, 1.33))
  device_side = stream(augmenting_config(tmp_path, canvas=2.0 if crop == 'inception_crop' else 1.25, **common), 0, 2)
  plain = stream(
    augmenting_config(
      tmp_path, augment_on='host', flip=False, randaugment_layers=0, color_augment=0.0, color_drop=0.0, **common
    ),
    0,
    2,
  )
  augmented = stream(augmenting_config(tmp_path, augment_on='host', **common), 0, 2)
  for a, b, c in zip(device_side, plain, augmented):
    canvas = (32, 32) if crop == 'inception_crop' else (20, 20)
    assert a['inputs'].shape == (8, *canvas, 3) and a['resize'].shape == (8, 8)
    resized = np.asarray(jax.jit(device.resize_windows, static_argnums=2)(a['inputs'], a['resize'], (16, 16)))
    diff = np.abs(resized.astype(int) - b['inputs'].astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.05, (diff.max(), (diff > 0).mean())
    assert not np.array_equal(b['inputs'], c['inputs'])


@pytest.mark.parametrize('antialias', [True, False])
def test_a_window_resized_on_the_device_is_the_hosts_resized_crop(antialias):
  """images.window's canvas and parameters, resized by device.resize_windows, against the host's resized_crop
  (tf.raw_ops.ScaleAndTranslate) of the same crop: shrinking and growing, windows that fit their canvas and ones
  resized on the host instead, images and two-frame clips; a level apart at a few percent of pixels (fixed point). And
  pil_images.window (grain) against PIL's box resize, a level apart (PIL's 8-bit fixed point)."""
  rng, resize = np.random.default_rng(0), jax.jit(device.resize_windows, static_argnums=2)
  fits = 0
  for _ in range(40):
    shape = (*rng.integers(1, 3, 1), *rng.integers(20, 90, 2), 3)
    image = tf.constant(np.asarray(RNG.integers(0, 256, shape), np.uint8))
    image = image[0] if shape[0] == 1 else image
    size = tuple(int(v) for v in rng.integers(16, 130, 2))
    corner = tuple(int(rng.integers(0, s - 16 + 1)) for s in size)
    host = images.pixels(images.resized_crop(image, size, corner, (16, 16), antialias)).numpy()
    canvas, params = (x.numpy() for x in images.window(image, size, corner, (16, 16), antialias, (24, 24)))
    assert canvas.shape == (*image.shape[:-3], 24, 24, 3) and params.shape == (8,)
    fits += (params[2:4] != 1).any()
    ours = np.asarray(resize(canvas[None], params[None], (16, 16)))[0]
    diff = np.abs(ours.astype(int) - host.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.05, (diff.max(), (diff > 0).mean())
  assert 10 < fits < 38  # Both branches ran.
  for _ in range(20):
    photo = Image.fromarray(np.asarray(RNG.integers(0, 256, (*rng.integers(20, 90, 2), 3)), np.uint8))
    box = pil_images.inception_box(photo.width, photo.height, rng)
    host = np.asarray(pil_images.resize(photo, (16, 16), antialias, box))
    if not antialias:  # As pil_images.preprocess_fn hands it over: the crop alone.
      photo, box = photo.crop(box), (0, 0, box[2] - box[0], box[3] - box[1])
    canvas, params = pil_images.window(np.asarray(photo), box, (16, 16), antialias, (32, 32))
    ours = np.asarray(resize(canvas[None], params[None], (16, 16)))[0]
    assert np.abs(ours.astype(int) - host.astype(int)).max() <= 1


def smooth_image(rows: int, cols: int) -> np.ndarray:
  ys, xs = np.mgrid[0:rows, 0:cols]
  return np.stack([xs * 200 / cols, ys * 200 / rows, (xs + ys) * 100 / (rows + cols)], -1).astype(np.uint8)


def test_a_canvas_smaller_than_the_crop_enlarges_on_the_device():
  """data.canvas < 1 (small images enlarged, as CIFAR's to 384): a window that fits is enlarged on the device as
  the host would, a level apart; one larger than the canvas is shrunk into it on the host and enlarged back, near
  the host's crop (a smooth gradient of about 4 levels a pixel: a mean under a level, at most 6 at the edges,
  where the round trip loses half a pixel). TensorFlow's images.window and grain's pil_images.window."""
  resize, crop, canvas = jax.jit(device.resize_windows, static_argnums=2), (48, 40), (20, 18)
  for rows, cols in ((12, 10), (17, 15), (60, 52)):
    image = smooth_image(rows, cols)
    host = images.pixels(images.resized_crop(tf.constant(image), (48, 40), (0, 0), crop, False)).numpy()
    window, params = (x.numpy() for x in images.window(tf.constant(image), (48, 40), (0, 0), crop, False, canvas))
    ours = np.asarray(resize(window[None], params[None], crop))[0]
    fits = rows <= canvas[0] and cols <= canvas[1]
    diff = np.abs(ours.astype(int) - host.astype(int))
    assert diff.max() <= (1 if fits else 6) and diff.mean() < 1, (rows, cols, diff.max(), diff.mean())
    photo = Image.fromarray(image)
    host = np.asarray(pil_images.resize(photo, crop[::-1], False))
    window, params = pil_images.window(image, (0, 0, cols, rows), crop, False, canvas)
    ours = np.asarray(resize(window[None], params[None], crop))[0]
    diff = np.abs(ours.astype(int) - host.astype(int))
    assert diff.max() <= (1 if fits else 6) and diff.mean() < 1, (rows, cols, diff.max(), diff.mean())
    assert (params[2:4] > 1).all() and params[0] <= canvas[0] and params[1] <= canvas[1]


def test_a_canvas_needs_the_device_an_image_size_and_no_padding(tmp_path):
  """data.canvas is the device's resize: with the host's augmentation, no image_size or crop_padding it would do
  nothing, so it is one line naming the three."""
  for data in (dict(augment_on='host'), dict(image_size=None), dict(crop_padding=2)):
    config = augmenting_config(tmp_path, canvas=2.0, **data)
    with pytest.raises(ConfigError, match=r'data.canvas=2.0 has the jitted step resize training crops: it needs'):
      config_lib.validate(config)
  for canvas in (-1.0, 8.5):
    with pytest.raises(ConfigError, match=f'data.canvas={canvas} must be 0'):
      config_lib.validate(augmenting_config(tmp_path, canvas=canvas, crop_padding=0, image_size=16))
  config_lib.validate(augmenting_config(tmp_path, canvas=0.25, crop_padding=0, image_size=16))


def symmetry(out: np.ndarray, x: np.ndarray, ops: dict) -> str:
  """The name of the one op of `ops` that takes x to out (random images: at most one does)."""
  names = [name for name, op in ops.items() if np.array_equal(op(x), out)]
  assert len(names) == 1, names
  return names[0]


TURNS = {k: (lambda x, k=k: np.rot90(x, k, axes=(-3, -2))) for k in range(4)}


def recolouring(out: np.ndarray, x: np.ndarray) -> tuple[tuple[int, ...], bool]:
  """(order, inverted) of data.recolor's map from x to out, which it checks: each output channel an affine map of
  one input channel (to rounding), all with gains of one sign and sizes in images.RECOLOR_SCALE, offsets within
  RECOLOR_SHIFT (of the inverted channel, 255 - x, where the gain is negative)."""
  x, out = x.reshape(-1, 3).astype(np.float64), out.reshape(-1, 3).astype(np.float64)
  order, gains = [], []
  for c in range(3):
    fits = [np.polyfit(x[:, k], out[:, c], 1) for k in range(3)]
    residuals = [np.abs(np.polyval(f, x[:, k]) - out[:, c]).max() for k, f in enumerate(fits)]
    k = int(np.argmin(residuals))
    assert residuals[k] <= 1.0 and sorted(residuals)[1] > 5, residuals  # Rounding, fitted by least squares.
    gain, offset = fits[k]
    offset = offset + 255 * gain if gain < 0 else offset  # As a map of 255 - x.
    assert 0.6 - 0.03 <= abs(gain) <= 1.4 + 0.03 and abs(offset) <= 40 + 4, (gain, offset)  # Fitted to rounded pixels.
    order.append(k)
    gains.append(gain)
  assert sorted(order) == [0, 1, 2] and len({g > 0 for g in gains}) == 1
  return tuple(order), gains[0] < 0


def test_quarter_turns_and_recolouring_draw_every_symmetry_alike_on_the_host_the_device_and_grain():
  """data.rotate90 turns each training image by one of 4 quarters; data.recolor maps its channels, in one of 6
  orders, inverted or not, each through its own gain and offset: every example is exactly one of these, each order
  and inversion drawn about equally often, by TensorFlow, in the jitted step and by the grain backend's NumPy;
  recolor=0.5 leaves about half as they were. The colours lie in 105-150, which no gain and offset clips, inverted
  or not."""
  n = 240
  x = RNG.integers(105, 151, (n, 6, 6, 3), dtype=np.uint8)
  seeds = [tf.constant([i, 3], tf.int64) for i in range(n)]
  host_turns = [images.rotate90(tf.constant(x[i]), seeds[i]).numpy() for i in range(n)]
  host_colours = [images.pixels(images.recolor(tf.constant(x[i], tf.float32), seeds[i], 1.0)).numpy() for i in range(n)]
  key = jax.random.key(4)
  device_turns = np.asarray(device.rotate90(jnp.asarray(x), key))
  device_colours = np.asarray(device.recolor(jnp.asarray(x), key, 1.0))
  config = load_config('configs/vit/digits.py:smoke', '/unused')
  config.data.update(image_size=6, crop_padding=0, rotate90=True, recolor=0.0)
  turn_fn = pil_images.preprocess_fn(config.data, (6, 6, 3), train=True)
  grain_turns = [turn_fn(x[i], np.random.default_rng(i)) for i in range(n)]
  config.data.update(rotate90=False, recolor=1.0)
  colour_fn = pil_images.preprocess_fn(config.data, (6, 6, 3), train=True)
  grain_colours = [colour_fn(x[i], np.random.default_rng(i)) for i in range(n)]
  for turns, colours in [(host_turns, host_colours), (device_turns, device_colours), (grain_turns, grain_colours)]:
    drawn = [symmetry(turns[i], x[i], TURNS) for i in range(n)]
    assert sorted(set(drawn)) == [0, 1, 2, 3] and max(drawn.count(k) for k in TURNS) < n / 4 * 1.5
    drawn = [recolouring(np.asarray(colours[i]), x[i]) for i in range(n)]
    assert len(set(drawn)) == 12 and max(drawn.count(k) for k in set(drawn)) < n / 12 * 2
  half = np.asarray(device.recolor(jnp.asarray(x), key, 0.5))
  kept = (half == x).all(axis=(1, 2, 3)).mean()
  assert 0.4 < kept < 0.6
  config.data.update(rotate90=True, recolor=1.0)
  eval_fn = pil_images.preprocess_fn(config.data, (6, 6, 3), train=False)
  np.testing.assert_array_equal(eval_fn(x[0], None), x[0])  # Evaluation is never turned nor recoloured.


def test_quarter_turns_need_square_images_and_recolor_is_a_probability(tmp_path):
  config = augmenting_config(tmp_path, rotate90=True)
  config.data.image_size = None
  with pytest.raises(ConfigError, match=r'data.rotate90=True turns images a quarter.*set data.image_size'):
    config_lib.validate(config)
  config = augmenting_config(tmp_path, recolor=1.5)
  with pytest.raises(ConfigError, match=r'data.recolor=1.5 is a probability'):
    config_lib.validate(config)
  config = augmenting_config(tmp_path, inception_min_area=0.0)
  with pytest.raises(ConfigError, match=r'data.inception_min_area=0.0 is a share of the image'):
    config_lib.validate(config)


def test_the_inception_crops_smallest_area_is_the_configs_on_both_backends():
  """data.inception_min_area bounds the crops' area on tf.data and grain; at 1 the crop is the whole image, so a
  training image equals the evaluation one."""
  shape = tf.constant([40, 50, 3])
  areas = {}
  for min_area in (0.05, 0.3):
    tf_areas = [
      np.prod(images.inception_box(shape, tf.constant([i, 0], tf.int64), min_area)[1].numpy()) / 2000
      for i in range(200)
    ]
    rng = np.random.default_rng(0)
    boxes = [pil_images.inception_box(50, 40, rng, min_area) for _ in range(200)]
    pil_areas = [(r - left) * (b - t) / 2000 for left, t, r, b in boxes]
    areas[min_area] = (min(tf_areas), min(pil_areas))
  assert all(a >= 0.3 - 0.02 for a in areas[0.3]) and all(a < 0.2 for a in areas[0.05])
  config = load_config('configs/vit/digits.py:smoke', '/unused')
  config.data.update(image_size=16, crop_padding=0, inception_crop=True, inception_min_area=1.0)
  picture = RNG.integers(0, 256, (20, 20, 3), dtype=np.uint8)
  data = tf.io.encode_png(picture)
  tf_train = images.preprocess_fn(config.data, (16, 16, 3), train=True)(data, tf.constant([1, 2], tf.int64))
  tf_eval = images.preprocess_fn(config.data, (16, 16, 3), train=False)(data, tf.constant([1, 2], tf.int64))
  np.testing.assert_array_equal(tf_train.numpy(), tf_eval.numpy())
  png = data.numpy()
  pil_train = pil_images.preprocess_fn(config.data, (16, 16, 3), train=True)(png, np.random.default_rng(3))
  np.testing.assert_array_equal(pil_train, pil_images.preprocess_fn(config.data, (16, 16, 3), train=False)(png, None))
