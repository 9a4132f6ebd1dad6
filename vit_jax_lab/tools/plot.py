"""Plots one or more runs' train and eval metrics from their metrics.jsonl to a PNG, one panel per metric and one
line per run: the comparison TensorBoard shows, as a file to keep beside the runs.

python -m vit_jax_lab.tools.plot runs/vit_digits                                  # runs/vit_digits/curves.png
python -m vit_jax_lab.tools.plot runs/a runs/b --metrics train/loss,eval/accuracy --out compare.png

--metrics defaults to every metric the runs logged but train/steps_per_sec and eval/examples. Each run is named by
its folder. --out defaults to curves.png in the run's folder, and for several runs to curves_with_<the others>.png in
the first's.
"""

import json
import os
import re
import sys

from matplotlib.figure import Figure

from vit_jax_lab import console, errors
from vit_jax_lab.errors import ConfigError, check

SKIPPED = ('train/steps_per_sec', 'eval/examples', 'eval/sequences')  # Not curves of learning.


def read(workdir: str) -> dict[str, tuple[list[int], list[float]]]:
  """metric -> (steps, values) of the run in `workdir`, in the order it logged them."""
  path = os.path.join(workdir, 'metrics.jsonl')
  check(os.path.isfile(path), f'{workdir} has no metrics.jsonl file: give the folder of a run (its --workdir)')
  curves: dict[str, tuple[list[int], list[float]]] = {}
  with open(path, errors='replace') as f:
    for number, line in enumerate(f, 1):
      try:
        row = json.loads(line)
        step = int(row.pop('step'))
        values = {key: float(value) for key, value in row.items()}
      except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise ConfigError(
          f'{path}:{number} is not a metrics line of numbers ({errors.foreign(line.strip(), 60)!r})'
        ) from None
      for key, value in values.items():
        steps, logged = curves.setdefault(key, ([], []))
        steps.append(step)
        logged.append(value)
  return curves


def figure(runs: dict[str, dict[str, tuple[list[int], list[float]]]], metrics: list[str]) -> Figure:
  """One panel per metric (titled with it), one line per run (the legend names the runs), steps across."""
  columns = min(len(metrics), 3)
  rows = -(-len(metrics) // columns)
  fig = Figure(figsize=(4.6 * columns, 3.4 * rows), layout='constrained')
  axes = fig.subplots(rows, columns, squeeze=False).flat
  for ax, metric in zip(axes, metrics):
    for name, curves in runs.items():
      if metric in curves:
        steps, values = curves[metric]
        ax.plot(steps, values, marker='o' if len(steps) < 20 else None, markersize=3, label=name)
    ax.set_title(metric)
    ax.set_xlabel('step')
    ax.grid(alpha=0.3)
  for ax in axes:  # Panels left over in the last row.
    ax.set_visible(False)
  handles, labels = fig.axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='outside lower center', ncols=min(len(labels), 4))  # The title is on top.
  fig.suptitle(f'metrics.jsonl of {len(runs)} run{"s" if len(runs) > 1 else ""}')
  return fig


def names(workdirs: list[str]) -> list[str]:
  """Each run's folder name; the path when two have the same name."""
  short = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  return short if len(set(short)) == len(short) else [os.path.normpath(w) for w in workdirs]


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.plot', description=__doc__.split('\n\n')[0])
  parser.add_argument('workdirs', nargs='+', help="runs' folders (their --workdir), each with its metrics.jsonl")
  parser.add_argument('--metrics', help='comma-separated, e.g. train/loss,eval/accuracy; default: all')
  parser.add_argument(
    '--out', help='the PNG to write; default: curves.png in the run (several: curves_with_OTHERS.png in the first)'
  )
  args = parser.parse_args(argv)
  runs = dict(zip(names(args.workdirs), map(read, args.workdirs)))
  logged = list(dict.fromkeys(k for curves in runs.values() for k in curves))
  if args.metrics is None:
    metrics = [k for k in logged if k not in SKIPPED]
  else:
    metrics = [m.strip() for m in args.metrics.split(',') if m.strip()]
    unknown = [m for m in metrics if m not in logged]
    check(not unknown, f'--metrics: {", ".join(unknown)} not logged by these runs; they logged {", ".join(logged)}')
  check(metrics, f'{", ".join(args.workdirs)}: nothing to plot yet (no metrics logged)')
  # Several runs: a file of their own beside the first run's curves.png, which it would otherwise replace.
  others = '_'.join(re.sub(r'[^\w.-]+', '-', name) for name in list(runs)[1:])
  out = args.out or os.path.join(args.workdirs[0], f'curves_with_{others}.png' if others else 'curves.png')
  if not os.path.splitext(out)[1]:
    out += '.png'  # What matplotlib would write; said as written.
  check(out.lower().endswith('.png'), f'--out {out}: write a .png file')
  check(not os.path.isdir(out), f'--out {out} is a folder: name the .png file to write')
  check(os.path.isdir(os.path.dirname(os.path.abspath(out))), f'--out {out}: its folder does not exist (make it first)')
  errors.write_output(out, lambda path: figure(runs, metrics).savefig(path, dpi=100))
  print(f'wrote {out}: {len(metrics)} metrics of {len(runs)} run{"s" if len(runs) > 1 else ""}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
