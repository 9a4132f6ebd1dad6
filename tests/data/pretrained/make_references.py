"""Writes the reference folders of tests/test_pretrained.py: for each row a tiny random-weight timm or Hugging Face
transformers model saved as a hub folder (config.json + model.safetensors, by timm's own save_for_hf or the model's
save_pretrained; for transformers also preprocessor_config.json by its image processor) and reference.npz with the
input images (NHWC) and the library's eval-mode outputs on them (timm: logits and pre-logits features;
transformers: the outputs the model returns; its video classifiers, HF_VIDEO_ROWS: `videos` (NTHWC) and `logits`).
Not run by the tests: it needs torch, timm and transformers, which are no project dependency. Made with torch
2.14.1 (CPU use), timm 1.0.31 and transformers 5.24 in a separate environment (the clip_ft row and its predict
reference with torch 2.13.0; the other predict references reproduce with it to 7e-8) (ROW...: only those rows):

    /work/torchenv/bin/python tests/data/pretrained/make_references.py tests/data/pretrained [ROW...]

`... make_references.py tests/data/pretrained predict [ROW...]` writes predict/ instead (those rows' references only
when rows are named; tests/test_pretrained_commands.py): three PNGs (PREDICT_IMAGES: the models' input size, 40 x 48
and 24 x 64) and each PREDICT row's probabilities from the library's own eval pipeline on them (timm:
resolve_data_config + create_transform; transformers: the folder's image processor, torchvision's), the committed
folders' weights loaded by the library; and for the video
rows two PNG-coded clips and their probabilities from the folder's video processor (predict_video_references; PyAV
18.1 in that environment too).

`... make_references.py tests/data/pretrained fields` writes transformers_fields.json (IMAGE_CONFIGS: each config's
fields); `... resize` writes predict/resize.npz (resize_references: Pillow 13.0.0,
torchvision 0.28).

`... make_references.py tests/data/pretrained export DIR` writes export/timm_logits_NAME.npy: timm's logits on
export/images.npy of each folder DIR/NAME that `python tests/test_pretrained_commands.py DIR` exported (our ViTs
as timm folders), loaded as a timm user loads one: create_model(architecture, pretrained=True,
pretrained_cfg_overlay=dict(file=...), **model_args); and export/transformers_logits_NAME.npy of those exported as
transformers folders (the class of the folder's `architectures`: ViTForImageClassification on export/images.npy,
VivitForVideoClassification or VideoMAEForVideoClassification on export/videos.npy, 2 random uint8 clips of 4 x 16 x
24 x 3 written here once, as x / 127.5 - 1: what the folder's own image processor makes of them, checked).
"""

import json
import os
import sys

import numpy as np
import safetensors.torch
import timm
import torch
import transformers
from timm.models.vision_transformer import checkpoint_filter_fn

