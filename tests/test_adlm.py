"""ADLM (docs/method.md §13.4) against exact references.

* γ = 0: the loss equals MDLM's (the K = 1 HMDLM) bit for bit on a real anchor + denoiser model.
* The objective at every state of an enumerable toy equals a numpy re-derivation, and a wrong
  anchor term (sign, placement, normalisation) fails that comparison (mutation check).
* The bound by quadrature with the exact denoiser: the reported bound = -log p(x); the ANELBO with
  γ > 0 exceeds it by exactly γ times its anchor integral, with equality when the term vanishes.
* The Monte-Carlo loss within 4 standard errors of its exact expectation.
* The sampler with the exact denoiser (and a useless anchor head) samples the data law (TV).
* The anchor rule, the γ ramp, the model's information flow; configs/adlm_text.py trains.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.processes import adlm
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes.base import NoisyState
from tests import oracle
from tests import sampler_helpers as sh
from tests.conftest import read_jsonl
from tests.conftest import run_cmd

TAU = 1
T_MIN = 1e-3


def _toy(seed: int = 0, num_tokens: int = 3, seq_len: int = 3) -> oracle.Toy:
  return oracle.make_toy(seed, num_tokens=num_tokens, seq_len=seq_len, num_levels=1, tau=TAU)


def _anchors(tokens: jax.Array) -> jax.Array:
  """The rule re-derived in jnp (count of the token in its row <= τ), for traced toy batches."""
  return (tokens[:, :, None] == tokens[:, None, :]).sum(-1) <= TAU


def _with_anchors(batch: dict) -> dict:
  return dict(batch, anchors=_anchors(jnp.asarray(batch['tokens'])))


def _table_model(num_states: int, vocab: int, seq_len: int, seed: int):
  """A deterministic apply_fn: 'anchor' and 'token' logits looked up per (state, position) in
  random tables (the toys' states: tokens 0..vocab-1 at each position)."""
  rng = np.random.default_rng(seed)
  anchor = rng.normal(size=(num_states, seq_len, vocab)) * 2
  token = rng.normal(size=(num_states, seq_len, vocab)) * 2
  weights = vocab ** np.arange(seq_len - 1, -1, -1)

  def fn(tokens, levels, t, *, heads, **_):
    code = (tokens * jnp.asarray(weights)).sum(-1)
    dtype = jnp.promote_types(jnp.asarray(t).dtype, jnp.float32)
    tables = {'anchor': jnp.asarray(anchor, dtype), 'token': jnp.asarray(token, dtype)}
    return {h: tables[h][code] for h in heads}

  return fn, anchor, token


def _numpy_objective(toy, states, t, anchor_tab, token_tab, gamma) -> np.ndarray:
  """The objective of docs/method.md §13.4 per (sequence, state), numpy float64 (independent)."""
  v, mask = toy.vocab_size, toy.mask_id
  weights = v ** np.arange(toy.seq_len - 1, -1, -1)
  out = np.zeros(states.shape[:2])
  for i, x in enumerate(toy.seqs):
    counts = (x[:, None] == x[None, :]).sum(-1)
    for j, z in enumerate(states[i]):
      code = int((z * weights).sum())
      lm = anc = 0.0
      for pos in range(toy.seq_len):
        tok = token_tab[code, pos].copy()
        tok[mask] = -np.inf
        tok = tok - np.log(np.exp(tok - tok.max()).sum()) - tok.max()
        if z[pos] == mask:
          lm += -tok[x[pos]] / t
        if counts[pos] <= TAU:
          a = anchor_tab[code, pos]
          anc += -(a[x[pos]] - a.max() - np.log(np.exp(a - a.max()).sum())) / t
      out[i, j] = (lm + gamma * anc) / toy.seq_len
  return out


def _check_objective_against_numpy(proc: adlm.ADLM, gamma: float) -> None:
  toy = _toy()
  states, xi = oracle.enumerate_states(toy, proc)
  n_seq, n_st, seq_len = states.tokens.shape
  fn, anchor_tab, token_tab = _table_model(toy.vocab_size ** seq_len, toy.vocab_size, seq_len, 1)
  t = 0.37
  batch = _with_anchors(toy.batch(xi.reshape(-1)))
  state = NoisyState(jnp.asarray(states.tokens.reshape(-1, seq_len)),
                     jnp.asarray(states.levels.reshape(-1, seq_len)))
  with jax.enable_x64(True):
    got = proc.anelbo_from_state(fn, batch, state, jnp.full((n_seq * n_st,), t, jnp.float64),
                                 gamma=gamma)['total']
  want = _numpy_objective(toy, np.asarray(states.tokens), t, anchor_tab, token_tab, gamma)
  np.testing.assert_allclose(np.asarray(got).reshape(n_seq, n_st), want, rtol=1e-12, atol=1e-12)


def _proc(gamma: float = 0.5, eps: float = 0.0, antithetic: bool = True) -> adlm.ADLM:
  schedule = hmdlm.Schedule('loglinear', (0.0,), eps=eps, eta=0.0)
  return adlm.make(schedule, mask_id=3, gamma=gamma, tau=TAU, t_min=T_MIN, antithetic=antithetic)


def test_objective_equals_numpy_on_the_enumerable_toy():
  _check_objective_against_numpy(_proc(), gamma=0.5)


def _mutant(kind: str):
  original = adlm.objective_terms

  def mutated(anchor_logits, token_logits, tokens, anchors, masked, loss_mask, hazard, *,
              mask_id):
    if kind == 'masked_only':  # the anchor term at masked anchors only
      anchors = anchors & masked
    if kind == 'without_mask_column':  # softmax over the words only
      anchor_logits = jnp.where(jnp.arange(anchor_logits.shape[-1]) == mask_id, -jnp.inf,
                                anchor_logits)
    out = original(anchor_logits, token_logits, tokens, anchors, masked, loss_mask, hazard,
                   mask_id=mask_id)
    if kind == 'sign':
      out['anchor'] = -out['anchor']
    if kind == 'per_anchor':  # normalised by the number of anchors, not of loss positions
      n = loss_mask.sum(-1) / jnp.maximum((anchors & loss_mask).sum(-1), 1)
      out['anchor'] = out['anchor'] * n
    return out

  return mutated


@pytest.mark.parametrize('kind', ['sign', 'masked_only', 'without_mask_column', 'per_anchor'])
def test_mutated_anchor_term_fails_the_numpy_oracle(kind, monkeypatch):
  """The comparison above can fail: each wrong anchor term is caught by it."""
  monkeypatch.setattr(adlm, 'objective_terms', _mutant(kind))
  with pytest.raises(AssertionError):
    _check_objective_against_numpy(_proc(), gamma=0.5)


def _exact_model(toy, proc, anchor: str):
  """The exact-posterior denoiser as 'token'; 'anchor' = the same posterior ('posterior': c_l = 0
  at revealed positions) or zeros ('useless')."""
  exact = oracle.make_oracle(toy, proc)

  def fn(tokens, levels, t, *, heads, **_):
    tok = exact(tokens, levels, t, heads=('token',))['token']
    out = {'token': tok}
    if 'anchor' in heads:
      out['anchor'] = tok if anchor == 'posterior' else jnp.zeros_like(tok)
    return {h: out[h] for h in heads}

  return fn


def test_bound_is_exact_and_the_anelbo_a_bound_by_quadrature():
  _check_anelbo_bound()


def test_mutated_anchor_sign_fails_the_bound_test(monkeypatch):
  monkeypatch.setattr(adlm, 'objective_terms', _mutant('sign'))
  with pytest.raises(AssertionError):
    _check_anelbo_bound()


def _check_anelbo_bound() -> None:
  toy = _toy(2)
  proc = _proc()
  fn = _exact_model(toy, proc, 'posterior')
  nlp = toy.neg_log_prob()
  bound = oracle.integrated_bound(toy, proc, fn)
  np.testing.assert_allclose(bound, nlp, rtol=0, atol=1e-10)
  t_nodes, w = oracle.quadrature(0.0, proc.kinks)

  def integral(gamma: float, *, no_anchors: bool = False) -> np.ndarray:
    def value(batch, state, t):
      batch = _with_anchors(batch)
      if no_anchors:
        batch['anchors'] = jnp.zeros_like(batch['anchors'])
      out = proc.anelbo_from_state(fn, batch, state, t, gamma=gamma)
      return out['total'] * out['num_tokens']
    return w @ oracle.expected_per_state(toy, proc, value, t_nodes)

  np.testing.assert_allclose(integral(0.0), nlp, rtol=0, atol=1e-10)
  np.testing.assert_allclose(integral(0.5, no_anchors=True), nlp, rtol=0, atol=1e-10)
  anchor_part = integral(1.0) - nlp
  has_anchor = oracle.frequency_levels(toy.seqs, TAU, 2).any(-1)
  assert np.all(anchor_part[has_anchor] > 1e-3) and np.all(np.abs(anchor_part[~has_anchor]) < 1e-10)
  np.testing.assert_allclose(integral(0.5) - nlp, 0.5 * anchor_part, rtol=1e-9, atol=1e-12)


def test_monte_carlo_loss_matches_its_exact_expectation():
  toy = _toy(4)
  proc = _proc(gamma=0.5, eps=1e-3, antithetic=False)  # i.i.d. t: E[loss] = the mean of E_t
  seq_len = toy.seq_len
  fn, _, _ = _table_model(toy.vocab_size ** seq_len, toy.vocab_size, seq_len, 2)
  t_nodes, w = oracle.quadrature(T_MIN, proc.kinks)

  def value(batch, state, t):
    return proc.anelbo_from_state(fn, _with_anchors(batch), state, t)['total']

  exact = (w @ oracle.expected_per_state(toy, proc, value, t_nodes)) / (1.0 - T_MIN)  # [N]
  batch = proc.prepare_batch(toy.batch())
  losses = jax.jit(jax.vmap(lambda k: proc.loss(fn, batch, k)[0]))(
      jax.random.split(jax.random.key(0), 2000))
  losses = np.asarray(losses, np.float64)
  se = losses.std(ddof=1) / np.sqrt(len(losses))
  assert se < 0.02 * exact.mean()  # a sharp check, not a wide interval
  assert abs(losses.mean() - exact.mean()) < 4 * se, (losses.mean(), exact.mean(), se)


def test_gamma_zero_loss_equals_mdlm_on_a_real_model():
  c = config_lib.defaults()
  c.process.kind = 'adlm'
  c.process.adlm.gamma = 0.0
  m = c.model
  m.num_levels, m.vocab_size, m.seq_len, m.num_layers = 1, 12, 8, 2
  m.hidden_size, m.num_heads, m.mlp_dim, m.cond_dim = 32, 2, 64, 16
  c.data.kind, c.data.seq_len, c.schedule.offsets = 'text', 8, (0.0,)
  r = config_lib.resolve(c)
  assert r.model.denoiser_layers == 1
  proc = adlm.build(r)
  model = models.build_model(r.model)
  params = models.init_params(model, jax.random.key(0), 8)
  specs = models.logical_specs(model, 8)  # every denoiser parameter has logical axes
  assert jax.tree.structure(specs) == jax.tree.structure(params)
  counts = models.param_count_breakdown(r.model)
  assert counts['adlm denoiser'] == sum(models.count_params(v) for k, v in params.items()
                                         if k.startswith('denoiser_'))
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape), params)
  fn = models.make_apply_fn(model, params, train=False)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 11, size=(4, 8)).astype(np.int32)
  loss_mask = np.ones((4, 8), bool)
  loss_mask[0, 6:] = False
  raw = dict(tokens=tokens, levels=rng.integers(0, 2, (4, 8)).astype(np.int32),
             given=np.zeros((4, 8), bool), loss_mask=loss_mask)
  batch = proc.prepare_batch(raw)
  key = jax.random.key(3)
  mdlm = hmdlm.HMDLM(proc.mdlm.schedule, proc.mdlm.cfg)
  want, _ = jax.jit(lambda b: mdlm.loss(fn, b, key))(mdlm.prepare_batch(raw))
  got, metrics = jax.jit(lambda b: proc.loss(fn, b, key, step=jnp.int32(10)))(batch)
  assert float(got) == float(want) and float(metrics['nelbo']) == float(want)
  assert float(metrics['anchor']) > 0.0  # the anchor term is computed, with weight 0
  # Gradients: the anchor term reaches φ only, the denoiser term reaches both networks.
  def grads(which):
    def f(p):
      return proc.loss(models.make_apply_fn(model, p, train=False), batch, key)[1][which]
    return jax.jit(jax.grad(f))(params)
  g_anchor, g_lm = grads('anchor'), grads('lm')
  norm = lambda g, pre: sum(float(jnp.abs(x).sum()) for k, v in g.items() if k.startswith(pre)
                           for x in jax.tree.leaves(v))
  assert norm(g_anchor, 'denoiser_') == 0.0 and norm(g_anchor, 'blocks_') > 0.0
  assert norm(g_lm, 'denoiser_') > 0.0 and norm(g_lm, 'blocks_') > 0.0
  # With γ > 0 the same draws add exactly γ times that term.
  proc2 = adlm.make(proc.mdlm.schedule, mask_id=proc.cfg.mask_id, gamma=0.25, tau=5)
  got2, _ = jax.jit(lambda b: proc2.loss(fn, b, key))(batch)
  np.testing.assert_allclose(float(got2), float(want) + 0.25 * float(metrics['anchor']),
                             rtol=1e-6)
  # The denoiser sees z_t only through y_φ(z_t): with φ's output layer zeroed (random weights
  # elsewhere) every input gives the same 'token' logits; with it perturbed, they differ.
  cut = dict(params, output_layer=jax.tree.map(jnp.zeros_like, params['output_layer']))
  fresh = models.make_apply_fn(model, cut, train=False)
  t = jnp.full((4,), 0.5)
  zero = jnp.zeros_like(tokens)
  out = fresh(tokens, zero, t, heads=('anchor', 'token'))
  assert np.all(np.asarray(out['anchor']) == 0.0)
  flipped = fresh(tokens[::-1], zero, t, heads=('token',))['token']
  np.testing.assert_array_equal(out['token'], flipped)
  assert not np.allclose(fn(tokens, zero, t, heads=('token',))['token'],
                         fn(tokens[::-1], zero, t, heads=('token',))['token'])
  # The jitted sampler on the real model returns words only.
  cfg = dataclasses.replace(config_lib.SampleConfig.from_config(r), num_steps=4)
  run = base.make_sampler(proc, lambda p: models.make_apply_fn(model, p, train=False), cfg,
                          batch_size=3, seq_len=8)
  out = jax.tree.map(np.asarray, run(params, jax.random.key(2)))
  assert np.all(out.tokens < r.model.mask_id) and 1 <= int(out.nfe) <= 4


