"""Exports a run: its parameters in its family's release .npz layout (vit: vision_transformer's, readable by other
tools), a ViT run as a timm or Hugging Face transformers hub folder (config.json + model.safetensors), a ViViT run
as a transformers one, a seq2seq Transformer run as a transformers MarianMTModel folder (with its tokenizer), or a
TensorFlow SavedModel that serves it, the run's evaluation preprocessing inside.

python -m vit_jax_lab.tools.export --workdir runs/vit_digits --out runs/vit_digits/vit.npz
python -m vit_jax_lab.tools.export --format safetensors --layout timm --workdir runs/vit_digits --out vit_timm
python -m vit_jax_lab.tools.export --format safetensors --layout transformers --workdir runs/vit_digits --out vit_hf
python -m vit_jax_lab.tools.export --format safetensors --layout transformers --workdir runs/vivit --out vivit_hf
python -m vit_jax_lab.tools.export --format safetensors --layout transformers --workdir runs/wmt_base --out wmt_hf
python -m vit_jax_lab.tools.export --format saved_model --workdir runs/vit_digits --out runs/vit_digits/serving
python -m vit_jax_lab.tools.export --format saved_model --config configs/vit/finetune.py:imagenet2012,B/16 \
    --config.init_from=ViT-B_16-imagenet2012.npz --config.data.data_dir=/datasets/tfds --out serving

The SavedModel's `serving_default` signature takes uint8 `images` (batch, height, width, channels) of any size,
or `videos` (batch, frames, height, width, channels) of any length and size, and returns `probabilities` (batch,
classes), `class_index` (batch,) and `class_name` (batch,), the run's dataset's name of that class (the asset
assets/class_names.txt holds them, one a line in class order). Each example goes through the same tf preprocessing
function as the run's evaluation (resize, central crop, value range; a video's eval_clips x eval_crops views,
scored by their mean logits), then the model, lowered to StableHLO by jax2tf (native serialization) for
`--platforms`. A run that kept its dataset's image size (no data.image_size nor data.resize_size) is served with
inputs resized to it.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import os
import shutil
import sys
import tempfile
from typing import Callable, Iterator

import jax
import jax.extend as jex
import jax.numpy as jnp
import ml_collections
import numpy as np
import safetensors.numpy
from flax import nnx
from jax._src.export import _export
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func, stablehlo

from vit_jax_lab import checkpoints, console, errors, models, tasks, train
from vit_jax_lab.data import device, info
from vit_jax_lab.errors import ConfigError, check
from vit_jax_lab.models import marian_layout, timm_layout, transformers_layout
from vit_jax_lab.tools import common

# Loaded at their first use (console.lazy): they import TensorFlow, which --help and a mistake in the arguments
# need not wait for.
tf = console.lazy('tensorflow')
jax2tf = console.lazy('jax.experimental.jax2tf')
tf_stablehlo = console.lazy('tensorflow.compiler.mlir.stablehlo.stablehlo')

PLATFORMS = ('cpu', 'cuda', 'tpu')


def export(workdir: str, out: str) -> dict:
  """Exports the newest checkpoint of `workdir` to `out` in its family's release layout and returns the flat arrays
  written."""
  config = common.config_of(workdir, None, [])
  family = models.get(config.model.name)
  if family.RELEASE_LAYOUT is None:
    with_layout = [name for name, f in models.MODELS.items() if f.RELEASE_LAYOUT is not None]
    raise ConfigError(
      f'--workdir {workdir} holds a {config.model.name!r} model, which has no release layout (those of '
      f'{", ".join(with_layout)} have): export it with --format saved_model, or keep the run'
    )
  _check_checkpoint(workdir)
  flat = family.release_params(checkpoints.read_params(workdir), config.model)  # The run alone, not its data.
  with errors.output_errors(out):
    checkpoints.write_npz(out, flat)
  return flat


def _check_checkpoint(workdir: str) -> None:
  folder = os.path.join(workdir, 'checkpoints')
  check(
    os.path.isdir(folder) and any(d.isdigit() for d in os.listdir(folder)),
    f'--workdir {workdir} has no checkpoint yet: train it first (its command again resumes it), then export',
  )


def serving_config(config: ml_collections.ConfigDict, source: str) -> ml_collections.ConfigDict:
  """`config` for building the served model on one device; refuses what the SavedModel cannot serve."""
  predicts = tasks.get(config.task.name).predicts
  check(
    predicts == 'classes',
    f'{source} is a {config.task.name} run (model {config.model.name!r}), which predicts {predicts}: the SavedModel '
    'serves the classes of classification runs (vit, vivit); use --format npz for a vit, or use the run itself',
  )
  config = common.one_device_one_example(copy.deepcopy(config))
  if config.model.get('attention_impl') == 'cudnn':  # A kernel of NVIDIA GPUs only; XLA's is the same product.
    config.model.attention_impl = None
  return config


def saved_model(config: ml_collections.ConfigDict, params: dict | None, out: str, platforms: tuple[str, ...]) -> str:
  """Writes the SavedModel of `config`'s model with `params` (a pure dict; None: config.init_from's weights)
  to the folder `out`, and returns a line saying what its signature takes and returns."""
  s = train.setup(config, jax.devices()[:1])
  if params is None:
    state = train.init_state(s).params  # config.init_from loaded and adapted, with its notes printed.
  else:
    state = s.abstract_state.params
    state.replace_by_pure_dict(params)
  state = jax.device_get(state)
  paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  info, channels = s.info, s.info.input_shape[-1]

  data = copy.deepcopy(config.data)
  if data.image_size is None and data.resize_size is None:  # Evaluation kept the dataset's size: squash to it.
    data.image_size = info.input_shape[-3]
  preprocess = s.task.preprocess(data, info, train=False)  # The evaluation's own function.

  def one(raw: tf.Tensor) -> dict:
    blank = s.task.blank_targets(info)
    features = preprocess({info.input_key: raw} | blank, tf.zeros([2], tf.int64))
    return {k: v for k, v in features.items() if k not in blank}

  raw_shape = (None,) * (2 if info.input_key == 'image' else 3) + (channels,)
  traced = tf.function(one, autograph=False).get_concrete_function(tf.TensorSpec(raw_shape, tf.uint8))
  features_spec = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in traced.structured_outputs.items()}

  def scores(leaves, batch):
    params = train.in_compute_dtype(jax.tree.unflatten(treedef, leaves), config)
    model = nnx.merge(s.graphdef, params)
    logits = s.task.logits(model, train.in_compute_dtype(device.eval_inputs(batch, config.data), config))
    return jax.nn.softmax(logits), jnp.argmax(logits, -1).astype(jnp.int32)

  tf_scores = jax2tf.convert(
    scores,
    polymorphic_shapes=[None, '(b, ...)'],
    with_gradient=False,
    native_serialization_platforms=platforms,
  )
  module = tf.Module()
  module.params = [tf.Variable(np.asarray(leaf), trainable=False, name=_name(path)) for path, leaf in paths_leaves]
  name = f'{info.input_key}s'
  names_file = os.path.join(tempfile.mkdtemp(), CLASS_NAMES)
  with open(names_file, 'w') as f:
    f.write(''.join(n + '\n' for n in common.class_names(s.builder, info.num_classes)))
  module.class_names = tf.saved_model.Asset(names_file)  # Copied into the SavedModel's assets/.
  module.names = tf.lookup.StaticHashTable(
    tf.lookup.TextFileInitializer(
      module.class_names, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE
    ),
    default_value='',
  )

  @tf.function(input_signature=[tf.TensorSpec((None, *raw_shape), tf.uint8, name=name)], autograph=False)
  def serve(inputs):
    batch = tf.map_fn(one, inputs, fn_output_signature=features_spec)
    probabilities, class_index = tf_scores(module.params, batch)
    class_name = module.names.lookup(tf.cast(class_index, tf.int64))
    return {'probabilities': probabilities, 'class_index': class_index, 'class_name': class_name}

  module.serve = serve
  partial = f'{out.rstrip(os.sep)}.partial'
  if os.path.exists(partial):  # Left by an export that was killed.
    shutil.rmtree(partial)
  try:
    with errors.output_errors(out), _for_tensorflow():  # jax2tf lowers the model while `serve` is traced, in save.
      tf.saved_model.save(module, partial, signatures={'serving_default': serve})
      os.rename(partial, out)  # All or nothing: a failed export leaves no --out behind.
  finally:
    shutil.rmtree(os.path.dirname(names_file))
    shutil.rmtree(partial, ignore_errors=True)
  axes = 'height, width' if info.input_key == 'image' else 'frames, height, width'
  size = 'size' if info.input_key == 'image' else 'length and size'
  return (
    f'uint8 {name} (batch, {axes}, {channels}) of any {size} -> probabilities (batch, {info.num_classes}), '
    f'class_index (batch,), class_name (batch,); for {", ".join(platforms)}'
  )


CLASS_NAMES = 'class_names.txt'


def private_bytecode_writer() -> Callable[[ir.Module], bytes]:
  """jax's private `_export._module_to_bytecode(module) -> bytes`, which _for_tensorflow replaces for the time of a
  SavedModel export; a jax that renamed it or changed its arguments is one line, not a wrong or failed export."""
  writer = getattr(_export, '_module_to_bytecode', None)
  check(
    writer is not None and list(inspect.signature(writer).parameters) == ['module'],
    f'--format saved_model: jax {jax.__version__} no longer has the private jax._src.export._export.'
    '_module_to_bytecode(module) this export replaces: install the jax of requirements.txt, or export --format npz',
  )
  return writer


@contextlib.contextmanager
def _for_tensorflow() -> Iterator[None]:
  """While in it, jax serializes StableHLO that the installed TensorFlow runs for any batch size. Two steps for
  jax 0.10 and TensorFlow 2.21: jax writes for readers at most 4 weeks older than itself (StableHLO 1.15), which
  TensorFlow (1.13.7) cannot read, so the older version of the two is written; and jax writes CHLO ops (the exact
  GELU's erf) as composites, whose bodies TensorFlow 2.21 leaves with the batch dimension unknown ("Module has
  dynamic shapes"), so each composite becomes a call of its body (the same ops), which TensorFlow specialises.
  jax.export has no option for either: its private bytecode writer is replaced for the time of the export."""
  original = private_bytecode_writer()
  newest = stablehlo.get_version_from_compatibility_requirement(stablehlo.StablehloCompatibilityRequirement.WEEK_4)
  target = stablehlo.get_smaller_version(newest, tf_stablehlo.get_current_version())

  def to_bytecode(module):
    mixed = jex.backend.get_backend().serialize_with_sdy
    with module.context:
      portable = jex.mlir.deserialize_portable_artifact(jex.mlir.serialize_portable_artifact(module, target, mixed))
      _composites_to_calls(portable)
      return jex.mlir.serialize_portable_artifact(portable, target, mixed)

  _export._module_to_bytecode = to_bytecode
  try:
    yield
  finally:
    _export._module_to_bytecode = original


def _composites_to_calls(module) -> None:
  """Replaces each stablehlo.composite op of the MLIR `module` by a func.call of its decomposition."""
  composites = []

  def collect(op):
    if op.name == 'stablehlo.composite':
      composites.append(op)
    return ir.WalkResult.ADVANCE

  module.operation.walk(collect)
  for op in composites:
    with ir.InsertionPoint(op), op.location:
      callee = ir.FlatSymbolRefAttr(op.attributes['decomposition']).value
      call = func.CallOp([r.type for r in op.results], callee, list(op.operands))
    for old, new in zip(op.results, call.results):
      old.replace_all_uses_with(new)
    op.erase()


def _name(path) -> str:
  """A parameter's tf.Variable name: its path in the model, e.g. encoder/blocks/0/attn/out/kernel."""
  keys = [str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))) for k in path]
  return '/'.join(k for k in keys if k != 'value')


