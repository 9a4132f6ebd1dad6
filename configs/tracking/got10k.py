"""The tracking ViT on GOT-10k's one-shot protocol (train on GOT-10k train only, track GOT-10k val online), in
OSTrack-256's one-stream setting: ViT-B/16 over a 128 px template at context factor 2 and a 256 px search crop at
factor 4, the corner head, from an ImageNet ViT-B/16.

python -m main --config configs/tracking/got10k.py --workdir runs/got10k --config.data.data_dir=/datasets/tfds
python -m vit_jax_lab.tools.evaluate --config configs/tracking/got10k.py:otb100 --config.init_from=runs/got10k \
    --config.data.data_dir=/datasets/tfds       # the GOT-10k-trained run on OTB100 (or uav123, lasot)

Argument: [BENCHMARK][,smoke]. BENCHMARK (default got10k) is the data evaluated: got10k (its val split), or
otb100, uav123, lasot (their test split, for tools.evaluate: no training on them). The benchmarks are read from
data.data_dir/downloads/manual/ in their published layouts (vit_jax_lab/data/builders/tracking_benchmarks.py).
`smoke` makes the model tiny and the run a few steps, for tests on small folders in those layouts.
"""

from vit_jax_lab import config as config_lib, models, tasks

BENCHMARKS = ('got10k', 'otb100', 'uav123', 'lasot')
# OSTrack-256 (Ye et al. 2022, Table 1), by (benchmark, split): GOT-10k test AO (the server's) trained on GOT-10k
# train only; LaSOT AUC trained on LaSOT + GOT-10k + COCO + TrackingNet.
PUBLISHED = {('got10k', 'test'): ('AO', 71.0), ('lasot', 'test'): ('success AUC', 69.1)}


def get_config(arg: str | None = None):
  benchmark, _, smoke = (arg or 'got10k').partition(',')
  if benchmark not in BENCHMARKS or smoke not in ('', 'smoke'):
    raise config_lib.ConfigError(
      f'configs/tracking/got10k.py takes [BENCHMARK][,smoke] with BENCHMARK one of {", ".join(BENCHMARKS)}, got {arg!r}'
    )
  c = config_lib.base_config()
  c.model = models.config(
    'tracker', variant='B/16', box_head='corner', corner_channels=256, corner_margin=1, drop_path=0.1
  )
  c.task = tasks.config('tracking')
  c.init_from = 'pretrained/imagenet21k/ViT-B_16.npz'  # A release; tools.evaluate gives a tracker run instead.
  c.data.name = f'tracking_benchmarks/{benchmark}'
  c.data.train_split = 'train' if benchmark == 'got10k' else 'test'
  c.data.eval_split = 'val' if benchmark == 'got10k' else 'test'
  c.data.template_size, c.data.search_size = 128, 256
  c.data.template_factor, c.data.search_factor = 2.0, 4.0
  c.data.centre_jitter, c.data.size_jitter = 3.0, 0.25
  c.data.max_gap = 200  # OSTrack's largest template-search gap in frames.
  c.data.negative_fraction = 0.1
  c.data.value_range = (-1.0, 1.0)  # The ImageNet ViT releases' input range.
  c.data.batch_size = 128
  c.data.shuffle_buffer = 256  # Examples are whole sequences: a small buffer of them.
  c.compute_dtype = 'bfloat16'
  # GOT-10k's protocol in OSTrack: 100 epochs of 60,000 pairs at batch 128.
  c.total_steps = 47_000
  c.log_every = 100
  c.eval_every = 5_000
  c.checkpoint_every = 1_000
  c.optim.lr = 4e-4
  c.optim.weight_decay = 1e-4
  c.optim.clip_norm = 0.1
  c.schedule.warmup_steps = 1_000

  if smoke:
    c.model.update(variant=None, patch_size=8, width=32, depth=1, mlp_dim=64, num_heads=2, corner_channels=16)
    c.data.template_size, c.data.search_size, c.data.max_gap = 16, 32, 5
    c.compute_dtype, c.init_from = 'float32', None
    config_lib.smoke(c, batch_size=8, eval_batch_size=8)
  return c
