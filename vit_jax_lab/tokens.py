"""Special token ids, the same in every vocabulary (data/text.py) and every decoder (decode.py)."""

PAD, BOS, EOS, UNK = 0, 1, 2, 3
