"""MultiMDM consistency distillation (docs/method.md §13.2): the shared-Gumbel path (3.8), the loss
(3.11) and few-step generation (Algorithm 4) on enumerable toys.

* The coupled path has exactly the forward marginals (3.2) at every t: empirical frequencies of
  200,000 paths within 5 binomial standard errors of p_t(z | x0) for every state z, x0 and t; a
  path leaves x0 at most once and jumps at most twice (Prop. B.1).
* Figure 2's point: H(x0 | x̃_t, ω) < H(x0 | x_t). H(x0 | x_t) is exact; H(x0 | x̃_t, ω) is the
  Monte-Carlo average (App. C.1's estimator, 20,000 (x0, ω) pairs) whose mean + 4 standard errors
  must stay below it, for M = 1 (MDLM with shared-Gumbel paths) and M = 4; more masks, lower.
* Distillation helps few-step generation: a tabular model of the toy (one logit table per time
  bin t ∈ ((b-1)/4, b/4], initialised with the exact posterior at t = b/4, so before distillation
  its 1/2/4-step samplers ARE the exact-teacher samplers) trained for 150 steps of the real
  `MultiMDMDistill.loss` (reverse KL, δ = 1/32, EMA target 0.95). The law of the few-step
  sampler is computed EXACTLY (enumerating the (V + M)^L states and the product kernels of
  (3.12)), so the total-variation gains carry no sampling noise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import multimdm
from hmdlm_jax.processes import multimdm_distill
from hmdlm_jax.processes import multimdm_math as mm
from tests import oracle

V = 4


# ------------------------------------------------------------------------------- coupled path


@pytest.mark.parametrize('num_masks,beta', [(3, 'linear'), (1, 'linear'), (3, 'alpha_power')])
def test_shared_gumbel_path_has_the_forward_marginals(num_masks, beta):
  sched = mm.MaskSchedule(beta=beta, beta_power=0.5)
  des = mm.Designation(V, num_masks)
  n = 200_000
  clean = jnp.asarray(np.arange(n) % V, jnp.int32)[:, None]  # [N, 1]: every x0, N/V paths each
  g_clean, g_masks = mm.draw_gumbels(jax.random.key(0), (n, 1), num_masks)
  states = V + num_masks
  times = np.array([0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0])
  path = np.stack([np.asarray(mm.coupled_state(sched, des, clean, g_clean, g_masks,
                                               jnp.full((n,), t, jnp.float32)))[:, 0]
                   for t in times])  # [T, N]
  for x0 in range(V):
    rows = np.asarray(clean[:, 0]) == x0
    for i, t in enumerate(times):
      emp = np.bincount(path[i, rows], minlength=states) / rows.sum()
      p = np.exp(np.asarray(mm.log_marginal(sched, des, jnp.arange(states),
                                            jnp.full((states,), x0), jnp.float32(t))))
      tol = 5 * np.sqrt(p * (1 - p) / rows.sum()) + 1e-9
      assert np.all(np.abs(emp - p) <= tol), (x0, t, emp, p)
  # Along the path: x0 until it leaves, never back; at most two jumps (Prop. B.1).
  fine = np.linspace(0.0, 1.0, 101)
  sub = slice(0, 20_000)
  fine_path = np.stack([np.asarray(mm.coupled_state(
      sched, des, clean[sub], g_clean[sub], g_masks[sub], jnp.full((20_000,), t, jnp.float32)))[
          :, 0] for t in fine])
  is_clean = fine_path < V
  assert np.all(np.diff(is_clean.astype(int), axis=0) <= 0)
  assert (np.diff(fine_path, axis=0) != 0).sum(0).max() <= (2 if num_masks > 1 else 1)


def _conditional_entropies(num_masks: int, t: float, beta: str, n: int = 20_000
                           ) -> tuple[float, float, float]:
  """(H(x0 | x_t) exact, H(x0 | x̃_t, ω) Monte-Carlo mean, its standard error), Zipf(1.2) on 20."""
  vocab = 20
  prior = np.arange(1, vocab + 1, dtype=np.float64) ** -1.2
  prior /= prior.sum()
  sched = mm.MaskSchedule(beta=beta, beta_power=0.5)
  des = mm.Designation(vocab, num_masks)
  with jax.enable_x64(True):
    z = jnp.arange(vocab + num_masks)
    lik = np.stack([np.exp(np.asarray(mm.log_marginal(sched, des, z, jnp.full_like(z, x),
                                                      jnp.float64(t)))) for x in range(vocab)])
  joint = prior[:, None] * lik  # [x0, z]
  pz = joint.sum(0)
  post = joint / np.where(pz > 0, pz, 1.0)
  h_exact = float(-(joint * np.log(np.where(post > 0, post, 1.0))).sum())
  key = jax.random.key(int(t * 1000) + num_masks)
  k_x, k_g = jax.random.split(key)
  x0 = jax.random.choice(k_x, vocab, (n,), p=jnp.asarray(prior, jnp.float32))
  g = jax.random.gumbel(k_g, (n, vocab + num_masks))
  g_words, g_masks = g[:, :vocab], g[:, vocab:]
  tt = jnp.full((n,), t, jnp.float32)
  xt = mm.coupled_state(sched, des, x0[:, None], jnp.take_along_axis(g_words, x0[:, None], 1),
                        g_masks[:, None], tt)[:, 0]
  # F_t(j, ω) for every candidate j under the same ω (App. C.1's estimator).
  cand = mm.coupled_state(sched, des, jnp.broadcast_to(jnp.arange(vocab), (n, vocab)), g_words,
                          jnp.broadcast_to(g_masks[:, None], (n, vocab, num_masks)), tt)
  w = np.where(np.asarray(cand) == np.asarray(xt)[:, None], prior[None], 0.0)
  q = w / w.sum(1, keepdims=True)
  ent = -(q * np.log(np.where(q > 0, q, 1.0))).sum(1)
  return h_exact, float(ent.mean()), float(ent.std(ddof=1) / np.sqrt(n))


@pytest.mark.parametrize('beta', ['linear', 'alpha_power'])
def test_coupling_lowers_the_conditional_entropy(beta):
  for t in (0.25, 0.5, 0.75):
    h1, c1, se1 = _conditional_entropies(1, t, beta)
    h4, c4, se4 = _conditional_entropies(4, t, beta)
    print(f'{beta} t={t}: H(x0|x_t) M=1 {h1:.4f}, M=4 {h4:.4f}; H(x0|x_t,ω) M=1 {c1:.4f}±{se1:.4f}'
          f', M=4 {c4:.4f}±{se4:.4f}')
    assert c1 + 4 * se1 < h1 and c4 + 4 * se4 < h4
    assert c4 + 4 * np.hypot(se1, se4) < c1  # more masks, less pathwise uncertainty (Figure 2)


# ------------------------------------------------------------------------------- the loss


def test_delta_schedule_doubles_and_saturates():
  cfg = config_lib.MultiMDMConfig(num_masks=2, num_words=4, delta_init=2 ** -9,
                                  delta_double_every=10, delta_max=2 ** -5)
  got = [float(multimdm_distill.delta_at(jnp.asarray(k), cfg)) for k in (0, 9, 10, 25, 49, 1000)]
  assert got == [2 ** -9, 2 ** -9, 2 ** -8, 2 ** -7, 2 ** -5, 2 ** -5]
  assert float(multimdm_distill.delta_at(None, cfg)) == 2 ** -5


def test_distillation_loss_terms_and_target():
  toy = oracle.make_toy(0, num_tokens=V, seq_len=3, num_levels=1)
  proc = multimdm_distill.make(V, 2, distill=True, delta_init=0.25, delta_max=0.25)
  assert proc.uses_target and not multimdm.make(V, 2).uses_target
  exact = oracle.make_oracle(toy, proc, vocab_size=V + 2)
  batch = toy.batch(np.arange(64))
  with pytest.raises(ValueError, match='target'):
    proc.loss(exact, batch, jax.random.key(0))
  loss, metrics = proc.loss(exact, batch, jax.random.key(0), step=jnp.asarray(0),
                            target_apply_fn=exact)
  assert np.isfinite(float(loss)) and float(metrics['delta']) == 0.25
  assert float(metrics['jump_rate']) > 0 and float(metrics['kl']) >= 0
  # Positions revealed at s carry -log f_t(x0): the loss is the exact cross-entropy part then.
  single = multimdm_distill.make(V, 1, distill=True, distill_kl='forward')
  l1, _ = single.loss(oracle.make_oracle(toy, single, vocab_size=V + 1), batch,
                      jax.random.key(1), step=jnp.asarray(3),
                      target_apply_fn=oracle.make_oracle(toy, single, vocab_size=V + 1))
  assert np.isfinite(float(l1))


# ------------------------------------------------------------------- few-step generation (exact)

L, M, G = 3, 2, 4  # toy length, masks, time bins of the tabular model


def _states() -> np.ndarray:
  n = V + M
  return (np.arange(n ** L)[:, None] // n ** np.arange(L - 1, -1, -1)) % n  # [S, L]


def _table_model(table: jax.Array):
  """apply_fn of a tabular model: logits table[bin(t), state] ([G, S, L, V]), masks -inf."""
  weights = jnp.asarray((V + M) ** np.arange(L - 1, -1, -1))

  def fn(tokens, levels, t, *, heads, token_levels=None):
    code = jnp.sum(tokens * weights, -1)
    b = jnp.clip(jnp.ceil(t * G).astype(jnp.int32) - 1, 0, G - 1)
    logits = table[b, code]
    return {'token': jnp.concatenate([logits, jnp.full(logits.shape[:-1] + (M,), -jnp.inf)], -1)}

  return fn


def few_step_law(proc: multimdm.MultiMDM, apply_fn, num_steps: int) -> np.ndarray:
  """The exact output law of the T-step sampler (3.12) over the V^L word sequences: [V^L]."""
  states = _states()
  n_st = len(states)
  tokens = jnp.asarray(states, jnp.int32)
  law = np.where((states >= V).all(1), 1.0 / M ** L, 0.0)  # x_1 ~ u_M^L
  with jax.enable_x64(True):
    for n in range(num_steps, 0, -1):
      t, s = n / num_steps, (n - 1) / num_steps
      logits = apply_fn(tokens, jnp.zeros_like(tokens), jnp.full((n_st,), t), heads=('token',))
      f = np.exp(np.asarray(multimdm.word_log_probs(logits['token'], V), np.float64))  # [S,L,V]
      mu = np.asarray(proc.des.group(jnp.asarray(f)))  # [S, L, M]
      kern = np.asarray(mm.posterior_kernel(proc.sched, jnp.arange(M)[:, None],
                                            jnp.arange(M)[None, :], jnp.float64(s),
                                            jnp.float64(t), M))  # [m, k, 1 + M]
      step = np.zeros((n_st, L, V + M))
      k = np.clip(states - V, 0, M - 1)
      step[..., :V] = f * kern[0, 0, 0]
      step[..., V:] = np.einsum('slm,mslj->slj', mu, kern[:, k, 1:])
      word = states < V
      step[word] = 0.0
      step[word, states[word]] = 1.0
      trans = np.prod([step[:, i, states[:, i]] for i in range(L)], axis=0)  # [S, S']
      law = law @ trans
  words = (states < V).all(1)
  idx = (states[words] * V ** np.arange(L - 1, -1, -1)).sum(1)
  out = np.zeros(V ** L)
  out[idx] = law[words]
  return out


def test_few_step_law_matches_the_sampler():
  """The exact enumeration above is the sampler's law (so the distillation gains are exact)."""
  toy = oracle.make_toy(0, num_tokens=V, seq_len=L, num_levels=1, concentration=0.2)
  proc = multimdm.make(V, M)
  exact = oracle.make_oracle(toy, proc, vocab_size=V + M)
  law = few_step_law(proc, exact, 2)
  np.testing.assert_allclose(law.sum(), 1.0, atol=1e-9)
  cfg = config_lib.SampleConfig(num_steps=2, num_levels=1, mask_id=V)
  _, out = oracle.sampler_total_variation(toy, proc, exact, cfg, num_samples=40_000, seed=3)
  emp = np.bincount(toy.index(out.tokens), minlength=V ** L) / 40_000
  assert 0.5 * np.abs(emp - law).sum() < 0.02


