"""Single-object tracking benchmarks in their published layouts as TFDS datasets, read from TFDS's manual folder
(no network): `data.name='tracking_benchmarks/got10k'` (or lasot, otb100, uav123) with the benchmark unpacked in
DATA_DIR/downloads/manual/<FOLDER> (FOLDERS below), prepared once into DATA_DIR like every built-in dataset.

  got10k  GOT-10k/{train,val,test}/<sequence>/00000001.jpg ... + groundtruth.txt (+ absence.label); list.txt, when
          a split has one, orders its sequences. The test split's groundtruth.txt holds the first box only (the
          server scores the rest): its later boxes are NaN and absent, it is neither trained on nor scored here
          (BenchmarkConfig.withheld), and `python -m vit_jax_lab.tools.results` writes its files for the server.
  lasot   LaSOT/<class>/<class>-<n>/img/00000001.jpg ... + groundtruth.txt (+ full_occlusion.txt, out_of_view.txt).
          With LaSOT/testing_set.txt (the toolkit's list of 280 sequences): `test` those, `train` the others;
          without it every sequence is `test` (the test-set download).
  otb100  OTB100/<Sequence>/img/0001.jpg ... + groundtruth_rect.txt (two targets: groundtruth_rect.1.txt and .2.txt,
          named <Sequence>.1 and .2); all `test`. David, Football1, Freeman3, Freeman4 and Diving have more frames
          than boxes: the benchmark's frame ranges (TRIMMED) pick theirs.
  uav123  UAV123/anno/UAV123/<name>.txt and UAV123/data_seq/UAV123/<video>/000001.jpg ...; all `test`. A name
          <video>_<k> is part k of a video: part 1 starts at frame 1, each later part at the last frame of the part
          before (the parts share that frame), except the three parts after a gap (GAPS).

Box files hold one `x,y,w,h` per frame (commas, tabs or spaces), in pixels as the benchmark gives them; `NaN` boxes
(UAV123) and frames labelled absent, occluded or out of view mark the target absent there. An example is one
sequence: its frames as the paths of their JPEG/PNG files in the benchmark's folder (`frames_root`: read and decoded
only when used, so a training pair reads and decodes two files, not its whole sequence, as the trackers' own loaders
do; the folder stays where it was prepared from), its boxes and its `absent` flags. A box file with a line that is
not four numbers, a sequence folder without frames, or frames and boxes of different counts stop the preparation with
one line that names the file.
"""

import dataclasses
import os
import re
from typing import Iterator, NamedTuple

import numpy as np
import tensorflow_datasets as tfds

from vit_jax_lab.data.builders.folder import JPEG_PNG_EXTENSIONS, natural_key
from vit_jax_lab.errors import check

FOLDERS = {'got10k': 'GOT-10k', 'lasot': 'LaSOT', 'otb100': 'OTB100', 'uav123': 'UAV123'}
TRIMMED = {'David': (300, 770), 'Football1': (1, 74), 'Freeman3': (1, 460), 'Freeman4': (1, 283), 'Diving': (1, 215)}
WITHHELD = {'got10k': ('test',)}  # Splits whose boxes after the first only the benchmark's server has.
GAPS = {'bird1_2': 775, 'bird1_3': 1573, 'uav1_3': 2473}  # UAV123 parts whose first frame is not the last before.


class Sequence(NamedTuple):
  name: str
  frames: list[str]  # Paths, in order.
  boxes: np.ndarray  # (T, 4) float32, NaN where the file says so.
  absent: np.ndarray  # (T,) bool.


@dataclasses.dataclass
class BenchmarkConfig(tfds.core.BuilderConfig):
  """Attributes:
  folder: the benchmark's folder inside the manual folder.
  withheld: splits whose boxes after the first are withheld (a server scores them): tracked, never trained on or
    scored.
  """

  folder: str = ''
  withheld: tuple[str, ...] = ()


def read_boxes(path: str) -> np.ndarray:
  """(T, 4) float32 boxes of a box file, one line per frame; a line that is not 4 numbers is a ConfigError naming
  the file and line."""
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      fields = [x for x in re.split(r'[,\s]+', line.strip()) if x]
      try:
        values = [float(x) for x in fields]
      except ValueError:
        values = []
      check(
        len(values) == 4,
        f'{path} line {number}: {line.strip()[:60]!r} is not a box: each line must be x,y,w,h (4 numbers, or NaN '
        'where the target is absent); fix the line or remove the sequence',
      )
      rows.append(values)
  check(bool(rows), f'{path} has no boxes: give one x,y,w,h line per frame, or remove the sequence')
  return np.asarray(rows, np.float32)


