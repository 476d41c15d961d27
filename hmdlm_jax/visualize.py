"""Generic pictures: schedules, and the colours and layout of reveal-order pictures.

Every plotting function takes plain numpy arrays (or a `Schedule`, whose methods are pure), builds
a stand-alone `matplotlib.figure.Figure` on an Agg canvas, optionally writes it to `path` (local or
any `etils.epath` location, e.g. `gs://`), and returns it. No pyplot state is touched, so the
functions are safe in scripts, tests and notebooks alike (`display(fig)` shows one), and no model
is ever called here. The reveal-order pictures of a task (Sudoku grids, text timelines) live with
the task (tasks/*_pictures.py) and use the helpers below.

Conventions: colours run along the reveal order, from the first step (n = T, the colormap's start)
to the last (n = 1), with given positions (whatever their `reveal_step` holds; the sampler writes
T + 1) in a neutral colour (`normalized_reveal_order`, docs/method.md §7); cell / token outlines
grow thicker and darker red with the level, a higher level being more important and revealed
earlier (`level_outline`, docs/method.md §1).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from etils import epath
import matplotlib
from matplotlib import cm
from matplotlib import colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
import numpy as np

from hmdlm_jax import lease
from hmdlm_jax import storage
from hmdlm_jax.processes import schedules as schedules_lib

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
  free = np.ones(steps.shape, bool) if given is None else ~check_given(given, steps.shape)
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
  rgba = np.asarray(get_cmap(cmap)(np.nan_to_num(u, nan=0.0)), np.float64)
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
  colors = np.asarray(get_cmap(LEVEL_CMAP)(lo + (hi - lo) * frac), np.float64)
  widths = LEVEL_MIN_LINEWIDTH + (LEVEL_MAX_LINEWIDTH - LEVEL_MIN_LINEWIDTH) * frac
  return colors, widths


# ----------------------------------------------------------------------------------------------------
# Schedules (docs/method.md §2, Appendix D).


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

  fig = new_figure((11.0, 4.0))
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
  return finish(fig, path)


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
  if int(num_steps) != num_steps or num_steps < 1:
    raise ValueError(f'num_steps must be a positive integer (config sample.num_steps), got {num_steps!r}')
  k_levels = int(schedule.num_levels)
  n = np.arange(1, int(num_steps) + 1)
  t = (n / num_steps).astype(np.float32)
  s = ((n - 1) / num_steps).astype(np.float32)
  lam = _to_numpy(schedule.reveal_prob(s, t), (n.shape[0], k_levels), 'schedule.reveal_prob(s, t)')
  violations = schedules_lib.ordering_violations(schedule, int(num_steps))

  fig = new_figure((8.0, 4.5))
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
  return finish(fig, path)


# ----------------------------------------------------------------------------------------------------
# Building blocks of the pictures (the tasks draw with them too).


def get_cmap(cmap: str | mcolors.Colormap) -> mcolors.Colormap:
  """A colormap object from its name (or the object itself)."""
  return matplotlib.colormaps[cmap] if isinstance(cmap, str) else cmap


def check_given(given: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """`given` as a bool array of `shape` (ValueError otherwise)."""
  given = np.asarray(given)
  if given.dtype != bool or given.shape != tuple(shape):
    raise ValueError(f'given must be a bool array of shape {tuple(shape)}, got {given.dtype} {given.shape}')
  return given


def _to_numpy(x: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
  arr = np.asarray(x)
  if arr.shape != shape:
    raise ValueError(f'{what} returned shape {arr.shape}, expected {shape}')
  return arr


def _schedule_title(schedule: Any) -> str:
  kind = getattr(schedule, 'kind', 'schedule')
  params = getattr(schedule, 'params', None)
  sym = {'loglinear': 'δ', 'power': 'ω'}.get(kind, 'params')
  return f'{kind} schedule, {sym} = {tuple(float(p) for p in params)}' if params is not None else kind


def _level_line_colors(num_levels: int) -> np.ndarray:
  # Line plots need distinguishable hues more than an ordered shade: a qualitative palette.
  return np.asarray(get_cmap('tab10')(np.arange(num_levels) % 10), np.float64)


def new_figure(figsize: tuple[float, float], dpi: int = 100) -> Figure:
  """A stand-alone figure on its own Agg canvas (no pyplot state)."""
  fig = Figure(figsize=figsize, dpi=dpi, layout='constrained')
  FigureCanvasAgg(fig)  # the Agg canvas, independent of pyplot's backend
  return fig


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
  """Writes `data` to a local path or URL (hmdlm_jax/storage.py), creating its folder; fenced
  (lease.check_held: a run whose lease was taken over writes no picture)."""
  lease.check_held()
  path = storage.absolute(path)
  storage.makedirs(os.path.dirname(path))
  storage.write_bytes(path, data)


def finish(fig: Figure, path: str | os.PathLike[str] | None) -> Figure:
  """Writes `fig` to `path` (format from the suffix; nothing when None) and returns it."""
  if path is not None:
    suffix = os.path.splitext(os.fspath(path))[1].lstrip('.').lower() or 'png'
    buf = io.BytesIO()
    with warnings.catch_warnings():
      # Tokens outside the font (e.g. CJK WordPiece pieces) render as boxes; one warning each is noise.
      warnings.filterwarnings('ignore', message=r'Glyph \d+ .* missing from font')
      fig.savefig(buf, format=suffix, dpi=fig.dpi)
    write_bytes(path, buf.getvalue())
  return fig


def text_color(face: np.ndarray) -> str:
  """'black' or 'white', whichever reads better on the RGBA `face`."""
  # Relative luminance (ITU-R BT.709): dark text on light faces, white on dark ones.
  r, g, b = face[:3]
  return 'black' if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else 'white'


def reveal_colorbar(fig: Figure, axes: list[Any], num_steps: int, cmap: str,
                    orientation: str = 'vertical') -> None:
  """The reveal-order colorbar, from the first step (n = T) to the last (n = 1)."""
  # The colorbar is indexed by the order of the step (0 = first = n = T), as the cell colours are.
  mappable = cm.ScalarMappable(norm=mcolors.Normalize(0, 1), cmap=get_cmap(cmap))
  if orientation == 'vertical':
    cbar = fig.colorbar(mappable, ax=axes, orientation=orientation, fraction=0.04, pad=0.03)
  else:
    cbar = fig.colorbar(mappable, ax=axes, orientation=orientation, fraction=0.08, pad=0.02,
                        shrink=0.6, aspect=40)
  cbar.set_ticks([0.0, 1.0])
  cbar.set_ticklabels([f'first (n={num_steps})', 'last (n=1)'])
  cbar.set_label('reveal step')


def level_legend(fig: Figure, num_levels: int) -> None:
  """A legend of the level outlines (none for K = 1)."""
  if num_levels <= 1:
    return
  colors, widths = level_outline(np.arange(num_levels), num_levels)
  handles = [Line2D([], [], color=colors[k], lw=widths[k], label=f'level {k}')
             for k in range(num_levels - 1, -1, -1)]
  fig.legend(handles=handles, loc='outside lower center', ncol=min(num_levels, 6), fontsize='x-small',
             frameon=False, title='outline = level (higher = revealed earlier)', title_fontsize='x-small')


# ----------------------------------------------------------------------------------------------------
# Sample rows and records for the `--mode=sample` pictures of the tasks.


class PictureRows(NamedTuple):
  """Sampled rows as the pictures read them: numpy [B, L] each; `given` = never revealed."""
  tokens: np.ndarray
  levels: np.ndarray
  reveal_step: np.ndarray
  given: np.ndarray


def picture_rows(outputs: Any, num_steps: int, given: np.ndarray | None = None) -> PictureRows:
  """The rows of a `SampleOutput` (tokens, levels, reveal_step [B, L]; jax or numpy arrays).

  `given` (bool [B, L]) marks the given positions; None reads them from the sampler's convention
  `reveal_step == T + 1`.
  """
  tokens = np.asarray(outputs.tokens)
  levels = np.asarray(outputs.levels)
  steps = np.asarray(outputs.reveal_step)
  if tokens.ndim != 2 or levels.shape != tokens.shape or steps.shape != tokens.shape:
    raise ValueError(f'outputs.tokens/levels/reveal_step must all be [B, L]; got {tokens.shape}, '
                     f'{levels.shape}, {steps.shape}')
  given_arr = steps == num_steps + 1 if given is None else check_given(given, tokens.shape)
  return PictureRows(tokens, levels, steps, given_arr)


def record_field(records: Sequence[dict[str, Any]], field: str) -> np.ndarray:
  """`field` of every JSON record of `--mode=sample`, stacked ([N, ...])."""
  missing = [n for n, r in enumerate(records) if field not in r]
  if missing:
    raise ValueError(f'sample pictures: record(s) {missing[:5]} have no {field!r} field')
  return np.stack([np.asarray(r[field]) for r in records])


def picture_dir(workdir: str | os.PathLike[str], subdir: str) -> epath.Path:
  """DIR/subdir (local or `gs://`), created."""
  out = storage.join(storage.absolute(workdir), subdir)
  storage.makedirs(out)
  return storage.as_path(out)
