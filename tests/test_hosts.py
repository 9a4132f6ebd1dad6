"""hosts.available_memory under a scheduler's memory limit: the process's own cgroup and the groups above it, on
cgroup v2 and v1, read from file trees laid out as the kernel lays them out."""

import os

from vit_jax_lab import hosts

GIB = 2**30


def write(path, text) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def proc_files(tmp_path, cgroup: str, mounts: list[str]) -> str:
  proc = tmp_path / 'proc'
  write(proc / 'cgroup', cgroup)
  write(proc / 'mountinfo', ''.join(f'{30 + i} 23 0:{28 + i} {m}\n' for i, m in enumerate(mounts)))
  return str(proc)


def test_cgroup_v2_a_jobs_own_group_and_the_tightest_above_it(tmp_path):
  """A SLURM-like job: its step's group has no limit ('max'), the job's group above it 2 GiB with 1.5 GiB used,
  the hierarchy's root none of its own: 0.5 GiB can still be taken. The root's files alone (what was read before)
  say nothing of the job."""
  mount = tmp_path / 'cg2'
  write(mount / 'job_7' / 'step_0' / 'memory.max', 'max\n')
  write(mount / 'job_7' / 'step_0' / 'memory.current', f'{GIB}\n')
  write(mount / 'job_7' / 'memory.max', f'{2 * GIB}\n')
  write(mount / 'job_7' / 'memory.current', f'{3 * GIB // 2}\n')
  proc = proc_files(tmp_path, '0::/job_7/step_0\n', [f'/ {mount} rw,relatime - cgroup2 cgroup2 rw'])
  assert hosts.memory_cgroups(proc)[:3] == [
    (str(mount / 'job_7' / 'step_0'), 2),
    (str(mount / 'job_7'), 2),
    (str(mount), 2),
  ]
  assert hosts.available_memory(proc) == GIB // 2


def test_cgroup_v1_memory_hierarchy_beside_others_and_a_namespaced_mount(tmp_path):
  """v1: the memory controller's line of /proc/self/cgroup, in the hierarchy mounted with the memory option (not
  cpu's); a mount whose root is the process's own group (a cgroup namespace) maps that group to the mount point."""
  memory, cpu = tmp_path / 'memory', tmp_path / 'cpu'
  write(memory / 'slurm' / 'uid_0' / 'job_9' / 'memory.limit_in_bytes', f'{4 * GIB}\n')
  write(memory / 'slurm' / 'uid_0' / 'job_9' / 'memory.usage_in_bytes', f'{GIB}\n')
  write(cpu / 'slurm' / 'memory.limit_in_bytes', '1\n')  # Not a memory hierarchy: never read.
  write(cpu / 'slurm' / 'memory.usage_in_bytes', '0\n')
  proc = proc_files(
    tmp_path,
    '5:cpu,cpuacct:/slurm\n4:memory:/slurm/uid_0/job_9\n0::/\n',
    [f'/ {cpu} rw - cgroup cgroup rw,cpu,cpuacct', f'/ {memory} rw - cgroup cgroup rw,memory'],
  )
  assert hosts.available_memory(proc) == 3 * GIB
  namespaced = tmp_path / 'ns'
  write(namespaced / 'memory.limit_in_bytes', f'{GIB}\n')
  write(namespaced / 'memory.usage_in_bytes', '0\n')
  proc = proc_files(
    tmp_path / 'b', '4:memory:/slurm/job_3\n', [f'/slurm/job_3 {namespaced} rw - cgroup cgroup rw,memory']
  )
  assert hosts.memory_cgroups(proc) == [(str(namespaced), 1)]
  assert hosts.available_memory(proc) == GIB


def test_no_limit_anywhere_is_the_kernels_available_memory(tmp_path):
  mount = tmp_path / 'cg2'
  write(mount / 'a' / 'memory.max', 'max\n')
  write(mount / 'a' / 'memory.current', '5\n')
  proc = proc_files(tmp_path, '0::/a\n', [f'/ {mount} rw - cgroup2 cgroup2 rw'])
  with open('/proc/meminfo') as f:
    kernel = next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable:'))
  assert abs(hosts.available_memory(proc) - kernel) < GIB  # What the kernel says, give or take what moved since.
