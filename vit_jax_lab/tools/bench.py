"""Train-step benchmark: compile time, step time, examples/s, FLOPs, MFU, peak memory, input throughput.

python -m vit_jax_lab.tools.bench --config configs/vit/digits.py --config.model.variant=Ti/16 \
    --config.data.batch_size=32 --synthetic 224,224,3,1000
python -m vit_jax_lab.tools.bench --config A.py --config.x=1 --config B.py ... --out bench.json   # one table

Each `--config` starts a new entry; the `--config.KEY=VALUE` after it apply to it. The step is timed on
one batch kept on the devices (so the input pipeline does not count), `--steps` times after `--warmup`
steps. `--synthetic H,W,C,CLASSES` (videos T,H,W,C,CLASSES; token classification LENGTH,VOCAB,CLASSES; seq2seq
LENGTH,VOCAB) replaces the dataset by random inputs of that shape, and TensorFlow is never imported; otherwise the
config's train pipeline is timed on its own too, to show whether data or compute bounds a step. FLOPs are XLA's
cost analysis of the whole step as lowered for the mesh (`step_flops`; remat's recomputation included; on GPUs,
the step's matmuls counted from its jaxpr); MFU divides the achieved FLOP/s by the devices' peak: a table of
accelerators (bf16 dense), or on CPU the float32 matmul throughput measured here. Memory is the compiled step's,
per device. `--profile DIR` adds the step's top operations by device time, from a `jax.profiler` trace.
"""

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax_lab import checkpoints, config as config_lib, console, cost, decode, parallel, tasks, train
from vit_jax_lab.errors import ConfigError

PEAK_TFLOPS = {  # Dense bf16 peak per chip, by a substring of jax.Device.device_kind (first match wins).
  'H200': 989.0,
  'H100': 989.0,
  'A100': 312.0,
  'TPU v4': 275.0,
  'TPU v5 lite': 197.0,
  'TPU v5e': 197.0,
  'TPU v5p': 459.0,
  'TPU v5': 459.0,
}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, list[str]]]]:
  """(options, [(config spec, its overrides), ...])."""
  parser = console.Parser(prog='python -m vit_jax_lab.tools.bench', description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=10, help='timed steps (the median is reported); 0: compile only')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps after compilation')
  parser.add_argument('--input_batches', type=int, default=20, help='batches drawn to time the input pipeline')
  parser.add_argument(
    '--synthetic',
    help='H,W,C,CLASSES (or T,H,W,C,CLASSES; tokens: LENGTH,VOCAB,CLASSES; seq2seq: LENGTH,VOCAB): random inputs, '
    'no dataset',
  )
  parser.add_argument(
    '--decode',
    help='seq2seq: also time greedy decoding of these lengths, e.g. 32,64,128,256, '
    'with and without the key/value cache',
  )
  parser.add_argument('--out', help='write the results as JSON here')
  parser.add_argument(
    '--profile',
    metavar='DIR',
    help='also trace --steps more steps with jax.profiler into DIR and print the top 20 operations by device time '
    '(on a GPU, run with XLA_FLAGS=--xla_gpu_enable_command_buffer= : a CUDA graph is one op to the profiler)',
  )
  args, rest = parser.parse_known_args(argv)
  entries = []
  for item in rest:
    if item.startswith('--config='):
      item = item[len('--config=') :]
    elif item.startswith('--config.'):
      if not entries:
        raise ConfigError(f'{item}: give --config PATH before its overrides')
      entries[-1][1].append(item)
      continue
    elif item == '--config':
      continue
    elif item.startswith('-'):
      raise ConfigError(f'unrecognised argument {item!r}')
    entries.append((item, []))
  if not entries:
    raise ConfigError('give at least one --config PATH[:ARG]')
  if args.steps < 0 or args.warmup < 0:
    raise ConfigError('--steps and --warmup must be >= 0')
  try:
    args.decode = [int(n) for n in args.decode.split(',')] if args.decode else []
  except ValueError:
    raise ConfigError(f'--decode {args.decode}: expected lengths such as 32,64,128,256') from None
  return args, entries


