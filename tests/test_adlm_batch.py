"""ADLM's batch reduction: rows of unequal length weigh by their loss tokens (docs/method.md §13.4).

The authors' loss sums the per-token terms of the whole batch and divides by its loss tokens, so a
row of 1 token counts once and a row of 3 thrice. `ADLM.loss` on such a batch equals a float64
numpy sum over tokens / total tokens (with the same t and z_t draws, an independent re-derivation
of both terms), and a row mean of the per-row normalised terms (the mutation) fails it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.processes import adlm
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm

VOCAB, MASK, L, TAU, GAMMA, T_MIN = 4, 3, 3, 1, 0.5, 1e-3


def _table_model(seed: int):
  """apply_fn: 'anchor' and 'token' logits [B, L, VOCAB] looked up per noisy row."""
  rng = np.random.default_rng(seed)
  tables = {h: rng.normal(size=(VOCAB ** L, L, VOCAB)) * 2 for h in adlm.HEADS}
  code_w = VOCAB ** np.arange(L - 1, -1, -1)

  def fn(tokens, levels, t, *, heads, **_):
    del levels, t
    code = (tokens * jnp.asarray(code_w)).sum(-1)
    return {h: jnp.asarray(tables[h], jnp.float32)[code] for h in heads}

  return fn, tables, code_w


def _batch() -> dict[str, np.ndarray]:
  tokens = np.array([[1, 0, 0], [2, 2, 1], [0, 1, 2]], np.int32)
  loss_mask = np.array([[1, 0, 0], [1, 1, 1], [0, 1, 1]], bool)  # 1, 3 and 2 loss tokens
  given = np.array([[0, 0, 0], [0, 0, 0], [1, 0, 0]], bool)
  return {'tokens': tokens, 'levels': np.zeros_like(tokens), 'given': given,
          'loss_mask': loss_mask}


def _numpy_loss(batch, t, xt, tables, code_w) -> float:
  """Σ over loss tokens of w(t) (−log x_ψ[x] · 1{masked} + γ A −log softmax(y_φ)[x]) / Σ N_b."""
  total = 0.0
  for b in range(batch['tokens'].shape[0]):
    x, loss = batch['tokens'][b], batch['loss_mask'][b]
    real = loss | batch['given'][b]
    code, w = int((xt[b] * code_w).sum()), 1.0 / t[b]  # log-linear: w(t) = 1/t
    for pos in np.flatnonzero(loss):
      tok = tables['token'][code, pos].copy()
      tok[MASK] = -np.inf  # the MASK column carries no mass (zero-masking parameterisation)
      tok = tok - tok.max() - np.log(np.exp(tok - tok.max()).sum())
      anc = tables['anchor'][code, pos]
      anc = anc - anc.max() - np.log(np.exp(anc - anc.max()).sum())
      is_anchor = (x[real] == x[pos]).sum() <= TAU
      total += w * (-tok[x[pos]] * (xt[b, pos] == MASK) + GAMMA * is_anchor * -anc[x[pos]])
  return total / batch['loss_mask'].sum()


def _loss_against_numpy(seed: int) -> tuple[float, float]:
  proc = adlm.make(hmdlm.Schedule('loglinear', (0.0,), eps=0.0, eta=0.0), mask_id=MASK,
                   gamma=GAMMA, tau=TAU, t_min=T_MIN, antithetic=False)
  fn, tables, code_w = _table_model(seed)
  batch = proc.prepare_batch(_batch())
  key = jax.random.key(seed)
  got, _ = proc.loss(fn, {k: jnp.asarray(v) for k, v in batch.items()}, key)
  # The draws the loss makes (its key split), re-made to evaluate the same z_t in numpy.
  k_t, k_mask, _ = jax.random.split(key, 3)
  t = base.sample_times(k_t, 3, t_min=T_MIN, antithetic=False)
  xt, _, _ = hmdlm.corrupt(k_mask, jnp.asarray(batch['tokens']), jnp.zeros((3, L), jnp.int32),
                           jnp.asarray(batch['given']), t, proc.mdlm.schedule, mask_id=MASK)
  want = _numpy_loss(batch, np.asarray(t, np.float64), np.asarray(xt), tables, code_w)
  return float(got), want


def test_rows_of_unequal_length_weigh_by_their_tokens():
  for seed in range(4):
    got, want = _loss_against_numpy(seed)
    assert got == pytest.approx(want, rel=2e-6), (seed, got, want)


def test_a_row_mean_fails_the_token_weighted_reference(monkeypatch):
  def row_mean(values, loss_mask):
    del loss_mask
    return values.astype(jnp.float32).mean()

  monkeypatch.setattr(adlm.base, 'token_weighted_mean', row_mean)
  far = [abs(got - want) > 1e-3 * abs(want) for got, want in map(_loss_against_numpy, range(4))]
  assert all(far)
