"""Writes tests/data/pretrained/export/marian_*.npy and marian_export.json: what transformers does with the Marian
folder that `tools.export --format safetensors --layout transformers` writes of a tiny random seq2seq Transformer
(tests/test_pretrained_marian.py's random_transformer over export/marian_spm.model), which
test_export_gives_the_librarys_logits_and_translation compares ours with. Run the test module to write the folder,
then this in a separate PyTorch environment (torch, transformers 5, sentencepiece; never a project dependency):

  python tests/test_pretrained_marian.py /tmp/exported
  /work/torchenv/bin/python tests/data/pretrained/make_marian_export_reference.py /tmp/exported

In Marian's ids (the folder's vocab.json: eos 0, unk 1, pad = decoder start = vocab_size - 1):
  marian_input_ids, marian_attention_mask: `MarianTokenizer.from_pretrained` on SOURCES, padded.
  marian_decoder_input_ids, marian_labels_mask: its ids of TARGETS shifted right (decoder start first), and which
    positions are real.
  marian_logits: `MarianMTModel.from_pretrained`'s teacher-forced logits (batch, target length, vocab_size), float32.
  marian_generated: its `generate(num_beams=1, do_sample=False)` tokens (generation_config.json's max_length).
marian_export.json: the sentences, the tokenizer's source pieces, the decoded translations and the versions.
"""

import json
import os
import sys

import numpy as np
import sentencepiece as spm
import torch
import transformers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'export')
SOURCES = ['the cat runs in the park', 'a bird reads']  # Different lengths: the second is padded.
TARGETS = ['die katze rennt im park', 'ein vogel liest']


def main(folder: str) -> None:
  model = transformers.MarianMTModel.from_pretrained(folder).eval()
  tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
  pad = model.config.pad_token_id
  batch = tokenizer(SOURCES, text_target=TARGETS, padding=True, return_tensors='pt')
  labels = batch['labels']
  decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels.masked_fill(labels == pad, -100))
  with torch.no_grad():
    logits = model(
      input_ids=batch['input_ids'], attention_mask=batch['attention_mask'], decoder_input_ids=decoder_input_ids
    ).logits
    generated = model.generate(
      input_ids=batch['input_ids'], attention_mask=batch['attention_mask'], num_beams=1, do_sample=False
    )
  arrays = dict(
    input_ids=batch['input_ids'].numpy().astype(np.int32),
    attention_mask=batch['attention_mask'].numpy().astype(np.int32),
    decoder_input_ids=decoder_input_ids.numpy().astype(np.int32),
    labels_mask=(labels != pad).numpy(),
    logits=logits.numpy().astype(np.float32),
    generated=generated.numpy().astype(np.int32),
  )
  for name, array in arrays.items():
    np.save(os.path.join(OUT, f'marian_{name}.npy'), array)
  reference = {
    'sources': SOURCES,
    'targets': TARGETS,
    'source_pieces': [tokenizer.tokenize(s) for s in SOURCES],
    'translations': tokenizer.batch_decode(generated, skip_special_tokens=True),
    'versions': {
      'transformers': transformers.__version__,
      'torch': torch.__version__,
      'sentencepiece': spm.__version__,
    },
  }
  with open(os.path.join(OUT, 'marian_export.json'), 'w') as f:
    json.dump(reference, f, indent=1, ensure_ascii=False)
  print(json.dumps(reference, indent=1, ensure_ascii=False))
  print(generated.numpy())


if __name__ == '__main__':
  main(os.path.join(sys.argv[1], 'marian'))
