"""Rehearsal of the cluster recipes' input pipelines on stand-ins of their datasets, rendered into README.md.

python -m experiments.rehearsal.run [--rows imagenet_deit,wmt14_ende] [--scratch /tmp/rehearsal] [--readme PATH]
python -m experiments.rehearsal.run --tiny --rows imagenet_deit --readme /tmp/x.md   # a check that it runs (a new file)

For each row (ROWS: a cluster config of configs/), a stand-in of the recipe's dataset in its real format and shapes
(standins.py, made once under --scratch) is read by the project's own training iterator, `train.setup(config)` then
`train.train_batches(setup)`, with every data.* setting of the recipe but the batch size (the dataset's name and
folder, and the eval split's name, point at the stand-in); the model is made tiny and never run, so what is timed is
the input path alone. Each row runs in fresh processes of its own, not pinned (no taskset), with TensorFlow's
default threads: one prepares the stand-in (TFDS records, a trained vocabulary), one times the pipeline and reads
its peak memory, then times resumes, one reads the peak memory with a shuffle buffer of a few examples. The table
is rewritten after each row; every row's measurements are kept in a JSON file beside the README, so --rows
replaces only those rows. A row whose pipeline fails shows the failure's one line. --tiny: tiny stand-ins under
--scratch/tiny, 2 batches and all of a row in one process (its numbers mean nothing; it checks the path runs).
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.rehearsal.run')

import argparse
import dataclasses
import datetime
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from experiments import common
from experiments.rehearsal import standins

RESULT = 'REHEARSAL_RESULT '  # Prefixes the probe's one JSON line among TensorFlow's output.
NODE_MEMORY = 2 * 2**40  # A DGX H100's host memory: 2 TiB for 8 GPUs.
PREFETCHED = 4  # Batches in flight per data shard at the recipe's batch (the pipeline's own BATCHES_IN_FLIGHT).

# One H100's measured training rates (experiments/throughput/NOTES.md, bf16 with cuDNN attention): ViT-Ti/16 at
# batch 256 and ViT-B/16 at batch 512 (53.8377 TFLOP per step of 179.2 ms: 300.4 TFLOP/s). Other models are
# assumed to run at ViT-B/16's FLOP rate: its images/s x 17.56 / their forward GMACs (cost.matmul_macs).
TI16_H100 = 10_666.0
B16_H100 = 2_858.0
B16_GMACS = 17.56
B16_TFLOPS = 53.8377 / 0.1792
# Transformer-base's train step: 0.8111 TFLOP (XLA's count) for 16 pairs of 128 + 128 tokens
# (experiments/throughput/README.md): per padded token, source and target alike.
TRANSFORMER_FLOP_PER_TOKEN = 0.8111e12 / (16 * 256)


@dataclasses.dataclass(frozen=True)
class StandIn:
  """A stand-in dataset: the function of standins.py that makes it, its arguments at full and --tiny sizes, and
  what the full one holds."""

  make: str  # standins.<make>(root, **full or tiny)
  full: dict
  tiny: dict
  about: str
  tfds_dir: bool = False  # root is a TFDS data_dir (a built-in builder reads its manual folder), not a folder:PATH.


STANDINS = {
  'imagenet': StandIn(
    'imagenet_like',
    dict(train_per_class=54, test_per_class=6, classes=20),
    dict(train_per_class=6, test_per_class=1, classes=4),
    '1,080 train + 120 val JPEGs of ImageNet sizes (~500x375, ~110 KB), 20 classes',
  ),
  'cifar': StandIn(
    'cifar10_prepared',
    dict(train_per_class=1_000, test_per_class=100),
    dict(train_per_class=10, test_per_class=2),
    '10,000 train + 1,000 test 32x32 PNGs, 10 classes, as TFDS cifar10 prepared',
    tfds_dir=True,
  ),
  'kinetics': StandIn(
    'kinetics_like',
    dict(train_per_class=8, test_per_class=1, classes=8, seconds=10.0),
    dict(train_per_class=2, test_per_class=1, classes=2, seconds=2.0),
    '64 train + 8 val 10 s clips, 340x256, 25 fps, H.264 mp4 with audio',
  ),
  'wmt': StandIn(
    'wmt_like',
    dict(train_pairs=100_000, test_pairs=3_000),
    dict(train_pairs=2_000, test_pairs=100),
    '100,000 train + 3,000 test EN-DE pairs (train.tsv / test.tsv), WMT14-like lengths',
  ),
  'got10k': StandIn(
    'got10k_like',
    dict(sequences=6, frames=150, size=(1280, 720)),
    dict(sequences=2, frames=10, size=(320, 180)),
    '6 train + 6 val sequences of 150-225 1280x720 JPEG frames (GOT-10k layout)',
    tfds_dir=True,
  ),
}

VIT_TINY = ('--config.model.variant=mu/16',)
# The WMT stand-in's 4,000-word lexicons per language leave SentencePiece at most ~14k pieces (the recipe: 32,000).
WMT_VOCAB = 8_000


@dataclasses.dataclass(frozen=True)
class Row:
  name: str
  spec: str  # Config file[:arg], relative to the repository root.
  standin: str  # A key of STANDINS.
  batch: int  # data.batch_size here (the recipe's stays in the config, for the memory estimate).
  tiny_batch: int
  overrides: tuple[str, ...]  # The tiny model; the eval split's name on the stand-in; no pretrained weights.
  real_examples: int  # Training examples of the real dataset.
  real_what: str
  gpu_rate: float | None  # Examples/s one H100 trains on; None: worked out from the batches (token budgets).
  gpu_what: str
  tiny_overrides: tuple[str, ...] = ()  # What the --tiny stand-in needs besides.


def augreg(level: str) -> Row:
  return Row(
    f'imagenet_augreg_{level}' if level != 'medium2' else 'imagenet_augreg',
    f'configs/vit/imagenet_augreg.py:Ti/16,{level}',
    'imagenet',
    96,
    8,
    (*VIT_TINY, '--config.data.eval_split=val'),
    1_268_355,
    'ImageNet-1k train[:99%]',
    TI16_H100,
    'ViT-Ti/16, measured',
  )


ROWS = [
  Row(
    'imagenet_deit',
    'configs/vit/imagenet_deit.py:Ti',
    'imagenet',
    96,
    6,
    (*VIT_TINY, '--config.data.eval_split=val'),
    1_281_167,
    'ImageNet-1k train',
    TI16_H100,
    'ViT-Ti/16, measured',
  ),
  augreg('medium2'),
  augreg('none'),
  augreg('light1'),
  augreg('light2'),
  augreg('strong2'),
  Row(
    'finetune_imagenet',
    'configs/vit/finetune.py:imagenet2012,B/16',
    'imagenet',
    64,
    8,
    (*VIT_TINY, '--config.data.eval_split=val', '--config.init_from=None'),
    1_268_355,
    'ImageNet-1k train[:99%]',
    B16_H100 * B16_GMACS / 55.48,
    'ViT-B/16 at 384 px (55.48 GMACs)',
  ),
  Row(
    'finetune_cifar10',
    'configs/vit/finetune.py:cifar10,B/16',
    'cifar',
    64,
    8,
    (*VIT_TINY, '--config.init_from=None'),
    49_000,
    'CIFAR-10 train[:98%]',
    B16_H100 * B16_GMACS / 55.48,
    'ViT-B/16 at 384 px (55.48 GMACs)',
  ),
  Row(
    'kinetics400',
    'configs/vivit/kinetics400.py',
    'kinetics',
    8,
    2,
    ('--config.model.variant=mu/16x2', '--config.data.eval_split=val', '--config.init_from=None'),
    214_834,
    "Kinetics-400 train, the config's TRAIN_EXAMPLES",
    B16_H100 * B16_GMACS / 283.3,
    'ViViT-B/16x2 model 2, 32 frames (283.3 GMACs)',
  ),
  Row(
    'wmt14_ende',
    'configs/seq2seq/wmt14_ende.py',
    'wmt',
    128,
    128,
    (
      '--config.model.variant=tiny',
      '--config.data.source=source',
      '--config.data.target=target',
      f'--config.data.vocab_size={WMT_VOCAB}',
    ),
    4_508_785,
    'WMT14 EN-DE train pairs',
    None,
    "Transformer-base at ViT-B/16's FLOP rate",
    ('--config.data.vocab_size=500',),
  ),
  Row(
    'got10k',
    'configs/tracking/got10k.py',
    'got10k',
    16,
    4,
    ('--config.model.variant=mu/16', '--config.model.corner_channels=16', '--config.init_from=None'),
    9_335,
    'GOT-10k train sequences',
    B16_H100 * B16_GMACS / 30.12,
    'tracker ViT-B/16, 128 + 256 px crops (30.12 GMACs)',
  ),
]
GRAIN = ('--config.data.backend=grain',)  # In this process, with threads: their CPU time is counted (workers' is not).


def on_grain(row: Row) -> Row:
  """`row` read by the grain backend (data.backend='grain'), which has no shuffle buffer."""
  return dataclasses.replace(row, name=f'{row.name}_grain', overrides=(*row.overrides, *GRAIN))


ROWS += [on_grain(r) for r in ROWS if r.name in ('imagenet_deit', 'imagenet_augreg', 'finetune_imagenet')]
BY_NAME = {row.name: row for row in ROWS}


def standin_root(name: str, scratch: str, tiny: bool) -> str:
  """The stand-in's folder, made unless a finished one of the same description is there (its `.complete` file)."""
  root = os.path.join(scratch, 'tiny' if tiny else '', 'standins', name)
  marker = os.path.join(root, '.complete')
  if not os.path.exists(marker) or open(marker).read() != STANDINS[name].about:
    shutil.rmtree(root, ignore_errors=True)
    start = time.time()
    print(f'making the {name} stand-in in {root}', flush=True)
    standin = STANDINS[name]
    getattr(standins, standin.make)(root, **(standin.tiny if tiny else standin.full))
    with open(marker, 'w') as f:
      f.write(STANDINS[name].about)
    print(f'  {time.time() - start:.0f} s', flush=True)
  return root


