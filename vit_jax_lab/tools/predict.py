"""Runs a trained model on your own files: the top-k labels of images and videos, the decoded text of seq2seq runs.

python -m vit_jax_lab.tools.predict --workdir runs/vit_digits digit.png more_digits/ --top_k 3
python -m vit_jax_lab.tools.predict --workdir runs/vivit_fe clip_frames/ videos/ --out videos.jsonl
python -m vit_jax_lab.tools.predict --workdir runs/scan_simple 'jump twice and walk left'
python -m vit_jax_lab.tools.predict --workdir runs/scan_simple --lines commands.txt > actions.txt
python -m vit_jax_lab.tools.predict --config configs/vit/finetune.py:cifar10,B/16 --config.init_from=ViT-B_16.npz \
    --config.data.data_dir=/datasets/tfds cat.jpg

Every input goes through the run's own evaluation preprocessing (the task's `prepare` and `preprocess(train=False)`,
as `train.evaluate` applies them): a video is scored by the mean logits of its eval_clips x eval_crops views. An
image is a JPEG, PNG, WebP, BMP, GIF or TIFF file; a video a folder of frames (natural order: 2.png before 10.png)
or, with PyAV, a video file. A folder of images, or of videos, gives one JSON line per file: {"input": path,
"top_k": [[label, p], ...]} ({"input", "output"} for seq2seq). Labels are the class names of the run's dataset.

python -m vit_jax_lab.tools.predict --pretrained vit_base_patch16_224.augreg_in21k_ft_in1k/ cat.jpg

Weights: the newest checkpoint of --workdir (its parameter average with ema_decay, as evaluation uses), or, with
--config, those of --config.init_from (a release .npz or a run), loaded as training loads them. With --pretrained,
a timm or Hugging Face transformers classifier folder (config.json + model.safetensors) runs as it is: the ViT of
its shape, its label names (timm's label_names, transformers' id2label) and its own preprocessing (timm's
pretrained_cfg, transformers' preprocessor_config.json). A transformers video classifier folder (ViViT, VideoMAE)
runs as the ViViT of its shape on num_frames frames sampled evenly from each clip, as the library's video processor
samples them. A transformers Marian folder (opus-mt) translates its inputs as the library's greedy `generate` does
(its tokenizer, up to generation_config.json's max_length):

python -m vit_jax_lab.tools.predict --pretrained opus-mt-en-de/ 'the cat sits on the mat'

The model is compiled once, for batches of --batch_size (the last one padded).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any, TextIO

import jax

from vit_jax_lab import (
  config as config_lib,
  console,
  errors,
  parallel,
  tasks,
  train,
)
from vit_jax_lab.errors import ConfigError, check
from vit_jax_lab.tools import common
from vit_jax_lab.tools.predictors import Item, Predictor, Unreadable, collect
from vit_jax_lab.tools.pretrained import HubPredictor, kind_of, load_hub

DEFAULT_BATCH = {'image': 64, 'video': 8, 'text': 64}  # Inputs per compiled batch (videos: x their views).


# --- Loading a run ------------------------------------------------------------------------------------------------


def _config(args: argparse.Namespace, overrides: list[str]):
  """The run's config (or the given one), on one device, with batches of one for the trainer's checks."""
  config = common.config_of(args.workdir, args.config, overrides)
  if args.config is not None:
    check(
      config.init_from is not None,
      f'--config {args.config}: give the weights with --config.init_from=PATH (a .npz or a run); without them the '
      'model would predict with random ones',
    )
  config_lib.validate(common.one_device_one_example(config))
  predicts = tasks.get(config.task.name).predicts
  check(
    predicts in ('classes', 'text'),
    f'task.name={config.task.name!r} predicts {predicts}, and this command prints classes or text: a tracking run '
    'is drawn by python -m vit_jax_lab.tools.track and run on a split by python -m vit_jax_lab.tools.results',
  )
  return config


def _vocab_dir(config, workdir: str | None) -> str | None:
  """Where the run keeps a trained SentencePiece vocabulary: its workdir, or the run init_from names. Predicting
  must use the run's, never train another."""
  if config.data.vocab != 'sentencepiece':
    return workdir
  candidates = [workdir] if workdir else []
  if config.init_from and not config.init_from.endswith('.npz'):
    path = os.path.abspath(config.init_from)
    candidates += [path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))]
  for directory in candidates:
    if os.path.isfile(os.path.join(directory, 'sentencepiece.model')):
      return directory
  raise ConfigError(
    "data.vocab='sentencepiece': the run's trained vocabulary (sentencepiece.model in its workdir) is not there; "
    'give --workdir of the run, or --config.data.vocab=PATH/sentencepiece.model'
  )


def setup(args: argparse.Namespace, overrides: list[str], devices=None) -> train.Setup:
  """The model of --workdir (or --config and its init_from) built abstractly on one device, with its data's info:
  what it reads is known before any weight is."""
  config = _config(args, overrides)
  with contextlib.redirect_stdout(sys.stderr):  # Dataset preparation and init_from notes: not predictions.
    return train.setup(config, (devices or jax.devices())[:1], workdir=_vocab_dir(config, args.workdir))


def load(s: train.Setup, args: argparse.Namespace) -> Predictor:
  """The predictor of setup `s` with its evaluation parameters (the newest checkpoint, or init_from) on one device."""
  with contextlib.redirect_stdout(sys.stderr):
    params = common.params_of(s, args.workdir)
  labels = None
  if s.task.predicts == 'classes':
    labels = [str(n) for n in s.builder.info.features['label'].names]
  kind = s.task.input_kind(s.info)
  return Predictor(kind, s.config, s, jax.device_put(params, s.mesh.devices.flat[0]), labels, args.top_k)


