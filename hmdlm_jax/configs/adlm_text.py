"""ADLM on the offline Shakespeare text: the twin of configs/text.py (docs/method.md §13.4).

Expected: test bound 5.283 ± 0.114 nats/token (PPL 197.0; 3 seeds, 2,000 steps), above the MDLM
twin's 4.890 ± 0.173 and HMDLM's 5.116 ± 0.045 (HMDLM − ADLM −0.167 ± 0.070, same sign in 3 of 3
seeds, p = 0.14): docs/results/baselines.md.

`configs/text.py` with the forward process replaced: `process.kind='adlm'`, the text DiT (4 × 128)
as the anchor network and a denoiser of half its blocks (2) on the raw anchor logits, γ = 3e-3
reached by the authors' ramp γ_k = min(γ, k / train.num_steps) (at step 6 of 2,000), anchors =
tokens occurring at most τ = 5 times in their row (ADLM's LM1B setting;
`--config.process.adlm.tau=1` matches HMDLM's levels), `model.num_levels=1`,
`data.hierarchy='none'`, MDLM's log-linear schedule; everything else (data, optimiser, steps) is
text.py's. Runs on 2 CPU cores with no network.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import text


def to_adlm(c: ml_collections.ConfigDict, *, tau: int, gamma: float = 3e-3
            ) -> ml_collections.ConfigDict:
  """Turns a config into its ADLM twin (in place; returns it): the process, one level, no data
  hierarchy, MDLM's schedule; the anchor network is the config's model, the denoiser half of it.

  Args:
    c: a config of any text kind.
    tau: the anchor rule's τ (a token occurring at most τ times in its row).
    gamma: γ, the anchor term's weight.
  """
  c.process.kind = 'adlm'
  a = c.process.adlm
  a.gamma = gamma
  a.tau = tau
  a.gamma_ramp_steps = -1  # γ_k = min(γ, k / train.num_steps): the authors' code
  a.denoiser_layers = 0  # half of model.num_layers, the paper's
  c.model.num_levels = 1
  c.model.variant = 'two_pass'  # irrelevant with one level
  c.model.hier_stop_gradient = False
  c.schedule.kind = 'loglinear'
  c.schedule.offsets = (0.0,)
  c.data.hierarchy = 'none'
  return c


def get_config() -> ml_collections.ConfigDict:
  return to_adlm(text.get_config(), tau=5)
