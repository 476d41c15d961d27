"""Pictures of schedules and of the order in which a sampler reveals positions.

Every plotting function takes plain numpy arrays (or a `Schedule`, whose methods are pure), builds a
stand-alone `matplotlib.figure.Figure` on an Agg canvas, optionally writes it to `path` (local or any
`etils.epath` location, e.g. `gs://`), and returns it. No pyplot state is touched, so the functions are
safe in scripts, tests and notebooks alike (show a figure in a notebook with `display(fig)` or by
opening the saved PNG). No model is ever called here.

Reveal-step convention (SPEC 7, `sampling.SampleOutput.reveal_step`): the sampler runs n = T, ..., 1 and
records for every generated position the n at which it was revealed, so n = T is the FIRST step and n = 1
the last. Colours run along the reveal order: `u = (T - n) / (T - 1)` in [0, 1], u = 0 for the first
step (colormap start) and u = 1 for the last. Given positions (Sudoku clues, prompts) are never revealed;
they are drawn in a neutral colour whatever their `reveal_step` holds.

Level convention (SPEC 1): a higher level is more important and revealed earlier; cell / token outlines
grow thicker and darker red with the level (`level_outline`); Sudoku cells also show the level number
in their corner when K > 1.

Sudoku convention (SPEC 6, `data/sudoku.py`): a quiz is 81 digits 0..9 with 0 = blank (the CSV format of
Palm et al., as an array [81] / [9, 9] or a string); model tokens are digit - 1 (0..8).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import matplotlib

from matplotlib import cm
from matplotlib import colors as mcolors
from matplotlib import patches as mpatches
from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
import numpy as np

# Face colours: given cells / prompt tokens (light grey), cells not yet revealed in GIF frames (white).
GIVEN_COLOR: tuple[float, float, float, float] = (0.86, 0.86, 0.86, 1.0)
MASKED_COLOR: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
GIVEN_EDGE_COLOR: tuple[float, float, float, float] = (0.55, 0.55, 0.55, 1.0)
GIVEN_LINEWIDTH = 0.6
# Outline width by level: MIN at level 0, MAX at level K-1 (linear in between).
LEVEL_MIN_LINEWIDTH = 0.8
LEVEL_MAX_LINEWIDTH = 3.2
LEVEL_CMAP = 'Reds'
# Level colours are taken from this part of LEVEL_CMAP: medium red (level 0) to dark red (level K-1),
# visible on every colour of REVEAL_CMAP.
_LEVEL_CMAP_RANGE = (0.45, 1.0)
REVEAL_CMAP = 'viridis'
SUDOKU_NUM_LEVELS = 6  # K of the Sudoku labeller (SPEC 6)
SUDOKU_CELLS = 81


class ScheduleLike(Protocol):
  """The part of `schedules.Schedule` (docs/design.md) the schedule plots use."""

  @property
  def num_levels(self) -> int: ...

  def alpha(self, t: Any) -> Any: ...

  def hazard(self, t: Any) -> Any: ...

  def reveal_prob(self, s: Any, t: Any) -> Any: ...


# ----------------------------------------------------------------------------------------------------
# Colour helpers (pure, unit-testable).


def normalized_reveal_order(reveal_step: np.ndarray, num_steps: int,
                            given: np.ndarray | None = None) -> np.ndarray:
  """Position of each reveal step along the sampling run, in [0, 1].

  Args:
    reveal_step: int [...], the step n in 1..T at which each position was revealed (n = T first).
    num_steps: T, the number of sampling steps.
    given: optional bool [...] (same shape): given positions are skipped (value NaN).

  Returns:
    float64 [...]: (T - n) / (T - 1) (0 for T == 1); NaN at given positions.

  Raises:
    ValueError: T < 1, or a non-given reveal step outside 1..T.
  """
  if int(num_steps) != num_steps or num_steps < 1:
    raise ValueError(f'num_steps must be a positive integer (config sample.num_steps), got {num_steps!r}')
  steps = np.asarray(reveal_step)
  if not np.issubdtype(steps.dtype, np.integer):
    raise ValueError(f'reveal_step must be an integer array, got dtype {steps.dtype}')
  free = np.ones(steps.shape, bool) if given is None else ~_check_given(given, steps.shape)
  bad = free & ((steps < 1) | (steps > num_steps))
  if bad.any():
    raise ValueError(
        f'reveal_step must lie in 1..{num_steps} (num_steps) at every non-given position; found '
        f'{np.unique(steps[bad]).tolist()[:10]} at {int(bad.sum())} position(s)')
  u = (num_steps - steps.astype(np.float64)) / max(num_steps - 1, 1)
  return np.where(free, u, np.nan)


def reveal_colors(reveal_step: np.ndarray, num_steps: int, cmap: str | mcolors.Colormap = REVEAL_CMAP,
                  given: np.ndarray | None = None,
                  given_color: tuple[float, float, float, float] = GIVEN_COLOR) -> np.ndarray:
  """RGBA colour of each position from the step at which it was revealed.

  Args:
    reveal_step: int [...], n in 1..T (n = T is the first step).
    num_steps: T.
    cmap: colormap (name or object); `cmap(u)` with u = `normalized_reveal_order`.
    given: optional bool [...]; given positions get `given_color`.
    given_color: RGBA of given positions.

  Returns:
    float64 [..., 4] RGBA in [0, 1].
  """
  u = normalized_reveal_order(reveal_step, num_steps, given)
  rgba = np.asarray(_get_cmap(cmap)(np.nan_to_num(u, nan=0.0)), np.float64)
  rgba[np.isnan(u)] = np.asarray(given_color, np.float64)
  return rgba


def level_outline(levels: np.ndarray, num_levels: int) -> tuple[np.ndarray, np.ndarray]:
  """Outline colour and width of each position from its level (higher = thicker, darker).

  Args:
    levels: int [...] in 0..K-1.
    num_levels: K.

  Returns:
    (edge colours float64 [..., 4], line widths float64 [...]).

  Raises:
    ValueError: K < 1 or a level outside 0..K-1.
  """
  levels = np.asarray(levels)
  if int(num_levels) != num_levels or num_levels < 1:
    raise ValueError(f'num_levels must be a positive integer (config model.num_levels), got {num_levels!r}')
  if not np.issubdtype(levels.dtype, np.integer):
    raise ValueError(f'levels must be an integer array, got dtype {levels.dtype}')
  if levels.size and (levels.min() < 0 or levels.max() >= num_levels):
    raise ValueError(f'levels must lie in 0..{num_levels - 1} (num_levels={num_levels}); '
                     f'found values {np.unique(levels[(levels < 0) | (levels >= num_levels)]).tolist()}')
  frac = levels.astype(np.float64) / max(num_levels - 1, 1)
  lo, hi = _LEVEL_CMAP_RANGE
  colors = np.asarray(_get_cmap(LEVEL_CMAP)(lo + (hi - lo) * frac), np.float64)
  widths = LEVEL_MIN_LINEWIDTH + (LEVEL_MAX_LINEWIDTH - LEVEL_MIN_LINEWIDTH) * frac
  return colors, widths


# ----------------------------------------------------------------------------------------------------
# Schedules (SPEC 2, Appendix D).


def plot_schedules(schedule: ScheduleLike, num_points: int = 501, *, title: str | None = None,
                   path: str | os.PathLike[str] | None = None) -> Figure:
  """α_k(t) (left) and the hazards λ'_k(t) = -α'_k / (1 - α_k) (right, log y) for every level.

  The α lines carry `schedule.alpha(t)[:, k]` on the grid t = linspace(0, 1, num_points) (float32)
  exactly; the hazard lines use the same grid without t = 0 and leave out points where the hazard is 0
  (inactive level, e.g. t <= δ_k), which a log axis cannot show.

  Args:
    schedule: a `schedules.Schedule`.
    num_points: number of grid points (>= 2).
    title: optional figure title.
    path: optional file to write (format from the suffix).

  Returns:
    The figure; `fig.axes[0]` holds the α lines, `fig.axes[1]` the hazards, labelled 'level k'.
  """
  if int(num_points) != num_points or num_points < 2:
    raise ValueError(f'num_points must be an integer >= 2, got {num_points!r}')
  k_levels = int(schedule.num_levels)
  t = np.linspace(0.0, 1.0, int(num_points), dtype=np.float32)
  alpha = _to_numpy(schedule.alpha(t), (t.shape[0], k_levels), 'schedule.alpha(t)')
  t_pos = t[1:]
  hazard = _to_numpy(schedule.hazard(t_pos), (t_pos.shape[0], k_levels), 'schedule.hazard(t)')

  fig = _new_figure((11.0, 4.0))
  ax_a, ax_h = fig.subplots(1, 2)
  colors = _level_line_colors(k_levels)
  for k in range(k_levels):
    ax_a.plot(t, alpha[:, k], color=colors[k], label=f'level {k}')
    keep = hazard[:, k] > 0
    ax_h.plot(t_pos[keep], hazard[keep, k], color=colors[k], label=f'level {k}')
  ax_a.set(xlabel='t', ylabel=r'$\alpha_k(t)$', title='P(position still revealed)', xlim=(0, 1))
  ax_h.set(xlabel='t', ylabel=r"$\lambda'_k(t) = -\alpha'_k / (1 - \alpha_k)$", title='hazard',
           xlim=(0, 1), yscale='log')
  for ax in (ax_a, ax_h):
    ax.grid(True, alpha=0.3)
    ax.legend(loc='best', fontsize='small')
  fig.suptitle(title or _schedule_title(schedule))
  return _finish(fig, path)


def plot_reveal_ordering(schedule: ScheduleLike, num_steps: int, *, title: str | None = None,
                         path: str | os.PathLike[str] | None = None) -> Figure:
  """Per-step reveal probabilities λ_k(t_{n-1}, t_n) on the sampling grid t_n = n/T, per level.

  Appendix D asks λ_k <= λ_k' for k < k' wherever level k' is active; the steps that
  `schedules.ordering_violations` reports are marked with red crosses (artists with gid 'violation')
  and shaded. Zero probabilities (inactive levels) are left out of the log axis.

  Args:
    schedule: a `schedules.Schedule`.
    num_steps: T (config sample.num_steps).
    title: optional title.
    path: optional file to write.

  Returns:
    The figure; `fig.axes[0]` holds one line per level labelled 'level k' (x = t_n, y = λ_k).
  """
  from hmdlm_jax.processes import schedules as schedules_lib  # local: keeps this module importable alone

  if int(num_steps) != num_steps or num_steps < 1:
    raise ValueError(f'num_steps must be a positive integer (config sample.num_steps), got {num_steps!r}')
  k_levels = int(schedule.num_levels)
  n = np.arange(1, int(num_steps) + 1)
  t = (n / num_steps).astype(np.float32)
  s = ((n - 1) / num_steps).astype(np.float32)
  lam = _to_numpy(schedule.reveal_prob(s, t), (n.shape[0], k_levels), 'schedule.reveal_prob(s, t)')
  violations = schedules_lib.ordering_violations(schedule, int(num_steps))

  fig = _new_figure((8.0, 4.5))
  ax = fig.subplots()
  colors = _level_line_colors(k_levels)
  for k in range(k_levels):
    keep = lam[:, k] > 0
    ax.plot(t[keep], lam[keep, k], marker='.', markersize=3, lw=1, color=colors[k], label=f'level {k}')
  bad_steps = sorted({int(v.step) for v in violations})
  for step in bad_steps:
    ax.axvspan((step - 0.5) / num_steps, (step + 0.5) / num_steps, color='red', alpha=0.15, lw=0)
    row = lam[step - 1]
    y = row[row > 0].max() if (row > 0).any() else 1.0
    ax.plot([step / num_steps], [y], marker='x', color='red', markersize=7, mew=2, ls='none',
            gid='violation')
  if bad_steps:
    ax.plot([], [], marker='x', color='red', ls='none', mew=2,
            label=f'Appendix D violated ({len(bad_steps)} step(s))')
  ax.set(xlabel=r'$t_n = n / T$', ylabel=r'$\lambda_k(t_{n-1}, t_n)$', yscale='log', xlim=(0, 1),
         title=title or f'{_schedule_title(schedule)}, T = {num_steps}: '
         + ('ordering holds' if not bad_steps else f'{len(bad_steps)} violating step(s)'))
  ax.grid(True, alpha=0.3)
  ax.legend(loc='best', fontsize='small')
  return _finish(fig, path)


# ----------------------------------------------------------------------------------------------------
# Sudoku.


def quiz_to_digits(quiz: str | np.ndarray | Sequence[int]) -> np.ndarray:
  """Quiz as int [81] digits 0..9 (0 = blank) from a string of 81 digits ('.' = blank) or an array."""
  if isinstance(quiz, str):
    text = quiz.strip().replace('.', '0')
    if len(text) != SUDOKU_CELLS or not text.isdigit():
      raise ValueError(f'a quiz string must have 81 digits 0-9 (0 or . = blank); got {len(text)} '
                       f'characters: {quiz[:20]!r}...')
    return np.array([int(c) for c in text], np.int64)
  digits = np.asarray(quiz)
  if digits.size != SUDOKU_CELLS or not np.issubdtype(digits.dtype, np.integer):
    raise ValueError(f'quiz must hold 81 integers ([81] or [9, 9]); got shape {digits.shape}, '
                     f'dtype {digits.dtype}')
  digits = digits.reshape(SUDOKU_CELLS).astype(np.int64)
  if digits.min() < 0 or digits.max() > 9:
    raise ValueError('quiz digits must lie in 0..9 (0 = blank); got '
                     f'{np.unique(digits[(digits < 0) | (digits > 9)]).tolist()}')
  return digits


def plot_sudoku_reveal(quiz: str | np.ndarray, tokens: np.ndarray, levels: np.ndarray,
                       reveal_step: np.ndarray, num_steps: int, title: str | None = None, *,
                       num_levels: int = SUDOKU_NUM_LEVELS, solution: str | np.ndarray | None = None,
                       cmap: str = REVEAL_CMAP, path: str | os.PathLike[str] | None = None) -> Figure:
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
  fig = _new_figure((5.6, 5.0))
  ax = fig.subplots()
  _draw_sudoku(ax, quiz, tokens, levels, reveal_step, num_steps, num_levels=num_levels,
               solution=solution, cmap=cmap, title=title)
  _reveal_colorbar(fig, [ax], num_steps, cmap)
  _level_legend(fig, num_levels)
  return _finish(fig, path)


def plot_sudoku_reveal_comparison(hmdlm_out: Any, mdlm_out: Any, quiz: str | np.ndarray, *,
                                  num_steps: int, index: int = 0,
                                  hmdlm_num_levels: int = SUDOKU_NUM_LEVELS, mdlm_num_levels: int = 1,
                                  solution: str | np.ndarray | None = None,
                                  titles: tuple[str, str] = ('HMDLM', 'MDLM'), cmap: str = REVEAL_CMAP,
                                  path: str | os.PathLike[str] | None = None) -> Figure:
  """HMDLM and MDLM reveal orders side by side on the same puzzle.

  Args:
    hmdlm_out, mdlm_out: `sampling.SampleOutput`s (or anything with `tokens`, `levels`,
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
  fig = _new_figure((10.6, 5.0))
  axes = fig.subplots(1, 2)
  for ax, out, k_levels, name in zip(axes, (hmdlm_out, mdlm_out), (hmdlm_num_levels, mdlm_num_levels),
                                     titles):
    tokens, levels, steps = (_row(getattr(out, f), index, f) for f in ('tokens', 'levels', 'reveal_step'))
    _draw_sudoku(ax, quiz, tokens, levels, steps, num_steps, num_levels=k_levels, solution=solution,
                 cmap=cmap, title=name)
  _reveal_colorbar(fig, list(axes), num_steps, cmap)
  _level_legend(fig, max(hmdlm_num_levels, mdlm_num_levels))
  return _finish(fig, path)


def sudoku_reveal_gif(quiz: str | np.ndarray, tokens: np.ndarray, reveal_step: np.ndarray,
                      levels: np.ndarray, path: str | os.PathLike[str], fps: float = 4.0, *,
                      num_steps: int, num_levels: int = SUDOKU_NUM_LEVELS,
                      solution: str | np.ndarray | None = None, cmap: str = REVEAL_CMAP,
                      dpi: int = 80) -> list[Any]:
  """Animated GIF of the solving process: the quiz, then one frame per step that revealed a cell.

  Frame 0 shows the givens only; frame j >= 1 adds the cells revealed at the j-th distinct reveal step
  (in sampling order n = T..1), so the GIF has (number of distinct reveal steps of generated cells) + 1
  frames. Steps that revealed nothing get no frame.

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
  from PIL import Image  # Pillow ships with matplotlib

  if not fps > 0:
    raise ValueError(f'fps must be > 0, got {fps!r}')
  digits = quiz_to_digits(quiz)
  given = digits > 0
  steps = np.asarray(reveal_step).reshape(-1)
  normalized_reveal_order(steps, num_steps, given)  # validates before any drawing
  frame_steps = sorted(np.unique(steps[~given]).tolist(), reverse=True)  # n = T first
  frames = []
  for j, n_min in enumerate([None] + frame_steps):
    shown = given.copy() if n_min is None else given | (steps >= n_min)
    label = 'quiz' if n_min is None else f'step n = {n_min} ({j}/{len(frame_steps)})'
    fig = _new_figure((5.6, 5.0), dpi=dpi)
    ax = fig.subplots()
    _draw_sudoku(ax, digits, tokens, levels, steps, num_steps, num_levels=num_levels,
                 solution=solution, cmap=cmap, title=label, shown=shown)
    _reveal_colorbar(fig, [ax], num_steps, cmap)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    frames.append(Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy()))
  buf = io.BytesIO()
  frames[0].save(buf, format='GIF', save_all=True, append_images=frames[1:],
                 duration=int(round(1000.0 / fps)), loop=0, optimize=False, disposal=1)
  _write_bytes(path, buf.getvalue())
  return frames


# ----------------------------------------------------------------------------------------------------
# Text.


def plot_text_reveal(token_strings: Sequence[str], reveal_step: np.ndarray, levels: np.ndarray,
                     num_steps: int, *, given: np.ndarray | None = None, num_levels: int = 2,
                     chars_per_line: int = 60, title: str | None = None, cmap: str = REVEAL_CMAP,
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
  given_arr = np.zeros(length, bool) if given is None else _check_given(given, (length,))
  faces = reveal_colors(steps, num_steps, cmap, given_arr)
  edges, widths = level_outline(levs, num_levels)

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
  fig = _new_figure((max(chars_per_line * char_in + 1.0, 4.0), num_rows * line_h * 0.22 + 1.6))
  ax = fig.subplots()
  for i, ((x0, r, w), s) in enumerate(zip(boxes, strings)):
    y0 = -(r * line_h)
    if given_arr[i]:
      edge, lw = GIVEN_EDGE_COLOR, GIVEN_LINEWIDTH
    else:
      edge, lw = tuple(edges[i]), float(widths[i])
    ax.add_patch(mpatches.Rectangle((x0, y0 - 1.0), w, 1.0, facecolor=tuple(faces[i]), edgecolor=edge,
                                    linewidth=lw, gid=f'token-{i}'))
    ax.text(x0 + w / 2, y0 - 0.5, s, ha='center', va='center', family='monospace', fontsize=8,
            color=_text_color(faces[i]),
            fontweight='bold' if (levs[i] == num_levels - 1 and num_levels > 1) else 'normal')
  ax.set_xlim(-0.5, chars_per_line + pad + 0.5)
  ax.set_ylim(-(num_rows - 1) * line_h - 1.3, 0.3)
  ax.set_axis_off()
  if title:
    ax.set_title(title)
  _reveal_colorbar(fig, [ax], num_steps, cmap, orientation='horizontal')
  _level_legend(fig, num_levels)
  return _finish(fig, path)


# ----------------------------------------------------------------------------------------------------
# `--mode=sample` hook.


def save_sample_pictures(config: Any, workdir: str | os.PathLike[str], outputs: Any, *,
                         given: np.ndarray | None = None, solution: np.ndarray | None = None,
                         decode_fn: Any = None, eos_id: int | None = None, max_pictures: int = 4,
                         gif: bool = True, subdir: str = 'pictures') -> list[str]:
  """Writes reveal-order pictures of the first samples into `workdir/subdir`; returns the paths.

  Sudoku (`config.data.kind == 'sudoku'`): `sudoku_reveal_{i}.png` per sample (i < max_pictures) and,
  if `gif`, `sudoku_reveal_0.gif`. The quiz is read from `given` (True at clues) and the sampled tokens
  (clues are copied through by the sampler). Text: `text_reveal_{i}.png`, with `decode_fn(ids [L]) ->
  list of L strings` turning token ids into one string per position; with `eos_id` a row is drawn up
  to and including its first `eos_id` (SPEC 6: samples are cut at the first [SEP]).

  Args:
    config: the experiment config (uses data.kind, model.num_levels, sample.num_steps).
    workdir: run directory (local path or `gs://...`).
    outputs: `sampling.SampleOutput` (tokens, levels, reveal_step [B, L]); jax or numpy arrays.
    given: bool [B, L] given positions (Sudoku clues / prompts); None = read them from the sampler's
      convention `reveal_step == T + 1`.
    solution: optional int [B, L] true tokens (Sudoku: marks wrong digits).
    decode_fn: text only, ids -> per-position strings.
    eos_id: text only, optional end-of-row id to cut at.
    max_pictures: how many samples to draw.
    gif: Sudoku only, also write the GIF of sample 0.
    subdir: folder inside workdir.

  Returns:
    The written file paths (str).
  """
  from etils import epath

  tokens = np.asarray(outputs.tokens)
  levels = np.asarray(outputs.levels)
  steps = np.asarray(outputs.reveal_step)
  if tokens.ndim != 2 or levels.shape != tokens.shape or steps.shape != tokens.shape:
    raise ValueError(f'outputs.tokens/levels/reveal_step must all be [B, L]; got {tokens.shape}, '
                     f'{levels.shape}, {steps.shape}')
  num_steps = int(config.sample.num_steps)
  # The sampler marks given positions with reveal_step = T + 1 (sampling.SampleOutput).
  given_arr = steps == num_steps + 1 if given is None else _check_given(given, tokens.shape)
  num_levels = int(config.model.num_levels)
  kind = str(config.data.kind)
  out_dir = epath.Path(os.fspath(workdir)) / subdir
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for i in range(min(int(max_pictures), tokens.shape[0])):
    if kind == 'sudoku':
      if tokens.shape[1] != SUDOKU_CELLS:
        raise ValueError(f'data.kind="sudoku" needs L = 81, got outputs of length {tokens.shape[1]}')
      quiz = np.where(given_arr[i], tokens[i] + 1, 0)
      sol = None if solution is None else np.asarray(solution)[i] + 1
      path = out_dir / f'sudoku_reveal_{i}.png'
      plot_sudoku_reveal(quiz, tokens[i], levels[i], steps[i], num_steps,
                         title=f'sample {i} (K = {num_levels}, T = {num_steps})',
                         num_levels=num_levels, solution=sol, path=path)
      paths.append(os.fspath(path))
      if gif and i == 0:
        gif_path = out_dir / 'sudoku_reveal_0.gif'
        sudoku_reveal_gif(quiz, tokens[i], steps[i], levels[i], gif_path, num_steps=num_steps,
                          num_levels=num_levels, solution=sol)
        paths.append(os.fspath(gif_path))
    else:
      if decode_fn is None:
        raise ValueError(f'save_sample_pictures: data.kind={kind!r} needs decode_fn (ids -> strings)')
      ids = tokens[i]
      length = ids.shape[0]
      if eos_id is not None and np.any(ids == eos_id):
        length = int(np.argmax(ids == eos_id)) + 1
      strings = list(decode_fn(ids[:length]))
      path = out_dir / f'text_reveal_{i}.png'
      plot_text_reveal(strings, steps[i, :length], levels[i, :length], num_steps,
                       given=given_arr[i, :length],
                       num_levels=num_levels, title=f'sample {i} (K = {num_levels}, T = {num_steps})',
                       path=path)
      paths.append(os.fspath(path))
  return paths


def save_record_pictures(config: Any, workdir: str | os.PathLike[str],
                         records: Sequence[dict[str, Any]], *, tokenizer: Any = None,
                         max_pictures: int = 4, gif: bool = True,
                         subdir: str = 'pictures') -> list[str]:
  """`save_sample_pictures` for the JSON records of `evaluate.run_sample`; returns the paths.

  Sudoku records carry 'quiz' and 'prediction' (81-digit strings), 'levels' and 'reveal_step';
  text records 'tokens', 'levels', 'reveal_step' and 'given'. Text tokens are drawn as the
  tokenizer's pieces (`tokenizer.hf.convert_ids_to_tokens`), cut after the first EOS ([SEP]);
  `tokenizer` defaults to `data.tokenizers.tokenizer_from_config(config.data)`.
  """
  if not records:
    return []
  records = list(records)[:int(max_pictures)]

  def stack(field: str) -> np.ndarray:
    missing = [n for n, r in enumerate(records) if field not in r]
    if missing:
      raise ValueError(f'save_record_pictures: record(s) {missing[:5]} have no {field!r} field')
    return np.stack([np.asarray(r[field]) for r in records])

  levels, steps = stack('levels').astype(np.int64), stack('reveal_step').astype(np.int64)
  if str(config.data.kind) == 'sudoku':
    tokens = np.stack([quiz_to_digits(r) for r in stack('prediction')]) - 1
    given = np.stack([quiz_to_digits(r) for r in stack('quiz')]) > 0
    outputs = _Outputs(tokens, levels, steps)
    return save_sample_pictures(config, workdir, outputs, given=given, max_pictures=max_pictures,
                                gif=gif, subdir=subdir)
  if tokenizer is None:
    from hmdlm_jax.data import tokenizers as tokenizers_lib  # text only: keeps Sudoku light

    tokenizer = tokenizers_lib.tokenizer_from_config(config.data)
  outputs = _Outputs(stack('tokens').astype(np.int64), levels, steps)
  given = stack('given').astype(bool)

  def decode(ids: np.ndarray) -> list[str]:
    return list(tokenizer.hf.convert_ids_to_tokens([int(i) for i in ids]))

  return save_sample_pictures(config, workdir, outputs, given=given, decode_fn=decode,
                              eos_id=int(tokenizer.eos_id), max_pictures=max_pictures, gif=False,
                              subdir=subdir)


# ----------------------------------------------------------------------------------------------------
# Internals.


class _Outputs(NamedTuple):
  """The fields of `sampling.SampleOutput` the pictures use (numpy [B, L])."""
  tokens: np.ndarray
  levels: np.ndarray
  reveal_step: np.ndarray


def _get_cmap(cmap: str | mcolors.Colormap) -> mcolors.Colormap:
  return matplotlib.colormaps[cmap] if isinstance(cmap, str) else cmap


def _check_given(given: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  given = np.asarray(given)
  if given.dtype != bool or given.shape != tuple(shape):
    raise ValueError(f'given must be a bool array of shape {tuple(shape)}, got {given.dtype} {given.shape}')
  return given


def _to_numpy(x: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
  arr = np.asarray(x)
  if arr.shape != shape:
    raise ValueError(f'{what} returned shape {arr.shape}, expected {shape}')
  return arr


def _row(x: Any, index: int, name: str) -> np.ndarray:
  arr = np.asarray(x)
  if arr.ndim == 2:
    return arr[index]
  if arr.ndim == 1:
    return arr
  raise ValueError(f'{name} must be [B, L] or [L], got shape {arr.shape}')


def _schedule_title(schedule: Any) -> str:
  kind = getattr(schedule, 'kind', 'schedule')
  params = getattr(schedule, 'params', None)
  sym = {'loglinear': 'δ', 'power': 'ω'}.get(kind, 'params')
  return f'{kind} schedule, {sym} = {tuple(float(p) for p in params)}' if params is not None else kind


def _level_line_colors(num_levels: int) -> np.ndarray:
  # Line plots need distinguishable hues more than an ordered shade: a qualitative palette.
  return np.asarray(_get_cmap('tab10')(np.arange(num_levels) % 10), np.float64)


def _new_figure(figsize: tuple[float, float], dpi: int = 100) -> Figure:
  fig = Figure(figsize=figsize, dpi=dpi, layout='constrained')
  FigureCanvasAgg(fig)  # the Agg canvas, independent of pyplot's backend
  return fig


def _write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
  from etils import epath

  p = epath.Path(os.fspath(path))
  p.parent.mkdir(parents=True, exist_ok=True)
  p.write_bytes(data)


def _finish(fig: Figure, path: str | os.PathLike[str] | None) -> Figure:
  if path is not None:
    suffix = os.path.splitext(os.fspath(path))[1].lstrip('.').lower() or 'png'
    buf = io.BytesIO()
    with warnings.catch_warnings():
      # Tokens outside the font (e.g. CJK WordPiece pieces) render as boxes; one warning each is noise.
      warnings.filterwarnings('ignore', message=r'Glyph \d+ .* missing from font')
      fig.savefig(buf, format=suffix, dpi=fig.dpi)
    _write_bytes(path, buf.getvalue())
  return fig


def _text_color(face: np.ndarray) -> str:
  # Relative luminance (ITU-R BT.709): dark text on light faces, white on dark ones.
  r, g, b = face[:3]
  return 'black' if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else 'white'


def _reveal_colorbar(fig: Figure, axes: list[Any], num_steps: int, cmap: str,
                     orientation: str = 'vertical') -> None:
  # The colorbar is indexed by the order of the step (0 = first = n = T), as the cell colours are.
  mappable = cm.ScalarMappable(norm=mcolors.Normalize(0, 1), cmap=_get_cmap(cmap))
  if orientation == 'vertical':
    cbar = fig.colorbar(mappable, ax=axes, orientation=orientation, fraction=0.04, pad=0.03)
  else:
    cbar = fig.colorbar(mappable, ax=axes, orientation=orientation, fraction=0.08, pad=0.02,
                        shrink=0.6, aspect=40)
  cbar.set_ticks([0.0, 1.0])
  cbar.set_ticklabels([f'first (n={num_steps})', 'last (n=1)'])
  cbar.set_label('reveal step')


def _level_legend(fig: Figure, num_levels: int) -> None:
  if num_levels <= 1:
    return
  colors, widths = level_outline(np.arange(num_levels), num_levels)
  handles = [Line2D([], [], color=colors[k], lw=widths[k], label=f'level {k}')
             for k in range(num_levels - 1, -1, -1)]
  fig.legend(handles=handles, loc='outside lower center', ncol=min(num_levels, 6), fontsize='x-small',
             frameon=False, title='outline = level (higher = revealed earlier)', title_fontsize='x-small')


def _draw_sudoku(ax: Any, quiz: str | np.ndarray, tokens: np.ndarray, levels: np.ndarray,
                 reveal_step: np.ndarray, num_steps: int, *, num_levels: int,
                 solution: str | np.ndarray | None, cmap: str, title: str | None,
                 shown: np.ndarray | None = None) -> None:
  """Draws one grid on `ax`; `shown` (bool [81]) hides the cells not yet revealed (GIF frames)."""
  digits = quiz_to_digits(quiz)
  given = digits > 0
  toks = np.asarray(tokens).reshape(-1)
  levs = np.asarray(levels).reshape(-1)
  steps = np.asarray(reveal_step).reshape(-1)
  for name, arr in (('tokens', toks), ('levels', levs), ('reveal_step', steps)):
    if arr.shape != (SUDOKU_CELLS,):
      raise ValueError(f'{name} must hold 81 cells, got shape {arr.shape}')
  if toks.min() < 0 or toks.max() > 8:
    raise ValueError(f'tokens must be Sudoku digit tokens 0..8 (digit - 1); got values '
                     f'{np.unique(toks[(toks < 0) | (toks > 8)]).tolist()} (MASK left in the output?)')
  if np.any(toks[given] != digits[given] - 1):
    raise ValueError('tokens disagree with the quiz at given cells: tokens must be digit - 1 and the '
                     'quiz digits 1..9 with 0 = blank')
  sol = None if solution is None else quiz_to_digits(solution)
  faces = reveal_colors(steps, num_steps, cmap, given)
  edges, widths = level_outline(levs, num_levels)
  shown = np.ones(SUDOKU_CELLS, bool) if shown is None else shown
  for i in range(SUDOKU_CELLS):
    r, c = divmod(i, 9)
    x, y = c, 8 - r
    if given[i]:
      face, edge, lw = GIVEN_COLOR, GIVEN_EDGE_COLOR, GIVEN_LINEWIDTH
    elif shown[i]:
      face, edge, lw = tuple(faces[i]), tuple(edges[i]), float(widths[i])
    else:
      face, edge, lw = MASKED_COLOR, GIVEN_EDGE_COLOR, GIVEN_LINEWIDTH
    inset = lw / 144.0  # keep thick outlines inside the cell
    ax.add_patch(mpatches.Rectangle((x + 0.04 + inset, y + 0.04 + inset), 0.92 - 2 * inset,
                                    0.92 - 2 * inset, facecolor=face, edgecolor=edge, linewidth=lw,
                                    gid=f'cell-{r}-{c}'))
    if shown[i] and not given[i] and num_levels > 1:
      ax.text(x + 0.1 + inset, y + 0.9 - inset, str(int(levs[i])), ha='left', va='top', fontsize=6,
              color=_text_color(np.asarray(face)), gid=f'level-{r}-{c}')
    if given[i] or shown[i]:
      digit = int(toks[i]) + 1
      wrong = sol is not None and not given[i] and digit != sol[i]
      color = 'red' if wrong else ('black' if given[i] else _text_color(np.asarray(face)))
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
