"""A small convolutional network for the few hundred pictures a ViT cannot learn from scratch: stages of a 3 x 3
convolution, GroupNorm, ReLU and 2 x 2 max pooling, then the average over positions and a linear head.

A ViT has to learn locality and translation from data; on ~80 training pictures it memorises them instead (0.3 of
held-out accuracy at chance, experiments/own_photos), where these built-in priors generalise. configs/vit/folder.py
trains it when no pretrained weights are given.
"""

import jax
from flax import nnx

import vit_jax_lab.models.base as base
from vit_jax_lab.errors import ConfigError


class CNN(base.Model):
  """Images (B, H, W, C) -> class logits (B, num_classes).

  Attributes:
    num_classes: size of the classification head (from the dataset).
    input_shape: (height, width, channels) of one image (from the data config).
    widths: channels of each stage; each stage halves the height and width (flooring), so both must be at least
      2 ** len(widths).
    groups: GroupNorm's channel groups; every width must divide by it. GroupNorm, not BatchNorm: there are no batch
      statistics to keep, so a prediction does not depend on its batch, and 1 and 8 devices compute the same.
    head_zero_init: start the classification head at zero.
  """

  ENCODER = None  # No attention: the family takes no encoder options.

  def __init__(
    self,
    num_classes: int,
    input_shape: tuple[int, ...],
    *,
    widths: tuple[int, ...] = (32, 64, 128, 128),
    groups: int = 8,
    head_zero_init: bool = True,
    rngs: nnx.Rngs,
  ):
    if len(input_shape) != 3:
      raise ConfigError(f'CNN takes images of shape (height, width, channels), got {tuple(input_shape)}')
    widths = tuple(widths)
    if not widths or not all(isinstance(w, int) and w > 0 and w % groups == 0 for w in widths):
      raise ConfigError(f'model.widths={widths} must be positive integers, each divisible by model.groups={groups}')
    if min(input_shape[:2]) < 2 ** len(widths):
      raise ConfigError(
        f'{len(widths)} stages halve the images {len(widths)} times: {input_shape[0]}x{input_shape[1]} is too '
        f'small; raise data.image_size to at least {2 ** len(widths)} or give model.widths fewer stages'
      )
    self.input_shape = tuple(input_shape)
    channels = (input_shape[2], *widths)
    self.convs = nnx.List([nnx.Conv(a, b, (3, 3), rngs=rngs) for a, b in zip(channels, widths)])
    self.norms = nnx.List([nnx.GroupNorm(w, num_groups=groups, rngs=rngs) for w in widths])
    head_init = nnx.initializers.zeros if head_zero_init else nnx.initializers.lecun_normal()
    self.head = nnx.Linear(widths[-1], num_classes, kernel_init=head_init, rngs=rngs)

  def features(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    if images.ndim != 4 or tuple(images.shape[1:]) != self.input_shape:
      raise ValueError(f'this CNN takes a batch of images (B, *{self.input_shape}), got {tuple(images.shape)}')
    x = images
    for conv, norm in zip(self.convs, self.norms):
      x = nnx.max_pool(jax.nn.relu(norm(conv(x))), (2, 2), (2, 2))
    return x.mean((1, 2))

  def __call__(self, images: jax.Array, *, train: bool = False, rngs: nnx.Rngs | None = None) -> jax.Array:
    return self.head(self.features(images))