def write_folder(
  out: str, files: dict[str, dict], tensors: dict[str, np.ndarray], copies: dict[str, str] | None = None
) -> dict:
  """Writes a hub folder (a layout module's `folder`): JSON `files`, model.safetensors of `tensors`, and `copies`
  (name -> file), beside `out` and renamed into place whole, so a failed export leaves no --out behind; returns
  its config.json's content."""
  partial = f'{out.rstrip(os.sep)}.partial-{os.getpid()}'
  try:
    with errors.output_errors(out):
      os.makedirs(partial)
      for name, content in files.items():
        with open(os.path.join(partial, name), 'w') as f:
          json.dump(content, f, indent=2)
      safetensors.numpy.save_file(tensors, os.path.join(partial, 'model.safetensors'), metadata={'format': 'pt'})
      for name, path in (copies or {}).items():
        shutil.copyfile(path, os.path.join(partial, name))
      os.rename(partial, out)
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  return files['config.json']


def _with_model(folder: Callable[..., tuple[dict, dict]]) -> Callable[..., dict]:
  """A layout module's `folder(model, params, data_config, labels)` as a writer of runs: the run's model (built
  abstractly from its config and dataset) and class names."""

  def run(config: ml_collections.ConfigDict, params: dict, out: str, workdir: str) -> dict:
    with contextlib.redirect_stdout(sys.stderr):
      s = train.setup(common.one_device_one_example(config), jax.devices()[:1])
    model = nnx.eval_shape(lambda: train.build_model(s.config, s.task, s.info, jax.random.key(0)))
    labels = common.class_names(s.builder, model.head.out_features)
    return write_folder(out, *folder(model, params, config.data, labels))

  return run


