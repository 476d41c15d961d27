r"""MultiMDM on offline text (Shakespeare, or any local text): configs/text.py's model and data.

Expected (scripts/few_step.py on Shakespeare, 3 seeds, judge GenPPL at equal entropy 3.2): at
K = 2 steps `:distill` 706 ± 154 against `:mdlm_distill`'s 848 ± 214 and the `:mdlm_more` control's
1,428 ± 411 (real text: 50); no difference at K >= 8 (docs/results/multimdm.md).

Recipes (config string after the file name): the default (or `:rand`) 2,000 steps from scratch;
`:mdlm` with --config.train.num_steps=1500, the MDLM stage; `:cont` 500 more steps from it
(--config.init.workdir=DIR_MDLM); `:distill` / `:mdlm_distill` consistency distillation of
MultiMDM-cont / of MDLM (--config.init.workdir=...); `:mdlm_more` the control: MDLM trained on
from DIR_MDLM for the distillation's steps with its optimiser (docs/method.md §13.2). `python -m scripts.few_step --task=text
--archive=...` runs them all with a 512-piece WordPiece vocabulary trained on the train split.
Choices: K = 1; M = 16 masks appended after the words (data.mask_token='append'); α = β = 1 - t;
'-cont' 3:1 as the paper's 150K + 50K (docs/results/multimdm.md). Data: text.py's small-corpus
shortcut (tokenised at start-up); a prepared corpus with --config.data.kind=corpus (data/corpus.py).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import text

NUM_MASKS = 16
OPTIONS = ('', 'rand', 'mdlm', 'cont', 'distill', 'mdlm_distill', 'mdlm_more')
BERT_WORDS = 30522


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/multimdm_text.py:{arg}: the option must be one of {OPTIONS}.')
  c = text.get_config()
  c.model.num_levels = 1
  c.model.variant = 'two_pass'
  c.model.hier_stop_gradient = False
  c.schedule.offsets = (0.0,)
  c.data.hierarchy = 'none'
  c.data.mask_token = 'append'
  c.sample.ordering = 'ancestral'
  if arg in ('mdlm', 'mdlm_more'):
    c.process.kind = 'mdlm'
    c.model.vocab_size = BERT_WORDS + 1
    c.model.mask_id = -1
    if arg == 'mdlm_more':
      _distillation_optimiser(c)
      c.train.ckpt_every = 250
    return c
  c.process.kind = 'multimdm'
  mm = c.process.multimdm
  mm.num_masks = 1 if arg == 'mdlm_distill' else NUM_MASKS
  c.model.vocab_size = BERT_WORDS + mm.num_masks
  c.model.mask_id = -1
  if arg == 'cont':
    c.train.num_steps = 500
    c.optim.warmup_steps = 50
    mm.curriculum_steps = 250
  elif arg in ('distill', 'mdlm_distill'):
    mm.distill = True
    mm.distill_kl = 'reverse'
    mm.delta_init = 2.0 ** -6
    mm.delta_double_every = 150
    mm.delta_max = 2.0 ** -4
    _distillation_optimiser(c)
  c.train.ckpt_every = 250
  return c


def _distillation_optimiser(c: ml_collections.ConfigDict) -> None:
  """The distillation's steps and optimiser, shared by `:mdlm_more` (the same extra steps)."""
  c.train.num_steps = 500
  c.optim.lr = 3e-4
  c.optim.warmup_steps = 0
  c.optim.ema_decay = 0.99
  c.optim.ema_warmup = False
