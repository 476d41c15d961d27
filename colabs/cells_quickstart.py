"""Cells of quickstart.ipynb (colabs/make_notebooks.py writes the notebook)."""

from __future__ import annotations

from cells_shared import IMPORTS, INSTALL, PARAMETERS, SETUP  # colabs/ is on sys.path

QUICKSTART = [
    ('md', '''\
# HMDLM quickstart: train a tiny Sudoku solver and watch the order it fills the grid

Hierarchical Masked Diffusion LMs give every position a hierarchy level with its own noise
schedule: higher levels are masked more slowly and therefore revealed earlier when sampling. For
Sudoku the levels come from how directly a cell follows from the givens (level 5 = forced by the
givens, level 0 = needs search), so the model learns to fill the easy cells first.

This notebook trains a small model for a few minutes on a CPU runtime (`configs/sudoku.py`, the
offline demo), solves a puzzle and draws the reveal order. **On a Colab GPU/TPU runtime** set
`QUICK = False` (the paper's 25M model, `configs/sudoku_25m.py`) and `ACCELERATOR` in the setup
cell.'''),
    ('parameters', PARAMETERS + '''
QUICK = True  # True: 4-layer demo model, minutes on a CPU. False: the paper's 25M model (GPU/TPU).
CONFIG = None  # None: configs/sudoku.py when QUICK, else configs/sudoku_25m.py
TRAIN_MINUTES = 5.0  # wall-clock budget of the training cell
TRAIN_STEPS = None  # a number of steps instead of the budget (test mode: 2)'''),
    ('code', SETUP + '\n' + INSTALL),
    ('code', IMPORTS),
    ('md', '''\
## Config

`configs/sudoku.py` is a 4-layer, width-128 DiT over the 81 cells with Sudoku-aware positions,
K = 6 levels and offsets δ = (0, .1, …, .5), plus a small hierarchy pathway that learns each
blank cell's level, trained on generated puzzles for `TRAIN_MINUTES` (rerun the training cell to
train longer). The test mode (`HMDLM_NOTEBOOK_TEST=1`) swaps in the
2-layer width-32 `configs/tiny_test.py` and trains a handful of steps.'''),
    ('code', '''\
CONFIG = CONFIG or ('configs/sudoku.py' if QUICK else 'configs/sudoku_25m.py')
config = load_config('configs/tiny_test.py' if TEST else CONFIG)
RUN_DIR = WORKDIR / 'sudoku_run'
config.data.cache_dir = str(WORKDIR / 'sudoku_cache')  # generated puzzles are cached here
config.train.final_eval = False  # we evaluate below, on one puzzle
if TEST or TRAIN_STEPS:
  config.train.num_steps = TRAIN_STEPS or 2
  config.train.ckpt_every = 1000
else:
  config.train.num_steps = 10_000_000  # the time budget stops training first
  config.train.time_budget_s = 60.0 * TRAIN_MINUTES
print(config.model)'''),
    ('md', '''\
## Train

`main.run('train', ...)` (what `python -m hmdlm_jax.main` runs) resumes from
`RUN_DIR/checkpoints` when it exists, so rerunning this cell continues training.'''),
    ('code', '''\
from hmdlm_jax import main

result = main.run('train', config, str(RUN_DIR))
print('stopped at step', result['step'], 'because of', result['stop_reason'])
print({k: round(float(v), 4) for k, v in result['train'].items() if k in ('loss', 'lm', 'hier', 'cons')})'''),
    ('md', '''\
## Solve a puzzle

A generated test puzzle (the one with the most givens among 64, so a briefly trained model can
solve much of it; paste any 81-character puzzle instead). `hmdlm_jax.load(RUN_DIR)` reads the
config the run recorded and restores its latest checkpoint (EMA weights); `solve` runs the
configured sampler (confidence ordering for Sudoku) as `--mode=sample` does and records for every
cell the step `n` at which it was revealed (n = T is the first step) and the level the model drew
for it. Nothing is written unless you save it.'''),
    ('code', '''\
import json

from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator
from hmdlm_jax.tasks import sudoku_pictures

quizzes, _, _ = sudoku_generator.generate_dataset(0, 64, 'test', progress=False)
PUZZLE = ''.join(map(str, quizzes[np.argmax((quizzes > 0).sum(-1))]))
# Example 1 of the paper's Appendix F (sudoku-hard: almost every cell needs search, level 0):
# PUZZLE = '506070800400000016000000000002000003070050400000900020960000500030002007000100000'
trained = hmdlm_jax.load(RUN_DIR)  # also: step=..., params='raw', overrides=[...]
solved = trained.solve([PUZZLE])
rec = solved.records[0]
(WORKDIR / 'quickstart_solution.json').write_text(json.dumps(rec))  # kept for later cells/runs
num_solutions, solution = sudoku_data.count_solutions(sudoku_csv.parse_puzzle(PUZZLE))
assert num_solutions == 1, 'the puzzle should have exactly one solution'
wrong = sum(p != str(d) for p, d in zip(rec['prediction'], solution))
print(f'{wrong} of {PUZZLE.count("0")} blank cells wrong')'''),
    ('md', '''\
## Reveal order

Each generated cell is coloured by the step that revealed it (dark = first), its outline and corner
number show the level the hierarchy head drew for it (thick/dark red = high level = expected
early); givens are grey; wrong digits are red.'''),
    ('code', '''\
T = int(config.sample.num_steps)
tokens = np.array([int(c) for c in rec['prediction']]) - 1
levels = np.array(rec['levels'])
reveal_step = np.array(rec['reveal_step'])
png = PICTURES / 'quickstart_sudoku_reveal.png'
sudoku_pictures.plot_sudoku_reveal(rec['quiz'], tokens, levels, reveal_step, T,
                                   title=f'HMDLM, step {trained.step}, T = {T}',
                                   num_levels=int(config.model.num_levels), solution=solution,
                                   path=png)
show(png)'''),
    ('code', '''\
gif = PICTURES / 'quickstart_sudoku_reveal.gif'
frames = sudoku_pictures.sudoku_reveal_gif(rec['quiz'], tokens, reveal_step, levels, gif, fps=3,
                                           num_steps=T, num_levels=int(config.model.num_levels),
                                           solution=solution)
print(len(frames), 'frames ->', gif)
show(gif)'''),
    ('md', '''\
Do the drawn levels agree with the labeller's (computed from the givens by constraint propagation)?
A trained model reveals level-5 cells first: compare the mean reveal order per labeller level.'''),
    ('code', '''\
labeller = np.array(rec['labeller_levels'])
free = np.array([c == '0' for c in rec['quiz']])
order = visualize.normalized_reveal_order(reveal_step, T, ~free)
for k in range(int(config.model.num_levels) - 1, -1, -1):
  sel = free & (labeller == k)
  if sel.any():
    print(f'labeller level {k}: {sel.sum():2d} cells, drawn level agrees {np.mean(levels[sel] == k):.0%}, '
          f'mean reveal order {np.nanmean(order[sel]):.2f} (0 = first step, 1 = last)')'''),
    ('md', '''\
Next: `schedules_explorer.ipynb` (the per-level schedules and the ordering condition) and
`checkpoint_explorer.ipynb` (load a checkpoint, sample, perplexity on text). From the command line:
`python -m hmdlm_jax.main --config=configs/tiny_test.py --workdir=/tmp/run --mode=sample`.'''),
]
