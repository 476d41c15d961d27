"""Pictures (hmdlm_jax/visualize.py, tasks/*_pictures.py) carry exactly the numbers they claim."""

from __future__ import annotations

import os

import matplotlib
from matplotlib import patches as mpatches
import numpy as np
from PIL import Image
import pytest

from hmdlm_jax.configs import base as base_config
from hmdlm_jax.processes import schedules
from hmdlm_jax import visualize
from hmdlm_jax.tasks import sudoku_pictures
from hmdlm_jax.tasks import text_pictures

SOLUTION = ('534678912672195348198342567859761423426853791713924856961537284'
            '287419635345286179')
T = 12  # sampling steps of the synthetic runs


def _synthetic_run(seed: int = 0, num_steps: int = T, num_levels: int = 6):
  """A quiz, a full solution as tokens, levels and reveal steps in the sampler's convention."""
  rng = np.random.default_rng(seed)
  sol_digits = np.array([int(c) for c in SOLUTION])
  quiz = np.where(rng.random(81) < 0.35, sol_digits, 0)
  tokens = sol_digits - 1
  levels = rng.integers(0, num_levels, 81)
  steps = rng.integers(1, num_steps + 1, 81)
  steps[quiz > 0] = num_steps + 1  # SampleOutput: given positions have T + 1
  return quiz, tokens, levels, steps


def _rgba(c) -> np.ndarray:
  return np.asarray(matplotlib.colors.to_rgba(c), np.float64)


def _patches_by_gid(fig, prefix: str) -> dict[str, mpatches.Patch]:
  out = {}
  for ax in fig.axes:
    for p in ax.patches:
      gid = p.get_gid()
      if gid and gid.startswith(prefix):
        out[gid] = p
  return out


# ---------------------------------------------------------------------------------------------------
# Colour helpers.


def test_reveal_colors_equal_colormap_at_normalised_step():
  steps = np.array([[T, 1, 5], [T + 1, 7, 2]])
  given = steps == T + 1
  got = visualize.reveal_colors(steps, T, 'viridis', given)
  assert got.shape == (2, 3, 4)
  cmap = matplotlib.colormaps['viridis']
  for idx in np.ndindex(steps.shape):
    if given[idx]:
      np.testing.assert_array_equal(got[idx], visualize.GIVEN_COLOR)
    else:
      u = (T - steps[idx]) / (T - 1)  # first step n = T -> 0, last n = 1 -> 1
      np.testing.assert_allclose(got[idx], cmap(u), atol=0, rtol=0)
  # Endpoints of the order: the first step is the colormap start, the last its end.
  np.testing.assert_allclose(got[0, 0], cmap(0.0))
  np.testing.assert_allclose(got[0, 1], cmap(1.0))


def test_reveal_colors_single_step_and_errors():
  np.testing.assert_allclose(visualize.reveal_colors(np.array([1]), 1, 'magma')[0],
                             matplotlib.colormaps['magma'](0.0))
  with pytest.raises(ValueError, match='reveal_step must lie in 1..5'):
    visualize.reveal_colors(np.array([0, 3]), 5)
  with pytest.raises(ValueError, match='reveal_step must lie in 1..5'):
    visualize.reveal_colors(np.array([6]), 5)  # T + 1 is only allowed where given
  with pytest.raises(ValueError, match='num_steps'):
    visualize.reveal_colors(np.array([1]), 0)
  with pytest.raises(ValueError, match='integer'):
    visualize.reveal_colors(np.array([1.0]), 3)


def test_level_outline_monotone_and_exact_endpoints():
  colors, widths = visualize.level_outline(np.arange(6), 6)
  assert colors.shape == (6, 4) and widths.shape == (6,)
  np.testing.assert_allclose(widths, np.linspace(visualize.LEVEL_MIN_LINEWIDTH,
                                                 visualize.LEVEL_MAX_LINEWIDTH, 6))
  lo, hi = visualize._LEVEL_CMAP_RANGE
  cmap = matplotlib.colormaps[visualize.LEVEL_CMAP]
  np.testing.assert_allclose(colors, cmap(np.linspace(lo, hi, 6)))
  # K = 1 (MDLM): one level, thinnest outline.
  _, w1 = visualize.level_outline(np.zeros(3, np.int64), 1)
  np.testing.assert_allclose(w1, visualize.LEVEL_MIN_LINEWIDTH)
  with pytest.raises(ValueError, match='levels must lie in 0..1'):
    visualize.level_outline(np.array([2]), 2)


