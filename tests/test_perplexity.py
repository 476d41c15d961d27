"""Tests of the perplexity evaluator (hmdlm_jax/evaluation/perplexity.py, docs/method.md §8).

Reference values are plain numpy float64 re-derivations (the accumulation) or exact enumeration +
Gauss-Legendre quadrature with the exact oracle of tests/oracle.py (the evaluator's expectation).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.data import text as text_data
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.evaluation import perplexity
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle
from tests.eval_helpers import SCHED2, random_logit_model


@dataclasses.dataclass(frozen=True, eq=False)
class _FakeProcess(hmdlm.HMDLM):
  """HMDLM whose per-example bound terms are `values[tokens[:, 0]]` (estimate: twice that)."""
  values: Any = None
  nan_at: int | None = None

  def bound_from_state(self, apply_fn, batch, state, t, key):
    v = jnp.asarray(self.values, jnp.float32)[batch['tokens'][:, 0]]
    if self.nan_at is not None:
      v = jnp.where(batch['tokens'][:, 0] == self.nan_at, jnp.nan, v)
    z = jnp.zeros_like(v)
    return {'lm': v, 'hier': 0.5 * v, 'cons': z, 'total': 1.5 * v,
            'num_tokens': batch['loss_mask'].sum(-1).astype(v.dtype)}

  @property
  def estimate_names(self) -> tuple[str, ...]:
    return ('appendix_e',)

  def estimates_from_state(self, apply_fn, batch, state, t):
    return {'appendix_e': 2.0 * jnp.asarray(self.values, jnp.float32)[batch['tokens'][:, 0]]}


def _fake_process(values: np.ndarray, *, nan_at: int | None = None) -> _FakeProcess:
  return _FakeProcess(SCHED2, LOSS_CFG, values=values, nan_at=nan_at)


def _id_batches(n: int, size: int, seq_len: int, rng: np.random.Generator):
  """Batches whose tokens[:, 0] is the example id; loss positions vary per example."""
  n_tok = rng.integers(1, seq_len + 1, n)
  batches = []
  for i in range(0, n, size):
    ids = np.arange(i, min(i + size, n))
    tokens = np.zeros((len(ids), seq_len), np.int32)
    tokens[:, 0] = ids
    loss_mask = np.arange(seq_len)[None] < n_tok[ids][:, None]
    batches.append({'tokens': tokens, 'levels': np.zeros_like(tokens),
                    'given': np.zeros(tokens.shape, bool), 'loss_mask': loss_mask})
  return batches, n_tok


LOSS_CFG = config_lib.LossConfig(mask_id=3, num_levels=2, variant='single_pass',
                                 prior_corrected=False)


def test_perplexity_accumulates_in_float64():
  rng = np.random.default_rng(0)
  n, size, seq_len = 60_000, 4096, 8
  values = (3.0 + rng.random(n)).astype(np.float32)  # per-example nats per token
  batches, n_tok = _id_batches(n, size, seq_len, rng)
  res = perplexity.evaluate_perplexity(lambda *a, **k: {}, _fake_process(values), batches,
                                     time_seed=0, progress=False)
  v64 = values.astype(np.float64)
  ref = (1.5 * v64 * n_tok).sum() / n_tok.sum()  # numpy float64 reference
  assert res['num_tokens'] == int(n_tok.sum()) and res['num_sequences'] == n
  assert res['bound_nats_per_token'] == pytest.approx(ref, rel=1e-13, abs=0)
  assert res['lm_nats_per_token'] == pytest.approx((v64 * n_tok).sum() / n_tok.sum(), rel=1e-13)
  assert res['hier_nats_per_token'] == pytest.approx(0.5 * res['lm_nats_per_token'], rel=1e-13)
  assert res['appendix_e_nats_per_token_estimate'] == pytest.approx(
      2 * res['lm_nats_per_token'], rel=1e-13)
  assert res['ppl'] == pytest.approx(math.exp(ref), rel=1e-12)
  # The same sums in float32, batch by batch as a device accumulator would: visibly off, so the
  # tolerance above is one float32 could not meet.
  total32, tok32 = np.float32(0), np.float32(0)
  for b in batches:
    ids = b['tokens'][:, 0]
    total32 += np.float32(1.5) * (values[ids] * n_tok[ids].astype(np.float32)).sum(dtype=np.float32)
    tok32 += n_tok[ids].sum(dtype=np.float32)
  err32 = abs(float(total32 / tok32) - ref) / ref
  assert err32 > 1e-9, err32
  # Standard error of the ratio estimator, from a direct float64 computation.
  u = 1.5 * v64 * n_tok
  se = math.sqrt(((u - ref * n_tok) ** 2).sum() * n / (n - 1)) / n_tok.sum()
  assert res['bound_stderr'] == pytest.approx(se, rel=1e-6)


def test_perplexity_nan_raises_with_location():
  rng = np.random.default_rng(1)
  values = np.ones(20, np.float32)
  batches, _ = _id_batches(20, 8, 4, rng)
  with pytest.raises(FloatingPointError,
                     match=r'value\(s\) hier=nan, lm=nan for batch 1, row 5 \(t = '):
    perplexity.evaluate_perplexity(lambda *a, **k: {}, _fake_process(values, nan_at=13), batches,
                                 time_seed=0, progress=False)


def _random_text_batches(n: int, size: int, seq_len: int, vocab: int, seed: int):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab - 1, (n, seq_len)).astype(np.int32)
  real = np.arange(seq_len)[None] < rng.integers(2, seq_len + 1, n)[:, None]
  levels = text_data.frequency_levels(tokens, real, 1)
  return [{'tokens': tokens[i:i + size], 'levels': levels[i:i + size],
           'given': np.zeros((min(size, n - i), seq_len), bool), 'loss_mask': real[i:i + size]}
          for i in range(0, n, size)]


@pytest.mark.parametrize('variant', ['two_pass', 'single_pass'])
def test_perplexity_deterministic_for_fixed_seed(variant):
  vocab, seq_len = 6, 7
  model = random_logit_model(vocab, 2, single_pass=variant == 'single_pass')
  apply_fn = compiled.Network(lambda params: model).bind(None)  # one compilation for all runs
  cfg = config_lib.LossConfig(mask_id=vocab - 1, num_levels=2, variant=variant)
  batches = _random_text_batches(21, 8, seq_len, vocab, seed=0)  # last batch short: padded
  proc = hmdlm.HMDLM(SCHED2, cfg)
  run = lambda seed, n_t=2: perplexity.evaluate_perplexity(
      apply_fn, proc, batches, time_seed=seed, num_t_samples=n_t, progress=False)
  a, b, c = run(7), run(7), run(8)
  assert a == b  # bit-identical, every field
  assert a['bound_nats_per_token'] != c['bound_nats_per_token']
  assert a['num_tokens'] == sum(int(x['loss_mask'].sum()) for x in batches)
  assert a['num_sequences'] == 21 and a['bound_kind'] == 'hmdlm'
  for key in ('bound_nats_per_token', 'lm_nats_per_token', 'hier_nats_per_token',
              'appendix_e_nats_per_token_estimate'):
    assert math.isfinite(a[key]) and a[key] > 0
  assert a['bound_nats_per_token'] == pytest.approx(
      a['lm_nats_per_token'] + a['hier_nats_per_token'] + a['cons_nats_per_token'], rel=1e-12)
  assert a['ppl_appendix_e_estimate'] == pytest.approx(
      math.exp(a['appendix_e_nats_per_token_estimate']))


def test_perplexity_mdlm_k1_and_bad_num_t_samples():
  vocab = 5
  apply_fn = random_logit_model(vocab, 1)
  cfg = config_lib.LossConfig(mask_id=vocab - 1, num_levels=1)
  batches = _random_text_batches(8, 8, 5, vocab, seed=2)
  batches = [dict(b, levels=np.zeros_like(b['levels'])) for b in batches]
  proc = hmdlm.HMDLM(Schedule('loglinear', (0.0,)), cfg)
  res = perplexity.evaluate_perplexity(apply_fn, proc, batches, time_seed=0, progress=False)
  assert res['bound_kind'] == 'mdlm'
  assert res['hier_nats_per_token'] == 0.0 and res['cons_nats_per_token'] == 0.0
  # For K = 1, Appendix E's r_i = λ'_0(t): the estimate is MDLM's bound on the same hmdlm.
  assert res['appendix_e_nats_per_token_estimate'] == pytest.approx(res['bound_nats_per_token'],
                                                                    rel=1e-6)
  with pytest.raises(ValueError, match='num_t_samples'):
    perplexity.evaluate_perplexity(apply_fn, proc, batches, time_seed=0, num_t_samples=0)


def _exact_expected_bound(toy, schedule, apply_fn, cfg, given, t_min, nodes=24):
  """E_{t ~ U(t_min,1)} E_mask [bound total] per example, by enumeration of the mask patterns of
  the non-given positions and Gauss-Legendre quadrature on [t_min, δ_1] and [δ_1, 1]: [N] float64.

  The integrand is the evaluator's own per-example value (`hmdlm.bound_from_state`, deterministic
  for single_pass), so this is exactly the expectation of `evaluate_perplexity`'s estimate.
  """
  n, seq_len = toy.seqs.shape
  pats = np.array(list(itertools.product([False, True], repeat=seq_len)))  # [P, L]
  pats = pats[~(pats & given[None]).any(-1)]  # given positions are never masked
  p_num = len(pats)
  tokens = np.repeat(toy.seqs, p_num, 0)
  levels = np.repeat(toy.levels, p_num, 0)
  masked = np.tile(pats, (n, 1))
  batch = {'tokens': jnp.asarray(tokens), 'levels': jnp.asarray(levels),
           'given': jnp.asarray(np.tile(given, (n * p_num, 1))),
           'loss_mask': jnp.asarray(np.tile(~given, (n * p_num, 1)))}
  xt = jnp.asarray(np.where(masked, toy.mask_id, tokens))
  ht = jnp.asarray(np.where(masked, toy.num_levels, levels))

  @jax.jit
  def integrand(t):  # Σ_patterns P(pattern | x, t) · bound total(x, pattern, t): [N]
    tb = jnp.full((n * p_num,), t, jnp.float32)
    total = hmdlm.bound_from_state(apply_fn, batch, xt, ht, jnp.asarray(masked), tb,
                                    jax.random.PRNGKey(0), schedule, cfg)['total']
    om = schedule.one_minus_alpha(t)  # [K]
    pm = om[jnp.asarray(levels)]  # [N*P, L]
    prob = jnp.where(jnp.asarray(masked), pm, jnp.where(jnp.asarray(given), 1.0, 1.0 - pm))
    prob = prob.prod(-1)
    # States of probability 0 (a level-1 position masked while t <= δ_1) may give 0 * inf = NaN.
    return jnp.where(prob > 0, prob * total, 0.0).reshape(n, p_num).sum(-1)  # [N]

  x, w = np.polynomial.legendre.leggauss(nodes)
  total = np.zeros(n)
  for lo, hi in ((t_min, schedule.params[1]), (schedule.params[1], 1.0)):
    for xi, wi in zip(x, w):
      t = 0.5 * (hi - lo) * xi + 0.5 * (hi + lo)
      total += 0.5 * (hi - lo) * wi * np.asarray(integrand(jnp.float32(t)), np.float64)
  return total / (1.0 - t_min)


def test_perplexity_matches_exact_expected_bound_on_toy():
  """On the enumerable toy, the evaluator's bound agrees with its exact expectation (quadrature
  over t, enumeration over masks) within 4 standard errors, with per-example token counts that
  differ (position 0 given in half of the examples), so token weighting is exercised too."""
  toy = oracle.make_toy(seed=3)
  schedule = Schedule('loglinear', (0.0, 0.25))
  cfg = config_lib.LossConfig(mask_id=toy.mask_id, num_levels=2, variant='single_pass',
                              prior_corrected=False)
  apply_fn = oracle.make_oracle(toy, hmdlm.HMDLM(schedule, cfg))
  t_min = cfg.t_min
  free = np.zeros(toy.seq_len, bool)
  first_given = free.copy()
  first_given[0] = True
  # 32 nodes per piece: within 1e-4 of 96 nodes, far below the test's standard error.
  exact_free = _exact_expected_bound(toy, schedule, apply_fn, cfg, free, t_min, 32)  # [27]
  exact_given = _exact_expected_bound(toy, schedule, apply_fn, cfg, first_given, t_min, 32)
  # The reference is the rigorous bound (docs/method.md §8): its expectation under p is H(p) per
  # token up to the ε terms (α(1) = ε, t >= t_min; ~0.005 nats per sequence on the toy).
  assert abs((exact_free * toy.probs).sum() - toy.entropy() / toy.seq_len) < 0.003
  # Data: x ~ p, 8192 examples; odd rows have position 0 given (2 instead of 3 loss tokens).
  rng = np.random.default_rng(0)
  idx = rng.choice(len(toy.probs), 8192, p=toy.probs)
  given = np.zeros((len(idx), toy.seq_len), bool)
  given[1::2, 0] = True
  data = toy.batch(idx)
  data['given'], data['loss_mask'] = given, ~given
  batches = [{k: v[i:i + 512] for k, v in data.items()} for i in range(0, len(idx), 512)]
  res = perplexity.evaluate_perplexity(apply_fn, hmdlm.HMDLM(schedule, cfg), batches,
                                     time_seed=11, num_t_samples=4, t_min=t_min, progress=False)
  n_tok = (~given).sum(-1)
  assert res['num_tokens'] == n_tok.sum()
  per_example = np.where(given[:, 0], exact_given[idx], exact_free[idx])  # nats per loss token
  expected = (per_example * n_tok).sum() / n_tok.sum()
  se = res['bound_stderr']
  assert 0 < se < 0.02
  # The per-sample variance is heavy-tailed (λ' = 1/(t - δ_k), docs/method.md §8): 4 std errors.
  assert abs(res['bound_nats_per_token'] - expected) < 4 * se, (res, expected)
