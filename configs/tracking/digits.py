"""The tracking ViT (class and regression tokens, one stream) on the built-in tracking digits.

python -m main --config configs/tracking/digits.py --workdir runs/track
python -m main --config configs/tracking/digits.py:corner --workdir runs/track_corner

Argument: BOX_HEAD[,smoke]: 'mlp' (default) or 'corner' (model.box_head); `smoke` makes it tiny and a few steps
long, on `tracking_digits/tiny`, for tests. Training pairs: a 24 px template of the target alone (context factor
1) and a 48 px search crop at factor 2, so the target is 24 px, 3 x 3 patches, in both (as OSTrack's 128 px at 2
and 256 px at 4 keep it at 64 px), on 64 x 64 frames whose digits are 8-20 px; evaluation tracks the 60 test
sequences online from their first box.
"""

from vit_jax_lab import config as config_lib, models, tasks

BOX_HEADS = ('mlp', 'corner')


def get_config(arg: str | None = None):
  box_head, _, smoke = (arg or 'mlp').partition(',')
  if box_head not in BOX_HEADS or smoke not in ('', 'smoke'):
    raise config_lib.ConfigError(
      f'configs/tracking/digits.py takes BOX_HEAD[,smoke] with BOX_HEAD one of {", ".join(BOX_HEADS)}, got {arg!r}'
    )
  c = config_lib.base_config()
  # The runs behind each choice: the config search in experiments/tracking_digits/NOTES.md.
  c.model = models.config(
    'tracker',
    width=64,
    depth=4,
    mlp_dim=128,
    num_heads=4,
    patch_size=8,
    stem='conv',  # A digit at any offset in the patch grid gives alike tokens: the template stands out more.
    box_head=box_head,
    corner_margin=1,  # The corner maps reach past the crop, where centre jitter can put the target's edge.
    posemb_init='sincos2d_beside',  # From scratch, a random start leaves the regression token blind to position.
  )
  c.task = tasks.config(
    'tracking',
    size_rate=0.2,  # Box sizes move a fifth of the way to each prediction: chosen on train sequences, not test.
    motion_rate=1.0,  # Each search region a frame's velocity ahead of the previous box: fewer fast targets lost.
    velocity_smoothing=0.75,  # Targets move up to 3 px a frame; an average steadier than the last step alone.
    attention_weight=3.0 if box_head == 'mlp' else 0.0,  # The MLP token must find the target; corner maps read all.
  )
  c.data.name = 'tracking_digits'
  c.data.batch_size = 64
  c.data.eval_batch_size = 60
  c.data.search_factor = 2.0  # A small search region keeps most distractors, which the tracker jumps to, out of it.
  c.data.template_size, c.data.template_factor, c.data.search_size = 24, 1.0, 48  # 45 tokens: twice the steps/s of 80.
  c.data.centre_jitter = 1.5 if box_head == 'corner' else 1.0  # The corner head learns targets at the crop's edge.
  c.data.max_gap = 47  # Any two frames, as online tracking pairs the first frame with every later one.
  c.data.cache = True
  c.total_steps = 4000  # The table's 6 runs on 2 CPU cores: 40 minutes two at a time on a core each.
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 500
  c.optim.lr = 2e-3  # Above 1e-3 for both heads and two seeds.
  c.optim.weight_decay = 0.05
  c.optim.clip_norm = 1.0
  c.schedule.warmup_steps = 100

  if smoke:
    c.model.update(width=32, depth=1, mlp_dim=64, num_heads=2, corner_channels=16)
    c.data.name = 'tracking_digits/tiny'
    config_lib.smoke(c, batch_size=8, eval_batch_size=4)
  return c
