"""Image captioning on the built-in digit scenes: a ViT encoder reads 1-3 handwritten digits side by side and
the Transformer decoder writes their names ("seven one four"). The decoder is the translation model's.

python -m main --config configs/seq2seq/digit_captions.py --workdir runs/digit_captions

Argument: [smoke] makes it tiny and a few steps long, for tests.
"""

from vit_jax_lab import config as config_lib, models, tasks


def get_config(arg: str | None = None):
  if arg not in (None, 'smoke'):
    raise config_lib.ConfigError(f'configs/seq2seq/digit_captions.py takes no argument or smoke, got {arg!r}')
  c = config_lib.base_config()
  c.model = models.config(
    'transformer',
    variant=None,
    width=64,
    encoder_depth=2,
    decoder_depth=2,
    mlp_dim=128,
    num_heads=4,
    patch_size=4,
    share_embeddings='decoder',
    dropout=0.0,
    prenorm=True,
    activation='gelu',
  )
  c.task = tasks.config('seq2seq', label_smoothing=0.0, eval_decode='greedy', headline='cider_d')
  c.data.name = 'digit_scenes'
  c.data.vocab = 'words'
  c.data.max_target_length = 4  # Up to 3 words + EOS.
  c.data.batch_size = 64
  c.data.eval_batch_size = 500
  c.data.cache = True
  c.total_steps = 1500
  c.log_every = 100
  c.eval_every = 500
  c.checkpoint_every = 1500
  c.optim.lr = 1e-3
  c.optim.weight_decay = 1e-4
  c.schedule.warmup_steps = 100

  if arg == 'smoke':
    c.model.update(width=32, encoder_depth=1, decoder_depth=1, mlp_dim=64, num_heads=2)
    c.data.train_split = 'train[:256]'
    c.data.eval_split = 'test[:100]'
    config_lib.smoke(c)
  return c
