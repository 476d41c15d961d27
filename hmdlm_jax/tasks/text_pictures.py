"""Pictures of text samples: a token timeline coloured by reveal step, outlined by level.

Conventions as hmdlm_jax/visualize.py. Rows are drawn up to and including their first EOS ([SEP]),
where the sample is cut (docs/method.md §6).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from matplotlib import patches as mpatches
from matplotlib.figure import Figure
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import visualize
from hmdlm_jax.data import tokenizers as tokenizers_lib


def plot_text_reveal(token_strings: Sequence[str], reveal_step: np.ndarray, levels: np.ndarray,
                     num_steps: int, *, given: np.ndarray | None = None, num_levels: int = 2,
                     chars_per_line: int = 60, title: str | None = None,
                     cmap: str = visualize.REVEAL_CMAP,
                     path: str | os.PathLike[str] | None = None) -> Figure:
  """A token timeline: each token a box coloured by its reveal step, outlined by its level.

  Tokens are laid out left to right in a monospace font and wrapped at `chars_per_line` characters.
  Tokens of the top level (K-1) are also written in bold. Given tokens (prompt) are grey.

  Args:
    token_strings: L strings, one per position (e.g. WordPiece pieces).
    reveal_step: int [L], n in 1..T at generated positions.
    levels: int [L] in 0..K-1.
    num_steps: T.
    given: optional bool [L] (prompt positions).
    num_levels: K.
    chars_per_line: wrap width in characters.
    title: optional title.
    cmap: reveal colormap.
    path: optional file to write.

  Returns:
    The figure; token i is the `Rectangle` with gid f'token-{i}'.
  """
  strings = [str(s) for s in token_strings]
  length = len(strings)
  steps = np.asarray(reveal_step).reshape(-1)
  levs = np.asarray(levels).reshape(-1)
  if steps.shape != (length,) or levs.shape != (length,):
    raise ValueError(f'token_strings ({length}), reveal_step {np.shape(reveal_step)} and levels '
                     f'{np.shape(levels)} must all have L = {length} entries')
  if chars_per_line < 1:
    raise ValueError(f'chars_per_line must be >= 1, got {chars_per_line}')
  given_arr = np.zeros(length, bool) if given is None else visualize.check_given(given, (length,))
  faces = visualize.reveal_colors(steps, num_steps, cmap, given_arr)
  edges, widths = visualize.level_outline(levs, num_levels)

  # Layout in character units: box width = len + padding, wrap when the line would overflow.
  pad, gap, line_h = 0.6, 0.4, 1.6
  x, row, boxes = 0.0, 0, []
  for s in strings:
    w = max(len(s), 1) + pad
    if x > 0 and x + w > chars_per_line + pad:
      x, row = 0.0, row + 1
    boxes.append((x, row, w))
    x += w + gap
  num_rows = row + 1

  char_in = 0.11  # inches per character cell at the font size below
  fig = visualize.new_figure((max(chars_per_line * char_in + 1.0, 4.0),
                              num_rows * line_h * 0.22 + 1.6))
  ax = fig.subplots()
  for i, ((x0, r, w), s) in enumerate(zip(boxes, strings)):
    y0 = -(r * line_h)
    if given_arr[i]:
      edge, lw = visualize.GIVEN_EDGE_COLOR, visualize.GIVEN_LINEWIDTH
    else:
      edge, lw = tuple(edges[i]), float(widths[i])
    ax.add_patch(mpatches.Rectangle((x0, y0 - 1.0), w, 1.0, facecolor=tuple(faces[i]),
                                    edgecolor=edge, linewidth=lw, gid=f'token-{i}'))
    ax.text(x0 + w / 2, y0 - 0.5, s, ha='center', va='center', family='monospace', fontsize=8,
            color=visualize.text_color(faces[i]),
            fontweight='bold' if (levs[i] == num_levels - 1 and num_levels > 1) else 'normal')
  ax.set_xlim(-0.5, chars_per_line + pad + 0.5)
  ax.set_ylim(-(num_rows - 1) * line_h - 1.3, 0.3)
  ax.set_axis_off()
  if title:
    ax.set_title(title)
  visualize.reveal_colorbar(fig, [ax], num_steps, cmap, orientation='horizontal')
  visualize.level_legend(fig, num_levels)
  return visualize.finish(fig, path)


def save_sample_pictures(config: config_lib.Config, workdir: str | os.PathLike[str],
                         outputs: Any, *, decode_fn: Callable[[np.ndarray], Sequence[str]],
                         given: np.ndarray | None = None, eos_id: int | None = None,
                         max_pictures: int = 4, subdir: str = 'pictures') -> list[str]:
  """`text_reveal_{i}.png` of the first samples in DIR/subdir; returns the written paths.

  Args:
    config: the experiment config (model.num_levels, sample.num_steps).
    workdir: run directory (local path or `gs://...`).
    outputs: `SampleOutput` (tokens, levels, reveal_step [B, L]); jax or numpy arrays.
    decode_fn: token ids [L'] -> one string per position.
    given: bool [B, L] prompt positions; None = the sampler's convention `reveal_step == T + 1`.
    eos_id: a row is drawn up to and including its first `eos_id` (None: whole rows).
    max_pictures: how many samples to draw.
    subdir: folder inside workdir.
  """
  num_steps = int(config.sample.num_steps)
  num_levels = int(config.model.num_levels)
  rows = visualize.picture_rows(outputs, num_steps, given)
  out_dir = visualize.picture_dir(workdir, subdir)
  paths = []
  for i in range(min(int(max_pictures), rows.tokens.shape[0])):
    ids = rows.tokens[i]
    length = ids.shape[0]
    if eos_id is not None and np.any(ids == eos_id):
      length = int(np.argmax(ids == eos_id)) + 1
    path = out_dir / f'text_reveal_{i}.png'
    plot_text_reveal(list(decode_fn(ids[:length])), rows.reveal_step[i, :length],
                     rows.levels[i, :length], num_steps, given=rows.given[i, :length],
                     num_levels=num_levels,
                     title=f'sample {i} (K = {num_levels}, T = {num_steps})', path=path)
    paths.append(os.fspath(path))
  return paths


def save_record_pictures(config: config_lib.Config, workdir: str | os.PathLike[str],
                         records: Sequence[dict[str, Any]], *,
                         tokenizer: tokenizers_lib.TextTokenizer | None = None,
                         max_pictures: int = 4, subdir: str = 'pictures') -> list[str]:
  """`save_sample_pictures` for the JSON records of sample mode ('tokens', 'levels',
  'reveal_step', 'given'); returns the written paths.

  Tokens are drawn as the tokenizer's pieces (`tokenizer.hf.convert_ids_to_tokens`), cut after
  the first EOS ([SEP]); `tokenizer` defaults to `tokenizers.tokenizer_from_config(config.data)`.
  """
  records = list(records)[:int(max_pictures)]
  if not records:
    return []
  if tokenizer is None:
    tokenizer = tokenizers_lib.tokenizer_from_config(config.data)
  field = lambda name: visualize.record_field(records, name).astype(np.int64)
  outputs = visualize.PictureRows(field('tokens'), field('levels'), field('reveal_step'),
                                  field('given').astype(bool))

  def decode(ids: np.ndarray) -> list[str]:
    return list(tokenizer.hf.convert_ids_to_tokens([int(i) for i in ids]))

  return save_sample_pictures(config, workdir, outputs, decode_fn=decode, given=outputs.given,
                              eos_id=int(tokenizer.eos_id), max_pictures=max_pictures,
                              subdir=subdir)
