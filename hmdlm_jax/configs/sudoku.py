"""Default Sudoku demo: HMDLM whose level head learns the hierarchy; offline, 900 steps.

  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=/tmp/hmdlm_sudoku

Expected: ~65% solved greedy / 48% stochastic (cell accuracy 85.3% / 76.3%), level accuracy ~0.82
against a prior of 0.64, on the 100 generated test puzzles (2 CPU cores, ~10 min). On 500 puzzles
over four seeds: level accuracy 0.812 ± 0.002, the head's order +5.8 ± 0.6 solve points over
ignoring it, no lead over the MDLM twin at equal training time (docs/results/sudoku.md, with why
these values).

The token network is configs/sudoku_base.py's (a 4-layer width-128 DiT, K = 6 levels from each
blank cell's solving round, offsets δ_k = 0.1·k). Beside it the hierarchy pathway of
docs/method.md §4.7 learns the levels: width 32, one attention head, two tied blocks per round of
constraint propagation, 8× the token network's learning rate. Decoding: confidence order, T = 81,
the head's reveal probability in the score at weight 0.1. `--config.model.num_levels=1`: the twin.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import sudoku_learned_hierarchy

NUM_STEPS = 900  # a step budget keeps the figures reproducible across machines


def get_config() -> ml_collections.ConfigDict:
  c = sudoku_learned_hierarchy.get_config()
  c.model.pathway.width = 32
  c.model.pathway.num_heads = 1
  c.optim.hier_lr_scale = 8.0  # level accuracy >= 0.80 on each seed at 900 steps
  c.train.num_steps = NUM_STEPS
  c.data.num_test_puzzles = 100
  c.eval.num_examples = 100
  return c
