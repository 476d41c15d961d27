"""The bound is a bound (docs/method.md §5, §8): exact checks on the toy of tests/oracle.py.

Exact expectations are computed in float64: over the data by enumerating all V^L sequences, over
the forward corruption by enumerating the 2^L mask patterns (3^L states with Algorithm 1's reveal
set), and over t by tanh-sinh quadrature on segments split at the schedule's kinks (δ_k, and
δ_k + 1/T for Algorithm 1's λ(s, t)). Tanh-sinh, not Gauss-Legendre, because the integrand has
integrable endpoint singularities: near δ_1⁺ a masked level-1 position contributes
λ'_1 · (-log g_1) ~ -log(t - δ_1) (and ~ t log t near 0 for the power schedule), which
Gauss-Legendre resolves only algebraically. Measured on this toy, max error over sequences with
Gauss-Legendre on the same segments: 2.6e-3 / 1.5e-4 / 3.8e-5 (offset loglinear) and 4.5e-7 /
2.9e-8 / 1.8e-9 (power) at 32 / 64 / 128 nodes per segment; tanh-sinh at step 1/16 (~100 nodes)
reaches 1e-14.

The Monte-Carlo estimator of the offset schedule is heavy-tailed (docs/method.md §8): a level-1 position
masked at t = δ_1 + u has probability ∝ u and contributes ~ -log(u)/u, so its variance is only
finite through the η floor. Its standard error is therefore taken from i.i.d. batch means.

The ε = 0 exactness check uses η = 0: the hazard floor η changes the integral by O(η log(1/η))
(8e-7 at η = 1e-8 on this toy), far above the 1e-10 tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import hmdlm_terms
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle
from tests.conftest import OPTIMISED

TOY_SEED = 0


def loss_cfg(toy: oracle.Toy, variant: str = 'single_pass') -> config_lib.LossConfig:
  return config_lib.LossConfig(mask_id=toy.mask_id, num_levels=toy.num_levels,
                               prior_corrected=False, variant=variant)


def process(toy: oracle.Toy, schedule: Schedule, variant: str = 'single_pass') -> hmdlm.HMDLM:
  """HMDLM with the oracle's head convention (its hierarchy logits already are the posterior)."""
  return hmdlm.HMDLM(schedule, loss_cfg(toy, variant), check_ordering='off')


def make_oracle(toy: oracle.Toy, schedule: Schedule, probs=None):
  return oracle.make_oracle(toy, process(toy, schedule), probs=probs)


def exact_bound(toy: oracle.Toy, schedule: Schedule, apply_fn, *, t_lo: float = 0.0
                ) -> np.ndarray:
  """∫_{t_lo}^1 E_q[L · bound(own-level context)] dt per sequence: [N] float64."""
  return oracle.integrated_bound(toy, process(toy, schedule), apply_fn, t_lo=t_lo)


def exact_appendix_e(toy: oracle.Toy, schedule: Schedule, apply_fn) -> np.ndarray:
  """∫_0^1 E_q[L · Appendix E estimate] dt per sequence: [N]."""
  proc = process(toy, schedule)
  t_nodes, w = oracle.quadrature(0.0, proc.kinks)

  def value(batch, state, t):
    return proc.estimates_from_state(apply_fn, batch, state, t)['appendix_e'] * toy.seq_len

  return w @ oracle.expected_per_state(toy, proc, value, t_nodes)