# --- The command --------------------------------------------------------------------------------------------------


def _write(out: TextIO, item: Item, value: Any, jsonl: bool, classify: bool) -> None:
  if isinstance(value, Unreadable):
    console.say(f'error: {errors.foreign(value, 4096)}')
    if jsonl:
      out.write(json.dumps({'input': item.name, 'error': str(value)}, ensure_ascii=False) + '\n')
    return
  if jsonl:
    out.write(json.dumps({'input': item.name, 'top_k' if classify else 'output': value}, ensure_ascii=False) + '\n')
    return
  # File names, label names (a folder's, a hub config's) and decoded text come from files handed over: their
  # control characters are escaped, so none retitles or clears the terminal (JSON escapes them itself).
  name = errors.foreign(item.name, 4096)
  if classify:
    out.write(name + '\n' + ''.join(f'  {p:.4f}  {errors.foreign(label, 4096)}\n' for label, p in value))
  elif item.form == 'text':
    out.write(errors.foreign(value, 2**20) + '\n')
  else:
    out.write(f'{name}\t{errors.foreign(value, 2**20)}\n')


def _notes(predictor: Predictor, adapted: int) -> str | None:
  if not adapted:
    return None
  if isinstance(predictor, HubPredictor):
    return f"note: {adapted} inputs resized or cut to the folder's size, as its library's preprocessing does"
  if predictor.kind == 'text':
    return (
      f'note: {adapted} inputs have more than data.max_input_length={predictor.s.info.input_shape[0]} tokens (EOS '
      'included): cut to it, as evaluation cuts them'
    )
  height, width = predictor.s.info.input_shape[-3:-1]
  return (
    f"note: {adapted} inputs are not {height}x{width}, the size of the run's data, and its config resizes nothing "
    f'(data.image_size, data.resize_size): squashed to {height}x{width} first'
  )


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.predict', description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', help='a run: its config.json and newest checkpoint')
  parser.add_argument('--config', help='a config file, with --config.init_from=WEIGHTS, instead of --workdir')
  parser.add_argument(
    '--pretrained', help='a timm or transformers classifier folder, or a Marian one, run as it is (no config)'
  )
  parser.add_argument('--top_k', type=int, default=5, help='labels printed per input (classification)')
  parser.add_argument('--lines', help='a UTF-8 text file: one input per line (seq2seq models reading text)')
  parser.add_argument('--out', help='write JSON lines to this new file (default: stdout)')
  parser.add_argument('--batch_size', type=int, help='inputs per compiled batch (default: 64; videos 8)')
  args, rest = parser.parse_known_args(argv)
  inputs = rest[rest.index('--') + 1 :] if '--' in rest else []
  rest = rest[: rest.index('--')] if '--' in rest else rest
  overrides = [a for a in rest if a.startswith('--config.')]
  for a in rest:
    if not a.startswith('--config.'):
      check(
        not a.startswith('-') or os.path.exists(a),
        f'unrecognised option {a!r}: see --help; overrides look like --config.data.data_dir=DIR',
      )
      inputs.append(a)
  check(args.top_k >= 1, f'--top_k={args.top_k} must be a positive integer')
  check(args.batch_size is None or args.batch_size >= 1, f'--batch_size={args.batch_size} must be positive')
  check(inputs or args.lines, 'no inputs: give image or video files, folders of them, text (seq2seq), or --lines FILE')
  if args.out is not None:  # Never a file of the user's (nor one of the inputs) overwritten.
    common.check_new(args.out, makes_folder=True)
  parallel.enable_compilation_cache()
  start = time.perf_counter()
  if args.pretrained is not None:
    check(
      args.workdir is None and args.config is None and not overrides,
      '--pretrained DIR runs the folder as it is: give no --workdir, --config nor --config.KEY overrides',
    )
    items, folders = collect(kind_of(args.pretrained), inputs, args.lines)  # Before the weights are read.
    predictor = load_hub(args.pretrained, args.top_k)
  else:
    s = setup(args, overrides)
    items, folders = collect(s.task.input_kind(s.info), inputs, args.lines)  # Before the weights are read.
    predictor = load(s, args)
  loaded = time.perf_counter()
  batch = predictor.batch_size(min(args.batch_size or DEFAULT_BATCH[predictor.kind], len(items)))
  try:
    if args.out:
      os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    out = open(args.out, 'w', encoding='utf-8') if args.out else sys.stdout  # noqa: SIM115
  except OSError as e:
    raise ConfigError(f'--out {args.out}: cannot write it ({e.strerror})') from None
  failed = adapted = 0
  try:
    for item, value, changed in predictor.results(items, batch):
      failed += isinstance(value, Unreadable)
      adapted += changed
      _write(out, item, value, folders or args.out is not None, predictor.classify)
      out.flush()
  finally:
    if out is not sys.stdout:
      out.close()
  note = _notes(predictor, adapted)
  if note:
    print(note, file=sys.stderr)
  done, seconds = len(items) - failed, time.perf_counter() - loaded
  print(
    f'{done:,} of {len(items):,} inputs in {seconds:.1f}s ({done / seconds:.1f}/s, batches of {batch}, compiling '
    f'included; loading the run {loaded - start:.1f}s)' + (f'; wrote {args.out}' if args.out else ''),
    file=sys.stderr,
  )
  return 2 if failed else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
