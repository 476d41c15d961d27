r"""MultiMDM on Sudoku (few-step solving): configs/sudoku_base.py's model and data, M = 3 masks.

Recipes (config string after the file name; DIR_* are run directories):

  # MDLM twin of sudoku_base (1,200 steps), then MultiMDM-cont: 400 more steps from its EMA weights
  python -m hmdlm_jax.main --config=configs/sudoku_mdlm.py --workdir=DIR_MDLM
  python -m hmdlm_jax.main --config=configs/multimdm_sudoku.py:cont --workdir=DIR_MM \
      --config.init.workdir=DIR_MDLM
  # consistency distillation (Algorithm 3) of each: MultiMDM, and MDLM with shared-Gumbel paths
  python -m hmdlm_jax.main --config=configs/multimdm_sudoku.py:distill --workdir=DIR_MM_CD \
      --config.init.workdir=DIR_MM
  python -m hmdlm_jax.main --config=configs/multimdm_sudoku.py:mdlm_distill \
      --workdir=DIR_MDLM_CD --config.init.workdir=DIR_MDLM
  # MultiMDM from scratch, sudoku_base's budget (default, or ':rand')
  python -m hmdlm_jax.main --config=configs/multimdm_sudoku.py --workdir=DIR_RAND

The few-step table (solve rate and cell accuracy at 1, 2, 4, 8, 16, 81 network calls) is
`python -m scripts.few_step --task=sudoku` (docs/multimdm_results.md), which runs all of the above.

Choices (docs/method.md §13.2): M = 3, m_x = x mod 3 (each mask class holds 3 digits; the paper's
rule M ≳ N^{1/L} asks for little here, and M = 9 would make the designated mask the digit itself);
α = β = 1 - t (the paper's); decoding by confidence like sudoku_base (`sample.ordering`: the
expected number of cells per step, the most confident first, the other cells' masks drafted by
(3.4); 'ancestral' is (3.7) with random reveal times), argmax tokens (`sample.greedy`); the curriculum ramps the identification term in over
the first half of the continual run (the paper: "reconstruction first, identification gradually",
no numbers given). Distillation: App. C.2's dyadic δ schedule shortened to the run (2^-6 doubling
every 100 steps up to 2^-4), reverse KL, EMA target μ = 0.99 (no EMA warm-up: the target starts
as the pretrained model), lr 1e-4 constant.
"""

from __future__ import annotations

import ml_collections

from configs import sudoku_mdlm

NUM_MASKS = 3
WORDS = 9  # digits 1..9 -> tokens 0..8
OPTIONS = ('', 'rand', 'cont', 'distill', 'mdlm_distill')


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/multimdm_sudoku.py:{arg}: the option must be one of {OPTIONS}.')
  c = sudoku_mdlm.get_config()
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
    c.train.num_steps = 400
    c.optim.warmup_steps = 50
    c.optim.lr = 3e-4
    mm.curriculum_steps = 200
  elif arg in ('distill', 'mdlm_distill'):
    mm.distill = True
    mm.distill_kl = 'reverse'
    mm.delta_init = 2.0 ** -6
    mm.delta_double_every = 100
    mm.delta_max = 2.0 ** -4
    c.train.num_steps = 300
    c.optim.lr = 1e-4
    c.optim.warmup_steps = 0
    c.optim.decay = 'constant'
    c.optim.ema_decay = 0.99
    c.optim.ema_warmup = False
  c.train.ckpt_every = 100
  return c