# Small enough that every file stays well under 200 KB: width 32, 2 blocks, 4 heads, MLP ratio 2.
SMALL = dict(embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
# row -> (timm model name, overrides). num_classes=0: released as a backbone without a head (MAE, DINOv2, SigLIP).
ROWS = {
  'vit': ('vit_tiny_patch16_224.augreg_in21k_ft_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  'deit': ('deit_tiny_patch16_224.fb_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  # Mean pooling over the patch tokens (the class token kept but left out of the mean), with timm's fc_norm after
  # it (its default for 'avg') or with the final norm before it (fc_norm=False).
  'vit_avg': (
    'vit_tiny_patch16_224.augreg_in21k_ft_in1k',
    dict(img_size=32, patch_size=8, num_classes=10, global_pool='avg'),
  ),
  'vit_avg_norm': (
    'vit_tiny_patch16_224.augreg_in21k_ft_in1k',
    dict(img_size=32, patch_size=8, num_classes=10, global_pool='avg', fc_norm=False),
  ),
  'deit_distilled': ('deit_tiny_distilled_patch16_224.fb_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  'mae': ('vit_base_patch16_224.mae', dict(img_size=32, patch_size=8, num_classes=0)),
  'dinov2': ('vit_small_patch14_dinov2.lvd142m', dict(img_size=42, patch_size=14, num_classes=0)),
  'dinov2_reg4': ('vit_small_patch14_reg4_dinov2.lvd142m', dict(img_size=42, patch_size=14, num_classes=10)),
  'siglip': ('vit_base_patch16_siglip_224.webli', dict(img_size=32, patch_size=8, num_classes=0)),
  # CLIP image towers: timm's head is CLIP's projection (here to 16).
  'clip': ('vit_base_patch16_clip_224.openai', dict(img_size=32, patch_size=8, num_classes=16)),
  'clip_quickgelu': ('vit_base_patch16_clip_quickgelu_224.openai', dict(img_size=32, patch_size=8, num_classes=16)),
  # A CLIP tower fine-tuned into a classifier (timm's most accurate ViTs): the same layout, its head a classifier.
  'clip_ft': ('vit_base_patch16_clip_224.laion2b_ft_in12k_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  # DINOv2 giant's SwiGLU (SwiGLUPacked fc1) at its own MLP ratio 2.66667 * 2: fc1 170 outputs, the gate's 85 first.
  'dinov2_giant': (
    'vit_giant_patch14_dinov2.lvd142m',
    dict(img_size=42, patch_size=14, num_classes=0, mlp_ratio=2.66667 * 2),
  ),
  # timm's Eva class with rotary position embeddings (timm/models/eva.py). RoPE-ViT axial (temperature 100, x first)
  # and RoPE-Mixed (learned frequencies `rope.freqs`; with absolute positions on the patches, `_ape`).
  'rope_axial': ('vit_small_patch16_rope_224.naver_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  'rope_mixed_ape': (
    'vit_small_patch16_rope_mixed_ape_224.naver_in1k',
    dict(img_size=32, patch_size=8, num_classes=10),
  ),
  # timm's SBB ViT: EVA attention (q and v biases, none on k), a register, mean pool with fc_norm, and positions
  # rescaled to its 16 x 16 pre-training grid (ref_feat_shape), rows first.
  'rope_sbb': ('vit_medium_patch16_rope_reg1_gap_256.sbb_in1k', dict(img_size=32, patch_size=8, num_classes=10)),
  # DINOv3: centred coordinates, rotate-half pairs, class token and 4 registers, LayerNorm epsilon 1e-5; timm's
  # default pool is the patch tokens' mean beside the class token.
  'dinov3': ('vit_small_patch16_dinov3.lvd1689m', dict(img_size=32, patch_size=8, num_classes=10)),
  # EVA-02: SwiGLU (tiny: packed in mlp.fc1; base: mlp.fc1_g / fc1_x with the sub-LN mlp.norm), positions on the 16 x
  # 16 pre-training grid, a class token beside the mean pool and fc_norm, q and v biases.
  'eva02_tiny': ('eva02_tiny_patch14_224.mim_in22k', dict(img_size=28, patch_size=7, num_classes=10)),
  'eva02_base': ('eva02_base_patch14_448.mim_in22k_ft_in22k_in1k', dict(img_size=28, patch_size=7, num_classes=10)),
  # Perception Encoder: norm_pre, an attention pool of 8 heads (the encoder's are 4 here), epsilon 1e-5, positions on
  # its 24 x 24 grid offset by one (no effect: scores see differences); its head CLIP's projection (to 16).
  'pe_core': ('vit_pe_core_tiny_patch16_384.fb', dict(img_size=32, patch_size=8, num_classes=16)),
}
# transformers rows: (model class, its config class, image processor class, config overrides).
HF_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
HF_ROWS = {
  'hf_vit': ('ViTForImageClassification', 'ViTConfig', 'ViTImageProcessor', dict(num_labels=10, intermediate_size=64)),
  'hf_vit_model': ('ViTModel', 'ViTConfig', 'ViTImageProcessor', dict(intermediate_size=64)),
  'hf_dinov2': ('Dinov2Model', 'Dinov2Config', 'BitImageProcessor', dict(mlp_ratio=2, image_size=42, patch_size=14)),
  'hf_dinov2_reg': (
    'Dinov2WithRegistersModel',
    'Dinov2WithRegistersConfig',
    'BitImageProcessor',
    dict(mlp_ratio=2, image_size=42, patch_size=14, num_register_tokens=4),
  ),
  # DINOv2 giant's SwiGLU: mlp.weights_in (2 x 88 rows: 32 x mlp_ratio 4, two thirds, rounded up to 8).
  'hf_dinov2_giant': (
    'Dinov2Model',
    'Dinov2Config',
    'BitImageProcessor',
    dict(mlp_ratio=4, image_size=42, patch_size=14, use_swiglu_ffn=True),
  ),
  # DINOv2's linear probes: the classifier reads the class token beside the patch tokens' mean (registers left out).
  'hf_dinov2_cls': (
    'Dinov2ForImageClassification',
    'Dinov2Config',
    'BitImageProcessor',
    dict(mlp_ratio=2, image_size=42, patch_size=14, num_labels=10),
  ),
  'hf_dinov2_reg_cls': (
    'Dinov2WithRegistersForImageClassification',
    'Dinov2WithRegistersConfig',
    'BitImageProcessor',
    dict(mlp_ratio=2, image_size=42, patch_size=14, num_register_tokens=4, num_labels=10),
  ),
  'hf_siglip': ('SiglipVisionModel', 'SiglipVisionConfig', 'SiglipImageProcessor', dict(intermediate_size=64)),
  'hf_clip': ('CLIPVisionModel', 'CLIPVisionConfig', 'CLIPImageProcessor', dict(intermediate_size=64)),
  'hf_clip_projection': (
    'CLIPVisionModelWithProjection',
    'CLIPVisionConfig',
    'CLIPImageProcessor',
    dict(intermediate_size=64, projection_dim=16),
  ),
  # DINOv3: rotary positions, class token and 4 registers, LayerScale, no key bias; and its gated MLP (SiLU), as
  # the 7B's.
  'hf_dinov3': (
    'DINOv3ViTModel',
    'DINOv3ViTConfig',
    'DINOv3ViTImageProcessor',
    dict(intermediate_size=64, num_register_tokens=4),
  ),
  'hf_dinov3_gated': (
    'DINOv3ViTModel',
    'DINOv3ViTConfig',
    'DINOv3ViTImageProcessor',
    dict(intermediate_size=48, num_register_tokens=2, use_gated_mlp=True, hidden_act='silu', proj_bias=False),
  ),
}
# transformers video rows (clips of 4 frames of 16 x 24, tubelets 2 x 8 x 8: a 2 x 2 x 3 token grid, not square, so
# that the order of time, height and width is checked): (model class, config class, image processor class, config).
HF_VIDEO = dict(image_size=[16, 24], num_frames=4, intermediate_size=64, num_labels=10)
HF_VIDEO_ROWS = {
  'hf_vivit': ('VivitForVideoClassification', 'VivitConfig', 'VivitImageProcessor', dict(tubelet_size=[2, 8, 8])),
  'hf_videomae': (
    'VideoMAEForVideoClassification',
    'VideoMAEConfig',
    'VideoMAEImageProcessor',
    dict(tubelet_size=2, patch_size=8, use_mean_pooling=True),
  ),
}
# row -> another image size: the same weights loaded by timm's own filter (bicubic position-embedding resampling).
RESIZED = {
  'vit': 48,
  'dinov2_reg4': 56,
  'rope_axial': 48,
  'rope_mixed_ape': 48,
  'rope_sbb': 48,
  'dinov3': 48,
  'eva02_base': 42,
  'pe_core': 48,
}
# transformers row -> another image size, the same model run on it: DINOv2 resamples its position embeddings itself
# (bicubic, antialiased), ViT when asked (interpolate_pos_encoding; bicubic without antialiasing).
HF_RESIZED = {'hf_dinov2_reg': 56, 'hf_vit_model': 48, 'hf_dinov3': 48}
# Rows added later, with seeds of their own: the others keep theirs (their order in ROWS, HF_ROWS, HF_VIDEO_ROWS).
LATER = {
  'dinov2_giant': 30,
  'hf_dinov2_giant': 31,
  'clip_ft': 32,
  'hf_dinov2_cls': 33,
  'hf_dinov2_reg_cls': 34,
  'rope_axial': 35,
  'rope_mixed_ape': 36,
  'rope_sbb': 37,
  'dinov3': 38,
  'hf_dinov3': 39,
  'hf_dinov3_gated': 40,
  'eva02_tiny': 41,
  'eva02_base': 42,
  'hf_siglip2': 43,
  'pe_core': 44,
  'hf_vjepa2_cls': 45,
  'hf_vjepa2': 46,
  'hf_siglip_cls': 47,
  'hf_siglip2_cls': 48,
}


def seed_of(row: str) -> int:
  if row in LATER:
    return LATER[row]
  return [r for r in (*ROWS, *HF_ROWS, *HF_VIDEO_ROWS) if r not in LATER].index(row)


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


def transformers_row(out: str, row: str, seed: int) -> None:
  model_class, config_class, processor_class, overrides = HF_ROWS[row]
  config = getattr(transformers, config_class)(**(dict(image_size=32, patch_size=8) | HF_SMALL | overrides))
  model = getattr(transformers, model_class)(config).eval()
  randomise(model, seed)
  folder = os.path.join(out, row)
  model.save_pretrained(folder, safe_serialization=True)
  size = config.image_size
  processor = getattr(transformers, processor_class)(size={'height': size, 'width': size}, crop_size=size)
  processor.save_pretrained(folder)
  images = np.random.RandomState(seed).randn(2, size, size, 3).astype(np.float32)
  with torch.no_grad():
    result = model(pixel_values=torch.from_numpy(images).permute(0, 3, 1, 2))
  ref = {k: v.numpy() for k, v in result.items() if isinstance(v, torch.Tensor)}
  if row in HF_RESIZED:
    big = HF_RESIZED[row]
    ref['resized_images'] = np.random.RandomState(seed).randn(2, big, big, 3).astype(np.float32)
    pixels = torch.from_numpy(ref['resized_images']).permute(0, 3, 1, 2)
    kwargs = dict(interpolate_pos_encoding=True) if row == 'hf_vit_model' else {}
    with torch.no_grad():
      ref['resized_pooler_output'] = model(pixel_values=pixels, **kwargs).pooler_output.numpy()
  np.savez_compressed(
    os.path.join(folder, 'reference.npz'),
    torch=torch.__version__,
    transformers=transformers.__version__,
    name=model_class,
    images=images,
    **ref,
  )
  print(row, model_class, {k: v.shape for k, v in ref.items()})


# SigLIP 2's image tower (NaFlex): a Linear on pre-cut patches (row, column, channel order, as its image processor
# cuts them) and a 4 x 4 position table resized to each image's patch grid (bilinear, antialiased).
SIGLIP2_ROWS = {'hf_siglip2': dict(intermediate_size=64, patch_size=8, num_patches=16)}
SIGLIP2_RESIZED = {'hf_siglip2': 48}


def siglip2_row(out: str, row: str, seed: int) -> None:
  config = transformers.Siglip2VisionConfig(**(HF_SMALL | SIGLIP2_ROWS[row]))
  model = transformers.Siglip2VisionModel(config).eval()
  randomise(model, seed)
  folder = os.path.join(out, row)
  model.save_pretrained(folder, safe_serialization=True)

  def run(images):
    n, size, p = len(images), images.shape[1], config.patch_size
    g = size // p
    patches = images.reshape(n, g, p, g, p, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, g * g, p * p * 3)
    with torch.no_grad():
      return model(
        pixel_values=torch.from_numpy(patches),
        pixel_attention_mask=torch.ones(n, g * g, dtype=torch.long),
        spatial_shapes=torch.tensor([[g, g]] * n),
      )

  images = np.random.RandomState(seed).randn(2, 32, 32, 3).astype(np.float32)
  result = run(images)
  ref = {'last_hidden_state': result.last_hidden_state.numpy(), 'pooler_output': result.pooler_output.numpy()}
  big = SIGLIP2_RESIZED[row]
  ref['resized_images'] = np.random.RandomState(seed).randn(2, big, big, 3).astype(np.float32)
  ref['resized_pooler_output'] = run(ref['resized_images']).pooler_output.numpy()
  np.savez_compressed(
    os.path.join(folder, 'reference.npz'),
    torch=torch.__version__,
    transformers=transformers.__version__,
    name='Siglip2VisionModel',
    images=images,
    **ref,
  )
  print(row, {k: v.shape for k, v in ref.items()})


def transformers_video_row(out: str, row: str, seed: int) -> None:
  """A video classifier's folder and reference.npz: `videos` (clips, NTHWC) and the model's `logits` on them."""
  model_class, config_class, processor_class, overrides = HF_VIDEO_ROWS[row]
  config = getattr(transformers, config_class)(**(HF_SMALL | HF_VIDEO | overrides))
  model = getattr(transformers, model_class)(config).eval()
  randomise(model, seed)
  folder = os.path.join(out, row)
  model.save_pretrained(folder, safe_serialization=True)
  height, width = config.image_size
  size = {'height': height, 'width': width}
  getattr(transformers, processor_class)(size=size, crop_size=size).save_pretrained(folder)
  videos = np.random.RandomState(seed).randn(2, config.num_frames, height, width, 3).astype(np.float32)
  with torch.no_grad():
    logits = model(pixel_values=torch.from_numpy(videos).permute(0, 1, 4, 2, 3)).logits.numpy()
  np.savez_compressed(
    os.path.join(folder, 'reference.npz'),
    torch=torch.__version__,
    transformers=transformers.__version__,
    name=model_class,
    videos=videos,
    logits=logits,
  )
  print(row, model_class, logits.shape)


# V-JEPA 2 rows: clips of 4 frames of 24 x 24, tubelets 2 x 8 x 8 (a 2 x 3 x 3 grid); heads 26 wide, so that each
# axis turns 8 channels at 4 rates (pairs at two rates: V-JEPA 2's arithmetic) and 2 channels are left unturned. The
# classifier is also run built at crop_size 40 on 6-frame clips (another grid; transformers numbers positions with
# the config's crop_size). A VJEPA2Model (backbone and predictor) gives last_hidden_state.
VJEPA2 = dict(
  hidden_size=52,
  num_attention_heads=2,
  num_hidden_layers=2,
  mlp_ratio=2.0,
  patch_size=8,
  tubelet_size=2,
  crop_size=24,
  frames_per_clip=4,
  num_pooler_layers=2,
  pred_hidden_size=24,
  pred_num_attention_heads=2,
  pred_num_hidden_layers=1,
  num_labels=10,
)
# SigLIP's image classifiers: the mean of the image tower's tokens after its final norm, classified (the tower's
# attention-pool head is saved but unused). SigLIP at a fixed size (SiglipImageProcessor); SigLIP 2 NaFlex
# (Siglip2ImageProcessor: each image at its own patch grid, at most max_num_patches, padded and masked): logits at
# the table's 4 x 4 grid and at a 2 x 6 one (12 patches, 4 of padding), as its processor pads and masks them.
SIGLIP_CLASSIFIERS = {
  'hf_siglip_cls': ('SiglipForImageClassification', 'SiglipConfig', dict(image_size=32, patch_size=8)),
  'hf_siglip2_cls': ('Siglip2ForImageClassification', 'Siglip2Config', dict(patch_size=8, num_patches=16)),
}


def siglip_classifier_row(out: str, row: str, seed: int) -> None:
  model_class, config_class, vision = SIGLIP_CLASSIFIERS[row]
  text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=64)
  vision = HF_SMALL | dict(intermediate_size=64) | vision
  config = getattr(transformers, config_class)(vision_config=vision, text_config=text, num_labels=10)
  model = getattr(transformers, model_class)(config).eval()
  randomise(model, seed)
  folder = os.path.join(out, row)
  model.save_pretrained(folder, safe_serialization=True)
  rng, ref = np.random.RandomState(seed), {}
  if row == 'hf_siglip_cls':
    transformers.SiglipImageProcessor(size={'height': 32, 'width': 32}).save_pretrained(folder)
    ref['images'] = rng.randn(2, 32, 32, 3).astype(np.float32)
    with torch.no_grad():
      ref['logits'] = model(pixel_values=torch.from_numpy(ref['images']).permute(0, 3, 1, 2)).logits.numpy()
  else:
    transformers.Siglip2ImageProcessor(patch_size=8, max_num_patches=16).save_pretrained(folder)
    for key, (h, w) in (('', (4, 4)), ('wide_', (2, 6))):
      images = rng.randn(2, 8 * h, 8 * w, 3).astype(np.float32)
      patches = images.reshape(2, h, 8, w, 8, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, h * w, 8 * 8 * 3)
      mask = np.zeros((2, 16), np.int64)
      mask[:, : h * w] = 1
      padded = np.zeros((2, 16, patches.shape[-1]), np.float32)
      padded[:, : h * w] = patches
      with torch.no_grad():
        logits = model(
          pixel_values=torch.from_numpy(padded),
          pixel_attention_mask=torch.from_numpy(mask),
          spatial_shapes=torch.tensor([[h, w]] * 2),
        ).logits
      ref[f'{key}images'], ref[f'{key}logits'] = images, logits.numpy()
  np.savez_compressed(
    os.path.join(folder, 'reference.npz'),
    torch=torch.__version__,
    transformers=transformers.__version__,
    name=model_class,
    **ref,
  )
  print(row, {k: v.shape for k, v in ref.items()})


VJEPA2_ROWS = {'hf_vjepa2_cls': 'VJEPA2ForVideoClassification', 'hf_vjepa2': 'VJEPA2Model'}


def vjepa2_row(out: str, row: str, seed: int) -> None:
  config = transformers.VJEPA2Config(**VJEPA2)
  model = getattr(transformers, VJEPA2_ROWS[row])(config).eval()
  randomise(model, seed)
  folder = os.path.join(out, row)
  model.save_pretrained(folder, safe_serialization=True)
  transformers.VJEPA2VideoProcessor(crop_size=config.crop_size).save_pretrained(folder)
  rs = np.random.RandomState(seed)
  ref = {'videos': rs.randn(2, 4, 24, 24, 3).astype(np.float32), 'resized_videos': rs.randn(2, 6, 40, 40, 3)}
  ref['resized_videos'] = ref['resized_videos'].astype(np.float32)

  def run(m, videos):
    with torch.no_grad():
      result = m(pixel_values_videos=torch.from_numpy(videos).permute(0, 1, 4, 2, 3))
    return (result.logits if row == 'hf_vjepa2_cls' else result.last_hidden_state).numpy()

  key = 'logits' if row == 'hf_vjepa2_cls' else 'last_hidden_state'
  ref[key] = run(model, ref['videos'])
  other = getattr(transformers, VJEPA2_ROWS[row])(transformers.VJEPA2Config(**(VJEPA2 | dict(crop_size=40)))).eval()
  other.load_state_dict(model.state_dict())
  ref[f'resized_{key}'] = run(other, ref['resized_videos'])
  np.savez_compressed(
    os.path.join(folder, 'reference.npz'),
    torch=torch.__version__,
    transformers=transformers.__version__,
    name=VJEPA2_ROWS[row],
    **ref,
  )
  print(row, {k: v.shape for k, v in ref.items()})


# Folders with a head, and the images their eval pipelines read: image.png at the models' 32 x 32 (timm's pipeline at
# crop_pct 1: the identity, but for EVA-02's 28) and image_large.png, 40 x 48, which each pipeline resizes and crops
# (timm's at the folder's own crop_pct) to the model's size: references ROW.npy and ROW_large.npy.
PREDICT = (
  'vit',
  'deit_distilled',
  'clip_ft',
  'hf_vit',
  'rope_mixed_ape',
  'rope_sbb',
  'dinov3',
  'eva02_tiny',
  'eva02_base',
  'hf_dinov2_cls',
  'hf_dinov2_reg_cls',
  'hf_siglip_cls',
  'hf_siglip2_cls',
)
# image_wide.png, 24 x 64: upsampled by the fixed-size pipelines; SigLIP 2's NaFlex reads it at a 2 x 6 patch grid.
PREDICT_IMAGES = {
  'image.png': ((32, 32), 100, ''),
  'image_large.png': ((40, 48), 101, '_large'),
  'image_wide.png': ((24, 64), 102, '_wide'),
}


def predict_references(out: str, only: list[str]) -> None:
  """Every PREDICT row's references and the video ones, or those of the rows `only` names (the images kept)."""
  from PIL import Image

  folder = os.path.join(out, 'predict')
  os.makedirs(folder, exist_ok=True)
  for file, (shape, seed, suffix) in PREDICT_IMAGES.items():
    path = os.path.join(folder, file)
    if not only or not os.path.exists(path):
      Image.fromarray(np.random.RandomState(seed).randint(0, 256, (*shape, 3), np.uint8)).save(path)
    image = Image.open(path).convert('RGB')
    for row in [r for r in PREDICT if not only or r in only]:
      if row in ROWS:
        name, overrides = ROWS[row]
        size = overrides['img_size']
        overlay = dict(input_size=(3, size, size)) | (dict(crop_pct=1.0) if suffix == '' else {})
        saved = json.load(open(os.path.join(out, row, 'config.json')))['pretrained_cfg']
        overlay = {k: saved[k] for k in ('crop_pct', 'interpolation', 'mean', 'std')} | overlay
        model = timm.create_model(name, pretrained_cfg_overlay=overlay, **(SMALL | overrides)).eval()
        model.load_state_dict(safetensors.torch.load_file(os.path.join(out, row, 'model.safetensors')))
        transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
        pixels = transform(image)[None]
      else:
        model = transformers.AutoModelForImageClassification.from_pretrained(os.path.join(out, row)).eval()
        processor = transformers.AutoImageProcessor.from_pretrained(os.path.join(out, row))
        inputs = processor(images=image, return_tensors='pt')  # SigLIP 2's: patches, their mask and grid too.
        pixels = inputs['pixel_values']
      with torch.no_grad():
        logits = model(pixels) if row in ROWS else model(**inputs)
      logits = logits if isinstance(logits, torch.Tensor) else logits.logits
      probabilities = torch.softmax(logits, -1).numpy()
      np.save(os.path.join(folder, f'{row}{suffix}.npy'), probabilities)
      print(row, file, tuple(pixels.shape), probabilities.shape, probabilities.max())
  if not only:
    predict_video_references(out, folder)


# Clips for the video rows (PNG-coded .mov: lossless RGB, so that every decoder gives the same frames): 6 frames, so
# that num_frames=4 are sampled, at the folders' 16 x 24 (the identity) and at 24 x 40 (read with the shorter side
# resized to 16 and the centre cropped to 16 x 24: PREDICT_VIDEO_RESIZE overrides the folder's size).
PREDICT_VIDEOS = {'clip.mov': (6, 16, 24), 'clip_large.mov': (6, 24, 40)}
PREDICT_VIDEO_RESIZE = {'shortest_edge': 16}


def write_video(path: str, frames: np.ndarray) -> None:
  import av

  with av.open(path, 'w') as container:
    stream = container.add_stream('png', rate=8)
    stream.height, stream.width = frames.shape[1:3]
    stream.pix_fmt = 'rgb24'
    for frame in frames:
      container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format='rgb24')))
    container.mux(stream.encode())


