"""Box geometry for tracking, shared by the input pipeline (TensorFlow), the task (JAX) and the metrics (NumPy).

A box is a tuple of its four coordinates (x, y, w, h): pixels, x to the right, y down, (x, y) the top-left
corner, each coordinate any array of the same shape. Functions use arithmetic operators only, so the same code
serves tf.Tensor, jax.Array and np.ndarray. A crop region is (x0, y0, side): the square a search or template
crop is cut from; a box inside a crop is in crop units (0..1 across the crop).
"""

from typing import Any

Box = tuple[Any, Any, Any, Any]
Region = tuple[Any, Any, Any]


def region(box: Box, factor: float) -> Region:
  """The square crop region of side factor * sqrt(w * h) centred on the box (STARK's and OSTrack's)."""
  x, y, w, h = box
  side = factor * (w * h) ** 0.5
  return x + w / 2 - side / 2, y + h / 2 - side / 2, side


def to_crop(box: Box, crop: Region) -> Box:
  """A frame box in the units of a crop region."""
  x, y, w, h = box
  x0, y0, side = crop
  return (x - x0) / side, (y - y0) / side, w / side, h / side


def from_crop(box: Box, crop: Region) -> Box:
  """A box in crop units back in frame pixels: the inverse of `to_crop`."""
  x, y, w, h = box
  x0, y0, side = crop
  return x0 + x * side, y0 + y * side, w * side, h * side


def to_corners(box: Box) -> Box:
  """(x, y, w, h) -> (x1, y1, x2, y2)."""
  x, y, w, h = box
  return x, y, x + w, y + h


def from_corners(corners: Box) -> Box:
  """(x1, y1, x2, y2) -> (x, y, w, h)."""
  x1, y1, x2, y2 = corners
  return x1, y1, x2 - x1, y2 - y1


def to_centre(box: Box) -> Box:
  """(x, y, w, h) -> (cx, cy, w, h)."""
  x, y, w, h = box
  return x + w / 2, y + h / 2, w, h


def from_centre(box: Box) -> Box:
  """(cx, cy, w, h) -> (x, y, w, h)."""
  cx, cy, w, h = box
  return cx - w / 2, cy - h / 2, w, h


def crop_sample_points(crop: Region, size: int, index: Any) -> Any:
  """Frame coordinates (pixel centres at integers) that crop pixels `index` (0..size-1) sample along one axis,
  given the region's start and side on that axis: each crop pixel samples the frame at its own centre."""
  start, side = crop
  return start + (index + 0.5) * side / size - 0.5