def config_args(row: Row, scratch: str, tiny: bool) -> list[str]:
  """The overrides that make `row`'s config read its stand-in (which exists by now)."""
  root = os.path.join(scratch, 'tiny' if tiny else '', 'standins', row.standin)
  tfds_dir = os.path.join(scratch, 'tiny' if tiny else '', 'tfds')
  data = [f'--config.data.data_dir={root}'] if STANDINS[row.standin].tfds_dir else []
  data = data or [f'--config.data.name=folder:{root}', f'--config.data.data_dir={tfds_dir}']
  batch = f'--config.data.batch_size={row.tiny_batch if tiny else row.batch}'
  return [*data, *row.overrides, batch, *(row.tiny_overrides if tiny else ())]


# --- The probe: one process's measurements of a row ---------------------------------------------------------------


def cpu_seconds() -> float:
  """User + system CPU time of this process and its reaped children."""
  own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def memory(field: str = 'VmHWM') -> int:
  """This process's peak (VmHWM) or present (VmRSS) resident memory; the peak from ru_maxrss without /proc."""
  try:
    with open('/proc/self/status') as f:
      return next(int(line.split()[1]) * 1024 for line in f if line.startswith(f'{field}:'))
  except OSError:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rows_of(batch: dict) -> int:
  return next(iter(batch.values())).shape[0]


