"""Exact K-step laws of the samplers with an imperfect denoiser, and mutation checks.

A fixed random logit table over every noisy state of an L = 2 toy (logits A[z] + t·B[z]) is a
denoiser whose K-step law differs from any data law, so these tests see the sampler itself: the
law of the K-step chain is enumerated in numpy float64 (docs/method.md §13.1, "Sampler") and
20k draws are compared to it by Pearson's χ² (p-value > 1e-3; the draws use fixed keys). Each
mutation (the network called at s instead of t; the cluster position's word drawn from x̂ without
restriction to its cluster; the authors' β_m' without 1/(γ-1)) must be rejected by a check.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.config import HDLMConfig
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import hdlm
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hdlm_core
from hmdlm_jax.processes import hdlm_sampler
from hmdlm_jax.processes.hdlm_core import ClusterLayout
from tests import oracle
from tests.sampler_helpers import chi2_pvalue
from tests.sampler_helpers import final_law
from tests.sampler_helpers import table_model
from tests.conftest import OPTIMISED

WORD_CLUSTERS = (0, 0, 1, 1)
W, MASK, N_CLUS, L = 4, 4, 2, 2
V = W + 1 + N_CLUS  # words, MASK, two cluster rows
NUM_SAMPLES = 20_000
P_MIN = 1e-3  # χ² p-value below which a law is rejected


def make_process(**kw) -> hdlm.HDLM:
  cfg = HDLMConfig(num_clusters=N_CLUS, eps=0.0, mask_id=MASK, vocab_size=V, **kw)
  cluster_of = np.full(V, -1, np.int32)
  cluster_of[:W] = WORD_CLUSTERS
  return hdlm.HDLM(cfg, ClusterLayout(cluster_of, N_CLUS, MASK))


# ---------------------------------------------------------------------------------------------
# The numpy float64 reference of HDLM's K-step chain.


def _marginals(gamma: float, t: float) -> tuple[float, float, float]:
  u = 1.0 - t
  alpha = u ** gamma
  if u == 0.0:
    beta_c = 0.0
  elif gamma == 1.0:
    beta_c = -u * np.log(u)
  else:
    beta_c = gamma * (u - u ** gamma) / (gamma - 1.0)
  return alpha, beta_c, 1.0 - alpha - beta_c


def _jumps(gamma: float, sampler: str, s: float, t: float) -> tuple[float, float, float]:
  """(MASK -> cluster, MASK -> word, cluster -> word) of one step t -> s (method.md §13.1)."""
  at, ct, mt = _marginals(gamma, t)
  as_, cs, ms = _marginals(gamma, s)
  if sampler == 'first_order':
    p_mc, p_mw = (mt - ms) / mt if mt > 0 else 0.0, 0.0
    p_cw = (as_ - at) / ct if ct > 0 else 1.0
  else:
    stay = cs * (1.0 - t) / (1.0 - s)
    p_mc = (cs - stay) / mt if mt > 0 else 0.0
    p_mw = (mt - ms - cs + stay) / mt if mt > 0 else 0.0
    p_cw = 1.0 - stay / ct if ct > 0 else 1.0
  return tuple(float(np.clip(p, 0.0, 1.0)) for p in (p_mc, p_mw, p_cw))


def _position_law(lg: np.ndarray, z: int, jumps, *, last: bool, argmax: bool, force: str,
                  xi: float, perturbed: bool) -> np.ndarray:
  """The law [V] of one position's next state given its state z and its logits lg [V]."""
  member = np.asarray(WORD_CLUSTERS)
  x = np.exp(lg[:W] - lg[:W].max())
  x /= x.sum()
  p = np.array([x[member == c].sum() for c in range(N_CLUS)])
  out = np.zeros(V)
  if z < W:
    out[z] = 1.0
    return out
  p_mc, p_mw, p_cw = (0.0, 1.0, 1.0) if last else jumps
  if z == MASK:
    law, stay, to_word = x, 1.0 - p_mc - p_mw, p_mw
    q = xi * p + (1.0 - xi) / (N_CLUS - 1) * (1.0 - p) if perturbed else p
    out[W + 1:] += p_mc * q
    out[MASK] += stay
  else:
    c = z - W - 1
    inside = np.where(member == c, x, 0.0)
    if force == 'within':
      law = inside / inside.sum()
    elif force == 'between':
      law = xi * inside / inside.sum() + (1 - xi) * (x - inside) / (1.0 - inside.sum())
    else:
      law = x
    to_word = p_cw
    out[z] += 1.0 - p_cw
  if argmax and last:
    law = np.eye(W)[np.argmax(law)]
  out[:W] += to_word * law
  return out