def test_distillation_lowers_few_step_total_variation():
  toy = oracle.make_toy(0, num_tokens=V, seq_len=L, num_levels=1, concentration=0.2)
  teacher = multimdm.make(V, M)
  exact = oracle.make_oracle(toy, teacher, vocab_size=V + M)
  tokens = jnp.asarray(_states(), jnp.int32)
  table0 = jnp.stack([jnp.maximum(exact(tokens, jnp.zeros_like(tokens),
                                        jnp.full((len(tokens),), (b + 1) / G),
                                        heads=('token',))['token'][..., :V], -30.0)
                      for b in range(G)]).astype(jnp.float32)
  proc = multimdm_distill.make(V, M, distill=True, distill_kl='reverse', delta_init=1 / 32,
                               delta_max=1 / 32)
  opt = optax.adam(0.03)
  data = jnp.asarray(toy.seqs)
  probs = jnp.asarray(toy.probs, jnp.float32)
  bsz = 1024

  @jax.jit
  def update(table, ema, opt_state, k):
    k_b, k_l = jax.random.split(jax.random.key(k))
    idx = jax.random.choice(k_b, len(toy.probs), (bsz,), p=probs)
    batch = dict(tokens=data[idx], levels=jnp.zeros((bsz, L), jnp.int32),
                 given=jnp.zeros((bsz, L), bool), loss_mask=jnp.ones((bsz, L), bool))
    target = _table_model(jax.lax.stop_gradient(ema))
    grads = jax.grad(lambda tb: proc.loss(_table_model(tb), batch, k_l, step=k,
                                          target_apply_fn=target)[0])(table)
    upd, opt_state = opt.update(grads, opt_state, table)
    table = optax.apply_updates(table, upd)
    return table, 0.95 * ema + 0.05 * table, opt_state

  table, ema, opt_state = table0, table0, opt.init(table0)
  for k in range(150):
    table, ema, opt_state = update(table, ema, opt_state, k)
  tv = lambda tb, n: 0.5 * np.abs(few_step_law(teacher, _table_model(tb), n) - toy.probs).sum()
  before = {n: tv(table0, n) for n in (1, 2, 4, 8)}
  after = {n: tv(ema, n) for n in (1, 2, 4, 8)}
  exact_tv = {n: 0.5 * np.abs(few_step_law(teacher, exact, n) - toy.probs).sum() for n in (2, 4)}
  print('exact TV, undistilled (exact teacher) -> distilled: ' + ', '.join(
      f'{n} steps {before[n]:.4f} -> {after[n]:.4f}' for n in before))
  for n in (2, 4):
    assert abs(before[n] - exact_tv[n]) < 1e-6  # the undistilled table IS the exact teacher
    assert after[n] < before[n] - 0.01, (n, before[n], after[n])
