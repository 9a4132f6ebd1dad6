"""Few-shot linear evaluation of a run or a released checkpoint, printed as a table (vit_jax_lab/evaluators/fewshot.py).

python -m vit_jax_lab.tools.fewshot --workdir runs/vit_digits [--dataset digits] [--shots 1,5,10,25] [--draws 5]
python -m vit_jax_lab.tools.fewshot --config configs/vit/finetune.py:cifar10,B/16 --config.init_from=ViT-B_16.npz \
    --config.data.data_dir=/datasets/tfds --dataset cifar100,oxford_iiit_pet

Defaults come from the config (`eval.fewshot`; a run's datasets, else its own data.name), so on a finished run
it reproduces the few-shot numbers the run logged at its end: the same parameters (the average, with
ema_decay), seed and draws. `--config` evaluates the weights `--config.init_from` names (a release .npz or a run),
or, without it, the config's model at its random initialisation. No training happens here, so any batch fits: the
run's data.eval_batch_size, rounded to this machine's devices (--batch_size sets another).

On the data the model was trained on (the default without eval.fewshot.datasets), a trained model's features are
already grouped by class, so every draw's probe tends to classify the test images as the model's head does: the
same accuracy at every k, with a spread of 0. Few-shot evaluation measures how features transfer to other
classes: name other datasets with --dataset.
"""

import sys

import jax
import ml_collections
import numpy as np

from vit_jax_lab import console, tasks, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tools import common

# Loaded at their first use (console.lazy): they import TensorFlow, which --help and a mistake in the arguments
# need not wait for.
pipeline = console.lazy('vit_jax_lab.data.pipeline')
fewshot = console.lazy('vit_jax_lab.evaluators.fewshot')


def run(argv: list[str]) -> dict[str, dict[int, np.ndarray]]:
  """The command without its printing: dataset -> k -> the test accuracy of every draw."""
  return evaluate(*_config(argv))[0]


def evaluate(
  config: ml_collections.ConfigDict, workdir: str | None, fit_shots: bool = False
) -> tuple[dict[str, dict[int, np.ndarray]], list[str]]:
  """(dataset -> k -> the test accuracy of every draw, notes), of the parameters `config` and `workdir` name.
  `fit_shots`: leave out the k a dataset cannot fill (the shots were not chosen) instead of refusing them."""
  task = tasks.build(config.task)
  # Passed to setup, so that its check of the run's eval batch against the eval split (a training concern, which
  # depends on the run's device count) does not apply: here a batch larger than a split is padded.
  data = pipeline.load(config.data, lambda b, d: task.dataset_info(b, d, workdir))
  s = train.setup(config, data=data, workdir=workdir)
  params = common.params_of(s, workdir)
  evaluator = fewshot.Evaluator(config, s.mesh, s.graphdef, s.state_shardings.params, s.info, fit_shots=fit_shots)
  return evaluator.results(params), evaluator.notes


def _config(argv: list[str]) -> tuple[ml_collections.ConfigDict, str | None, bool]:
  """(config, workdir, whether to fit the shots to the data: the user gave none)."""
  parser = console.Parser(prog='python -m vit_jax_lab.tools.fewshot', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', help='a run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file (with --config.init_from=...) instead of --workdir')
  parser.add_argument('--dataset', help='comma-separated TFDS names; default: eval.fewshot.datasets, else data.name')
  parser.add_argument('--shots', help='comma-separated k, e.g. 1,5,10,25; default: eval.fewshot.shots')
  parser.add_argument('--draws', type=int, help='random draws per k; default: eval.fewshot.draws')
  parser.add_argument(
    '--batch_size',
    '--batch-size',  # The spelling it had before the other tools' --batch_size.
    type=int,
    help='examples per forward pass; default: data.eval_batch_size rounded down to a multiple of the device count',
  )
  args, overrides = parser.parse_known_args(argv)
  shots = None
  if args.shots is not None:  # The flags' mistakes name the flags, before anything loads.
    try:
      shots = tuple(int(k) for k in args.shots.split(','))
    except ValueError:
      raise ConfigError(f'--shots {args.shots}: expected comma-separated integers, e.g. 1,5,10,25') from None
    if min(shots) < 1 or len(set(shots)) < len(shots):
      raise ConfigError(f'--shots {args.shots}: give distinct positive integers, e.g. 1,5,10,25')
  if args.draws is not None and args.draws < 1:
    raise ConfigError(f'--draws {args.draws}: give a positive number of draws, e.g. 5')
  if args.batch_size is not None and args.batch_size < 1:
    raise ConfigError(f'--batch_size {args.batch_size}: give a positive batch size')
  config = common.config_of(args.workdir, args.config, overrides)
  config.mesh.data, config.mesh.fsdp, config.mesh.model = -1, 1, 1  # Whatever devices this machine has.
  config.data.shards = -1
  devices = jax.device_count()
  if args.batch_size is not None:
    if args.batch_size % devices:
      raise ConfigError(f'--batch_size {args.batch_size}: must be a multiple of the device count, {devices}')
    batch = args.batch_size
  else:
    batch = max(devices, config.data.eval_batch_size // devices * devices)
  config.accum_steps, config.data.batch_size, config.data.eval_batch_size = 1, batch, batch  # No training here.
  f = config.eval.fewshot
  if args.dataset is not None:
    f.datasets = tuple(name.strip() for name in args.dataset.split(','))
  elif not f.datasets:
    f.datasets = (config.data.name,)
  if shots is not None:
    f.shots = shots
  if args.draws is not None:
    f.draws = args.draws
  return config, args.workdir, args.shots is None


def table(results: dict[str, dict[int, np.ndarray]]) -> list[str]:
  """Markdown rows: one per dataset, mean ± standard deviation (over the draws) of the test accuracy in %."""
  shots = sorted({k for by_k in results.values() for k in by_k})
  lines = ['| dataset | ' + ' | '.join(f'{k}-shot' for k in shots) + ' |', '|---' * (len(shots) + 1) + '|']
  for name, by_k in results.items():
    cells = [f'{100 * by_k[k].mean():.2f} ± {100 * _std(by_k[k]):.2f}' if k in by_k else '' for k in shots]
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  return lines


def _std(values: np.ndarray) -> float:
  """The sample standard deviation (0 for one value)."""
  return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


@console.command
def main(argv: list[str]) -> int:
  config, workdir, fit_shots = _config(argv)
  results, notes = evaluate(config, workdir, fit_shots)
  draws = len(next(iter(next(iter(results.values())).values())))
  print(f'few-shot linear evaluation: test accuracy (%), mean ± std over {draws} draws')
  print('\n'.join(table(results)))
  for note in notes:
    print(f'note: {note}')
  own = [name for name in results if workdir is not None and name == config.data.name]
  if own:
    print(
      f'note: {", ".join(own)} is the data the model was trained on: the probes measure how well its features '
      'separate classes it has learnt, not transfer; name other datasets with --dataset'
    )
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
