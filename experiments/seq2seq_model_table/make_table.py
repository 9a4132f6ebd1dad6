"""Renders the Transformer parameter table into experiments/seq2seq_model_table/README.md.

python experiments/seq2seq_model_table/make_table.py
Transformer base and big with a shared 37,000-token vocabulary, counted from abstract shapes in seconds.
"""

import os
import sys

from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from vit_jax_lab import cost, reporting  # noqa: E402
from vit_jax_lab.models import seq2seq  # noqa: E402

VOCAB = 37_000
PUBLISHED = {'base': (65, 27.3), 'big': (213, 28.4)}  # Vaswani et al. 2017, Table 3: params (M), EN-DE BLEU.


def count(variant: str, **options) -> int:
  model = nnx.eval_shape(lambda: seq2seq.Transformer(VOCAB, VOCAB, None, 256, variant=variant, rngs=nnx.Rngs(0),
                                                     **options))
  return cost.param_count(nnx.state(model, nnx.Param))


def main() -> None:
  lines = [
      '# Transformer parameter counts', '',
      'Vaswani et al. 2017, Table 3, with a shared source/target vocabulary of 37,000 tokens (the paper\'s BPE',
      'size for WMT14 EN-DE). The exact counts include a bias on every dense layer (attention projections and',
      'MLP), LayerNorm scales and biases, and one embedding matrix shared by the encoder input, the decoder input',
      'and the output projection (no output bias). Post-norm, as the paper, has no final LayerNorms; pre-norm',
      'adds one per stack. Sin-cos position embeddings have no parameters. The paper rounds and does not say',
      'what it counts; "within 5%" compares to its numbers.', '',
      'Regenerate: `python experiments/seq2seq_model_table/make_table.py`', '',
      '| model | d_model | heads | d_ff | layers | params | paper | within 5% | untied embeddings | pre-norm |'
      ' WMT14 EN-DE BLEU (paper) |',
      '|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|']
  for variant, (paper, bleu) in PUBLISHED.items():
    width, enc, dec, mlp, heads = seq2seq.PRESETS[variant]
    params = count(variant)
    within = abs(params / (paper * 1e6) - 1) <= 0.05
    lines.append(f'| {variant} | {width} | {heads} | {mlp} | {enc}+{dec} | {params:,} | {paper}M | '
                 f'{"yes" if within else "NO"} | {count(variant, share_embeddings="none"):,} | '
                 f'{count(variant, prenorm=True):,} | {bleu} |')
  lines += ['', '"untied embeddings": separate source, target and output matrices (`share_embeddings=\'none\'`).',
            'Run the WMT recipe with `configs/seq2seq/wmt14_ende.py` (see its docstring); BLEU is not reproduced',
            'here (no cluster, no WMT data on this machine).']
  reporting.write_readme(__file__, lines)


if __name__ == '__main__':
  main()
