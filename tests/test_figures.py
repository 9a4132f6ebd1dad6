"""The figures of tools.track and tools.attention_map (matplotlib): their titles, legends and colour bars read back
from the figure objects, and the PNGs they write."""

import numpy as np
from PIL import Image

from vit_jax_lab.tools import attention_map, track


def texts(fig) -> dict[str, list[str]]:
  """Every title, axis label, legend entry and the figure title of `fig`."""
  return {
    'titles': [ax.get_title() for ax in fig.axes if ax.get_title()],
    'ylabels': [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()],
    'legend': [t.get_text() for legend in fig.legends for t in legend.get_texts()],
    'suptitle': [fig.get_suptitle()],
  }


def tracking_arrays(frames=6, size=16, grid=4):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 255, (frames, 20, 30, 1), np.uint8)
  truth = np.tile(np.array([[4.0, 5.0, 8.0, 6.0]]), (frames, 1))
  truth[2] = np.nan  # A frame without the target.
  predicted = truth + 1.0
  predicted[2] = [5.0, 6.0, 8.0, 6.0]
  crops = rng.uniform(size=(frames, size, size, 1))
  attention = rng.dirichlet(np.ones(grid * grid), size=(2, frames)).reshape(2, frames, grid, grid)
  return images, predicted, truth, crops, attention[0], attention[1]


def test_track_figure_says_what_its_rows_colours_and_scales_mean(tmp_path):
  frames, predicted, truth, crops, cls, reg = tracking_arrays()
  path = str(tmp_path / 'track.png')
  regions = np.tile(np.array([[1.0, 2.0, 14.0, 14.0]]), (len(frames), 1))
  fig = track.draw(path, frames, predicted, truth, crops, cls, reg, 'sequence 2 of test: success AUC 0.500', regions)
  got = texts(fig)
  assert got['titles'] == [f'frame {t}' for t in range(6)]  # 6 frames, all shown.
  assert got['ylabels'][:3] == ['frame', "regression token's\nattention", "class token's\nattention"]
  assert got['ylabels'][3:] == ['attention share'] * 2  # A colour bar per attention row.
  assert got['legend'] == ['predicted box', 'true box', 'search crop (rows 2, 3)']
  assert got['suptitle'] == ['sequence 2 of test: success AUC 0.500']
  boxes = [p for ax in fig.axes[:6] for p in ax.patches]
  assert len(boxes) == 17  # Search regions, predicted and true boxes, but no true box where the target is absent.
  # The search region dotted, under the boxes; the true box dashed, drawn on top.
  assert [p.get_linestyle() for p in fig.axes[0].patches] == [':', '-', '--']
  assert fig.axes[0].patches[0].get_bbox().bounds == (1.0, 2.0, 14.0, 14.0)
  image = np.asarray(Image.open(path))
  assert image.shape[2] in (3, 4) and image.std() > 0
  # An animation's frame is one column: its legend of three entries stacked, inside the figure (in one row it was
  # cut at both edges).
  fig = track.draw(str(tmp_path / 'seq.gif'), frames, predicted, truth, crops, cls, reg, 'sequence 2', regions)
  fig.canvas.draw()
  legend = fig.legends[0].get_window_extent()
  assert legend.x0 >= 0 and legend.x1 <= fig.bbox.width and legend.height > 2.5 * legend.width / 8
  # A user's video has no true boxes: no such legend entry; a GIF holds every frame.
  fig = track.draw(str(tmp_path / 'clip.gif'), frames, predicted, None, crops, cls, reg, 'clip.mp4')
  assert texts(fig)['legend'] == ['predicted box']
  assert Image.open(tmp_path / 'clip.gif').n_frames == 6
  # Every frame of the animation on one colour scale: the highest share over all frames.
  scale = [im.get_clim() for ax in fig.axes for im in ax.images if im.get_cmap().name == 'inferno']
  assert scale == [(0.0, float(reg.max())), (0.0, float(cls.max()))]


def test_attention_figure_titles_each_panel_and_gives_each_a_colour_bar(tmp_path):
  rng = np.random.default_rng(1)
  maps = [rng.dirichlet(np.ones(5), size=(2, 5)) for _ in range(3)]  # 3 layers, 2 heads, class token + 2x2 patches.
  image = rng.integers(0, 255, (8, 8, 3), np.uint8)
  fig = attention_map.figure(image, maps, True, (2, 2), -1, 'predicted cat (81%)\ntrue cat')
  got = texts(fig)
  assert got['titles'] == [
    'predicted cat (81%)\ntrue cat',
    'rollout over all 3 layers',
    'layer 2, head 0',
    'layer 2, head 1',
  ]
  assert got['ylabels'] == ["class token's attention"] * 3  # The colour bars of rollout and both heads.
  assert "class token's attention" in got['suptitle'][0]
  patches_only = [rng.dirichlet(np.ones(4), size=(2, 4)) for _ in range(3)]  # No class token ('gap').
  without = attention_map.figure(image, patches_only, False, (2, 2), 0, 'x')
  assert texts(without)['titles'][2] == 'layer 0, head 0'
  assert texts(without)['ylabels'][0] == 'attention received (mean over queries)'
  fig.savefig(tmp_path / 'a.png')
  assert np.asarray(Image.open(tmp_path / 'a.png')).std() > 0