def hdlm_kstep_law(logits_fn, proc: hdlm.HDLM, num_steps: int, *,
                   time_shift: float = 0.0) -> np.ndarray:
  """Exact law [W^L] of the sampler's words after `num_steps` steps from all-MASK (float64).

  time_shift: the reference of a sampler that calls the network at t + time_shift.
  """
  c = proc.cfg
  states = list(itertools.product(range(V), repeat=L))
  prob = {tuple([MASK] * L): 1.0}
  for n in range(num_steps, 0, -1):
    t, s = n / num_steps, (n - 1) / num_steps
    jumps = _jumps(c.gamma, c.sampler, s, t)
    nxt = dict.fromkeys(states, 0.0)
    for z, pz in prob.items():
      lg = logits_fn(np.asarray(z), None, t + time_shift)['token']
      laws = [_position_law(lg[i], z[i], jumps, last=n == 1, argmax=c.final_step == 'argmax',
                            force=c.force, xi=c.xi, perturbed=c.cluster_draw == 'perturbed')
              for i in range(L)]
      joint = np.einsum('i,j->ij', *laws)
      for y in zip(*np.nonzero(joint)):
        nxt[y] += pz * joint[y]
    prob = {z: p for z, p in nxt.items() if p > 0}
  return final_law(prob, W)


def draw(proc: hdlm.HDLM, apply_fn, num_steps: int, seed: int = 0) -> np.ndarray:
  """NUM_SAMPLES sequences from the jitted sampler, as indices into [W^L]."""
  cfg = SampleConfig(num_steps=num_steps, num_levels=1, mask_id=MASK, use_cache=False)
  run = jax.jit(lambda k: proc.sample(apply_fn, k, cfg, batch_size=NUM_SAMPLES, seq_len=L),
                compiler_options=OPTIMISED)
  tokens = np.asarray(run(jax.random.key(seed)).tokens)
  assert tokens.max() < W, 'the sampler left noise states in its output'
  return tokens[:, 0] * W + tokens[:, 1]


# ---------------------------------------------------------------------------------------------
# HDLM: the draws follow the enumerated K-step law; the mutations do not.

HDLM_CASES = {
    'first_order-argmax-K3': (dict(), 3),
    'posterior-sample-gamma2-K2': (dict(sampler='posterior', final_step='sample', gamma=2.0), 2),
    'first_order-sample-gamma0.7-K4': (dict(final_step='sample', gamma=0.7), 4),
    'xi0.9-within-perturbed-K3': (dict(xi=0.9, force='within', cluster_draw='perturbed',
                                       final_step='sample'), 3),
    'xi0.8-between-K3': (dict(xi=0.8, force='between', final_step='sample'), 3),
}


