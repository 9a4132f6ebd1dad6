"""Input pipelines: TFDS + tf.data on the host, handed to JAX as global sharded arrays.

The `data.*` config keys are defined here, one pair of functions per part of the package (its keys with their
defaults and meaning, then their checks): the dataset and its batches (pipeline.py), images (images.py, augment.py),
videos (videos.py), text (text.py) and tracking (tracking.py). They live here rather than in those modules because
those import TensorFlow (about 5 s): this file imports nothing heavy, so a config mistake is reported in a second.
"""

import math
import os
from typing import Callable

import jax
import ml_collections
from ml_collections import config_dict

from vit_jax_lab import hosts
from vit_jax_lab.data import info
from vit_jax_lab.errors import check

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's C++ start-up chatter, when a module loads it.


BACKENDS = ('tfdata', 'grain')
WORKER_BYTES = 300 * 2**20  # A grain worker process's resident memory (measured: about 270 MB).
AUGMENT_ON = ('host', 'device')
RECOLOR_SCALE, RECOLOR_SHIFT = (0.6, 1.4), 40.0  # data.recolor's per-channel gain and offset (levels).
JPEG_PNG = (b'\xff\xd8', b'\x89PNG')  # The starts of the image files read (JPEG and PNG).
# Set (truthy): refused on grain; the colours only with data.augment_on='host' (the device makes them).
GRAIN_UNSUPPORTED = ('color_augment', 'color_drop', 'token_budget')


def whole_crop(crop: tuple[int, int], canvas: tuple[int, int]) -> tuple[tuple[int, int], tuple[float, ...]]:
  """The size a crop resized on the host travels at (`crop`, or less where the canvas is smaller: small images
  enlarged, data.canvas < 1) and the resize parameters (images.window_box's) that enlarge it back in the step:
  plain bilinear, no shift."""
  fits = min(crop[0], canvas[0]), min(crop[1], canvas[1])
  return fits, (*fits, crop[0] / fits[0], crop[1] / fits[1], 0.0, 0.0, 1.0, 1.0)


def device_canvas(
  d: ml_collections.ConfigDict, height: int, width: int, train: bool, source: tuple[int, int] | None = None
) -> tuple[int, int] | None:
  """(height, width) of the uint8 canvas a training crop's source window travels in when the jitted step resizes it
  (data.canvas, with data.augment_on='device', a data.image_size and no crop_padding; images.window), never more
  than the images' own `source` size where all share one; None: the host resizes."""
  if not train or not d.canvas or d.augment_on != 'device' or d.image_size is None or d.crop_padding:
    return None
  if not (d.inception_crop or d.resize_size is not None):
    return None
  canvas = math.ceil(d.canvas * height), math.ceil(d.canvas * width)
  return canvas if source is None else (min(canvas[0], source[0]), min(canvas[1], source[1]))


def dataset_keys() -> dict:
  """What is read and how it is batched (pipeline.py)."""
  return dict(
    name='digits',  # A TFDS dataset name: a built-in one (data/builders), folder:PATH, or any in data_dir.
    data_dir=config_dict.placeholder(str),  # TFDS data_dir; None: TFDS's default (~/tensorflow_datasets).
    train_split='train',  # TFDS split syntax, e.g. 'train[:90%]'.
    eval_split='test',
    batch_size=128,  # Global train batch, over all devices and hosts.
    eval_batch_size=256,  # Global eval batch; the last one is padded and masked.
    # Examples in the shuffle buffer of each data shard (re-seeded every epoch); images and videos are held as their
    # files. A run whose buffers would not fit the host's memory is refused before it starts.
    shuffle_buffer=50_000,
    # tf.data: keep the read examples in memory, for small datasets: images as their files, or decoded where their
    # pixels take at most twice a record's bytes (CIFAR's; pipeline.pixels_fit).
    cache=False,
    # Input shards, each a disjoint part of the split with its own stream; -1: one per process. Fix it (to a
    # multiple of the process count) to get the same batches on any host count.
    shards=-1,
    # How batches are made. 'tfdata': TFDS and tf.data (pipeline.py), for every dataset and task. 'grain': grain
    # over an ArrayRecord copy of the prepared dataset, made once beside it (grain_input.py), with NumPy and PIL
    # preprocessing: image classification only, and no TensorFlow in the run (docs/data.md). The two draw
    # different shuffles and augmentations, so a resumed run keeps its backend.
    backend='tfdata',
    workers=0,  # grain: processes that make batches (0: this process, with threads); the batches are the same.
  )


