"""Nucleus (top-p) token draws (processes/base.nucleus_logits, draw_tokens; sample.top_p).

The kept set is checked exactly against a float64 numpy re-derivation of the definition (keep v
iff the tokens more probable than v hold less than top_p of the mass), ties included; the draws
against the truncated, renormalised tempered law (total variation, stated tolerance).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base


def _kept_reference(logits: np.ndarray, top_p: float) -> np.ndarray:
  """bool [..., V]: the nucleus by its definition, in float64, without sorting."""
  x = logits.astype(np.float64)
  p = np.exp(x - x.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  flat, out = p.reshape(-1, p.shape[-1]), np.zeros(p.shape, bool).reshape(-1, p.shape[-1])
  for r, row in enumerate(flat):
    asc = np.sort(row)
    suffix = np.concatenate([np.cumsum(asc[::-1])[::-1], [0.0]])  # suffix[i] = Σ asc[i:]
    out[r] = suffix[np.searchsorted(asc, row, side='right')] < top_p  # Σ_{u: p_u > p_v} p_u
  return out.reshape(p.shape)


@pytest.mark.parametrize('vocab', [12, 300])  # the inverse-CDF and the Gumbel-max paths
@pytest.mark.parametrize('top_p', [0.1, 0.5, 0.9, 0.999])
def test_nucleus_keeps_exactly_the_reference_set(vocab, top_p):
  logits = np.random.default_rng(vocab).normal(0.0, 2.0, (5, 7, vocab)).astype(np.float32)
  got = np.isfinite(np.asarray(base.nucleus_logits(jnp.asarray(logits), top_p)))
  want = _kept_reference(logits, top_p)
  np.testing.assert_array_equal(got, want)
  assert want.sum(-1).min() >= 1 and (want.sum(-1) < vocab).any()  # a real truncation
  kept = np.asarray(base.nucleus_logits(jnp.asarray(logits), top_p))
  np.testing.assert_array_equal(kept[want], logits[want])  # kept logits unchanged


def test_nucleus_keeps_boundary_ties_whole_and_top_p_one_is_identity():
  logits = jnp.log(jnp.asarray([[0.4, 0.2, 0.2, 0.2]], jnp.float32))
  got = np.isfinite(np.asarray(base.nucleus_logits(logits, 0.5)))
  np.testing.assert_array_equal(got, [[True, True, True, True]])  # 0.4 < 0.5: every 0.2 kept
  got = np.isfinite(np.asarray(base.nucleus_logits(logits, 0.4)))
  np.testing.assert_array_equal(got, [[True, False, False, False]])
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 9)), jnp.float32)
  assert base.nucleus_logits(x, 1.0) is x


def test_draws_follow_the_truncated_tempered_law():
  """40,000 draws at τ = 0.8, top_p = 0.7 on one row of 8: no draw outside the nucleus and a
  total variation to the renormalised truncated law under 0.01 (its sampling s.d. ~0.003)."""
  p = np.array([0.3, 0.25, 0.15, 0.1, 0.08, 0.06, 0.04, 0.02])
  cfg = config_lib.SampleConfig(num_steps=1, num_levels=1, mask_id=8, temperature=0.8,
                                top_p=0.7)
  logp = jnp.broadcast_to(jnp.log(jnp.asarray(p, jnp.float32)), (200, 200, 8))
  draws = np.asarray(base.draw_tokens(jax.random.PRNGKey(0), logp, cfg)).ravel()
  tempered = p ** (1 / 0.8) / (p ** (1 / 0.8)).sum()
  keep = _kept_reference(np.log(tempered), 0.7)
  law = np.where(keep, tempered, 0.0) / tempered[keep].sum()
  freq = np.bincount(draws, minlength=8) / draws.size
  assert (freq[~keep] == 0).all() and keep.sum() == 3
  assert 0.5 * np.abs(freq - law).sum() < 0.01


def test_top_p_is_checked():
  with pytest.raises(ValueError, match=r'sample\.top_p=0\.0 must lie in \(0, 1\]'):
    config_lib.SampleConfig(num_steps=1, num_levels=1, mask_id=1, top_p=0.0)
