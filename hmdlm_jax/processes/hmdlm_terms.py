"""HMDLM's three per-position loss terms (docs/method.md §5), normalised per loss position.

Per masked loss position i, with λ'_k(t) the hazard of level k (schedules.py):
  L_LM   = λ'_{h0^i}(t) · (-log f^i[x0^i])                  (eq. 73, pass 2)
  L_hier = λ'_{h0^i}(t) · (-log g^i[h0^i])                  (eq. 74, pass 1)
  L_cons = Σ_k g^i_k λ'_k(t) − λ'_{h0^i}(t)                  (eq. 75, pass 1)
each summed over positions that are masked AND in `loss_mask` and divided by the number of loss
positions (never by the number that happen to be masked, which would bias the bound). `lm_term`
and `level_terms` are the two halves (pass 2's term and pass 1's).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def per_position(table: jax.Array, levels: jax.Array) -> jax.Array:
  """table [B, K] indexed by levels [B, L] -> [B, L]."""
  return jnp.take_along_axis(table, levels, axis=1)


def loss_terms(tok_nll: jax.Array, level_logp: jax.Array, levels: jax.Array, masked: jax.Array,
               loss_mask: jax.Array, hazard: jax.Array) -> dict[str, jax.Array]:
  """The three per-example loss terms (eq. 73-75), normalised per loss position.

  Args:
    tok_nll: [B, L] -log f^i[x0^i].
    level_logp: [B, L, K] log g (zeros [B, L, 1] for K = 1).
    levels: [B, L] gold levels h0.
    masked, loss_mask: [B, L] bool.
    hazard: [B, K] λ'_k(t).
  Returns:
    dict 'lm', 'hier', 'cons' of [B]: sums over masked loss positions / max(#loss positions, 1).
  """
  chex.assert_equal_shape_prefix((tok_nll, level_logp), 2)
  return dict(lm_term(tok_nll, levels, masked, loss_mask, hazard),
              **level_terms(level_logp, levels, masked, loss_mask, hazard))


def _loss_positions(levels: jax.Array, masked: jax.Array, loss_mask: jax.Array,
                    hazard: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(sel [B, L] masked loss positions, n [B] max(#loss positions, 1), λ'_{h0^i}(t) [B, L])."""
  chex.assert_rank((levels, masked, loss_mask, hazard), (2, 2, 2, 2))
  chex.assert_equal_shape((levels, masked, loss_mask))
  sel = masked.astype(bool) & loss_mask.astype(bool)
  n = jnp.maximum(loss_mask.astype(bool).sum(-1), 1).astype(hazard.dtype)
  return sel, n, per_position(hazard, levels)


def lm_term(tok_nll: jax.Array, levels: jax.Array, masked: jax.Array, loss_mask: jax.Array,
            hazard: jax.Array) -> dict[str, jax.Array]:
  """L_LM of `loss_terms` alone (eq. 73): dict 'lm' of [B]; it never reads g."""
  sel, n, lam0 = _loss_positions(levels, masked, loss_mask, hazard)
  chex.assert_equal_shape((tok_nll, levels))
  # Select before multiplying so a non-finite value at an unused position cannot leak (0 * inf).
  return dict(lm=(lam0 * jnp.where(sel, tok_nll, 0.0)).sum(-1) / n)


def level_terms(level_logp: jax.Array, levels: jax.Array, masked: jax.Array, loss_mask: jax.Array,
                hazard: jax.Array) -> dict[str, jax.Array]:
  """L_hier and L_cons of `loss_terms` alone (eq. 74-75): dict 'hier', 'cons' of [B]."""
  sel, n, lam0 = _loss_positions(levels, masked, loss_mask, hazard)
  chex.assert_shape(level_logp, levels.shape + hazard.shape[-1:])
  hier_nll = -jnp.take_along_axis(level_logp, levels[..., None], axis=-1)[..., 0]
  hier = lam0 * jnp.where(sel, hier_nll, 0.0)
  cons = jnp.where(sel, (jnp.exp(level_logp) * hazard[:, None, :]).sum(-1) - lam0, 0.0)
  return dict(hier=hier.sum(-1) / n, cons=cons.sum(-1) / n)
