"""Pictures of Sudoku samples: every cell coloured by the step that revealed it, outlined by level.

Conventions as hmdlm_jax/visualize.py (reveal colours, level outlines); cells also show their level
number in a corner when K > 1. A quiz is 81 digits 0..9 with 0 = blank (a string or an array,
read by `data.sudoku_csv.as_digits`); model tokens are digit - 1 (0..8).
"""

from __future__ import annotations

import io
import os
from typing import Any, Sequence

from matplotlib import patches as mpatches
from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np
from PIL import Image

from hmdlm_jax import config as config_lib
from hmdlm_jax import visualize
from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv


def plot_sudoku_reveal(quiz: str | np.ndarray, tokens: np.ndarray, levels: np.ndarray,
                       reveal_step: np.ndarray, num_steps: int, title: str | None = None, *,
                       num_levels: int = sudoku.NUM_LEVELS,
                       solution: str | np.ndarray | None = None,
                       cmap: str = visualize.REVEAL_CMAP,
                       path: str | os.PathLike[str] | None = None) -> Figure:
  """A solved grid with every cell coloured by the step at which the sampler revealed it.

  Given cells are grey with a thin grey outline; generated cells get `reveal_colors` as face colour
  and `level_outline` of their (sampled) level as outline. Digits are drawn in every cell (bold for
  givens; red when `solution` is given and the digit is wrong).

  Args:
    quiz: the puzzle, 81 digits 0..9 (0 = blank), [81], [9, 9] or a string.
    tokens: int [81] sampled tokens 0..8 (digit - 1); at givens they must equal the quiz digit - 1.
    levels: int [81] levels in 0..K-1.
    reveal_step: int [81], n in 1..T at generated cells.
    num_steps: T.
    title: optional axes title.
    num_levels: K (6 for HMDLM Sudoku, 1 for MDLM).
    solution: optional true solution (81 digits) to mark wrong digits.
    cmap: reveal colormap.
    path: optional file to write.

  Returns:
    The figure. Cell (r, c) is the `Rectangle` with gid f'cell-{r}-{c}'.
  """
  fig = visualize.new_figure((5.6, 5.0))
  ax = fig.subplots()
  _draw_sudoku(ax, quiz, tokens, levels, reveal_step, num_steps, num_levels=num_levels,
               solution=solution, cmap=cmap, title=title)
  visualize.reveal_colorbar(fig, [ax], num_steps, cmap)
  visualize.level_legend(fig, num_levels)
  return visualize.finish(fig, path)


def plot_sudoku_reveal_comparison(hmdlm_out: Any, mdlm_out: Any, quiz: str | np.ndarray, *,
                                  num_steps: int, index: int = 0,
                                  hmdlm_num_levels: int = sudoku.NUM_LEVELS,
                                  mdlm_num_levels: int = 1,
                                  solution: str | np.ndarray | None = None,
                                  titles: tuple[str, str] = ('HMDLM', 'MDLM'),
                                  cmap: str = visualize.REVEAL_CMAP,
                                  path: str | os.PathLike[str] | None = None) -> Figure:
  """HMDLM and MDLM reveal orders side by side on the same puzzle.

  Args:
    hmdlm_out, mdlm_out: `SampleOutput`s (or anything with `tokens`, `levels`,
      `reveal_step` arrays of shape [B, 81] or [81]); row `index` is drawn. Any two runs on the same
      puzzle can be compared (e.g. two decodings of one model: set `mdlm_num_levels` and `titles`).
    quiz: the puzzle both were conditioned on (81 digits, 0 = blank).
    num_steps: T used by both samplers.
    index: which batch row to draw.
    hmdlm_num_levels: K of the left run.
    mdlm_num_levels: K of the right run (1 for MDLM).
    solution: optional true solution to mark wrong digits.
    titles: axes titles.
    cmap: reveal colormap.
    path: optional file to write.

  Returns:
    The figure; `fig.axes[0]` is HMDLM, `fig.axes[1]` MDLM.
  """
  fig = visualize.new_figure((10.6, 5.0))
  axes = fig.subplots(1, 2)
  for ax, out, k_levels, name in zip(axes, (hmdlm_out, mdlm_out),
                                     (hmdlm_num_levels, mdlm_num_levels), titles):
    tokens, levels, steps = (_row(getattr(out, f), index, f)
                             for f in ('tokens', 'levels', 'reveal_step'))
    _draw_sudoku(ax, quiz, tokens, levels, steps, num_steps, num_levels=k_levels, solution=solution,
                 cmap=cmap, title=name)
  visualize.reveal_colorbar(fig, list(axes), num_steps, cmap)
  visualize.level_legend(fig, max(hmdlm_num_levels, mdlm_num_levels))
  return visualize.finish(fig, path)