def test_sampler_samples_the_data_law():
  """The locked-in anchored step with the exact denoiser and a useless anchor head (the sampler
  reads 'token' only): TV to the data law; a wrong denoiser is far."""
  toy = _toy(3)
  proc = _proc()
  cfg = sh.sample_cfg(num_steps=100, num_levels=1, mask_id=toy.mask_id, use_cache=False)
  fn = oracle.memoize(_exact_model(toy, proc, 'useless'), vocab_size=toy.vocab_size,
                      num_level_inputs=2, seq_len=toy.seq_len)
  tv, out = oracle.sampler_total_variation(toy, proc, fn, cfg, num_samples=8000)
  assert tv < 0.05, tv
  assert int(out.nfe) == 100
  wrong = oracle.make_oracle(toy, proc, probs=oracle.make_toy(7, num_levels=1).probs)
  tv_wrong, _ = oracle.sampler_total_variation(
      toy, proc, lambda *a, heads, **k: wrong(*a, heads=('token',), **k), cfg, num_samples=2000)
  assert tv_wrong > 0.1, tv_wrong


def test_anchor_rule():
  tokens = np.array([[7, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 0, 0]])
  real = np.ones_like(tokens, bool)
  real[0, -2:] = False  # padding: neither counted nor an anchor
  got = adlm.anchor_mask(tokens, real, 5)
  np.testing.assert_array_equal(got[0], [1] * 6 + [0] * 6 + [0, 0])
  np.testing.assert_array_equal(adlm.anchor_mask(tokens, real, 1)[0], [1] + [0] * 13)
  toy = _toy()
  np.testing.assert_array_equal(adlm.anchor_mask(toy.seqs, np.ones_like(toy.seqs, bool), TAU),
                                oracle.frequency_levels(toy.seqs, TAU, 2))
  batch = _proc().prepare_batch(dict(toy.batch(), levels=np.ones_like(toy.seqs)))
  assert np.all(batch['levels'] == 0)
  np.testing.assert_array_equal(batch['anchors'], oracle.frequency_levels(toy.seqs, TAU, 2))
  with pytest.raises(ValueError, match=r"batch\['anchors'\]"):
    _proc().loss(lambda *a, **k: None, toy.batch(), jax.random.key(0))


