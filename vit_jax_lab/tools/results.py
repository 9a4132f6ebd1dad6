"""Tracks every sequence of a split with a trained tracking ViT and writes the result files the tracking toolkits
read: GOT-10k's test split, whose boxes after the first are withheld, is scored only by its server, from these.

python -m vit_jax_lab.tools.results --workdir runs/got10k --split test --out results/got10k_test
    # results/got10k_test/<sequence>/<sequence>_001.txt and <sequence>_time.txt, zipped as results/got10k_test.zip:
    # the file the GOT-10k server takes
python -m vit_jax_lab.tools.results --config configs/tracking/got10k.py:lasot --config.init_from=runs/got10k \
    --config.data.data_dir=/datasets/tfds --out results/lasot   # <sequence>.txt, times/<sequence>_time.txt

--split defaults to the config's data.eval_split. --layout: 'got10k' (a folder per sequence, zipped) or 'otb' (a
file per sequence, as the got10k toolkit's OTB, UAV123 and LaSOT experiments keep them); by default got10k for
GOT-10k, otb for the others. Boxes are x,y,w,h in pixels, one line per frame, the first the given box; times are the
seconds each frame took (cropping, the model, the box update; decoding not), the first the template's. The model is
compiled before the first frame; the first two frames of each new frame size also compile its crops.
"""

import os
import shutil
import sys
import time
from typing import Iterator

import jax
import numpy as np

from vit_jax_lab import console, tasks, train
from vit_jax_lab.errors import check
from vit_jax_lab.tasks import tracking
from vit_jax_lab.tools import common

# Loaded at their first use (console.lazy): they import TensorFlow, which --help and a mistake in the arguments
# need not wait for.
data_tracking = console.lazy('vit_jax_lab.data.tracking')

LAYOUTS = ('got10k', 'otb')


def timed(frames: Iterator[np.ndarray], seconds: list[float]) -> Iterator[np.ndarray]:
  """`frames`, appending to `seconds` the time from handing out each frame to the request for the next: the time
  the consumer spent on that frame."""
  for frame in frames:
    start = time.perf_counter()
    yield frame
    seconds.append(time.perf_counter() - start)


def write(out: str, layout: str, name: str, boxes: np.ndarray, seconds: np.ndarray) -> None:
  """One sequence's boxes and times in `layout` under `out`."""
  if layout == 'got10k':
    box_file, time_file = os.path.join(out, name, f'{name}_001.txt'), os.path.join(out, name, f'{name}_time.txt')
  else:
    box_file, time_file = os.path.join(out, f'{name}.txt'), os.path.join(out, 'times', f'{name}_time.txt')
  for path, values, fmt in ((box_file, boxes, '%.3f'), (time_file, seconds, '%.8f')):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savetxt(path, values, fmt=fmt, delimiter=',')


def run(argv: list[str]) -> tuple[list[str], int]:
  """(the folder written and its zip (got10k layout), the number of sequences)."""
  parser = console.Parser(prog='python -m vit_jax_lab.tools.results', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', help='a tracking run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file (with --config.init_from=...) instead of --workdir')
  parser.add_argument('--split', help="the split tracked (default: the config's data.eval_split)")
  parser.add_argument('--layout', choices=LAYOUTS, help='got10k: a folder per sequence, zipped; otb: a file each')
  parser.add_argument('--out', required=True, help='a new folder for the result files')
  args, overrides = parser.parse_known_args(argv)
  common.check_new(args.out, makes_folder=True)
  config = common.one_device_one_example(common.config_of(args.workdir, args.config, overrides))
  predicts = tasks.get(config.task.name).predicts
  check(predicts == 'boxes', f'task.name={config.task.name!r} predicts {predicts}: results tracks tracking runs')
  layout = args.layout or ('got10k' if config.data.name.endswith('got10k') else 'otb')
  if layout == 'got10k':
    common.check_new(args.out + '.zip', makes_folder=True)
  s = train.setup(config, jax.devices()[:1])
  split = args.split or config.data.eval_split
  splits = s.builder.info.splits
  check(split in splits, f'--split {split}: {config.data.name} has the splits {", ".join(splits)}')
  g = s.info
  predict = train.host_predict(s, common.params_of(s, args.workdir))
  jax.block_until_ready(  # Compiled before any frame is timed.
    predict(*(np.zeros((1, n, n, g.channels), np.float32) for n in (g.template_size, g.search_size)))
  )
  count = 0
  examples = s.builder.as_dataset(split=split, shuffle_files=False)
  examples = examples.map(lambda ex: ex | {'frames': data_tracking.read_frames(ex['frames'], g)})  # The files.
  for count, example in enumerate(examples.as_numpy_iterator(), 1):
    name = example['name'].decode() if 'name' in example else f'{count - 1:05d}'
    frames = data_tracking.decoded_frames(example['frames'], g)
    seconds = []
    boxes, _ = tracking.track_frames(predict, timed(frames, seconds), example['boxes'][0], g, s.task.online)
    write(args.out, layout, name, boxes, np.asarray(seconds))
  written = [args.out]
  if layout == 'got10k':
    written.append(shutil.make_archive(args.out, 'zip', args.out))
  return written, count


@console.command
def main(argv: list[str]) -> int:
  written, count = run(argv)
  print(f'wrote the results of {count} sequences: {" and ".join(written)}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