def check_dataset(d: ml_collections.ConfigDict) -> None:
  check(d.name.strip() != '', 'data.name is empty: name a TFDS dataset, e.g. digits')
  # The eval batch first: tools.evaluate runs with data.batch_size set to it, and a bad one is the user's eval key.
  check(d.eval_batch_size > 0, f'data.eval_batch_size={d.eval_batch_size} must be positive')
  check(d.batch_size > 0, f'data.batch_size={d.batch_size} must be positive')
  check(d.shuffle_buffer > 0, f'data.shuffle_buffer={d.shuffle_buffer} must be positive (1: no shuffling)')
  check(d.shards == -1 or d.shards > 0, f'data.shards={d.shards} must be -1 (one per process) or positive')
  check(d.backend in BACKENDS, f'data.backend={d.backend!r} is not one of {", ".join(map(repr, BACKENDS))}')
  check(d.workers >= 0, f'data.workers={d.workers} must be >= 0 (0: batches are made in this process)')
  cores = os.cpu_count() or 1
  check(
    d.workers <= cores,
    f'data.workers={d.workers} is more than the {cores} cores of this host: use at most {cores} (each is a process)',
  )
  room = hosts.available_memory()
  check(
    room is None or d.workers * WORKER_BYTES <= room,
    f'data.workers={d.workers} would take about {d.workers * WORKER_BYTES / 2**30:.1f} GiB '
    f'(~{WORKER_BYTES // 2**20} MiB each), more than the {(room or 0) / 2**30:.1f} GiB this host has free: use fewer',
  )
  if d.backend == 'grain':
    on_device = ('color_augment', 'color_drop') if d.augment_on == 'device' else ()
    unsupported = [k for k in GRAIN_UNSUPPORTED if d[k] and k not in on_device] + ['scale_jitter'] * (
      tuple(d.scale_jitter) != (1.0, 1.0)
    )
    check(
      not unsupported,
      f'data.{unsupported[0] if unsupported else ""} is not implemented on the grain backend: unset it, or use '
      "data.backend='tfdata'",
    )


