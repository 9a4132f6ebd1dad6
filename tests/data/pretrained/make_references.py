"""Writes the timm reference folders of tests/test_pretrained.py: for each row a tiny random-weight timm model saved
as a hub folder (config.json + model.safetensors, by timm's own save_for_hf) and reference.npz with the input images
(NHWC) and timm's eval-mode logits and pre-logits features on them. Not run by the tests: it needs torch and timm,
which are no project dependency. Made with torch 2.14.1 (CPU use) and timm 1.0.31 in a separate environment:

    /work/torchenv/bin/python tests/data/pretrained/make_references.py tests/data/pretrained
"""

import json
import os
import sys

import numpy as np
import timm
import torch
from timm.models.vision_transformer import checkpoint_filter_fn

# Small enough that every file stays well under 200 KB: width 32, 2 blocks, 4 heads, MLP ratio 2.
SMALL = dict(embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
# row -> (timm model name, overrides). num_classes=0: released as a backbone without a head (MAE, DINOv2, SigLIP).
ROWS = {
  'vit': ('vit_tiny_patch16_224.augreg_in21k_ft_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  'deit': ('deit_tiny_patch16_224.fb_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  'deit_distilled': ('deit_tiny_distilled_patch16_224.fb_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  'mae': ('vit_base_patch16_224.mae', dict(img_size=32, patch_size=8, num_classes=0)),
  'dinov2': ('vit_small_patch14_dinov2.lvd142m', dict(img_size=42, patch_size=14, num_classes=0)),
  'dinov2_reg4': ('vit_small_patch14_reg4_dinov2.lvd142m', dict(img_size=42, patch_size=14, num_classes=10)),
  'siglip': ('vit_base_patch16_siglip_224.webli', dict(img_size=32, patch_size=8, num_classes=0)),
}
# row -> another image size: the same weights loaded by timm's own filter (bicubic position-embedding resampling).
RESIZED = {'vit': 48, 'dinov2_reg4': 56}


def randomise(model: torch.nn.Module, seed: int) -> None:
  """Every parameter random, so that no weight (LayerScale gammas, zero heads, tokens) is left at a constant."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim >= 2 and 'token' not in name and 'pos_embed' not in name and 'latent' not in name:
        fan_in = p[0].numel()
        p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
      elif name.endswith('norm1.weight') or name.endswith('norm2.weight') or 'norm.weight' in name:
        p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(0.3 * torch.randn(p.shape, generator=g))


def outputs(model: torch.nn.Module, images: np.ndarray) -> dict[str, np.ndarray]:
  x = torch.from_numpy(images).permute(0, 3, 1, 2)
  with torch.no_grad():
    tokens = model.forward_features(x)
    return {'logits': model.forward_head(tokens).numpy(), 'features': model.forward_head(tokens, True).numpy()}


def main(out: str) -> None:
  for seed, (row, (name, overrides)) in enumerate(ROWS.items()):
    model = timm.create_model(name, pretrained=False, **SMALL, **overrides).eval()
    randomise(model, seed)
    folder = os.path.join(out, row)
    timm.models.save_for_hf(model, folder, safe_serialization=True)
    size = overrides['img_size']
    images = np.random.RandomState(seed).randn(2, size, size, 3).astype(np.float32)
    ref = {'images': images, **outputs(model, images)}
    if row in RESIZED:
      big = RESIZED[row]
      other = timm.create_model(name, pretrained=False, **SMALL, **(overrides | dict(img_size=big))).eval()
      other.load_state_dict(checkpoint_filter_fn(model.state_dict(), other))
      ref['resized_images'] = np.random.RandomState(seed).randn(2, big, big, 3).astype(np.float32)
      ref |= {f'resized_{k}': v for k, v in outputs(other, ref['resized_images']).items()}
    np.savez_compressed(
      os.path.join(folder, 'reference.npz'), torch=torch.__version__, timm=timm.__version__, name=name, **ref
    )
    with open(os.path.join(folder, 'config.json')) as f:
      config = json.load(f)
    print(row, name, config['architecture'], {k: v.shape for k, v in ref.items()})


if __name__ == '__main__':
  main(sys.argv[1])
