"""HMDLM losses (docs/method.md §5, §8): numpy re-derivations, MDLM reduction, normalisation, wiring."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import hmdlm_terms
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes.schedules import Schedule
from tests.config_helpers import resolved

V = 11  # vocabulary incl. MASK
MASK = V - 1
L = 12
B = 16


def make_net(seed: int, num_levels: int, width: int = 8):
  """A tiny deterministic 'network' whose logits depend on every input (tokens, levels, t,
  token_levels and the other positions): (params, apply(params, ...)) following the contract."""
  ks = jax.random.split(jax.random.key(seed), 8)
  params = dict(
      tok=jax.random.normal(ks[0], (V, width)),
      lvl=jax.random.normal(ks[1], (num_levels + 1, width)),
      own=jax.random.normal(ks[2], (num_levels + 1, width)),
      pos=jax.random.normal(ks[3], (L, width)),
      time=jax.random.normal(ks[4], (width,)), out_tok=jax.random.normal(ks[5], (width, V)),
      out_hier=jax.random.normal(ks[6], (width, num_levels)))

  def apply(params, tokens, levels, t, *, heads, token_levels=None):
    h = params['tok'][tokens] + params['lvl'][levels] + params['pos'] + t[:, None, None] * params[
        'time']
    h = jnp.tanh(h + h.mean(1, keepdims=True))
    out = {}
    if 'hier' in heads:
      out['hier'] = h @ params['out_hier']
    if 'token' in heads:
      ht = h if token_levels is None else h + params['own'][token_levels]
      out['token'] = ht @ params['out_tok']
    return out

  return params, apply


def make_batch(seed: int, num_levels: int, *, pad_from: int = 9, given_rate: float = 0.2):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, MASK, (B, L)).astype(np.int32)
  levels = rng.integers(0, num_levels, (B, L)).astype(np.int32)
  given = rng.random((B, L)) < given_rate
  pad = np.zeros((B, L), bool)
  pad[::2, pad_from:] = True  # every other example is padded: per-example counts differ
  levels[pad] = 0
  return dict(tokens=tokens, levels=levels, given=given, loss_mask=~given & ~pad)


def np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_schedule(params, t, eps=1e-3):
  """Log-linear offsets: (1 - α [B, K], λ' [B, K]) re-derived (eq. 103, 107)."""
  p = np.asarray(params)[None]
  t = np.asarray(t, np.float64)[:, None]
  om = (1 - eps) * np.clip((t - p) / (1 - p), 0, 1)
  haz = np.where(t > p, 1 / np.where(t > p, t - p, 1.0), 0.0)
  return om, haz


# ---- the three terms, re-derived in numpy ----------------------------------------------------


@pytest.mark.parametrize('offsets,prior_corrected', [
    ((0.0, 0.25), True), ((0.0, 0.25), False), ((0.0, 0.25, 0.5), True),
    ((0.0, 0.3125, 0.625), False)])
def test_terms_match_numpy(offsets, prior_corrected):
  # Offsets exactly representable in float32 (0.3 is not: t - 0.3f differs from t - 0.3 by 1e-8,
  # i.e. 1e-5 relative when t is 1e-3 above δ).
  k = len(offsets)
  sched = Schedule('loglinear', offsets)
  rng = np.random.default_rng(0)
  batch = make_batch(1, k)
  t = rng.uniform(1e-3, 1.0, B).astype(np.float32)
  masked = (rng.random((B, L)) < 0.6) & ~batch['given']
  # The forward process never masks a level that is inactive at t: respect that here.
  om, haz = np_schedule(offsets, t)
  masked &= np.take_along_axis(om, batch['levels'], 1) > 0
  tok_logits = rng.normal(size=(B, L, V)).astype(np.float32) * 3
  hier_logits = rng.normal(size=(B, L, k)).astype(np.float32) * 2
  xt = np.where(masked, MASK, batch['tokens'])

  logf = parameterization.token_log_probs(jnp.asarray(tok_logits), jnp.asarray(xt), mask_id=MASK)
  logg = parameterization.level_log_probs(jnp.asarray(hier_logits), jnp.asarray(t), sched,
                                          prior_corrected=prior_corrected)
  nll = -jnp.take_along_axis(logf, batch['tokens'][..., None], -1)[..., 0]
  got = hmdlm_terms.loss_terms(nll, logg, batch['levels'], masked, batch['loss_mask'],
                          sched.hazard(t))

  # numpy: SUBS (MASK logit -inf) and the prior-corrected level head, in float64.
  lt = tok_logits.astype(np.float64)
  lt[..., MASK] = -np.inf
  ref_logf = np_log_softmax(lt)
  lh = hier_logits.astype(np.float64)
  if prior_corrected:
    with np.errstate(divide='ignore'):
      lh = lh + np.log(om)[:, None, :]
  g = np.exp(np_log_softmax(lh))
  sel = masked & batch['loss_mask']
  n = batch['loss_mask'].sum(1)
  ref = dict(lm=np.zeros(B), hier=np.zeros(B), cons=np.zeros(B))
  for b in range(B):
    for i in range(L):
      if not sel[b, i]:
        continue
      h0 = batch['levels'][b, i]
      ref['lm'][b] += haz[b, h0] * -ref_logf[b, i, batch['tokens'][b, i]]
      ref['hier'][b] += haz[b, h0] * -np.log(g[b, i, h0])
      ref['cons'][b] += (g[b, i] * haz[b]).sum() - haz[b, h0]
  for name in ref:
    assert got[name].shape == (B,)
    np.testing.assert_allclose(np.asarray(got[name], np.float64), ref[name] / n, rtol=1e-6,
                               atol=1e-6, err_msg=name)


def test_token_log_probs_subs():
  rng = np.random.default_rng(3)
  logits = jnp.asarray(rng.normal(size=(2, 5, V)), jnp.bfloat16)
  xt = jnp.asarray([[MASK, 1, 2, MASK, 4], [0, MASK, MASK, 3, MASK]])
  logf = parameterization.token_log_probs(logits, xt, mask_id=MASK)
  assert logf.dtype == jnp.float32
  f = np.exp(np.asarray(logf))
  np.testing.assert_allclose(f.sum(-1), 1, rtol=1e-6)
  assert np.all(f[..., MASK] == 0)
  revealed = np.asarray(xt) != MASK
  np.testing.assert_array_equal(f[revealed], np.eye(V)[np.asarray(xt)[revealed]])


def test_token_nll_equals_subs_at_masked_positions():
  """The fused NLL (value and gradient) equals -log f[x0] of the SUBS distribution wherever the
  loss reads it (masked positions), re-derived in numpy float64; bf16 logits give float32."""
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(3, 7, V)) * 3
  tokens = rng.integers(0, MASK, size=(3, 7))
  got = parameterization.token_nll(jnp.asarray(logits, jnp.float32), jnp.asarray(tokens),
                                   mask_id=MASK)
  z = np.delete(logits, MASK, axis=-1)  # the MASK column carries no mass
  lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
  ref = lse - np.take_along_axis(logits, tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=1e-5, atol=1e-5)
  xt = jnp.full(tokens.shape, MASK)
  subs = lambda lg: -jnp.take_along_axis(parameterization.token_log_probs(lg, xt, mask_id=MASK),
                                         jnp.asarray(tokens)[..., None], -1)[..., 0].sum()
  fused = lambda lg: parameterization.token_nll(lg, jnp.asarray(tokens), mask_id=MASK).sum()
  g_subs = jax.grad(subs)(jnp.asarray(logits, jnp.float32))
  g_fused = jax.grad(fused)(jnp.asarray(logits, jnp.float32))
  np.testing.assert_allclose(np.asarray(g_fused), np.asarray(g_subs), atol=1e-6)
  assert np.all(np.asarray(g_fused)[..., MASK] == 0)
  assert parameterization.token_nll(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(tokens),
                                    mask_id=MASK).dtype == jnp.float32
  with pytest.raises(ValueError, match='mask_id=11'):
    parameterization.token_nll(jnp.asarray(logits), jnp.asarray(tokens), mask_id=V)


