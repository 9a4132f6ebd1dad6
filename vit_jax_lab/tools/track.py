"""Tracks one sequence with a trained tracking ViT and draws it (matplotlib) as the tracking-ViT paper does.

python -m vit_jax_lab.tools.track --workdir runs/track --sequence 3        # runs/track/track_sequence3.png
python -m vit_jax_lab.tools.track --workdir runs/track --sequence 3 --out track.gif      # every frame, animated
python -m vit_jax_lab.tools.track --workdir runs/track --video clip.mp4 --box 120,80,40,60 --out clip.gif

The figure's columns are frames; its first row the frames with the predicted box (green) and the true one (red, for
a test sequence), as its legend says; the second the regression token's attention over each frame's search region,
the third the class token's, each row with its colour bar (the share of the token's attention per patch).
--video is a video file or a folder of frames (natural order); --box the target's (x, y, w, h) in pixels in its
first frame. --out defaults into the run's workdir. The predicted boxes are written beside it as OUT.txt, one
"x,y,w,h" line per frame (GOT-10k's).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from PIL import Image

from vit_jax_lab import boxes, console, errors, tasks, train
from vit_jax_lab.data.builders import folder
from vit_jax_lab.errors import ConfigError, check
from vit_jax_lab.tasks import tracking
from vit_jax_lab.tools import common

# Loaded at their first use (console.lazy): they import TensorFlow, which --help and a mistake in the arguments
# need not wait for.
videos = console.lazy('vit_jax_lab.data.videos')

SHOWN = 8  # Frames in the PNG, evenly spaced from the first to the last.
PREDICTED, TRUE, SEARCHED = 'lime', 'red', 'deepskyblue'  # Box colours; SEARCHED: the search crop's region.


def read_video(path: str, channels: int) -> np.ndarray:
  """(T, H, W, channels) uint8 frames of a video file or a folder of images; one line for an empty or bad one."""
  check(os.path.exists(path), f'--video {path} does not exist: give a video file or a folder of frames')
  if os.path.isdir(path):
    names = sorted(
      (n for n in os.listdir(path) if n.lower().endswith(folder.JPEG_PNG_EXTENSIONS)), key=folder.natural_key
    )
    check(names, f'--video {path} holds no frames ({"/".join(folder.JPEG_PNG_EXTENSIONS)} files)')
    frames = [Image.open(os.path.join(path, n)) for n in names]
  else:
    av = folder._import_av(path)
    try:
      with av.open(path) as container:
        frames = [frame.to_image() for frame in container.decode(video=0)]
    except (av.FFmpegError, ValueError, IndexError) as e:
      raise ConfigError(f'--video {path} does not decode as a video ({type(e).__name__})') from None
    check(frames, f'--video {path} has no frames')
  sizes = {f.size for f in frames}
  check(len(sizes) == 1, f'--video {path}: its frames differ in size {sorted(sizes)}')
  mode = 'L' if channels == 1 else 'RGB'
  return np.stack([np.asarray(f.convert(mode)).reshape(f.size[1], f.size[0], channels) for f in frames])


def parse_box(text: str, height: int, width: int) -> np.ndarray:
  """'x,y,w,h' -> float32 (4,), checked to be a box of positive size overlapping the frame."""
  try:
    box = np.array([float(v) for v in text.split(',')], np.float32)
  except ValueError:
    box = np.zeros(0)
  check(box.shape == (4,), f'--box {text!r}: expected x,y,w,h in pixels, e.g. --box 12,30,16,16')
  x, y, w, h = box
  check(w > 0 and h > 0, f'--box {text!r}: width and height must be positive')
  check(
    x < width and y < height and x + w > 0 and y + h > 0,
    f'--box {text!r} lies outside the first frame ({width} x {height} pixels): give x,y,w,h inside it',
  )
  return box


def load_sequence(s: train.Setup, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(frames uint8 (T, H, W, C), true boxes (T, 4), absent (T,): frames without the target) of sequence `index`
  of the eval split; a benchmark's encoded frames decoded."""
  count = s.builder.info.splits[s.config.data.eval_split].num_examples
  check(0 <= index < count, f'--sequence={index}: the eval split has {count} sequences (0 to {count - 1})')
  split = f'{s.config.data.eval_split}[{index}:{index + 1}]'
  example = next(iter(s.task.prepare(s.info, False)(s.builder.as_dataset(split=split))))  # 'absent' as evaluated.
  frames = videos.decode_frames(example['frames'], s.info.channels).numpy()
  return frames, example['boxes'].numpy(), example['absent'].numpy()


