"""Peak host memory and time of loading a large hub folder into a sharded ViT (the loader's promise: a host holds
the file's pages plus about one tensor, never a copy of the whole model).

    python -m vit_jax_lab.tools.hub_benchmark write --size g/14 --out /tmp/vit_g14   # a random timm folder, by numpy
    python -m vit_jax_lab.tools.hub_benchmark measure /tmp/vit_g14

`write` streams random float32 tensors into model.safetensors one at a time (never the whole model in memory).
`measure` reads the folder into our ViT (a video folder: our ViViT) over every local device (FSDP shardings of
train.setup's rule) as init_from does (hub.read, load_pretrained, hub.place) and prints the load time and the
process's peak resident memory: all of it, the anonymous part (what the process allocated; on CPU devices the placed
parameters live there too) and the anonymous peak above the placed parameters (the loader's own working memory).
"""

import json
import os
import resource
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from vit_jax_lab import console, hub, parallel

# size -> width, depth, mlp_dim, num_heads (ViT-L: Dosovitskiy et al.; ViT-g: Zhai et al. 2022, 1.0B parameters).
SIZES = {'Ti': (192, 12, 768, 3), 'B': (768, 12, 3072, 12), 'L': (1024, 24, 4096, 16), 'g': (1408, 40, 6144, 16)}


