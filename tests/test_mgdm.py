"""MGDM against the exact oracle and independent numpy computations (docs/method.md §13.3).

Toy: V = 3 words, L = 2 (a Dirichlet(1) law over the 9 sequences), K = 1, ε = 0 where exactness
needs it. The objective (focal token weight × time weight × cross-entropy over masked positions)
is recomputed in float64 numpy from the toy's law on every noisy state and for a whole batch and
key; with its reweighting off it is MDLM's loss to 1e-6; its reported bound (MDLM's) integrates
to -log p(x) (1e-10); its Monte-Carlo loss lies within 4 standard errors of the exact
expectation; the focal weight is differentiated, not detached. Sampling: the ancestral chain at
T = 1,000 gives the data law (TV < 0.03); the 'remask' chain (top-k mask-predict) follows its law
enumerated in numpy (TV < 0.025 over 20k draws), and its deterministic mode a hand computation.
Mutations (flipped exponent, weight on unmasked positions, detached weight, remask-highest) make
the same checks fail. On a small DiT the one-device reading of the token head ('selected' rows)
gives the dense loss and gradient. The two shipped configs train three real steps.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import train_step as ts
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax.configs import sudoku_mgdm
from hmdlm_jax.configs import sudoku_mgdm_6m
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import mgdm
from hmdlm_jax.processes import mgdm_sampler
from hmdlm_jax.processes.schedules import Schedule
from tests import model_helpers as mh
from tests import oracle
from tests import sampler_helpers as sh
from tests.conftest import OPTIMISED
from tests.config_helpers import resolved

V, L = 3, 2
EXACT = Schedule('loglinear', (0.0,), eps=0.0, eta=0.0)
CASES = {  # MGDM's Sudoku recipe on a short grid; MDLM's weight in continuous time; no time weight
    'linear': mgdm.MGDMConfig(alpha=0.25, gamma=1.0, time_weighting='linear', diffusion_steps=4),
    'elbo': mgdm.MGDMConfig(alpha=0.5, gamma=2.0, time_weighting='elbo', diffusion_steps=0,
                            normalisation='positions'),
    'none': mgdm.MGDMConfig(alpha=1.0, gamma=0.5, time_weighting='none', diffusion_steps=3),
}


def _toy(seed: int = 0) -> oracle.Toy:
  return oracle.make_toy(seed, num_tokens=V, seq_len=L, num_levels=1)


def _proc(cfg: mgdm.MGDMConfig, schedule: Schedule = EXACT, **loss_kw) -> mgdm.MGDM:
  loss_cfg = config_lib.LossConfig(mask_id=V, num_levels=1, prior_corrected=False,
                                   token_rows='all', **loss_kw)
  return mgdm.MGDM(schedule, loss_cfg, mgdm=cfg)


# ------------------------------------------------------------------ the numpy reference (float64)


def np_posterior(toy: oracle.Toy, state: np.ndarray) -> np.ndarray:
  """p(x0^i = v | the revealed words of `state` [L]): [L, V], from the toy's law alone."""
  ok = np.all((state == toy.mask_id) | (toy.seqs == state), axis=-1)
  w = np.where(ok, toy.probs, 0.0)
  w = w / w.sum()
  return np.stack([np.bincount(toy.seqs[:, i], weights=w, minlength=V) for i in range(L)])


def np_time_weight(t: float, cfg: mgdm.MGDMConfig) -> float:
  if cfg.time_weighting == 'linear':
    return cfg.diffusion_steps - (round(t * cfg.diffusion_steps) - 1)  # T - k at t = (k + 1)/T
  return 1.0 / t if cfg.time_weighting == 'elbo' else 1.0  # ε = 0 log-linear: λ'(t) = 1/t


def np_sum(toy: oracle.Toy, x0: np.ndarray, state: np.ndarray, t: float,
           cfg: mgdm.MGDMConfig) -> float:
  """Σ_{masked i} w(t) · α(1 - p_i)^γ · (-log p_i), p_i = p(x0^i | the revealed words)."""
  post = np_posterior(toy, state)
  total = 0.0
  for i in np.flatnonzero(state == toy.mask_id):
    p = post[i, x0[i]]
    v = cfg.alpha * (1.0 - p) ** cfg.gamma if cfg.token_reweighting else 1.0
    total += np_time_weight(t, cfg) * v * -np.log(p)
  return total