def run(
  model, frames: np.ndarray, first_box: np.ndarray, geometry, value_range, online: tracking.Online
) -> tuple[np.ndarray, ...]:
  """Tracks `frames` (uint8) from `first_box`: (boxes (T, 4), class logits (T,), search crops (T, S, S, C) in [0, 1],
  class and regression attention (T, gh, gw), the crops' regions in the frames (T, 4) as x, y, w, h); frame 0's
  crop and maps are those of its own box."""
  low, high = value_range
  scaled = jnp.asarray(frames, jnp.float32)[None] / 255.0 * (high - low) + low
  predicted, logits = jax.jit(lambda f, b: tracking.track(model, f, b, geometry, online))(
    scaled, jnp.asarray(first_box)[None]
  )
  predicted = np.asarray(predicted[0])
  searched = online.searched(predicted)  # Frame t's search region, cut around box t - 1 led by its velocity.

  def region(box_rows, factor):
    return boxes.region(tuple(jnp.unstack(jnp.asarray(box_rows), axis=-1)), factor)

  g = geometry
  template = tracking.crops(scaled[:, 0], region(first_box[None], g.template_factor), g.template_size)
  searched_region = region(searched, g.search_factor)
  search = tracking.crops(scaled[0], searched_region, g.search_size)
  cls, reg = jax.jit(model.search_attention)(jnp.repeat(template, len(frames), 0), search)
  crops_01 = (np.asarray(search) - low) / (high - low)
  x0, y0, side = (np.asarray(v) for v in searched_region)
  return (
    predicted,
    np.asarray(logits[0]),
    crops_01,
    np.asarray(cls),
    np.asarray(reg),
    np.stack([x0, y0, side, side], -1),
  )


def figure(
  frames, predicted, truth, crops, cls, reg, shown: list[int], title: str, scaled=None, regions=None
) -> Figure:
  """Columns `shown` of the frames: the frame with its boxes (the true one dashed, over the predicted one; dotted,
  the region `regions` its search crop was cut from, when given), the regression token's attention over its search
  crop, the class token's; a legend for the boxes, a colour bar per attention row, whose scale runs to the highest
  share over the frames `scaled` (default: `shown`), so the frames of an animation share it."""
  fig = Figure(figsize=(1.75 * len(shown) + 1.4, 6.4), layout='constrained')
  axes = fig.subplots(3, len(shown), squeeze=False)
  rows = ((reg, "regression token's\nattention"), (cls, "class token's\nattention"))
  for i, t in enumerate(shown):
    ax = axes[0, i]
    ax.imshow(_shown(frames[t]), cmap='gray', vmin=0, vmax=255)
    outlines = (
      (None if regions is None else regions[t], SEARCHED, ':'),
      (predicted[t], PREDICTED, '-'),
      (None if truth is None else truth[t], TRUE, '--'),
    )
    for box, colour, style in outlines:
      if box is not None and np.isfinite(box).all():  # A frame without the target has no true box.
        x1, y1, x2, y2 = boxes.to_corners(tuple(box))
        ax.add_patch(
          Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=1.5, linestyle=style)
        )
    ax.set_title(f'frame {t}')
  for row, (maps, label) in enumerate(rows, start=1):
    top = float(max(maps[t].max() for t in (shown if scaled is None else scaled)))
    for i, t in enumerate(shown):
      ax, size = axes[row, i], crops.shape[1]
      ax.imshow(_shown(255 * crops[t]), cmap='gray', vmin=0, vmax=255)
      heat = ax.imshow(
        maps[t],
        cmap='inferno',
        alpha=0.65,
        vmin=0.0,
        vmax=top,
        interpolation='bilinear',
        extent=(-0.5, size - 0.5, size - 0.5, -0.5),
      )
    axes[row, 0].set_ylabel(label)
    fig.colorbar(heat, ax=axes[row, :], shrink=0.9, label='attention share')
  axes[0, 0].set_ylabel('frame')
  for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
  handles = [Patch(fill=False, edgecolor=PREDICTED, label='predicted box')]
  if truth is not None:
    handles.append(Patch(fill=False, edgecolor=TRUE, linestyle='--', label='true box'))
  if regions is not None:
    handles.append(Patch(fill=False, edgecolor=SEARCHED, linestyle=':', label='search crop (rows 2, 3)'))
  # Below: the title keeps the top. In one row only where the columns are wide enough (an animation's one column
  # would cut it at both edges).
  fig.legend(handles=handles, loc='outside lower center', ncols=len(handles) if len(shown) >= 3 else 1)
  fig.suptitle(title)
  return fig


