"""Writes the WMT14 English-German recipes beside the Transformer paper's, value by value, into
experiments/wmt14_ende/README.md.

python -m experiments.wmt14_ende.recipes
Read from configs/seq2seq/wmt14_ende.py, so the table shows what the config sets; nothing is trained.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.wmt14_ende.recipes')

import os

from experiments import common
from vit_jax_lab import config as config_lib

PAPER = 'Vaswani et al. 2017'


def config(size: str):
  return config_lib.load(os.path.join(common.ROOT, f'configs/seq2seq/wmt14_ende.py:{size}'))


def recipe_rows() -> list[tuple[str, str, str, str]]:
  base, big = config('base'), config('big')
  m, t, d, o = base.model, base.task, base.data, base.optim
  norm, positions = 'pre' if m.prenorm else 'post', {'sincos': 'sinusoidal'}.get(m.posemb, m.posemb)
  act = {'relu': 'ReLU'}.get(m.activation, m.activation)
  budget = f'~{d.token_budget / 1000:g}k source + {d.token_budget / 1000:g}k target tokens, by length'
  return [
    ('model', 'post-norm, sinusoidal positions, ReLU', f'{PAPER} §3', f'{norm}-norm, {positions} positions, {act}'),
    (
      'shared embeddings',
      'source, target and softmax',
      f'{PAPER} §3.4',
      'source, target and softmax' if m.share_embeddings == 'all' else m.share_embeddings,
    ),
    ('vocabulary', 'shared BPE, 37k', f'{PAPER} §5.1', f'shared SentencePiece, {d.vocab_size // 1000}k'),
    (
      'batches',
      '~25k source + 25k target tokens, by length',
      f'{PAPER} §5.1',
      budget if d.token_budget else f'{d.batch_size} rows, packing x{d.pack_factor}',
    ),
    (
      'optimizer',
      'Adam 0.9, 0.98, 1e-9',
      f'{PAPER} §5.3',
      f'Adam {o.b1:g}, {o.b2:g}, {o.eps:.0e}'.replace('e-0', 'e-'),
    ),
    (
      'learning rate',
      'd^-0.5 min(s^-0.5, s 4000^-1.5)',
      f'{PAPER} §5.3',
      'd^-0.5 min(s^-0.5, s 4000^-1.5)'
      if (
        base.schedule.decay,
        base.schedule.warmup_steps,
        base.schedule.rsqrt_timescale,
        round(o.lr * 512**0.5 * 4000**0.5, 6),
      )
      == ('rsqrt', 4000, 4000, 1.0)
      else 'other',
    ),
    ('dropout: base / big', '0.1 / 0.3', f'{PAPER} §5.4, Table 3', f'{m.dropout:g} / {big.model.dropout:g}'),
    ('label smoothing', '0.1', f'{PAPER} §5.4', f'{t.label_smoothing:g}'),
    ('steps: base / big', '100k / 300k', f'{PAPER} §5.2', f'{base.total_steps // 1000}k / {big.total_steps // 1000}k'),
    ('decoding', 'beam 4, alpha 0.6', f'{PAPER} §6.1', f'{t.eval_decode} {t.beam_size}, alpha {t.alpha:g}'),
    (
      'checkpoints averaged: base / big',
      'last 5 / last 20, every 1,500 / 600 steps',
      f'{PAPER} §6.1 (10 min apart), §5.2 (0.4 / 1.0 s a step)',
      f'last 5 / last 20, every {base.checkpoint_every:,} / {big.checkpoint_every:,} steps',
    ),
    (
      'metric',
      'tokenised, compound-split BLEU',
      "tensor2tensor's `get_ende_bleu.sh`",
      'tokenised, compound-split BLEU' if t.tokenized_bleu == 'de' else 'sacreBLEU only',
    ),
    ('test set', 'newstest2014', f'{PAPER} §6.1', 'newstest2014' if d.eval_split == 'test' else d.eval_split),
  ]


# Where the recipe differs on purpose.
DIFFERENCES = {
  'vocabulary': "a SentencePiece unigram vocabulary trained on the training text (tensor2tensor, the paper's code, "
  'used a 32k word-piece one too)',
}


if __name__ == '__main__':
  common.write_table(__file__, common.recipe_lines(recipe_rows()), marker='recipe')