def test_level_log_probs_guards():
  sched = Schedule('loglinear', (0.3, 0.6))  # at t <= 0.3 no level is active
  logits = jnp.zeros((3, 2, 2))
  t = jnp.asarray([0.2, 0.45, 0.9])
  g = np.exp(np.asarray(parameterization.level_log_probs(logits, t, sched, prior_corrected=True)))
  assert np.all(np.isfinite(g))
  np.testing.assert_allclose(g[0], 0.5)  # nothing active: the plain head (never used)
  np.testing.assert_allclose(g[1], [[1, 0]] * 2)  # only level 0 active
  om = np.asarray(sched.one_minus_alpha(t[2]))
  np.testing.assert_allclose(g[2], [om / om.sum()] * 2, rtol=1e-6)
  grad = jax.grad(lambda x: parameterization.level_log_probs(x, t, sched, prior_corrected=True)[
      :, :, 0].sum())(logits)
  assert np.all(np.isfinite(np.asarray(grad)))
  one = parameterization.level_log_probs(jnp.ones((3, 2, 1)), t, Schedule('loglinear', (0.0,)),
                                         prior_corrected=True)
  np.testing.assert_array_equal(np.asarray(one), 0.0)


def test_normalised_by_loss_positions_not_masked_count():
  k = 2
  lv = np.zeros((1, 8), np.int32)
  loss_mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0]], bool)  # 6 loss positions, 2 padding
  masked = np.array([[1, 1, 0, 0, 0, 0, 1, 1]], bool)  # 2 masked loss positions + padding
  nll = np.array([[1.0, 3.0, 5.0, 5.0, 5.0, 5.0, 100.0, np.inf]], np.float32)
  logg = np.log(np.full((1, 8, k), 0.5, np.float32))
  hazard = np.array([[2.0, 4.0]], np.float32)
  got = hmdlm_terms.loss_terms(nll, logg, lv, masked, loss_mask, hazard)
  np.testing.assert_allclose(float(got['lm'][0]), 2.0 * (1 + 3) / 6, rtol=1e-6)
  np.testing.assert_allclose(float(got['hier'][0]), 2.0 * 2 * np.log(2) / 6, rtol=1e-6)
  np.testing.assert_allclose(float(got['cons'][0]), 2 * (3.0 - 2.0) / 6, rtol=1e-6)
  # No loss positions at all: zeros, not NaN.
  got = hmdlm_terms.loss_terms(nll, logg, lv, masked, np.zeros_like(loss_mask), hazard)
  assert all(float(v[0]) == 0.0 for v in got.values())


