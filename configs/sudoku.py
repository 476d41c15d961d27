"""Default Sudoku HMDLM demo: offline, 1,200 steps (about 10 minutes on 2 quiet CPU cores).

  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=/tmp/hmdlm_sudoku

Data: puzzles generated on the first run and cached (data.cache_dir; Palm's CSVs via
data.train_path / data.test_path), a fresh Sudoku symmetry of each puzzle every epoch. Model: a
4-layer width-128 DiT with Sudoku-aware positions (learned row, column and box tables). K = 6
levels from the solving round of each cell (SPEC 6): level 5 = determined directly from the clues.
Schedule: log-linear with offsets δ_k = 0.04·k, i.e. (0, .04, .08, .12, .16, .2): the higher
(easier) a level, the later it is masked and the earlier it is revealed; increasing offsets satisfy
Appendix D's ordering. Evaluation: confidence-ordered greedy sampling with T = 81 steps (solve rate,
cell accuracy per level).

Why these values (measured on this machine, README): the MDLM twin leaves its chance-level plateau
after ~120 steps; HMDLM with the tied weights β_hier = β_cons = 1 and offsets up to 0.5 was still on
it after 300-425 steps (the hazard-weighted level terms dominate the shared backbone early on), so
the demo uses β_hier = β_cons = 0.1 (eq. 76 makes them tunable) and offsets up to 0.2. The step
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
NUM_STEPS = 1200  # ≈ 10 min on 2 CPU cores (README); a step budget keeps the figures reproducible
TOP_OFFSET = 0.2  # δ_5; δ_k = TOP_OFFSET·k/(K-1)
BETA = 0.1  # β_hier = β_cons (eq. 76); see the docstring


def get_config() -> ml_collections.ConfigDict:
  c = base.get_base_config()
  c.seed = 0

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 6  # SPEC 6
  m.vocab_size = 10  # digits 1..9 -> tokens 0..8, MASK = 9 (hmdlm_jax/data/sudoku.py)
  m.mask_id = -1
  m.seq_len = 81
  m.num_layers = NUM_LAYERS
  m.hidden_size = WIDTH
  m.num_heads = WIDTH // 32
  m.mlp_dim = 4 * WIDTH
  m.cond_dim = 64
  m.dropout = 0.0  # symmetries already give endless fresh puzzles
  m.position_embedding = 'sudoku'
  m.variant = 'two_pass'
  m.prior_corrected_head = True

  s = c.schedule
  s.kind = 'loglinear'
  s.offsets_max = TOP_OFFSET
  s.offsets = tuple(round(TOP_OFFSET * k / 5, 10) for k in range(6))  # as derived, for readers

  c.loss.beta_hier = BETA
  c.loss.beta_cons = BETA
  c.loss.train_steps_T = 81  # Algorithm 1's s = t - 1/T_train on the sampling grid T = 81

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
  sm.temperature = 1.0
  sm.seeds = (0,)

  e = c.eval
  e.kind = 'sudoku'
  e.num_examples = 100
  e.use_ema = True
  return c