def _shown(image: np.ndarray) -> np.ndarray:
  image = np.clip(image, 0, 255).astype(np.uint8)
  return image[..., 0] if image.shape[-1] == 1 else image


def _pixels(fig: Figure) -> Image.Image:
  canvas = FigureCanvasAgg(fig)
  canvas.draw()
  return Image.fromarray(np.asarray(canvas.buffer_rgba())).convert('RGB')


def draw(path: str, frames, predicted, truth, crops, cls, reg, title: str, regions=None) -> Figure:
  """A PNG of SHOWN columns (returns its figure), or (a .gif path) every frame's column as an animation (returns
  the last frame's)."""
  if path.lower().endswith('.gif'):
    every = list(range(len(frames)))
    figures = [figure(frames, predicted, truth, crops, cls, reg, [t], title, every, regions) for t in every]
    images = [_pixels(f) for f in figures]
    images[0].save(path, save_all=True, append_images=images[1:], duration=120, loop=0)
    return figures[-1]
  shown = np.unique(np.linspace(0, len(frames) - 1, min(SHOWN, len(frames))).round().astype(int)).tolist()
  fig = figure(frames, predicted, truth, crops, cls, reg, shown, title, regions=regions)
  fig.savefig(path, dpi=100)
  return fig


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.track', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', help='a tracking run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file (with --config.init_from=...) instead of --workdir')
  parser.add_argument('--sequence', type=int, default=0, help='index in the eval split')
  parser.add_argument('--video', help='a video file or a folder of frames, instead of --sequence')
  parser.add_argument('--box', help="the target's x,y,w,h in the first frame of --video")
  parser.add_argument(
    '--out', help='the .png (or .gif) to write; default: track_sequenceN.png or track_VIDEO.png in --workdir'
  )
  args, overrides = parser.parse_known_args(argv)
  config = common.one_device_one_example(common.config_of(args.workdir, args.config, overrides))
  predicts = tasks.get(config.task.name).predicts
  check(predicts == 'boxes', f'task.name={config.task.name!r} predicts {predicts}: track draws tracking runs')
  check(not config.model.scan, 'track draws attention of unscanned layers: this run has model.scan=True')
  check((args.video is None) == (args.box is None), "give --video and --box together (the first frame's box)")
  name = f'sequence{args.sequence}' if args.video is None else os.path.splitext(os.path.basename(args.video))[0]
  check(args.out or args.workdir, '--out: give the .png or .gif to write (with --config there is no run folder)')
  out = args.out or os.path.join(args.workdir, f'track_{name}.png')
  s = train.setup(config, jax.devices()[:1])
  model = common.load_model(s, args.workdir)
  if args.video:
    frames = read_video(args.video, s.info.channels)
    check(len(frames) >= 2, f'--video {args.video} has {len(frames)} frame: tracking needs 2 or more')
    truth, first = None, parse_box(args.box, *frames.shape[1:3])
    title = f'{os.path.basename(args.video)} tracked from the box {args.box}'
  else:
    frames, truth, absent = load_sequence(s, args.sequence)
    first = truth[0]
  predicted, _, crops, cls, reg, regions = run(model, frames, first, s.info, s.config.data.value_range, s.task.online)
  if truth is not None:
    metrics = tracking.sequence_metrics(predicted[None], truth[None], ~absent[None], frames.shape[1:3])
    means = tracking.metric_means(tracking.metric_sums(metrics))
    print('  '.join(f'{k} {v:.4f}' for k, v in means.items()))
    title = f'sequence {args.sequence} of {s.config.data.eval_split}: success AUC {means["auc"]:.3f}'
  errors.write_output(out, lambda path: draw(path, frames, predicted, truth, crops, cls, reg, title, regions))
  np.savetxt(os.path.splitext(out)[0] + '.txt', predicted, fmt='%.2f', delimiter=',')
  print(f'wrote {out} and {os.path.splitext(out)[0]}.txt')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
