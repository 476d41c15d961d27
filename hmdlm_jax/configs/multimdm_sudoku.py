r"""MultiMDM on Sudoku (few-step solving): configs/sudoku_base.py's model and data, M = 3 masks.

Expected (scripts/few_step.py, 200 test puzzles, 3 seeds, confidence decoding): no few-step
gain: at 4 network calls MultiMDM-cont solves 17.3 ± 2.0% against its budget-matched control's
20.0 ± 2.2%, at 81 calls 56.7 ± 0.9% against 60.0 ± 2.8% (docs/results/multimdm.md).

Recipes (`:option` after the file name; init.workdir=DIR names the run it starts from):
  :cont          400 MultiMDM steps from MDLM's EMA weights (DIR = configs/sudoku_mdlm.py's run)
  :distill       consistency distillation (Algorithm 3) of a MultiMDM run (DIR = :cont's run)
  :mdlm_distill  MDLM with shared-Gumbel paths (DIR = MDLM's run)
  :mdlm_more     the control: MDLM trained on for the distillation's steps with its optimiser
  :mdlm_more_cont  the control of :cont (its steps and optimiser); :mdlm_more from it is
                 the control of :distill (docs/method.md §13.2)
  :rand          MultiMDM from scratch at sudoku_base's budget (the default)
`python -m scripts.few_step --task=sudoku` runs them all; choices: docs/method.md §13.2.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import sudoku_mdlm

NUM_MASKS = 3
WORDS = 9  # digits 1..9 -> tokens 0..8
OPTIONS = ('', 'rand', 'cont', 'distill', 'mdlm_distill', 'mdlm_more', 'mdlm_more_cont')


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/multimdm_sudoku.py:{arg}: the option must be one of {OPTIONS}.')
  c = sudoku_mdlm.get_config()
  if arg in ('mdlm_more', 'mdlm_more_cont'):
    (_distillation_optimiser if arg == 'mdlm_more' else _cont_optimiser)(c)
    c.train.ckpt_every = 100
    return c
  c.process.kind = 'multimdm'
  mm = c.process.multimdm
  mm.num_masks = 1 if arg == 'mdlm_distill' else NUM_MASKS
  c.model.vocab_size = WORDS + mm.num_masks
  c.model.mask_id = -1
  c.sample.ordering = 'confidence'  # sudoku_base's decoding; 'ancestral' is (3.7)
  c.sample.greedy = True
  c.sample.num_steps = 81
  c.sample.level_context = 'candidates'
  c.sample.hierarchy_weight = 1.0
  if arg == 'cont':
    _cont_optimiser(c)
    mm.curriculum_steps = 200
  elif arg in ('distill', 'mdlm_distill'):
    mm.distill = True
    mm.distill_kl = 'reverse'
    mm.delta_init = 2.0 ** -6
    mm.delta_double_every = 100
    mm.delta_max = 2.0 ** -4
    _distillation_optimiser(c)
  c.train.ckpt_every = 100
  return c


def _cont_optimiser(c: ml_collections.ConfigDict) -> None:
  """MultiMDM-cont's steps and optimiser, shared by `:mdlm_more_cont` (the same extra steps)."""
  c.train.num_steps = 400
  c.optim.warmup_steps = 50
  c.optim.lr = 3e-4


def _distillation_optimiser(c: ml_collections.ConfigDict) -> None:
  """The distillation's steps and optimiser, shared by `:mdlm_more` (the same extra steps)."""
  c.train.num_steps = 300
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 0
  c.optim.decay = 'constant'
  c.optim.ema_decay = 0.99
  c.optim.ema_warmup = False