def sudoku_reveal_gif(quiz: str | np.ndarray, tokens: np.ndarray, reveal_step: np.ndarray,
                      levels: np.ndarray, path: str | os.PathLike[str], fps: float = 4.0, *,
                      num_steps: int, num_levels: int = sudoku.NUM_LEVELS,
                      solution: str | np.ndarray | None = None, cmap: str = visualize.REVEAL_CMAP,
                      dpi: int = 80) -> list[Any]:
  """Animated GIF of the solving process: the quiz, then one frame per step that revealed a cell.

  Frame 0 shows the givens only; frame j >= 1 adds the cells revealed at the j-th distinct reveal
  step (in sampling order n = T..1), so the GIF has (number of distinct reveal steps of generated
  cells) + 1 frames. Steps that revealed nothing get no frame.

  Args:
    quiz, tokens, reveal_step, levels: as in `plot_sudoku_reveal`.
    path: the .gif to write.
    fps: frames per second (> 0).
    num_steps: T.
    num_levels: K.
    solution: optional true solution to mark wrong digits.
    cmap: reveal colormap.
    dpi: resolution of each frame.

  Returns:
    The frames as `PIL.Image.Image`s (all the same size).
  """
  if not fps > 0:
    raise ValueError(f'fps must be > 0, got {fps!r}')
  digits = sudoku_csv.as_digits(quiz, where='quiz')
  given = digits > 0
  steps = np.asarray(reveal_step).reshape(-1)
  visualize.normalized_reveal_order(steps, num_steps, given)  # validates before any drawing
  frame_steps = sorted(np.unique(steps[~given]).tolist(), reverse=True)  # n = T first
  frames = []
  for j, n_min in enumerate([None] + frame_steps):
    shown = given.copy() if n_min is None else given | (steps >= n_min)
    label = 'quiz' if n_min is None else f'step n = {n_min} ({j}/{len(frame_steps)})'
    fig = visualize.new_figure((5.6, 5.0), dpi=dpi)
    ax = fig.subplots()
    _draw_sudoku(ax, digits, tokens, levels, steps, num_steps, num_levels=num_levels,
                 solution=solution, cmap=cmap, title=label, shown=shown)
    visualize.reveal_colorbar(fig, [ax], num_steps, cmap)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    frames.append(Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy()))
  buf = io.BytesIO()
  frames[0].save(buf, format='GIF', save_all=True, append_images=frames[1:],
                 duration=int(round(1000.0 / fps)), loop=0, optimize=False, disposal=1)
  visualize.write_bytes(path, buf.getvalue())
  return frames


def _draw_sudoku(ax: Any, quiz: str | np.ndarray, tokens: np.ndarray, levels: np.ndarray,
                 reveal_step: np.ndarray, num_steps: int, *, num_levels: int,
                 solution: str | np.ndarray | None, cmap: str, title: str | None,
                 shown: np.ndarray | None = None) -> None:
  """Draws one grid on `ax`; `shown` (bool [81]) hides the cells not yet revealed (GIF frames)."""
  digits = sudoku_csv.as_digits(quiz, where='quiz')
  given = digits > 0
  toks = np.asarray(tokens).reshape(-1)
  levs = np.asarray(levels).reshape(-1)
  steps = np.asarray(reveal_step).reshape(-1)
  for name, arr in (('tokens', toks), ('levels', levs), ('reveal_step', steps)):
    if arr.shape != (sudoku.NUM_CELLS,):
      raise ValueError(f'{name} must hold 81 cells, got shape {arr.shape}')
  if toks.min() < 0 or toks.max() > 8:
    raise ValueError(f'tokens must be Sudoku digit tokens 0..8 (digit - 1); got values '
                     f'{np.unique(toks[(toks < 0) | (toks > 8)]).tolist()} '
                     '(MASK left in the output?)')
  if np.any(toks[given] != digits[given] - 1):
    raise ValueError('tokens disagree with the quiz at given cells: tokens must be digit - 1 and '
                     'the quiz digits 1..9 with 0 = blank')
  sol = None if solution is None else sudoku_csv.as_digits(solution, where='solution')
  faces = visualize.reveal_colors(steps, num_steps, cmap, given)
  edges, widths = visualize.level_outline(levs, num_levels)
  shown = np.ones(sudoku.NUM_CELLS, bool) if shown is None else shown
  for i in range(sudoku.NUM_CELLS):
    r, c = divmod(i, 9)
    x, y = c, 8 - r
    if given[i]:
      face, edge, lw = visualize.GIVEN_COLOR, visualize.GIVEN_EDGE_COLOR, visualize.GIVEN_LINEWIDTH
    elif shown[i]:
      face, edge, lw = tuple(faces[i]), tuple(edges[i]), float(widths[i])
    else:
      face, edge, lw = visualize.MASKED_COLOR, visualize.GIVEN_EDGE_COLOR, visualize.GIVEN_LINEWIDTH
    inset = lw / 144.0  # keep thick outlines inside the cell
    ax.add_patch(mpatches.Rectangle((x + 0.04 + inset, y + 0.04 + inset), 0.92 - 2 * inset,
                                    0.92 - 2 * inset, facecolor=face, edgecolor=edge, linewidth=lw,
                                    gid=f'cell-{r}-{c}'))
    if shown[i] and not given[i] and num_levels > 1:
      ax.text(x + 0.1 + inset, y + 0.9 - inset, str(int(levs[i])), ha='left', va='top', fontsize=6,
              color=visualize.text_color(np.asarray(face)), gid=f'level-{r}-{c}')
    if given[i] or shown[i]:
      digit = int(toks[i]) + 1
      wrong = sol is not None and not given[i] and digit != sol[i]
      color = 'red' if wrong else ('black' if given[i] else visualize.text_color(np.asarray(face)))
      ax.text(x + 0.5, y + 0.5, str(digit), ha='center', va='center', fontsize=13, color=color,
              fontweight='bold' if (given[i] or wrong) else 'normal', gid=f'digit-{r}-{c}',
              # A white halo keeps a red (wrong) digit readable on dark cells.
              path_effects=[patheffects.withStroke(linewidth=2.5, foreground='white')] if wrong
              else None)
  for j in range(10):
    lw = 2.0 if j % 3 == 0 else 0.4
    ax.plot([j, j], [0, 9], color='black', lw=lw)
    ax.plot([0, 9], [j, j], color='black', lw=lw)
  ax.set_xlim(-0.05, 9.05)
  ax.set_ylim(-0.05, 9.05)
  ax.set_aspect('equal')
  ax.set_axis_off()
  if title:
    ax.set_title(title)


