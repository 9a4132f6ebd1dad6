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


def available_memory(proc: str = '/proc/self') -> int | None:
  """Bytes of memory this process can still take: the kernel's MemAvailable, or less under a cgroup limit (a
  container, a SLURM or Kubernetes job): the tightest of this process's own memory cgroup and every group above it
  (cgroup v2 and v1), as container-aware runtimes read it; None where none of it can be read (not Linux)."""
  limits = []
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          limits.append(int(line.split()[1]) * 1024)
  except OSError:
    pass
  for directory, version in memory_cgroups(proc):
    files = ('memory.max', 'memory.current') if version == 2 else ('memory.limit_in_bytes', 'memory.usage_in_bytes')
    try:
      with open(os.path.join(directory, files[0])) as f, open(os.path.join(directory, files[1])) as g:
        limit, usage = f.read().strip(), int(g.read().strip())
    except (OSError, ValueError):
      continue
    if limit.isdigit() and int(limit) < 2**60:  # 'max', or v1's huge number: no limit.
      limits.append(max(int(limit) - usage, 0))
  return min(limits) if limits else None


def memory_cgroups(proc: str = '/proc/self') -> list[tuple[str, int]]:
  """(directory, cgroup version) of this process's memory cgroup and of each group above it up to its hierarchy's
  mount point, from `proc`/cgroup and `proc`/mountinfo; the hierarchies' roots where those cannot be read."""
  try:
    with open(os.path.join(proc, 'mountinfo')) as f:
      mountinfo = f.read().splitlines()
    with open(os.path.join(proc, 'cgroup')) as f:
      membership = f.read().splitlines()
  except OSError:
    return [('/sys/fs/cgroup', 2), ('/sys/fs/cgroup/memory', 1)]
  groups = {}  # version -> this process's group path in that hierarchy.
  for line in membership:
    parts = line.split(':', 2)
    if len(parts) == 3 and parts[0] == '0' and parts[1] == '':
      groups[2] = parts[2]
    elif len(parts) == 3 and 'memory' in parts[1].split(','):
      groups[1] = parts[2]
  found = []
  for line in mountinfo:
    mount, _, source = line.partition(' - ')
    fields, kind = mount.split(), source.split()
    if len(fields) < 5 or len(kind) < 3:
      continue
    version = 2 if kind[0] == 'cgroup2' else 1 if kind[0] == 'cgroup' and 'memory' in kind[2].split(',') else 0
    root, point, path = fields[3], fields[4], groups.get(version)
    if not version or path is None or os.path.commonpath([root, path]) != root:
      continue  # Not a memory hierarchy, or this process's group lies outside what is mounted (not visible).
    directory = os.path.normpath(os.path.join(point, os.path.relpath(path, root)))
    while True:
      found.append((directory, version))
      if directory == os.path.normpath(point):
        break
      directory = os.path.dirname(directory)
  return found