def iterate(train, s, *, warmup: int, batches: int, seconds: float, examples: int = 0) -> dict:
  """Time to the first batch from building the iterator; then, after `warmup` more, CPU and wall seconds of a window
  of at least `batches` batches, `seconds` seconds and `examples` examples; the peak memory after it."""
  before = memory('VmRSS')
  start = time.perf_counter()
  it = train.train_batches(s)
  first = next(it)
  first_s = time.perf_counter() - start
  for _ in range(warmup):
    next(it)
  cpu, wall = cpu_seconds(), time.perf_counter()
  count = drawn = 0
  out_bytes = tokens = 0.0
  while count < batches or drawn < examples or time.perf_counter() - wall < seconds:
    batch = next(it)
    count, drawn = count + 1, drawn + rows_of(batch)
    out_bytes += sum(v.nbytes for v in batch.values())
    if 'targets' in batch and batch['inputs'].ndim == 2:
      tokens += batch['inputs'].size + batch['targets'].size
  result = dict(
    first_s=first_s,
    batches=count,
    examples=drawn,
    cpu_s=cpu_seconds() - cpu,
    wall_s=time.perf_counter() - wall,
    peak=memory(),
    before=before,
    out_bytes_per_example=out_bytes / drawn,
    tokens_per_example=tokens / drawn,
    rows_per_batch=drawn / count,
    first_rows=rows_of(first),
  )
  it.close()
  return result


def mid_epoch_step(epoch: int, per_step: float) -> tuple[int, int]:
  """(step, stream examples skipped into its epoch) of the step whose start lies nearest the middle of an epoch of
  `epoch` stream examples (a batch larger than an epoch lands in a later one)."""
  steps = range(1, 2 * int(epoch / per_step) + 3)
  step = min(steps, key=lambda k: (abs(round(k * per_step) % epoch - epoch / 2), k))
  return step, round(step * per_step) % epoch


def resume_pairs(tiny: bool, first_s: float) -> int:
  """Builds from step 0 and from mid-epoch, each, to time a resume: 4, or 2 where a first batch takes over 20 s."""
  return 1 if tiny else 4 if first_s < 20 else 2


def resume_times(train, s, step: int, pairs: int) -> dict:
  """Times to the first batch from step 0 and from `step`, `pairs` times each, in the order 0, step, step, 0, 0, ...
  so that neither gains from going first (this process has built the iterator before)."""
  times = {0: [], step: []}
  for i in range(pairs):
    for start_step in (0, step) if i % 2 == 0 else (step, 0):
      begin = time.perf_counter()
      it = train.train_batches(s, start_step)
      next(it)
      times[start_step].append(time.perf_counter() - begin)
      it.close()
      del it
      gc.collect()
  return {'first_0': times[0], 'first_mid': times[step]}


def host_memory_estimate(s) -> dict:
  """The pipeline's own estimate of a buffered example's bytes (TFDS's recorded bytes per example plus tf.data's
  cost)."""
  from vit_jax_lab.data import pipeline

  data, task = s.config.data, s.task
  estimate = pipeline.host_memory(
    s.builder, data, task.prepare(s.info, True), task.preprocess(data, s.info, True), task.buckets(data, s.info), 1e30
  )
  return {'estimated_example_bytes': estimate.example_bytes}