def image_keys() -> dict:
  """Image preprocessing and augmentation (images.py, augment.py); videos' frames go through it too."""
  return dict(
    image_size=config_dict.placeholder(int),  # Images (and frames) end as this square size; None keeps theirs.
    # None: images are resized to image_size x image_size (squashed, as vision_transformer does). Set: their
    # shorter side is resized to this, then an image_size square is cropped, at random for training and in the
    # centre for evaluation (big_vision's resize_small + central_crop, e.g. 256 and 224). Videos: video_keys.
    resize_size=config_dict.placeholder(int),
    # Resizing a larger image smoothes it first (tf.image.resize(antialias=True)); False: plain bilinear
    # sampling, as vision_transformer's pipeline resizes.
    antialias=True,
    inception_crop=False,  # Random-resized crop (Szegedy et al.) before resizing, for training.
    # The inception crop's smallest share of the image's area (big_vision's area_min 5%, timm's scale 0.08). Where
    # the thing to classify fills little of the picture, small crops cut it off and teach noise: e.g. 0.85.
    inception_min_area=0.05,
    crop_padding=0,  # Pad by this many pixels (with zeros) and take a random crop, for training.
    flip=False,  # Random horizontal flip, for training.
    # Training, with resize_size: after the shorter-side resize, height and width are each scaled by a factor
    # drawn from [low, high] before the random crop (scenic's ViViT: (0.9, 1.33)); (1, 1): off.
    scale_jitter=(1.0, 1.0),
    # Training: probability of random brightness (+-32/255), saturation and contrast (x 0.6-1.4) and hue
    # (+-0.2), one draw for all frames of a clip (scenic's ViViT: 0.8).
    color_augment=0.0,
    color_drop=0.0,  # Training: probability of turning an image or clip to grey (scenic's ViViT: 0.1).
    # Training images: RandAugment (Cubuk et al. 2020), this many ops in a row, each drawn from the paper's 14
    # (DeiT, AugReg: 2); 0: off. After crop and flip, before colour augmentation.
    randaugment_layers=0,
    # Their strength m on the 0-10 scale of big_vision and timm, growing with m (DeiT: 9; AugReg's
    # light/medium/strong: 10/15/20; at most 30); the ops and their ranges: augment.py.
    randaugment_magnitude=9.0,
    # Training images: probability of replacing a random rectangle (2%-1/3 of the area) by noise, last, in the
    # jitted step (timm's RandomErasing, 'pixel' mode; DeiT: 0.25; data/device.py).
    random_erasing=0.0,
    # Where training images and clips are flipped (data.flip), RandAugmented and colour-augmented: 'host' (the input
    # pipeline's CPU threads, in tf.data or PIL) or 'device' (in the jitted step, per example, on the accelerator:
    # the host then only decodes, crops and resizes; with data.canvas, decodes and copies the crop's window, which
    # the device resizes). The same ops and distributions, other draws (data/device.py). The cluster recipes take
    # 'device'.
    augment_on='host',
    # With augment_on='device' and an image_size: the jitted step resizes the training crops too, and the host only
    # decodes and copies each crop's source window into a canvas this many times image_size (no larger than the
    # images, where the dataset says their size); a window that does not fit is resized on the host. 0: the host
    # resizes. The canvas should hold most crops: 2 for inception crops of ImageNet's photos (up to 500 px) at 224,
    # 1.25 for Kinetics' short-side crops under scale jitter down to 0.9, under 1 where small images are enlarged
    # (0.25 for CIFAR's 32-pixel images at 384). It costs transfer (a 448-pixel canvas is
    # 4x the bytes of the 224-pixel image) and device FLOPs (experiments/rehearsal/host_limit.py prints both).
    canvas=0.0,
    # Training: each example appears this many times in its batch, each copy augmented with its own seed
    # (repeated augmentation, Hoffer et al. 2020; DeiT: 3); 1: off. Batches per data shard must divide by it;
    # copies are spread over the batch (not side by side), so mixup and cutmix pair different examples.
    repeated_augment=1,
    # Training images: turned by a random multiple of 90 degrees (square images: data.image_size), after colour
    # augmentation; with data.flip, each of the square's 8 symmetries alike. For pictures with no up: shapes,
    # cells, aerial views.
    rotate90=False,
    # Training images: probability of remapping the colours, last: the channels in a random order, inverted
    # (255 - pixel) by a coin toss, then each scaled by RECOLOR_SCALE and shifted by up to RECOLOR_SHIFT levels.
    # For classes that colour does not tell apart (shapes, drawings).
    recolor=0.0,
    value_range=(-1.0, 1.0),  # Pixel values are scaled to this range (in the jitted step: pixels travel as uint8).
  )