def exact_algorithm1(toy: oracle.Toy, schedule: Schedule, apply_fn, train_steps: int
                     ) -> np.ndarray:
  """∫_0^1 E_q E_R[L · (L_LM + L_hier + L_cons)] dt with Algorithm 1's pass-2 context: [N].

  Enumerates the 3^L states (revealed / masked / masked in R) with their probabilities
  α, (1 - α)(1 - λ(s, t)), (1 - α) λ(s, t), s = max(t - 1/T, 0).
  """
  kinks = schedule.params if schedule.kind == 'loglinear' else ()
  kinks = kinks + tuple(k + 1.0 / train_steps for k in kinks) + (1.0 / train_steps,)
  t_nodes, w = oracle.quadrature(0.0, kinks)
  codes = np.array(np.meshgrid(*[np.arange(3)] * toy.seq_len, indexing='ij')).reshape(
      toy.seq_len, -1).T  # [3^L, L]
  n_seq, n_st = len(toy.probs), len(codes)
  xi = np.repeat(np.arange(n_seq), n_st)
  code = np.tile(codes, (n_seq, 1))
  b = toy.batch(xi)
  masked = code > 0
  xt = np.where(masked, toy.mask_id, b['tokens'])
  ht = np.where(masked, toy.num_levels, b['levels'])
  hs = np.where(code == 2, b['levels'], ht)
  with jax.enable_x64(True):

    @jax.jit
    def fn(t_scalar):
      t = jnp.full((n_seq * n_st,), t_scalar, jnp.float64)
      lev = jnp.asarray(b['levels'])
      om = jnp.take_along_axis(schedule.one_minus_alpha(t)[:, None, :], lev[..., None], -1)[..., 0]
      lam = jnp.take_along_axis(
          schedule.reveal_prob(jnp.maximum(t - 1.0 / train_steps, 0.0), t)[:, None, :],
          lev[..., None], -1)[..., 0]
      c = jnp.asarray(code)
      probs = jnp.where(c == 0, 1.0 - om, jnp.where(c == 1, om * (1.0 - lam), om * lam)).prod(-1)
      g = parameterization.level_log_probs(apply_fn(xt, ht, t, heads=('hier',))['hier'], t,
                                           schedule, prior_corrected=False)
      logf = parameterization.token_log_probs(apply_fn(xt, hs, t, heads=('token',))['token'], xt,
                                              mask_id=toy.mask_id)
      nll = -jnp.take_along_axis(logf, b['tokens'][..., None], -1)[..., 0]
      terms = hmdlm_terms.loss_terms(nll, g, b['levels'], masked, b['loss_mask'], schedule.hazard(t))
      val = terms['lm'] + terms['hier'] + terms['cons']
      return jnp.where(probs > 0, probs * jnp.where(probs > 0, val, 0.0), 0.0)

    per = np.stack([np.asarray(fn(jnp.float64(t))).reshape(n_seq, n_st).sum(-1)
                    for t in t_nodes])
  return w @ per * toy.seq_len


# ----------------------------------------------------------------------------------------------
# The oracle is exact (against a plain numpy enumeration).


def brute_force_posteriors(toy: oracle.Toy, schedule: Schedule, tokens, levels, t, token_levels):
  """Plain loops: P(h_i = k | state), P(x_i = v | state, h_i = token_levels_i)."""
  big_k, v_real = toy.num_levels, toy.num_tokens
  a = schedule.alpha(np.float64(t), np)
  w = np.zeros(len(toy.probs))
  for c, (x, h) in enumerate(zip(toy.seqs, toy.levels)):
    wt = toy.probs[c]
    for j in range(toy.seq_len):
      if tokens[j] != toy.mask_id:
        wt *= a[h[j]] * (x[j] == tokens[j]) * (h[j] == levels[j])
      else:
        wt *= 1.0 - a[h[j]]
        if levels[j] < big_k:
          wt *= h[j] == levels[j]
    w[c] = wt
  w /= w.sum()
  hier = np.zeros((toy.seq_len, big_k))
  tok = np.zeros((toy.seq_len, v_real + 1))
  for c, (x, h) in enumerate(zip(toy.seqs, toy.levels)):
    for j in range(toy.seq_len):
      hier[j, h[j]] += w[c]
      if h[j] == token_levels[j]:
        tok[j, x[j]] += w[c]
  return hier, tok / tok.sum(-1, keepdims=True)


