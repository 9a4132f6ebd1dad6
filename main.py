"""Train and evaluate: `python -m main --config configs/vit/digits.py --workdir runs/vit_digits`.

Options: --config PATH[:ARG] (a file with get_config(arg)), --config.KEY=VALUE (any number), --workdir DIR.
Every way a run ends is one line: 0 done, 2 a user mistake (`error: ...`), 3 the loss diverged, 74 no space
left, 75 stopped by SIGTERM/SIGINT with a checkpoint saved (the same command continues).
"""

import argparse
import sys

from vit_jax_lab import config as config_lib, console, parallel


def parse_args(argv: list[str]):
  """(config, workdir) from the command line, checked in full; raises ConfigError on a bad key or value."""
  parser = argparse.ArgumentParser(prog='python -m main', description=__doc__.splitlines()[0])
  parser.add_argument('--config', required=True, help='PATH[:ARG], a file defining get_config(arg)')
  parser.add_argument('--workdir', required=True, help='checkpoints, metrics.jsonl, config.json, TensorBoard')
  args, rest = parser.parse_known_args(argv)
  config = config_lib.load(args.config)
  config_lib.apply_overrides(config, rest)
  config_lib.validate(config)  # Before TensorFlow is imported: a mistake costs a second, not five.
  return config, args.workdir


@console.command
def main(argv: list[str]) -> int:
  config, workdir = parse_args(argv)
  console.quiet_libraries()
  parallel.initialize_distributed(config)  # Before anything touches a JAX backend.
  parallel.use_cpu_cores(config)
  parallel.enable_compilation_cache()
  # Imported here, the one lazy import of the command: train loads TensorFlow (about 5 s), which a config mistake,
  # reported above, should not wait for.
  from vit_jax_lab import train

  train.train_and_evaluate(config, workdir)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
