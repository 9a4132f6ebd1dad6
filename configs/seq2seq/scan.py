"""A Transformer on SCAN (Lake & Baroni 2018): navigation commands -> action sequences, built in (no network).

python -m main --config configs/seq2seq/scan.py:simple --workdir runs/scan_simple

Argument: SPLIT[,beam][,smoke]. SPLIT is `simple` (random 80/20) or `length` (train on action sequences of at
most 22 actions, test on longer ones). `beam` evaluates with beam search (beam 4) instead of greedy decoding;
`smoke` makes it tiny and a few steps long, for tests.
"""

from vit_jax_lab import config as config_lib, models, tasks


def get_config(arg: str | None = None):
  split, *flags = (arg or 'simple').split(',')
  if split not in ('simple', 'length') or not set(flags) <= {'beam', 'smoke'}:
    raise config_lib.ConfigError(
      f'configs/seq2seq/scan.py takes SPLIT[,beam][,smoke] with SPLIT simple or length, got {arg!r}'
    )
  c = config_lib.base_config()
  c.model = models.config(
    'transformer',
    variant=None,
    width=64,
    encoder_depth=2,
    decoder_depth=2,
    mlp_dim=256,
    num_heads=4,
    share_embeddings='decoder',
    dropout=0.0,
    prenorm=True,
    activation='relu',
  )
  c.task = tasks.config(
    'seq2seq',
    label_smoothing=0.0,
    eval_decode='beam' if 'beam' in flags else 'greedy',
    beam_size=4,
    alpha=0.6,
    headline='exact_match',  # SCAN's measure: a command's actions right or wrong.
  )
  c.data.name = f'scan/{split}'
  c.data.vocab = 'words'
  c.data.max_input_length = 20  # 2 commands of up to 9 words + EOS: two per packed row.
  c.data.max_target_length = 49  # 48 actions + EOS: every SCAN action sequence.
  c.data.pack_factor = 2  # 128 rows of ~2 pairs: half the padding of one pair per row.
  c.data.batch_size = 128
  c.data.eval_batch_size = 512
  c.data.cache = True
  c.total_steps = 1000
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 1000
  c.optim.lr = 2e-3
  c.optim.b2 = 0.98
  c.optim.weight_decay = 0.0
  c.schedule.warmup_steps = 100

  if 'smoke' in flags:
    c.model.update(width=32, encoder_depth=1, decoder_depth=1, mlp_dim=64, num_heads=2)
    c.data.train_split = 'train[:512]'
    c.data.eval_split = 'test[:100]'
    config_lib.smoke(c)
  return c
