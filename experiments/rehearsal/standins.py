"""Stand-ins of the cluster recipes' real datasets, with their shapes and formats, made locally without network.

The content is synthetic (what a model could learn does not matter here); the sizes, formats and byte counts are
what the real data's input pipeline has to handle. experiments/rehearsal/run.py and tests/test_configs_build.py make
them; by hand, one of them with its function's arguments after the folder:

python -m experiments.rehearsal.standins imagenet /tmp/inet 54 6 20   # imagenet_like(root, 54, 6, 20)
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.rehearsal.standins')

import io
import os
import sys

import numpy as np
from PIL import Image

IMAGENET_SIDES = ((500, 375), (375, 500), (500, 333), (500, 500), (640, 480), (400, 300))  # (width, height)


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
  """An RGB image whose JPEG is about the size of an ImageNet photo's (~110 KB at 500x375): smooth colour fields
  (4x4 to 32x32 blocks upsampled) plus fine texture."""
  coarse = rng.integers(0, 256, (rng.integers(4, 33), rng.integers(4, 33), 3), dtype=np.uint8)
  image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.int16)
  image = image + rng.normal(0, 18, (height, width, 1)).astype(np.int16)
  return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def imagenet_like(root: str, train_per_class: int, test_per_class: int, classes: int, seed: int = 0) -> str:
  """root/train/<class>/*.JPEG and root/val/<class>/*.JPEG: JPEGs (quality 90) of ImageNet's common sizes."""
  rng = np.random.default_rng(seed)
  for split, per_class in (('train', train_per_class), ('val', test_per_class)):
    for c in range(classes):
      folder = os.path.join(root, split, f'n{c:08d}')
      os.makedirs(folder, exist_ok=True)
      for i in range(per_class):
        width, height = IMAGENET_SIDES[rng.integers(len(IMAGENET_SIDES))]
        buffer = io.BytesIO()
        photo(rng, width, height).save(buffer, 'JPEG', quality=90)
        with open(os.path.join(folder, f'{split}_{c}_{i}.JPEG'), 'wb') as f:
          f.write(buffer.getvalue())
  return root


CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')


def cifar10_prepared(root: str, train_per_class: int, test_per_class: int, seed: int = 0) -> str:
  """TFDS's `cifar10` prepared in data_dir `root` as `tfds build cifar10` leaves it (its version, features and
  records: 32x32 RGB PNGs), of `photo`s: the fine-tuning recipe reads it as it reads the real one, whose images it
  knows to be 32x32 before it reads them."""
  import tensorflow_datasets as tfds

  rng = np.random.default_rng(seed)

  def examples(split: str, per_class: int):
    for c in range(len(CIFAR10_CLASSES)):
      for i in range(per_class):
        key = f'{split}_{c}_{i}'
        yield key, {'id': key, 'image': np.asarray(photo(rng, 32, 32)), 'label': c}

  class Cifar10(tfds.image_classification.Cifar10, skip_registration=True):
    def _split_generators(self, dl_manager):
      del dl_manager  # Nothing to download.
      return {'train': examples('train', train_per_class), 'test': examples('test', test_per_class)}

  Cifar10(data_dir=root).download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return root


def cifar_like(root: str, train_per_class: int, test_per_class: int, classes: int = 10, seed: int = 0) -> str:
  """root/train/<class>/*.png and root/test/<class>/*.png: 32x32 RGB PNGs (CIFAR-10's names for up to 10 classes)."""
  rng = np.random.default_rng(seed)
  names = CIFAR10_CLASSES[:classes] if classes <= len(CIFAR10_CLASSES) else [f'class_{c:03d}' for c in range(classes)]
  for split, per_class in (('train', train_per_class), ('test', test_per_class)):
    for c, name in enumerate(names):
      folder = os.path.join(root, split, name)
      os.makedirs(folder, exist_ok=True)
      for i in range(per_class):
        photo(rng, 32, 32).save(os.path.join(folder, f'{split}_{c}_{i}.png'), 'PNG')
  return root


def _encode_mp4(path: str, frames, fps: int, size: tuple[int, int], seconds: float) -> None:
  """H.264 (yuv420p) video of `frames` (uint8 RGB arrays) with a quiet AAC stereo track, as YouTube's Kinetics clips
  carry one: a reader has to pick the video stream out of interleaved packets."""
  import av  # Only this stand-in needs PyAV.

  with av.open(path, 'w') as container:
    # One thread: x264's threaded encodes of the same frames differed from run to run.
    video = container.add_stream('libx264', rate=fps, options={'preset': 'veryfast', 'threads': '1'})
    video.width, video.height, video.pix_fmt = *size, 'yuv420p'
    audio = container.add_stream('aac', rate=44_100, layout='stereo')
    for frame in frames:
      container.mux(video.encode(av.VideoFrame.from_ndarray(frame, format='rgb24')))
    container.mux(video.encode())
    block = audio.codec_context.frame_size or 1024
    for start in range(0, int(seconds * 44_100), block):
      sound = av.AudioFrame.from_ndarray(np.zeros((2, block), np.float32), format='fltp', layout='stereo')
      sound.sample_rate, sound.pts = 44_100, start
      container.mux(audio.encode(sound))
    container.mux(audio.encode())


def kinetics_like(
  root: str,
  train_per_class: int,
  test_per_class: int,
  classes: int,
  seconds: float = 10.0,
  fps: int = 25,
  size: tuple[int, int] = (340, 256),
  seed: int = 0,
) -> str:
  """root/train/<class>/*.mp4 and root/val/<class>/*.mp4: Kinetics' clips as commonly stored (10 s at 25 fps,
  resized to 340x256 = width x height, H.264 with an audio track). Each shows a textured scene panning in a
  direction set by its class, and a textured object crossing it."""
  rng = np.random.default_rng(seed)
  width, height = size
  count = int(round(seconds * fps))
  for split, per_class in (('train', train_per_class), ('val', test_per_class)):
    for c in range(classes):
      folder = os.path.join(root, split, f'class_{c:03d}')
      os.makedirs(folder, exist_ok=True)
      angle = 2 * np.pi * c / classes
      for i in range(per_class):
        speed = rng.uniform(0.5, 2.0)  # Pixels per frame.
        pan = np.array([np.cos(angle), np.sin(angle)]) * speed * np.arange(count)[:, None]  # (x, y) of each frame.
        pan -= pan.min(0)
        scene = np.asarray(photo(rng, width + int(pan[:, 0].max()) + 1, height + int(pan[:, 1].max()) + 1))
        side = int(rng.integers(height // 6, height // 3))
        thing = np.asarray(photo(rng, side, side))
        start, end = rng.uniform(0, 1, 2), rng.uniform(0, 1, 2)

        def frames(scene=scene, pan=pan, thing=thing, side=side, start=start, end=end):
          for t in range(count):
            x, y = pan[t].astype(int)
            frame = scene[y : y + height, x : x + width].copy()
            u = t / max(count - 1, 1)
            ox, oy = ((1 - u) * start + u * end) * (width - side, height - side)
            frame[int(oy) : int(oy) + side, int(ox) : int(ox) + side] = thing
            yield frame

        _encode_mp4(os.path.join(folder, f'{split}_{c}_{i}.mp4'), frames(), fps, size, seconds)
  return root


EN_FUNCTION = ('the', 'of', 'and', 'to', 'in', 'a', 'is', 'that', 'for', 'it', 'on', 'with', 'as', 'be', 'by', 'this')
DE_FUNCTION = ('die', 'der', 'und', 'zu', 'in', 'ein', 'ist', 'dass', 'für', 'es', 'auf', 'mit', 'als', 'sein', 'von')
DE_FUNCTION += ('diese', 'den', 'das', 'sich', 'nicht', 'im', 'dem', 'auch', 'werden')  # Inserted: German's ~1.1x.
EN_SOUNDS = (
  ('', 'b', 'c', 'd', 'f', 'g', 'h', 'l', 'm', 'n', 'p', 'r', 's', 't', 'w', 'th', 'st', 'br', 'cl', 'sh', 'pr', 'tr'),
  ('a', 'e', 'i', 'o', 'u', 'ea', 'ou', 'ai', 'ee', 'oo', 'y'),
  ('', 'n', 't', 's', 'r', 'l', 'nd', 'st', 'ng', 'ck', 'rt', 'm', 'd', 'tion', 'ly'),
)
DE_SOUNDS = (
  ('', 'b', 'd', 'f', 'g', 'h', 'k', 'l', 'm', 'n', 'p', 'r', 's', 't', 'w', 'z', 'sch', 'st', 'pf', 'kr', 'tr', 'gr'),
  ('a', 'e', 'i', 'o', 'u', 'ei', 'ie', 'au', 'eu', 'ä', 'ö', 'ü'),
  ('', 'n', 't', 's', 'r', 'l', 'ch', 'cht', 'ng', 'nn', 'tz', 'ß', 'st', 'en', 'er', 'ung', 'keit'),
)
WMT_WORDS = 4000  # Content words per language.


def _words(rng: np.random.Generator, sounds: tuple, count: int, taken: tuple[str, ...]) -> list[str]:
  """`count` distinct pseudo-words of 1-3 syllables (onset and nucleus each) and a coda, none in `taken`."""
  onsets, nuclei, codas = sounds
  out, seen = [], set(taken)
  while len(out) < count:
    syllables = rng.choice(3, p=(0.4, 0.4, 0.2)) + 1
    word = ''.join(onsets[rng.integers(len(onsets))] + nuclei[rng.integers(len(nuclei))] for _ in range(syllables))
    word += codas[rng.integers(len(codas))]
    if len(word) > 1 and word not in seen:
      seen.add(word)
      out.append(word)
  return out


def _zipf(n: int) -> np.ndarray:
  """Zipf-Mandelbrot probabilities of n ranked words, as word frequencies in running text fall."""
  p = 1.0 / (np.arange(n) + 2.7)
  return p / p.sum()


def wmt_like(root: str, train_pairs: int, test_pairs: int, seed: int = 0) -> str:
  """root/train.tsv and root/test.tsv, `source<TAB>target` lines of English-like and German-like sentences (UTF-8,
  umlauts and ß included). Source lengths in words are log-normal like WMT14 En-De's (mean ~23, median ~20, a
  long tail past 100); the target translates word by word through a fixed lexicon and adds German's extra function
  words, so it is ~1.1x the source and correlated with it. Words follow a Zipf law; German nouns are capitalised."""
  rng = np.random.default_rng(seed)
  english = list(EN_FUNCTION) + _words(rng, EN_SOUNDS, WMT_WORDS, EN_FUNCTION)
  german = list(DE_FUNCTION[: len(EN_FUNCTION)]) + _words(rng, DE_SOUNDS, WMT_WORDS, DE_FUNCTION)
  german = [w.capitalize() if i >= len(EN_FUNCTION) and rng.random() < 0.3 else w for i, w in enumerate(german)]
  extra = DE_FUNCTION[len(EN_FUNCTION) :] + DE_FUNCTION[:3]
  cdf = np.cumsum(_zipf(len(english)))
  os.makedirs(root, exist_ok=True)
  for split, count in (('train', train_pairs), ('test', test_pairs)):
    lines = []
    for _ in range(count):
      length = int(np.clip(round(rng.lognormal(np.log(23) - 0.18, 0.6)), 1, 250))  # exp(mu + 0.6^2 / 2) = 23.
      ids = np.minimum(np.searchsorted(cdf, rng.random(length)), len(english) - 1)
      source, target = [], []
      for k, i in enumerate(ids):
        source.append(english[i])
        target.append(german[i])
        if rng.random() < 0.1:
          target.append(extra[rng.integers(len(extra))])
        if k + 1 < length and rng.random() < 0.06:
          source[-1] += ','
          target[-1] += ','
      end = '?' if rng.random() < 0.05 else '.'
      source[0], target[0] = source[0].capitalize(), target[0][0].upper() + target[0][1:]
      lines.append(f'{" ".join(source)}{end}\t{" ".join(target)}{end}\n')
    with open(os.path.join(root, f'{split}.tsv'), 'w', encoding='utf-8') as f:
      f.writelines(lines)
  return root


def _track(rng: np.random.Generator, frames: int, size: tuple[int, int]):
  """(frame, box) of one tracking sequence of `frames` frames of `size` (width, height): a textured object moving
  and scaling smoothly over a textured scene that the camera pans slowly; boxes x, y, w, h in pixels."""
  width, height = size
  margin = max(width, height) // 20
  scene = np.asarray(photo(rng, width + 2 * margin, height + 2 * margin))
  side = rng.uniform(0.08, 0.3) * min(width, height)
  aspect = np.exp(rng.uniform(-0.5, 0.5))
  thing = photo(rng, int(side * aspect * 1.3) + 1, int(side / aspect * 1.3) + 1)
  phase = rng.uniform(0, 2 * np.pi, 5)
  period = rng.uniform(60, 200)
  for t in range(frames):
    wave = np.sin(2 * np.pi * t / period + phase)
    w, h = int(side * aspect * (1 + 0.15 * wave[0])), int(side / aspect * (1 + 0.15 * wave[0]))
    x = int((0.5 + 0.35 * wave[1]) * (width - w))
    y = int((0.5 + 0.35 * wave[2]) * (height - h))
    dx, dy = (margin * (1 + 0.5 * wave[3:5])).astype(int)
    frame = scene[dy : dy + height, dx : dx + width].copy()
    frame[y : y + h, x : x + w] = np.asarray(thing.resize((w, h), Image.BILINEAR))
    yield Image.fromarray(frame), (x, y, w, h)


def _frames_and_boxes(rng, folder: str, frames: int, size: tuple[int, int], name) -> list[tuple[int, int, int, int]]:
  """Writes a sequence's JPEGs (quality 90) as folder/name(t) for t = 1, 2, ...; returns its boxes."""
  os.makedirs(folder, exist_ok=True)
  boxes = []
  for t, (image, box) in enumerate(_track(rng, frames, size), 1):
    image.save(os.path.join(folder, name(t)), 'JPEG', quality=90)
    boxes.append(box)
  return boxes


def _write_lines(path: str, lines) -> None:
  with open(path, 'w') as f:
    f.writelines(f'{line}\n' for line in lines)


def got10k_like(root: str, sequences: int, frames: int, size: tuple[int, int] = (1280, 720), seed: int = 0) -> str:
  """GOT-10k as unpacked in TFDS's manual folder of data_dir `root`: root/downloads/manual/GOT-10k/{train,val}/
  GOT-10k_{Train,Val}_000001/00000001.jpg ... with groundtruth.txt (x,y,w,h to 4 decimals), absence.label,
  cover.label, cut_by_image.label and each split's list.txt; `sequences` per split of `frames` to 1.5x `frames`
  frames (width x height `size`)."""
  rng = np.random.default_rng(seed)
  for split in ('train', 'val'):
    names = [f'GOT-10k_{split.title()}_{i:06d}' for i in range(1, sequences + 1)]
    for name in names:
      folder = os.path.join(root, 'downloads', 'manual', 'GOT-10k', split, name)
      length = int(rng.integers(frames, frames + frames // 2 + 1))
      boxes = _frames_and_boxes(rng, folder, length, size, '{:08d}.jpg'.format)
      _write_lines(os.path.join(folder, 'groundtruth.txt'), (','.join(f'{v:.4f}' for v in box) for box in boxes))
      _write_lines(os.path.join(folder, 'absence.label'), ['0'] * length)
      _write_lines(os.path.join(folder, 'cover.label'), ['8'] * length)  # 8: fully visible.
      _write_lines(os.path.join(folder, 'cut_by_image.label'), ['0'] * length)
    _write_lines(os.path.join(root, 'downloads', 'manual', 'GOT-10k', split, 'list.txt'), names)
  return root


def lasot_like(root: str, sequences: int, frames: int, size: tuple[int, int] = (1280, 720), seed: int = 0) -> str:
  """LaSOT's test-set download in data_dir `root`'s manual folder: root/downloads/manual/LaSOT/<class>/<class>-<n>/
  img/00000001.jpg ... with groundtruth.txt (x,y,w,h integers), full_occlusion.txt and out_of_view.txt (0/1, one
  comma-separated line) and nlp.txt; `sequences` sequences, two per class."""
  rng = np.random.default_rng(seed)
  for i in range(sequences):
    cls = ('airplane', 'basketball', 'bear', 'bicycle', 'bird', 'boat')[i // 2 % 6]
    folder = os.path.join(root, 'downloads', 'manual', 'LaSOT', cls, f'{cls}-{i % 2 + 1 + i // 12 * 2}')
    length = int(rng.integers(frames, frames + frames // 2 + 1))
    boxes = _frames_and_boxes(rng, os.path.join(folder, 'img'), length, size, '{:08d}.jpg'.format)
    _write_lines(os.path.join(folder, 'groundtruth.txt'), (','.join(str(v) for v in box) for box in boxes))
    for flags in ('full_occlusion.txt', 'out_of_view.txt'):
      _write_lines(os.path.join(folder, flags), [','.join(['0'] * length)])
    _write_lines(os.path.join(folder, 'nlp.txt'), [f'the {cls} moving across the scene'])
  return root


def otb100_like(root: str, sequences: int, frames: int, seed: int = 0) -> str:
  """OTB100 in data_dir `root`'s manual folder: root/downloads/manual/OTB100/<Sequence>/img/0001.jpg ... with
  groundtruth_rect.txt (x,y,w,h integers, comma- or tab-separated as the benchmark's files vary), at OTB's frame
  sizes (320x240 to 640x480)."""
  rng = np.random.default_rng(seed)
  names = ('Basketball', 'Biker', 'Bird1', 'BlurBody', 'Car4', 'Coke', 'Deer', 'Dog1', 'Girl2', 'Jumping')
  for i in range(sequences):
    folder = os.path.join(root, 'downloads', 'manual', 'OTB100', f'{names[i % 10]}{i // 10 or ""}')
    size = ((320, 240), (640, 360), (640, 480), (576, 432))[i % 4]
    length = int(rng.integers(frames, frames + frames // 2 + 1))
    boxes = _frames_and_boxes(rng, os.path.join(folder, 'img'), length, size, '{:04d}.jpg'.format)
    sep = '\t' if i % 2 else ','
    _write_lines(os.path.join(folder, 'groundtruth_rect.txt'), (sep.join(str(v) for v in box) for box in boxes))
  return root


def uav123_like(root: str, sequences: int, frames: int, size: tuple[int, int] = (1280, 720), seed: int = 0) -> str:
  """UAV123 in data_dir `root`'s manual folder: root/downloads/manual/UAV123/data_seq/UAV123/<video>/000001.jpg ...
  and anno/UAV123/<video>.txt (x,y,w,h integers; one NaN,NaN,NaN,NaN line, as UAV123 marks a target out of view),
  every second video annotated in two parts (<video>_1, <video>_2) that share the frame where they meet."""
  rng = np.random.default_rng(seed)
  base = os.path.join(root, 'downloads', 'manual', 'UAV123')
  os.makedirs(os.path.join(base, 'anno', 'UAV123'), exist_ok=True)
  for i in range(sequences):
    video = f'{("bike", "boat", "car", "person", "truck", "wakeboard")[i % 6]}{i // 6 + 1}'
    length = int(rng.integers(frames, frames + frames // 2 + 1))
    folder = os.path.join(base, 'data_seq', 'UAV123', video)
    lines = [','.join(str(v) for v in box) for box in _frames_and_boxes(rng, folder, length, size, '{:06d}.jpg'.format)]
    if length >= 4:
      lines[-2] = 'NaN,NaN,NaN,NaN'
    if i % 2:
      half = length // 2
      _write_lines(os.path.join(base, 'anno', 'UAV123', f'{video}_1.txt'), lines[:half])
      _write_lines(os.path.join(base, 'anno', 'UAV123', f'{video}_2.txt'), lines[half - 1 :])
    else:
      _write_lines(os.path.join(base, 'anno', 'UAV123', f'{video}.txt'), lines)
  return root


def main(argv: list[str]) -> None:
  kinds = {name.removesuffix('_like'): f for name, f in globals().items() if name.endswith('_like')}
  if len(argv) < 2 or argv[0] not in kinds:
    raise SystemExit(f'usage: python -m experiments.rehearsal.standins {{{",".join(kinds)}}} ROOT [INT ...]')
  print(kinds[argv[0]](argv[1], *(int(a) for a in argv[2:])))


if __name__ == '__main__':
  main(sys.argv[1:])
