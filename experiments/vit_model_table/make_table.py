"""Renders the ViT model table (parameters, forward GMACs) into experiments/vit_model_table/README.md.

python -m experiments.vit_model_table.make_table
Counted from abstract shapes: nothing is allocated, so H/14 takes seconds on a laptop.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.vit_model_table.make_table')


from flax import nnx

from experiments import common
from vit_jax_lab import cost
from vit_jax_lab.models import vit

# Dosovitskiy et al. 2021 / timm: parameters at 224 px with 1,000 classes, forward GMACs per image.
PUBLISHED = {
  'Ti/16': (5_717_416, 1.25),
  'S/16': (22_050_664, 4.60),
  'B/16': (86_567_656, 17.56),
  'B/32': (88_224_232, 4.41),
  'L/16': (304_326_632, 61.55),
  'L/32': (306_535_400, None),
  'H/14': (632_045_800, 167.3),
}


def rows():
  for variant, (params, gmacs) in PUBLISHED.items():
    fn, args = cost.forward(lambda: vit.ViT(1000, (224, 224, 3), variant=variant, rngs=nnx.Rngs(0)), (224, 224, 3))
    ours_params, ours_gmacs = cost.param_count(args[0]), cost.matmul_macs(fn, *args) / 1e9
    xla_gmacs = cost.xla_flops(fn, *args) / 2e9
    match = ours_params == params and (gmacs is None or abs(ours_gmacs / gmacs - 1) <= 0.03)
    yield variant, ours_params, params, ours_gmacs, xla_gmacs, gmacs, match


def main() -> None:
  lines = [
    '| variant | params | published | GMACs | XLA FLOPs / 2 (G) | published GMACs | match |',
    '|---|---:|---:|---:|---:|---:|---|',
  ]
  for variant, params, pub_params, gmacs, xla, pub_gmacs, match in rows():
    pub = '—' if pub_gmacs is None else f'{pub_gmacs:.2f}'
    lines.append(
      f'| {variant} | {params:,} | {pub_params:,} | {gmacs:.2f} | {xla:.2f} | {pub} | {"yes" if match else "NO"} |'
    )
  common.write_table(__file__, lines)


if __name__ == '__main__':
  main()