def _row(x: Any, index: int, name: str) -> np.ndarray:
  arr = np.asarray(x)
  if arr.ndim == 2:
    return arr[index]
  if arr.ndim == 1:
    return arr
  raise ValueError(f'{name} must be [B, L] or [L], got shape {arr.shape}')


def save_sample_pictures(config: config_lib.Config, workdir: str | os.PathLike[str],
                         outputs: Any, *, given: np.ndarray | None = None,
                         solution: np.ndarray | None = None, max_pictures: int = 4,
                         gif: bool = True, subdir: str = 'pictures') -> list[str]:
  """Reveal-order pictures of the first samples in DIR/subdir; returns the written paths.

  `sudoku_reveal_{i}.png` per sample (i < max_pictures) and, if `gif`, `sudoku_reveal_0.gif`. The
  quiz is read from `given` (True at clues) and the sampled tokens (the sampler copies the clues).

  Args:
    config: the experiment config (model.num_levels, sample.num_steps).
    workdir: run directory (local path or `gs://...`).
    outputs: `SampleOutput` (tokens, levels, reveal_step [B, 81]); jax or numpy arrays.
    given: bool [B, 81] clues; None = the sampler's convention `reveal_step == T + 1`.
    solution: optional int [B, 81] true tokens (marks wrong digits).
    max_pictures: how many samples to draw.
    gif: also write the GIF of sample 0.
    subdir: folder inside workdir.
  """
  num_steps = int(config.sample.num_steps)
  num_levels = int(config.model.num_levels)
  rows = visualize.picture_rows(outputs, num_steps, given)
  if rows.tokens.shape[1] != sudoku.NUM_CELLS:
    raise ValueError(f'data.kind="sudoku" needs L = 81, got outputs of length '
                     f'{rows.tokens.shape[1]}')
  out_dir = visualize.picture_dir(workdir, subdir)
  paths = []
  for i in range(min(int(max_pictures), rows.tokens.shape[0])):
    quiz = np.where(rows.given[i], rows.tokens[i] + 1, 0)
    sol = None if solution is None else np.asarray(solution)[i] + 1
    path = out_dir / f'sudoku_reveal_{i}.png'
    plot_sudoku_reveal(quiz, rows.tokens[i], rows.levels[i], rows.reveal_step[i], num_steps,
                       title=f'sample {i} (K = {num_levels}, T = {num_steps})',
                       num_levels=num_levels, solution=sol, path=path)
    paths.append(os.fspath(path))
    if gif and i == 0:
      gif_path = out_dir / 'sudoku_reveal_0.gif'
      sudoku_reveal_gif(quiz, rows.tokens[i], rows.reveal_step[i], rows.levels[i], gif_path,
                        num_steps=num_steps, num_levels=num_levels, solution=sol)
      paths.append(os.fspath(gif_path))
  return paths


def save_record_pictures(config: config_lib.Config, workdir: str | os.PathLike[str],
                         records: Sequence[dict[str, Any]], *, max_pictures: int = 4,
                         gif: bool = True, subdir: str = 'pictures') -> list[str]:
  """`save_sample_pictures` for the JSON records of sample mode ('quiz' and 'prediction' as
  81-digit strings, 'levels', 'reveal_step'); returns the written paths."""
  records = list(records)[:int(max_pictures)]
  if not records:
    return []
  digits = lambda field: np.stack([sudoku_csv.as_digits(str(r), where=f'record {field}')
                                   for r in visualize.record_field(records, field)])
  tokens = digits('prediction').astype(np.int64) - 1
  levels = visualize.record_field(records, 'levels').astype(np.int64)
  steps = visualize.record_field(records, 'reveal_step').astype(np.int64)
  outputs = visualize.PictureRows(tokens, levels, steps, digits('quiz') > 0)
  return save_sample_pictures(config, workdir, outputs, given=outputs.given,
                              max_pictures=max_pictures, gif=gif, subdir=subdir)
