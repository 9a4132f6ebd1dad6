"""Every config in configs/, with each choice of its argument, builds, takes a training step and evaluates a batch
through its own input pipeline: the recipe's input settings as they are (augmentation, resolution, frames, clips and
crops, packing, token budget, shuffle buffers), a tiny model, small batches, one step, on a small stand-in of its real
data (experiments/rehearsal/standins.py, or the built-in dataset's small config). What a cluster run of a recipe
would meet first (a pipeline that does not build, shapes that do not agree) shows here in seconds."""

import glob
import math
import os

import jax
import numpy as np
import pytest

from conftest import ROOT, load_config
from experiments.rehearsal import standins
from vit_jax_lab import train
from vit_jax_lab.data import builders, device_canvas, pipeline

# The arguments tried, each choice of each part of a config's :ARG at least once (None: no argument); AugReg's levels
# are paired with variants so that two of a mixup strength and patch size share their compiled step. A config not
# listed is tried without one, so a new config that cannot build fails here until it is listed with its arguments.
ARGS = {
  'configs/lra/listops.py': (None, 'local', 'linear', 'sparse,smoke'),
  'configs/seq2seq/digit_captions.py': (None, 'smoke'),
  'configs/seq2seq/scan.py': (None, 'length,beam,smoke'),
  'configs/seq2seq/wmt14_ende.py': (None, 'big'),
  'configs/tracking/digits.py': (None, 'corner,smoke'),
  'configs/tracking/got10k.py': (None, 'otb100', 'uav123', 'lasot,smoke'),
  'configs/vit/digits.py': (None, 'smoke'),
  'configs/vit/finetune.py': (None, 'cifar100,L/16,500', 'imagenet2012,H/14,paper'),
  'configs/vit/folder.py': ('{imagenet}',),  # A folder of photos: the stand-in's, filled in by `small`.
  'configs/vit/imagenet_augreg.py': (
    'Ti/16',
    'S/32,none',
    'S/16,light2',
    'B/16,medium1',
    'B/16,medium2,reg',
    'L/16,strong1,reg',
    'B/32,strong2,reg',
  ),
  'configs/vit/imagenet_deit.py': ('Ti', 'S', 'B'),
  'configs/vivit/kinetics400.py': (None, 'spatiotemporal'),
  'configs/vivit/moving_digits.py': (
    None,
    'factorised_encoder',
    'factorised_self_attention',
    'factorised_dot_product,smoke',
    'single_frame',
  ),
}
# Beside the tiny sizes, larger patches where the config's would make thousands of tokens: 96 eval views (8 videos x
# 4 clips x 3 crops) of full attention over ViViT-B/16x2's 3,136 tokens took a minute, 64 images of 1,369 at 518 px
# eight seconds a step, on two CPU cores.
MODEL = {
  'configs/vivit/kinetics400.py': dict(patch_size=32, tubelet_time=4),
  'configs/vit/finetune.py:imagenet2012,H/14,paper': dict(patch_size=37),
}
CONFIGS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'configs', '*', '*.py')))
SPECS = [f'{path}:{arg}' if arg else path for path in CONFIGS for arg in ARGS.get(path, (None,))]

# data.name of a recipe -> (stand-in, its eval split): folders of files, read as data.name=folder:PATH.
FOLDERS = {
  'imagenet2012': ('imagenet', 'val'),
  'cifar10': ('cifar10', 'test'),
  'cifar100': ('cifar100', 'test'),
  'kinetics400': ('kinetics', 'val'),
  'wmt14_translate/de-en': ('wmt', 'test'),
}
MAKERS = {  # Each as small as one batch needs, at the real data's sizes and formats.
  'imagenet': lambda root: standins.imagenet_like(root, train_per_class=4, test_per_class=2, classes=2),
  'cifar10': lambda root: standins.cifar_like(root, train_per_class=2, test_per_class=1, classes=10),
  'cifar100': lambda root: standins.cifar_like(root, train_per_class=1, test_per_class=1, classes=100),
  'kinetics': lambda root: standins.kinetics_like(root, train_per_class=2, test_per_class=1, classes=2, seconds=2.6),
  'wmt': lambda root: standins.wmt_like(root, train_pairs=300, test_pairs=8),
  'got10k': lambda root: standins.got10k_like(root, sequences=2, frames=6),
  'otb100': lambda root: standins.otb100_like(root, sequences=2, frames=6),
  'uav123': lambda root: standins.uav123_like(root, sequences=2, frames=6),
  'lasot': lambda root: standins.lasot_like(root, sequences=2, frames=6),
}
# Built-in datasets whose full build takes long -> their small config, of the same examples' shapes.
SMALL_BUILTIN = {'listops/len256': 'listops/tiny', 'tracking_digits': 'tracking_digits/tiny'}
TINY_MODEL = dict(
  width=32, depth=1, encoder_depth=1, decoder_depth=1, temporal_depth=1, mlp_dim=64, num_heads=2, corner_channels=16
)
TRAIN_EXAMPLES = 512  # Read at most (of the built-in datasets: their caches and word vocabularies in seconds).
VOCAB_SIZE = 256  # A trained SentencePiece vocabulary's pieces: the embedding and logits are the model's size.