def matmul_flops_per_second(n: int = 2048, repeats: int = 5) -> float:
  """The best float32 n x n matmul throughput of the first device: the ceiling MFU is taken against on CPU.
  Best of XLA's default kernels and those the steps are compiled with (`parallel.compiler_options`)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  mesh = jax.sharding.Mesh(jax.devices()[:1], ('data',))
  best = float('inf')
  for options in (None, parallel.compiler_options(mesh)):
    matmul = jax.jit(lambda x: x @ x, compiler_options=options)
    matmul(a).block_until_ready()
    for _ in range(repeats):
      t0 = time.perf_counter()
      matmul(a).block_until_ready()
      best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def peak_flops_per_second(devices) -> tuple[float, str]:
  """(peak FLOP/s of all `devices`, where the figure comes from)."""
  kind = devices[0].device_kind
  for name, tflops in PEAK_TFLOPS.items():
    if name.lower() in kind.lower():
      return tflops * 1e12 * len(devices), f'{name} bf16 dense peak x {len(devices)}'
  if devices[0].platform == 'cpu':
    return matmul_flops_per_second(), 'float32 2048^3 matmul measured now'
  return float('nan'), f'unknown peak for {kind!r}'


def synthetic_setup(config, shape: str):
  """A Setup whose data is random inputs of `shape`, in the form its task takes (classification: H,W,C,CLASSES or
  T,H,W,C,CLASSES; seq2seq: LENGTH,VOCAB, source and target tokens of one shared vocabulary), and its batch."""
  try:
    info, batch = tasks.build(config.task).synthetic_batch(shape, config.data.batch_size)
  except ConfigError as e:
    raise ConfigError(f'--synthetic {shape}: {e}') from None
  s = train.setup(config, data=(None, info))
  return s, jax.device_put(batch, jax.sharding.NamedSharding(s.mesh, parallel.BATCH))


def step_flops(s, config, batch) -> float:
  """XLA's FLOP count of one whole train step: the cost analysis of the step as lowered for all devices,
  before partitioning, so work replicated on every device (the optimizer update) counts once. XLA counts
  a loop's body once and nothing inside cuDNN's fused attention (a custom call), so such a model is counted
  through its twin with unscanned layers and XLA's attention: the same arithmetic. On a GPU, where XLA counts
  nothing before compiling, the count is the step's matmuls alone (`cost.jaxpr_macs`, forward and backward)."""
  twin = {'scan': False} if config.model.get('scan') else {}
  twin |= {'attention_impl': 'xla'} if config.model.get('attention_impl') == 'cudnn' else {}
  if twin:
    config = config.copy_and_resolve_references()
    config.model.update(twin)
    s = train.setup(config, list(s.mesh.devices.flat), data=(s.builder, s.info))
  traced = train.make_train_step(s).trace(checkpoints.abstract(s.abstract_state, s.state_shardings), batch)
  costs = traced.lower().cost_analysis()
  if costs:
    return float(costs['flops'])
  # XLA:GPU counts no lowered module, and its count of a compiled one leaves out the cuBLAS calls.
  return 2.0 * cost.jaxpr_macs(traced.jaxpr.jaxpr)


def measure(config, args) -> dict[str, Any]:
  """One config's numbers."""
  if args.synthetic:
    s, batch = synthetic_setup(config, args.synthetic)
    input_rate = None
  else:
    s = train.setup(config)
    batches = train.train_batches(s)
    batch = next(batches)
    t0 = time.perf_counter()
    for _ in range(args.input_batches):
      jax.block_until_ready(next(batches))
    input_rate = args.input_batches * config.data.batch_size / (time.perf_counter() - t0)
  # Initialisation runs asynchronously: unfinished, it would share the cores with the compilation timed below
  # (ViT-L/16's took ~3 s of its compile time).
  state = jax.block_until_ready(train.init_state(s))
  decoding = {'decode': decode_speed(s, state.params, args.decode)} if args.decode else {}
  t0 = time.perf_counter()
  compiled = train.make_train_step(s).lower(state, batch).compile()
  compile_seconds = time.perf_counter() - t0
  flops = step_flops(s, config, batch)
  memory = compiled.memory_analysis()
  peak_bytes = (
    None
    if memory is None
    else (
      memory.temp_size_in_bytes
      + memory.argument_size_in_bytes
      + memory.output_size_in_bytes
      - memory.alias_size_in_bytes
    )
  )
  result = {
    'model': f'{config.model.name} {config.model.get("variant") or ""}'.strip(),
    'devices': f'{len(s.mesh.devices.flat)} x {s.mesh.devices.flat[0].device_kind}',
    'batch': config.data.batch_size,
    # Images, videos, tokens: one input shape; tasks of several inputs (tracking's template and search) name each.
    'input_shape': (
      list(s.info.input_shape) if hasattr(s.info, 'input_shape') else {k: list(v.shape[1:]) for k, v in batch.items()}
    ),
    'compile_s': compile_seconds,
    'step_tflop': flops / 1e12,
    'peak_memory_gib': None if peak_bytes is None else peak_bytes / 2**30,
    'input_examples_per_s': input_rate,
  } | decoding
  if not args.steps:
    return result
  for _ in range(args.warmup):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(state)
  times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t0)
  step = statistics.median(times)
  if getattr(args, 'profile', None):
    with jax.profiler.trace(args.profile):
      for _ in range(args.steps):
        state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
    result['profile'] = top_operations(args.profile, args.steps, step)
  peak, peak_source = peak_flops_per_second(list(s.mesh.devices.flat))
  return result | {
    'step_s_median': step,
    'step_s_min': min(times),
    'step_s_max': max(times),
    'examples_per_s': config.data.batch_size / step,
    'achieved_tflops': flops / step / 1e12,
    'peak_tflops': peak / 1e12,
    'peak_source': peak_source,
    'mfu': flops / step / peak,
    'loss': float(metrics['loss']),
  }


