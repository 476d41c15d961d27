"""Training-only objectives of the level pathway (docs/method.md §5.1).

Neither term is part of the bound, which `hmdlm.diffusion_loss` reports whatever trains the head:
* `level_cross_entropy`: the mean −log g^i[h0^i] over the masked loss positions
  (`loss.hier_objective='cross_entropy'`; the minimiser of the bound's L_hier + L_cons too);
* `round_token_loss`: L_rounds, each round of the pathway learns the digits it decides
  (`loss.beta_rounds` > 0).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def level_cross_entropy(level_logp: jax.Array, levels: jax.Array, sel: jax.Array) -> jax.Array:
  """Mean −log g^i[h0^i] over the selected positions of the batch: [] (0 if none is selected).

  level_logp [B, L, K] log g; levels [B, L] gold h0; sel [B, L] bool (masked loss positions).
  """
  chex.assert_rank((level_logp, levels, sel), (3, 2, 2))
  nll = -jnp.take_along_axis(level_logp, levels[..., None], axis=-1)[..., 0]
  n = jnp.maximum(sel.sum(), 1).astype(jnp.float32)
  return jnp.where(sel, nll, 0.0).sum().astype(jnp.float32) / n


def round_token_loss(round_logits: jax.Array, tokens: jax.Array, levels: jax.Array,
                     sel: jax.Array) -> jax.Array:
  """L_rounds: the mean over rounds r = 1..R of the mean token NLL of round r's head over the
  selected positions whose level rounds 1..r decide (h0 >= K - r, K = R + 1): [] (docs/method.md
  §5.1). A round with no such position adds 0.

  round_logits [B, L, R, V] raw ('hier_round_tokens'); tokens, levels [B, L] x0, h0;
  sel [B, L] bool (masked loss positions).
  """
  chex.assert_rank((round_logits, tokens, levels, sel), (4, 2, 2, 2))
  chex.assert_equal_shape_prefix((round_logits, tokens, levels, sel), 2)
  num_rounds = round_logits.shape[2]
  logp = jax.nn.log_softmax(round_logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, tokens[:, :, None, None], axis=-1)[..., 0]  # [B, L, R]
  # Round r (index r-1) decides levels K-1 .. K-r, i.e. h0 >= K - r = R + 1 - r.
  first_level = num_rounds - jnp.arange(num_rounds)  # [R]: R, R-1, .., 1
  w = sel[..., None] & (levels[..., None] >= first_level)  # [B, L, R]
  per_round = (jnp.where(w, nll, 0.0).sum((0, 1))
               / jnp.maximum(w.sum((0, 1)), 1).astype(jnp.float32))
  return per_round.mean()
