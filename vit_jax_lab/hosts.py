"""This machine: who holds something on it (the workdir lock and a dataset's preparation record their host and pid),
and how much memory a run can still take."""

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


def available_memory() -> int | None:
  """Bytes of memory this process can still take: the kernel's MemAvailable, or less under a cgroup limit (a
  container, a SLURM job); None where neither can be read (not Linux)."""
  limits = []
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          limits.append(int(line.split()[1]) * 1024)
  except OSError:
    pass
  for limit_file, usage_file in (
    ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory.current'),  # cgroup v2.
    ('/sys/fs/cgroup/memory/memory.limit_in_bytes', '/sys/fs/cgroup/memory/memory.usage_in_bytes'),  # v1.
  ):
    try:
      with open(limit_file) as f, open(usage_file) as g:
        limit, usage = f.read().strip(), int(g.read().strip())
    except (OSError, ValueError):
      continue
    if limit.isdigit() and int(limit) < 2**60:  # 'max', or v1's huge number: no limit.
      limits.append(max(int(limit) - usage, 0))
  return min(limits) if limits else None