def test_gamma_ramp():
  cfg = config_lib.ADLMConfig(gamma=3e-3, ramp_steps=1000)
  got = [float(adlm.anchor_weight(cfg, jnp.int32(k))) for k in (0, 1, 2, 3, 4, 100)]
  np.testing.assert_allclose(got, [0.0, 1e-3, 2e-3, 3e-3, 3e-3, 3e-3], rtol=1e-6)
  assert float(adlm.anchor_weight(cfg, None)) == pytest.approx(3e-3)
  c = config_lib.defaults()
  c.process.kind, c.model.num_levels, c.train.num_steps = 'adlm', 1, 777
  c.data.kind, c.schedule.offsets = 'text', (0.0,)
  view = config_lib.ADLMConfig._view(config_lib.resolve(c))  # pylint: disable=protected-access
  assert view.ramp_steps == 777
  c.model.num_levels = 2
  with pytest.raises(ValueError, match='model.num_levels=1'):
    config_lib.resolve(c)


def test_adlm_text_trains_evaluates_and_samples(tmp_path, jax_cache):
  """configs/adlm_text.py, shrunk, through `hmdlm_jax.main`: 4 finite steps, a finite bound."""
  from tests import test_trained  # pylint: disable=g-import-not-at-top
  with open(test_trained.ASSET, encoding='utf-8') as f:
    lines = [line.strip() for line in f if line.strip()]
  (tmp_path / 'train.txt').write_text('\n'.join(lines[160:200]) + '\n', encoding='utf-8')
  (tmp_path / 'test.txt').write_text('\n'.join(lines[:6]) + '\n', encoding='utf-8')
  workdir = str(tmp_path / 'run')
  proc = run_cmd(test_trained._main(  # pylint: disable=protected-access
      '--config=configs/adlm_text.py', f'--workdir={workdir}', *test_trained.TINY,
      f'--config.data.train_path={tmp_path / "train.txt"}',
      f'--config.data.test_path={tmp_path / "test.txt"}'), jax_cache, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  recs = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  train = [r for r in recs if r['split'] == 'train']
  assert train and all(np.isfinite(r['loss']) and r['anchor_rate'] > 0.5 for r in train)
  evals = [r['perplexity/bound_nats_per_token'] for r in recs if r['split'] == 'eval']
  assert evals and all(np.isfinite(evals)), recs
