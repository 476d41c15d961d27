"""HDLM on LM1B (docs/method.md §13.1): bert-base-uncased, n = 64 MiniLM clusters, the LM1B model.

configs/lm1b.py's model, data and optimiser (DiT 12 × 768, L = 128, batch 512, AdamW 3e-4,
1.25M steps ≈ 33B tokens, bf16) with the HDLM process: MASK = BERT's own [MASK] (id 103, MDLM's
LM1B convention) and the 64 cluster tokens as the last rows (vocab_size = 30,522 + 64), the
committed size-constrained k-means clusters of all-MiniLM-L6-v2's word embeddings
(assets/hdlm_clusters/bert-base-uncased_minilm-l6_n64.npz; the authors cluster bert-base-uncased's
own embeddings, which the offline package does not ship: MiniLM's table has the same 30,522 rows),
γ = 1, ξ = 1, t ∈ [1e-4, 1] and the authors' LM1B weight clipping [0, 10] in training (the
evaluation reports the unclipped bound). No position levels (`model.num_levels=1`).

  python -m hmdlm_jax.main --config=configs/hdlm_lm1b.py --workdir=/ckpt/hdlm_lm1b \
      --config.data.tfds_data_dir=/data/tfds
  python -m hmdlm_jax.main --config=configs/hdlm_lm1b.py --workdir=/ckpt/hdlm_lm1b --mode=eval

Rebuild the clusters (50 s on 2 CPU cores):
  python -m hmdlm_jax.data.clusters --embeddings=minilm --num_clusters=64 \
      --out=assets/hdlm_clusters/bert-base-uncased_minilm-l6_n64.npz
"""

from __future__ import annotations

import ml_collections

from configs import hdlm_text
from configs import lm1b


def get_config() -> ml_collections.ConfigDict:
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
  c.model.num_levels = 1
  c.model.vocab_size = 30522 + 64
  c.model.mask_id = 103
  c.data.hierarchy = 'none'
  c.loss.t_min = 1e-4
  return c
