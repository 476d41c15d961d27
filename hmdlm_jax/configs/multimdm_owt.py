r"""MultiMDM on OpenWebText: the paper's 170M DiT, M = 50, batch 1024, lr 3e-4, 200K steps.

Expected: not measured in this repository (it needs an accelerator pod and OpenWebText).

Data: your export (JSON lines of {"text": ...}, parquet, .txt) tokenised once with GPT-2's
tokenizer by `python -m hmdlm_jax.data.prepare --tokenizer=gpt2 --output=DIR` (--split=train and
--split=test), then --config.data.corpus_dir=DIR: rows of L = 1,024 packed as MDLM wraps
OpenWebText (docs/method.md §6). Recipes as configs/multimdm_lm1b.py (`:rand`, `:mdlm`, `:cont`,
`:distill`, `:mdlm_distill`); or start from MDLM's released OWT checkpoint converted by
`python -m hmdlm_jax.convert_mdlm` (MASK = 50257): --config.init.mdlm_checkpoint=mdlm_owt.npz.
Vocabulary: 50,257 GPT-2 ids, then MDLM's MASK or the 50 masks. Batch 1,024 × 1,024 tokens needs
`train.grad_accum` on small meshes. Small slices (v5e-8, 16 GB chips): --config.model.remat=block
with --config.train.grad_accum=8 (16: more headroom); accumulation alone does not fit. Compiled:
docs/results/performance.md ("TPU slices, by compilation"). Details: docs/results/multimdm.md.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import lm1b
from hmdlm_jax.configs import multimdm_lm1b

GPT2_WORDS = 50257
OPTIONS = multimdm_lm1b.OPTIONS


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/multimdm_owt.py:{arg}: the option must be one of {OPTIONS}.')
  c = lm1b.get_config()
  c.model.num_levels = 1
  c.schedule.offsets = (0.0,)
  c.model.seq_len = 1024
  d = c.data
  d.kind = 'corpus'
  d.corpus_dir = ''  # set on the command line: the folder `prepare` wrote
  d.packing = 'wrap'
  d.tokenizer = 'gpt2'
  d.mask_token = 'append'
  d.hierarchy = 'none'
  d.seq_len = 1024
  multimdm_lm1b.paper_settings(c)
  c.eval.kind = 'perplexity'
  c.eval.num_samples = 128
  c.eval.num_examples = 5000
  c.train.eval_every = 0
  if arg == 'mdlm':
    c.process.kind = 'mdlm'
    c.model.vocab_size = GPT2_WORDS + 1
    c.model.mask_id = -1
    c.train.num_steps = 150_000
    return c
  multimdm_lm1b.multimdm_settings(c, arg, GPT2_WORDS, 200_000)
  return c