def timm_shapes(width: int, depth: int, mlp_dim: int, patch: int, image: int, classes: int) -> dict[str, tuple]:
  """timm's VisionTransformer tensor names -> shapes, for a class-token ViT."""
  shapes = {
    'cls_token': (1, 1, width),
    'pos_embed': (1, 1 + (image // patch) ** 2, width),
    'patch_embed.proj.weight': (width, 3, patch, patch),
    'patch_embed.proj.bias': (width,),
  }
  for i in range(depth):
    block = {
      'norm1': (width,),
      'attn.qkv': (3 * width, width),
      'attn.proj': (width, width),
      'norm2': (width,),
      'mlp.fc1': (mlp_dim, width),
      'mlp.fc2': (width, mlp_dim),
    }
    for name, shape in block.items():
      shapes[f'blocks.{i}.{name}.weight'] = shape
      shapes[f'blocks.{i}.{name}.bias'] = (shape[0],)
  return shapes | {
    'norm.weight': (width,),
    'norm.bias': (width,),
    'head.weight': (classes, width),
    'head.bias': (classes,),
  }


def write(out: str, size: str, seed: int = 0) -> int:
  """A random timm ViT folder of `size` ('L/16', 'g/14'); returns the bytes written. Tensor by tensor: the
  safetensors header first, then each tensor's data."""
  name, patch = size.split('/')
  width, depth, mlp_dim, num_heads = SIZES[name]
  shapes = timm_shapes(width, depth, mlp_dim, int(patch), 224, 1000)
  header, offset = {}, 0
  for key, shape in shapes.items():
    end = offset + 4 * int(np.prod(shape))
    header[key] = {'dtype': 'F32', 'shape': list(shape), 'data_offsets': [offset, end]}
    offset = end
  text = json.dumps(header).encode()
  text += b' ' * (-len(text) % 8)  # The data starts 8-byte aligned, as safetensors writes it.
  os.makedirs(out, exist_ok=True)
  rng = np.random.default_rng(seed)
  with open(os.path.join(out, hub.WEIGHTS), 'wb') as f:
    f.write(len(text).to_bytes(8, 'little') + text)
    for shape in shapes.values():
      f.write(((rng.random(shape, dtype=np.float32) - 0.5) * 0.04).tobytes())
  config = {
    'architecture': f'vit_{dict(Ti="tiny", B="base", L="large", g="giant")[name]}_patch{patch}_224',
    'num_classes': 1000,
    'model_args': {'embed_dim': width, 'depth': depth, 'num_heads': num_heads, 'patch_size': int(patch)},
    'pretrained_cfg': {'input_size': [3, 224, 224]},
  }
  with open(os.path.join(out, hub.CONFIG), 'w') as f:
    json.dump(config, f)
  return 8 + len(text) + offset


def _status(field: str) -> int:
  """A /proc/self/status field in bytes (Linux)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024
  return 0


def measure(path: str, fsdp_min_size: int = 2**14) -> dict[str, Any]:
  """Loads the folder into a ViT (a video folder: a ViViT) sharded over every local device; the times and peak memory
  (bytes)."""
  from vit_jax_lab.models import vit, vivit  # The models import hub: not at this module's top.
  from vit_jax_lab.tools import pretrained

  weights = hub.read(path)
  image = pretrained.input_kind(path, weights) == 'image'
  family = vit.ViT if image else vivit.ViViT
  reader = hub.reader(weights.layout)
  options = (reader.vit_options if image else reader.vivit_options)(weights.config, weights.tensors)
  classes, shape = options.pop('num_classes'), options.pop('input_shape')
  abstract = nnx.eval_shape(lambda: family(max(classes, 1), shape, rngs=nnx.Rngs(0), **options))  # Not timed.
  params = nnx.state(abstract, nnx.Param).to_pure_dict()
  mesh = jax.make_mesh((1, len(jax.devices()), 1), ('data', 'fsdp', 'model'))
  shardings = parallel.shardings(params, mesh, fsdp_min_size, family.TENSOR_PARALLEL)
  start, peak = time.perf_counter(), {'anon': 0}
  done = threading.Event()

  def sample():  # RssAnon has no high-water mark of its own.
    while not done.is_set():
      peak['anon'] = max(peak['anon'], _status('RssAnon'))
      time.sleep(0.005)

  jax.devices()  # The runtime's own memory before the baseline.
  baseline = _status('RssAnon')
  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  weights = hub.read(path)  # Again, timed: the tensors' names and shapes.
  # The initial parameters load_pretrained keeps for a head it re-initialises: zero-strided zeros, no memory.
  target = jax.tree.map(lambda a: np.broadcast_to(np.zeros((), a.dtype), a.shape), params)
  loaded, _ = abstract.load_pretrained(weights, target)
  converted = time.perf_counter()
  placed = hub.place(loaded, shardings)
  jax.block_until_ready(placed)
  end = time.perf_counter()
  done.set()
  sampler.join()
  placed_bytes = sum(a.nbytes for a in jax.tree.leaves(placed))
  return dict(
    file_bytes=sum(os.path.getsize(f) for f in set(weights.tensors._files.values())),
    parameters=sum(a.size for a in jax.tree.leaves(placed)),
    largest_tensor_bytes=max(int(np.prod(weights.tensors.shape(n))) * 4 for n in weights.tensors),
    read_and_convert_s=converted - start,
    place_s=end - converted,
    devices=len(jax.devices()),
    peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    peak_anon_bytes=peak['anon'] - baseline,
    placed_bytes=placed_bytes,
    peak_anon_above_placed_bytes=peak['anon'] - baseline - (placed_bytes if jax.default_backend() == 'cpu' else 0),
  )


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.hub_benchmark', description=__doc__.split('\n\n')[0])
  commands = parser.add_subparsers(dest='command', required=True)
  w = commands.add_parser('write', help='write a random timm ViT folder')
  w.add_argument('--size', default='L/16', choices=['Ti/16', 'B/16', 'L/16', 'g/14'], help='the ViT variant written')
  w.add_argument('--out', required=True, help='the new folder (config.json + model.safetensors)')
  m = commands.add_parser('measure', help='load a folder into a sharded ViT: time and peak host memory')
  m.add_argument('path', help='a timm or transformers folder (image or video) as the hub serves it')
  args = parser.parse_args(argv)
  if args.command == 'write':
    print(f'{args.out}: {write(args.out, args.size) / 2**30:.2f} GiB')
    return 0
  result = measure(args.path)
  print(json.dumps({k: round(v / 2**30, 3) if k.endswith('_bytes') else v for k, v in result.items()}, indent=1))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