def decoded_example_bytes(s) -> dict:
  """The mean bytes of a training example's images or frames once decoded (uint8 height x width x channels, from
  the JPEG headers, or decoding other formats), for the datasets whose pipeline keeps them encoded in its buffer."""
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from vit_jax_lab.data import pipeline

  keys = pipeline.encoded_features(s.builder)
  if not keys:
    return {}
  ds = s.builder.as_dataset(split=s.config.data.train_split, decoders={k: tfds.decode.SkipDecoding() for k in keys})

  def pixels(encoded: tf.Tensor) -> tf.Tensor:
    shape = tf.cond(
      tf.io.is_jpeg(encoded), lambda: tf.io.extract_jpeg_shape(encoded), lambda: tf.shape(tf.io.decode_image(encoded))
    )
    return tf.reduce_prod(tf.cast(shape, tf.int64))

  def size(ex):
    return sum(tf.reduce_sum(tf.map_fn(pixels, tf.reshape(ex[k], [-1]), fn_output_signature=tf.int64)) for k in keys)

  sizes = [int(n) for n in ds.map(size, num_parallel_calls=tf.data.AUTOTUNE).as_numpy_iterator()]
  return {'decoded_bytes': sum(sizes) / max(len(sizes), 1)}


LIMIT_SECONDS = 10.0  # CPU-seconds of the host-limit loop at most (it stops after a pass over its examples).


def host_limit(s) -> dict:
  """Examples per CPU-second (one thread, this process) of the work the host cannot avoid for the row's examples,
  on the same records: decoding an image (libjpeg-turbo through TensorFlow, or PNG); decoding the data.num_frames
  frames a clip takes, or the 2 of a tracking pair; tokenising a sentence pair (SentencePiece from Python)."""
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from vit_jax_lab.data import pipeline

  data, features = s.config.data, s.builder.info.features
  keys = pipeline.encoded_features(s.builder)
  decoders = {k: tfds.decode.SkipDecoding() for k in keys}
  if data.backend == 'grain':  # Its ArrayRecord copy is read by index (TFDS reads it with no as_dataset).
    source = s.builder.as_data_source(data.train_split, decoders=decoders)
    examples = [source[i] for i in range(min(64, len(source)))]
  else:
    examples = list(s.builder.as_dataset(split=data.train_split, decoders=decoders).take(64).as_numpy_iterator())
  root = getattr(s.info, 'frames_root', None)  # Frames kept as files are read from their paths beforehand.
  read = (lambda f: open(os.path.join(root, f.decode()), 'rb').read()) if root else (lambda f: f)
  if 'frames' in features:  # A tracking sequence: a pair's 2 frames.
    what, work = 'decode 2 frames', [[read(f) for f in ex['frames'][:2]] for ex in examples]
  elif 'video' in features:
    what = f'decode {data.num_frames} frames'
    work = [[read(f) for f in ex['video'][: data.num_frames]] for ex in examples]
  elif keys:
    what, work = 'decode', [[ex[keys[0]]] for ex in examples]
  else:
    source, target = s.info.input_vocab, s.info.target_vocab
    pairs = [(ex[s.info.input_key].decode(), ex[s.info.target_key].decode()) for ex in examples * 16]
    start = time.process_time()
    for a, b in pairs:
      source.encode(a), target.encode(b)
    return {'limit': len(pairs) / (time.process_time() - start), 'limit_what': 'tokenise (SentencePiece)'}
  for files in work[:4]:  # Warm-up.
    [tf.io.decode_image(f, channels=3, expand_animations=False) for f in files]
  start, done = time.process_time(), 0
  while time.process_time() - start < LIMIT_SECONDS and done < 4 * len(work):
    [tf.io.decode_image(f, channels=3, expand_animations=False) for f in work[done % len(work)]]
    done += 1
  return {'limit': done / (time.process_time() - start), 'limit_what': what}


def probe(args) -> dict:
  """The measurements `args.stages` ask for, of row `args.probe` (see main's --stages)."""
  from vit_jax_lab import config as config_lib, train

  row, tiny, stages = BY_NAME[args.probe], args.tiny, args.stages.split(',')
  workdir = os.path.join(args.scratch, 'tiny' if tiny else '', 'work', row.name)
  os.makedirs(workdir, exist_ok=True)

  def setup(buffer: int | None = None):
    config = config_lib.load(os.path.join(common.ROOT, row.spec))
    recipe = {'shuffle_buffer': config.data.shuffle_buffer, 'batch_size': config.data.batch_size}
    extra = [f'--config.data.shuffle_buffer={buffer}'] if buffer else []
    config_lib.apply_overrides(config, config_args(row, args.scratch, tiny) + extra)
    return train.setup(config, workdir=workdir), recipe

  s, recipe = setup(args.buffer)
  data = s.config.data
  grain = data.backend == 'grain'  # No shuffle buffer; its copy of the data is read by index.
  buckets = s.task.buckets(data, s.info)
  split = s.builder.info.splits[data.train_split]
  whole = s.builder.info.splits[data.train_split.split('[')[0]]  # A slice's num_bytes is 0.
  out = dict(
    n=split.num_examples,
    record_bytes=whole.num_bytes / max(whole.num_examples, 1),
    repeats=data.repeated_augment,
    batch=data.batch_size,
    groups=len(buckets.lengths()) if buckets else 0,
    buffer=0 if grain else data.shuffle_buffer,
    cache=bool(data.cache) and not grain,
    recipe_buffer=0 if grain else recipe['shuffle_buffer'],
    recipe_batch=recipe['batch_size'],
    token_budget=data.token_budget,
  )
  if 'prepare' in stages and not grain:
    out |= host_memory_estimate(s) | decoded_example_bytes(s)
  # A window spans an epoch of the stand-in: a token budget's bucket groups read their examples anew each epoch.
  epoch = out['n'] * out['repeats']
  window = dict(warmup=0, batches=2, seconds=0.0) if tiny else dict(warmup=2, batches=5, seconds=20.0, examples=epoch)
  if 'main' in stages:
    out['main'] = iterate(train, s, **window)
    out |= host_limit(s)  # In the same process and sitting as the pipeline's rate.
  if 'resume' in stages:
    per_step = data.batch_size if buckets is None else out['main']['rows_per_batch']
    step, skipped = mid_epoch_step(out['n'] * out['repeats'], per_step)
    out['resume'] = {'step': step, 'skipped': skipped} | resume_times(
      train, s, step, resume_pairs(tiny, out['main']['first_s'])
    )
  if 'small' in stages:
    if args.buffer is None:
      s, _ = setup(small_buffer(out['n']))
    count = args.batches or out['main']['batches'] + window['warmup']
    small = iterate(train, s, warmup=0, batches=count, seconds=0.0)
    out['small'] = small | {'buffer': 0 if grain else s.config.data.shuffle_buffer}
  return out