def test_oracle_matches_brute_force_enumeration():
  toy = oracle.make_toy(TOY_SEED)
  sched = Schedule('loglinear', (0.0, 0.25), eps=1e-3)
  rng = np.random.default_rng(1)
  b = toy.batch(rng.integers(0, len(toy.probs), 64))
  t = rng.uniform(0.05, 1.0, 64)
  masked = rng.random(b['tokens'].shape) < 0.5
  # Reachable states: masked level-1 positions need t > δ_1.
  masked &= ~((b['levels'] == 1) & (t[:, None] <= 0.25))
  shown = masked & (rng.random(masked.shape) < 0.3)  # Algorithm 1's R: gold level shown
  tokens = np.where(masked, toy.mask_id, b['tokens'])
  levels = np.where(masked & ~shown, toy.num_levels, b['levels'])
  with jax.enable_x64(True):
    out = make_oracle(toy, sched)(
        tokens, levels, jnp.asarray(t), heads=('hier', 'token'), token_levels=b['levels'])
    hier, tok = np.exp(np.asarray(out['hier'])), np.exp(np.asarray(out['token']))
  for i in range(64):
    ref_h, ref_t = brute_force_posteriors(toy, sched, tokens[i], levels[i], t[i], b['levels'][i])
    np.testing.assert_allclose(hier[i], ref_h, atol=1e-12)
    np.testing.assert_allclose(tok[i], ref_t, atol=1e-12)
  assert np.all(tok[..., toy.mask_id] == 0.0)


def test_oracle_on_unreachable_states_falls_back_to_tokens_only():
  # Tokens (0, 0, MASK) with level 1 shown on both 0s: impossible (a repeated token has level 0).
  toy = oracle.make_toy(TOY_SEED)
  sched = Schedule('loglinear', (0.0, 0.25))
  out = make_oracle(toy, sched)(
      np.array([[0, 0, toy.mask_id]]), np.array([[1, 1, 2]]), jnp.array([0.5]),
      heads=('hier', 'token'))
  tok = np.exp(np.asarray(out['token'][0, 2]))
  keep = (toy.seqs[:, 0] == 0) & (toy.seqs[:, 1] == 0)
  ref = np.bincount(toy.seqs[keep, 2], weights=toy.probs[keep], minlength=toy.vocab_size)
  np.testing.assert_allclose(tok, ref / ref.sum(), rtol=1e-5)
  assert np.all(np.isfinite(np.asarray(out['hier'][0, 2])))


# ----------------------------------------------------------------------------------------------
# (a) ε = 0: the own-level continuous-time loss integrates to -log p(x) exactly.


@pytest.mark.parametrize('kind,params,num_levels', [
    ('loglinear', (0.0, 0.25), 2),
    ('power', (1.0, 2.0), 2),
    ('loglinear', (0.0,), 1),  # MDLM
])
def test_continuous_bound_equals_neg_log_likelihood(kind, params, num_levels):
  toy = oracle.make_toy(TOY_SEED, num_levels=num_levels)
  sched = Schedule(kind, params, eps=0.0, eta=0.0)
  value = exact_bound(toy, sched, make_oracle(toy, sched))
  err = np.abs(value - toy.neg_log_prob())
  print(f'{kind}{params}: max |∫ bound - (-log p)| = {err.max():.2e} over {len(err)} sequences')
  assert err.max() < 1e-10


# ----------------------------------------------------------------------------------------------
# (b) ε = ε_t = 1e-3: Monte Carlo of `HMDLM.bound` vs its exact expectation, and the gap to H.


def monte_carlo_bound(toy: oracle.Toy, sched: Schedule, cfg: config_lib.LossConfig, *, t_min: float,
                      copies: int, num_batches: int, seed: int) -> np.ndarray:
  """Batch estimates of E_{x~p} E_t E_q[L · bound]: [num_batches] i.i.d. values.

  Each batch holds every sequence `copies` times and weights it by p(x); times are MDLM's
  stratified draws, randomly permuted so every example's t is marginally U(t_min, 1).
  """
  apply_fn = make_oracle(toy, sched)
  n_seq = len(toy.probs)
  bsz = n_seq * copies
  idx = np.arange(bsz) % n_seq
  batch = toy.batch(idx)
  wts = jnp.asarray(toy.probs[idx] * n_seq / bsz * toy.seq_len, jnp.float32)

  def one(key):
    k_t, k_perm, k_b = jax.random.split(key, 3)
    t = jax.random.permutation(k_perm, base.sample_times(k_t, bsz, t_min=t_min))
    return (wts * hmdlm.HMDLM(sched, cfg).bound(apply_fn, batch, k_b, t)['total']).sum()

  run = jax.jit(lambda key: jax.lax.map(one, jax.random.split(key, num_batches)),
                compiler_options=OPTIMISED)
  return np.asarray(run(jax.random.key(seed)), np.float64)


