"""TFRecord files read without TensorFlow. TensorBoard's event files (reporting.py) and TFDS's prepared record files
(data/grain_input.py) share the framing: each record is its length (8 bytes), that length's CRC (4), the data and
the data's CRC (4)."""

import struct
from typing import Iterator


class CutShort(Exception):
  """A file that ends inside a record: a crash or a full disk while it was written, a copy cut off."""


def records(path: str) -> Iterator[bytes]:
  """The records of the TFRecord file at `path`, in order (their CRCs are not checked); CutShort where the file ends
  inside one."""
  with open(path, 'rb') as f:
    while head := f.read(12):
      length = struct.unpack('<Q', head[:8])[0] if len(head) == 12 else -1
      data = f.read(length) if length >= 0 else b''
      if length < 0 or len(data) < length or len(f.read(4)) < 4:
        raise CutShort(path)
      yield data