def top_operations(trace_dir: str, steps: int, step_seconds: float, top: int = 20) -> list[dict[str, Any]]:
  """The `top` operations of the newest `jax.profiler` trace in `trace_dir` by device time, from its events that
  name their HLO op: on an accelerator the kernels of its device planes (`/device:...`), on CPU the thunks of the
  host's XLA threads. Each: op, kernel (its longest-running kernel's name), ms per step, share of the median step
  time, and kernel launches per step; then the ops grouped by kind (the name without its `.N`: 'fusion',
  'custom-call', 'loop_add_fusion'), group 'kind'; the last entry, group 'all', sums every op."""
  paths = sorted(glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True), key=os.path.getmtime)
  if not paths:
    raise ConfigError(f'--profile {trace_dir}: jax.profiler wrote no trace there')
  planes = list(jax.profiler.ProfileData.from_file(paths[-1]).planes)
  devices = [p for p in planes if p.name.startswith('/device:')] or [p for p in planes if p.name == '/host:CPU']
  total, calls, by_kernel = collections.Counter(), collections.Counter(), collections.defaultdict(collections.Counter)
  for plane in devices:
    for line in plane.lines:
      if line.name.startswith('XLA'):  # 'XLA Ops' and 'XLA Modules' repeat the stream lines' kernels.
        continue
      for event in line.events:
        op = dict(event.stats).get('hlo_op')
        if op:
          total[op] += event.duration_ns
          calls[op] += 1
          by_kernel[op][event.name] += event.duration_ns
  rows = [
    {
      'group': 'op',
      'op': op,
      'kernel': by_kernel[op].most_common(1)[0][0],
      'ms_per_step': ns / 1e6 / steps,
      'share': ns / 1e9 / steps / step_seconds,
      'calls_per_step': calls[op] / steps,
    }
    for op, ns in total.most_common(top)
  ]
  kinds, kind_calls = collections.Counter(), collections.Counter()
  for op, ns in total.items():
    kinds[op.rsplit('.', 1)[0]] += ns
    kind_calls[op.rsplit('.', 1)[0]] += calls[op]
  rows += [
    {
      'group': 'kind',
      'op': kind,
      'kernel': '',
      'ms_per_step': ns / 1e6 / steps,
      'share': ns / 1e9 / steps / step_seconds,
      'calls_per_step': kind_calls[kind] / steps,
    }
    for kind, ns in kinds.most_common(10)
  ]
  everything = sum(total.values()) / 1e9 / steps
  return rows + [
    {
      'group': 'all',
      'op': 'every op',
      'kernel': '',
      'ms_per_step': everything * 1e3,
      'share': everything / step_seconds,
      'calls_per_step': sum(calls.values()) / steps,
    }
  ]


def profile_table(rows: list[dict[str, Any]]) -> str:
  lines = ['| # | HLO op | kernel | ms / step | share of step | launches / step |', '|---:|---|---|---:|---:|---:|']
  for i, r in enumerate(rows, 1):
    kernel = r['kernel'] if len(r['kernel']) <= 60 else r['kernel'][:57] + '...'
    number = str(i) if r['group'] == 'op' else ''
    op = f'all {r["op"]}' if r['group'] == 'kind' else r['op']
    lines.append(
      f'| {number} | {op} | {kernel} | {r["ms_per_step"]:.3f} | {r["share"]:.1%} | {r["calls_per_step"]:g} |'
    )
  return '\n'.join(lines)