def read_flags(path: str, count: int) -> np.ndarray:
  """(count,) bool of a 0/1 label file (one per line, or comma-separated on one line); all False without one."""
  if not os.path.exists(path):
    return np.zeros(count, bool)
  with open(path) as f:
    flags = [x for x in re.split(r'[,\s]+', f.read()) if x]
  check(
    len(flags) == count and set(flags) <= {'0', '1'},
    f'{path} has {len(flags)} entries (0 or 1) for {count} frames: one per frame',
  )
  return np.asarray(flags) == '1'


def frames_in(folder: str) -> list[str]:
  """The image files of a folder, in natural order; none is a ConfigError."""
  check(os.path.isdir(folder), f'{folder} is missing: each sequence needs its folder of frames')
  names = sorted((n for n in os.listdir(folder) if n.lower().endswith(JPEG_PNG_EXTENSIONS)), key=natural_key)
  check(bool(names), f'{folder} has no frames ({"/".join(JPEG_PNG_EXTENSIONS)}): add them or remove the sequence')
  return [os.path.join(folder, n) for n in names]


def sequence(
  name: str, frames: list[str], box_file: str, flag_files: tuple[str, ...] = (), first_only: bool = False
) -> Sequence:
  """A sequence from its frames, its box file and the 0/1 files that flag frames without a visible target;
  `first_only`: the box file holds the first frame's box alone, the others are NaN (absent)."""
  boxes = read_boxes(box_file)
  if first_only:
    check(len(boxes) == 1, f"{box_file}: {len(boxes)} boxes: a withheld split gives the first frame's box alone")
    boxes = np.concatenate([boxes, np.full((len(frames) - 1, 4), np.nan, np.float32)])
  check(len(frames) == len(boxes), f'{box_file}: {len(boxes)} boxes for {len(frames)} frames: one box per frame')
  absent = ~np.isfinite(boxes).all(1) | (boxes[:, 2] <= 0) | (boxes[:, 3] <= 0)
  for path in flag_files:
    absent |= read_flags(path, len(boxes))
  check(not absent[0], f'{box_file}: the first frame has no box ({boxes[0]}): tracking starts from it')
  return Sequence(name, frames, boxes, absent)


def got10k(root: str) -> dict[str, list[Sequence]]:
  splits = {}
  for split in ('train', 'val', 'test'):
    folder = os.path.join(root, split)
    if not os.path.isdir(folder):
      continue
    listed = os.path.join(folder, 'list.txt')
    if os.path.exists(listed):
      with open(listed) as f:
        names = [n.strip() for n in f if n.strip()]
    else:
      names = sorted(n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n)))
    out = []
    for name in names:
      d = os.path.join(folder, name)
      flags = (os.path.join(d, 'absence.label'),)
      out.append(sequence(name, frames_in(d), os.path.join(d, 'groundtruth.txt'), flags, split == 'test'))
    splits[split] = out
  return splits


def lasot(root: str) -> dict[str, list[Sequence]]:
  listed = os.path.join(root, 'testing_set.txt')
  test_names = None
  if os.path.exists(listed):
    with open(listed) as f:
      test_names = {n.strip() for n in f if n.strip()}
  splits = {'train': [], 'test': []}
  for cls in sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))):
    for name in sorted(os.listdir(os.path.join(root, cls)), key=natural_key):
      d = os.path.join(root, cls, name)
      if not os.path.isdir(d):
        continue
      flags = tuple(os.path.join(d, f) for f in ('full_occlusion.txt', 'out_of_view.txt'))
      split = 'test' if test_names is None or name in test_names else 'train'
      splits[split].append(sequence(name, frames_in(os.path.join(d, 'img')), os.path.join(d, 'groundtruth.txt'), flags))
  return {k: v for k, v in splits.items() if v}