def check_images(d: ml_collections.ConfigDict) -> None:
  check(d.image_size is None or d.image_size > 0, f'data.image_size={d.image_size} must be positive or None')
  check(d.resize_size is None or d.resize_size > 0, f'data.resize_size={d.resize_size} must be positive or None')
  check(
    d.resize_size is None or d.image_size is None or d.resize_size >= d.image_size,
    f'data.resize_size={d.resize_size} must be >= data.image_size={d.image_size}: images are resized, then cropped',
  )
  check(d.crop_padding >= 0, f'data.crop_padding={d.crop_padding} must be >= 0')
  check(
    len(d.value_range) == 2 and d.value_range[0] < d.value_range[1],
    f'data.value_range={d.value_range} must be (low, high) with low < high',
  )
  check(
    len(d.scale_jitter) == 2 and 0 < d.scale_jitter[0] <= d.scale_jitter[1],
    f'data.scale_jitter={d.scale_jitter} must be (low, high) with 0 < low <= high; (1, 1) turns it off',
  )
  check(
    0 < d.inception_min_area <= 1,
    f'data.inception_min_area={d.inception_min_area} is a share of the image: it must be in (0, 1]',
  )
  check(
    not d.rotate90 or d.image_size is not None,
    'data.rotate90=True turns images a quarter, which keeps only square ones square: set data.image_size',
  )
  for key in ('color_augment', 'color_drop', 'random_erasing', 'recolor'):
    check(0 <= d[key] <= 1, f'data.{key}={d[key]} is a probability: it must be in [0, 1]')
  check(
    d.randaugment_layers >= 0,
    f'data.randaugment_layers={d.randaugment_layers} must be >= 0 (ops per image; 0 turns RandAugment off)',
  )
  check(
    0 <= d.randaugment_magnitude <= 30,
    f'data.randaugment_magnitude={d.randaugment_magnitude} must be in [0, 30] (0-10 is the scale, e.g. 9)',
  )
  check(
    d.augment_on in AUGMENT_ON, f'data.augment_on={d.augment_on!r} is not one of {", ".join(map(repr, AUGMENT_ON))}'
  )
  check(
    0 <= d.canvas <= 8,
    f'data.canvas={d.canvas} must be 0 (the host resizes) or above 0 up to 8 (times data.image_size)',
  )
  check(
    not d.canvas or (d.augment_on == 'device' and d.image_size is not None and not d.crop_padding),
    f"data.canvas={d.canvas} has the jitted step resize training crops: it needs data.augment_on='device', a "
    f'data.image_size and no data.crop_padding (here {d.augment_on!r}, {d.image_size}, {d.crop_padding}); or set 0',
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


def video_keys() -> dict:
  """Clips of datasets with a "video" feature (videos.py): `num_frames` frames, `frame_stride` apart, resized so
  their shorter side is data.resize_size (None: image_size; both None: kept), then cropped to image_size x
  image_size: at random for training, at `eval_crops` places for evaluation."""
  return dict(
    num_frames=8,  # Frames per clip: the model's time axis.
    frame_stride=1,  # Take every this-many-th frame (the clip spans (num_frames - 1) * stride + 1).
    eval_clips=1,  # Evaluation views: this many evenly spaced temporal clips per video...
    # ...times this many spatial crops (1: centre; 3: both ends and centre of the longer side). The logits of
    # all eval_clips x eval_crops views of a video are averaged.
    eval_crops=3,
  )


def check_videos(d: ml_collections.ConfigDict) -> None:
  check(d.num_frames > 0, f'data.num_frames={d.num_frames} must be a positive integer')
  check(d.frame_stride > 0, f'data.frame_stride={d.frame_stride} must be a positive integer')
  check(d.eval_clips > 0, f'data.eval_clips={d.eval_clips} must be a positive integer')
  check(d.eval_crops in (1, 3), f'data.eval_crops={d.eval_crops} must be 1 (centre) or 3 (both ends and centre)')


def text_keys() -> dict:
  """Token sequences (text.py): which features, their vocabulary, lengths, packing and token budgets."""
  return dict(
    source=config_dict.placeholder(str),  # Input feature (text, or an image); None: the first supervised key.
    target=config_dict.placeholder(str),  # Target text feature; None: the second supervised key.
    # 'words' (word-level, from the train split; one vocabulary per side), 'sentencepiece' (trained on the train
    # split's source and target text, one shared vocabulary, saved as <workdir>/sentencepiece.model and reused on
    # resume), the path of a SentencePiece .model file, or a transformers Marian folder (opus-mt: its source.spm
    # tokenises the source, target.spm the target, in vocab.json's ids; what init_from=that folder needs).
    vocab='words',
    vocab_size=32_000,  # Pieces of a trained SentencePiece vocabulary.
    vocab_sentences=1_000_000,  # Train a SentencePiece vocabulary on this many training examples.
    # Source tokens (EOS included). Longer training examples are left out; evaluation keeps every example and
    # cuts it to this. Classification of token sequences (an "inputs" feature, e.g. listops): every sequence is
    # padded to this length, a longer one cut; it must hold a dataset's declared longest.
    max_input_length=64,
    max_target_length=64,  # Target tokens (EOS included); the same rules.
    # > 1: pack this many batches' worth of sequences into each training batch (sequence packing: fewer padding
    # tokens; sequences that do not fit are left out, see train/packed_fraction).
    pack_factor=1,
    # > 0: training batches by a token budget with length bucketing instead of batch_size pairs (the
    # Transformer paper's ~25k source + 25k target tokens): pairs of similar length are batched together, each
    # batch padded to its bucket's length and holding as many pairs as fit the budget on each side. Rows round
    # down to a multiple of batch shards x accum_steps (and data.shards) so batches divide: budgets whose rows
    # need no rounding give the same batches on any device count. data.batch_size is unused then; seq2seq, no
    # packing.
    token_budget=0,
  )


def check_text(d: ml_collections.ConfigDict) -> None:
  check(
    d.vocab in ('words', 'sentencepiece') or d.vocab.endswith('.model') or info.is_marian_folder(d.vocab),
    f"data.vocab={d.vocab!r} is not 'words', 'sentencepiece', the path of a SentencePiece .model file or a Marian "
    'folder (source.spm, target.spm, vocab.json)',
  )
  for key in ('vocab_size', 'vocab_sentences', 'max_input_length', 'max_target_length', 'pack_factor'):
    check(d[key] > 0, f'data.{key}={d[key]} must be a positive integer')
  check(d.token_budget >= 0, f'data.token_budget={d.token_budget} must be >= 0 (0: batches of data.batch_size)')


def tracking_keys() -> dict:
  """Datasets with "frames" and "boxes" (tracking.py): training pairs of a template crop of the target in one
  frame and a search crop around it in a frame at most max_gap away; evaluation crops the same way, online."""
  return dict(
    template_size=32,  # Template crop side in pixels (ViTCRT and STARK: 128).
    search_size=64,  # Search crop side in pixels (ViTCRT and STARK: 320).
    template_factor=2.0,  # The template crop covers template_factor * sqrt(w * h) of the frame (STARK: 2).
    search_factor=4.0,  # The search crop covers search_factor * sqrt(w * h) (STARK: 5; OSTrack: 4).
    max_gap=10,  # Training: the search frame is at most this many frames before or after the template's.
    negative_fraction=0.1,  # Training: the fraction of search crops cut away from the target (class 0).
    # Training, datasets with 'distractors' (tracking_digits): the fraction of search crops cut around the
    # distractor nearest the target instead: a positive with the target's box if its centre is in the crop, else
    # a negative. The tracker learns to pick the template's object rather than the one in the middle of the crop.
    distractor_fraction=0.0,
    # Training: the search crop's centre moves by up to +-centre_jitter / 2 times the square root of the
    # target's (jittered) area along each axis (OSTrack: 3).
    centre_jitter=3.0,
    size_jitter=0.25,  # Training: the target's sides, for the search crop only, scale by exp(N(0, this)).
  )


def check_tracking(d: ml_collections.ConfigDict) -> None:
  for key in ('template_size', 'search_size', 'max_gap'):
    check(d[key] > 0, f'data.{key}={d[key]} must be a positive integer')
  for key in ('template_factor', 'search_factor'):
    check(d[key] > 0, f"data.{key}={d[key]} must be positive (the crop side in units of the target's size)")
  check(0 <= d.negative_fraction < 1, f'data.negative_fraction={d.negative_fraction} must be in [0, 1)')
  check(0 <= d.distractor_fraction <= 1, f'data.distractor_fraction={d.distractor_fraction} must be in [0, 1]')
  for key in ('centre_jitter', 'size_jitter'):
    check(d[key] >= 0, f'data.{key}={d[key]} must be >= 0 (0 turns it off)')


PARTS: tuple[tuple[Callable[[], dict], Callable[[ml_collections.ConfigDict], None]], ...] = (
  (dataset_keys, check_dataset),
  (image_keys, check_images),
  (video_keys, check_videos),
  (text_keys, check_text),
  (tracking_keys, check_tracking),
)


def config() -> ml_collections.ConfigDict:
  """`config.data`: every part's keys."""
  c = ml_collections.ConfigDict()
  for keys, _ in PARTS:
    c.update(keys())
  return c


def validate(d: ml_collections.ConfigDict) -> None:
  """Every part's checks of `config.data`."""
  for _, checks in PARTS:
    checks(d)


def global_batch(local: dict, sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """This process's rows of a batch (NumPy, keyed) as global arrays laid out by `sharding`."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}


def shards(data_config, batch_key: str) -> tuple[list[int], int, int]:
  """(this process's shard ids, number of shards, examples per shard in a `data.<batch_key>` batch)."""
  global_batch = data_config[batch_key]
  local, count = shard_ids(data_config)
  check(global_batch % count == 0, f'data.{batch_key}={global_batch} must be divisible by data.shards={count}')
  return local, count, global_batch // count


def shard_ids(data_config) -> tuple[list[int], int]:
  """(this process's shard ids, number of shards) of `data.shards`."""
  count = jax.process_count() if data_config.shards == -1 else data_config.shards
  check(
    count % jax.process_count() == 0,
    f'data.shards={count} must be a multiple of the process count {jax.process_count()}',
  )
  per_process = count // jax.process_count()
  first = jax.process_index() * per_process
  return list(range(first, first + per_process)), count
