"""Renders the Transformer parameter table into experiments/seq2seq_model_table/README.md.

python -m experiments.seq2seq_model_table.make_table
Transformer base and big with a shared 37,000-token vocabulary, counted from abstract shapes in seconds.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.seq2seq_model_table.make_table')


from flax import nnx

from experiments import common
from vit_jax_lab import cost
from vit_jax_lab.models import seq2seq

VOCAB = 37_000
PUBLISHED = {'base': (65, 27.3), 'big': (213, 28.4)}  # Vaswani et al. 2017, Table 3: params (M), EN-DE BLEU.


def count(variant: str, **options) -> int:
  model = nnx.eval_shape(
    lambda: seq2seq.Transformer(VOCAB, VOCAB, None, 256, variant=variant, rngs=nnx.Rngs(0), **options)
  )
  return cost.param_count(nnx.state(model, nnx.Param))


def main() -> None:
  lines = [
    '| model | d_model | heads | d_ff | layers | params | paper | within 5% | untied embeddings | pre-norm |'
    ' WMT14 EN-DE BLEU (paper) |',
    '|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|',
  ]
  for variant, (paper, bleu) in PUBLISHED.items():
    width, enc, dec, mlp, heads = seq2seq.PRESETS[variant]
    params = count(variant)
    within = abs(params / (paper * 1e6) - 1) <= 0.05
    lines.append(
      f'| {variant} | {width} | {heads} | {mlp} | {enc}+{dec} | {params:,} | {paper}M | '
      f'{"yes" if within else "NO"} | {count(variant, share_embeddings="none"):,} | '
      f'{count(variant, prenorm=True):,} | {bleu} |'
    )
  common.write_table(__file__, lines)


if __name__ == '__main__':
  main()
