"""Long Range Arena's ListOps (Tay et al. 2021) on the built-in generator: a Transformer encoder classifies the
value (0-9) of a nested MAX / MIN / MED / SM expression; evaluated on the test split.

python -m main --config configs/lra/listops.py --workdir runs/listops              # full attention
python -m main --config configs/lra/listops.py:local --workdir runs/listops_local  # another attention pattern

Argument: [KIND][,smoke]. KIND is model.attention: full (the default), local, sparse or linear. `smoke` makes it
a tiny model on listops/tiny for a few steps, for tests.

Sized for a 2-core CPU: one run of full attention takes about 4.5 minutes, so that 4 patterns x 3 seeds fit in an
hour (experiments/lra_listops). Against LRA's ListOps setup (base_listops_config: sequences of 500-2,000 tokens,
6 layers of width 512, MLP 2,048, 8 heads, batch 32, 5,000 steps, lr 0.05 with rsqrt decay): sequences of 64-256
tokens (listops/len256), a model of width 64 with 4 layers (variant 'small'), 1,000 steps of batch 32 at lr 1e-3.
"""

from vit_jax_lab import config as config_lib, models, tasks

KINDS = ('full', 'local', 'sparse', 'linear')


def get_config(arg: str | None = None):
  kind, *flags = (arg or 'full').split(',')
  if kind == 'smoke' and not flags:
    kind, flags = 'full', ['smoke']
  if kind not in KINDS or not set(flags) <= {'smoke'}:
    raise config_lib.ConfigError(
      f'configs/lra/listops.py takes [KIND][,smoke] with KIND one of {", ".join(KINDS)}, got {arg!r}'
    )
  c = config_lib.base_config()
  c.model = models.config('text_classifier', variant='small', pool='tok', posemb='learn', attention=kind)
  c.task = tasks.config('classification')
  c.data.name = 'listops/len256'
  c.data.max_input_length = 256  # The longest sequence of listops/len256.
  c.data.eval_split = 'test'  # LRA reports test accuracy; validation is there for tuning.
  c.data.batch_size = 32  # LRA's.
  c.data.eval_batch_size = 400
  c.data.shuffle_buffer = 10_000  # A run reads a third of the 96,000 training examples.
  c.total_steps = 1000
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 1000
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.1  # LRA's.
  c.schedule.warmup_steps = 100

  if 'smoke' in flags:
    c.model.variant = 'tiny'
    c.data.name = 'listops/tiny'
    c.data.max_input_length = 48
    config_lib.smoke(c, steps=4, warmup=1, batch_size=32, eval_batch_size=64)
    c.mesh.fsdp_min_size = 256
  return c