def decode_speed(s, params, lengths: list[int], repeats: int = 3) -> list[dict[str, Any]]:
  """Greedy decoding of exactly L tokens (EOS held back) for each L of `lengths`, for a batch of
  data.eval_batch_size random inputs, with the cache and without: seconds (best of `repeats`) and tokens/s."""
  if s.task.predicts != 'text':
    raise ConfigError(
      f'--decode times decoding, and task.name={s.config.task.name!r} predicts {s.task.predicts}: give a seq2seq '
      'config, or leave --decode out'
    )
  b, info = s.config.data.eval_batch_size, s.info
  if info.input_vocab is None:
    inputs = jax.random.normal(jax.random.key(0), (b, *info.input_shape), jnp.float32)
  else:
    inputs = jax.random.randint(jax.random.key(0), (b, *info.input_shape), 4, info.input_vocab.size)
    inputs = inputs.at[:, -1].set(decode.EOS)
  results = []
  for length in lengths:
    row = {'length': length, 'batch': b}
    for cached in (True, False):

      def tokens(p, x):
        return decode.greedy(
          decode.stepper(nnx.merge(s.graphdef, p), x, length, cached=cached), b, length, min_length=length
        )[0]

      fn = jax.jit(tokens, compiler_options=parallel.compiler_options(s.mesh))
      jax.block_until_ready(fn(params, inputs))
      best = float('inf')
      for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, inputs))
        best = min(best, time.perf_counter() - t0)
      name = 'cached' if cached else 'uncached'
      row |= {f'{name}_s': best, f'{name}_tokens_per_s': b * length / best}
    row['speedup'] = row['uncached_s'] / row['cached_s']
    results.append(row)
  return results


def decode_table(results: list[dict[str, Any]]) -> str:
  lines = [
    '| config | length | batch | cached s | uncached s | cached / uncached speed | cached tokens/s | '
    'uncached tokens/s |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for r in results:
    for d in r.get('decode', []):
      lines.append(
        f'| {r["config"]} | {d["length"]} | {d["batch"]} | {d["cached_s"]:.3f} | {d["uncached_s"]:.3f} | '
        f'{d["speedup"]:.1f}x | {d["cached_tokens_per_s"]:.0f} | {d["uncached_tokens_per_s"]:.0f} |'
      )
  return '\n'.join(lines)


def table(results: list[dict[str, Any]]) -> str:
  header = (
    'config',
    'model',
    'batch',
    'compile s',
    'step ms (min-max)',
    'ex/s',
    'input ex/s',
    'TFLOP/step',
    'TFLOP/s',
    'MFU',
    'peak GiB',
  )
  rows = []

  def number(r, key, fmt):
    return '—' if r.get(key) is None else format(r[key], fmt)

  for r in results:
    ms = (
      '—'
      if 'step_s_median' not in r
      else (f'{1e3 * r["step_s_median"]:.1f} ({1e3 * r["step_s_min"]:.1f}-{1e3 * r["step_s_max"]:.1f})')
    )
    rows.append(
      (
        r['config'],
        r['model'],
        str(r['batch']),
        f'{r["compile_s"]:.1f}',
        ms,
        number(r, 'examples_per_s', '.1f'),
        number(r, 'input_examples_per_s', '.0f'),
        f'{r["step_tflop"]:.4f}',
        number(r, 'achieved_tflops', '.3f'),
        number(r, 'mfu', '.1%'),
        number(r, 'peak_memory_gib', '.2f'),
      )
    )
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
  sources = sorted(
    {
      f'{r["devices"]}: MFU against {r["peak_tflops"]:.3f} TFLOP/s ({r["peak_source"]})'
      for r in results
      if 'peak_tflops' in r
    }
  )
  return '\n'.join(lines + [''] + sources)


@console.command
def main(argv: list[str]) -> int:
  args, entries = parse(argv)
  configs = []
  for spec, overrides in entries:  # Every config is checked before the first one runs.
    config = config_lib.load(spec)
    config_lib.apply_overrides(config, overrides)
    configs.append((' '.join([spec, *overrides]), config))
  parallel.initialize_distributed(configs[0][1])
  parallel.use_cpu_cores(configs[0][1])
  results = [{'config': name} | measure(config, args) for name, config in configs]
  print(table(results))
  if any('decode' in r for r in results):
    print('\n' + decode_table(results))
  for r in results:
    if 'profile' in r:
      print(f'\n{r["config"]}: top operations by device time\n' + profile_table(r['profile']))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(results, f, indent=2)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
