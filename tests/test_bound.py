"""The bound is a bound (SPEC 5, 8): exact checks on the enumerable toy with its exact oracle.

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

The Monte-Carlo estimator of the offset schedule is heavy-tailed (SPEC 8): a level-1 position
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

from hmdlm_jax import corruption
from hmdlm_jax import losses
from hmdlm_jax import parameterization
from hmdlm_jax.schedules import Schedule
from tests import toy as toylib

TOY_SEED = 0
QUAD_STEP = 1.0 / 16  # tanh-sinh step (nodes ≈ 2 · 3.2 / step per segment)


def tanh_sinh(a: float, b: float, h: float = QUAD_STEP) -> tuple[np.ndarray, np.ndarray]:
  """Tanh-sinh nodes and weights on [a, b] (float64); nodes that round onto an end are dropped."""
  n = int(np.ceil(3.2 / h))
  x = np.arange(-n, n + 1) * h
  y = 0.5 * np.pi * np.sinh(x)
  u = 1.0 / (1.0 + np.exp(-2.0 * y))  # (1 + tanh y) / 2 without cancellation near a
  w = h * 0.25 * np.pi * np.cosh(x) / np.cosh(y) ** 2 * (b - a)
  t = a + (b - a) * u
  keep = (t > a) & (t < b)
  return t[keep], w[keep]


def quadrature(t_lo: float, kinks: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
  """Nodes/weights on [t_lo, 1] split at the kinks inside (t_lo, 1)."""
  cuts = [t_lo] + sorted(k for k in set(kinks) if t_lo < k < 1.0) + [1.0]
  parts = [tanh_sinh(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
  return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def schedule_kinks(schedule: Schedule) -> tuple[float, ...]:
  return schedule.params if schedule.kind == 'loglinear' else ()


def loss_cfg(toy: toylib.Toy, variant: str = 'single_pass') -> losses.LossConfig:
  return losses.LossConfig(mask_id=toy.mask_id, num_levels=toy.num_levels,
                           prior_corrected=False, variant=variant)


def flat_states(toy: toylib.Toy, t_nodes: np.ndarray, state_codes: np.ndarray) -> dict:
  """Every (t node, sequence, corruption code) as one flat batch (float64 t).

  state_codes: [S, L] ints, 0 = revealed, 1 = masked, 2 = masked and in Algorithm 1's reveal set.
  """
  n_seq, n_st = len(toy.probs), len(state_codes)
  ti = np.repeat(t_nodes, n_seq * n_st)
  xi = np.tile(np.repeat(np.arange(n_seq), n_st), len(t_nodes))
  si = np.tile(np.arange(n_st), len(t_nodes) * n_seq)
  batch = toy.batch(xi)
  code = state_codes[si]
  masked = code > 0
  return dict(batch=batch, t=ti, xi=xi, si=si, code=code, masked=masked,
              xt=np.where(masked, toy.mask_id, batch['tokens']),
              ht=np.where(masked, toy.num_levels, batch['levels']))


def integrate(values: np.ndarray, probs: np.ndarray, weights: np.ndarray, num_seq: int
              ) -> np.ndarray:
  """Σ_nodes w · Σ_states prob · value -> [num_seq] (zero-probability states contribute 0)."""
  per_state = np.where(probs > 0, probs * np.where(probs > 0, values, 0.0), 0.0)
  return (weights[:, None] * per_state.reshape(len(weights), num_seq, -1).sum(-1)).sum(0)


def exact_bound(toy: toylib.Toy, schedule: Schedule, apply_fn, *, t_lo: float = 0.0
                ) -> np.ndarray:
  """∫_{t_lo}^1 E_q[L · bound(own-level context)] dt per sequence: [N] float64."""
  t_nodes, w = quadrature(t_lo, schedule_kinks(schedule))
  pats = toylib.mask_patterns(toy.seq_len)
  st = flat_states(toy, t_nodes, pats.astype(int))
  probs = toylib.pattern_probs(toy.levels[st['xi']], st['t'], schedule)
  probs = np.take_along_axis(probs, st['si'][:, None], axis=1)[:, 0]
  cfg = loss_cfg(toy)
  with jax.enable_x64(True):
    fn = jax.jit(lambda b, xt, ht, m, t: losses.bound_from_state(
        apply_fn, b, xt, ht, m, t, jax.random.key(0), schedule, cfg)['total'])
    val = np.asarray(fn(st['batch'], st['xt'], st['ht'], st['masked'], jnp.asarray(st['t'])))
  return integrate(val * toy.seq_len, probs, w, len(toy.probs))


def exact_appendix_e(toy: toylib.Toy, schedule: Schedule, apply_fn) -> np.ndarray:
  """∫_0^1 E_q[L · Appendix E estimate] dt per sequence: [N]."""
  t_nodes, w = quadrature(0.0, schedule_kinks(schedule))
  pats = toylib.mask_patterns(toy.seq_len)
  st = flat_states(toy, t_nodes, pats.astype(int))
  probs = toylib.pattern_probs(toy.levels[st['xi']], st['t'], schedule)
  probs = np.take_along_axis(probs, st['si'][:, None], axis=1)[:, 0]
  cfg = loss_cfg(toy)
  with jax.enable_x64(True):
    fn = jax.jit(lambda b, xt, ht, m, t: losses.appendix_e_from_state(
        apply_fn, b, xt, ht, m, t, schedule, cfg))
    val = np.asarray(fn(st['batch'], st['xt'], st['ht'], st['masked'], jnp.asarray(st['t'])))
  return integrate(val * toy.seq_len, probs, w, len(toy.probs))


def exact_algorithm1(toy: toylib.Toy, schedule: Schedule, apply_fn, train_steps: int
                     ) -> np.ndarray:
  """∫_0^1 E_q E_R[L · (L_LM + L_hier + L_cons)] dt with Algorithm 1's pass-2 context: [N].

  Enumerates the 3^L states (revealed / masked / masked in R) with their probabilities
  α, (1 - α)(1 - λ(s, t)), (1 - α) λ(s, t), s = max(t - 1/T, 0).
  """
  kinks = schedule_kinks(schedule)
  kinks = kinks + tuple(k + 1.0 / train_steps for k in kinks) + (1.0 / train_steps,)
  t_nodes, w = quadrature(0.0, kinks)
  codes = np.array(np.meshgrid(*[np.arange(3)] * toy.seq_len, indexing='ij')).reshape(
      toy.seq_len, -1).T  # [3^L, L]
  st = flat_states(toy, t_nodes, codes)
  lev = toy.levels[st['xi']]
  om = np.take_along_axis(schedule.one_minus_alpha(st['t'], np), lev, axis=-1)
  lam = np.take_along_axis(
      schedule.reveal_prob(np.maximum(st['t'] - 1.0 / train_steps, 0.0), st['t'], np), lev, -1)
  pos_prob = np.select([st['code'] == 0, st['code'] == 1],
                       [1.0 - om, om * (1.0 - lam)], om * lam)
  probs = pos_prob.prod(-1)
  hs = np.where(st['code'] == 2, lev, st['ht'])
  with jax.enable_x64(True):

    @jax.jit
    def fn(b, xt, ht, hs, m, t):
      g = parameterization.level_log_probs(apply_fn(xt, ht, t, heads=('hier',))['hier'], t,
                                           schedule, prior_corrected=False)
      logf = parameterization.token_log_probs(apply_fn(xt, hs, t, heads=('token',))['token'], xt,
                                              mask_id=toy.mask_id)
      nll = -jnp.take_along_axis(logf, b['tokens'][..., None], -1)[..., 0]
      terms = losses.loss_terms(nll, g, b['levels'], m, b['loss_mask'], schedule.hazard(t))
      return terms['lm'] + terms['hier'] + terms['cons']

    val = np.asarray(fn(st['batch'], st['xt'], st['ht'], hs, st['masked'],
                        jnp.asarray(st['t'])))
  return integrate(val * toy.seq_len, probs, w, len(toy.probs))


# ----------------------------------------------------------------------------------------------
# The oracle is exact (against a plain numpy enumeration).


def brute_force_posteriors(toy: toylib.Toy, schedule: Schedule, tokens, levels, t, token_levels):
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
  toy = toylib.make_toy(TOY_SEED)
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
    out = toylib.make_toy_oracle(toy, sched)(
        tokens, levels, jnp.asarray(t), heads=('hier', 'token'), token_levels=b['levels'])
    hier, tok = np.exp(np.asarray(out['hier'])), np.exp(np.asarray(out['token']))
  for i in range(64):
    ref_h, ref_t = brute_force_posteriors(toy, sched, tokens[i], levels[i], t[i], b['levels'][i])
    np.testing.assert_allclose(hier[i], ref_h, atol=1e-12)
    np.testing.assert_allclose(tok[i], ref_t, atol=1e-12)
  assert np.all(tok[..., toy.mask_id] == 0.0)


def test_oracle_on_unreachable_states_falls_back_to_tokens_only():
  # Tokens (0, 0, MASK) with level 1 shown on both 0s: impossible (a repeated token has level 0).
  toy = toylib.make_toy(TOY_SEED)
  sched = Schedule('loglinear', (0.0, 0.25))
  out = toylib.make_toy_oracle(toy, sched)(
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
  toy = toylib.make_toy(TOY_SEED, num_levels=num_levels)
  sched = Schedule(kind, params, eps=0.0, eta=0.0)
  value = exact_bound(toy, sched, toylib.make_toy_oracle(toy, sched))
  err = np.abs(value - toy.neg_log_prob())
  print(f'{kind}{params}: max |∫ bound - (-log p)| = {err.max():.2e} over {len(err)} sequences')
  assert err.max() < 1e-10


# ----------------------------------------------------------------------------------------------
# (b) ε = ε_t = 1e-3: Monte Carlo of `bound_per_example` vs its exact expectation, and the gap to H.


def monte_carlo_bound(toy: toylib.Toy, sched: Schedule, cfg: losses.LossConfig, *, t_min: float,
                      copies: int, num_batches: int, seed: int) -> np.ndarray:
  """Batch estimates of E_{x~p} E_t E_q[L · bound]: [num_batches] i.i.d. values.

  Each batch holds every sequence `copies` times and weights it by p(x); times are MDLM's
  stratified draws, randomly permuted so every example's t is marginally U(t_min, 1).
  """
  apply_fn = toylib.make_toy_oracle(toy, sched)
  n_seq = len(toy.probs)
  bsz = n_seq * copies
  idx = np.arange(bsz) % n_seq
  batch = toy.batch(idx)
  wts = jnp.asarray(toy.probs[idx] * n_seq / bsz * toy.seq_len, jnp.float32)

  def one(key):
    k_t, k_perm, k_b = jax.random.split(key, 3)
    t = jax.random.permutation(k_perm, corruption.sample_times(k_t, bsz, t_min=t_min))
    return (wts * losses.bound_per_example(apply_fn, batch, k_b, t, sched, cfg)['total']).sum()

  run = jax.jit(lambda key: jax.lax.map(one, jax.random.split(key, num_batches)))
  return np.asarray(run(jax.random.key(seed)), np.float64)


@pytest.mark.parametrize('variant,copies,num_batches', [
    ('two_pass', 256, 304),  # 2.1M samples (the stochastic one-position estimator)
    ('single_pass', 256, 76),  # 0.5M samples
])
def test_monte_carlo_bound_matches_exact_expectation(variant, copies, num_batches):
  toy = toylib.make_toy(TOY_SEED)
  eps = t_min = 1e-3
  sched = Schedule('loglinear', (0.0, 0.25), eps=eps)
  exact = exact_bound(toy, sched, toylib.make_toy_oracle(toy, sched), t_lo=t_min) / (1 - t_min)
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
  toy = toylib.make_toy(TOY_SEED)
  sched = Schedule('loglinear', (0.0, 0.25), eps=0.0, eta=0.0)
  right = exact_bound(toy, sched, toylib.make_toy_oracle(toy, sched)) @ toy.probs
  wrong_p = toylib.make_toy(TOY_SEED + 1).probs  # the oracle of another distribution
  wrong = exact_bound(toy, sched, toylib.make_toy_oracle(toy, sched, wrong_p)) @ toy.probs
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
  toy = toylib.make_toy(TOY_SEED)
  sched = Schedule('loglinear', (0.0, 0.25), eps=0.0, eta=0.0)
  oracle = toylib.make_toy_oracle(toy, sched)
  nll = toy.neg_log_prob()
  alg1 = exact_algorithm1(toy, sched, oracle, train_steps=1000)
  app_e = exact_appendix_e(toy, sched, oracle)
  d1, de = alg1 - nll, app_e - nll
  print(f'Algorithm 1 loss - (-log p): mean over p {d1 @ toy.probs:+.4f} '
        f'[{d1.min():+.4f}, {d1.max():+.4f}] per sequence')
  print(f'Appendix E estimate - (-log p): mean over p {de @ toy.probs:+.4f} '
        f'[{de.min():+.4f}, {de.max():+.4f}] per sequence')
  # SPEC 5/8 state only that neither equals -log p: both miss it by far more than quadrature error.
  assert np.all(np.isfinite(alg1)) and np.all(np.isfinite(app_e))
  assert abs(d1 @ toy.probs) > 1e-3 and abs(de @ toy.probs) > 1e-3