class StandIns:
  """The stand-ins of this process, each made at its first use: folders (and the data_dir they are prepared in),
  the tracking benchmarks' data_dir, and the built-in datasets' data_dir."""

  def __init__(self, tmp_path_factory, request):
    self.factory, self.request, self.made = tmp_path_factory, request, {}
    self.prepared = str(tmp_path_factory.mktemp('prepared'))
    self.tracking = str(tmp_path_factory.mktemp('tracking'))

  def get(self, kind: str) -> str:
    if kind not in self.made:
      root = self.tracking if kind in ('got10k', 'otb100', 'uav123', 'lasot') else str(self.factory.mktemp(kind))
      self.made[kind] = MAKERS[kind](root)
    return self.made[kind]

  def builtin_dir(self) -> str:
    return self.request.getfixturevalue('data_dir')


@pytest.fixture(scope='session')
def stand_ins(tmp_path_factory, request) -> StandIns:
  return StandIns(tmp_path_factory, request)


def small(spec: str, stand_ins: StandIns):
  """The config of `spec` on its stand-in data, with a tiny model, batches of one example per device (times
  accum_steps and repeated_augment), one step, and an eval split of at most one batch; its input settings unchanged."""
  path, _, arg = spec.partition(':')
  if arg.startswith('{'):  # A stand-in's folder as the argument.
    spec = f'{path}:{stand_ins.get(arg.strip("{}"))}'
  config = load_config(spec, None)
  model, data = config.model, config.data
  for key, value in TINY_MODEL.items():
    if key in model:
      model[key] = value
  model.update(MODEL.get(spec, MODEL.get(spec.partition(':')[0], {})))
  if model.get('representation_size'):
    model.representation_size = TINY_MODEL['width']
  if config.init_from is not None and not os.path.exists(config.init_from):
    config.init_from = None  # A release file that is not here.
  shards = jax.device_count()
  data.batch_size = math.lcm(shards * config.accum_steps, data.repeated_augment)
  data.eval_batch_size = shards
  data.vocab_size = VOCAB_SIZE
  config.total_steps = config.log_every = config.eval_every = config.checkpoint_every = 1
  config.schedule.warmup_steps = min(config.schedule.warmup_steps, 1)
  if data.name in FOLDERS:
    kind, data.eval_split = FOLDERS[data.name]
    data.name, data.data_dir = f'folder:{stand_ins.get(kind)}', stand_ins.prepared
    data.source = data.target = None  # A folder of text pairs names its features source and target.
  elif data.name.startswith('folder:'):
    data.data_dir = stand_ins.prepared
  elif data.name.startswith('tracking_benchmarks/'):
    data.data_dir = stand_ins.get(data.name.partition('/')[2])
  else:
    assert builders.is_builtin(data.name), f'no stand-in for data.name={data.name!r} of {spec}: add one here'
    data.name, data.data_dir = SMALL_BUILTIN.get(data.name, data.name), stand_ins.builtin_dir()
  builder, _ = pipeline.load(data, lambda builder, data: None)  # Prepared once, as setup will find it.
  for key, count in (('train_split', TRAIN_EXAMPLES), ('eval_split', data.eval_batch_size)):
    if builder.info.splits[data[key]].num_examples > count:
      data[key] = f'{data[key].partition("[")[0]}[:{count}]'
  return config


def assert_input_shapes(batch: dict, d) -> None:
  """Images, clips and tracking crops are of the sizes and frame counts the config's input settings give (training
  crops the jitted step resizes: of their canvas)."""
  pixels = batch.get('inputs')
  if pixels is not None and pixels.dtype == np.uint8 and d.image_size is not None:
    frames = (d.num_frames,) if pixels.ndim == 5 else ()
    side = (d.image_size, d.image_size)
    assert pixels.shape[1:-1] == (*frames, *(device_canvas(d, *side, True) if 'resize' in batch else side))
  for key, side in (('template', d.template_size), ('search', d.search_size)):
    if key in batch:
      assert batch[key].shape[1:3] == (side, side)


@pytest.mark.parametrize('spec', SPECS)
def test_config_builds_steps_and_evaluates_on_its_pipeline(spec, stand_ins, tmp_path):
  s = train.setup(small(spec, stand_ins), workdir=str(tmp_path))
  state = train.init_state(s)
  batches = train.train_batches(s)
  batch = next(batches)
  batches.close()  # Its prefetching would go on reading.
  assert_input_shapes(batch, s.config.data)
  state, metrics = train.make_train_step(s)(state, batch)
  assert np.isfinite(float(metrics['loss'])), spec
  scores = train.evaluate(s, train.make_eval_step(s), state.eval_params())
  assert scores and all(np.isfinite(v) for v in scores.values()), scores


def test_every_listed_config_exists():
  assert set(ARGS) <= set(CONFIGS)