def predict_video_references(out: str, folder: str) -> None:
  """Each video row's probabilities on each clip as transformers' video-classification pipeline computes them: the
  folder's video processor (AutoVideoProcessor) sampling num_frames frames evenly (do_sample_frames: frame
  i * frames // num_frames) from the decoded clip, then the model and a softmax. The pipeline itself decodes files
  only with torchcodec: here PyAV decodes them, as ours does."""
  import av

  rs = np.random.RandomState(101)
  for name, shape in PREDICT_VIDEOS.items():
    write_video(os.path.join(folder, name), rs.randint(0, 256, (*shape, 3), np.uint8))
  for row in HF_VIDEO_ROWS:
    model = transformers.AutoModelForVideoClassification.from_pretrained(os.path.join(out, row)).eval()
    processor = transformers.AutoVideoProcessor.from_pretrained(os.path.join(out, row))
    for name in PREDICT_VIDEOS:
      with av.open(os.path.join(folder, name)) as container:
        frames = np.stack([f.to_ndarray(format='rgb24') for f in container.decode(video=0)])
      size = PREDICT_VIDEO_RESIZE if name == 'clip_large.mov' else None
      kwargs = dict(num_frames=model.config.num_frames, do_sample_frames=True, return_tensors='pt')
      pixels = processor(frames, **kwargs, **(dict(size=size) if size else {}))['pixel_values']
      with torch.no_grad():
        probabilities = torch.softmax(model(pixel_values=pixels).logits, -1).numpy()
      file = f'{row}_{os.path.splitext(name)[0]}.npy'
      np.save(os.path.join(folder, file), probabilities)
      print(file, type(processor).__name__, tuple(pixels.shape), probabilities.max())


