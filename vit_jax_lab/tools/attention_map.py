"""Renders what a ViT attends to: per-head attention of one layer and the rollout over all layers.

python -m vit_jax_lab.tools.attention_map --workdir runs/vit_digits --example 3 --out attention.png
python -m vit_jax_lab.tools.attention_map --config configs/vit/finetune.py:imagenet2012,B/16 \
    --config.init_from=ViT-B_16.npz --config.data.data_dir=/datasets/tfds --image cat.jpg --out cat.png

The PNG shows the input, the rollout overlay, then one overlay per head of `--layer`. With a class
token ('tok' pooling) the maps are the class token's attention to each patch; without one ('gap',
'map'), the attention each patch receives, averaged over all query tokens.
"""

import argparse
import os
import sys

import jax
import numpy as np
import tensorflow as tf
from PIL import Image

from vit_jax_lab import console, models, train
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tools import common


def rollout(maps: list[np.ndarray]) -> np.ndarray:
  """Attention rollout (Abnar & Zuidema 2020) of one example: heads averaged, the residual added as
  0.5 I, rows renormalised, multiplied through the layers. (tokens, tokens); rows sum to 1."""
  result = np.eye(maps[0].shape[-1])
  for attention in maps:
    a = 0.5 * attention.mean(axis=0) + 0.5 * np.eye(attention.shape[-1])
    result = (a / a.sum(axis=-1, keepdims=True)) @ result
  return result


def patch_scores(attention: np.ndarray, has_class_token: bool) -> np.ndarray:
  """(..., tokens, tokens) -> (..., patches): the class token's row, or the mean over all rows."""
  if has_class_token:
    return attention[..., 0, 1:]
  return attention.mean(axis=-2)


def overlay(image: np.ndarray, scores: np.ndarray, grid: tuple[int, int], size: int) -> Image.Image:
  """Scores on the patch grid, normalised, upsampled and blended over the image in a red-yellow map."""
  heat = scores.reshape(grid)
  heat = (heat - heat.min()) / max(heat.max() - heat.min(), 1e-12)
  heat = np.asarray(Image.fromarray(np.uint8(255 * heat)).resize((size, size), Image.BILINEAR)) / 255.0
  colour = np.stack([np.ones_like(heat), heat, np.zeros_like(heat)], axis=-1)  # Red -> yellow.
  base = np.asarray(_pil(image).resize((size, size), Image.NEAREST)) / 255.0
  return Image.fromarray(np.uint8(255 * (0.45 * base + 0.55 * colour * heat[..., None])))


def _pil(image: np.ndarray) -> Image.Image:
  return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).convert('RGB')


def render(model, image: np.ndarray, model_input: np.ndarray, layer: int, size: int = 160) -> Image.Image:
  """One strip: input, rollout, then every head of `layer`. `image` is uint8 (H, W, C) for display."""
  maps = [np.asarray(m[0]) for m in model.attention_maps(model_input[None])]
  has_cls = model.pool == 'tok'
  tiles = [_pil(image).resize((size, size), Image.NEAREST)]
  tiles.append(overlay(image, patch_scores(rollout(maps), has_cls), model.grid, size))
  tiles += [overlay(image, scores, model.grid, size) for scores in patch_scores(maps[layer], has_cls)]
  strip = Image.new('RGB', (len(tiles) * (size + 4), size), 'white')
  for i, tile in enumerate(tiles):
    strip.paste(tile, (i * (size + 4), 0))
  return strip


@console.command
def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(
    prog='python -m vit_jax_lab.tools.attention_map', description=__doc__.splitlines()[0]
  )
  parser.add_argument('--workdir', help='a run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file (with --config.init_from=...) instead of --workdir')
  parser.add_argument('--image', help='an image file; default: --example of the eval split')
  parser.add_argument('--example', type=int, default=0, help='index in the eval split')
  parser.add_argument('--layer', type=int, default=-1, help='the layer whose heads are drawn (-1: the last)')
  parser.add_argument('--out', required=True, help='the PNG to write')
  args, overrides = parser.parse_known_args(argv)
  config = _config(args, overrides)
  if not models.get(config.model.name).offers('attention_maps') or config.model.get('scan'):
    drawn = [name for name, family in models.MODELS.items() if family.offers('attention_maps')]
    raise ConfigError(
      f'attention maps are drawn for models of {", ".join(drawn)} with unscanned layers; this run has '
      f'model.name={config.model.name!r}, model.scan={config.model.get("scan")}'
    )
  s = train.setup(config, jax.devices()[:1])
  model = common.load_model(s, args.workdir)
  if not -len(model.encoder.blocks) <= args.layer < len(model.encoder.blocks):
    raise ConfigError(f'--layer={args.layer}: the model has {len(model.encoder.blocks)} layers')
  image, model_input = _input(s, args)
  render(model, image, model_input, args.layer).save(args.out)
  print(f'wrote {args.out}')
  return 0


def _config(args, overrides):
  return common.one_device_one_example(common.config_of(args.workdir, args.config, overrides))  # One image.


def _input(s, args) -> tuple[np.ndarray, np.ndarray]:
  """(the image for display as uint8, the preprocessed model input)."""
  if args.image:
    if not os.path.exists(args.image):
      raise ConfigError(f'--image {args.image} does not exist')
    raw = tf.io.decode_image(tf.io.read_file(args.image), channels=s.info.input_shape[-1], expand_animations=False)
  else:
    split = s.builder.info.splits[s.config.data.eval_split].num_examples
    if not 0 <= args.example < split:
      raise ConfigError(f'--example={args.example}: the eval split has {split} examples')
    ds = s.builder.as_dataset(split=f'{s.config.data.eval_split}[{args.example}:{args.example + 1}]')
    raw = next(iter(ds))['image']
  preprocess = s.task.preprocess(s.config.data, s.info, train=False)
  model_input = preprocess({'image': raw, 'label': 0}, tf.zeros([2], tf.int64))['inputs'].numpy()
  return raw.numpy().astype(np.uint8), model_input


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
