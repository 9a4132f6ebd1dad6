"""Devices: multi-host start-up, the mesh, and where every array lives."""

import os

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from ml_collections import config_dict

import vit_jax_lab.models.layers as layers
from vit_jax_lab import supervisor
from vit_jax_lab.errors import check

AXES = ('data', 'fsdp', 'model')
BATCH = P(('data', 'fsdp'))  # The batch dimension is split over the data-parallel devices.


def mesh_config() -> ml_collections.ConfigDict:
  """`config.mesh`: the device mesh's axis sizes."""
  return ml_collections.ConfigDict(
    dict(
      data=-1,  # Data-parallel axis size; -1: the devices left over by the other axes.
      fsdp=1,  # Fully sharded data parallel: parameters and optimizer state are split over this axis.
      fsdp_min_size=2**14,  # Arrays with fewer elements stay replicated under FSDP.
      # Tensor parallel: attention and MLP weights are split over this axis (Megatron style); the batch is split
      # over data x fsdp only.
      model=1,
    )
  )


def distributed_config() -> ml_collections.ConfigDict:
  """`config.distributed`: multi-host start-up; all None: detected from the environment."""
  return ml_collections.ConfigDict(
    dict(
      coordinator_address=config_dict.placeholder(str),  # 'host:port' of process 0.
      num_processes=config_dict.placeholder(int),
      process_id=config_dict.placeholder(int),
    )
  )


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks `config.mesh` and `config.distributed`."""
  sizes = {k: config.mesh[k] for k in AXES}
  check(list(sizes.values()).count(-1) <= 1, f'mesh: at most one axis may be -1, got {sizes}')
  check(all(v == -1 or v > 0 for v in sizes.values()), f'mesh: axis sizes must be positive or -1, got {sizes}')
  dist = config.distributed
  given = [dist.coordinator_address is not None, dist.num_processes is not None, dist.process_id is not None]
  check(
    all(given) or not any(given),
    'distributed: set coordinator_address, num_processes and process_id together, or none of them',
  )
  if all(given):
    check(dist.num_processes > 0, f'distributed.num_processes={dist.num_processes} must be positive')
    check(
      0 <= dist.process_id < dist.num_processes,
      f'distributed.process_id={dist.process_id} must be from 0 to num_processes - 1 = {dist.num_processes - 1}',
    )


def multi_process(config) -> bool:
  """Whether the config or the environment makes this run one of several processes."""
  return config.distributed.coordinator_address is not None or _distributed_environment()


def initialize_distributed(config) -> None:
  """Starts multi-host JAX when the config or the environment asks for it. Call before any JAX backend use."""
  d = config.distributed
  timeouts = dict(  # A lost process ends the others within HEARTBEAT_S: supervisor.py.
    initialization_timeout=supervisor.CONNECT_S,
    heartbeat_timeout_seconds=supervisor.HEARTBEAT_S,
    shutdown_timeout_seconds=supervisor.SHUTDOWN_S,
  )
  if d.coordinator_address is not None:
    jax.distributed.initialize(
      d.coordinator_address, num_processes=d.num_processes, process_id=d.process_id, **timeouts
    )
  elif _distributed_environment():
    jax.distributed.initialize(**timeouts)  # Detects SLURM, Cloud TPU and GKE by itself.


CPU_CORES: int | None = None  # Set by use_cpu_cores: the CPU devices it made, one per physical core.


def physical_cores() -> int:
  """Physical cores this process may run on (hyper-thread siblings counted once)."""
  cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else range(os.cpu_count() or 1)
  cores = set()
  for cpu in cpus:
    try:
      with open(f'/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list') as f:
        cores.add(f.read().strip())
    except OSError:
      cores.add(str(cpu))
  return max(len(cores), 1)


def use_cpu_cores(config) -> None:
  """One CPU device per physical core, so that a CPU-only run is data-parallel over the cores: XLA:CPU runs
  some ops (the attention's batched matmuls) on one thread, and devices run side by side. Left alone when the
  user chose (JAX_NUM_CPU_DEVICES, --xla_force_host_platform_device_count, jax_num_cpu_devices) and for
  multi-process runs. Call before any JAX backend use; `devices` then falls back to fewer devices where a batch
  does not divide. Harmless with an accelerator: the default devices are then not the CPU ones."""
  global CPU_CORES
  chosen = jax.config.jax_num_cpu_devices != -1 or 'xla_force_host_platform_device_count' in os.environ.get(
    'XLA_FLAGS', ''
  )
  d = config.distributed
  if chosen or d.coordinator_address is not None or _distributed_environment():
    return
  CPU_CORES = physical_cores()
  jax.config.update('jax_num_cpu_devices', CPU_CORES)


def devices(config) -> tuple[list[jax.Device], str]:
  """The devices a run uses, and a note for its start-up line: all of them, but for CPU devices that
  use_cpu_cores made, as many of those as the batch sizes divide by (under the default mesh)."""
  available = jax.devices()
  if CPU_CORES is None or available[0].platform != 'cpu' or len(available) == 1:
    return available, ''
  m, d = config.mesh, config.data
  if (m.data, m.fsdp, m.model) != (-1, 1, 1):
    return available, f'{len(available)} CPU devices, one per core'
  batches = [d.eval_batch_size] + ([] if d.token_budget else [d.batch_size // config.accum_steps])
  n = max(k for k in range(1, len(available) + 1) if all(b % k == 0 for b in batches))
  if n == len(available):
    return available, f'{n} CPU devices, one per core'
  return available[:n], (
    f'{n} of {len(available)} CPU devices (one per core): data.batch_size / accum_steps and data.eval_batch_size '
    f'do not all divide by {len(available)}'
  )


def _distributed_environment() -> bool:
  return (
    int(os.environ.get('SLURM_NTASKS', 1)) > 1
    or 'JAX_COORDINATOR_ADDRESS' in os.environ
    or ',' in os.environ.get('TPU_WORKER_HOSTNAMES', '')
  )


def enable_compilation_cache(path: str = '~/.cache/vit_jax_lab/jax') -> None:
  """Keeps compiled steps on disk, so a rerun or resume skips compilation. JAX_COMPILATION_CACHE_DIR
  in the environment chooses another folder."""
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update('jax_compilation_cache_dir', os.path.expanduser(path))


def compiler_options(mesh: Mesh) -> dict[str, str] | None:
  """XLA options for the steps compiled for `mesh`. On CPU: matrix products by XLA's own Eigen kernels, not
  YNNPACK (jaxlib 0.10's default), which ran ViT-Ti/16's train step about 10% slower and most of the ViT and
  Transformer matmul shapes 10-40% slower on 2 cores (experiments/throughput/README.md). An
  `xla_cpu_experimental_ynn_fusion_type` in XLA_FLAGS is left to win."""
  if mesh.devices.flat[0].platform != 'cpu' or 'ynn_fusion_type' in os.environ.get('XLA_FLAGS', ''):
    return None
  return {'xla_cpu_experimental_ynn_fusion_type': ''}


def make_mesh(mesh_config, devices: list[jax.Device] | None = None) -> Mesh:
  """A mesh over `devices` (default: all) with axes ('data', 'fsdp', 'model'); an axis of size -1 takes the
  rest."""
  devices = jax.devices() if devices is None else devices
  n = len(devices)
  sizes = [mesh_config[a] for a in AXES]
  known = int(np.prod([s for s in sizes if s != -1]))
  check(n % known == 0, f'mesh: {dict(zip(AXES, sizes))} does not fit {n} devices')
  sizes = [n // known if s == -1 else s for s in sizes]
  check(
    int(np.prod(sizes)) == n,
    f'mesh: {dict(zip(AXES, sizes))} uses {int(np.prod(sizes))} devices but there are {n}; set one axis to -1',
  )
  return jax.make_mesh(sizes, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES), devices=devices)


def spec(
  shape: tuple[int, ...],
  mesh: Mesh,
  fsdp_min_size: int,
  path: tuple[str, ...] = (),
  tensor_parallel: dict[str, str] | None = None,
) -> P:
  """Where one array lives. Tensor parallelism first: under a 'model' axis, an array below a sub-layer named
  in `tensor_parallel` (the model family's TENSOR_PARALLEL; `path` holds the array's names) is split along
  that kernel's 'outputs' (kernel and bias) or 'inputs' (kernel only: the bias is added after the all-reduce).
  Then FSDP: arrays of at least `fsdp_min_size` elements are split along the largest other dimension that
  the fsdp axis divides. Everything else is replicated."""
  tensor_parallel = tensor_parallel or {}
  axes = [None] * len(shape)
  model, layer = mesh.shape['model'], next((p for p in reversed(path) if p in tensor_parallel), None)
  split = tensor_parallel.get(layer) if model > 1 else None
  dim = None
  if split == 'outputs':
    dim = len(shape) - 1
  elif split == 'inputs' and 'bias' not in path[-2:]:
    dim = len(shape) - 2
  if dim is not None and shape[dim] % model == 0:
    axes[dim] = 'model'
  fsdp = mesh.shape['fsdp']
  if fsdp > 1 and int(np.prod(shape)) >= fsdp_min_size:
    dims = [i for i in np.argsort(shape, kind='stable')[::-1] if shape[i] % fsdp == 0 and axes[i] is None]
    if dims:
      axes[dims[0]] = 'fsdp'
  return P(*axes) if any(axes) else P()


def shardings(abstract_tree, mesh: Mesh, fsdp_min_size: int, tensor_parallel: dict[str, str] | None = None):
  """A `NamedSharding` for every array of a tree (parameters, optimizer state, ...)."""

  def sharding(path, x):
    names = tuple(str(k) for k in layers.path_keys(path))
    return NamedSharding(mesh, spec(x.shape, mesh, fsdp_min_size, names, tensor_parallel))

  return jax.tree_util.tree_map_with_path(sharding, abstract_tree)


def device_memory(mesh: Mesh) -> int | None:
  """Bytes of memory one device of `mesh` has: the accelerator's own, or for CPU devices the machine's RAM
  shared among the process's CPU devices. None when the runtime does not say."""
  device = mesh.devices.flat[0]
  if device.platform == 'cpu':
    try:
      ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError):
      return None
    return ram // max(len(jax.local_devices(backend='cpu')), 1)
  stats = device.memory_stats() or {}
  return stats.get('bytes_limit')


def per_device_bytes(tree, shardings_tree) -> int:
  """Bytes one device holds of `tree` under `shardings_tree`."""
  sizes = jax.tree.map(lambda x, s: int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize, tree, shardings_tree)
  return sum(jax.tree.leaves(sizes))
