r"""HDLM on LM1B (docs/method.md §13.1): bert-base-uncased, n = 64 MiniLM clusters, the LM1B model.

Expected: not measured in this repository (no LM1B, no accelerator; docs/results/hdlm.md).

configs/lm1b.py's model, data and optimiser with the HDLM process: MASK = BERT's [MASK] (id 103)
and the 64 cluster tokens as the last rows (vocab_size = 30,522 + 64), the committed
size-constrained k-means clusters of all-MiniLM-L6-v2's word embeddings
(assets/hdlm_clusters/bert-base-uncased_minilm-l6_n64.npz; the authors cluster bert-base-uncased's
own embeddings, which the offline package does not ship), γ = 1, ξ = 1, t ∈ [1e-4, 1], the authors'
LM1B weight clipping [0, 10] in training (the evaluation reports the unclipped bound); no levels.

  python -m hmdlm_jax.main --config=configs/hdlm_lm1b.py --workdir=DIR \
      --config.data.tfds_data_dir=/data/tfds
  python -m hmdlm_jax.data.clusters --embeddings=minilm --num_clusters=64 \
      --out=assets/hdlm_clusters/bert-base-uncased_minilm-l6_n64.npz    # rebuild them, ~50 s
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import hdlm_text
from hmdlm_jax.configs import lm1b


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