# ---------------------------------------------------------------------------------------------------
# Schedules.


@pytest.mark.parametrize('kind,params', [('loglinear', (0.0, 0.25)), ('power', (1.0, 2.0, 3.0))])
def test_plot_schedules_lines_carry_exact_alpha_and_hazard(kind, params, tmp_path):
  sched = schedules.Schedule(kind, params)
  path = tmp_path / 'sched.png'
  fig = visualize.plot_schedules(sched, num_points=201, path=path)
  assert path.stat().st_size > 0
  ax_a, ax_h = fig.axes[:2]
  assert ax_h.get_yscale() == 'log'
  assert [ln.get_label() for ln in ax_a.lines] == [f'level {k}' for k in range(len(params))]
  eps = sched.eps
  for k, p in enumerate(params):
    t = np.asarray(ax_a.lines[k].get_xdata())
    y = np.asarray(ax_a.lines[k].get_ydata())
    assert t.shape == (201,)
    # Exactly what the schedule computes ...
    np.testing.assert_array_equal(y, np.asarray(sched.alpha(t))[:, k])
    # ... and the closed form of docs/method.md §2 (float64 re-derivation; float32 tolerance).
    t64 = t.astype(np.float64)
    if kind == 'loglinear':
      ref = 1 - (1 - eps) * np.clip((t64 - p) / (1 - p), 0, 1)
    else:
      ref = 1 - (1 - eps) * t64**p
    np.testing.assert_allclose(y, ref, atol=2e-7)
    # Hazard lines: the positive hazards only, equal to 1/(t - δ) resp. ω/t (docs/method.md §2).
    th = np.asarray(ax_h.lines[k].get_xdata(), np.float64)
    yh = np.asarray(ax_h.lines[k].get_ydata(), np.float64)
    ref_h = 1.0 / (th - p) if kind == 'loglinear' else p / th
    np.testing.assert_allclose(yh, ref_h, rtol=2e-4)
    expected_count = int(np.sum(t64[1:] > p)) if kind == 'loglinear' else 200
    assert th.shape == (expected_count,)


def test_plot_reveal_ordering_marks_exactly_the_violating_steps():
  # ω decreasing in k violates Appendix D at every step with λ_0 > λ_1 (numpy re-derivation).
  bad = schedules.Schedule('power', (2.0, 1.0))
  num_steps = 10
  fig = visualize.plot_reveal_ordering(bad, num_steps)
  ax = fig.axes[0]
  n = np.arange(1, num_steps + 1)
  t, s = n / num_steps, (n - 1) / num_steps
  lam = np.stack([(t**w - s**w) / t**w for w in (2.0, 1.0)], -1)  # (1-ε) cancels
  expected = set(n[lam[:, 0] > lam[:, 1] + 1e-12].tolist())
  assert expected == {v.step for v in schedules.ordering_violations(bad, num_steps)}
  assert len(expected) == num_steps - 1  # all but n = 1, where both λ are 1
  marks = [ln for ln in ax.lines if ln.get_gid() == 'violation']
  assert sorted(round(float(m.get_xdata()[0]) * num_steps) for m in marks) == sorted(expected)
  # Lines carry the reveal probabilities of the schedule.
  for k in range(2):
    line = next(ln for ln in ax.lines if ln.get_label() == f'level {k}')
    np.testing.assert_allclose(line.get_ydata(), lam[:, k], rtol=1e-5)

  good = schedules.Schedule('loglinear', (0.0, 0.25))
  fig = visualize.plot_reveal_ordering(good, 16)
  ax = fig.axes[0]
  assert not [ln for ln in ax.lines if ln.get_gid() == 'violation']
  lvl1 = next(ln for ln in ax.lines if ln.get_label() == 'level 1')
  # Level 1 is inactive for t_n <= δ_1 = 0.25 (λ_1 = 0): those steps are left off the log axis.
  np.testing.assert_allclose(lvl1.get_xdata(), np.arange(5, 17) / 16)


