"""Renders the ViViT model table (parameters, forward GMACs) into experiments/vivit_model_table/README.md.

python -m experiments.vivit_model_table.make_table
ViViT-B/16x2 on 32 frames of 224 px with a 400-class head, counted from abstract shapes in seconds.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.vivit_model_table.make_table')


from flax import nnx

from experiments import common
from vit_jax_lab import cost
from vit_jax_lab.models import vivit

SHAPE = (32, 224, 224, 3)
# Arnab et al. 2021, Table 2: parameters (millions), GFLOPs (the paper's FLOPs are multiply-adds), K400 top-1.
PUBLISHED = {
  'spatiotemporal': (88.9, 455.2, 80.0),
  'factorised_encoder': (115.1, 284.4, 78.8),
  'factorised_self_attention': (117.3, 372.3, 77.4),
  'factorised_dot_product': (88.9, 277.1, 76.3),
}


def rows():
  for number, (model, (params, gmacs, top1)) in enumerate(PUBLISHED.items(), 1):
    fn, args = cost.forward(lambda: vivit.ViViT(400, SHAPE, variant='B/16x2', model=model, rngs=nnx.Rngs(0)), SHAPE)
    ours_params, ours_gmacs = cost.param_count(args[0]), cost.matmul_macs(fn, *args) / 1e9
    match = abs(ours_params / 1e6 - params) <= 0.1 and abs(ours_gmacs / gmacs - 1) <= 0.03
    yield number, model, ours_params, params, ours_gmacs, gmacs, top1, match


def main() -> None:
  lines = [
    '| model | params | published (M) | GMACs | published | K400 top-1 (paper) | match |',
    '|---|---:|---:|---:|---:|---:|---|',
  ]
  for number, model, params, pub_params, gmacs, pub_gmacs, top1, match in rows():
    lines.append(
      f'| {number}: {model} | {params:,} | {pub_params} | {gmacs:.1f} | {pub_gmacs} | {top1} | '
      f'{"yes" if match else "NO"} |'
    )
  common.write_table(__file__, lines)


if __name__ == '__main__':
  main()