def predict_vjepa2_reference(out: str) -> None:
  """The V-JEPA 2 classifier's probabilities on clip_large.mov (6 frames of 24 x 40) as VJEPA2VideoProcessor reads it
  with its shorter side at 24 (the identity) and the central 24 x 24 crop, 4 frames sampled evenly."""
  import av

  folder, row = os.path.join(out, 'predict'), 'hf_vjepa2_cls'
  model = transformers.VJEPA2ForVideoClassification.from_pretrained(os.path.join(out, row)).eval()
  processor = transformers.AutoVideoProcessor.from_pretrained(os.path.join(out, row))
  with av.open(os.path.join(folder, 'clip_large.mov')) as container:
    frames = np.stack([f.to_ndarray(format='rgb24') for f in container.decode(video=0)])
  kwargs = dict(num_frames=4, do_sample_frames=True, size={'shortest_edge': 24}, return_tensors='pt')
  pixels = processor(frames, **kwargs)['pixel_values_videos']
  with torch.no_grad():
    probabilities = torch.softmax(model(pixel_values_videos=pixels).logits, -1).numpy()
  np.save(os.path.join(folder, f'{row}_clip_large.npy'), probabilities)
  print(row, type(processor).__name__, tuple(pixels.shape), probabilities.max())


def export_references(out: str, folders: str) -> None:
  images = torch.from_numpy(np.load(os.path.join(out, 'export', 'images.npy'))).permute(0, 3, 1, 2)
  videos_file = os.path.join(out, 'export', 'videos.npy')
  if not os.path.exists(videos_file):
    np.save(videos_file, np.random.RandomState(0).randint(0, 256, (2, 4, 16, 24, 3), np.uint8))
  clips = np.load(videos_file)
  videos = torch.from_numpy(clips.astype(np.float32) / 127.5 - 1).permute(0, 1, 4, 2, 3)  # (B, T, C, H, W)
  for name in sorted(os.listdir(folders)):
    folder = os.path.join(folders, name)
    with open(os.path.join(folder, 'config.json')) as f:
      config = json.load(f)
    if 'model_type' in config:  # Ours as a transformers classifier: every tensor taken, none left.
      (architecture,) = config['architectures']
      model, loading = getattr(transformers, architecture).from_pretrained(folder, output_loading_info=True)
      assert not any(loading.values()), loading
      pixels = images
      if config['model_type'] != 'vit':  # The folder's image processor on the uint8 frames: our inputs.
        processor = transformers.AutoImageProcessor.from_pretrained(folder)
        processed = processor([list(clip) for clip in clips], return_tensors='pt')['pixel_values']
        print(
          name, type(processor).__name__, 'max |processor - x / 127.5 - 1|', float((processed - videos).abs().max())
        )
        assert torch.allclose(processed, videos, atol=1e-6)
        pixels = videos
      with torch.no_grad():
        logits = model.eval()(pixel_values=pixels).logits.numpy()
      np.save(os.path.join(out, 'export', f'transformers_logits_{name}.npy'), logits)
      print(name, architecture, logits.shape)
      continue
    file = os.path.join(folder, 'model.safetensors')
    overlay = dict(file=file, num_classes=config['num_classes'])
    model = timm.create_model(
      config['architecture'], pretrained=True, pretrained_cfg_overlay=overlay, **config['model_args']
    ).eval()
    state = model.state_dict()
    missing = [k for k, v in safetensors.torch.load_file(file).items() if not torch.equal(state[k], v)]
    assert not missing and len(state) == len(safetensors.torch.load_file(file)), missing
    with torch.no_grad():
      logits = model(images).numpy()
    np.save(os.path.join(out, 'export', f'timm_logits_{name}.npy'), logits)
    print(name, config['architecture'], logits.shape)


