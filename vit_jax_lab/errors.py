"""User mistakes: `ConfigError` and `check`, and the one-line report every command gives of them.

A leaf of the import graph: every module may raise these; this one imports nothing of ours.
"""

import functools
import sys
from typing import Callable


class ConfigError(ValueError):
  """A user mistake in the config, the command line, a path or the data (printed as one line, exit status 2)."""


def check(condition: bool, message: str) -> None:
  """Raises ConfigError(message) unless `condition`."""
  if not condition:
    raise ConfigError(message)


def command(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
  """Decorates a command's `main(argv)`: a ConfigError becomes one line `error: ...` on stderr and exit status 2."""

  @functools.wraps(main)
  def run(argv: list[str]) -> int:
    try:
      return main(argv)
    except ConfigError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2

  return run
