"""Who holds something on this machine: the workdir lock and a dataset's preparation record their host and pid."""

import os


def alive(pid: int) -> bool:
  """Whether process `pid` of this host is running (someone else's counts: it cannot be signalled, but it runs)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return pid > 0
