"""Special token ids, the same in every vocabulary (data/text.py) and every decoder (decode.py)."""

PAD, BOS, EOS, UNK = 0, 1, 2, 3


def foreign_ids(size: int, pad: int, eos: int, unk: int) -> list[int]:
  """Our ids -> the ids of a vocabulary of `size` with its own pad, eos and unk ids and no BOS (Marian's: eos 0,
  unk 1, pad = decoder start = size - 1): PAD and BOS are its pad (the decoder starts from it), EOS and UNK its
  eos and unk, then its other ids in their order; so ours has size + 1 ids. One rule for the weights (the rows of
  the embedding and the logits) and the tokenizer, which must agree."""
  others = [i for i in range(size) if i not in (pad, eos, unk)]
  return [pad, pad, eos, unk, *others]
