"""HDLM (hmdlm_jax/processes/hdlm*.py, docs/method.md §13.1): exact-oracle tests, numpy
re-derivations of the losses, the MDLM reduction, the sampler and the config.

The toy: V = 4 words in 2 clusters ({0, 1} -> 0, {2, 3} -> 1), L = 3, a fixed Dirichlet law
(tests/oracle.py); ids: words 0..3, MASK 4, clusters 5, 6. The exact denoiser is
`oracle.make_oracle` on the process's own `log_marginal`; quadrature over t by tanh-sinh.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import pytest

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax.config import HDLMConfig
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hdlm
from hmdlm_jax.processes import hdlm_core
from hmdlm_jax.processes import hdlm_sampler
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes.hdlm_core import ClusterLayout
from hmdlm_jax.processes.hdlm_core import HDLMSchedule
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle
from tests.conftest import OPTIMISED
from tests.config_helpers import resolved

WORD_CLUSTERS = (0, 0, 1, 1)
MASK = 4


def make_process(*, gamma: float = 1.0, xi: float = 1.0, force: str = 'within', eps: float = 0.0,
                 num_clusters: int = 2, t_min: float = 1e-3, **kw) -> hdlm.HDLM:
  """HDLM on the toy's ids (module docstring); num_clusters=1 merges the cluster with MASK."""
  rows = config_lib.hdlm_cluster_rows(num_clusters)
  cfg = HDLMConfig(num_clusters=num_clusters, gamma=gamma, eps=eps, xi=xi, force=force,
                   t_min=t_min, mask_id=MASK, vocab_size=MASK + 1 + rows, **kw)
  cluster_of = np.full(cfg.vocab_size, -1, np.int32)
  cluster_of[:MASK] = WORD_CLUSTERS if num_clusters == 2 else 0
  return hdlm.HDLM(cfg, ClusterLayout(cluster_of, num_clusters, MASK))


def toy() -> oracle.Toy:
  return oracle.make_toy(0, num_tokens=4, seq_len=3, num_levels=1)


def denoiser(t: oracle.Toy, proc: hdlm.HDLM, probs=None):
  return oracle.make_oracle(t, proc, vocab_size=proc.cfg.vocab_size, probs=probs)


# ---------------------------------------------------------------------------------------------
# The schedule: closed forms of the method card, exact rates.