def _marian_run(config: ml_collections.ConfigDict, params: dict, out: str, workdir: str) -> dict:
  """A translation run's writer (marian_layout.folder): its config, parameters and vocabulary (the workdir's
  SentencePiece model, or data.vocab's Marian folder, which data.info reads); no dataset. Notes go to stderr."""

  def build(vocab_size: int) -> nnx.Module:
    kwargs = dict(vocab_size=vocab_size, input_vocab_size=vocab_size, input_shape=None, max_len=1)
    return nnx.eval_shape(lambda: models.build(config.model, nnx.Rngs(0), **kwargs))

  def marian_vocab(vocab: str) -> info.MarianVocab | None:
    return info.MarianVocab(vocab) if info.is_marian_folder(vocab) else None

  files, tensors, copies, notes = marian_layout.folder(params, config.model, config.data, workdir, build, marian_vocab)
  written = write_folder(out, files, tensors, copies)
  for note in notes:
    print(f'--out {out}: {note}', file=sys.stderr)
  return written


# --layout -> the layout modules that write it, each of the model families its EXPORTS names.
HUB_LAYOUTS = {'timm': (timm_layout,), 'transformers': (transformers_layout, marian_layout)}
# How a run reaches a layout module's `folder`: a translation run's from its vocabulary (marian_layout's), any other
# run's with its model built on its dataset and its class names.
_RUNS = {marian_layout: _marian_run}
# layout -> model family (config.model.name) -> the writer of its runs: (config, params, out, workdir) -> config.
WRITERS = {
  layout: {family: _RUNS.get(module) or _with_model(module.folder) for module in modules for family in module.EXPORTS}
  for layout, modules in HUB_LAYOUTS.items()
}