# Pixels of resizes (predict/resize.npz, tests/test_pretrained_commands.py): random uint8 images resized by Pillow
# (timm's pipeline; every filter) and by torchvision's uint8 tensor resize (transformers' image processors), up and
# down on each axis, with both of Pillow's pass orders.
RESIZE_FILTERS = {'pil': ('box', 'bilinear', 'hamming', 'bicubic', 'lanczos'), 'torchvision': ('bilinear', 'bicubic')}


def resize_references(out: str) -> None:
  from PIL import Image
  from torchvision.transforms import InterpolationMode
  from torchvision.transforms.v2 import functional

  rng, cases = np.random.default_rng(7), {}
  shapes = [(17, 23, 9, 30), (30, 12, 5, 11), (9, 9, 20, 14), (25, 40, 22, 13), (12, 31, 12, 8), (40, 6, 16, 6)]
  for i, (h, w, height, width) in enumerate(shapes):
    x = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    cases[f'{i}_image'] = x
    for library, methods in RESIZE_FILTERS.items():
      for method in methods:
        if library == 'pil':
          y = np.asarray(Image.fromarray(x).resize((width, height), getattr(Image.Resampling, method.upper())))
        else:
          mode = getattr(InterpolationMode, method.upper())
          tensor = torch.from_numpy(x.copy()).permute(2, 0, 1)
          y = functional.resize(tensor, [height, width], interpolation=mode, antialias=True).permute(1, 2, 0).numpy()
        cases[f'{i}_{library}_{method}'] = y
  import PIL
  import torchvision

  np.savez_compressed(
    os.path.join(out, 'predict', 'resize.npz'), pillow=PIL.__version__, torchvision=torchvision.__version__, **cases
  )
  print(len(cases), 'resize cases')