def _all_states(toy: oracle.Toy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(x0 [S, L], state [S, L], masked [S, L]) for every sequence and mask pattern."""
  pats = np.array(list(itertools.product([False, True], repeat=L)))
  x0 = np.repeat(toy.seqs, len(pats), axis=0)
  masked = np.tile(pats, (len(toy.seqs), 1))
  return x0, np.where(masked, toy.mask_id, x0), masked


def objective_error(cfg: mgdm.MGDMConfig, times: tuple[float, ...]) -> float:
  """max |`sums_from_state` - numpy| over every state of the toy at `times` (float64)."""
  toy = _toy()
  proc = _proc(cfg)
  apply_fn = oracle.make_oracle(toy, proc)
  x0, state, masked = _all_states(toy)
  batch = dict(tokens=x0, levels=np.zeros_like(x0), given=np.zeros(x0.shape, bool),
               loss_mask=np.ones(x0.shape, bool))
  err = 0.0
  with jax.enable_x64(True):
    for t in times:
      tb = jnp.full((len(x0),), t, jnp.float64)
      got = np.asarray(mgdm.sums_from_state(
          apply_fn, batch, jnp.asarray(state), jnp.asarray(masked, jnp.int32), jnp.asarray(masked),
          tb, proc.schedule, proc.cfg, cfg)['sums'])
      want = np.array([np_sum(toy, a, s, t, cfg) for a, s in zip(x0, state)])
      err = max(err, float(np.abs(got - want).max()))
  return err


def _times(cfg: mgdm.MGDMConfig) -> tuple[float, ...]:
  if cfg.diffusion_steps:
    return tuple((k + 1) / cfg.diffusion_steps for k in range(cfg.diffusion_steps))
  return (0.07, 0.5, 0.93)


# ----------------------------------------------------------------------------------- objective


@pytest.mark.parametrize('name', CASES)
def test_objective_matches_numpy_on_every_state(name):
  cfg = CASES[name]
  assert objective_error(cfg, _times(cfg)) < 1e-10


def batch_loss_error(cfg: mgdm.MGDMConfig) -> float:
  """|`MGDM.loss` - numpy| / numpy on a batch and key (times, masks, weights, normalisation)."""
  toy = _toy()
  batch = toy.batch(np.arange(4 * len(toy.probs)) % len(toy.probs))
  proc = _proc(cfg)
  apply_fn = oracle.make_oracle(toy, proc)
  key = jax.random.key(5)
  loss, metrics = proc.loss(apply_fn, batch, key)
  k_t, k_mask, _ = jax.random.split(key, 3)
  t = np.asarray(mgdm.draw_times(k_t, len(batch['tokens']), proc.cfg, cfg), np.float64)
  if cfg.diffusion_steps:  # MGDM's grid
    k = t * cfg.diffusion_steps - 1
    np.testing.assert_allclose(k, np.round(k), atol=1e-5)
    t = (np.round(k) + 1) / cfg.diffusion_steps
  xt, _, masked = hmdlm.corrupt(k_mask, jnp.asarray(batch['tokens']), jnp.asarray(batch['levels']),
                                jnp.asarray(batch['given']), jnp.asarray(t, jnp.float32), EXACT,
                                mask_id=toy.mask_id)
  xt, masked = np.asarray(xt), np.asarray(masked)
  num = sum(np_sum(toy, a, s, ti, cfg) for a, s, ti in zip(batch['tokens'], xt, t))
  want = num / (masked.sum() if cfg.normalisation == 'masked' else masked.size)
  assert float(metrics['finite']) == 1.0 and 0 < masked.mean() < 1
  np.testing.assert_allclose(float(metrics['mask_rate']), masked.mean(), rtol=1e-6)
  return abs(float(loss) - want) / want


@pytest.mark.parametrize('name', CASES)
def test_loss_of_a_batch_and_key_matches_numpy(name):
  assert batch_loss_error(CASES[name]) < 2e-5


@pytest.mark.parametrize('alpha,gamma,reweight', [(0.25, 1.0, False), (1.0, 0.0, True)])
def test_reweighting_off_is_the_mdlm_loss(alpha, gamma, reweight):
  """Weight off (or α = 1, γ = 0), MDLM's time weight, normalisation and continuous t: the loss is
  HMDLM's K = 1 loss on the same batch and key; MGDM's recipe on the same draws is not."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, V, (16, 5)).astype(np.int32)
  batch = dict(tokens=tokens, levels=np.zeros_like(tokens), given=rng.random(tokens.shape) < 0.2,
               loss_mask=np.ones(tokens.shape, bool))
  batch['loss_mask'] = ~batch['given']
  net = sh.hash_model(1, V + 1)
  sched = Schedule('loglinear', (0.0,))
  off = mgdm.MGDMConfig(token_reweighting=reweight, alpha=alpha, gamma=gamma,
                        time_weighting='elbo', diffusion_steps=0, normalisation='positions')
  proc = _proc(off, sched)
  ref = hmdlm.HMDLM(sched, proc.cfg)
  for seed in range(3):
    key = jax.random.key(seed)
    got, _ = proc.loss(net, batch, key)
    want, want_m = ref.loss(net, batch, key)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    recipe, m = _proc(mgdm.MGDMConfig(diffusion_steps=0, time_weighting='elbo',
                                      normalisation='positions'), sched).loss(net, batch, key)
    assert abs(float(recipe) - float(want)) > 1e-2 * float(want)
    np.testing.assert_allclose(float(m['nelbo']), float(want_m['nelbo']), rtol=1e-6)


def test_selected_token_rows_equal_all_rows_on_a_real_network():
  """The train step's one-device reading (`loss.token_rows='selected'`) gives the dense loss and
  gradient on a small DiT (the focal weight included)."""
  vocab, seq = 8, 10
  model = models.build_model(mh.model_cfg(backbone='dit', num_levels=1, vocab_size=vocab,
                                          seq_len=seq, dropout=0.0))
  params = mh.random_params(model, seq, 0, scale=0.3)
  r = np.random.default_rng(1)
  batch = dict(tokens=r.integers(0, vocab - 1, (4, seq)).astype(np.int32),
               levels=np.zeros((4, seq), np.int32), given=r.random((4, seq)) < 0.2,
               loss_mask=r.random((4, seq)) < 0.9)

  def loss(p, rows):
    cfg = config_lib.LossConfig(mask_id=vocab - 1, num_levels=1, token_rows=rows)
    proc = mgdm.MGDM(Schedule('loglinear', (0.0,)), cfg, mgdm=mgdm.MGDMConfig(gamma=2.0))
    return proc.loss(models.make_apply_fn(model, p, train=False), batch, jax.random.key(3))[0]

  v_all, g_all = jax.jit(jax.value_and_grad(lambda p: loss(p, 'all')))(params)
  v_sel, g_sel = jax.jit(jax.value_and_grad(lambda p: loss(p, 'selected')))(params)
  np.testing.assert_allclose(v_sel, v_all, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_all), jax.tree.leaves(g_sel)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------ bound and MC


def test_reported_bound_is_mdlms_and_equals_minus_log_p():
  toy = _toy()
  proc = _proc(CASES['linear'])
  assert proc.bound_kind == 'mdlm'
  with jax.enable_x64(True):
    nats = oracle.integrated_bound(toy, proc, oracle.make_oracle(toy, proc))
  assert np.abs(nats - toy.neg_log_prob()).max() < 1e-10


def test_monte_carlo_loss_matches_exact_expectation():
  """i.i.d. grid times (loss.antithetic=False), 'positions' normalisation: the batch loss is
  unbiased for mean_b (1/T) Σ_k E_q[sum] / L, computed exactly in numpy."""
  toy = _toy(1)
  cfg = dataclasses.replace(CASES['linear'], normalisation='positions')
  proc = _proc(cfg, antithetic=False)
  apply_fn = oracle.make_oracle(toy, proc)
  copies, num_batches = 8, 1500
  batch = toy.batch(np.arange(copies * len(toy.probs)) % len(toy.probs))
  run = jax.jit(lambda keys: jax.lax.map(lambda k: proc.loss(apply_fn, batch, k)[0], keys),
                compiler_options=OPTIMISED)
  est = np.asarray(run(jax.random.split(jax.random.key(0), num_batches)), np.float64)
  exact = 0.0
  x0, state, masked = _all_states(toy)
  for k in range(cfg.diffusion_steps):
    t = (k + 1) / cfg.diffusion_steps
    q = np.prod(np.where(masked, t, 1 - t), axis=-1)  # ε = 0: mask probability t
    vals = np.array([np_sum(toy, a, s, t, cfg) for a, s in zip(x0, state)])
    exact += (q * vals).sum() / len(toy.probs) / cfg.diffusion_steps / L
  se = est.std(ddof=1) / np.sqrt(len(est))
  print(f'MC {est.mean():.5f} ± {se:.5f}, exact {exact:.5f}')
  assert abs(est.mean() - exact) < 4 * se


def _focal_grad(weight_fn) -> tuple[np.ndarray, np.ndarray]:
  """d/dlogits of α(1-p)^γ·(-log p) at one position: autodiff through `weighted_sums` with
  `mgdm.token_weight` = weight_fn, and central finite differences of the closed form."""
  cfg = mgdm.MGDMConfig(alpha=0.25, gamma=2.0, time_weighting='none', diffusion_steps=1)
  logits = np.array([0.3, -1.1, 0.7], np.float64)

  def closed(z):
    p = np.exp(z[1] - np.log(np.exp(z).sum()))
    return 0.25 * (1 - p) ** 2 * -np.log(p)

  def f(z):
    u = jax.nn.logsumexp(z) - z[1]
    return mgdm.weighted_sums(u[None, None], jnp.ones((1, 1), bool), jnp.ones((1,)),
                              jnp.ones((1,)), cfg)[0]

  old = mgdm.token_weight
  mgdm.token_weight = weight_fn
  try:
    with jax.enable_x64(True):
      auto = np.asarray(jax.grad(f)(jnp.asarray(logits)))
  finally:
    mgdm.token_weight = old
  h = 1e-6
  fd = np.array([(closed(logits + h * e) - closed(logits - h * e)) / (2 * h) for e in np.eye(3)])
  return auto, fd


def test_focal_weight_is_differentiated_not_detached():
  auto, fd = _focal_grad(mgdm.token_weight)
  np.testing.assert_allclose(auto, fd, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------------------------ mutations


def test_mutations_of_the_objective_fail_the_oracle_checks(monkeypatch):
  cfg = CASES['linear']
  times = _times(cfg)
  assert objective_error(cfg, times) < 1e-10
  good = mgdm.token_weight
  monkeypatch.setattr(mgdm, 'token_weight', lambda u, a, g: good(u, a, -g))  # flipped exponent
  assert objective_error(cfg, times) > 1e-3
  monkeypatch.setattr(mgdm, 'token_weight', good)
  real = mgdm.weighted_sums

  # The weight applied to unmasked positions as well, where the network is not certain (the exact
  # denoiser is, u = 0 there, which would hide this mutant).
  def everywhere(u, sel, t, hazard, c):
    return real(jnp.where(sel, u, 0.5), jnp.ones_like(sel), t, hazard, c)

  monkeypatch.setattr(mgdm, 'weighted_sums', everywhere)
  assert objective_error(cfg, times) > 1e-3
  monkeypatch.setattr(mgdm, 'weighted_sums', real)
  # Unmasked positions counted in MGDM's normaliser (MDLM's denominator in 'masked' mode).
  assert batch_loss_error(cfg) < 2e-5
  monkeypatch.setattr(mgdm, 'normaliser', lambda sel, loss_mask, c: loss_mask.sum())
  assert batch_loss_error(cfg) > 1e-2
  auto, fd = _focal_grad(lambda u, a, g: jax.lax.stop_gradient(good(u, a, g)))  # detached
  assert np.abs(auto - fd).max() > 1e-3


# ------------------------------------------------------------------------------------ sampling


def test_ancestral_ordering_samples_the_data_law():
  toy = _toy(3)
  proc = _proc(CASES['linear'], Schedule('loglinear', (0.0,)))
  fn = oracle.memoize(oracle.make_oracle(toy, proc), vocab_size=V + 1, num_level_inputs=2,
                      seq_len=L)
  cfg = sh.sample_cfg(num_steps=1000, num_levels=1, mask_id=V, use_cache=False)
  tv, out = oracle.sampler_total_variation(toy, proc, fn, cfg, num_samples=20_000, seed=1)
  assert tv < 0.03, f'TV(samples, data) = {tv:.4f}'
  assert int(out.nfe) == 1000


def np_remask_law(toy: oracle.Toy, cfg: config_lib.SampleConfig, *, lowest: bool = True
                  ) -> np.ndarray:
  """The law of the 'remask' chain with the exact denoiser on an L = 2 toy, by enumeration.

  Each step: argmax tokens x̂ and log-confidences c of the posterior (revealed words: c = 0);
  count = floor(2 · rate); for count = 1 the lower noisy score c_i + s G_i is re-masked, i.e.
  position 0 with probability σ((c_1 - c_0)/s) (a difference of Gumbels is logistic).
  `lowest=False` re-masks the higher one (a mutant).
  """
  law = np.zeros(len(toy.probs))

  def walk(x: np.ndarray, n: int, prob: float) -> None:
    post = np_posterior(toy, x)
    x_hat, c = post.argmax(-1), np.log(post.max(-1))
    rate = float(mgdm_sampler.remask_rate(jnp.asarray(n), cfg))
    count = int(np.floor(L * rate))
    if count == 0:
      if n == 1:
        law[toy.index(x_hat)] += prob
      else:
        walk(x_hat, n - 1, prob)
      return
    assert count == 1
    s = cfg.remask_noise * rate
    p0 = 1.0 / (1.0 + np.exp(-(c[1] - c[0]) / s))  # P(c_0 + s G_0 < c_1 + s G_1)
    for i, p in ((0, p0), (1, 1.0 - p0)):
      if not lowest:
        p = 1.0 - p
      y = x_hat.copy()
      y[i] = toy.mask_id
      walk(y, n - 1, prob * p)

  walk(np.full(L, toy.mask_id), cfg.num_steps, 1.0)
  return law


# Toy seeds whose law has two outcomes of mass >= 0.2 (most toys' chains end on one sequence).
@pytest.mark.parametrize('steps,noise,schedule,seed', [(4, 0.5, 'linear', 34),
                                                       (6, 0.5, 'cosine', 24)])
def test_remask_chain_follows_its_enumerated_law(steps, noise, schedule, seed):
  toy = _toy(seed)
  proc = _proc(CASES['linear'], Schedule('loglinear', (0.0,)))
  fn = oracle.make_oracle(toy, proc)
  cfg = sh.sample_cfg(num_steps=steps, num_levels=1, mask_id=V, ordering='remask',
                      remask_noise=noise, remask_schedule=schedule, greedy=False)
  law = np_remask_law(toy, cfg)
  np.testing.assert_allclose(law.sum(), 1.0, atol=1e-12)
  run = jax.jit(lambda k: proc.sample(fn, k, cfg, batch_size=20_000, seq_len=L))
  out = jax.tree.map(np.asarray, run(jax.random.key(4)))
  assert np.all(out.tokens < V) and int(out.nfe) == steps
  emp = np.bincount(toy.index(out.tokens), minlength=len(law)) / len(out.tokens)
  tv = 0.5 * np.abs(emp - law).sum()
  assert tv < 0.025, f'TV(samples, enumerated law) = {tv:.4f}'
  assert np.sort(law)[-2] > 0.2
  # The check has power: re-masking the most confident instead is another law.
  assert 0.5 * np.abs(emp - np_remask_law(toy, cfg, lowest=False)).sum() > 0.1


@pytest.mark.parametrize('decoded', ['carry', 'repredict'])
def test_remask_deterministic_trajectory_matches_hand_computation(decoded):
  """Greedy mode with a model whose logits are fixed per step: after step n exactly
  floor(N (n-1)/T) free positions are masked, the lowest-confidence ones among those predicted
  (carry: the masked ones, decoded cells certain; repredict, MGDM's code: every free cell afresh,
  so a decoded cell the network doubts is re-masked); givens stay."""
  rng = np.random.default_rng(0)
  b, l, steps = 3, 7, 5
  table = rng.normal(size=(steps + 1, b, l, V + 1)) * 2.0  # logits at step n = round(t T)

  def model(tokens, levels, t, *, heads, token_levels=None):
    del tokens, levels, heads, token_levels
    return {'token': jnp.asarray(table, jnp.float32)[jnp.round(t[0] * steps).astype(jnp.int32)]}

  given = np.zeros((b, l), bool)
  given[:, 0] = True
  given_tok = np.zeros((b, l), np.int32)
  cfg = sh.sample_cfg(num_steps=steps, num_levels=1, mask_id=V, ordering='remask', greedy=True,
                      remask_decoded=decoded)
  proc = _proc(CASES['linear'], Schedule('loglinear', (0.0,)))
  state = proc.sampler_init(model, cfg, batch_size=b, seq_len=l, given_tokens=given_tok,
                            given_mask=given)
  x = np.where(given, 0, V)
  remasked_decoded = 0
  for n in range(steps, 0, -1):
    z = table[n, ..., :V] - np.log(np.exp(table[n, ..., :V]).sum(-1, keepdims=True))
    state = proc.reverse_step(model, cfg, jax.random.key(0), state, jnp.int32(n))
    fresh = (x == V) if decoded == 'carry' else np.ones_like(given)
    conf = np.where(fresh, z.max(-1), 0.0)  # carry (SUBS): a revealed word is certain
    x_hat = np.where(fresh & ~given, z.argmax(-1), x)
    count = (n - 1) * (l - 1) // steps
    score = np.where(given, np.inf, conf)
    cut = np.sort(score, -1)[:, count][:, None]
    remasked_decoded += int(np.sum((score < cut) & (x != V) & ~given))
    x = np.where(score < cut, V, x_hat)
    np.testing.assert_array_equal(np.asarray(state.tokens), x)
    assert np.all((x == V).sum(-1) == count) and np.all(np.asarray(state.tokens)[:, 0] == 0)
  assert not np.any(x == V)
  assert (remasked_decoded > 0) == (decoded == 'repredict')  # only MGDM's code re-masks


def test_remask_ordering_is_refused_by_other_processes():
  cfg = sh.sample_cfg(num_steps=4, num_levels=1, mask_id=V, ordering='remask')
  with pytest.raises(ValueError, match="sample.ordering='remask'"):
    hmdlm.HMDLM(Schedule('loglinear', (0.0,)), _proc(CASES['linear']).cfg).check_sampling(cfg)
  _proc(CASES['linear']).check_sampling(cfg)


# ------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize('field,value,match', [
    ('process.mgdm.time_weighting', 'cubic', 'time_weighting'),
    ('process.mgdm.alpha', 0.0, 'alpha'),
    ('process.mgdm.diffusion_steps', 0, 'diffusion_steps'),  # 'linear' needs the grid
    ('process.mgdm.normalisation', 'rows', 'normalisation'),
    ('model.num_levels', 2, 'num_levels=1'),
    ('sample.remask_schedule', 'step', 'remask_schedule'),
])
def test_config_validation_names_the_field(field, value, match):
  with pytest.raises(ValueError, match=match):
    processes.build(resolved(sudoku_mgdm.get_config(), **{field: value}))


@pytest.mark.parametrize('module', [sudoku_mgdm, sudoku_mgdm_6m], ids=['demo', '6m'])
def test_shipped_configs_train_three_steps(module):
  c = module.get_config()
  c.data.batch_size = 8
  config = config_lib.resolve(c)
  assert isinstance(processes.build(config), mgdm.MGDM)
  step, state, batch = ts.real_step(config)
  p0 = [np.array(a) for a in jax.tree.leaves(state.params)]  # the step donates the state
  losses = []
  for _ in range(3):
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss']))
    assert 0.0 < float(metrics['token_weight']) <= config.process.mgdm.alpha
  assert np.all(np.isfinite(losses)) and int(state.step) == 3
  assert any(not np.allclose(a, b) for a, b in zip(p0, jax.tree.leaves(state.params)))
