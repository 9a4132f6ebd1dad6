"""What ends a run early, each as one line: a user mistake (`ConfigError`, exit status 2) or a run stopped on
purpose with its work saved (`Stopped` and its kinds, each with its own exit status).

A leaf of the import graph: every module may raise these; this one imports nothing of ours.
"""


class ConfigError(ValueError):
  """A user mistake in the config, the command line, a path or the data (printed as one line, exit status 2)."""

  exit_status = 2


class Stopped(Exception):
  """The run stopped before total_steps and kept everything up to its newest checkpoint."""

  exit_status = 1


class Preempted(Stopped):
  """SIGTERM or SIGINT: a checkpoint of the current step was saved; the same command continues the run."""

  exit_status = 75  # EX_TEMPFAIL (sysexits.h): try again. Schedulers can requeue on it.


class Diverged(Stopped):
  """The loss or the gradient norm became non-finite; nothing from that step on was saved."""

  exit_status = 3


class DiskFull(Stopped):
  """No space left on the workdir's disk; the checkpoints already written are intact."""

  exit_status = 74  # EX_IOERR (sysexits.h).


def check(condition: bool, message: str) -> None:
  """Raises ConfigError(message) unless `condition`."""
  if not condition:
    raise ConfigError(message)