def small_buffer(n: int) -> int:
  """The few-example shuffle buffer beside which the recipe's is measured: 16, or a quarter of a small stand-in."""
  return max(1, min(16, n // 4))


# --- The parent: rows in processes of their own, derived numbers, the README ----------------------------------------


def run_probe(row: Row, args, stages: str, extra: list[str] = (), timeout: float = 1800) -> dict:
  """`probe` in a fresh process; {'error': its one line} when it fails."""
  command = [sys.executable, '-m', 'experiments.rehearsal.run', '--probe', row.name, '--stages', stages]
  command += ['--scratch', args.scratch, *(['--tiny'] if args.tiny else []), *extra]
  try:
    done = subprocess.run(command, cwd=common.ROOT, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {'error': f'{stages}: no batch within {timeout:.0f} s'}
  lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
  if lines:
    return json.loads(lines[-1][len(RESULT) :])
  said = [line for line in done.stderr.splitlines() if line.strip()]
  return {'error': f'{stages}: exit {done.returncode}: {said[-1].strip() if said else "no output"}'}


def measure_row(row: Row, args) -> dict:
  """A row's probes: all in one process with --tiny, else preparation, timing and the small buffer apart."""
  standin_root(row.standin, args.scratch, args.tiny)
  start = time.time()
  if args.tiny:
    out = run_probe(row, args, 'prepare,main,resume,small', timeout=600)
  else:
    out = run_probe(row, args, 'prepare')
    if 'error' not in out:
      timed = run_probe(row, args, 'main,resume')
      out = out | timed if 'error' not in timed else timed
    if 'error' not in out:
      extra = ['--buffer', str(small_buffer(out['n'])), '--batches', str(out['main']['batches'] + 2)]
      small = run_probe(row, args, 'small', extra)
      out = out | {'small': small['small']} if 'error' not in small else small
  return out | {'seconds': time.time() - start}


def derive(row: Row, m: dict) -> dict:
  """The table's numbers of a row's measurements `m`."""
  if 'error' in m:
    return {}
  main, small = m['main'], m['small']
  groups = max(m['groups'], 1)  # A token-budget pipeline has a shuffle buffer per bucket group.

  def buffered(buffer: int, n: int) -> int:
    return min(buffer * groups, n) + n * m['cache']

  d = dict(per_cpu_s=main['examples'] / main['cpu_s'], per_s=main['examples'] / main['wall_s'])
  here, tiny = buffered(m['buffer'], m['n']), buffered(small['buffer'], m['n'])
  d['measured_bytes'] = (main['peak'] - small['peak']) / (here - tiny) if here > tiny else None
  d['example_bytes'] = max((b for b in (d['measured_bytes'], m.get('estimated_example_bytes')) if b), default=None)
  if m['recipe_buffer'] == 0 and not m['cache']:  # Nothing buffered (grain): the peak is the batches'.
    d['example_bytes'] = 0.0
  d['real_buffered'] = buffered(m['recipe_buffer'], row.real_examples)
  batch_examples = 0 if m['token_budget'] else m['recipe_batch'] - m['batch']
  d['batch_bytes'] = PREFETCHED * batch_examples * main['out_bytes_per_example']
  if d['example_bytes'] is not None:
    d['real_peak'] = main['peak'] + (d['real_buffered'] - here) * d['example_bytes'] + d['batch_bytes']
  first_0, first_mid = m['resume']['first_0'], m['resume']['first_mid']
  d['resume_extra'] = statistics.mean(first_mid) - statistics.mean(first_0)
  pairs = min(len(first_0), len(first_mid))
  d['resume_error'] = (
    (statistics.variance(first_0) / pairs + statistics.variance(first_mid) / pairs) ** 0.5 if pairs > 1 else 0.0
  )
  d['real_skipped'] = row.real_examples * m['repeats'] // 2
  per_skipped = d['real_skipped'] / max(m['resume']['skipped'], 1)
  d['real_resume'], d['real_resume_error'] = d['resume_extra'] * per_skipped, d['resume_error'] * per_skipped
  d['real_resume_bytes'] = row.real_examples / 2 * m['record_bytes']
  d['gpu_rate'] = row.gpu_rate or B16_TFLOPS * 1e12 / TRANSFORMER_FLOP_PER_TOKEN / main['tokens_per_example']
  d['cores'] = d['gpu_rate'] / d['per_cpu_s']
  d['limit_cores'] = d['gpu_rate'] / m['limit'] if m.get('limit') else None
  return d


def size(n: float) -> str:
  for unit, scale in (('TiB', 2**40), ('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if abs(n) >= scale:
      return f'{n / scale:.3g} {unit}' if abs(n) < 100 * scale else f'{n / scale:,.0f} {unit}'
  return f'{n:.0f} B'


def minutes(s: float, error: float | None = None) -> str:
  """Seconds, or minutes from 2 on; `error`: ± it in the same unit."""
  scale, unit = (1, 's') if s < 120 else (60, 'min')
  return f'{s / scale:.1f}{"" if error is None else f" ± {error / scale:.1f}"} {unit}'


def speed_lines(results: dict) -> list[str]:
  lines = [
    '| row | config | batch here (recipe) | window: batches (examples) | ex / CPU-s | ex / s | cores busy | '
    'first batch | resume at mid-epoch: extra s (skipped) | at the real half epoch (skipped; reads) | '
    'H100 needs ex/s | cores per H100 | host limit: ex / CPU-s (the work) | share of it | '
    'cores per H100 at the limit |',
    '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for row in ROWS:
    if row.name not in results:
      continue
    m = results[row.name]
    head = f'| {row.name} | `{row.spec}` |'
    if 'error' in m:
      lines.append(f'{head} {row.batch} | failed: {m["error"]} | | | | | | | | |')
      continue
    d, main, r = derive(row, m), m['main'], m['resume']
    extra = f'{d["resume_extra"]:+.2f} ± {d["resume_error"]:.2f} s ({r["skipped"]:,})'
    if abs(d['resume_extra']) < 2 * d['resume_error']:  # Within the noise: an upper bound.
      real = f'< {minutes(abs(d["real_resume"]) + 2 * d["real_resume_error"])}'
    else:
      real = minutes(d['real_resume'], d['real_resume_error'])
    real += f' ({d["real_skipped"]:,}; {size(d["real_resume_bytes"])})'
    batch = f'{m["batch"]} ({m["recipe_batch"]})' if not m['token_budget'] else f'{m["token_budget"]:,} tokens'
    lines.append(
      f'{head} {batch} | {main["batches"]} ({main["examples"]:,}) | {d["per_cpu_s"]:,.1f} | {d["per_s"]:,.1f} | '
      f'{main["cpu_s"] / main["wall_s"]:.2f} | {main["first_s"]:.1f} s | {extra} | {real} | {d["gpu_rate"]:,.0f} | '
      f'{d["cores"]:,.1f} | {limit(m, d)}'
    )
  return lines


def limit(m: dict, d: dict) -> str:
  """The host-limit cells: the limit (what it is), the pipeline's share of it, the cores per H100 it needs."""
  if not m.get('limit'):
    return '— | — | — |'
  return f'{m["limit"]:,.1f} ({m["limit_what"]}) | {d["per_cpu_s"] / m["limit"]:.0%} | {d["limit_cores"]:,.1f} |'


def scale_lines(results: dict) -> list[str]:
  """What each row's real-scale numbers assume."""
  lines = ['| row | real training examples | one H100 trains on |', '|---|---:|---|']
  for row in ROWS:
    if row.name in results:
      rate = f'{row.gpu_rate:,.0f} examples/s' if row.gpu_rate else 'pairs/s from the token rate below'
      lines.append(f'| {row.name} | {row.real_examples:,} ({row.real_what}) | {rate}: {row.gpu_what} |')
  return lines


def memory_lines(results: dict) -> list[str]:
  lines = [
    '| row | buffered examples: small / here / recipe | resident before the iterator; peak: small / here | '
    "bytes per buffered example: measured / pipeline's estimate / decoded | prefetched batches, recipe's batch | "
    "peak at the recipe's buffer and batch | under 2 TiB |",
    '|---|---:|---:|---:|---:|---:|:-:|',
  ]
  for row in ROWS:
    m = results.get(row.name)
    if m is None or 'error' in m:
      continue
    d, main, small = derive(row, m), m['main'], m['small']
    groups = max(m['groups'], 1)
    here, few = (min(b * groups, m['n']) for b in (m['buffer'], small['buffer']))
    measured, estimate = d['measured_bytes'], m.get('estimated_example_bytes')
    shown = '—' if measured is None else size(measured) if measured > 0 else 'none (in the noise)'
    decoded = m.get('decoded_bytes')
    per = f'{shown} / {"—" if estimate is None else size(estimate)} / {"—" if decoded is None else size(decoded)}'
    if measured and measured > 0 and decoded:
      per += f' ({measured / decoded:.0%} of decoded)'
    peak = d.get('real_peak')
    fits = '—' if peak is None else ('yes' if peak < NODE_MEMORY else '**no**')
    lines.append(
      f'| {row.name} | {few:,} / {here:,} / {d["real_buffered"]:,} | {size(main["before"])}; '
      f'{size(small["peak"])} / {size(main["peak"])} | {per} | {size(d["batch_bytes"])} | '
      f'{"—" if peak is None else size(peak)} | {fits} |'
    )
  return lines


def machine() -> str:
  model = next(
    (line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo') if line.startswith('model name')), 'unknown CPU'
  )
  return f'{model}, {os.cpu_count()} cores'


def git(*command: str) -> str:
  done = subprocess.run(['git', *command], cwd=common.ROOT, capture_output=True, text=True)
  return done.stdout.strip()


def readme(results: dict, tiny: bool) -> str:
  rows = [results[row.name] for row in ROWS if row.name in results]
  stamps = '; '.join(sorted({f'{m["date"]} at commit {m["commit"]}{m["dirty"]}' for m in rows}))
  used = {row.standin for row in ROWS if row.name in results}
  standins = [f'- `{name}`: {s.about}.' for name, s in STANDINS.items() if name in used]
  took = minutes(sum(m['seconds'] for m in rows))
  return '\n'.join(
    [
      "# Rehearsal of the cluster recipes' input pipelines",
      '',
      "Each cluster config's training input pipeline as a run builds it (`train.setup(config)`, then",
      '`train.train_batches(setup)`), on a stand-in of its dataset in the real format and shapes',
      "([standins.py](standins.py)). Every `data.*` setting is the recipe's (shuffle buffer, augmentation, resolution,",
      f'frames, token budget) but the batch size, and the WMT vocabulary ({WMT_VOCAB:,} pieces: its stand-in has too',
      "few words for 32,000); the model is made tiny and never run, so the numbers are the input path's.",
      f'Regenerate: `python -m experiments.rehearsal.run` ({took} for these rows; `--rows a,b` for some of them).',
      *(['', '**Made with --tiny: the numbers mean nothing.**'] if tiny else []),
      '',
      f'Machine: {machine()}, shared with other users: examples per CPU-second (user + system time of the process',
      "and its children, `getrusage`) are the fair rate. No taskset, TensorFlow's default threads, each row in fresh",
      f'processes. Measured {stamps}. Rows ending in `_grain`: the same recipe read by the grain backend',
      "(`data.backend='grain'`: an ArrayRecord copy read by index, NumPy/PIL ops, threads in the one process; no",
      'shuffle buffer). Stand-ins (made once under `--scratch`):',
      '',
      *standins,
      '',
      '## Speed',
      '',
      '<!-- speed -->',
      *speed_lines(results),
      '<!-- /speed -->',
      '',
      '<!-- scale -->',
      *scale_lines(results),
      '<!-- /scale -->',
      '',
      '- **Rates**: over a window of at least an epoch of the stand-in, 5 batches and 20 s, after the first batch',
      '  and 2 more; cores busy: CPU-seconds per second of it.',
      '- **First batch**: seconds from building the iterator to its first batch, the first in the process.',
      '- **Resume**: time to the first batch from the step nearest the middle of an epoch of the stand-in',
      '  (`train_batches(setup, start_step)`) minus that from step 0: the difference of the means of 4 builds each',
      '  (2 where a first batch takes over 20 s), alternating, ± its standard error; per skipped example',
      '  (repeated-augmentation copies count) times those of half an epoch of the real dataset, an upper bound where',
      "  the difference is within twice its error. The real resume also reads that half epoch's records (the bytes",
      '  shown) from storage; here they come from the page cache.',
      '- **Cores per H100**: the examples/s one H100 trains on ÷ examples per CPU-second. ViT-Ti/16 10,666 and',
      '  ViT-B/16 2,858 images/s are measured on one H100 (bf16, cuDNN attention; experiments/throughput/NOTES.md);',
      "  other models are assumed at ViT-B/16's FLOP rate (its images/s × 17.56 / their forward GMACs), and",
      '  Transformer-base at that rate (300 TFLOP/s) over the 0.198 GFLOP of its step per padded token',
      '  (experiments/throughput/README.md), divided by the padded tokens per pair measured here. A DGX H100 has',
      '  112 cores for its 8 GPUs: 14 per GPU.',
      '- **Host limit**: the work the host cannot avoid for an example, timed alone in the same process right after',
      "  the pipeline's window, on the same records, one thread, per CPU-second: decoding the image (TensorFlow's",
      '  libjpeg-turbo, or PNG), or the frames a clip or a tracking pair takes, or tokenising a sentence pair with the',
      "  run's SentencePiece model from Python; the share is the pipeline's rate over it. The ImageNet and Kinetics",
      "  recipes' augmentation and their crops' resize run on the accelerator (`data.augment_on='device'`,",
      "  `data.canvas`): their host work beyond decoding is copying each crop's window into its canvas. The device's",
      '  cost of that resize: `python -m experiments.rehearsal.host_limit`. The finetune recipes resize on the host.',
      "  GOT-10k's pairs decode of each frame only the rows and columns their crop reads, at the DCT scale it",
      '  allows: less than the whole frames of the limit, hence a share over 100%. The CIFAR recipe caches its',
      '  images decoded (`data.cache`): after its first epoch it decodes none.',
      '',
      '## Host memory',
      '',
      '<!-- memory -->',
      *memory_lines(results),
      '<!-- /memory -->',
      '',
      'Peak resident memory (VmHWM) of two fresh processes drawing the same batches, one with a shuffle buffer of a',
      "few examples, one with the recipe's (which the pipeline caps at the stand-in's size); their difference over",
      "the difference in buffered examples is the bytes a buffered example costs (beside it the pipeline's own",
      "estimate, `pipeline.host_memory`: the records' bytes plus tf.data's cost per element, and the example's",
      "pixels decoded, which a buffer held before images and videos were shuffled encoded). At the recipe's scale:",
      'the peak here + (examples the recipe buffers − examples buffered here) × the larger of the two + '
      f'{PREFETCHED} prefetched',
      "batches of the recipe's batch less this one, for one process per node holding the whole global batch (an",
      "upper bound for a run over several nodes; a token budget's batches are the recipe's already). Examples",
      "buffered at the recipe's scale: min(buffer × bucket groups, the real training examples). A DGX H100 has",
      '2 TiB of host memory.',
      '',
    ]
  )


def write(results: dict, path: str, tiny: bool) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(os.path.splitext(path)[0] + '.json', 'w') as f:
    json.dump(results, f, indent=1, sort_keys=True)
  with open(path, 'w') as f:
    f.write(readme(results, tiny))


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m experiments.rehearsal.run', description=__doc__.splitlines()[0])
  parser.add_argument('--rows', help=f'comma-separated, of: {", ".join(BY_NAME)} (default: all)')
  parser.add_argument('--scratch', default='/tmp/rehearsal', help='where stand-ins and prepared data are kept')
  parser.add_argument(
    '--readme',
    help="where the table goes (default: this folder's README.md; with --tiny, a new path must be given): a file "
    'this script did not write (no .json beside it) is never overwritten',
  )
  parser.add_argument('--tiny', action='store_true', help='tiny stand-ins, 2 batches: a check that it runs')
  parser.add_argument('--probe', help=argparse.SUPPRESS)  # A row's probe process (run_probe).
  parser.add_argument('--stages', help=argparse.SUPPRESS)  # prepare, main, resume, small
  parser.add_argument('--buffer', type=int, help=argparse.SUPPRESS)  # data.shuffle_buffer of the probe
  parser.add_argument('--batches', type=int, help=argparse.SUPPRESS)  # Batches the small-buffer probe draws.
  args = parser.parse_args()
  args.scratch = os.path.abspath(args.scratch)
  if args.probe:
    try:
      out = probe(args)
    except Exception as e:
      text = str(e).strip().splitlines()
      out = {'error': f'{type(e).__name__}: {text[0] if text else ""}'[:300]}
    print(RESULT + json.dumps(out), flush=True)
    return
  if args.readme is None and args.tiny:
    raise SystemExit('--tiny: its numbers mean nothing, so it does not write the README: give --readme NEW_PATH')
  args.readme = args.readme or os.path.join(os.path.dirname(os.path.abspath(__file__)), 'README.md')
  if os.path.exists(args.readme) and not os.path.exists(os.path.splitext(args.readme)[0] + '.json'):
    raise SystemExit(f'--readme {args.readme}: the file exists and this script did not write it; give a new path')
  names = args.rows.split(',') if args.rows else list(BY_NAME)
  unknown = [n for n in names if n not in BY_NAME]
  if unknown:
    raise SystemExit(f'--rows: no row {", ".join(unknown)}; rows: {", ".join(BY_NAME)}')
  kept = os.path.splitext(args.readme)[0] + '.json'
  results = {}
  if os.path.exists(kept):
    with open(kept) as f:
      results = json.load(f)
  dirty = ' (uncommitted changes in vit_jax_lab/data)' if git('status', '--porcelain', 'vit_jax_lab/data') else ''
  stamp = dict(date=datetime.date.today().isoformat(), commit=git('log', '-1', '--format=%h'), dirty=dirty)
  for name in names:
    print(f'{name}: {BY_NAME[name].spec}', flush=True)
    results[name] = measure_row(BY_NAME[name], args) | stamp
    m = results[name]
    print(f'  {m["error"]}' if 'error' in m else f'  {json.dumps(derive(BY_NAME[name], m))}', flush=True)
    write(results, args.readme, args.tiny)
  print(f'wrote {args.readme}')


if __name__ == '__main__':
  main()