def test_schedule_matches_closed_forms_and_rates():
  t = np.linspace(1e-3, 0.999, 301)
  with jax.enable_x64(True):
    m1 = HDLMSchedule(1.0).marginals(jnp.asarray(t))
    m2 = HDLMSchedule(2.0).marginals(jnp.asarray(t))
    w1 = HDLMSchedule(1.0).weights(jnp.asarray(t))
    w2 = HDLMSchedule(2.0).weights(jnp.asarray(t))
    g = 0.7
    s = HDLMSchedule(g)
    h = 1e-6
    mp, mm = s.marginals(jnp.asarray(t + h)), s.marginals(jnp.asarray(t - h))
    mg = s.marginals(jnp.asarray(t))
    m1, m2, w1, w2, mp, mm, mg = jax.tree.map(np.asarray, (m1, m2, w1, w2, mp, mm, mg))
  u = 1 - t
  np.testing.assert_allclose(m1.beta_c, -u * np.log(u), rtol=1e-12)
  np.testing.assert_allclose(m1.beta_m, t + u * np.log(u), rtol=1e-10)
  np.testing.assert_allclose(m2.alpha, u ** 2, rtol=1e-12)
  np.testing.assert_allclose(m2.beta_c, 2 * t * u, rtol=1e-12)
  np.testing.assert_allclose(m2.beta_m, t ** 2, rtol=1e-12)
  # The card's weights for γ = 1 and γ = 2.
  np.testing.assert_allclose(w1[0], -np.log(u) / (t + u * np.log(u)), rtol=1e-9)
  np.testing.assert_allclose(w1[1], 1 / (-u * np.log(u)), rtol=1e-12)
  np.testing.assert_allclose(w2[0], 2 / t, rtol=1e-12)
  np.testing.assert_allclose(w2[1], 1 / t, rtol=1e-12)
  # General γ: the Kolmogorov equations with λ1 = γ/(1-t), λ2 = 1/(1-t).
  d = lambda a, b: (np.asarray(a) - np.asarray(b)) / (2 * h)
  np.testing.assert_allclose(d(mp.alpha, mm.alpha), -g / u * mg.alpha, rtol=1e-6)
  np.testing.assert_allclose(d(mp.beta_c, mm.beta_c), g / u * mg.alpha - mg.beta_c / u,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(d(mp.beta_m, mm.beta_m), mg.beta_c / u, rtol=1e-5, atol=1e-6)
  # γ = 1: min w_c = e and min w_m ≈ 3.35, so clipping at 2 makes both weights 2 everywhere.
  assert abs(np.min(w1[1]) - np.e) < 1e-4 and 3.3 < np.min(w1[0]) < 3.4


# ---------------------------------------------------------------------------------------------
# (1) ε = 0: ∫ E_q[L · bound] dt = -log p(x) for every sequence with the exact denoiser.


@pytest.mark.parametrize('gamma,xi,force', [(1.0, 1.0, 'within'), (2.0, 1.0, 'within'),
                                            (0.7, 1.0, 'within'), (1.0, 0.8, 'none'),
                                            (2.0, 0.7, 'none'), (0.7, 0.8, 'none')],
                         ids=['gamma1', 'gamma2', 'gamma0.7', 'gamma1-xi0.8', 'gamma2-xi0.7',
                              'gamma0.7-xi0.8'])
def test_continuous_bound_equals_neg_log_likelihood(gamma, xi, force):
  tt = toy()
  proc = make_process(gamma=gamma, xi=xi, force=force)
  with jax.enable_x64(True):
    nats = oracle.integrated_bound(tt, proc, denoiser(tt, proc))
  err = np.abs(nats - tt.neg_log_prob())
  print(f'γ={gamma} ξ={xi} {force}: max |∫ NELBO - (-log p)| = {err.max():.2e} over {len(err)}')
  assert err.max() < 1e-10


def test_between_force_is_a_valid_but_loose_bound():
  """ξ < 1 with 'between' (a heuristic law at cluster states): E_p[bound] > H(p); 'within' with
  ξ < 1 (the authors' sampling law) reports the same finite bound."""
  tt = toy()
  proc = make_process(xi=0.8, force='between')
  within = make_process(xi=0.8, force='within')
  with jax.enable_x64(True):
    nats = oracle.integrated_bound(tt, proc, denoiser(tt, proc))
    nats_w = oracle.integrated_bound(tt, within, denoiser(tt, within))
  assert nats @ tt.probs > tt.entropy() + 1e-3
  np.testing.assert_allclose(nats_w, nats, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# (2) Monte Carlo of `HDLM.bound` against its exact expectation; (3) a wrong denoiser.


def test_monte_carlo_bound_matches_exact_expectation():
  tt = toy()
  eps = t_min = 1e-3
  proc = make_process(eps=eps, t_min=t_min)
  den = denoiser(tt, proc)
  with jax.enable_x64(True):
    exact = oracle.integrated_bound(tt, proc, den, t_lo=t_min) / (1 - t_min)
  exact_mean = float(exact @ tt.probs)
  copies, num_batches = 128, 64
  n_seq = len(tt.probs)
  idx = np.arange(n_seq * copies) % n_seq
  batch = tt.batch(idx)
  wts = jnp.asarray(tt.probs[idx] * n_seq / len(idx) * tt.seq_len, jnp.float32)

  def one(key):
    k_t, k_perm, k_b = jax.random.split(key, 3)
    t = jax.random.permutation(k_perm, base.sample_times(k_t, len(idx), t_min=t_min))
    return (wts * proc.bound(den, batch, k_b, t)['total']).sum()

  est = np.asarray(jax.jit(lambda k: jax.lax.map(one, jax.random.split(k, num_batches)),
                         compiler_options=OPTIMISED)(
      jax.random.key(0)), np.float64)
  se = est.std(ddof=1) / np.sqrt(num_batches)
  z = (est.mean() - exact_mean) / se
  print(f'MC {est.mean():.5f} ± {se:.5f} ({num_batches * len(idx)} samples), exact '
        f'{exact_mean:.6f}: {z:+.2f} SE; H(p) = {tt.entropy():.6f}')
  assert abs(z) < 4
  # The floor leaves α(1) + β_c(1) = ε - ε log ε of the information at t = 1 (γ = 1); t_min cuts.
  m1 = proc.schedule.marginals(1.0)
  tol = (float(m1.alpha + m1.beta_c) + t_min) * tt.seq_len * np.log(4)
  print(f'gap H - exact = {tt.entropy() - exact_mean:.5f} (allowed {tol:.5f})')
  assert abs(exact_mean - tt.entropy()) < tol


def test_wrong_denoiser_is_strictly_worse():
  tt = toy()
  proc = make_process()
  wrong_p = oracle.make_toy(1, num_tokens=4, seq_len=3, num_levels=1).probs
  with jax.enable_x64(True):
    right = oracle.integrated_bound(tt, proc, denoiser(tt, proc)) @ tt.probs
    wrong = oracle.integrated_bound(tt, proc, denoiser(tt, proc, wrong_p)) @ tt.probs
  kl = float(tt.probs @ (np.log(tt.probs) - np.log(wrong_p)))
  print(f'E_p[bound]: exact {right:.6f} (H = {tt.entropy():.6f}), wrong {wrong:.6f}, KL {kl:.4f}')
  assert abs(right - tt.entropy()) < 1e-10
  assert wrong >= tt.entropy() + kl - 1e-10 and wrong > right + 0.1


# ---------------------------------------------------------------------------------------------
# (4) The sampler with the oracle samples the data law.


def _memo(tt: oracle.Toy, proc: hdlm.HDLM):
  return oracle.memoize(denoiser(tt, proc), vocab_size=proc.cfg.vocab_size, num_level_inputs=1,
                        seq_len=tt.seq_len)


def test_sampler_with_oracle_matches_data_law():
  tt = toy()
  proc = make_process()
  cfg = SampleConfig(num_steps=1000, num_levels=1, mask_id=MASK, use_cache=False)
  tv, out = oracle.sampler_total_variation(tt, proc, _memo(tt, proc), cfg, num_samples=20_000)
  print(f'first-order sampler, argmax last step, T = 1000: TV = {tv:.4f}')
  assert tv < 0.03
  assert int(out.nfe) == 1000 and int(out.nan_calls) == 0
  assert out.reveal_step.min() >= 1 and np.all(out.levels == 0)


@pytest.mark.slow
@pytest.mark.parametrize('kw', [dict(sampler='posterior'), dict(gamma=2.0, final_step='sample'),
                                dict(xi=0.8, force='none', cluster_draw='perturbed',
                                     sampler='posterior', final_step='sample')],
                         ids=['posterior', 'gamma2-sample', 'xi0.8-perturbed'])
def test_sampler_variants_match_data_law(kw):
  tt = toy()
  proc = make_process(**kw)
  cfg = SampleConfig(num_steps=1000, num_levels=1, mask_id=MASK, use_cache=False)
  tv, _ = oracle.sampler_total_variation(tt, proc, _memo(tt, proc), cfg, num_samples=20_000)
  assert tv < 0.03, f'{kw}: TV = {tv:.4f}'


def test_sampler_respects_given_positions_and_counts_calls():
  tt = toy()
  proc = make_process()
  den = _memo(tt, proc)
  bsz, steps = 4000, 50
  given = np.zeros((bsz, 3), bool)
  given[:, 1] = True
  tokens = np.full((bsz, 3), 2, np.int32)
  cfg = SampleConfig(num_steps=steps, num_levels=1, mask_id=MASK, use_cache=True)
  out = jax.tree.map(np.asarray, jax.jit(lambda k: proc.sample(
      den, k, cfg, batch_size=bsz, seq_len=3, given_tokens=tokens, given_mask=given))(
          jax.random.key(1)))
  assert np.all(out.tokens[:, 1] == 2) and np.all(out.reveal_step[:, 1] == steps + 1)
  assert np.all(out.tokens < MASK)
  keep = tt.seqs[:, 1] == 2
  cond = np.where(keep, tt.probs, 0.0) / tt.probs[keep].sum()
  assert oracle.total_variation(tt, out.tokens) < 1.0  # sanity; the law:
  emp = np.bincount(tt.index(out.tokens), minlength=len(tt.probs)) / bsz
  assert 0.5 * np.abs(emp - cond).sum() < 0.06
  # With every position given nothing ever moves: no network call at all.
  full = np.ones((2, 3), bool)
  out2 = proc.sample(den, jax.random.key(2), cfg, batch_size=2, seq_len=3,
                     given_tokens=np.zeros((2, 3), np.int32), given_mask=full)
  assert int(out2.nfe) == 0
  with pytest.raises(ValueError, match='given_tokens must be words'):
    proc.sample(den, jax.random.key(2), cfg, batch_size=2, seq_len=3,
                given_tokens=np.full((2, 3), 5, np.int32), given_mask=full)


def test_first_order_jumps_follow_the_card():
  sched = HDLMSchedule(1.0)
  t, s = jnp.float32(0.6), jnp.float32(0.5)
  p_mc, p_mw, p_cw = hdlm_sampler.jump_probs(sched, s, t, 'first_order', jnp.bool_(False))
  mt, ms = sched.marginals(t), sched.marginals(s)
  np.testing.assert_allclose(p_mc, (mt.beta_m - ms.beta_m) / mt.beta_m, rtol=1e-6)
  np.testing.assert_allclose(p_cw, (ms.alpha - mt.alpha) / mt.beta_c, rtol=1e-6)
  assert float(p_mw) == 0.0
  last = hdlm_sampler.jump_probs(sched, jnp.float32(0.0), t, 'first_order', jnp.bool_(True))
  assert [float(p) for p in last] == [0.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------------
# (5) One cluster is MDLM: the loss equals HMDLM with K = 1 on the same batch and key.


V, L, B = 11, 12, 16


def _net(seed: int, vocab: int = V, length: int = L):
  """A tiny network whose logits depend on the tokens, t and the other positions (not on levels:
  with one level the real backbones have no level table either)."""
  ks = jax.random.split(jax.random.key(seed), 4)
  emb, pos = jax.random.normal(ks[0], (vocab, 8)), jax.random.normal(ks[1], (length, 8))
  time_w, out_w = jax.random.normal(ks[2], (8,)), jax.random.normal(ks[3], (8, vocab))

  def apply(tokens, levels, t, *, heads, token_levels=None):
    del levels, token_levels
    h = jnp.tanh(emb[tokens] + pos + t[:, None, None] * time_w)
    h = jnp.tanh(h + h.mean(1, keepdims=True))
    return {'token': 3.0 * h @ out_w} if 'token' in heads else {}

  return apply


def _batch(seed: int, vocab: int = V - 1):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (B, L)).astype(np.int32)
  given = rng.random((B, L)) < 0.2
  pad = np.zeros((B, L), bool)
  pad[::2, 9:] = True
  return dict(tokens=tokens, levels=np.zeros((B, L), np.int32), given=given,
              loss_mask=~given & ~pad)


def test_one_cluster_loss_equals_mdlm():
  apply = _net(0)
  cfg = HDLMConfig(num_clusters=1, gamma=1.0, eps=1e-3, t_min=1e-3, mask_id=V - 1,
                   vocab_size=V)
  cluster_of = np.zeros(V, np.int32)
  cluster_of[V - 1] = -1
  proc = hdlm.HDLM(cfg, ClusterLayout(cluster_of, 1, V - 1))
  mdlm = hmdlm.HMDLM(Schedule('loglinear', (0.0,), eps=1e-3),
                     config_lib.LossConfig(mask_id=V - 1, num_levels=1, t_min=1e-3))
  both = jax.jit(lambda batch, key: (proc.loss(apply, batch, key), mdlm.loss(apply, batch, key)))
  worst = 0.0
  for seed in range(5):
    (ours, m1), (ref, _) = both(_batch(seed), jax.random.key(seed))
    worst = max(worst, abs(float(ours) - float(ref)))
    assert float(m1['cluster']) == 0.0 and float(m1['mask_rate']) == 0.0
  print(f'max |HDLM(n=1) loss - MDLM loss| over 5 batches = {worst:.2e}')
  assert worst < 1e-6
  # The same identity holds for the states: HDLM's cluster state is MDLM's MASK.
  t = jnp.linspace(0.05, 0.95, B)
  z = proc.corrupt(jax.random.key(9), _batch(9), t).tokens
  zm = mdlm.corrupt(jax.random.key(9), _batch(9), t).tokens
  np.testing.assert_array_equal(z, zm)


# ---------------------------------------------------------------------------------------------
# Training-loss options against a numpy re-derivation (weights from the card's closed forms).


NW, NC = 8, 3  # words and clusters of the re-derivation vocabulary; ids: words, MASK, clusters
CLUSTERS = np.array([0, 0, 1, 1, 1, 2, 2, 0])
VOCAB = NW + 1 + NC


def _layout() -> ClusterLayout:
  return ClusterLayout(np.concatenate([CLUSTERS, -np.ones(1 + NC, int)]), NC, NW)


def _card_weights(gamma: float, t: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
  tau = (1 - eps) * t
  u = 1 - tau
  if gamma == 1.0:
    w_m, w_c = -np.log(u) / (tau + u * np.log(u)), 1 / (-u * np.log(u))
  else:
    w_m, w_c = 2 / tau, 1 / tau
  return (1 - eps) * w_m, (1 - eps) * w_c


def _numpy_terms(logits, tokens, state, loss_mask, t, *, gamma, eps, xi, force, objective, hard,
                 clip=None):
  """Per-example 'cluster' and 'word' terms, by loops over positions (float64)."""
  w_m, w_c = _card_weights(gamma, t, eps)
  if clip is not None:
    w_m, w_c = np.clip(w_m, *clip), np.clip(w_c, *clip)
  kappa = (1 - xi) / (NC - 1)
  out_c, out_w = np.zeros(len(t)), np.zeros(len(t))
  for b in range(len(t)):
    for i in range(tokens.shape[1]):
      if not loss_mask[b, i] or state[b, i] < NW:
        continue
      lg = logits[b, i, :NW].astype(np.float64)
      xh = np.exp(lg - lg.max())
      xh /= xh.sum()
      x, cx = tokens[b, i], CLUSTERS[tokens[b, i]]
      p = np.array([xh[CLUSTERS == c].sum() for c in range(NC)])
      q = xi * p + kappa * (1 - p)
      if state[b, i] == NW:  # MASK
        if hard:
          v = -np.log(xh[x])
        elif xi == 1.0:
          v = -np.log(p[cx])
        elif objective == 'approx':
          v = -xi * np.log(q[cx] / xi)
        else:
          pi = np.where(np.arange(NC) == cx, xi, kappa)
          v = float(pi @ (np.log(pi) - np.log(q)))
        out_c[b] += w_m[b] * v
      else:
        c = state[b, i] - NW - 1
        if objective == 'approx' and xi < 1:
          v = -np.log(xh[x]) + (np.log(q[cx] / xi) if c == cx else 0.0)
        elif force == 'none':
          v = -np.log(xh[x])
        elif force == 'within':
          v = -np.log(xh[x] / p[c])
        else:
          y = np.where(CLUSTERS == c, xi * xh / p[c], (1 - xi) * xh / (1 - p[c]))
          v = -np.log(y[x])
        out_w[b] += w_c[b] * v
  n = np.maximum(loss_mask.sum(-1), 1)
  return out_c / n, out_w / n


@pytest.mark.parametrize('name,gamma,xi,force,kw', [
    ('elbo', 2.0, 1.0, 'within', {}),
    ('clip', 1.0, 1.0, 'within', dict(clip_weights=True, weight_min=0.0, weight_max=2.0)),
    ('clip_gamma2', 2.0, 1.0, 'within', dict(clip_weights=True, weight_min=0.1, weight_max=5.0)),
    ('hard', 1.0, 1.0, 'within', dict(hard_training=True)),
    ('none', 1.0, 1.0, 'none', {}),
    ('xi_elbo_between', 1.0, 0.8, 'between', {}),
    ('xi_elbo_none', 2.0, 0.9, 'none', {}),
    ('xi_approx', 1.0, 0.8, 'between', dict(xi_loss='approx')),
    ('xi_approx_hard', 1.0, 0.9, 'none', dict(xi_loss='approx', hard_training=True)),
])
def test_training_terms_match_numpy(name, gamma, xi, force, kw):
  eps = 1e-3
  cfg = HDLMConfig(num_clusters=NC, gamma=gamma, eps=eps, xi=xi, force=force, mask_id=NW,
                   vocab_size=VOCAB, **kw)
  proc = hdlm.HDLM(cfg, _layout())
  rng = np.random.default_rng(hash(name) % 2**32)
  bsz, length = 6, 10
  tokens = rng.integers(0, NW, (bsz, length)).astype(np.int32)
  logits = (2.0 * rng.normal(size=(bsz, length, VOCAB))).astype(np.float32)
  t = np.linspace(0.1, 0.9, bsz).astype(np.float32)
  loss_mask = rng.random((bsz, length)) < 0.8
  state = np.asarray(hdlm.corrupt(jax.random.key(3), jnp.asarray(tokens),
                                  jnp.zeros((bsz, length), bool), jnp.asarray(t), proc.schedule,
                                  proc.layout, xi))
  assert np.any(state == NW) and np.any(state > NW)
  got = jax.tree.map(np.asarray, proc.training_terms(jnp.asarray(logits), jnp.asarray(tokens),
                                                    jnp.asarray(state), jnp.asarray(loss_mask),
                                                    jnp.asarray(t)))
  clip = (cfg.weight_min, cfg.weight_max) if cfg.clip_weights else None
  ref_c, ref_w = _numpy_terms(logits, tokens, state, loss_mask, t.astype(np.float64), gamma=gamma,
                              eps=eps, xi=xi, force=force, objective=cfg.xi_loss,
                              hard=cfg.hard_training, clip=clip)
  np.testing.assert_allclose(got['cluster'], ref_c, rtol=2e-5, atol=1e-5)
  np.testing.assert_allclose(got['word'], ref_w, rtol=2e-5, atol=1e-5)
  if name == 'clip':  # γ = 1, max 2: both weights are exactly 2 at every t
    w_m, w_c = (np.clip(w, 0.0, 2.0) for w in _card_weights(1.0, t.astype(np.float64), eps))
    assert np.all(w_m == 2.0) and np.all(w_c == 2.0)


def test_loss_is_finite_and_reports_the_bound():
  proc = make_process(num_clusters=2)
  apply = _net(1, vocab=proc.cfg.vocab_size)
  batch = _batch(3, vocab=4)
  scaled = lambda s: (lambda *a, **k: {'token': s * apply(*a, **k)['token']})
  loss_fn = lambda s: proc.loss(scaled(s), batch, jax.random.key(0))
  (loss, m), grad = jax.jit(lambda s: (loss_fn(s), jax.grad(lambda v: loss_fn(v)[0])(s)))(1.0)
  assert np.isfinite(float(loss)) and float(m['finite']) == 1.0
  assert float(m['nelbo']) == pytest.approx(float(loss), rel=1e-6)  # no clipping: loss = bound
  assert 0 < float(m['mask_rate']) < 1 and 0 < float(m['cluster_rate']) < 1
  assert np.isfinite(float(grad))


# ---------------------------------------------------------------------------------------------
# Forward process: corruption frequencies and the perturbation's law.


def test_corruption_follows_the_marginals():
  proc = make_process(xi=0.7, force='none')
  n = 200_000
  tokens = jnp.full((n, 1), 1, jnp.int32)
  t = jnp.full((n,), 0.4, jnp.float32)
  z = np.asarray(hdlm.corrupt(jax.random.key(0), tokens, jnp.zeros((n, 1), bool), t,
                              proc.schedule, proc.layout, 0.7))[:, 0]
  m = proc.schedule.marginals(jnp.float32(0.4))
  expected = {1: float(m.alpha), MASK: float(m.beta_m), 5: 0.7 * float(m.beta_c),
              6: 0.3 * float(m.beta_c)}
  for state, p in expected.items():
    freq = float(np.mean(z == state))
    assert abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n), (state, freq, p)
  assert set(np.unique(z)) <= set(expected)


# ---------------------------------------------------------------------------------------------
# Config: registry, derived ids, one clear error per field.


def _hdlm_config(**kw):
  c = get_base_config()
  c.process.kind = 'hdlm'
  c.model.num_levels = 1
  c.process.hdlm.num_clusters = 8
  c.model.vocab_size = 100 + 1 + 8
  for k, v in kw.items():
    setattr(c.process.hdlm, k, v)
  return c


def test_config_resolves_ids_and_builds_the_process():
  r = config_lib.resolve(_hdlm_config())
  assert r.model.mask_id == 100 and r.model.extra_vocab_rows == 8
  assert config_lib.resolve(ml_collections.ConfigDict(config_lib.to_dict(r))).model.mask_id == 100  # idempotent
  proc = processes.build(resolved(_hdlm_config()))
  assert isinstance(proc, hdlm.HDLM) and proc.layout.cluster_offset == 101
  sizes = np.bincount(proc.layout.cluster_of[proc.layout.cluster_of >= 0])
  assert sizes.tolist() == [13, 12, 13, 12, 13, 12, 13, 12]  # the 'id' fallback: 100 words
  one = config_lib.resolve(_hdlm_config(num_clusters=1))
  assert one.model.extra_vocab_rows == 0 and one.model.mask_id == 108
  assert config_lib.hdlm_config(resolved(_hdlm_config(xi=0.9))).force == 'between'


@pytest.mark.parametrize('field,value,match', [
    ('xi', 0.9, None),  # fine: force 'auto' -> 'between'
    ('force', 'within', None),
    ('gamma', 0.0, 'process.hdlm.gamma'),
    ('xi', 1.5, 'process.hdlm.xi'),
    ('sampler', 'gidd', 'process.hdlm.sampler'),
    ('weight_max', -1.0, 'process.hdlm.weight_max'),
    ('fallback', 'hash', 'process.hdlm.fallback'),
])
def test_config_errors_name_the_field(field, value, match):
  c = _hdlm_config(**{field: value})
  if match is None:
    config_lib.resolve(c)
    return
  with pytest.raises(ValueError, match=match):
    config_lib.resolve(c)


def test_config_errors_for_inconsistent_settings():
  # force='within' with ξ < 1 is the authors' sampling law; its bound uses 'between'.
  proc = processes.build(resolved(_hdlm_config(xi=0.9, force='within')))
  assert proc.cfg.force == 'within' and hdlm.bound_force(proc.cfg.force, 0.9) == 'between'
  with pytest.raises(ValueError, match='needs at least 2 clusters'):
    config_lib.resolve(_hdlm_config(num_clusters=1, xi=0.9))
  c = _hdlm_config()
  c.model.num_levels = 2
  with pytest.raises(ValueError, match='model.num_levels=1'):
    config_lib.resolve(c)
  c = _hdlm_config()
  c.model.vocab_size = 9
  with pytest.raises(ValueError, match='model.vocab_size=9 must count'):
    config_lib.resolve(c)
  with pytest.raises(ValueError, match='process.hdlm.clusters'):
    processes.build(resolved(_hdlm_config(clusters='/nonexistent/clusters.npz')))
  with pytest.raises(ValueError, match="fallback='error'"):
    processes.build(resolved(_hdlm_config(fallback='error')))


def test_sampling_settings_are_checked():
  proc = make_process()
  with pytest.raises(ValueError, match='ancestral'):
    proc.check_sampling(SampleConfig(num_steps=4, num_levels=1, mask_id=MASK,
                                     ordering='confidence'))
  with pytest.raises(ValueError, match='num_levels'):
    proc.check_sampling(SampleConfig(num_steps=4, num_levels=2, mask_id=MASK))


def test_forced_laws_are_distributions():
  lay = _layout()
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, 5, VOCAB)), jnp.float32)
  log_xhat = hdlm_core.word_log_probs(logits, lay)
  p = hdlm_core.cluster_probs(log_xhat, lay)
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
  sc = jnp.asarray(rng.integers(0, NC, (2, 5)), jnp.int32)
  for force in ('within', 'between', 'none'):
    f = np.exp(np.asarray(hdlm_core.forced_log_probs(log_xhat, sc, lay, force=force, xi=0.8)))
    np.testing.assert_allclose(f.sum(-1), 1.0, rtol=1e-5)
    inside = (CLUSTERS[None, None, :] == np.asarray(sc)[..., None])
    mass_in = (f[..., :NW] * inside).sum(-1)
    if force == 'within':
      np.testing.assert_allclose(mass_in, 1.0, rtol=1e-5)
    elif force == 'between':
      np.testing.assert_allclose(mass_in, 0.8, rtol=1e-5)
  assert dataclasses.is_dataclass(lay)


