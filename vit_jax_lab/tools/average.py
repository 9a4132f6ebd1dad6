"""Averages the parameters of a run's last N checkpoints into a new workdir, and evaluates the average.

python -m vit_jax_lab.tools.average --workdir runs/wmt_base --last 5 --out runs/wmt_base_avg5

The Transformer paper's numbers are of such averages (the last 5 checkpoints, 10 minutes apart, for the base
model; 20 for big). The new workdir holds the run's config and one checkpoint, at the newest step, whose
parameters (and parameter average, with config.ema_decay) are the mean over the N checkpoints; the rest of the
state is the newest one's. Evaluation, `tools.export`, `init_from` and `python -m main` (which says the run is
complete) read it like any run. Nothing in --workdir changes.
"""

import json
import os
import shutil
import sys

import jax

from vit_jax_lab import checkpoints, console, parallel, reporting, train, workdir as workdir_lib
from vit_jax_lab.errors import check
from vit_jax_lab.tools import common

# What a run's workdir holds besides its config that the run reads back (a trained vocabulary): copied along.
_NOT_COPIED = ('lock', 'metrics.jsonl', 'config.json')


def average(workdir: str, last: int, out: str, *, data_dir: str | None = None, evaluate: bool = True) -> dict:
  """Writes the average of the newest `last` checkpoints of `workdir` to the new workdir `out`; returns the
  eval metrics of the average (empty when not `evaluate`)."""
  check(last >= 1, f'--last {last}: average at least 1 checkpoint')
  common.check_new(out)
  config = workdir_lib.load_run(workdir)
  if data_dir is not None:
    config.data.data_dir = data_dir
  source = checkpoints.Checkpointer(workdir, every=1, keep=2**31 - 1)  # Reads only: never saves, never deletes.
  steps = sorted(source.manager.all_steps())[-last:]
  check(
    len(steps) == last,
    f'{workdir} has {len(steps)} checkpoint(s) (steps {", ".join(map(str, steps)) or "none"}), fewer than '
    f'--last {last}: average fewer, or keep more in training (--config.keep)',
  )
  s = train.setup(config, workdir=workdir)
  abstract = checkpoints.abstract(s.abstract_state, s.state_shardings)
  mean = None
  for k, step in enumerate(steps, start=1):  # The running mean: exact when the checkpoints are equal.
    state, failure = source.read_whole(step, abstract)
    check(
      failure is None,
      f'checkpoint {step} of {workdir} does not read whole ({failure}): resuming the run (python -m main with its '
      '--workdir) sets it aside and saves it again, or average the ones before it',
    )
    trees = (state.params, state.ema)
    mean = trees if mean is None else jax.tree.map(lambda m, x, k=k: m + (x - m) / k, mean, trees)
    train.log(f'read checkpoint {step}')
  source.close()
  state = state.replace(params=mean[0], ema=mean[1])

  partial = f'{out}.partial-{os.getpid()}'  # Renamed to `out` once whole: a crash leaves no half-written run.
  if jax.process_index() == 0:
    os.makedirs(partial)
    for name in os.listdir(workdir):
      if os.path.isfile(os.path.join(workdir, name)) and name not in _NOT_COPIED:
        shutil.copy2(os.path.join(workdir, name), partial)
    with open(os.path.join(partial, 'averaged.json'), 'w') as f:
      json.dump({'workdir': os.path.abspath(workdir), 'steps': steps}, f, indent=2)
  workdir_lib.record_config(config, partial)
  target = checkpoints.Checkpointer(partial, every=1, keep=1)
  target.save(steps[-1], state, force=True)
  target.close()
  if jax.process_index() == 0:
    os.rename(partial, out)
  train.log(f'wrote the average of checkpoints {", ".join(map(str, steps))} of {workdir} to {out}')
  if not evaluate:
    return {}
  metrics = train.evaluate(s, train.make_eval_step(s), state.eval_params())
  writer = reporting.writer(out, steps[-1])
  writer.write_scalars(steps[-1], metrics)
  writer.close()
  train.log('eval of the average: ' + '  '.join(f'{k} {v:.4f}' for k, v in metrics.items()))
  return metrics


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.average', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', required=True, help='the run whose checkpoints are averaged')
  parser.add_argument('--last', type=int, default=5, help='how many of the newest checkpoints (default 5)')
  parser.add_argument('--out', help='the new workdir (default: WORKDIR_avgN)')
  parser.add_argument('--data_dir', help="the TFDS data_dir for evaluation, if not the run's")
  parser.add_argument('--no_eval', action='store_true', help='write the average without evaluating it')
  args = parser.parse_args(argv)
  config = workdir_lib.load_run(args.workdir)
  parallel.initialize_distributed(config)  # Before anything touches a JAX backend.
  parallel.use_cpu_cores(config)
  parallel.enable_compilation_cache()
  out = args.out or f'{args.workdir.rstrip(os.sep)}_avg{args.last}'
  average(args.workdir, args.last, out, data_dir=args.data_dir, evaluate=not args.no_eval)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
