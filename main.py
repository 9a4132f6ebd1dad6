"""Train and evaluate: `python -m main --config configs/vit/digits.py --workdir runs/vit_digits`.

Options: --config PATH[:ARG] (a file with get_config(arg)), --config.KEY=VALUE (any number), --workdir DIR.
Every way a run ends is one line: 0 done, 2 a user mistake (`error: ...`), 3 the loss diverged, 74 no space
left, 75 stopped by SIGTERM/SIGINT/SIGHUP (with a checkpoint of the current step once training has begun; the same
command continues) or by a lost process of a multi-process run (vit_jax_lab/supervisor.py), 130 interrupted at once
by a second Ctrl-C.
"""

import signal
import sys

# A scheduler's SIGTERM (or a closed terminal's SIGHUP) can come while Python still imports JAX and TensorFlow, before
# train installs its own handlers: remembered from the first line on, reported as a stop before training by main().
_EARLY_SIGNALS: list[str] = []
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
if __name__ == '__main__':
  for _sig in STOP_SIGNALS:
    signal.signal(_sig, lambda sig, frame: _EARLY_SIGNALS.append(signal.Signals(sig).name))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402

from vit_jax_lab import console, errors, supervisor  # noqa: E402 (none imports JAX)


def _import_jax_parts():
  """config and parallel, which import JAX: JAX reads its JAX_* environment variables then, and a bad one
  (JAX_NUM_CPU_DEVICES=abc) is a ValueError naming the flag."""
  try:
    from vit_jax_lab import config as config_lib, parallel
  except ValueError as e:
    text = str(e)
    if not text.startswith('Invalid value') or 'JAX flag' not in text:
      raise
    flag = text.rsplit('JAX flag ', 1)[1].strip()
    value = text.split('"')[1] if '"' in text else '?'
    raise errors.ConfigError(
      f'{flag.upper()}={value} in the environment is not a valid value for JAX: fix or unset it'
    ) from None
  return config_lib, parallel


class _Parser(argparse.ArgumentParser):
  """argparse, but a mistake on the command line is one `error:` line (exit status 2), not its usage block."""

  def error(self, message: str):
    usage = 'python -m main --config PATH[:ARG] --workdir DIR [--config.KEY=VALUE ...]'
    raise errors.ConfigError(f'{message} (usage: {usage})')


def parse_args(argv: list[str]):
  """(config, workdir) from the command line, checked in full; raises ConfigError on a bad key or value."""
  config_lib, _ = _import_jax_parts()
  parser = _Parser(
    prog='python -m main',
    description=__doc__.splitlines()[0],
    epilog=f'configs (--config PATH[:ARG]):\n{console.configs_overview(os.path.dirname(os.path.abspath(__file__)))}\n\n'
    'model families and their variants (--config.model.variant): python -m vit_jax_lab.tools.models',
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    '--config',
    required=True,
    help='PATH[:ARG], a file defining get_config(arg), or one of configs/ as vit/digits[:ARG]',
  )
  parser.add_argument('--workdir', required=True, help='checkpoints, metrics.jsonl, config.json, TensorBoard')
  args, rest = parser.parse_known_args(argv)
  config = config_lib.load(args.config)
  config_lib.apply_overrides(config, rest)
  config_lib.check_parts(config)
  config_lib.validate(config)  # Before TensorFlow is imported: a mistake costs a second, not five.
  return config, args.workdir


def _stop_before_training(sig: int, frame) -> None:
  del frame
  errors.stop_from_handler(sig, errors.stopped_before_training(signal.Signals(sig).name))


@console.command
def main(argv: list[str]) -> int:
  if _EARLY_SIGNALS:
    raise errors.stopped_before_training(_EARLY_SIGNALS[0])
  # First: a config file may import TensorFlow itself (a user's does), and its start-up lines must not come before
  # the one line a mistake in it gets.
  console.quiet_libraries()
  config, workdir = parse_args(argv)
  config_lib, parallel = _import_jax_parts()
  if parallel.multi_process(config) and not supervisor.supervised():  # Trains in a child: a lost peer is one line.
    return supervisor.run(argv, workdir, config.distributed.process_id, config.distributed.num_processes)
  if supervisor.supervised():
    supervisor.end_with_parent()
  if not console.VERBOSE:  # TensorFlow's C++ warnings too (a full disk: eight lines before our one line); our
    # modules' imports have set a lower level by now (data/__init__.py: 2), so this one is not a default.
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
  parallel.initialize_distributed(config)  # Before anything touches a JAX backend.
  parallel.use_cpu_cores(config)
  parallel.enable_compilation_cache()
  # Imported here, the one lazy import of the command: train loads TensorFlow (about 5 s), which a config mistake,
  # reported above, should not wait for.
  from vit_jax_lab import train, workdir as workdir_lib

  with console.gloo_lines_dropped() if parallel.multi_process(config) else contextlib.nullcontext():
    workdir_lib.agree_on_config(config)  # Processes started with different configs: one line, nothing written.
    train.train_and_evaluate(config, workdir, given=config_lib.given_keys(argv))
  return 0


def cli() -> None:
  """`python -m main` and the `vit-jax-lab` command (pyproject.toml), which a main.py in the working folder does
  not shadow."""
  for sig in STOP_SIGNALS:  # Until train takes over at its start: a signal stops at once, nothing to save yet.
    signal.signal(sig, _stop_before_training)
  sys.exit(main(sys.argv[1:]))


if __name__ == '__main__':
  cli()
