"""8 simulated CPU devices, a persistent compilation cache in a temp dir, the built-in data built once."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

# The suite's models are tiny, so compiling dominates its time: XLA's backend skips its LLVM optimisations
# (the same computations, compiled about 40% faster). Set in the environment, so processes the tests start
# inherit it.
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
# And its CPU backend emits fusions as before its MLIR fusion emitters: a tiny ViT's train step compiled in about 2 s
# instead of 3, and the fast tier ran in 2:54 instead of 3:47.
if 'xla_cpu_use_fusion_emitters' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_cpu_use_fusion_emitters=false').strip()
# One compilation cache per test run, made by the process pytest starts and inherited through the environment by
# pytest-xdist's workers and the runs the tests start, every compilation kept however short (a smoke run in a
# child process took 8.8 s instead of 12.7 s with the cache's default, only compilations over a second); that
# process removes it at the end (pytest_unconfigure).
_OWN_CACHE = 'VIT_JAX_LAB_TEST_CACHE' not in os.environ
if _OWN_CACHE:
  os.environ['VIT_JAX_LAB_TEST_CACHE'] = tempfile.mkdtemp(prefix='vit_jax_lab_cache_')
os.environ['JAX_COMPILATION_CACHE_DIR'] = os.environ['VIT_JAX_LAB_TEST_CACHE']
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'

import jax  # noqa: E402

jax.config.update('jax_num_cpu_devices', 8)  # Before anything touches the backend.

import pytest  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vit_jax_lab import config as config_lib  # noqa: E402
from vit_jax_lab.data import builders  # noqa: E402


def build_builtin(name: str, data_dir: str) -> str:
  """Builds the built-in dataset `name` (with any '/config') in `data_dir`, through the registry as pipeline.load
  does; returns data_dir."""
  builders.register(name)
  tfds.builder(name, data_dir=data_dir).download_and_prepare(
    download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
  return data_dir


def digits_renamed(data_dir: str, target, name: str, version: str = '1.0.0', **info):
  """The digits dataset prepared in `data_dir`, copied to `target`/name/version as a dataset of that name and
  version (its files and dataset_info.json renamed, `info` set there too; its ArrayRecord copy left out). Returns
  the copy's folder."""
  prepared = target / name / version
  shutil.copytree(os.path.join(data_dir, 'digits', '1.0.0'), prepared, ignore=shutil.ignore_patterns('array_record*'))
  for path in prepared.iterdir():
    path.rename(prepared / path.name.replace('digits-', f'{name}-'))
  dataset_info = json.loads((prepared / 'dataset_info.json').read_text())
  (prepared / 'dataset_info.json').write_text(json.dumps(dataset_info | {'name': name, 'version': version, **info}))
  return prepared


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory) -> str:
  return build_builtin('digits', str(tmp_path_factory.mktemp('tensorflow_datasets')))


@pytest.fixture(scope='session')
def moving_digits_dir(data_dir) -> str:
  """The session's data_dir, with moving_digits built in it too (only by the tests that ask for it)."""
  return build_builtin('moving_digits', data_dir)


def load_config(spec: str, data_dir: str, **overrides):
  """The config file `spec` (relative to the repository) reading `data_dir`, with overrides given as keyword
  paths: data__batch_size=8 sets config.data.batch_size."""
  config = config_lib.load(os.path.join(ROOT, spec))
  config.data.data_dir = data_dir
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split('__')
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


@pytest.fixture
def smoke_config(data_dir):
  """configs/vit/digits.py:smoke reading the session's data_dir; call with overrides as keyword paths."""
  return lambda **overrides: load_config('configs/vit/digits.py:smoke', data_dir, **overrides)


def local_address() -> str:
  """'127.0.0.1:PORT' of a free port, for a multi-process run's coordinator."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'127.0.0.1:{s.getsockname()[1]}'


def start_processes(commands: list[list[str]], env: dict) -> list[subprocess.Popen]:
  """The commands started side by side in the repository, each with stdout and stderr merged."""
  return [
    subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for command in commands
  ]


def wait_for_first_log(workdir: str, timeout: float) -> None:
  """Returns once the run in `workdir` has written its first metrics line (it is past compiling and training),
  or after `timeout` seconds."""
  metrics, deadline = os.path.join(workdir, 'metrics.jsonl'), time.time() + timeout
  while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0) and time.time() < deadline:
    time.sleep(0.05)


def pytest_unconfigure(config):
  if _OWN_CACHE:
    shutil.rmtree(os.environ['VIT_JAX_LAB_TEST_CACHE'], ignore_errors=True)


# What a GPU machine with its own jax, flax, optax, orbax and numpy lacks (ml_collections travels as a wheel): a
# step on synthetic input must not need any of it.
ABSENT_ON_ACCELERATOR_MACHINES = ('tensorflow', 'tensorflow_datasets', 'clu', 'tensorboard', 'av', 'sacremoses')


def without_packages(tmp_path, names=ABSENT_ON_ACCELERATOR_MACHINES) -> dict:
  """An environment whose Python processes (and theirs) cannot import `names`, as if not installed: a
  sitecustomize.py, first on PYTHONPATH, that refuses them and has importlib.util.find_spec say they are absent
  (which TFDS asks before it imports TensorFlow)."""
  (tmp_path / 'sitecustomize.py').write_text(
    'import importlib.abc, importlib.util, sys\n'
    f'NAMES = {set(names)!r}\n'
    'class Refuse(importlib.abc.MetaPathFinder):\n'
    '  def find_spec(self, name, path, target=None):\n'
    '    if name.split(".")[0] in NAMES:\n'
    '      raise ModuleNotFoundError(f"{name} is made unimportable by the test", name=name)\n'
    'sys.meta_path.insert(0, Refuse())\n'
    '_find_spec = importlib.util.find_spec\n'
    'importlib.util.find_spec = lambda name, package=None: (\n'
    '  None if name.split(".")[0] in NAMES else _find_spec(name, package))\n'
  )
  return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]), JAX_NUM_CPU_DEVICES='1')


def elsewhere_env() -> dict:
  """The environment of a command started outside the clone: the clone on PYTHONPATH, where `pip install -e .` puts
  it (CI installs requirements.txt alone, so the suite must not need the install)."""
  return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))


def console_script(folder, name: str = 'vit-jax-lab') -> str:
  """pyproject.toml's [project.scripts] `name`, written into `folder` as pip writes it on install: run as a file, so
  its own folder, not the working one, is first on sys.path."""
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as file:
    module, function = tomllib.load(file)['project']['scripts'][name].split(':')
  path = os.path.join(folder, name)
  with open(path, 'w') as file:
    file.write(f'#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n')
  os.chmod(path, 0o755)
  return path


@pytest.fixture
def mount(tmp_path):
  """mount(options) -> a fresh tmpfs folder (mounting needs root, which this project's machines and CI have)."""
  mounted = []

  def make(options: str) -> str:
    path = str(tmp_path / f'mount{len(mounted)}')
    os.makedirs(path)
    subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', path], check=True)
    mounted.append(path)
    return path

  yield make
  for path in mounted:
    subprocess.run(['umount', '--lazy', path], check=True)