# ---------------------------------------------------------------------------------------------------
# Sudoku.


def test_plot_sudoku_reveal_cell_colours_outlines_and_digits(tmp_path):
  quiz, tokens, levels, steps = _synthetic_run()
  wrong = int(np.flatnonzero(quiz == 0)[0])
  tokens = tokens.copy()
  tokens[wrong] = (tokens[wrong] + 1) % 9
  path = tmp_path / 'grid.png'
  fig = sudoku_pictures.plot_sudoku_reveal(quiz, tokens, levels, steps, T, title='x',
                                           solution=SOLUTION, path=path)
  assert path.stat().st_size > 0
  cells = _patches_by_gid(fig, 'cell-')
  assert len(cells) == 81
  cmap = matplotlib.colormaps[visualize.REVEAL_CMAP]
  texts = {t.get_gid(): t for t in fig.axes[0].texts if t.get_gid()}
  for i in range(81):
    r, c = divmod(i, 9)
    cell = cells[f'cell-{r}-{c}']
    digit = texts[f'digit-{r}-{c}']
    assert digit.get_text() == str(tokens[i] + 1)
    if quiz[i]:
      np.testing.assert_allclose(cell.get_facecolor(), visualize.GIVEN_COLOR)
      assert cell.get_linewidth() == pytest.approx(visualize.GIVEN_LINEWIDTH)
      assert f'level-{r}-{c}' not in texts
    else:
      np.testing.assert_allclose(cell.get_facecolor(), cmap((T - steps[i]) / (T - 1)))
      frac = levels[i] / 5
      assert cell.get_linewidth() == pytest.approx(
          visualize.LEVEL_MIN_LINEWIDTH + frac * (visualize.LEVEL_MAX_LINEWIDTH
                                                  - visualize.LEVEL_MIN_LINEWIDTH))
      lo, hi = visualize._LEVEL_CMAP_RANGE
      np.testing.assert_allclose(cell.get_edgecolor(),
                                 matplotlib.colormaps[visualize.LEVEL_CMAP](lo + (hi - lo) * frac))
      assert texts[f'level-{r}-{c}'].get_text() == str(levels[i])
    is_red = np.allclose(_rgba(digit.get_color()), _rgba('red'))
    assert is_red == (i == wrong)


def test_plot_sudoku_reveal_rejects_inconsistent_inputs():
  quiz, tokens, levels, steps = _synthetic_run()
  g = int(np.flatnonzero(quiz > 0)[0])
  bad = tokens.copy()
  bad[g] = (bad[g] + 1) % 9
  with pytest.raises(ValueError, match='disagree with the quiz'):
    sudoku_pictures.plot_sudoku_reveal(quiz, bad, levels, steps, T)
  with pytest.raises(ValueError, match='0..8'):
    sudoku_pictures.plot_sudoku_reveal(quiz, np.where(quiz > 0, tokens, 9), levels, steps, T)
  with pytest.raises(ValueError, match='81 cells'):
    sudoku_pictures.plot_sudoku_reveal('123', tokens, levels, steps, T)
  with pytest.raises(ValueError, match='levels must lie in 0..5'):
    sudoku_pictures.plot_sudoku_reveal(quiz, tokens, levels + 1, steps, T)


def test_sudoku_comparison_draws_both_runs_on_the_same_quiz():
  quiz, tokens, levels, steps = _synthetic_run(seed=1)
  mdlm_steps = np.where(quiz > 0, T + 1, np.random.default_rng(2).integers(1, T + 1, 81))

  class Out:  # duck-typed SampleOutput with a batch axis

    def __init__(self, lv, st):
      self.tokens, self.levels, self.reveal_step = tokens[None], lv[None], st[None]

  fig = sudoku_pictures.plot_sudoku_reveal_comparison(
      Out(levels, steps), Out(np.zeros_like(levels), mdlm_steps), ''.join(map(str, quiz)),
      num_steps=T)
  ax_h, ax_m = fig.axes[:2]
  assert ax_h.get_title() == 'HMDLM' and ax_m.get_title() == 'MDLM'
  cmap = matplotlib.colormaps[visualize.REVEAL_CMAP]
  free = np.flatnonzero(quiz == 0)
  for ax, st in ((ax_h, steps), (ax_m, mdlm_steps)):
    cells = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    for i in free:
      r, c = divmod(int(i), 9)
      np.testing.assert_allclose(cells[f'cell-{r}-{c}'].get_facecolor(), cmap((T - st[i]) / (T - 1)))
  # MDLM is drawn with K = 1: every generated outline is the thinnest, and no level numbers.
  widths = {p.get_linewidth() for p in ax_m.patches if p.get_gid()}
  assert widths <= {visualize.LEVEL_MIN_LINEWIDTH, visualize.GIVEN_LINEWIDTH}
  assert not [t for t in ax_m.texts if (t.get_gid() or '').startswith('level-')]


