"""Devices: multi-host start-up, the mesh, and where every array lives."""

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax_lab.config import check

AXES = ('data', 'fsdp')
BATCH = P(AXES)  # The batch dimension is split over every device.


def initialize_distributed(config) -> None:
  """Starts multi-host JAX when the config or the environment asks for it. Call before any JAX backend use."""
  d = config.distributed
  if d.coordinator_address is not None:
    jax.distributed.initialize(d.coordinator_address, num_processes=d.num_processes, process_id=d.process_id)
  elif (int(os.environ.get('SLURM_NTASKS', 1)) > 1 or 'JAX_COORDINATOR_ADDRESS' in os.environ
        or ',' in os.environ.get('TPU_WORKER_HOSTNAMES', '')):
    jax.distributed.initialize()  # Detects SLURM, Cloud TPU and GKE by itself.


def enable_compilation_cache(path: str = '~/.cache/vit_jax_lab/jax') -> None:
  """Keeps compiled steps on disk, so a rerun or resume skips compilation. JAX_COMPILATION_CACHE_DIR
  in the environment chooses another folder."""
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update('jax_compilation_cache_dir', os.path.expanduser(path))


def make_mesh(mesh_config, devices: list[jax.Device] | None = None) -> Mesh:
  """A mesh over `devices` (default: all) with axes ('data', 'fsdp'); an axis of size -1 takes the rest."""
  devices = jax.devices() if devices is None else devices
  n = len(devices)
  sizes = [mesh_config[a] for a in AXES]
  known = int(np.prod([s for s in sizes if s != -1]))
  check(n % known == 0, f'mesh: {dict(zip(AXES, sizes))} does not fit {n} devices')
  sizes = [n // known if s == -1 else s for s in sizes]
  check(int(np.prod(sizes)) == n,
        f'mesh: {dict(zip(AXES, sizes))} uses {int(np.prod(sizes))} devices but there are {n}; set one axis to -1')
  return jax.make_mesh(sizes, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES), devices=devices)


def spec(shape: tuple[int, ...], mesh: Mesh, fsdp_min_size: int) -> P:
  """Replicated, or under FSDP split along the largest dimension that the fsdp axis divides."""
  fsdp = mesh.shape['fsdp']
  if fsdp == 1 or int(np.prod(shape)) < fsdp_min_size:
    return P()
  dims = [i for i in np.argsort(shape, kind='stable')[::-1] if shape[i] % fsdp == 0]
  if not dims:
    return P()
  return P(*[('fsdp' if i == dims[0] else None) for i in range(len(shape))])


def shardings(abstract_tree, mesh: Mesh, fsdp_min_size: int):
  """A `NamedSharding` for every array of a tree (parameters, optimizer state, ...)."""
  return jax.tree.map(lambda x: NamedSharding(mesh, spec(x.shape, mesh, fsdp_min_size)), abstract_tree)


def per_device_bytes(tree, shardings_tree) -> int:
  """Bytes one device holds of `tree` under `shardings_tree`."""
  sizes = jax.tree.map(lambda x, s: int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize, tree, shardings_tree)
  return sum(jax.tree.leaves(sizes))
