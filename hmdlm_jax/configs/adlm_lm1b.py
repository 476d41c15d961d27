"""ADLM on LM1B (Rout et al., NeurIPS 2025, Table 1a; docs/method.md §13.4): the paper's recipe.

Expected: not measured in this repository (no LM1B, no accelerator); the paper reports test PPL
26.40 at 1M steps (≈ 33B tokens) and 24.46 at 2M (`--config.train.num_steps=2000000`, ≈ 65B).

configs/lm1b.py's data and backbone (bert-base-uncased rows of L = 128, BERT's [MASK] id 103, DiT
12 × 768 as the anchor network, dropout 0.1, no time conditioning, batch 512, AdamW 3e-4 with 2,500
warm-up steps then constant, clip 1.0, EMA 0.9999, bfloat16) with `process.kind='adlm'`: a 6-block
denoiser on the raw anchor logits, γ = 3e-3 with the authors' ramp min(γ, k / num_steps), τ = 5
(the paper's; HMDLM measures 99.16% of LM1B tokens as anchors at τ = 5), MDLM's log-linear
schedule (ε = 1e-3), one level. 232.5M parameters (anchor 139.3M + denoiser 93.2M).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import lm1b
from hmdlm_jax.configs.adlm_text import to_adlm


def get_config() -> ml_collections.ConfigDict:
  c = to_adlm(lm1b.get_config(), tau=5)
  c.train.num_steps = 1_000_000  # ≈ 33B loss tokens (steps × 512 × 128 / 2)
  return c