# The image and video configs transformers_layout and vjepa2_layout read (model_type -> config class): their fields, for
# test_every_transformers_config_field_is_read_shown_by_the_tensors_or_neutral.
IMAGE_CONFIGS = {
  'vit': 'ViTConfig',
  'dinov2': 'Dinov2Config',
  'dinov2_with_registers': 'Dinov2WithRegistersConfig',
  'clip_vision_model': 'CLIPVisionConfig',
  'siglip_vision_model': 'SiglipVisionConfig',
  'siglip2_vision_model': 'Siglip2VisionConfig',
  'dinov3_vit': 'DINOv3ViTConfig',
  'clip': 'CLIPConfig',
  'siglip': 'SiglipConfig',
  'siglip2': 'Siglip2Config',
  'vivit': 'VivitConfig',
  'videomae': 'VideoMAEConfig',
  'vjepa2': 'VJEPA2Config',
}


def config_fields(out: str) -> None:
  fields = {name: sorted(getattr(transformers, c)().to_dict()) for name, c in IMAGE_CONFIGS.items()}
  with open(os.path.join(out, 'transformers_fields.json'), 'w') as f:
    json.dump({'transformers': transformers.__version__} | fields, f, indent=1)


def main(out: str, only: list[str]) -> None:
  if only[:1] == ['fields']:
    return config_fields(out)
  if only[:1] == ['resize']:
    return resize_references(out)
  if only[:1] == ['predict']:
    return predict_references(out, only[1:])
  if only[:1] == ['predict_vjepa2']:
    return predict_vjepa2_reference(out)
  if only[:1] == ['export']:
    return export_references(out, only[1])
  for row in HF_ROWS:
    if not only or row in only:
      transformers_row(out, row, seed_of(row))
  for row in HF_VIDEO_ROWS:
    if not only or row in only:
      transformers_video_row(out, row, seed_of(row))
  for row in SIGLIP2_ROWS:
    if not only or row in only:
      siglip2_row(out, row, seed_of(row))
  for row in VJEPA2_ROWS:
    if not only or row in only:
      vjepa2_row(out, row, seed_of(row))
  for row in SIGLIP_CLASSIFIERS:
    if not only or row in only:
      siglip_classifier_row(out, row, seed_of(row))
  for row, (name, overrides) in ROWS.items():
    if only and row not in only:
      continue
    seed = seed_of(row)
    model = timm.create_model(name, pretrained=False, **(SMALL | overrides)).eval()
    randomise(model, seed)
    folder = os.path.join(out, row)
    timm.models.save_for_hf(model, folder, safe_serialization=True)
    size = overrides['img_size']
    images = np.random.RandomState(seed).randn(2, size, size, 3).astype(np.float32)
    ref = {'images': images, **outputs(model, images)}
    if row in RESIZED:
      big = RESIZED[row]
      other = timm.create_model(name, pretrained=False, **(SMALL | overrides | dict(img_size=big))).eval()
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
  main(sys.argv[1], sys.argv[2:])