def test_real_backbone_trains_and_samples_through_the_registry():
  """configs/hdlm_text.py's process on a tiny DiT: the vocabulary counts the cluster rows, one
  gradient step is finite, and the jitted sampler returns words only."""
  from hmdlm_jax.configs import hdlm_text  # pylint: disable=g-import-not-at-top
  c = hdlm_text.get_config()
  hdlm_text.to_hdlm(c, words_and_mask=101, num_clusters=8, clusters='')
  c.process.hdlm.fallback = 'id'
  m = c.model
  m.seq_len, m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim, m.cond_dim = 8, 1, 32, 2, 64, 16
  c.data.seq_len = 8
  r = config_lib.resolve(c)
  proc = processes.build(resolved(c))
  assert (r.model.vocab_size, r.model.mask_id, proc.layout.cluster_offset) == (109, 100, 101)
  model = models.build_model(r.model)
  params = models.init_params(model, jax.random.key(0), 8)
  batch = _batch(0, vocab=100)
  batch = {k: v[:, :8] for k, v in batch.items()}

  def loss_fn(p):
    return proc.loss(models.make_apply_fn(model, p, train=False), batch, jax.random.key(1))[0]

  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
  assert np.isfinite(float(loss))
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  cfg = config_lib.SampleConfig.from_config(resolved(c))
  cfg = dataclasses.replace(cfg, num_steps=6)
  run = base.make_sampler(proc, lambda p: models.make_apply_fn(model, p, train=False), cfg,
                          batch_size=3, seq_len=8)
  out = jax.tree.map(np.asarray, run(params, jax.random.key(2)))
  assert np.all(proc.layout.cluster_of[out.tokens] >= 0)  # words only
  assert 1 <= int(out.nfe) <= 6 and np.all((out.reveal_step >= 1) & (out.reveal_step <= 6))
