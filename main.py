"""Train and evaluate: `python -m main --config configs/vit/digits.py --workdir runs/vit_digits`.

Options: --config PATH[:ARG] (a file with get_config(arg)), --config.KEY=VALUE (any number), --workdir DIR.
A user mistake prints one line `error: ...` and exits with status 2.
"""

import argparse
import sys

from vit_jax_lab import errors


def parse_args(argv: list[str]):
  """(config, workdir) from the command line; raises ConfigError on a bad key or value."""
  from vit_jax_lab import config as config_lib

  parser = argparse.ArgumentParser(prog='python -m main', description=__doc__.splitlines()[0])
  parser.add_argument('--config', required=True, help='PATH[:ARG], a file defining get_config(arg)')
  parser.add_argument('--workdir', required=True, help='checkpoints, metrics.jsonl, config.json, TensorBoard')
  args, rest = parser.parse_known_args(argv)
  config = config_lib.load(args.config)
  config_lib.apply_overrides(config, rest)
  return config, args.workdir


@errors.command
def main(argv: list[str]) -> int:
  config, workdir = parse_args(argv)
  from vit_jax_lab import parallel

  parallel.initialize_distributed(config)  # Before anything touches a JAX backend.
  parallel.enable_compilation_cache()
  from vit_jax_lab import train

  train.train_and_evaluate(config, workdir)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
