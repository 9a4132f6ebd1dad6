"""Time and compiled peak memory of each attention pattern against sequence length, rendered into README.md.

python -m experiments.attention_scaling.run                    # every row (about 25 minutes on 2 CPU cores)
python -m experiments.attention_scaling.run --sizes 256,1024   # a quick look; prints, writes nothing
python -m experiments.attention_scaling.run --what layer       # the layer table alone
On an NVIDIA GPU the same command writes the GPU tables: bf16 compute, and full attention also through cuDNN's
fused (flash) kernel, the baseline an O(n) pattern has to beat there; `--what layer` and `--what step` run them
apart (`python -m experiments.throughput.run gpu --part 3` and `--part 5`). Each table is rewritten after every
cell, so a run cut off keeps what it measured.

Two measurements per pattern and token count n: one ViT-Ti self-attention layer (width 192, 3 heads; forward and
backward), and a whole ViT-Ti/16 train step (batch 1, AdamW) on a square image of n patches (256 px: 256 patches,
4096 px: 65,536), average-pooled so n counts only patches. Local and sparse attention use blocks of 4 x 4 patches
(each patch sees 12 x 12 at most); sparse adds 2 random blocks. Each configuration runs in a process of its own;
one whose compiled peak memory exceeds what the machine has free is reported as out of memory and not run, and
one the kernel kills for memory is reported so too. Times are medians over --repeats (2) calls after one warm-up
call; the slope is the least-squares slope of log time against log n for n >= 1,024. Run nothing else meanwhile.
On a GPU the cells share one process: an allocation that fails raises there instead of killing it.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.attention_scaling.run')

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault('JAX_NUM_CPU_DEVICES', '1')  # One device: batch 1, and every core serves it.

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import common
from vit_jax_lab import config as config_lib, train
from vit_jax_lab.models import attention, layers
from vit_jax_lab.tools import bench

GPU = jax.default_backend() == 'gpu'
KINDS = ('full', 'cudnn', 'local', 'sparse', 'linear') if GPU else ('full', 'local', 'sparse', 'linear')
DTYPE = jnp.bfloat16 if GPU else jnp.float32  # cuDNN's fused attention takes bf16 or fp16 only.
IMPLS = {'full': 'xla', 'cudnn': 'cudnn'} if GPU else {}  # jax.nn.dot_product_attention's `implementation`.

BASELINE = 'cudnn' if GPU else 'full'  # What an O(n) pattern has to beat.
SIZES = (256, 1024, 4096, 16384, 65536)
WINDOW, RANDOM_BLOCKS = 4, 2


def pattern_of(kind: str) -> str:
  """The attention pattern a table row measures: cuDNN's rows are full attention."""
  return 'full' if kind == 'cudnn' else kind


def free_bytes() -> int:
  """Memory available to a new allocation now (Linux MemAvailable, or the GPU allocator's), less 2 GiB of
  headroom."""
  if GPU:
    stats = jax.devices()[0].memory_stats()
    return stats['bytes_limit'] - stats['bytes_in_use'] - 2 * 2**30
  with open('/proc/meminfo') as f:
    fields = dict(line.split(':') for line in f)
  return int(fields['MemAvailable'].split()[0]) * 1024 - 2 * 2**30


def peak_bytes(compiled) -> int:
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def measure(compiled, call, repeats: int) -> dict:
  """{'seconds', 'gib'} of `call()` (which runs `compiled` once), or {'oom_gib'} when its compiled peak does not
  fit in memory."""
  peak = peak_bytes(compiled)
  if peak > free_bytes():
    return {'oom_gib': peak / 2**30}
  jax.block_until_ready(call())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - t0)
  return {'seconds': statistics.median(times), 'gib': peak / 2**30}