# ---- K = 1 is MDLM --------------------------------------------------------------------------


def mdlm_reference(logits_fn, batch, key, t_min, eps=1e-3):
  """An independent MDLM loss: log-linear noise σ(t) = -log(1 - (1-ε)t), weight dσ/expm1(σ),
  SUBS, sum over masked loss tokens / number of loss tokens in the batch (MDLM's token mean).
  Uses the same random draws as the library (documented key split) to compare exactly."""
  k_t, k_mask, _ = jax.random.split(key, 3)
  t = np.asarray(base.sample_times(k_t, B, t_min=t_min), np.float64)
  move = (1 - eps) * t
  u = np.asarray(jax.random.uniform(k_mask, (B, L), jnp.float32), np.float64)
  masked = (u < move[:, None].astype(np.float32)) & ~batch['given']
  xt = np.where(masked, MASK, batch['tokens'])
  logits = np.asarray(logits_fn(xt, t.astype(np.float32)), np.float64)
  logits[..., MASK] = -np.inf
  logp = np_log_softmax(logits)
  sigma = -np.log1p(-move)
  dsigma = (1 - eps) / (1 - move)
  w = dsigma / np.expm1(sigma)
  nll = -np.take_along_axis(logp, batch['tokens'][..., None], -1)[..., 0]
  per_tok = np.where(masked & batch['loss_mask'], w[:, None] * nll, 0.0)
  return per_tok.sum() / batch['loss_mask'].sum(), t, masked, xt


