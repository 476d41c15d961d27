"""The Sudoku HMDLM every Sudoku config builds on; the default demo until 2026-12-05.

  python -m hmdlm_jax.main --config=configs/sudoku_base.py --workdir=/tmp/hmdlm_sudoku_base

Offline, 1,200 steps (about 8 minutes on 2 quiet CPU cores). Its level head reads the token
network's detached features and stays at its prior (level accuracy ~0.61); the demo
(configs/sudoku.py) adds the hierarchy pathway that learns the levels. docs/hierarchy_results.md
calls this config "the demo" in items 1–33, written before the switch.

Data: puzzles generated on the first run and cached (data.cache_dir; Palm's CSVs via data.train_path
/ data.test_path), a fresh Sudoku symmetry of each puzzle every epoch. Model: a 4-layer width-128
DiT with Sudoku-aware positions: learned row, column and box tables, and a learned per-head
attention bias for each relation of two cells (same row / column / box / none,
`position_embedding='sudoku_rel'`). K = 6 levels from the solving round of each cell (docs/method.md §6): level
5 = determined directly from the clues. Schedule: log-linear with offsets δ_k = 0.1·k, i.e. (0, .1,
.2, .3, .4, .5): the higher (easier) a level, the later it is masked and the earlier it is revealed;
increasing offsets satisfy Appendix D's ordering. Evaluation: confidence-ordered sampling with T =
81 steps, greedy and stochastic (solve rate, cell accuracy, accuracy per level); pass 2 sees no
predicted levels (`sample.level_context= 'none'`), so one network call per step computes both heads.

Why these values (measured on this machine, README): with the hierarchy terms flowing into the
shared backbone, HMDLM sat on its chance-level plateau (token NLL = ln 9) for 460 steps (β = 0.1,
offsets to 0.2) or more than 425 (β = 1, offsets to 0.5), while the MDLM twin leaves it after ~120.
With `model.hier_stop_gradient=True` (L_hier / L_cons train the hierarchy head only, on detached
backbone features) HMDLM leaves it after ~150 steps at the tied weights β = 1, and pass 1 needs no
backward through the backbone (step 1.35x MDLM's instead of 1.8x). Offsets to 0.5 beat 0.2 (75.0% vs
71.8% cell accuracy at 1,200 steps without the relation bias); the relation bias roughly halves the
steps to a given token NLL (0.27 at 600 steps vs 0.44 at 1,200 without it). The hierarchy head
itself learns little at this budget (level accuracy ~0.6; level 0 is 51% of the blanks), and
decoding suffers wherever it is used: showing its levels to pass 2 ('candidates') cost 4.6 points of
cell accuracy, and ordering the reveals by it (`sample.hierarchy_weight` w = 1 / 0.3 / 0) gave 75.5
/ 80.1 / 82.9%. It therefore decodes by token confidence (w = 0), one cell per step. The step
budget (not a wall-clock one) keeps the figures reproducible across machines.

Tuning knobs, all overridable with --config.x.y=...: model size (model.*), data.batch_size,
optim.lr / optim.warmup_steps, train.num_steps, schedule.offsets_max (the top offset; offsets are
spread evenly below it), loss.beta_hier / loss.beta_cons, data.num_train_puzzles.
`--config.model.num_levels=1` alone gives the MDLM twin (configs/sudoku_mdlm.py spells it out).
"""

from __future__ import annotations

import ml_collections

from configs import base

# The few numbers one tunes first.
NUM_LAYERS = 4
WIDTH = 128
BATCH = 64
LR = 1e-3
NUM_STEPS = 1200  # ≈ 8 min on 2 CPU cores; a step budget keeps the figures reproducible
TOP_OFFSET = 0.5  # δ_5; δ_k = TOP_OFFSET·k/(K-1)


def get_config() -> ml_collections.ConfigDict:
  c = base.get_base_config()
  c.seed = 0

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 6  # docs/method.md §6
  m.vocab_size = 10  # digits 1..9 -> tokens 0..8, MASK = 9 (hmdlm_jax/data/sudoku.py)
  m.mask_id = -1
  m.seq_len = 81
  m.num_layers = NUM_LAYERS
  m.hidden_size = WIDTH
  m.num_heads = WIDTH // 32
  m.mlp_dim = 4 * WIDTH
  m.cond_dim = 64
  m.dropout = 0.0  # symmetries already give endless fresh puzzles
  m.position_embedding = 'sudoku_rel'  # row/col/box tables + a learned relation attention bias
  m.variant = 'two_pass'
  m.prior_corrected_head = True
  m.hier_stop_gradient = True  # docstring

  s = c.schedule
  s.kind = 'loglinear'
  s.offsets_max = TOP_OFFSET
  s.offsets = tuple(round(TOP_OFFSET * k / 5, 10) for k in range(6))  # as derived, for readers

  c.loss.beta_hier = 1.0  # the tied weights (eq. 76)
  c.loss.beta_cons = 1.0
  c.loss.train_steps_T = 81  # Algorithm 1's s = t - 1/T_train on the sampling grid T = 81
  # The dense token head: at V = 10 it is a sliver of the step, and the selected-rows head measured
  # no faster (this demo's step, 3 interleaved rounds, 2026-12-01: 758/734/781 ms dense,
  # 798/791/726 ms selected; benchmarks/README.md, "the token head at selected rows").
  c.loss.token_rows = 'all'

  d = c.data
  d.kind = 'sudoku'
  d.batch_size = BATCH
  d.eval_batch_size = 100
  d.augment = True
  d.num_train_puzzles = 4000
  d.num_test_puzzles = 100
  d.gen_processes = 2

  o = c.optim
  o.lr = LR
  o.warmup_steps = 200
  o.decay = 'cosine'
  o.grad_clip = 1.0
  o.ema_decay = 0.999
  o.ema_warmup = True

  t = c.train
  t.num_steps = NUM_STEPS
  t.time_budget_s = 0.0
  t.log_every = 25
  t.eval_every = 0  # only at the end
  t.ckpt_every = 250
  t.keep_last = 2
  t.max_bad_steps = 10

  sm = c.sample
  sm.num_steps = 81  # T = 81 (paper, Sudoku)
  sm.ordering = 'confidence'
  sm.greedy = True
  sm.level_context = 'none'  # docstring
  sm.hierarchy_weight = 0.0  # order by token confidence only (docstring)
  sm.temperature = 1.0
  sm.seeds = (0,)

  e = c.eval
  e.kind = 'sudoku'
  e.num_examples = 100
  e.use_ema = True
  return c
