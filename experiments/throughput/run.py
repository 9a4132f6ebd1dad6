"""Train-step throughput of the model families on this machine, rendered into README.md.

python -m experiments.throughput.run            # every row (about 20 minutes on 2 CPU cores)
python -m experiments.throughput.run compile    # only the compile-time and memory rows
python -m experiments.throughput.run gpu        # the accelerator table: bf16, cuDNN attention (one NVIDIA GPU)
Each row is `python -m vit_jax_lab.tools.bench` on the config and overrides shown, with random inputs of the
shape shown (--synthetic; Transformer-base: 128 source and 128 target tokens, a 37,000-token vocabulary),
so no dataset is read. Run nothing else on the machine meanwhile.
"""

if not __package__:
  raise SystemExit('run from the repository root as a module: python -m experiments.throughput.run')

import os
import sys
import types

from experiments import common
from vit_jax_lab import config as config_lib
from vit_jax_lab.tools import bench

VIT = [
  '--config.model.pool=tok',
  '--config.model.posemb=learn',
  '--config.model.dropout=0.0',
  '--config.optim.weight_decay=0.05',
]
VIDEO = [
  '--config.model.variant=Ti/16x2',
  '--config.model.temporal_depth=4',
  '--config.data.batch_size=8',
  *(f'--config.model.{k}=None' for k in ('width', 'depth', 'mlp_dim', 'num_heads', 'patch_size', 'tubelet_time')),
]
STEP_ROWS = [  # (name, config, overrides, synthetic input shape)
  (
    'ViT-Ti/16',
    'configs/vit/digits.py',
    [*VIT, '--config.model.variant=Ti/16', '--config.data.batch_size=32'],
    '224,224,3,1000',
  ),
  (
    'ViT-S/16',
    'configs/vit/digits.py',
    [*VIT, '--config.model.variant=S/16', '--config.data.batch_size=32'],
    '224,224,3,1000',
  ),
  (
    'ViT-B/16',
    'configs/vit/digits.py',
    [*VIT, '--config.model.variant=B/16', '--config.data.batch_size=32'],
    '224,224,3,1000',
  ),
  ('ViViT-Ti/16x2 model 1', 'configs/vivit/moving_digits.py:spatiotemporal', VIDEO, '8,224,224,3,400'),
  ('ViViT-Ti/16x2 model 2', 'configs/vivit/moving_digits.py:factorised_encoder', VIDEO, '8,224,224,3,400'),
  (
    'Transformer-base',
    'configs/seq2seq/wmt14_ende.py:base',
    ['--config.compute_dtype=float32', '--config.data.batch_size=16'],
    '128,37000',
  ),
]
COMPILE_ROWS = [  # Compile time and compiled memory, no steps.
  (
    f'ViT-{v} {"scanned" if scan else "unscanned"}, remat {remat}, batch {b}',
    'configs/vit/digits.py',
    [
      *VIT,
      f'--config.model.variant={v}',
      f'--config.data.batch_size={b}',
      f'--config.model.scan={scan}',
      f'--config.model.remat={remat}',
    ],
    '224,224,3,1000',
  )
  for v, scan, remat, b in [
    ('B/16', False, 'none', 32),
    ('B/16', True, 'none', 32),
    ('L/16', True, 'none', 32),
    ('L/16', True, 'none', 64),
    ('L/16', True, 'full', 64),
  ]
]

BF16 = ['--config.compute_dtype=bfloat16']
CUDNN = [*BF16, '--config.model.attention_impl=cudnn']
GPU_ROWS = [  # ViT at 224 px (ImageNet's shape) on one NVIDIA GPU.
  *(
    (
      f'ViT-{v} bf16 cuDNN',
      'configs/vit/digits.py',
      [*VIT, *CUDNN, f'--config.model.variant={v}', f'--config.data.batch_size={b}'],
      '224,224,3,1000',
    )
    for v, b in [('Ti/16', 256), ('S/16', 256), ('B/16', 256), ('B/16', 512), ('L/16', 128)]
  ),
  *(
    (
      f'ViT-B/16 {name}',
      'configs/vit/digits.py',
      [*VIT, *options, '--config.model.variant=B/16', '--config.data.batch_size=256'],
      '224,224,3,1000',
    )
    for name, options in [('bf16 XLA attention', [*BF16, '--config.model.attention_impl=xla']), ('float32', [])]
  ),
]


def measure(rows, steps: int) -> list[dict]:
  results = []
  for name, path, overrides, shape in rows:
    config = config_lib.load(os.path.join(common.ROOT, path))
    config_lib.apply_overrides(config, overrides)
    args = types.SimpleNamespace(steps=steps, warmup=2, input_batches=0, synthetic=shape, decode=[])
    results.append({'config': name} | bench.measure(config, args))
    print(results[-1], flush=True)
  return results


def main() -> None:
  if sys.argv[1:] == ['gpu']:
    common.write_table(__file__, [bench.table(measure(GPU_ROWS, steps=20))], marker='gpu')
    return
  if sys.argv[1:] != ['compile']:
    common.write_table(__file__, [bench.table(measure(STEP_ROWS, steps=10))], marker='steps')
  common.write_table(__file__, [bench.table(measure(COMPILE_ROWS, steps=0))], marker='compile')


if __name__ == '__main__':
  main()
