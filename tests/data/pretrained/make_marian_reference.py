"""Writes tests/data/pretrained/marian/: a tiny random-weight transformers MarianMTModel saved as an opus-mt style hub
folder (config.json, generation_config.json, model.safetensors, source.spm, target.spm, vocab.json,
tokenizer_config.json), and reference.npz with the library's own outputs, which tests/test_pretrained_marian.py
compares ours with. Run in a separate PyTorch environment (torch, transformers 5, sentencepiece; never a project
dependency):

  /work/torchenv/bin/python tests/data/pretrained/make_marian_reference.py

reference.npz (Marian's ids: eos 0, unk 1, pad = decoder start = vocab_size - 1):
  input_ids, attention_mask: the tokenizer's padded source ids of SOURCES.
  decoder_input_ids, labels_mask: the tokenizer's target ids of TARGETS shifted right (decoder start first), and
    which positions are real (the logits at padding are not compared).
  logits: teacher-forced logits (batch, target length, vocab_size) in float32.
  generated: `generate(num_beams=1, do_sample=False, max_length=MAX_LENGTH)` tokens, decoder start first.
reference.json: the source pieces, the decoded translations and the library's versions.
"""

import io
import json
import os
import tempfile

import numpy as np
import sentencepiece as spm
import torch
import transformers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'marian')
SOURCE_TEXT = [
  'the cat sits on the mat',
  'a dog runs in the park',
  'the bird sings a song',
  'my friend reads a book',
  'we walk to the river',
  'the sun is warm today',
]
TARGET_TEXT = [
  'die katze sitzt auf der matte',
  'ein hund rennt im park',
  'der vogel singt ein lied',
  'mein freund liest ein buch',
  'wir gehen zum fluss',
  'die sonne ist heute warm',
]
SOURCES = ['the cat runs to the park', 'a bird reads']  # Different lengths: the second is padded.
TARGETS = ['die katze rennt zum park', 'ein vogel liest']
MAX_LENGTH = 9  # Of generate, the decoder start included: 8 tokens.
EOS_BIAS = 5.5  # Added to </s>'s logit bias, so that one greedy translation ends before MAX_LENGTH.
SCALE = 0.3  # Of the random matrices: larger ones make the greedy translations repeat one token.


def train_spm(texts: list[str], size: int) -> bytes:
  """A SentencePiece model as opus-mt ships them (Marian's own special ids live in vocab.json, not here)."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts),
    model_writer=model,
    vocab_size=size,
    model_type='unigram',
    character_coverage=1.0,
    normalization_rule_name='identity',  # No normalisation table: a few KB, not 240.
    minloglevel=2,
  )
  return model.getvalue()


def main():
  os.makedirs(OUT, exist_ok=True)
  torch.manual_seed(0)
  source_spm, target_spm = train_spm(SOURCE_TEXT, 40), train_spm(TARGET_TEXT, 40)
  pieces = []
  for blob in (source_spm, target_spm):
    sp = spm.SentencePieceProcessor(model_proto=blob)
    pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]
  # opus-mt's vocab.json: </s> 0, <unk> 1, the pieces of both sides, <pad> last (the decoder start).
  vocab = {'</s>': 0, '<unk>': 1}
  for piece in pieces:
    vocab.setdefault(piece, len(vocab))
  vocab['<pad>'] = len(vocab)
  size = len(vocab)
  with tempfile.TemporaryDirectory() as tmp:
    paths = []
    for name, blob in (('source.spm', source_spm), ('target.spm', target_spm)):
      paths.append(os.path.join(tmp, name))
      with open(paths[-1], 'wb') as f:
        f.write(blob)
    with open(os.path.join(tmp, 'vocab.json'), 'w') as f:
      json.dump(vocab, f)
    tokenizer = transformers.MarianTokenizer(paths[0], paths[1], os.path.join(tmp, 'vocab.json'))
    tokenizer.save_pretrained(OUT)
  config = transformers.MarianConfig(
    vocab_size=size,
    decoder_vocab_size=size,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=64,
    activation_function='swish',  # opus-mt's.
    scale_embedding=True,
    pad_token_id=size - 1,
    eos_token_id=0,
    decoder_start_token_id=size - 1,
    forced_eos_token_id=None,  # Greedy as it is: no EOS forced at max_length, which our decoder does not do.
    share_encoder_decoder_embeddings=True,
    tie_word_embeddings=True,
  )
  model = transformers.MarianMTModel(config).eval()
  with torch.no_grad():  # Random everything, so a swapped norm, bias or embedding row shows.
    for name, p in model.named_parameters():
      if 'embed_positions' not in name:
        p.copy_(
          torch.randn_like(p) * (SCALE if p.ndim > 1 else 0.2) + (1.0 if name.endswith('layer_norm.weight') else 0)
        )
    model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    model.final_logits_bias[0, 0] += EOS_BIAS
  model.generation_config.bad_words_ids = [[size - 1]]  # As opus-mt's: the decoder never emits <pad>.
  model.generation_config.max_length = MAX_LENGTH
  model.generation_config.num_beams = 1
  model.save_pretrained(OUT)
  model = transformers.MarianMTModel.from_pretrained(OUT).eval()  # What a user loads.
  tokenizer = transformers.MarianTokenizer.from_pretrained(OUT)
  batch = tokenizer(SOURCES, text_target=TARGETS, padding=True, return_tensors='pt')
  labels = batch['labels']
  decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels.masked_fill(labels == size - 1, -100))
  with torch.no_grad():
    logits = model(
      input_ids=batch['input_ids'], attention_mask=batch['attention_mask'], decoder_input_ids=decoder_input_ids
    ).logits
    generated = model.generate(
      input_ids=batch['input_ids'],
      attention_mask=batch['attention_mask'],
      num_beams=1,
      do_sample=False,
      max_length=MAX_LENGTH,
    )
  np.savez(
    os.path.join(OUT, 'reference.npz'),
    input_ids=batch['input_ids'].numpy().astype(np.int32),
    attention_mask=batch['attention_mask'].numpy().astype(np.int32),
    decoder_input_ids=decoder_input_ids.numpy().astype(np.int32),
    labels_mask=(labels != size - 1).numpy(),
    logits=logits.numpy().astype(np.float32),
    generated=generated.numpy().astype(np.int32),
  )
  reference = {
    'sources': SOURCES,
    'targets': TARGETS,
    'source_pieces': [tokenizer.tokenize(s) for s in SOURCES],
    'translations': tokenizer.batch_decode(generated, skip_special_tokens=True),
    'target_texts': tokenizer.batch_decode(labels.masked_fill(labels == size - 1, 0), skip_special_tokens=True),
    'versions': {
      'transformers': transformers.__version__,
      'torch': torch.__version__,
      'sentencepiece': spm.__version__,
    },
  }
  with open(os.path.join(OUT, 'reference.json'), 'w') as f:
    json.dump(reference, f, indent=1, ensure_ascii=False)
  print(json.dumps(reference, indent=1, ensure_ascii=False))
  print(generated.numpy())


if __name__ == '__main__':
  main()
