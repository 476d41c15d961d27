r"""MultiMDM on LM1B: the paper's 170M DiT, M = 50, batch 1024, lr 3e-4, 200K steps (App. C.2).

Expected: not measured in this repository (it needs an accelerator pod and LM1B; the same process
on Sudoku and offline text: docs/results/multimdm.md).

Recipes (config string after the file name; data as in configs/lm1b.py):
  :rand          200K steps from random initialisation
  :mdlm, :cont   MultiMDM-cont: 150K MDLM steps, then 50K MultiMDM steps from its EMA weights
                 (--config.init.workdir=DIR_MDLM)
  :distill       consistency distillation (Algorithm 3): R = 5 rounds of 10^4 steps, δ = 2^-9
                 doubling per round (--config.init.workdir=DIR_CONT)
  :mdlm_distill  MDLM with shared-Gumbel paths (--config.init.workdir=DIR_MDLM)
Model: DiT 12 × 768, rotary, bf16 (App. C.2.2). BERT's [MASK] (id 103) for the MDLM stage; the 50
masks appended after the 30,522 ids for MultiMDM, the warm start copying row 103 into them.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import lm1b_mdlm

NUM_MASKS = 50
BERT_WORDS = 30522
OPTIONS = ('', 'rand', 'mdlm', 'cont', 'distill', 'mdlm_distill')


def paper_settings(c: ml_collections.ConfigDict) -> None:
  """App. C.2.2's pretraining settings on top of an LM1B / OWT config."""
  c.model.time_conditioning = True
  c.data.batch_size = 1024
  o = c.optim
  o.lr = 3e-4
  o.warmup_steps = 2500
  o.decay = 'constant'
  o.b1, o.b2 = 0.9, 0.999
  o.weight_decay = 0.0
  o.ema_decay = 0.9999
  c.sample.ordering = 'ancestral'
  c.sample.num_steps = 32
  c.sample.num_samples = 128
  c.train.eval_every = 0


def multimdm_settings(c: ml_collections.ConfigDict, arg: str, words: int,
                      total_steps: int) -> None:
  """The MultiMDM process and the option's schedule (shared by LM1B and OWT)."""
  c.process.kind = 'multimdm'
  mm = c.process.multimdm
  mm.num_masks = 1 if arg == 'mdlm_distill' else NUM_MASKS
  c.model.vocab_size = words + mm.num_masks
  c.model.mask_id = -1
  c.data.mask_token = 'append'
  c.train.num_steps = total_steps
  if arg == 'cont':
    c.train.num_steps = total_steps // 4  # 50K of 200K
    mm.curriculum_steps = 10_000
  elif arg in ('distill', 'mdlm_distill'):
    mm.distill = True
    mm.distill_kl = 'reverse'
    mm.delta_init = 2.0 ** -9
    mm.delta_double_every = 10_000
    mm.delta_max = 2.0 ** -5
    c.train.num_steps = 50_000  # R = 5 rounds of K_R = 10^4 steps
    c.data.batch_size = 64
    c.optim.warmup_steps = 0


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/multimdm_lm1b.py:{arg}: the option must be one of {OPTIONS}.')
  c = lm1b_mdlm.get_config()
  paper_settings(c)
  c.eval.kind = 'perplexity'
  c.eval.num_samples = 128
  if arg == 'mdlm':
    c.train.num_steps = 150_000
    return c
  multimdm_settings(c, arg, BERT_WORDS, 200_000)
  return c