@pytest.mark.parametrize('variant,copies,num_batches', [
    ('two_pass', 256, 304),  # 2.1M samples (the stochastic one-position estimator)
    ('single_pass', 256, 76),  # 0.5M samples
])
def test_monte_carlo_bound_matches_exact_expectation(variant, copies, num_batches):
  toy = oracle.make_toy(TOY_SEED)
  eps = t_min = 1e-3
  sched = Schedule('loglinear', (0.0, 0.25), eps=eps)
  exact = exact_bound(toy, sched, make_oracle(toy, sched), t_lo=t_min) / (1 - t_min)
  exact_mean = float(exact @ toy.probs)  # E over t ~ U(t_min, 1), corruption, and x ~ p
  est = monte_carlo_bound(toy, sched, loss_cfg(toy, variant), t_min=t_min, copies=copies,
                          num_batches=num_batches, seed=0)
  se = est.std(ddof=1) / np.sqrt(len(est))
  gap = exact_mean - toy.entropy()
  tol = (eps + t_min) * toy.seq_len * np.log(toy.num_tokens * toy.num_levels)
  print(f'{variant}: MC {est.mean():.5f} ± {se:.5f} ({len(est) * len(toy.probs) * copies} '
        f'samples), exact {exact_mean:.6f}, H(p) {toy.entropy():.6f}, gap {gap:+.5f} '
        f'(allowed ±{tol:.5f})')
  assert abs(est.mean() - exact_mean) < 4 * se
  assert abs(gap) <= tol


# ----------------------------------------------------------------------------------------------
# (c) A wrong denoiser gives a strictly larger value.


def test_wrong_denoiser_is_strictly_worse():
  toy = oracle.make_toy(TOY_SEED)
  sched = Schedule('loglinear', (0.0, 0.25), eps=0.0, eta=0.0)
  right = exact_bound(toy, sched, make_oracle(toy, sched)) @ toy.probs
  wrong_p = oracle.make_toy(TOY_SEED + 1).probs  # the oracle of another distribution
  wrong = exact_bound(toy, sched, make_oracle(toy, sched, wrong_p)) @ toy.probs
  kl = float(toy.probs @ (np.log(toy.probs) - np.log(wrong_p)))
  print(f'E_p[bound]: exact oracle {right:.6f} (H = {toy.entropy():.6f}); wrong oracle '
        f'{wrong:.6f}; KL(p||p_wrong) = {kl:.4f}')
  assert abs(right - toy.entropy()) < 1e-10
  # The bound of the wrong model upper-bounds its own -log p_wrong: E_p[bound] >= H + KL.
  assert wrong >= toy.entropy() + kl - 1e-10
  assert wrong > right + 0.1


# ----------------------------------------------------------------------------------------------
# (d) Algorithm 1's training loss and Appendix E's estimate with the oracle are not the bound.


def test_algorithm1_surrogate_and_appendix_e_are_not_the_bound():
  toy = oracle.make_toy(TOY_SEED)
  sched = Schedule('loglinear', (0.0, 0.25), eps=0.0, eta=0.0)
  denoiser = make_oracle(toy, sched)
  nll = toy.neg_log_prob()
  alg1 = exact_algorithm1(toy, sched, denoiser, train_steps=1000)
  app_e = exact_appendix_e(toy, sched, denoiser)
  d1, de = alg1 - nll, app_e - nll
  print(f'Algorithm 1 loss - (-log p): mean over p {d1 @ toy.probs:+.4f} '
        f'[{d1.min():+.4f}, {d1.max():+.4f}] per sequence')
  print(f'Appendix E estimate - (-log p): mean over p {de @ toy.probs:+.4f} '
        f'[{de.min():+.4f}, {de.max():+.4f}] per sequence')
  # docs/method.md §5/§8 state only that neither equals -log p: both miss it by far more than quadrature error.
  assert np.all(np.isfinite(alg1)) and np.all(np.isfinite(app_e))
  assert abs(d1 @ toy.probs) > 1e-3 and abs(de @ toy.probs) > 1e-3
