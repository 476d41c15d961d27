"""ADLM fine-tuned on WikiHow: the HMDLM paper's baseline (its 5.1.2; docs/method.md §13.4).

Expected: not measured in this repository (no WikiHow data or ADLM-OWT checkpoint here); the HMDLM
paper reports ADLM up to 4.4 PPL points above HMDLM-F and an LLM-judge preference of 15.25%.

`--config=configs/adlm_wikihow.py:L` with L ∈ {256, 512, 1024} (default 512): configs/wikihow.py's
rows (GPT-2, `BOS title\\n summary\\n body EOS`, title given, long articles dropped), batch 128 and
optimiser, with `process.kind='adlm'`: anchors = tokens occurring at most once in their row (τ = 1,
the HMDLM paper's rule for ADLM here), γ = 3e-3 with the ramp min(γ, k / num_steps), MDLM's
log-linear schedule, one level, a 6-block denoiser. Steps: HMDLM-F's budget at the same L (the
paper fine-tunes both "under an identical setting"). Start from the authors' ADLM-OWT checkpoint
(`--config.init.adlm_checkpoint=adlm_owt.npz`, converted by `python -m hmdlm_jax.convert_adlm`) or
from an ADLM-OWT run of this project (`--config.init.workdir=DIR`, a configs/adlm_owt.py run).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import wikihow
from hmdlm_jax.configs.adlm_text import to_adlm

OPTIONS = ('', '256', '1024')


def get_config(config_string: str = '') -> ml_collections.ConfigDict:
  seq_len, _ = wikihow.parse(config_string)
  c = wikihow.get_config(f'{seq_len},frequency')
  c.init.mdlm_checkpoint = ''
  c.init.workdir = ''  # or init.adlm_checkpoint: set one on the command line
  return to_adlm(c, tau=1)