def test_sudoku_gif_has_one_frame_per_distinct_reveal_step_plus_quiz(tmp_path):
  quiz, tokens, levels, steps = _synthetic_run(seed=3)
  steps = np.where(quiz > 0, T + 1, np.minimum(steps, 9))  # steps 10..12 reveal nothing
  path = tmp_path / 'solve.gif'
  frames = sudoku_pictures.sudoku_reveal_gif(quiz, tokens, steps, levels, path, fps=5, num_steps=T)
  expected = len(np.unique(steps[quiz == 0])) + 1
  assert expected == 10
  assert len(frames) == expected
  assert len({f.size for f in frames}) == 1
  with Image.open(path) as im:
    assert im.n_frames == expected
    assert im.info['duration'] == 200
  # Consecutive frames differ (every frame reveals at least one cell).
  arrays = [np.asarray(f) for f in frames]
  assert all(np.any(a != b) for a, b in zip(arrays, arrays[1:]))
  with pytest.raises(ValueError, match='fps'):
    sudoku_pictures.sudoku_reveal_gif(quiz, tokens, steps, levels, path, fps=0, num_steps=T)


# ---------------------------------------------------------------------------------------------------
# Text.


def test_text_timeline_one_box_per_token_with_colours_and_wrapping(tmp_path):
  words = ('[CLS] the cat sat on the mat while the dog ##gy slept under a warm blanket near the '
           'fire [SEP]').split()
  num = len(words)
  rng = np.random.default_rng(0)
  steps = rng.integers(1, T + 1, num)
  levels = rng.integers(0, 2, num)
  given = np.zeros(num, bool)
  given[:2] = True
  steps[:2] = T + 1
  path = tmp_path / 'text.png'
  fig = text_pictures.plot_text_reveal(words, steps, levels, T, given=given, chars_per_line=30,
                                   path=path)
  assert path.stat().st_size > 0
  boxes = _patches_by_gid(fig, 'token-')
  assert len(boxes) == num
  cmap = matplotlib.colormaps[visualize.REVEAL_CMAP]
  ys = set()
  for i in range(num):
    box = boxes[f'token-{i}']
    ys.add(box.get_y())
    assert box.get_x() + box.get_width() <= 30 + 0.6 + 1e-9  # wrapped at chars_per_line (+ pad)
    if given[i]:
      np.testing.assert_allclose(box.get_facecolor(), visualize.GIVEN_COLOR)
    else:
      np.testing.assert_allclose(box.get_facecolor(), cmap((T - steps[i]) / (T - 1)))
      want = visualize.LEVEL_MAX_LINEWIDTH if levels[i] == 1 else visualize.LEVEL_MIN_LINEWIDTH
      assert box.get_linewidth() == pytest.approx(want)
  total_chars = sum(len(w) + 0.6 + 0.4 for w in words)
  assert len(ys) >= int(np.ceil(total_chars / 31.0))  # at least this many lines
  # Boxes on a line do not overlap and keep the token order.
  xs = [(boxes[f'token-{i}'].get_y(), boxes[f'token-{i}'].get_x()) for i in range(num)]
  assert xs == sorted(xs, key=lambda yx: (-yx[0], yx[1]))
  with pytest.raises(ValueError, match='L = '):
    text_pictures.plot_text_reveal(words[:-1], steps, levels, T)


# ---------------------------------------------------------------------------------------------------
# --mode=sample hook.


class _Outputs:

  def __init__(self, tokens, levels, reveal_step):
    self.tokens, self.levels, self.reveal_step = tokens, levels, reveal_step


