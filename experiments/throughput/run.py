"""Train-step throughput of the model families on this machine, rendered into README.md.

python -m experiments.throughput.run              # every CPU row (about 20 minutes on 2 CPU cores)
python -m experiments.throughput.run compile      # only the compile-time and memory rows
python -m experiments.throughput.run gpu --part N # one NVIDIA GPU, in parts of under 8 minutes each on an H100:
  1 throughput rows (ViT-Ti/S/B/L in bf16 with cuDNN attention, ViT-B/16 with XLA's attention and in float32)
  2 a jax.profiler trace of the ViT-B/16 step: its top 20 operations by device time
  3 the attention-scaling table of one layer in bf16 (experiments/attention_scaling/README.md; cuDNN's full
    attention the baseline)
  4 ViT-B/16's MFU levers, one at a time, each row beside the same machine's baseline
  5 the attention-scaling table of a whole ViT-Ti/16 train step
--tiny runs a part at toy sizes (the test suite runs every part so on CPU); --readme_dir DIR writes the READMEs
under DIR (DIR/throughput/README.md, DIR/attention_scaling/README.md) instead of beside the scripts.
Each row is `python -m vit_jax_lab.tools.bench` on the config and overrides shown, with random inputs of the
shape shown (--synthetic; Transformer-base: 128 source and 128 target tokens, a 37,000-token vocabulary),
so no dataset is read and TensorFlow is never imported. Each table is rewritten as soon as a row is measured: a
part cut off keeps every row it measured. Run nothing else on the machine meanwhile.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.throughput.run')

import argparse
import json
import os
import subprocess
import sys
import types

import jax

from experiments import common
from vit_jax_lab import config as config_lib
from vit_jax_lab.tools import bench

VIT = [
  '--config.model.pool=tok',
  '--config.model.posemb=learn',
  '--config.model.dropout=0.0',
  '--config.optim.weight_decay=0.05',
]
VIDEO = [
  '--config.model.variant=Ti/16x2',
  '--config.model.temporal_depth=4',
  '--config.data.batch_size=8',
  *(f'--config.model.{k}=None' for k in ('width', 'depth', 'mlp_dim', 'num_heads', 'patch_size', 'tubelet_time')),
]
STEP_ROWS = [  # (name, config, overrides, synthetic input shape)
  (
    'ViT-Ti/16',
    'configs/vit/digits.py',
    [*VIT, '--config.model.variant=Ti/16', '--config.data.batch_size=32'],
    '224,224,3,1000',
  ),
  (
    'ViT-S/16',
    'configs/vit/digits.py',
    [*VIT, '--config.model.variant=S/16', '--config.data.batch_size=32'],
    '224,224,3,1000',
  ),
  (
    'ViT-B/16',
    'configs/vit/digits.py',
    [*VIT, '--config.model.variant=B/16', '--config.data.batch_size=32'],
    '224,224,3,1000',
  ),
  ('ViViT-Ti/16x2 model 1', 'configs/vivit/moving_digits.py:spatiotemporal', VIDEO, '8,224,224,3,400'),
  ('ViViT-Ti/16x2 model 2', 'configs/vivit/moving_digits.py:factorised_encoder', VIDEO, '8,224,224,3,400'),
  (
    'Transformer-base',
    'configs/seq2seq/wmt14_ende.py:base',
    ['--config.compute_dtype=float32', '--config.data.batch_size=16'],
    '128,37000',
  ),
]
COMPILE_ROWS = [  # Compile time and compiled memory, no steps.
  (
    f'ViT-{v} {"scanned" if scan else "unscanned"}, remat {remat}, batch {b}',
    'configs/vit/digits.py',
    [
      *VIT,
      f'--config.model.variant={v}',
      f'--config.data.batch_size={b}',
      f'--config.model.scan={scan}',
      f'--config.model.remat={remat}',
    ],
    '224,224,3,1000',
  )
  for v, scan, remat, b in [
    ('B/16', False, 'none', 32),
    ('B/16', True, 'none', 32),
    ('L/16', True, 'none', 32),
    ('L/16', True, 'none', 64),
    ('L/16', True, 'full', 64),
  ]
]

BF16 = ['--config.compute_dtype=bfloat16']
CUDNN = [*BF16, '--config.model.attention_impl=cudnn']


def vit(variant: str, batch: int, *options: str) -> list[str]:
  return [*VIT, *options, f'--config.model.variant={variant}', f'--config.data.batch_size={batch}']


GPU_ROWS = [  # ViT at 224 px (ImageNet's shape) on one NVIDIA GPU.
  *(
    (f'ViT-{v} bf16 cuDNN', 'configs/vit/digits.py', vit(v, b, *CUDNN), '224,224,3,1000')
    for v, b in [('Ti/16', 256), ('S/16', 256), ('B/16', 256), ('B/16', 512), ('L/16', 128)]
  ),
  (
    'ViT-B/16 bf16 XLA attention',
    'configs/vit/digits.py',
    vit('B/16', 256, *BF16, '--config.model.attention_impl=xla'),
    '224,224,3,1000',
  ),
  ('ViT-B/16 float32', 'configs/vit/digits.py', vit('B/16', 256), '224,224,3,1000'),
]
PROFILE_ROW = ('ViT-B/16 bf16 cuDNN', 'configs/vit/digits.py', vit('B/16', 512, *CUDNN), '224,224,3,1000')
# The XLA flags MaxText sets for GPUs that bear on one device (the rest schedule collectives).
MAXTEXT_FLAGS = '--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_highest_priority_async_stream=true'
LEVERS = [  # (name, overrides on PROFILE_ROW's, XLA_FLAGS): ViT-B/16 bf16 cuDNN at batch 512 unless a row says.
  ('baseline', [], ''),
  ('tanh GELU', ['--config.model.gelu_approximate=true'], ''),
  ('no Triton GEMMs', [], '--xla_gpu_enable_triton_gemm=false'),
  ("MaxText's XLA flags", [], MAXTEXT_FLAGS),
  ('batch 1024', ['--config.data.batch_size=1024'], ''),
  ('batch 1024, remat dots', ['--config.data.batch_size=1024', '--config.model.remat=dots'], ''),
  ('scanned layers', ['--config.model.scan=true'], ''),
]
TINY = {  # --tiny: each row's model and input at toy sizes.
  'overrides': [
    '--config.model.variant=None',
    '--config.model.width=32',
    '--config.model.depth=2',
    '--config.model.mlp_dim=64',
    '--config.model.num_heads=2',
    '--config.model.patch_size=8',
    '--config.data.batch_size=4',
  ],
  'shape': '32,32,3,10',
}


def readme_dir(args, experiment: str) -> str:
  """The script whose README a table goes to: beside the experiment, or under --readme_dir."""
  directory = os.path.join(args.readme_dir or os.path.join(common.ROOT, 'experiments'), experiment)
  return os.path.join(directory, 'run.py')


def measure(rows, steps: int, args=None, write=None, profile: str | None = None) -> list[dict]:
  """bench.measure of each row, the table handed to `write` after each one."""
  results = []
  tiny = bool(args and args.tiny)
  for name, path, overrides, shape in rows:
    config = config_lib.load(os.path.join(common.ROOT, path))
    config_lib.apply_overrides(config, [*overrides, *(TINY['overrides'] if tiny else [])])
    if tiny and jax.default_backend() != 'gpu':  # cuDNN's attention runs on NVIDIA GPUs alone.
      config.model.attention_impl = None
    shape = TINY['shape'] if tiny else shape
    options = types.SimpleNamespace(steps=steps, warmup=2, input_batches=0, synthetic=shape, decode=[], profile=profile)
    results.append({'config': name} | bench.measure(config, options))
    if write:
      write(results)
    print(json.dumps({k: v for k, v in results[-1].items() if k != 'profile'}), flush=True)
  return results


def gpu_part(part: int, args) -> None:
  steps = 2 if args.tiny else 20
  here = readme_dir(args, 'throughput')
  if part == 1:
    measure(
      GPU_ROWS[:2] if args.tiny else GPU_ROWS,
      steps,
      args,
      lambda rows: common.write_table(here, [bench.table(rows)], marker='gpu', echo=False),
    )
  elif part == 2:
    # XLA:GPU launches the step as CUDA graphs, each of which the profiler sees as one op: off for the trace.
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} --xla_gpu_enable_command_buffer='.strip()
    trace = os.path.join(args.trace_dir or os.path.join(common.ROOT, 'runs', 'profile'))
    (row,) = measure([PROFILE_ROW], 5 if args.tiny else 10, args, profile=trace)
    lines = [
      f'{row["config"]}, batch {row["batch"]}, {row["devices"]}: {1e3 * row["step_s_median"]:.1f} ms per step.',
      '',
      bench.profile_table(row['profile']),
    ]
    common.write_table(here, lines, marker='profile')
  elif part in (3, 5):
    command = [sys.executable, '-m', 'experiments.attention_scaling.run', '--what', 'layer' if part == 3 else 'step']
    if args.tiny:
      command += ['--sizes', '16', '--repeats', '1', '--depth', '2']
    if args.readme_dir:
      command += ['--readme', os.path.join(args.readme_dir, 'attention_scaling', 'README.md')]
    subprocess.run(command, cwd=common.ROOT, check=True)
  elif part == 4:
    rows = []
    for name, _, flags in [LEVERS[0], LEVERS[2]] if args.tiny else LEVERS:
      # Each lever in a process of its own: XLA reads its flags once, when the backend starts.
      env = dict(os.environ, XLA_FLAGS=f'{os.environ.get("XLA_FLAGS", "")} {flags}'.strip())
      command = [sys.executable, '-m', 'experiments.throughput.run', 'lever', '--name', name]
      command += ['--tiny'] if args.tiny else []
      done = subprocess.run(command, cwd=common.ROOT, env=env, capture_output=True, text=True)
      if done.returncode:
        print(f'{name}: failed\n{done.stderr[-2000:]}', flush=True)
        continue
      rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
      print(done.stdout.strip().splitlines()[-1], flush=True)
      flags_note = [f'XLA_FLAGS: {flags}' for _, _, flags in LEVERS if flags]
      common.write_table(here, [bench.table(rows), '', *flags_note], marker='levers', echo=False)
  else:
    raise SystemExit(
      f'--part {part}: the parts are 1 (throughput), 2 (profile), 3 and 5 (attention scaling: one layer, a train '
      'step), 4 (levers)'
    )


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m experiments.throughput.run', description=__doc__.splitlines()[0])
  parser.add_argument('what', nargs='?', default='steps', choices=('steps', 'compile', 'gpu', 'lever'))
  parser.add_argument('--part', type=int, help='gpu: which part, 1-5')
  parser.add_argument('--tiny', action='store_true', help='toy sizes: a check that the part runs, on any machine')
  parser.add_argument('--readme_dir', help='write the READMEs under this folder instead')
  parser.add_argument('--trace_dir', help='part 2: where the trace goes (default runs/profile)')
  parser.add_argument('--name', help='lever: which one (used by part 4)')
  args = parser.parse_args()
  if args.what == 'gpu':
    gpu_part(args.part, args)
  elif args.what == 'lever':
    name, overrides, _ = next(lever for lever in LEVERS if lever[0] == args.name)
    _, path, base, shape = PROFILE_ROW
    measure([(f'ViT-B/16 {name}', path, [*base, *overrides], shape)], 2 if args.tiny else 20, args)
  else:
    here = readme_dir(args, 'throughput')
    if args.what == 'steps':
      common.write_table(here, [bench.table(measure(STEP_ROWS, steps=10, args=args))], marker='steps')
    common.write_table(here, [bench.table(measure(COMPILE_ROWS, steps=0, args=args))], marker='compile')


if __name__ == '__main__':
  main()
