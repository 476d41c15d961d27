r"""HDLM on LM1B with the authors' LM1B recipe (docs/method.md §13.1); `:mdlm` is its MDLM twin.

Expected: not measured in this repository (no LM1B, no accelerator); the authors release this
configuration without an LM1B result (docs/results/hdlm.md).

Their lm1b-hdlm-small-cluster_64-gamma_1.0-xi_1.0: DiT 12 × 768 (dropout 0.1, time-conditioned),
bert-base-uncased sentences of L = 128 (no packing), n = 64, γ = 1, ξ = 1, clipping [0, 10];
AdamW lr 3e-4, 2,500 warm-up steps then constant, betas (0.9, 0.99), eps 1e-9, weight decay 0.02,
clip 1.0, no EMA, batch 512, 1M steps; 512 first-order sampling steps, temperature 1. MASK =
[MASK] (103), the clusters as the last 64 rows (the committed MiniLM clusters, or their .pt file).
`:mdlm`: the same recipe with n = 1 (exactly MDLM), unclipped.

  python -m hmdlm_jax.main --config=configs/hdlm_lm1b.py --workdir=DIR \
      --config.data.tfds_data_dir=/data/tfds
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import hdlm_text
from hmdlm_jax.configs import lm1b

BERT_WORDS = 30522
OPTIONS = ('', 'mdlm')


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/hdlm_lm1b.py:{arg}: the option must be one of {OPTIONS}.')
  c = lm1b.get_config()
  c.process.kind = 'hdlm'
  h = c.process.hdlm
  h.num_clusters = 64
  h.clusters = hdlm_text.BERT_N64
  h.fallback = 'error'
  h.gamma = 1.0
  h.eps = 1e-4
  h.xi = 1.0
  h.force = 'auto'
  h.clip_weights = True  # the authors' LM1B config: [0, 10]
  h.weight_min = 0.0
  h.weight_max = 10.0
  h.sampler = 'first_order'
  h.final_step = 'argmax'
  m = c.model
  m.num_levels = 1
  m.vocab_size = BERT_WORDS + 64
  m.mask_id = 103
  m.time_conditioning = True  # the authors' DiT conditions on t (adaLN)
  c.data.hierarchy = 'none'
  c.loss.t_min = 1e-4
  o = c.optim
  o.b2 = 0.99
  o.eps = 1e-9
  o.weight_decay = 0.02
  o.ema_decay = 0.0  # no EMA
  c.eval.use_ema = False
  c.train.num_steps = 1_000_000
  c.sample.num_steps = 512
  c.sample.temperature = 1.0
  if arg == 'mdlm':
    h.num_clusters = 1
    h.clusters = ''
    h.fallback = 'id'
    h.clip_weights = False
    m.vocab_size = BERT_WORDS
  return c
