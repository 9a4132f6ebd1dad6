"""Renders what a ViT attends to: per-head attention of one layer and the rollout over all layers.

python -m vit_jax_lab.tools.attention_map --workdir runs/vit_digits --example 3   # runs/vit_digits/attention_3.png
python -m vit_jax_lab.tools.attention_map --config configs/vit/finetune.py:imagenet2012,B/16 \
    --config.init_from=ViT-B_16.npz --config.data.data_dir=/datasets/tfds --image cat.jpg --out cat.png

The PNG (matplotlib) shows the input titled with the predicted class and its probability (and the true class of an
eval example), the rollout over all layers, then every head of `--layer`, each with its colour bar. With a class
token ('tok' pooling) the maps are the class token's attention to each patch; without one ('gap', 'map'), the
attention each patch receives, averaged over all query tokens. --out defaults into the run's workdir.
"""

import os
import sys

import jax
import numpy as np
from matplotlib.figure import Figure

from vit_jax_lab import console, errors, models, train
from vit_jax_lab.data import device
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.tools import common, predictors

# Loaded at their first use (console.lazy): they import TensorFlow, which --help and a mistake in the arguments
# need not wait for.
tf = console.lazy('tensorflow')
images = console.lazy('vit_jax_lab.data.images')


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


def figure(
  image: np.ndarray, maps: list[np.ndarray], has_class_token: bool, grid: tuple[int, int], layer: int, caption: str
) -> Figure:
  """Input, rollout, then every head of `layer`, each map over the image with its colour bar. `image`: uint8
  (H, W, C) for display; `maps`: per layer (heads, tokens, tokens); `caption`: the input panel's title."""
  heads = patch_scores(maps[layer], has_class_token)
  layer_number = layer % len(maps)
  panels = [(f'rollout over all {len(maps)} layers', patch_scores(rollout(maps), has_class_token))]
  panels += [(f'layer {layer_number}, head {h}', scores) for h, scores in enumerate(heads)]
  fig = Figure(figsize=(2.7 * (len(panels) + 1), 3.2), layout='constrained')
  axes = fig.subplots(1, len(panels) + 1)
  shown = image[..., 0] if image.shape[-1] == 1 else image
  height, width = shown.shape[:2]
  label = "class token's attention" if has_class_token else 'attention received (mean over queries)'
  axes[0].imshow(shown, cmap='gray')
  axes[0].set_title(caption, fontsize='small')  # A class name may be long: the panel is narrow.
  grey = shown if shown.ndim == 2 else shown.mean(-1)  # Colours of the photo would read as attention.
  for ax, (title, scores) in zip(axes[1:], panels):
    ax.imshow(grey, cmap='gray')
    heat = ax.imshow(
      scores.reshape(grid),
      cmap='inferno',
      alpha=0.65,
      interpolation='bilinear',
      extent=(-0.5, width - 0.5, height - 0.5, -0.5),
    )
    ax.set_title(title)
    fig.colorbar(heat, ax=ax, shrink=0.85, label=label)
  for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
  fig.suptitle(f'What the model attends to ({label} per patch)')
  return fig


def render(model, image: np.ndarray, model_input: np.ndarray, layer: int, caption: str) -> Figure:
  """The figure of one example: `image` uint8 (H, W, C) for display, `model_input` as the model takes it."""
  maps = [np.asarray(m[0]) for m in model.attention_maps(model_input[None])]
  return figure(image, maps, model.pool in ('tok', 'tok_gap'), model.grid, layer, caption)


def prediction(model, model_input: np.ndarray, names: list[str]) -> str:
  """'predicted NAME' and '(p%)' on a second line, of one preprocessed input."""
  probabilities = np.asarray(jax.nn.softmax(model(model_input[None], train=False)[0].astype(np.float32)))
  best = int(probabilities.argmax())
  return f'predicted {names[best]}\n({probabilities[best]:.0%})'


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.attention_map', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', help='a run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file (with --config.init_from=...) instead of --workdir')
  parser.add_argument('--image', help='an image file; default: --example of the eval split')
  parser.add_argument('--example', type=int, default=0, help='index in the eval split')
  parser.add_argument('--layer', type=int, default=-1, help='the layer whose heads are drawn (-1: the last)')
  parser.add_argument('--out', help='the PNG to write; default: attention_EXAMPLE.png (or the image name) in --workdir')
  args, overrides = parser.parse_known_args(argv)
  if args.image and not os.path.exists(args.image):  # Before the run is read.
    raise ConfigError(f'--image {args.image} does not exist')
  out = args.out or _default_out(args)
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
  image, model_input, label = _input(s, args)
  names = common.class_names(s.builder, s.info.num_classes)
  caption = prediction(model, model_input, names) + ('' if label is None else f'\ntrue {names[label]}')
  errors.write_output(out, lambda path: render(model, image, model_input, args.layer, caption).savefig(path, dpi=100))
  print(f'wrote {out}')
  return 0


def _default_out(args) -> str:
  """attention_EXAMPLE.png, or attention_IMAGE.png, in the run's workdir."""
  if args.workdir is None:
    raise ConfigError('--out: give the PNG to write (with --config there is no run folder to write it into)')
  name = os.path.splitext(os.path.basename(args.image))[0] if args.image else str(args.example)
  return os.path.join(args.workdir, f'attention_{name}.png')


def _config(args, overrides):
  return common.one_device_one_example(common.config_of(args.workdir, args.config, overrides))  # One image.


def _input(s, args) -> tuple[np.ndarray, np.ndarray, int | None]:
  """(the image for display as uint8, the preprocessed model input, its true class: None for --image)."""
  if args.image:
    try:  # As predict reads it: turned upright as its EXIF says, checked before it is decoded.
      data = predictors.read_input(predictors.Item(args.image, 'image', (args.image,)), s.info.input_shape[-1])
    except predictors.Unreadable as e:
      raise ConfigError(f'--image {e}') from None
    raw = predictors.fit(images.decode(tf.constant(data), s.info.input_shape[-1]), s.config.data, s.info.input_shape)[0]
    label = None
  else:
    split = s.builder.info.splits[s.config.data.eval_split].num_examples
    if not 0 <= args.example < split:
      raise ConfigError(f'--example={args.example}: the eval split has {split} examples')
    ds = s.builder.as_dataset(split=f'{s.config.data.eval_split}[{args.example}:{args.example + 1}]')
    example = next(iter(ds))
    raw, label = example['image'], int(example['label'])
  preprocess = s.task.preprocess(s.config.data, s.info, train=False)
  model_input = preprocess({'image': raw, 'label': 0}, tf.zeros([2], tf.int64))['inputs'].numpy()
  model_input = np.asarray(device.eval_inputs({'inputs': model_input}, s.config.data)['inputs'])
  return raw.numpy().astype(np.uint8), model_input, label


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
