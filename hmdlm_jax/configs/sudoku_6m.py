"""The paper's 6M Sudoku model (Appendix F.1, docs/method.md §4b; Table 6): MGDM's compact GPT-2.

Expected: not measured in this repository (100k steps need an accelerator; docs/results/sudoku.md).

3 layers, width 384, 12 heads of 32, GELU MLP 1536, learned absolute positions, output head tied
to the input embedding, bidirectional attention; HMDLM adds a level table and level head. 100k
steps, T = 81, confidence-based sampling, 3 sampling seeds (mean ± std). Our vocabulary is the 9
digits + MASK (the paper's 31-character vocabulary only changes the embedding size).
`--config.model.num_levels=1` is the 6M MDLM/MGDM-style baseline. Data and optimiser as in
configs/sudoku_25m.py (the paper gives no optimiser settings).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import sudoku_25m


def get_config() -> ml_collections.ConfigDict:
  c = sudoku_25m.get_config()
  m = c.model
  m.backbone = 'gpt2'
  m.num_layers = 3
  m.hidden_size = 384
  m.num_heads = 12
  m.mlp_dim = 1536
  m.position_embedding = 'learned'
  m.tie_embeddings = True
  m.dropout = 0.1
  return c
