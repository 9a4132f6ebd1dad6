"""timm's DeiT training input pipeline on this machine's CPUs, as a yardstick for our tf.data pipeline: images per
CPU-second of the whole process tree, and images per wall second.

torch and timm are no dependencies of this project (nothing here imports this file): run it from the repository root
as a module, with the Python of a separate virtual env outside the repository:

  python3 -m venv /work/torchenv && /work/torchenv/bin/pip install torch==2.13.0 timm pillow numpy
  /work/torchenv/bin/python -m experiments.rehearsal.timm_input [--variant deit deit_every_op crop_flip]
      [--workers 2] [--batch-size 64] [--root /tmp/inet/train] [--seconds 20] [--warmup 5] [--show-transform]

It prints `variant  img/cpu-s  img/s  workers`, one line per variant, on stdout, and how each was measured on stderr.

What runs is DeiT's main.py input path: torchvision's ImageFolder (PIL decode, convert('RGB')) over --root, timm's
training transform, a torch DataLoader with --workers worker processes, batches of 64, drop_last, a fresh random
order each epoch (epochs follow one another without end; the measurement decides when to stop). Variants:
  deit           DeiT's defaults: create_transform(224, is_training=True, color_jitter=0.3,
                 auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', re_prob=0.25, re_mode='pixel',
                 re_count=1): RandomResizedCrop (bicubic) + flip + RandAugment (2 ops of the 15 'increasing' ones,
                 each applied with probability 0.5, magnitude 9 with Gaussian noise of std 0.5) + ToTensor +
                 Normalize + RandomErasing. timm drops the colour jitter whenever auto_augment is set
                 (transforms_factory: disable_color_jitter unless force_color_jitter or a '3a' policy), as here.
  deit_every_op  the same, with each of the 2 RandAugment ops always applied: the config string's 'p' section,
                 'rand-m9-mstd0.5-inc1-p1.0' (rand_augment_transform -> rand_augment_ops(prob=1.0)).
  crop_flip      RandomResizedCrop (bicubic) + flip + ToTensor + Normalize only (create_transform with no auto
                 augment, no colour jitter, no random erasing).
Each transform is checked to be what its variant says before it is measured.

How CPU time is counted: over a window of at least --seconds of steady state (after --warmup seconds and 2 batches
per worker), between two batch arrivals, the CPU time (user + system) of the whole process tree: this process's
resource.getrusage(RUSAGE_SELF) plus RUSAGE_CHILDREN (children already reaped), plus each live DataLoader worker's
utime + stime + cutime + cstime from /proc/<pid>/stat. A worker's rusage reaches RUSAGE_CHILDREN only once it has
exited and been waited for, so for the live workers /proc is read instead; none exits inside the window (checked).
img/cpu-s = images received in the window / that CPU time; img/s = the same images / the window's wall time. As a
cross-check, stderr also shows the whole pass (worker start-up and the batches prefetched but never used included)
counted from getrusage alone, RUSAGE_SELF + RUSAGE_CHILDREN after the workers have exited and been joined, and the
workers' CPU time both ways. Per CPU-second is the fair rate on a machine whose cores others are using too.

Where PyPI's torchvision does not load beside this torch (its compiled ops library fails to load, and then its
Python code dies registering fake kernels for torchvision::nms, 'operator torchvision::nms does not exist'), the
two op schemas it needs are declared first (torchvision_ops_shim); no torchvision op is used here. Where Pillow
refuses to posterize to 0 bits (Pillow 13: 'bits must be between or equal to 1 and 8'; Pillow 12 and before gave a
black image, a lookup table of zeros), timm's posterize is given that old result back for 0 bits
(posterize_zero_bits): RandAugment's PosterizeIncreasing asks for 0 bits whenever its noisy magnitude, 9 + N(0, 0.5),
reaches 10 (about 2% of its draws), and the exception would kill a DataLoader worker within seconds.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.rehearsal.timm_input')

import argparse
import glob
import importlib.util
import os
import resource
import sys
import time

import numpy as np
import torch

VARIANTS = ('deit', 'deit_every_op', 'crop_flip')
DEIT_RANDAUGMENT = 'rand-m9-mstd0.5-inc1'  # DeiT main.py's --aa default
TICK = os.sysconf('SC_CLK_TCK')
_KEPT = []  # the shim's torch.library.Library: its definitions go away when it is garbage-collected


def torchvision_ops_shim() -> bool:
  """Declares torchvision::nms and torchvision::qnms when torchvision's own ops library does not load with this
  torch (import torchvision would fail); returns whether it did. Call before importing torchvision or timm."""
  folder = os.path.dirname(importlib.util.find_spec('torchvision').origin)
  libraries = glob.glob(os.path.join(folder, '_C.*so'))
  try:
    for path in libraries:
      torch.ops.load_library(path)
    if libraries:
      return False
  except OSError:
    pass
  library = torch.library.Library('torchvision', 'FRAGMENT')
  for name in ('nms', 'qnms'):
    library.define(f'{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
  _KEPT.append(library)
  return True


def posterize_zero_bits() -> bool:
  """Where Pillow's ImageOps.posterize refuses 0 bits, makes timm's augment ops return what Pillow 12 and before did
  for 0 bits: the image through a lookup table of zeros (black). Returns whether it did. Call before building a
  transform (timm's AugmentOp takes its function from NAME_TO_OP when it is made)."""
  from PIL import Image, ImageOps
  from timm.data import auto_augment

  try:
    ImageOps.posterize(Image.new('RGB', (1, 1)), 0)
    return False
  except ValueError:
    pass
  original = auto_augment.posterize

  def posterize(img, bits_to_keep, **kwargs):
    if bits_to_keep <= 0:
      return img.point([0] * 256 * len(img.getbands()))
    return original(img, bits_to_keep, **kwargs)

  for name, op in auto_augment.NAME_TO_OP.items():
    if op is original:
      auto_augment.NAME_TO_OP[name] = posterize
  return True


def build_transform(variant: str):
  """timm's training transform of the variant (see the module docstring), checked to be what the variant says."""
  from timm.data import create_transform
  from timm.data.auto_augment import RandAugment

  if variant == 'crop_flip':
    transform = create_transform(
      224, is_training=True, color_jitter=None, auto_augment=None, re_prob=0.0, interpolation='bicubic'
    )
    names = [type(t).__name__ for t in transform.transforms]
    assert names == ['RandomResizedCropAndInterpolation', 'RandomHorizontalFlip', 'MaybeToTensor', 'Normalize'], names
    return transform
  every_op = variant == 'deit_every_op'
  transform = create_transform(
    224,
    is_training=True,
    color_jitter=0.3,
    auto_augment=DEIT_RANDAUGMENT + ('-p1.0' if every_op else ''),
    interpolation='bicubic',
    re_prob=0.25,
    re_mode='pixel',
    re_count=1,
  )
  names = [type(t).__name__ for t in transform.transforms]
  assert names == [
    'RandomResizedCropAndInterpolation',
    'RandomHorizontalFlip',
    'RandAugment',
    'MaybeToTensor',
    'Normalize',
    'RandomErasing',
  ], names
  (augment,) = [t for t in transform.transforms if isinstance(t, RandAugment)]
  assert augment.num_layers == 2 and len(augment.ops) == 15 and augment.choice_weights is None
  for op in augment.ops:
    assert (op.prob, op.magnitude, op.magnitude_std) == (1.0 if every_op else 0.5, 9, 0.5), op
  return transform


class EndlessSampler(torch.utils.data.Sampler):
  """Random permutations of the dataset's indices, one epoch after another, without end."""

  def __init__(self, size: int, seed: int):
    self.size, self.seed = size, seed

  def __iter__(self):
    rng = np.random.default_rng(self.seed)
    while True:
      yield from rng.permutation(self.size).tolist()


def rusage_cpu(who: int) -> float:
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


def proc_cpu(pid: int) -> float:
  """utime + stime + cutime + cstime of a live process, in seconds, from /proc/<pid>/stat."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()  # the command name, in parentheses, may hold spaces
  return sum(int(x) for x in fields[11:15]) / TICK  # fields 14-17 of proc(5); fields[0] is field 3, the state


def snapshot(workers) -> dict:
  assert all(w.is_alive() for w in workers), 'a DataLoader worker exited inside the measurement'
  own, reaped = rusage_cpu(resource.RUSAGE_SELF), rusage_cpu(resource.RUSAGE_CHILDREN)
  live = sum(proc_cpu(w.pid) for w in workers)
  return {'wall': time.perf_counter(), 'own': own, 'reaped': reaped, 'live': live, 'cpu': own + reaped + live}


def measure(variant: str, args) -> dict:
  from torch.utils.data import DataLoader
  from torchvision import datasets

  dataset = datasets.ImageFolder(args.root, transform=build_transform(variant))
  loader = DataLoader(
    dataset,
    batch_size=args.batch_size,
    sampler=EndlessSampler(len(dataset), args.seed),
    num_workers=args.workers,
    drop_last=True,
    pin_memory=False,  # DeiT pins for its GPU copies; this torch is a CPU build
  )
  if args.show_transform:
    print(f'{variant}: {len(dataset)} images in {len(dataset.classes)} classes\n{dataset.transform}', file=sys.stderr)
  torch.manual_seed(args.seed)
  pass_start = snapshot([])
  iterator = iter(loader)
  workers = list(getattr(iterator, '_workers', []))
  images = batches = 0
  start = end = None
  for x, _ in iterator:
    batches, images = batches + 1, images + x.shape[0]
    if start is None:
      if batches >= 2 * max(args.workers, 1) and time.perf_counter() - pass_start['wall'] >= args.warmup:
        start = dict(snapshot(workers), images=images)
    elif time.perf_counter() - start['wall'] >= args.seconds:
      end = dict(snapshot(workers), images=images)
      break
  iterator._shutdown_workers()  # joins the workers: their whole CPU time now lands in RUSAGE_CHILDREN
  del iterator
  pass_end = snapshot([])
  window_images, wall, cpu = end['images'] - start['images'], end['wall'] - start['wall'], end['cpu'] - start['cpu']
  return {
    'variant': variant,
    'img_per_cpu_s': window_images / cpu,
    'img_per_s': window_images / wall,
    'window_images': window_images,
    'wall': wall,
    'cpu': cpu,
    'main_cpu': end['own'] - start['own'],
    'workers_cpu': end['live'] - start['live'] + end['reaped'] - start['reaped'],
    'pass_images': images,
    'pass_cpu': pass_end['cpu'] - pass_start['cpu'],
    'workers_cpu_proc_at_end': end['live'],
    'workers_cpu_rusage_after_exit': pass_end['reaped'] - pass_start['reaped'],
  }


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m experiments.rehearsal.timm_input')
  parser.add_argument('--variant', nargs='+', choices=VARIANTS, default=list(VARIANTS))
  parser.add_argument('--workers', type=int, default=2)
  parser.add_argument('--batch-size', type=int, default=64)
  parser.add_argument('--root', default='/tmp/inet/train', help='an ImageFolder: ROOT/<class>/<image>')
  parser.add_argument('--seconds', type=float, default=20.0, help='the least steady-state window measured')
  parser.add_argument('--warmup', type=float, default=5.0, help='seconds from the loader start left out')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--show-transform', action='store_true', help='print the dataset and transform of each variant')
  args = parser.parse_args()
  if not os.path.isdir(args.root):
    raise SystemExit(f'no ImageFolder at {args.root}')
  shimmed = torchvision_ops_shim()
  import PIL
  import timm
  import torchvision

  patched = posterize_zero_bits()

  print(
    f'torch {torch.__version__}, torchvision {torchvision.__version__}'
    f'{" (nms/qnms schemas declared by the shim)" if shimmed else ""}, timm {timm.__version__}, '
    f'Pillow {PIL.__version__}{" (posterize to 0 bits: black, as Pillow 12)" if patched else ""}, '
    f'{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start',
    file=sys.stderr,
  )
  print(f'{"variant":<14} {"img/cpu-s":>9} {"img/s":>7} {"workers":>7}', flush=True)
  for variant in args.variant:
    r = measure(variant, args)
    print(f'{variant:<14} {r["img_per_cpu_s"]:9.1f} {r["img_per_s"]:7.1f} {args.workers:7d}', flush=True)
    print(
      f'  {variant}: window {r["window_images"]} images in {r["wall"]:.1f} s wall, {r["cpu"]:.1f} CPU-s '
      f'(main {r["main_cpu"]:.1f}, workers {r["workers_cpu"]:.1f}; {r["cpu"] / r["wall"]:.2f} cores busy); '
      f'whole pass by getrusage alone: {r["pass_images"]} images / {r["pass_cpu"]:.1f} CPU-s = '
      f'{r["pass_images"] / r["pass_cpu"]:.1f} img/cpu-s; workers CPU-s: /proc at the last batch '
      f'{r["workers_cpu_proc_at_end"]:.1f}, RUSAGE_CHILDREN after exit {r["workers_cpu_rusage_after_exit"]:.1f}; '
      f'load average {os.getloadavg()[0]:.2f}',
      file=sys.stderr,
      flush=True,
    )


if __name__ == '__main__':
  main()