def test_k1_equals_mdlm():
  params, net = make_net(0, 1)
  apply_fn = functools.partial(net, params)
  sched = Schedule('loglinear', (0.0,))
  batch = make_batch(2, 1)
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=1, t_min=1e-3)
  loss_fns = {v: jax.jit(functools.partial(
      hmdlm.diffusion_loss, apply_fn, schedule=sched,
      cfg=config_lib.LossConfig(mask_id=MASK, num_levels=1, t_min=1e-3, variant=v)))
      for v in config_lib.VARIANTS}  # the variant is irrelevant for K = 1
  process = hmdlm.HMDLM(sched, cfg)
  bound_fn = jax.jit(functools.partial(process.bound, apply_fn))

  @jax.jit
  def app_e_fn(batch, key, t):
    state = process.corrupt(key, batch, t)
    return process.estimates_from_state(apply_fn, batch, state, t)['appendix_e']
  for seed in range(2):
    key = jax.random.key(seed)
    ref, t, masked, xt = mdlm_reference(
        lambda x, tt: net(params, jnp.asarray(x), jnp.where(jnp.asarray(x) == MASK, 1, 0),
                          jnp.asarray(tt), heads=('token',))['token'], batch, key, 1e-3)
    assert masked.sum() > 10
    for fn in loss_fns.values():
      loss, metrics = fn(batch, key)
      np.testing.assert_allclose(float(loss), ref, rtol=1e-6)
      assert float(metrics['hier']) == 0.0 and float(metrics['cons']) == 0.0
    # The bound and Appendix E's estimate are MDLM's NELBO at the same (t, x_t).
    k_mask, _ = jax.random.split(key)
    t32 = jnp.asarray(t, jnp.float32)
    bound = bound_fn(batch, key, t32)
    _, _, masked_b = hmdlm.corrupt(k_mask, batch['tokens'], batch['levels'], batch['given'],
                                        t32, sched, mask_id=MASK)
    app_e = app_e_fn(batch, k_mask, t32)
    n = batch['loss_mask'].sum(1)
    tot = (np.asarray(bound['total']) * n).sum() / n.sum()
    np.testing.assert_allclose(np.asarray(app_e), np.asarray(bound['total']), rtol=1e-6)
    # Same t but fresh masks: compare with MDLM evaluated on this hmdlm.
    logits = np.asarray(net(params, jnp.where(masked_b, MASK, batch['tokens']),
                            jnp.where(masked_b, 1, 0), jnp.asarray(t, jnp.float32),
                            heads=('token',))['token'], np.float64)
    logits[..., MASK] = -np.inf
    nll = -np.take_along_axis(np_log_softmax(logits), batch['tokens'][..., None], -1)[..., 0]
    sel = np.asarray(masked_b) & batch['loss_mask']
    mdlm = np.where(sel, nll / t[:, None], 0).sum() / n.sum()
    np.testing.assert_allclose(tot, mdlm, rtol=1e-6)


# ---- the full loss: wiring of the passes, metrics, NaN handling ------------------------------


class Spy:
  """Records every apply_fn call (run un-jitted)."""

  def __init__(self, fn):
    self.fn, self.calls = fn, []

  def __call__(self, tokens, levels, t, *, heads, token_levels=None):
    self.calls.append(dict(tokens=np.asarray(tokens), levels=np.asarray(levels), heads=heads,
                           token_levels=None if token_levels is None else np.asarray(
                               token_levels)))
    return self.fn(tokens, levels, t, heads=heads, token_levels=token_levels)


@pytest.mark.parametrize('variant', config_lib.VARIANTS)
def test_pass_contexts(variant):
  k = 2
  params, net = make_net(1, k)
  spy = Spy(functools.partial(net, params))
  batch = make_batch(3, k)
  sched = Schedule('loglinear', (0.0, 0.25))
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=k, variant=variant, train_steps_T=4)
  hmdlm.diffusion_loss(spy, batch, jax.random.key(0), sched, cfg)
  k_t, k_mask, k_rev = jax.random.split(jax.random.key(0), 3)
  t = base.sample_times(k_t, B)
  xt, ht, masked = map(np.asarray, hmdlm.corrupt(
      k_mask, batch['tokens'], batch['levels'], batch['given'], t, sched, mask_id=MASK))
  if variant == 'two_pass':
    assert [c['heads'] for c in spy.calls] == [('hier',), ('token',)]
    np.testing.assert_array_equal(spy.calls[0]['tokens'], xt)
    np.testing.assert_array_equal(spy.calls[0]['levels'], ht)  # pass 1: h_t
    hs = spy.calls[1]['levels']  # pass 2: gold level on R, h_m on the other masked positions
    np.testing.assert_array_equal(hs[~masked], batch['levels'][~masked])
    in_r = masked & (hs != k)
    np.testing.assert_array_equal(hs[in_r], batch['levels'][in_r])
    assert 0 < in_r.sum() < masked.sum()  # with T_train = 4 a visible share joins R
    assert spy.calls[1]['token_levels'] is None
  else:
    assert [c['heads'] for c in spy.calls] == [('hier', 'token')]
    np.testing.assert_array_equal(spy.calls[0]['levels'], ht)
    np.testing.assert_array_equal(spy.calls[0]['token_levels'], batch['levels'])