def export_hub(workdir: str, out: str, layout: str) -> dict:
  """The newest checkpoint of the run `workdir` as a hub folder `out` of `layout` (WRITERS: its family's writer)."""
  common.check_new(out)
  config = common.config_of(workdir, None, [])
  writers = WRITERS[layout]
  check(
    config.model.name in writers,
    f'--workdir {workdir} holds a {config.model.name!r} model: --layout {layout} writes {" and ".join(writers)} runs',
  )
  _check_checkpoint(workdir)
  return writers[config.model.name](config, checkpoints.read_params(workdir), out, workdir)


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.export', description=__doc__.split('\n\n')[0])
  parser.add_argument(
    '--format',
    choices=('npz', 'saved_model', 'safetensors'),
    default='npz',
    help="npz: the parameters in the family's release layout (vision_transformer's for a vit); saved_model: a "
    'TensorFlow SavedModel serving images or clips to class scores; safetensors: a timm or transformers folder '
    '(--layout)',
  )
  parser.add_argument('--layout', choices=tuple(WRITERS), help='safetensors: the hub layout written')
  parser.add_argument('--workdir', help='a run: its config.json and newest checkpoint (its parameter average)')
  parser.add_argument('--config', help='saved_model: a config file with --config.init_from=x.npz, not --workdir')
  parser.add_argument(
    '--out', required=True, help='the .npz file, the SavedModel or safetensors folder (must not exist)'
  )
  parser.add_argument(
    '--platforms', default=','.join(PLATFORMS), help=f'saved_model: where it runs, of {", ".join(PLATFORMS)}'
  )
  args, overrides = parser.parse_known_args(argv)
  if args.format == 'safetensors':
    if args.config is not None or overrides or args.workdir is None or args.layout is None:
      raise ConfigError(
        '--format safetensors exports a ViT, ViViT or seq2seq Transformer run: give --layout timm (ViT) or --layout '
        'transformers (ViT, ViViT, Transformer as MarianMTModel), --workdir and --out only'
      )
    config = export_hub(args.workdir, args.out, args.layout)
    kind = config['architecture'] if args.layout == 'timm' else config['architectures'][0]
    print(f'wrote a {args.layout} folder ({kind}) to {args.out}')
    return 0
  if args.format == 'npz':
    common.check_new(args.out)
    if args.config is not None or overrides or args.workdir is None:
      raise ConfigError('--format npz exports a run: give --workdir and --out only')
    flat = export(args.workdir, args.out)
    print(f'wrote {len(flat)} arrays, {sum(v.size for v in flat.values()):,} parameters, to {args.out}')
    return 0

  platforms = tuple(p.strip() for p in args.platforms.split(',') if p.strip())
  check(
    platforms and set(platforms) <= set(PLATFORMS),
    f'--platforms={args.platforms!r}: give a comma-separated list of {", ".join(PLATFORMS)}',
  )
  common.check_new(args.out)
  check(
    args.workdir is None or not overrides,
    f'unknown arguments {" ".join(overrides)}: --config.KEY=VALUE goes with --config',
  )
  config = common.config_of(args.workdir, args.config, overrides)
  if args.workdir is not None:
    config = serving_config(config, f'--workdir {args.workdir}')
    _check_checkpoint(args.workdir)
    params = checkpoints.read_params(args.workdir)
  else:
    config = serving_config(config, f'--config {args.config}')
    check(
      config.init_from is not None,
      f'--config {args.config} without --config.init_from would export untrained weights: set it to a .npz or a run',
    )
    params = None
  signature = saved_model(config, params, args.out, platforms)
  print(f'wrote a SavedModel to {args.out}: {signature}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