def test_save_sample_pictures_sudoku_reads_givens_from_reveal_step(tmp_path):
  cfg = base_config.get_base_config()
  cfg.data.kind = 'sudoku'
  cfg.model.num_levels = 6
  cfg.sample.num_steps = T
  runs = [_synthetic_run(seed=s) for s in range(3)]
  out = _Outputs(*(np.stack([r[j] for r in runs]) for j in (1, 2, 3)))
  paths = sudoku_pictures.save_sample_pictures(cfg, str(tmp_path), out, max_pictures=2)
  names = sorted(os.path.basename(p) for p in paths)
  assert names == ['sudoku_reveal_0.gif', 'sudoku_reveal_0.png', 'sudoku_reveal_1.png']
  for p in paths:
    assert os.path.getsize(p) > 0 and os.path.dirname(p) == str(tmp_path / 'pictures')
  with Image.open(tmp_path / 'pictures' / 'sudoku_reveal_0.gif') as im:
    quiz0, _, _, steps0 = runs[0]
    assert im.n_frames == len(np.unique(steps0[quiz0 == 0])) + 1


def test_save_sample_pictures_text_cuts_rows_after_eos(tmp_path):
  cfg = base_config.get_base_config()
  cfg.data.kind = 'text'
  cfg.model.num_levels = 2
  cfg.sample.num_steps = T
  rng = np.random.default_rng(0)
  out = _Outputs(rng.integers(3, 50, (2, 20)), rng.integers(0, 2, (2, 20)),
                 rng.integers(1, T + 1, (2, 20)))
  out.tokens[0, 5] = 2  # EOS: row 0 is drawn up to and including it
  seen = []

  def decode(ids):
    seen.append(len(ids))
    return [f'w{i}' for i in ids]

  paths = text_pictures.save_sample_pictures(cfg, str(tmp_path), out, decode_fn=decode, eos_id=2)
  assert [os.path.basename(p) for p in paths] == ['text_reveal_0.png', 'text_reveal_1.png']
  assert seen == [6, 20]


def test_save_record_pictures_from_run_sample_records(tmp_path):
  # Sudoku records as evaluation.run.run_sample writes them (strings of digits, lists).
  cfg = base_config.get_base_config()
  cfg.data.kind = 'sudoku'
  cfg.model.num_levels = 6
  cfg.sample.num_steps = T
  quiz, tokens, levels, steps = _synthetic_run(seed=4)
  rec = {'quiz': ''.join(map(str, quiz)), 'prediction': ''.join(str(d + 1) for d in tokens),
         'levels': levels.tolist(), 'reveal_step': steps.tolist()}
  paths = sudoku_pictures.save_record_pictures(cfg, str(tmp_path), [rec], gif=True)
  assert sorted(os.path.basename(p) for p in paths) == ['sudoku_reveal_0.gif',
                                                        'sudoku_reveal_0.png']
  with Image.open(next(p for p in paths if p.endswith('.gif'))) as im:
    assert im.n_frames == len(np.unique(steps[quiz == 0])) + 1

  # Text records: drawn up to and including the first EOS, with the tokenizer's pieces.
  cfg.data.kind = 'text'
  cfg.model.num_levels = 2
  seen = []

  class _HF:

    def convert_ids_to_tokens(self, ids):
      seen.append(list(ids))
      return [f'p{i}' for i in ids]

  class _Tok:
    hf = _HF()
    eos_id = 2

  ids = [1, 5, 6, 7, 2, 0, 0, 0]
  text_rec = {'tokens': ids, 'levels': [0, 1, 0, 1, 0, 0, 0, 0],
              'reveal_step': [T + 1, 3, 4, 5, 6, 7, 8, 9], 'given': [1, 0, 0, 0, 0, 0, 0, 0]}
  paths = text_pictures.save_record_pictures(cfg, str(tmp_path), [text_rec], tokenizer=_Tok())
  assert [os.path.basename(p) for p in paths] == ['text_reveal_0.png']
  assert seen == [[1, 5, 6, 7, 2]]
  with pytest.raises(ValueError, match="no 'given' field"):
    text_pictures.save_record_pictures(
        cfg, str(tmp_path), [{k: v for k, v in text_rec.items() if k != 'given'}],
        tokenizer=_Tok())