def layer_row(kind: str, n: int, repeats: int) -> dict:
  side, impl = math.isqrt(n), IMPLS.get(kind)
  pattern = attention.Pattern(pattern_of(kind), window=WINDOW, random_blocks=RANDOM_BLOCKS, grid=(side, side))
  layer = layers.Attention(192, 3, implementation=impl, pattern=pattern, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(layer)
  params = jax.tree.map(lambda a: a.astype(DTYPE), params)

  def forward_backward(params, x):
    return jax.grad(lambda p, x: jnp.sum(nnx.merge(graphdef, p)(x) ** 2), argnums=(0, 1))(params, x)

  x = jax.random.normal(jax.random.key(0), (1, n, 192), DTYPE)
  compiled = jax.jit(forward_backward).lower(params, x).compile()
  return measure(compiled, lambda: compiled(params, x), repeats)


def step_row(kind: str, n: int, repeats: int, depth: int | None = None) -> dict:
  side = 16 * math.isqrt(n)
  config = config_lib.load(os.path.join(common.ROOT, 'configs/vit/digits.py'))
  config.model.update(variant='Ti/16', pool='gap', posemb='learn', dropout=0.0, attention=pattern_of(kind))
  config.model.attention_impl = IMPLS.get(kind)
  config.compute_dtype = jnp.dtype(DTYPE).name
  config.model.update(attention_window=WINDOW, attention_random_blocks=RANDOM_BLOCKS)
  config.model.update(**{k: None for k in ('width', 'depth', 'mlp_dim', 'num_heads', 'patch_size')})
  config.model.depth = depth
  config.data.batch_size = config.data.eval_batch_size = 1
  s, batch = bench.synthetic_setup(config, f'{side},{side},3,1000')
  state = jax.block_until_ready(train.init_state(s))
  compiled = train.make_train_step(s).lower(state, batch).compile()
  states = [state]

  def step():  # The step donates its state: each call takes the one before's.
    states[0], metrics = compiled(states[0], batch)
    return metrics

  return measure(compiled, step, repeats)


def row(what: str, kind: str, n: int, repeats: int, depth: int | None) -> dict:
  return layer_row(kind, n, repeats) if what == 'layer' else step_row(kind, n, repeats, depth)


def slope(rows: dict[int, dict]) -> float | None:
  """Of log time against log n, from n = 1,024 on: below, fixed costs (dispatch, small kernels) dominate."""
  points = [(math.log(n), math.log(r['seconds'])) for n, r in rows.items() if 'seconds' in r and n >= 1024]
  if len(points) < 2:
    return None
  x, y = np.array(points).T
  return float(np.polyfit(x, y, 1)[0])


def run_cell(what: str, kind: str, n: int, repeats: int, depth: int | None = None) -> dict:
  """One configuration measured in a process of its own (on a GPU, in this one): {'seconds', 'gib'}, {'oom_gib'}
  (its compiled peak does not fit), or {'killed': True} (the kernel ended it, or the GPU refused an allocation)."""
  if GPU:
    try:
      return row(what, kind, n, repeats, depth)
    except jax.errors.JaxRuntimeError as e:
      if 'RESOURCE_EXHAUSTED' not in str(e):
        raise
      return {'killed': True}
    finally:
      jax.clear_caches()
  command = [
    sys.executable,
    '-m',
    'experiments.attention_scaling.run',
    '--cell',
    f'{what},{kind},{n}',
    '--repeats',
    str(repeats),
    *(['--depth', str(depth)] if depth else []),
  ]
  done = subprocess.run(command, cwd=common.ROOT, capture_output=True, text=True)
  if done.returncode in (-9, 137):
    return {'killed': True}
  if done.returncode:
    raise RuntimeError(f'{what} {kind} n={n} failed:\n{done.stderr[-3000:]}')
  return json.loads(done.stdout.strip().splitlines()[-1])


def cell(r: dict | None) -> str:
  if r is None:
    return '—'
  if 'oom_gib' in r:
    return f'out of memory ({r["oom_gib"]:.0f} GiB)'
  if 'killed' in r:
    return 'out of memory (killed)'
  return f'{1e3 * r["seconds"]:,.1f} ms / {r["gib"]:.2f} GiB'


def render(results: dict, sizes: tuple[int, ...]) -> str:
  lines = []
  titles = {'layer': 'One self-attention layer, forward + backward', 'step': 'ViT-Ti/16 train step'}
  for what in results:
    lines += [f'**{titles[what]}** (time / compiled peak memory)', '']
    lines.append('| attention | ' + ' | '.join(f'n = {n:,}' for n in sizes) + ' | slope |')
    lines.append('|---' * (len(sizes) + 2) + '|')
    for kind in KINDS:
      rows = results[what][kind]
      s = slope(rows)
      lines.append(
        f'| {kind} | ' + ' | '.join(cell(rows.get(n)) for n in sizes) + f' | {"-" if s is None else f"{s:.2f}"} |'
      )
    full = results[what][BASELINE]
    largest = [n for n in sizes if n >= 16384]
    for n in (n for n in largest if n in full):
      ratios = []
      for kind in (k for k in KINDS if k not in ('full', BASELINE)):
        r = results[what][kind].get(n)
        if r is None:
          continue
        if 'seconds' not in r:
          ratios.append(f'{kind} out of memory')
        elif 'seconds' in full[n]:
          ratios.append(f'{kind} {full[n]["seconds"] / r["seconds"]:.1f}x')
        else:
          ratios.append(f'{kind} runs, full does not')
      lines.append('')
      baseline = 'full (cuDNN)' if GPU else 'full'
      lines.append(f'At n = {n:,}, faster than {baseline}: ' + ', '.join(ratios) + '.')
    lines.append('')
  return '\n'.join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m experiments.attention_scaling.run')
  parser.add_argument('--sizes', default=','.join(map(str, SIZES)))
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--what', default='layer,step', help='which tables: layer, step or both')
  parser.add_argument(
    '--readme',
    help='write the table into this README.md (default: beside this script, for the default sizes and depth)',
  )
  parser.add_argument(
    '--depth', type=int, help="the step table's layers (default: ViT-Ti/16's 12; the suite's toy run: 2)"
  )
  parser.add_argument('--cell', help='WHAT,KIND,N: measure one configuration and print it as JSON (used by main)')
  args = parser.parse_args()
  if args.cell:
    what, kind, n = args.cell.split(',')
    print(json.dumps(row(what, kind, int(n), args.repeats, args.depth)))
    return
  sizes = tuple(int(n) for n in args.sizes.split(','))
  results = {what: {k: {} for k in KINDS} for what in args.what.split(',')}
  start = time.time()
  readme = args.readme or (
    os.path.join(os.path.dirname(__file__), 'README.md') if (sizes, args.depth) == (SIZES, None) else None
  )
  machine = f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one JAX device'
  machine = f'one {jax.devices()[0].device_kind}, bf16' if GPU else machine
  for what in results:
    for kind in KINDS:
      for n in sizes:
        results[what][kind][n] = run_cell(what, kind, n, args.repeats, args.depth)
        print(what, kind, n, cell(results[what][kind][n]), flush=True)
        if readme:  # Rewritten after every cell: a run cut off keeps what it measured.
          minutes = (time.time() - start) / 60
          done = f'Measured on {machine}, jax {jax.__version__}, in {minutes:.0f} minutes.'
          # On a GPU each table has its own place, so the layer and the step tables can be run apart.
          shown = {what: results[what]} if GPU else results
          marker = f'gpu_{what}' if GPU else 'table'
          common.write_table(
            os.path.join(os.path.dirname(readme), 'run.py'), [render(shown, sizes), '', done], marker, False
          )
  print(render(results, sizes))


if __name__ == '__main__':
  main()
