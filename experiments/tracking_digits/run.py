"""Trains configs/tracking/digits.py with each box head and seed, scores them and two baselines on the built-in test
sequences, and writes the table and the tracking picture of README.md.

python -m experiments.tracking_digits.run                       # 2 heads x 3 seeds + baselines
python -m experiments.tracking_digits.run --heads corner --seeds 0
Each run is `python -m main --config configs/tracking/digits.py:HEAD --config.seed=SEED` as it stands, in a workdir
of its own under --workdir (a finished one is read back, not rerun); --jobs runs train at a time, each on its own
share of the CPU cores (2 on 2 cores: one core each, which keeps the table within 45 minutes). Every method is
scored by the same code, vit_jax_lab.tasks.tracking.sequence_metrics, on the whole test split, tracking from each
sequence's first box; the ViT's scores equal its run's final evaluation. FPS: frames tracked per second on this CPU
after compilation (the ViT: all test sequences as one batch under jit; the baselines: one sequence at a time in
NumPy).
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.tracking_digits.run')

import argparse
import os
import platform
import statistics
import time

import numpy as np

from experiments import common
from vit_jax_lab import config as config_lib

HEADS = ('mlp', 'corner')
SEQUENCE = 3  # The test sequence drawn as the tracking picture.


def held_box(frames: np.ndarray, first: np.ndarray, factor: float, online) -> np.ndarray:
  """The first box, held still in every frame."""
  del factor, online
  return np.repeat(first[None], len(frames), 0)


def template_matching(frames: np.ndarray, first: np.ndarray, factor: float, online) -> np.ndarray:
  """Normalised cross-correlation of the first frame's target patch with every placement inside the search region
  (the trackers' square of side factor * sqrt(w * h), cut to the frame) around the previous box, led by its velocity
  as the trackers' (`online`, a tasks.tracking.Online); the best placement is the new box (its size stays the first
  box's)."""
  from vit_jax_lab import boxes

  frames = frames[..., 0].astype(np.float32) if frames.shape[-1] == 1 else frames.astype(np.float32).mean(-1)
  height, width = frames.shape[1:]
  x, y, w, h = (int(round(v)) for v in first)
  x0, y0 = max(x, 0), max(y, 0)
  template = frames[0, y0 : min(y + h, height), x0 : min(x + w, width)]
  th, tw = template.shape
  t = (template - template.mean()) / (template.std() + 1e-6)
  out, box, velocity = [first], first.astype(np.float64), (0.0, 0.0)
  side = factor * np.sqrt(w * h)
  for frame in frames[1:]:
    cx, cy, _, _ = boxes.to_centre(online.ahead(tuple(box), velocity))
    left, top = int(max(0, round(cx - side / 2))), int(max(0, round(cy - side / 2)))
    right, bottom = int(min(width, round(cx + side / 2))), int(min(height, round(cy + side / 2)))
    new = box
    if bottom - top >= th and right - left >= tw:  # Else the region no longer holds the template: stay.
      windows = np.lib.stride_tricks.sliding_window_view(frame[top:bottom, left:right], (th, tw))
      mean, std = windows.mean((-2, -1)), windows.std((-2, -1)) + 1e-6
      score = np.einsum('ijkl,kl->ij', windows, t) / (th * tw) - mean * t.mean()
      i, j = np.unravel_index(np.argmax(score / std), score.shape)
      new = np.array([left + j - (x0 - x), top + i - (y0 - y), w, h], np.float64)
    velocity = online.moved(velocity, tuple(box), tuple(new))
    box = new
    out.append(box.copy())
  return np.array(out, np.float32)


def score(predicted: list[np.ndarray], truth: np.ndarray, frame_size: tuple[int, int]) -> dict[str, float]:
  """The scores of tasks.tracking.sequence_metrics over all sequences, as evaluation reports them."""
  from vit_jax_lab.tasks import tracking

  metrics = tracking.sequence_metrics(np.stack(predicted), truth, frame_size=frame_size)
  return tracking.metric_means(tracking.metric_sums(metrics))


def overlap_by_occlusion(
  predicted: list[np.ndarray], truth: np.ndarray, hidden: np.ndarray, frame_size: tuple[int, int]
) -> tuple[float, ...]:
  """AO (GOT-10k's, as `score` reports it) over frames 1.. whose target is hidden less than half, half or more, and
  wholly (hidden = 1)."""
  from vit_jax_lab.tasks import tracking

  def ao(frames):
    metrics = tracking.sequence_metrics(np.stack(predicted), truth, frames, frame_size)
    return tracking.metric_means(tracking.metric_sums(metrics))['ao'] if frames[:, 1:].any() else float('nan')

  return tuple(ao(m) for m in (hidden < 0.5, hidden >= 0.5, hidden >= 1))


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m experiments.tracking_digits.run')
  parser.add_argument('--heads', default=','.join(HEADS), help='box heads, comma-separated')
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--workdir', default=os.path.join(common.ROOT, 'runs', 'tracking_digits'))
  parser.add_argument('--data_dir', default=None, help='TFDS data_dir (default: TFDS default)')
  cores = len(common.pinnable_cores())
  parser.add_argument(
    '--jobs',
    type=int,
    default=min(2, max(cores, 1)),
    help='runs trained at a time, each pinned to its share of the cores (default 2; 1 where runs cannot be pinned)',
  )
  args = parser.parse_args()
  heads, seeds = args.heads.split(','), [int(s) for s in args.seeds.split(',')]
  unknown = [h for h in heads if h not in HEADS]
  if unknown:
    parser.error(f'--heads: {unknown[0]!r} is not one of {", ".join(HEADS)}')
  if not 1 <= args.jobs <= max(cores, 1):
    parser.error(
      f'--jobs {args.jobs}: give 1 to {max(cores, 1)}, the CPU cores runs can be pinned to here (Linux with taskset)'
    )

  import jax
  import jax.numpy as jnp
  import tensorflow_datasets as tfds

  from vit_jax_lab import tasks, train
  from vit_jax_lab.data import builders
  from vit_jax_lab.tasks import tracking
  from vit_jax_lab.tools import common as tool_common, track

  config = config_lib.load(os.path.join(common.ROOT, 'configs/tracking/digits.py'))
  builders.register(config.data.name)
  builder = tfds.builder(config.data.name, data_dir=args.data_dir)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  test = tfds.as_numpy(builder.as_dataset(split=config.data.eval_split, batch_size=-1))
  frames, truth = test['frames'], test['boxes']
  count, length = frames.shape[:2]
  frame_size = frames.shape[2:4]

  online = tasks.build(config.task).online  # How the trackers cut their search regions.
  baselines = [
    ('first box held still', held_box, online),
    ('template matching (NCC)', template_matching, tracking.Online()),
  ]
  if online.motion_rate:  # Template matching in the trackers' regions too, led by the velocity it tracks.
    baselines.append(('template matching (NCC), led by velocity', template_matching, online))
  rows, occlusion, hidden = [], [], test['hidden']
  for name, method, method_online in baselines:
    start = time.time()
    predicted = [method(f, b[0], config.data.search_factor, method_online) for f, b in zip(frames, truth)]
    fps = None if method is held_box else count * length / (time.time() - start)  # Holding computes nothing.
    rows.append((name, [score(predicted, truth, frame_size)], fps, None))
    occlusion.append((name, [overlap_by_occlusion(predicted, truth, hidden, frame_size)]))
    print(f'{name}: success AUC {rows[-1][1][0]["auc"]:.3f}', flush=True)

  low, high = config.data.value_range
  scaled = jnp.asarray(frames, jnp.float32) / 255.0 * (high - low) + low
  workdirs = {(h, s): os.path.join(args.workdir, f'{h}_seed{s}') for h in heads for s in seeds}
  data_dir = {'data.data_dir': args.data_dir} if args.data_dir else {}
  runs = [(f'configs/tracking/digits.py:{h}', workdir, {'seed': s, **data_dir}) for (h, s), workdir in workdirs.items()]
  common.train_all(runs, args.jobs)
  minutes = common.training_minutes(list(workdirs.values()))
  for head in heads:
    results, fps_runs, walls, by_occlusion = [], [], [], []
    for seed in seeds:
      workdir = workdirs[head, seed]
      walls.append(common.wall(workdir)['seconds'])
      run_config = tool_common.one_device_one_example(tool_common.config_of(workdir, None, []))
      s = train.setup(run_config, jax.devices()[:1])
      model = tool_common.load_model(s, workdir)
      fn = jax.jit(lambda f, b, model=model, s=s: tracking.track(model, f, b, s.info, s.task.online)[0])
      jax.block_until_ready(fn(scaled, jnp.asarray(truth[:, 0])))  # Compiles.
      start = time.time()
      predicted = np.asarray(jax.block_until_ready(fn(scaled, jnp.asarray(truth[:, 0]))))
      fps_runs.append(count * (length - 1) / (time.time() - start))
      results.append(score(list(predicted), truth, frame_size))
      by_occlusion.append(overlap_by_occlusion(list(predicted), truth, hidden, frame_size))
      print(f'{head} seed {seed}: success AUC {results[-1]["auc"]:.3f}  {fps_runs[-1]:.0f} FPS', flush=True)
      if head == 'corner' and seed == seeds[0]:
        picture = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'track.png')
        one = track.run(model, frames[SEQUENCE], truth[SEQUENCE, 0], s.info, run_config.data.value_range, s.task.online)
        title = f'test sequence {SEQUENCE}, corner head, seed {seed}'
        track.draw(picture, frames[SEQUENCE], one[0], truth[SEQUENCE], *one[2:5], title, one[5])
    rows.append((f'tracking ViT, {head} head', results, statistics.median(fps_runs), walls))
    occlusion.append((f'tracking ViT, {head} head', by_occlusion))

  def stat(values):
    return common.mean_spread(values, 3)

  lines = [
    f'Regenerated by `python -m experiments.tracking_digits.run --heads {",".join(heads)} --seeds '
    f'{",".join(map(str, seeds))}` ({minutes:.0f} minutes of training, {args.jobs} runs at a time) on '
    f'{platform.machine()}, '
    f'{os.cpu_count()} cores, CPU only: {config.data.name}, {count} test sequences of {length} frames, tracked from '
    f'the first box; ViT rows: mean ± std over seeds {", ".join(map(str, seeds))}.',
    '',
    '| tracker | success AUC | precision (20 px) | norm. precision | AO | SR0.5 | SR0.75 | FPS | training (s) |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for name, results, fps, walls in rows:
    cells = [stat([r[k] for r in results]) for k in ('auc', 'precision', 'norm_precision', 'ao', 'sr50', 'sr75')]
    speed, training = ('—' if fps is None else f'{fps:,.0f}'), (f'{statistics.mean(walls):.0f}' if walls else '—')
    lines.append(f'| {name} | {" | ".join(cells)} | {speed} | {training} |')
  common.write_table(__file__, lines)
  fractions = [
    float((hidden[:, 1:] < 0.5).mean()),
    float((hidden[:, 1:] >= 0.5).mean()),
    float((hidden[:, 1:] >= 1).mean()),
  ]
  lines = [
    f'AO (mean IoU) by how much of the target distractors hide, over frames 1.. of the {count} test sequences '
    f'({100 * fractions[0]:.1f}% of frames less than half hidden, {100 * fractions[1]:.1f}% half or more, '
    f'{100 * fractions[2]:.1f}% wholly); ViT rows: mean over seeds.',
    '',
    '| tracker | hidden < 0.5 | hidden ≥ 0.5 | wholly hidden |',
    '|---|---:|---:|---:|',
  ]
  for name, values in occlusion:
    lines.append(f'| {name} | ' + ' | '.join(f'{statistics.mean(v[k] for v in values):.3f}' for k in range(3)) + ' |')
  common.write_table(__file__, lines, marker='occlusion')


if __name__ == '__main__':
  main()
