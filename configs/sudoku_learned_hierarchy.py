"""Sudoku HMDLM whose level head learns the hierarchy (issue 11; docs/hierarchy_results.md 12-23).

  python -m hmdlm_jax.main --config=configs/sudoku_learned_hierarchy.py --workdir=DIR

configs/sudoku_base.py with the hierarchy pathway of docs/method.md §4.7: it reads the
embedded input (givens as their own state, its own input table and time embedding), runs two tied
blocks per solving round for the five rounds at width 64, reads one hazard per round, and learns
each round's digits (`loss.beta_rounds`) besides the levels (plain cross-entropy, its own gradient
clip). The Sudoku candidate features feed this pathway only, so the token network is the base's
and `--config.model.num_levels=1` gives exactly the base's MDLM twin. 2,000 steps, 46.3 G matrix
FLOPs per step (1.28x the base's: `python -m scripts.step_cost`; 95.2 G at the full width,
`--config.model.hier_width=0`, items 12-14); about 25 minutes of training alone on 2 CPU cores
(2026-12-03), plus about 10 of evaluation on 500 test puzzles.

Measured (500 generated test puzzles, docs/hierarchy_results.md items 19-21, seeds 0-2): with the
pathway's learning rate 5x the token network's (`optim.hier_lr_scale`) the jointly trained head
reaches level accuracy 0.898 against a prior of 0.614 (0.891 at 3x, 0.825 at 1x, items 16, 19);
ordering the reveals by it beats ignoring it by +5.7 ± 1.5 solve / +3.1 ± 0.5 cell points (w = 1;
+3.8 / +2.8 at 3x), and greedy decoding at w = 0.1 (`sample.hierarchy_weight`: the head's reveal
probability enters the confidence score with a small weight) solves 74.0 ± 0.9% (+4.7 ± 0.7 over
ignoring the head; w = 1: 75.0 ± 1.1%, paired +1.0 ± 1.9, within noise). The width-32 pathway
(`--config.model.hier_width=32`, at 3x) leads its MDLM twin at equal matrix FLOPs (2,426 steps) by
+6.2 ± 0.2 greedy and +6.0 ± 1.6 stochastic, but not at equal wall time on a 2-core CPU, where the
training loop's step is 1.9-2.1x the twin's (4,154 twin steps: +1.8 ± 1.0 greedy, -0.7 ± 0.3
stochastic, item 20; at 5x +2.3 ± 0.7 / -1.1 ± 0.7, item 21). The final evaluation reports all
three decodings and, as a reference, the labeller's order. `--config.model.hier_num_heads=1` (one
attention head in the pathway) keeps the level accuracy and makes the step 10-20% faster, but
decoded about one point lower at 1x (3 seeds, within noise; item 18), so the pathway keeps four
heads here; at width 32 (5x) one head decodes as four do (3 seeds, every decoding within a point,
paired) at a training-loop step of 1.58x the twin's against 2.08x (item 23).
"""

from __future__ import annotations

import ml_collections

from configs import sudoku_base


def get_config() -> ml_collections.ConfigDict:
  c = sudoku_base.get_config()

  m = c.model
  m.given_state = True  # givens are not "revealed level-5 cells"
  m.sudoku_candidates = True
  m.candidates_pathway_only = True  # the token network stays the base's
  m.hier_input_embed = True
  m.hier_time_conditioning = True
  m.hier_source = 'input'  # the pathway computes the rounds itself (its head re-reads the grid)
  m.hier_layers = 2  # tied blocks per round
  m.hier_width = 64  # item 16: half the pathway's FLOPs of the full width, a larger decoding gain
  m.hier_repeats = 5  # one repeat per solving round (K - 1)
  m.hier_readout = 'rounds'

  c.loss.hier_objective = 'cross_entropy'
  c.loss.beta_rounds = 1.0  # each round learns the digits it places
  c.optim.hier_grad_clip = 1.0  # the pathway's gradient does not throttle the backbone's step
  c.optim.hier_lr_scale = 5.0  # items 19, 21: level accuracy 0.825 (1x) -> 0.891 (3x) -> 0.898
  c.train.num_steps = 2000

  c.sample.hierarchy_weight = 0.1  # items 13, 16: 0.1 (and 0.3) beat 0 and 1

  c.data.num_test_puzzles = 500
  e = c.eval
  e.num_examples = 500
  e.hierarchy_diagnostics = True
  e.hierarchy_decodings = ('head_ignored', 'head_order', 'labeller_order')
  return c