def otb100(root: str) -> dict[str, list[Sequence]]:
  out = []
  for seq in sorted((n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))), key=natural_key):
    d = os.path.join(root, seq)
    box_files = sorted(n for n in os.listdir(d) if re.fullmatch(r'groundtruth_rect(\.\d+)?\.txt', n))
    box_files = [n for n in box_files if os.path.getsize(os.path.join(d, n)) > 0]  # Human4's .1 file is empty.
    check(bool(box_files), f'{d} has no groundtruth_rect.txt: each OTB sequence needs its box file')
    frames = frames_in(os.path.join(d, 'img'))
    if seq in TRIMMED:
      first, last = TRIMMED[seq]
      frames = frames[first - 1 : last]
    for n in box_files:
      name = seq + n[len('groundtruth_rect') : -len('.txt')]  # Jogging.1, Jogging.2
      out.append(sequence(name, frames, os.path.join(d, n)))
  return {'test': out}


def uav123(root: str) -> dict[str, list[Sequence]]:
  anno, data = os.path.join(root, 'anno', 'UAV123'), os.path.join(root, 'data_seq', 'UAV123')
  check(os.path.isdir(anno) and os.path.isdir(data), f'{root} needs anno/UAV123/ and data_seq/UAV123/ (as unzipped)')
  names = sorted((n[:-4] for n in os.listdir(anno) if n.endswith('.txt')), key=natural_key)
  out, ends = [], {}
  for name in names:
    part = re.fullmatch(r'(.+)_(\d+)', name)
    video = part.group(1) if part and not os.path.isdir(os.path.join(data, name)) else name
    box_file = os.path.join(anno, name + '.txt')
    frames = frames_in(os.path.join(data, video))
    first = GAPS.get(name, ends.get(video, 1) if part and int(part.group(2)) > 1 else 1)
    ends[video] = first + len(read_boxes(box_file)) - 1
    check(ends[video] <= len(frames), f'{box_file}: frames {first}-{ends[video]} of {video}, which has {len(frames)}')
    out.append(sequence(name, frames[first - 1 : ends[video]], box_file))
  return {'test': out}


READERS = {'got10k': got10k, 'lasot': lasot, 'otb100': otb100, 'uav123': uav123}


class TrackingBenchmarks(tfds.core.GeneratorBasedBuilder):
  """GOT-10k, LaSOT, OTB100 and UAV123 from their unpacked folders: one example per sequence."""

  VERSION = tfds.core.Version('1.2.0')
  RELEASE_NOTES = {
    '1.0.0': 'Sequences as encoded frames, boxes and absent flags.',
    '1.1.0': "GOT-10k's test split, its first boxes alone.",
    '1.2.0': "Frames as their files' paths in the benchmark's folder: a training pair reads 2 files, not all.",
  }
  BUILDER_CONFIGS = [
    BenchmarkConfig(name=k, folder=v, description=f'{v} (manual folder)', withheld=WITHHELD.get(k, ()))
    for k, v in FOLDERS.items()
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = 'Unpack the benchmark into DATA_DIR/downloads/manual/ as ' + ', '.join(
    FOLDERS.values()
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          'name': tfds.features.Text(),
          'frames': tfds.features.Tensor(shape=(None,), dtype=np.str_),  # Paths of the frames in frames_root().
          'boxes': tfds.features.Tensor(shape=(None, 4), dtype=np.float32),  # (x, y, w, h) in pixels.
          'absent': tfds.features.Tensor(shape=(None,), dtype=np.bool_),
        }
      ),
    )

  def frames_root(self) -> str:
    """The benchmark's folder, which the frames' paths are relative to."""
    return os.path.join(self.data_dir_root, 'downloads', 'manual', self.builder_config.folder)

  def _split_generators(self, dl_manager):
    del dl_manager  # The manual folder is read directly: its absence is one line of ours, not TFDS's instructions.
    c = self.builder_config
    root = self.frames_root()
    check(
      os.path.isdir(root) and os.listdir(root),
      f'data.name=tracking_benchmarks/{c.name} reads {c.folder} from {root}, which is missing or empty: unpack '
      f'the benchmark there (see vit_jax_lab/data/builders/tracking_benchmarks.py for its layout)',
    )
    splits = READERS[c.name](root)
    check(bool(splits), f'{root} holds no {c.folder} split in the published layout (see tracking_benchmarks.py)')
    return {split: self._generate_examples(root, sequences) for split, sequences in splits.items()}

  def _generate_examples(self, root: str, sequences: list[Sequence]) -> Iterator[tuple[str, dict]]:
    for s in sequences:
      frames = [os.path.relpath(path, root) for path in s.frames]
      yield s.name, {'name': s.name, 'frames': np.asarray(frames, object), 'boxes': s.boxes, 'absent': s.absent}
