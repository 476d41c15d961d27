"""Exact K-step laws of the MultiMDM and HMDLM samplers with an imperfect denoiser (mutations too).

As tests/test_sampler_kstep_laws.py does for HDLM: a fixed random logit table over every noisy
state of an L = 2 toy, the law of the K-step chain enumerated in float64 (the one-step closed
forms, kernel (3.4) and λ_k(s, t), evaluated in float64 by the package's tested functions; the
composition, the draws and their order re-derived here, docs/method.md §7 and §13.2), and 20k
draws compared by Pearson's χ² (p > 1e-3). The mutant that calls the network at s instead of t
must be rejected, and so must pass 2 reading the pass-1 levels.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import hmdlm_sampler
from hmdlm_jax.processes import multimdm
from hmdlm_jax.processes import multimdm_math as mm
from tests import sampler_helpers as sh
from tests.conftest import OPTIMISED

L = 2
NUM_SAMPLES = 20_000
P_MIN = 1e-3


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max())
  return e / e.sum()


# ---------------------------------------------------------------------------------------------
# MultiMDM: words 0..V-1, masks V..V+M-1; x_1 uniform over the masks, then (3.7) per step.

MV, MM = 3, 2


def multimdm_kstep_law(reference, proc: multimdm.MultiMDM, num_steps: int, *,
                       time_shift: float = 0.0) -> np.ndarray:
  """Exact law [V^L] of the words after `num_steps` steps (float64)."""
  prob = {z: (1.0 / MM) ** L for z in itertools.product(range(MV, MV + MM), repeat=L)}
  for n in range(num_steps, 0, -1):
    t, s = n / num_steps, (n - 1) / num_steps
    with jax.enable_x64(True):
      # kern[a, k]: [word a, mask 0..M-1] from mask k given the hypothesis a.
      kern = np.asarray(mm.posterior_kernel(
          proc.sched, proc.des.of(jnp.arange(MV)[:, None]), jnp.arange(MM)[None, :],
          jnp.float64(s), jnp.float64(t), MM))
    nxt: dict = {}
    for z, pz in prob.items():
      lg = reference(np.asarray(z), None, t + time_shift)['token']
      laws = []
      for i in range(L):
        out = np.zeros(MV + MM)
        if z[i] < MV:
          out[z[i]] = 1.0
        else:
          x = _softmax(lg[i, :MV])
          for a in range(MV):
            row = kern[a, z[i] - MV]
            out[a] += x[a] * row[0]
            out[MV:] += x[a] * row[1:]
        laws.append(out)
      joint = np.einsum('i,j->ij', *laws)
      for y in zip(*np.nonzero(joint)):
        nxt[y] = nxt.get(y, 0.0) + pz * joint[y]
    prob = nxt
  return sh.final_law(prob, MV)


def _multimdm_draws(proc, apply_fn, num_steps: int) -> np.ndarray:
  cfg = SampleConfig(num_steps=num_steps, num_levels=1, mask_id=MV, use_cache=False)
  run = jax.jit(lambda k: proc.sample(apply_fn, k, cfg, batch_size=NUM_SAMPLES, seq_len=L),
                compiler_options=OPTIMISED)
  tok = np.asarray(run(jax.random.key(0)).tokens)
  assert tok.max() < MV
  return tok[:, 0] * MV + tok[:, 1]


@pytest.mark.parametrize('k', [2, 4])
def test_multimdm_sampler_follows_the_exact_kstep_law(k):
  proc = multimdm.make(MV, MM)
  apply_fn, ref = sh.table_model(2, MV + MM, seq_len=L)
  pval, tv = sh.chi2_pvalue(_multimdm_draws(proc, apply_fn, k), multimdm_kstep_law(ref, proc, k))
  print(f'MultiMDM K = {k}: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval > P_MIN


def test_multimdm_mutant_network_called_at_s_is_rejected():
  k = 3
  proc = multimdm.make(MV, MM)
  apply_fn, ref = sh.table_model(2, MV + MM, seq_len=L)
  mutant = lambda tokens, levels, t, **kw: apply_fn(tokens, levels, t - 1.0 / k, **kw)
  law = multimdm_kstep_law(ref, proc, k)
  shifted = multimdm_kstep_law(ref, proc, k, time_shift=-1.0 / k)
  assert 0.5 * np.abs(law - shifted).sum() > 0.02  # the mutant's law is far enough to test
  pval, tv = sh.chi2_pvalue(_multimdm_draws(proc, mutant, k), law)
  print(f'MultiMDM network at s: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval < P_MIN
  assert sh.chi2_pvalue(_multimdm_draws(proc, mutant, k), shifted)[0] > P_MIN


# ---------------------------------------------------------------------------------------------
# HMDLM (Algorithm 2, two_pass): a masked position draws a level from λ_k g_k (or stays), pass 2
# sees the drawn levels of every position revealed at this step, then the words are drawn.

HW, HK = 3, 2  # words, levels; MASK = HW, masked level input = HK


def hmdlm_kstep_law(reference, schedule, num_steps: int, *, time_shift: float = 0.0
                    ) -> np.ndarray:
  """Exact law [W^L] of the words after `num_steps` steps of Algorithm 2 (float64)."""
  prob = {(tuple([HW] * L), tuple([HK] * L)): 1.0}
  for n in range(num_steps, 0, -1):
    t, s = n / num_steps, (n - 1) / num_steps
    tt = t + time_shift
    lam = np.asarray(schedule.reveal_prob(np.float64(s), np.float64(t), np))
    active = np.asarray(schedule.one_minus_alpha(np.float64(t), np)) > 0
    nxt: dict = {}
    for (x, h), pz in prob.items():
      g = np.stack([_softmax(r) for r in reference(np.asarray(x), np.asarray(h), tt)['hier']])
      options = []  # per position: [(drawn level or None, probability)]
      for i in range(L):
        if h[i] < HK:
          options.append([(None, 1.0)])
        elif n == 1:
          allowed = active if active.any() else np.ones(HK, bool)
          w = np.where(allowed, g[i], 0.0)
          options.append([(k, w[k] / w.sum()) for k in range(HK) if w[k] > 0])
        else:
          w = lam * g[i]
          options.append([(k, w[k]) for k in range(HK)] + [(None, 1.0 - w.sum())])
      for combo in itertools.product(*options):
        pc = pz * np.prod([p for _, p in combo])
        lev = tuple(h[i] if k is None else k for i, (k, _) in enumerate(combo))
        tok = reference(np.asarray(x), np.asarray(lev), tt)['token']
        words = [[x[i]] if k is None else range(HW) for i, (k, _) in enumerate(combo)]
        for y in itertools.product(*words):
          py = pc
          for i, (k, _) in enumerate(combo):
            if k is not None:
              py *= _softmax(tok[i, :HW])[y[i]]
          key = (tuple(y), lev)
          nxt[key] = nxt.get(key, 0.0) + py
    prob = nxt
  words: dict = {}
  for (x, _), p in prob.items():
    words[x] = words.get(x, 0.0) + p
  return sh.final_law(words, HW)


def _hmdlm_draws(apply_fn, schedule, num_steps: int) -> np.ndarray:
  cfg = sh.sample_cfg(num_steps=num_steps, num_levels=HK, mask_id=HW, use_cache=False,
                      time_conditioning=True)
  tok = sh.run_sampler(apply_fn, jax.random.key(0), schedule, cfg, batch_size=NUM_SAMPLES,
                       seq_len=L).tokens
  assert tok.max() < HW
  return tok[:, 0] * HW + tok[:, 1]


@pytest.mark.parametrize('k', [2, 3])
def test_hmdlm_sampler_follows_the_exact_kstep_law(k):
  apply_fn, ref = sh.table_model(3, HW + 1, seq_len=L, num_levels=HK)
  law = hmdlm_kstep_law(ref, sh.LOGLINEAR, k)
  pval, tv = sh.chi2_pvalue(_hmdlm_draws(apply_fn, sh.LOGLINEAR, k), law)
  print(f'HMDLM K = {k}: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval > P_MIN


def test_hmdlm_mutant_network_called_at_s_is_rejected():
  k = 3
  apply_fn, ref = sh.table_model(3, HW + 1, seq_len=L, num_levels=HK)
  mutant = lambda tokens, levels, t, **kw: apply_fn(tokens, levels, t - 1.0 / k, **kw)
  law = hmdlm_kstep_law(ref, sh.LOGLINEAR, k)
  assert 0.5 * np.abs(law - hmdlm_kstep_law(ref, sh.LOGLINEAR, k, time_shift=-1.0 / k)).sum() > 0.02
  pval, tv = sh.chi2_pvalue(_hmdlm_draws(mutant, sh.LOGLINEAR, k), law)
  print(f'HMDLM network at s: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval < P_MIN


def test_hmdlm_mutant_pass2_without_drawn_levels_is_rejected(monkeypatch):
  """Mutation: pass 2 reads the pass-1 levels (MASK's level K) instead of the drawn ones."""
  k = 3
  apply_fn, ref = sh.table_model(3, HW + 1, seq_len=L, num_levels=HK)
  right = hmdlm_sampler._Heads.pass2  # pylint: disable=protected-access
  monkeypatch.setattr(hmdlm_sampler._Heads, 'pass2',  # pylint: disable=protected-access
                      lambda self, x, h_in, own, t_b: right(self, x, h_in, h_in, t_b))
  pval, tv = sh.chi2_pvalue(_hmdlm_draws(apply_fn, sh.LOGLINEAR, k),
                            hmdlm_kstep_law(ref, sh.LOGLINEAR, k))
  print(f'HMDLM pass 2 without drawn levels: χ² p = {pval:.3g}, TV = {tv:.4f}')
  assert pval < P_MIN
