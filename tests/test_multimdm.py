"""MultiMDM against the exact oracle (docs/method.md §13.2; tests/oracle.py; docs/extending.md §3).

Toys: V = 4 words, M = 2 masks, L = 2 or 3 (Dirichlet(1) laws over the V^L sequences). In float64:
the closed forms (3.2)-(3.4) against matrices and Bayes' rule, the objective (3.6) with the exact
posterior integrated over t by tanh-sinh quadrature (= -log p(x) for every x, 1e-10), its Monte
Carlo estimate against that exact value (4 standard errors), a wrong denoiser, the ancestral
sampler (3.7) at T = 1,000 against the data law (TV < 0.03), given positions, and the reduction to
MDLM (M = 1: HMDLM's K = 1 loss to 1e-6 on the same batch and key).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.configs import multimdm_sudoku
from hmdlm_jax.configs import multimdm_text
from hmdlm_jax import config as config_lib
from hmdlm_jax import processes
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import multimdm
from hmdlm_jax.processes import multimdm_math as mm
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle
from tests.conftest import OPTIMISED
from tests.config_helpers import resolved

V, M = 4, 2
SCHEDULES = [dict(), dict(beta='alpha_power', beta_power=0.5),
             dict(alpha='cosine', beta='power', beta_power=2.0)]


def _toy(seq_len: int = 2, seed: int = 0) -> oracle.Toy:
  return oracle.make_toy(seed, num_tokens=V, seq_len=seq_len, num_levels=1)


def _oracle(toy: oracle.Toy, proc: multimdm.MultiMDM, probs=None, memo: bool = False):
  fn = oracle.make_oracle(toy, proc, vocab_size=V + proc.num_masks, probs=probs)
  if not memo:
    return fn
  return oracle.memoize(fn, vocab_size=V + proc.num_masks, num_level_inputs=1,
                        seq_len=toy.seq_len)


# --------------------------------------------------------------------------- closed forms (f64)


@pytest.mark.parametrize('kw', SCHEDULES, ids=['linear', 'alpha_power', 'cosine_power'])
def test_marginal_kernels_and_posterior_are_consistent(kw):
  sched = mm.MaskSchedule(**{k: v for k, v in kw.items()})
  des = mm.Designation(V, 3)  # M = 3: the designated and two other masks
  with jax.enable_x64(True):
    states = jnp.arange(V + 3)
    for s, t in [(0.0, 0.3), (0.2, 0.7), (0.55, 1.0)]:
      for x0 in range(V):
        p_s = np.exp(np.asarray(mm.log_marginal(sched, des, states, jnp.full_like(states, x0),
                                                jnp.float64(s))))
        p_t = np.exp(np.asarray(mm.log_marginal(sched, des, states, jnp.full_like(states, x0),
                                                jnp.float64(t))))
        np.testing.assert_allclose(p_t.sum(), 1.0, atol=1e-14)
        kern = mm.forward_kernel(sched, des, s, t)  # (3.3)
        np.testing.assert_allclose(kern.sum(1), 1.0, atol=1e-14)
        np.testing.assert_allclose(p_s @ kern, p_t, atol=1e-14)  # Chapman-Kolmogorov (A.1)
        for k in range(3):
          bayes = p_s * kern[:, V + k] / p_t[V + k]  # p(z_s | z_t = mask k, x0)
          post = np.asarray(mm.posterior_kernel(sched, des.of(jnp.asarray(x0)), jnp.asarray(k),
                                                jnp.float64(s), jnp.float64(t), 3))
          ref = np.concatenate([[bayes[x0]], bayes[V:]])
          np.testing.assert_allclose(post, ref, atol=1e-13)  # (3.4)
          np.testing.assert_allclose(np.delete(bayes[:V], x0), 0.0, atol=0)


def test_identification_term_equals_the_plain_formula():
  """The cancellation-free form of the (3.6) mask term against A.16/A.17 written out."""
  rng = np.random.default_rng(0)
  m = 4
  with jax.enable_x64(True):
    for _ in range(50):
      mu = rng.dirichlet(np.ones(m))
      k, m0 = rng.integers(0, m, 2)
      beta, dbeta = rng.uniform(0.01, 0.99), -rng.uniform(0.1, 2.0)
      c = (1 - beta) / m
      r = np.full(m, c)
      r[m0] += beta
      psi = r / r[k]
      psi_t = 1 - beta / (beta + c) * mu[k] + beta / c * mu
      plain = sum(psi[j] * np.log(psi[j] / psi_t[j]) + psi_t[j] - psi[j]
                  for j in range(m) if j != k) * (-dbeta / (m * beta))
      got = float(mm.identification_term(jnp.asarray(mu), jnp.asarray(k), jnp.asarray(m0),
                                         jnp.float64(beta), jnp.float64(1 - beta),
                                         jnp.float64(dbeta), m))
      np.testing.assert_allclose(got, plain, rtol=1e-10, atol=1e-14)
    # Finite at both ends (β = 1 at t = 0 has c = 0; β = 0 at t = 1 has weight 1/β).
    at_one = mm.identification_term(jnp.asarray([0.5, 0.5]), jnp.asarray(0), jnp.asarray(1),
                                    jnp.float64(0.0), jnp.float64(1.0), jnp.float64(-1.0), 2)
    assert float(at_one) == 0.0


# ----------------------------------------------------------------------------------- the bound


@pytest.mark.parametrize('kw', SCHEDULES, ids=['linear', 'alpha_power', 'cosine_power'])
def test_objective_integrates_to_neg_log_likelihood(kw):
  toy = _toy(seq_len=3)
  proc = multimdm.make(V, M, **kw)
  with jax.enable_x64(True):
    nats = oracle.integrated_bound(toy, proc, _oracle(toy, proc))
  err = np.abs(nats - toy.neg_log_prob())
  print(f'{kw}: max |∫ (3.6) dt - (-log p)| = {err.max():.2e} over {len(err)} sequences')
  assert err.max() < 1e-10


def test_monte_carlo_matches_exact_expectation():
  toy = _toy(seq_len=2)
  t_min = 1e-3
  proc = multimdm.make(V, M, t_min=t_min)
  with jax.enable_x64(True):
    exact = oracle.integrated_bound(toy, proc, _oracle(toy, proc), t_lo=t_min) / (1 - t_min)
  exact_mean = float(exact @ toy.probs)
  copies, num_batches = 256, 64
  n_seq = len(toy.probs)
  idx = np.arange(n_seq * copies) % n_seq
  batch = toy.batch(idx)
  wts = jnp.asarray(toy.probs[idx] * n_seq / len(idx) * toy.seq_len, jnp.float32)
  apply_fn = _oracle(toy, proc)

  def one(key):
    k_t, k_perm, k_b = jax.random.split(key, 3)
    t = jax.random.permutation(k_perm, jax.random.uniform(k_t, (len(idx),), minval=t_min))
    return (wts * proc.bound(apply_fn, batch, k_b, t)['total']).sum()

  est = np.asarray(jax.jit(lambda k: jax.lax.map(one, jax.random.split(k, num_batches)),
                         compiler_options=OPTIMISED)(
      jax.random.key(0)), np.float64)
  se = est.std(ddof=1) / np.sqrt(len(est))
  print(f'MC {est.mean():.5f} ± {se:.5f} ({len(est) * len(idx)} samples), exact '
        f'{exact_mean:.6f}, H(p) {toy.entropy():.6f}')
  assert abs(est.mean() - exact_mean) < 4 * se


def test_wrong_denoiser_scores_higher():
  toy = _toy(seq_len=3)
  proc = multimdm.make(V, M)
  wrong_p = _toy(seq_len=3, seed=1).probs
  with jax.enable_x64(True):
    right = oracle.integrated_bound(toy, proc, _oracle(toy, proc)) @ toy.probs
    wrong = oracle.integrated_bound(toy, proc, _oracle(toy, proc, probs=wrong_p)) @ toy.probs
  kl = float(toy.probs @ (np.log(toy.probs) - np.log(wrong_p)))
  print(f'E_p[bound]: exact {right:.6f} (H = {toy.entropy():.6f}), wrong {wrong:.6f}, KL {kl:.4f}')
  assert abs(right - toy.entropy()) < 1e-10
  assert wrong >= toy.entropy() + kl - 1e-10
  assert wrong > right + 0.1


# ------------------------------------------------------------------------------------- sampler


def test_sampler_matches_the_data_law():
  toy = _toy(seq_len=2)
  proc = multimdm.make(V, M)
  cfg = config_lib.SampleConfig(num_steps=1000, num_levels=1, mask_id=V)
  tv, out = oracle.sampler_total_variation(toy, proc, _oracle(toy, proc, memo=True), cfg,
                                           num_samples=20_000, seed=1)
  print(f'TV(samples at T = 1000, data) = {tv:.4f}; nfe {int(out.nfe)}')
  assert tv < 0.03
  assert int(out.nfe) == 1000 and int(out.nan_calls) == 0
  assert np.all((out.reveal_step >= 1) & (out.reveal_step <= 1000))


def test_sampler_starts_uniform_over_masks_and_skips_calls_when_done():
  proc = multimdm.make(V, 3)
  seen = []

  def spy(tokens, levels, t, *, heads, token_levels=None):
    jax.debug.callback(lambda x, tt: seen.append((np.asarray(x), float(tt[0]))), tokens, t)
    return {'token': jnp.zeros(tokens.shape + (V + 3,))}

  cfg = config_lib.SampleConfig(num_steps=4, num_levels=1, mask_id=V)
  out = jax.jit(lambda k: proc.sample(spy, k, cfg, batch_size=3000, seq_len=2))(jax.random.key(0))
  first, t_first = seen[0]
  assert t_first == 1.0
  counts = np.bincount(first.ravel(), minlength=V + 3)[V:] / first.size
  np.testing.assert_allclose(counts, 1 / 3, atol=5 * np.sqrt(2 / 9 / first.size))
  assert np.all(np.asarray(out.tokens) < V) and int(out.nfe) == 4


def test_given_positions_are_respected():
  toy = _toy(seq_len=2)
  proc = multimdm.make(V, M)
  a = 3
  cond = np.where(toy.seqs[:, 1] == a, toy.probs, 0.0)
  cond /= cond.sum()
  bsz = 8000
  given = np.zeros((bsz, 2), bool)
  given[:, 1] = True
  cfg = config_lib.SampleConfig(num_steps=100, num_levels=1, mask_id=V)
  out = jax.jit(lambda k: proc.sample(
      _oracle(toy, proc), k, cfg, batch_size=bsz, seq_len=2, given_tokens=jnp.full((bsz, 2), a),
      given_mask=jnp.asarray(given)))(jax.random.key(2))
  tokens = np.asarray(out.tokens)
  assert np.all(tokens[:, 1] == a) and np.all(np.asarray(out.reveal_step)[:, 1] == 101)
  assert oracle.total_variation(oracle.Toy(cond, toy.seqs, toy.levels, V, 1, 1), tokens) < 0.04
  with pytest.raises(ValueError, match='words'):
    proc.sample(_oracle(toy, proc), jax.random.key(0), cfg, batch_size=1, seq_len=2,
                given_tokens=np.full((1, 2), V), given_mask=np.ones((1, 2), bool))


def test_confidence_ordering_is_mdlm_top_k_for_one_mask():
  """Our Sudoku extension: M = 1 reproduces HMDLM's K = 1 confidence decoding token for token;
  for M = 3 every step reveals the expected number of positions and keeps the clues."""
  toy = _toy(seq_len=3)
  bsz, steps = 64, 6
  given = np.zeros((bsz, 3), bool)
  given[::4, 1] = True
  gt = np.where(given, 2, 0).astype(np.int32)
  mdlm = hmdlm.HMDLM(Schedule('loglinear', (0.0,), eps=0.0),
                     config_lib.LossConfig(mask_id=V, num_levels=1, prior_corrected=False))
  kw = dict(num_steps=steps, num_levels=1, mask_id=V, greedy=True, ordering='confidence',
            prior_corrected=False, hierarchy_weight=0.0, use_cache=False)
  ref = mdlm.sample(_hash_model(V + 1), jax.random.key(0), config_lib.SampleConfig(**kw),
                    batch_size=bsz, seq_len=3, given_tokens=np.where(given, gt, V),
                    given_levels=np.zeros_like(gt), given_mask=given)
  out = multimdm.make(V, 1).sample(_hash_model(V + 1), jax.random.key(0),
                                   config_lib.SampleConfig(**kw), batch_size=bsz, seq_len=3,
                                   given_tokens=gt, given_mask=given)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(np.asarray(out.reveal_step), np.asarray(ref.reveal_step))
  del toy
  three = multimdm.make(V, 3).sample(_hash_model(V + 3), jax.random.key(1),
                                     config_lib.SampleConfig(**kw), batch_size=bsz, seq_len=3,
                                     given_tokens=gt, given_mask=given)
  tokens, reveal = np.asarray(three.tokens), np.asarray(three.reveal_step)
  assert np.all(tokens < V) and np.all(tokens[given] == 2) and np.all(reveal[given] == steps + 1)
  free = (~given).sum(-1)
  for row in range(bsz):  # n = 6, 5: round(c · 1/n) with c masked positions, at least one
    steps_of = sorted(reveal[row][~given[row]], reverse=True)
    assert steps_of[0] == steps and len(steps_of) == free[row]


# ------------------------------------------------------------------------ M = 1 is MDLM exactly


def _hash_model(vocab: int):
  def fn(tokens, levels, t, *, heads, token_levels=None):
    pos = jnp.arange(tokens.shape[1], dtype=jnp.float32)
    z = jnp.sum(0.37 * tokens * (pos + 1.0), axis=-1)
    v = jnp.arange(vocab, dtype=jnp.float32)
    return {'token': 3.0 * jnp.cos(1.3 * z[:, None, None] + 0.4 * pos[None, :, None] + 0.9 * v
                                   + 2.0 * t[:, None, None] + 0.5 * tokens[..., None])}
  return fn


def test_single_mask_loss_equals_mdlm():
  toy = _toy(seq_len=3)
  rng = np.random.default_rng(0)
  batch = toy.batch(rng.integers(0, len(toy.probs), 512))
  batch['loss_mask'][:7, 2] = False
  batch['given'][7:11, 0] = True
  model = _hash_model(V + 1)
  mdlm = hmdlm.HMDLM(Schedule('loglinear', (0.0,), eps=0.0),
                     config_lib.LossConfig(mask_id=V, num_levels=1))
  single = multimdm.make(V, 1)
  for seed in range(3):
    key = jax.random.key(seed)
    l1, m1 = single.loss(model, batch, key)
    l2, m2 = mdlm.loss(model, batch, key)
    assert abs(float(l1) - float(l2)) <= 1e-6 * max(1.0, abs(float(l2)))
    assert float(m1['mask_rate']) == float(m2['mask_rate'])
    assert float(m1['ident']) == 0.0
  state = single.corrupt(jax.random.key(5), batch, jnp.full((512,), 0.4))
  ref = mdlm.corrupt(jax.random.key(5), batch, jnp.full((512,), 0.4))
  np.testing.assert_array_equal(np.asarray(state.tokens), np.asarray(ref.tokens))


def test_curriculum_weight_ramps():
  w = lambda s: float(multimdm.curriculum_weight(jnp.asarray(s), 10, 4))
  assert [w(s) for s in (0, 9, 10, 11, 12, 13, 50)] == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
  assert float(multimdm.curriculum_weight(None, 10, 4)) == 1.0
  assert float(multimdm.curriculum_weight(jnp.asarray(3), 5, 0)) == 0.0
  proc = multimdm.make(V, M, curriculum_start=100, curriculum_steps=10)
  batch = _toy(seq_len=3).batch(np.arange(64))
  l0, m0 = proc.loss(_hash_model(V + M), batch, jax.random.key(0), step=jnp.asarray(0))
  l1, m1 = proc.loss(_hash_model(V + M), batch, jax.random.key(0), step=jnp.asarray(200))
  assert float(m0['ident']) > 0 and float(m0['ident_weight']) == 0.0
  np.testing.assert_allclose(float(l0), float(m0['recon']), rtol=1e-6)
  np.testing.assert_allclose(float(l1), float(m1['recon'] + m1['ident']), rtol=1e-6)


# ------------------------------------------------------------------------------------- config


@pytest.mark.parametrize('field,value,match', [
    ('model.num_levels', 2, 'no hierarchy levels'),
    ('model.vocab_size', 3, 'count the words AND'),
    ('model.mask_id', 0, 'mask ids'),
    ('process.multimdm.num_masks', 0, 'num_masks'),
    ('process.multimdm.distill_kl', 'both', 'distill_kl'),
    ('process.multimdm.delta_max', 2.0 ** -12, 'delta_max'),
    ('process.multimdm.curriculum_steps', -1, 'curriculum_steps'),
    ('process.multimdm.alpha', 'sigmoid', 'alpha'),
    ('data.mask_token', 'tokenizer', "mask_token='append'"),
])
def test_config_validation_names_the_field(field, value, match):
  c = multimdm_text.get_config()
  section, *rest = field.split('.')
  node = c[section]
  for k in rest[:-1]:
    node = node[k]
  node[rest[-1]] = value
  with pytest.raises(ValueError, match=match):
    processes.build(resolved(c))


def test_designation_from_a_file(tmp_path):
  path = tmp_path / 'classes.txt'
  path.write_text('\n'.join(str(c) for c in [0, 0, 0, 1, 1, 1, 2, 2, 2]) + '\n')
  c = multimdm_sudoku.get_config()
  c.process.multimdm.designated = str(path)
  proc = multimdm.build(config_lib.resolve(c))
  np.testing.assert_array_equal(np.asarray(proc.des.of(jnp.arange(9))), [0, 0, 0, 1, 1, 1, 2, 2, 2])
  np.testing.assert_allclose(np.asarray(proc.des.group(jnp.full((9,), 1 / 9))), [1 / 3] * 3)
  path.write_text('0 1 5\n')
  with pytest.raises(ValueError, match='designated'):
    multimdm.build(config_lib.resolve(c))
