"""Evaluates a run, or the weights a config starts from, on its eval split or another dataset's; trains nothing.

python -m vit_jax_lab.tools.evaluate --workdir runs/track                      # what the run's last eval logged
python -m vit_jax_lab.tools.evaluate --config configs/tracking/got10k.py:otb100 --config.init_from=runs/got10k \
    --config.data.data_dir=/datasets/tfds --json otb100.json

`--workdir` reads the run's config and newest checkpoint (its parameter average, with ema_decay); `--config`
evaluates the weights `--config.init_from` names (a run, or a release .npz). --config.KEY=VALUE changes either,
e.g. --config.data.eval_split=val. The metrics are printed, and written as JSON with --json.
"""

import json
import sys

from vit_jax_lab import console, train
from vit_jax_lab.tools import common


def run(argv: list[str]) -> tuple[dict[str, float], str | None]:
  """(the eval metrics, the --json path)."""
  parser = console.Parser(prog='python -m vit_jax_lab.tools.evaluate', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', help='a run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file (with --config.init_from=...) instead of --workdir')
  parser.add_argument('--json', help='also write the metrics to this file')
  args, overrides = parser.parse_known_args(argv)
  config = common.config_of(args.workdir, args.config, overrides)
  config.mesh.data, config.mesh.fsdp, config.mesh.model = -1, 1, 1  # Whatever devices this machine has.
  config.accum_steps, config.data.batch_size = 1, config.data.eval_batch_size  # No training here.
  s = train.setup(config)
  return train.evaluate(s, train.make_eval_step(s), common.params_of(s, args.workdir)), args.json


@console.command
def main(argv: list[str]) -> int:
  metrics, path = run(argv)
  print('  '.join(f'{k} {v:.4f}' for k, v in metrics.items()))
  if path:
    with open(path, 'w') as f:
      json.dump(metrics, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