def test_bound_two_pass_shows_one_gold_level():
  k = 2
  params, net = make_net(1, k)
  spy = Spy(functools.partial(net, params))
  batch = make_batch(4, k)
  sched = Schedule('loglinear', (0.0, 0.25))
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=k, variant='two_pass')
  t = jnp.full((B,), 0.7)
  out = hmdlm.HMDLM(sched, cfg).bound(spy, batch, jax.random.key(1), t)
  assert set(out) == {'lm', 'hier', 'cons', 'total', 'num_tokens'}
  ht, hs = spy.calls[0]['levels'], spy.calls[1]['levels']
  masked = spy.calls[0]['tokens'] == MASK
  shown = masked & (hs != k)
  n_sel = (masked & batch['loss_mask']).sum(1)
  np.testing.assert_array_equal(shown.sum(1), np.minimum(n_sel, 1))
  assert np.all((shown & ~batch['loss_mask']) == 0)
  np.testing.assert_array_equal(hs[shown], batch['levels'][shown])
  np.testing.assert_array_equal(hs[~shown], ht[~shown])
  # Its token term is weighted by the number of masked loss positions.
  logits = np.asarray(net(params, spy.calls[1]['tokens'], hs, t, heads=('token',))['token'],
                      np.float64)
  logits[..., MASK] = -np.inf
  nll = -np.take_along_axis(np_log_softmax(logits), batch['tokens'][..., None], -1)[..., 0]
  _, haz = np_schedule((0.0, 0.25), np.asarray(t))
  lam0 = np.take_along_axis(haz, batch['levels'], 1)
  ref = np.where(shown, lam0 * nll, 0).sum(1) * n_sel / batch['loss_mask'].sum(1)
  np.testing.assert_allclose(np.asarray(out['lm']), ref, rtol=1e-5)


def test_metrics_and_betas():
  k = 2
  params, net = make_net(2, k)
  batch = make_batch(5, k)
  sched = Schedule('loglinear', (0.0, 0.25))
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=k, beta_hier=0.5, beta_cons=2.0)
  loss, m = jax.jit(functools.partial(hmdlm.diffusion_loss, functools.partial(net, params),
                                      schedule=sched, cfg=cfg))(batch, jax.random.key(3))
  for name in ('loss', 'lm', 'hier', 'cons', 'nelbo', 'token_nll', 'level_acc', 'mask_rate',
               'num_loss_tokens', 'finite'):
    assert m[name].shape == () and m[name].dtype == jnp.float32, name
  np.testing.assert_allclose(float(loss), float(m['lm'] + 0.5 * m['hier'] + 2.0 * m['cons']),
                             rtol=1e-6)
  np.testing.assert_allclose(float(m['nelbo']), float(m['lm'] + m['hier'] + m['cons']), rtol=1e-6)
  assert float(m['num_loss_tokens']) == batch['loss_mask'].sum()
  assert float(m['finite']) == 1.0 and 0 < float(m['mask_rate']) < 1
  # Gradients are finite (no 0 * inf leaking through the masking).
  grads = jax.jit(jax.grad(lambda p: hmdlm.diffusion_loss(
      functools.partial(net, p), batch, jax.random.key(3), sched, cfg)[0]))(params)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))


def test_nan_is_not_averaged_away():
  k = 2
  batch = make_batch(6, k)
  sched = Schedule('loglinear', (0.0, 0.25))
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=k)

  def bad(tokens, levels, t, *, heads, token_levels=None):
    out = {'hier': jnp.zeros(tokens.shape + (k,)),
           'token': jnp.zeros(tokens.shape + (V,)).at[0, :, 0].set(jnp.nan)}
    return {h: out[h] for h in heads}

  loss, m = hmdlm.diffusion_loss(bad, batch, jax.random.key(0), sched, cfg)
  assert np.isnan(float(loss)) and float(m['finite']) == 0.0
  with pytest.raises(FloatingPointError, match=r'lm=nan'):
    base.raise_if_nonfinite(m, where='step 7')


def test_loss_config_from_config():
  c = get_base_config()
  cfg = config_lib.LossConfig.from_config(resolved(c))
  assert cfg.mask_id == c.model.vocab_size - 1 and cfg.num_levels == 2
  assert cfg.variant == "two_pass" and cfg.prior_corrected
  assert cfg.train_steps_T == c.sample.num_steps  # loss.train_steps_T = 0: the sampling grid
  hash(cfg)
  c.model.variant = 'three_pass'
  with pytest.raises(ValueError, match='model.variant'):
    config_lib.LossConfig.from_config(resolved(c))
  c = get_base_config()
  c.model.mask_id = c.model.vocab_size
  with pytest.raises(ValueError, match='model.mask_id'):
    config_lib.LossConfig.from_config(resolved(c))
  c = get_base_config()
  c.loss.t_min = 1.0
  with pytest.raises(ValueError, match='loss.t_min'):
    config_lib.LossConfig.from_config(resolved(c))
  with pytest.raises(ValueError, match='model.num_levels'):
    hmdlm.diffusion_loss(lambda *a, **kw: {}, make_batch(0, 2), jax.random.key(0),
                          Schedule('loglinear', (0.0,)), config_lib.LossConfig(mask_id=MASK))