@pytest.mark.parametrize('name', list(HDLM_CASES))
def test_hdlm_sampler_follows_the_exact_kstep_law(name):
  kw, k = HDLM_CASES[name]
  proc = make_process(**kw)
  apply_fn, logits = table_model(1, V, seq_len=L)
  law = hdlm_kstep_law(logits, proc, k)
  pval, tv = chi2_pvalue(draw(proc, apply_fn, k), law)
  print(f'{name}: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval > P_MIN, f'{name}: χ² p-value {pval:.3g}, TV {tv:.4f}'


def test_mutant_law_is_far_from_the_right_one():
  """The t-dependent table separates the right K-step law from the one of the time mutant."""
  proc = make_process(final_step='sample')
  _, logits = table_model(1, V, seq_len=L)
  tv = 0.5 * np.abs(hdlm_kstep_law(logits, proc, 3)
                    - hdlm_kstep_law(logits, proc, 3, time_shift=-1 / 3)).sum()
  assert tv > 0.02, f'TV between the right and the mutant law {tv:.4f}: too close to test'


def test_mutant_network_called_at_s_is_rejected():
  """Mutation: the sampler evaluates the network at s = t - 1/K instead of t."""
  k = 3
  proc = make_process(final_step='sample')
  apply_fn, logits = table_model(1, V, seq_len=L)
  mutant = lambda tokens, levels, t, **kw: apply_fn(tokens, levels, t - 1.0 / k, **kw)
  pval, tv = chi2_pvalue(draw(proc, mutant, k), hdlm_kstep_law(logits, proc, k))
  print(f'network at s: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval < P_MIN
  # ... and the reference of that mutant accepts it (the check is about the law, nothing else).
  pval_ref, _ = chi2_pvalue(draw(proc, mutant, k),
                            hdlm_kstep_law(logits, proc, k, time_shift=-1.0 / k))
  assert pval_ref > P_MIN


def test_mutant_unrestricted_word_draw_is_rejected(monkeypatch):
  """Mutation: a cluster position draws its word from x̂ over all words (no renormalisation)."""
  k = 3
  proc = make_process(final_step='sample')
  apply_fn, logits = table_model(1, V, seq_len=L)
  monkeypatch.setattr(hdlm_core, 'forced_log_probs', lambda log_xhat, *a, **kw: log_xhat)
  pval, tv = chi2_pvalue(draw(proc, apply_fn, k), hdlm_kstep_law(logits, proc, k))
  print(f'unrestricted word draw: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval < P_MIN


# ---------------------------------------------------------------------------------------------
# The authors' weight bug for γ ∉ {1, 2} fails the bound's exactness check.


def _bound_error(gamma: float) -> float:
  tt = oracle.make_toy(0, num_tokens=W, seq_len=2, num_levels=1)
  proc = make_process(gamma=gamma, force='within')
  with jax.enable_x64(True):
    nats = oracle.integrated_bound(tt, proc, oracle.make_oracle(tt, proc, vocab_size=V))
  return float(np.abs(nats - tt.neg_log_prob()).max())


def test_authors_gamma_weight_bug_fails_the_bound_check(monkeypatch):
  """Their β_m' lacks 1/(γ-1): w_m is (γ-1)× ours. Exact at γ = 2, wrong at γ = 0.7."""
  right = hdlm_core.HDLMSchedule.weights

  def buggy(self, t):
    w_m, w_c = right(self, t)
    return (w_m * (self.gamma - 1.0) if self.gamma != 1.0 else w_m), w_c

  assert _bound_error(0.7) < 1e-10
  monkeypatch.setattr(hdlm_core.HDLMSchedule, 'weights', buggy)
  assert _bound_error(2.0) < 1e-10  # the bug is invisible where the authors ran it
  err = _bound_error(0.7)
  print(f'γ = 0.7 with the authors\' weight: max |∫ NELBO - (-log p)| = {err:.3g}')
  assert err > 1e-2


# ---------------------------------------------------------------------------------------------
# float32: a cluster whose mass P_θ(c) underflows still gets its within-cluster law.


def _linear_space_within(log_xhat, state_cluster, layout, *, force, xi):
  """The former law: x̂ / P_θ(c) with P_θ(c) = Σ exp(log x̂) (underflows to 0 in float32)."""
  p = hdlm_core.cluster_probs(log_xhat, layout)
  member = jnp.asarray(layout.cluster_of) == state_cluster[..., None]
  log_pc = jnp.log(jnp.take_along_axis(p, state_cluster[..., None], axis=-1))
  return jnp.where(member, log_xhat - log_pc, -jnp.inf)


def _last_step_from_cluster(final_step: str, batch: int = 4000) -> np.ndarray:
  """Words drawn by the last step from cluster 1 when P_θ(cluster 1) underflows: [batch * L]."""
  proc = make_process(final_step=final_step)
  logits = np.zeros((batch, L, V), np.float32)
  logits[..., 2:4] = [-1e4, -1e4 + np.log(2.0)]  # x̂(2) : x̂(3) = 1 : 2, both exp to 0
  apply_fn = lambda tokens, levels, t, **kw: {'token': jnp.asarray(logits)}
  x = jnp.full((batch, L), W + 1 + 1, jnp.int32)  # every position in cluster 1
  zeros, zero = jnp.zeros((batch, L), jnp.int32), jnp.zeros((), jnp.int32)
  state = base.SamplerState(x, zeros, zeros, zero, zero, ())
  cfg = SampleConfig(num_steps=4, num_levels=1, mask_id=MASK, use_cache=False)
  out = hdlm_sampler.reverse_step(apply_fn, proc.schedule, proc.layout, proc.cfg, cfg,
                                  jax.random.key(0), state, jnp.int32(1))
  return np.asarray(out.tokens).ravel()


def test_within_cluster_draw_survives_underflow(monkeypatch):
  words = _last_step_from_cluster('sample')
  assert set(np.unique(words)) <= {2, 3}, np.unique(words)
  frac = float(np.mean(words == 3))
  se = np.sqrt(2 / 9 / words.size)
  assert abs(frac - 2 / 3) < 5 * se, f'P(word 3) = {frac:.4f}, expected 2/3 (5 SE = {5 * se:.4f})'
  assert np.all(_last_step_from_cluster('argmax') == 3)
  # Mutation: the linear-space law draws outside the cluster or always the first member.
  monkeypatch.setattr(hdlm_core, 'forced_log_probs', _linear_space_within)
  bad = _last_step_from_cluster('sample')
  assert not (set(np.unique(bad)) <= {2, 3} and abs(np.mean(bad == 3) - 2 / 3) < 5 * se)
