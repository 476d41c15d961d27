"""Tests of hmdlm_jax/processes/hmdlm_sampler.py: given positions, greedy and temperature,
confidence ordering, cache and call counts, configuration (docs/method.md §7, §10). The sampler's
laws (it samples the data law of an exact oracle; reveal times follow the schedules) are in
tests/test_sampling_laws.py, the shared models and checks in tests/sampler_helpers.py.

References: the exact oracle of tests/oracle.py, a numpy re-implementation of the confidence rule,
and exact call counts from the reveal steps.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.configs import base as base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm_sampler
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle
from tests import sampler_helpers as sh

# ---------------------------------------------------------------------------------------------
# Given positions, greedy, temperature.


@pytest.mark.parametrize('ordering', ['ancestral', 'confidence'])
def test_given_positions_are_never_changed(ordering):
  toy = oracle.make_toy(0)
  rng = np.random.default_rng(3)
  bsz, steps = 64, 30
  given = rng.random((bsz, 3)) < 0.4
  gtok = rng.integers(0, 3, (bsz, 3))
  glev = rng.integers(0, 2, (bsz, 3))
  cfg = sh.sample_cfg(num_steps=steps, num_levels=2, mask_id=toy.mask_id, ordering=ordering)
  out = sh.run_sampler(sh.toy_oracle(toy, sh.POWER, memo=False), jax.random.key(9), sh.POWER, cfg,
                       batch_size=bsz, seq_len=3, given_tokens=gtok, given_levels=glev,
                       given_mask=given)
  np.testing.assert_array_equal(out.tokens[given], gtok[given])
  np.testing.assert_array_equal(out.levels[given], glev[given])
  assert np.all(out.reveal_step[given] == steps + 1)
  assert np.all((out.reveal_step[~given] >= 1) & (out.reveal_step[~given] <= steps))
  assert not np.any(out.tokens == toy.mask_id) and np.all(out.levels < 2)


def _permuted_logits(rng, bsz, seq_len, vocab):
  """Token logits whose values at each position are a permutation of 0..V-1 (gaps of 1)."""
  return np.stack([np.stack([rng.permutation(vocab).astype(float) for _ in range(seq_len)])
                   for _ in range(bsz)])


@pytest.mark.parametrize('num_levels', [1, 2])
def test_greedy_takes_the_argmax(num_levels):
  bsz, seq_len, vocab = 200, 6, 6  # real tokens 0..4, MASK = 5
  rng = np.random.default_rng(4)
  tok = _permuted_logits(rng, bsz, seq_len, vocab)
  model = sh.const_model(rng.normal(size=(bsz, seq_len, num_levels)), tok)
  schedule = sh.LOGLINEAR if num_levels == 2 else sh.MDLM
  best = np.argmax(np.where(np.arange(vocab) == 5, -np.inf, tok), -1)
  cfg = sh.sample_cfg(num_steps=16, num_levels=num_levels, mask_id=5, greedy=True)
  steps = []
  for key in (10, 11):
    out = sh.run_sampler(model, jax.random.key(key), schedule, cfg, batch_size=bsz, seq_len=seq_len)
    np.testing.assert_array_equal(out.tokens, best)
    steps.append(out.reveal_step)
  assert not np.array_equal(*steps)  # the reveal order is still random; the tokens are not


def test_temperature_scales_the_token_distribution():
  """P(draw != argmax) = 1 - max softmax(logits / τ); τ -> 0 approaches greedy."""
  bsz, seq_len, vocab = 200, 6, 6
  rng = np.random.default_rng(5)
  tok = _permuted_logits(rng, bsz, seq_len, vocab)
  model = sh.const_model(rng.normal(size=(bsz, seq_len, 2)), tok)
  logits = np.where(np.arange(vocab) == 5, -np.inf, tok)
  best = np.argmax(logits, -1)
  for tau in (0.3, 0.02):
    cfg = sh.sample_cfg(num_steps=16, num_levels=2, mask_id=5, temperature=tau)
    out = sh.run_sampler(model, jax.random.key(12), sh.LOGLINEAR, cfg, batch_size=bsz,
                         seq_len=seq_len)
    p = np.exp(logits / tau - np.logaddexp.reduce(logits / tau, axis=-1, keepdims=True))
    expected = float(np.mean(1.0 - p.max(-1)))
    observed = float(np.mean(out.tokens != best))
    sh.assert_fraction(observed, expected, bsz * seq_len, f'non-argmax share at τ={tau}')
    if tau == 0.02:  # P(non-argmax) ≈ 4 e^-50 per position
      assert observed == 0.0


def test_confidence_greedy_is_deterministic():
  toy = oracle.make_toy(0)
  cfg = sh.sample_cfg(num_steps=3, num_levels=2, mask_id=toy.mask_id, ordering='confidence',
                      greedy=True)
  denoiser = sh.toy_oracle(toy, sh.LOGLINEAR, memo=False)
  outs = [sh.run_sampler(denoiser, jax.random.key(k), sh.LOGLINEAR, cfg, batch_size=4, seq_len=3)
          for k in (0, 1, 2)]
  for o in outs[1:]:
    for a, b in zip(o, outs[0]):
      np.testing.assert_array_equal(a, b)
  # ...while the ancestral sampler at the same settings is random.
  cfg = sh.sample_cfg(num_steps=3, num_levels=2, mask_id=toy.mask_id, greedy=True)
  anc = [sh.run_sampler(denoiser, jax.random.key(k), sh.LOGLINEAR, cfg, batch_size=64,
                        seq_len=3).reveal_step for k in (0, 1)]
  assert not np.array_equal(anc[0], anc[1])


@pytest.mark.parametrize('level_context', ['candidates', 'none'])
def test_confidence_level_context_seen_by_pass_2(level_context):
  """'candidates': pass 2 sees a level 0..K-1 at every masked position; 'none': it sees h_m
  there (Algorithm 1's context for positions outside R). Either way the revealed positions keep
  their candidate level, and the output is identical for a model that ignores levels."""
  k, v, l, steps = 3, 5, 6, 4
  seen = []

  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    out = {}
    pos = jnp.arange(l, dtype=jnp.float32)
    if 'hier' in heads:
      out['hier'] = jnp.broadcast_to(jnp.stack([pos, -pos, 0 * pos], -1), tokens.shape + (k,))
    if 'token' in heads:
      masked = tokens == v - 1
      jax.debug.callback(lambda m, h: seen.append((np.asarray(m), np.asarray(h))), masked, levels)
      out['token'] = jnp.broadcast_to(jnp.arange(v, dtype=jnp.float32) * pos[:, None],
                                      tokens.shape + (v,))
    return out

  cfg = sh.sample_cfg(num_steps=steps, num_levels=k, mask_id=v - 1, ordering='confidence',
                      greedy=True, level_context=level_context)
  out = hmdlm_sampler.sample(apply_fn, jax.random.key(0), sh.LOGLINEAR3, cfg, batch_size=2,
                             seq_len=l)
  assert seen
  for masked, levels in seen:
    if level_context == 'none':
      assert np.all(levels[masked] == k)
    else:
      assert np.all(levels[masked] < k)
  assert np.all(np.asarray(out.levels) < k) and np.all(np.asarray(out.tokens) != v - 1)
  ref = hmdlm_sampler.sample(apply_fn, jax.random.key(0), sh.LOGLINEAR3,
                        dataclasses.replace(cfg, level_context='candidates'), batch_size=2,
                        seq_len=l)
  for a, b in zip(out[:3], ref[:3]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # 'none' runs both heads in ONE call per step (pass 2's inputs are pass 1's); 'candidates'
  # makes two calls at every step (each step here reveals something).
  reveal = np.asarray(out.reveal_step)
  work_steps = np.unique(reveal[reveal <= steps]).size
  assert int(out.nfe) == work_steps * (1 if level_context == 'none' else 2)


def test_level_context_is_a_confidence_ordering_knob_only():
  """Algorithm 2 (ancestral) shows the drawn levels to pass 2 whatever `level_context` says: with
  a token head that reads the levels, both settings give identical samples."""
  k, v, l = 2, 5, 6

  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    out = {}
    if 'hier' in heads:
      out['hier'] = jnp.zeros(tokens.shape + (k,))
    if 'token' in heads:
      out['token'] = 3.0 * jax.nn.one_hot(levels % (v - 1), v)  # the level picks the token
    return out

  outs = [hmdlm_sampler.sample(apply_fn, jax.random.key(3), sh.LOGLINEAR,
                          sh.sample_cfg(num_steps=4, num_levels=k, mask_id=v - 1, level_context=lc),
                          batch_size=8, seq_len=l) for lc in ('candidates', 'none')]
  for a, b in zip(outs[0], outs[1]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # ...and the tokens follow the drawn levels (the context pass 2 saw).
  out = outs[0]
  assert np.mean(np.asarray(out.tokens) == np.asarray(out.levels) % (v - 1)) > 0.5


# ---------------------------------------------------------------------------------------------
# Network evaluations and the cache.


def _expected_calls(reveal_step: np.ndarray, steps: int, *, reuse_pass1: bool,
                    num_levels: int) -> int:
  """Calls the cached sampler makes, from the reveal steps of the non-given positions.

  pass 2 runs at the steps that reveal something (set S); pass 1 runs at the steps that start with
  a masked position, and, when reusing, only at n = T or right after a step in S.
  """
  r = reveal_step[reveal_step <= steps]
  s_set = set(r.tolist())
  calls = len(s_set)
  if num_levels > 1:
    for n in range(steps, 0, -1):
      if np.any(r <= n) and (not reuse_pass1 or n == steps or (n + 1) in s_set):
        calls += 1
  return calls


@pytest.mark.parametrize('ordering,variant', [('ancestral', 'two_pass'),
                                              ('confidence', 'single_pass')])
def test_nfe_counts_and_cache_equivalence(ordering, variant):
  bsz, seq_len, steps, vocab = 2, 4, 40, 5
  given = np.zeros((bsz, seq_len), bool)
  given[0, 0] = True
  kw = dict(batch_size=bsz, seq_len=seq_len, given_tokens=np.zeros((bsz, seq_len), int),
            given_levels=np.ones((bsz, seq_len), int), given_mask=given)
  base_cfg = dict(num_steps=steps, num_levels=2, mask_id=vocab - 1, ordering=ordering,
                  variant=variant)
  key = jax.random.key(13)
  counter = [0]
  ref = sh.run_sampler(sh.hash_model(2, vocab, counter), key, sh.LOGLINEAR,
                       sh.sample_cfg(use_cache=False, **base_cfg), **kw)
  assert int(ref.nfe) == 2 * steps and counter[0] == 2 * steps
  for time_cond in (False, True):
    counter[0] = 0
    cfg = sh.sample_cfg(use_cache=True, time_conditioning=time_cond, **base_cfg)
    out = sh.run_sampler(sh.hash_model(2, vocab, counter), key, sh.LOGLINEAR, cfg, **kw)
    for a, b in zip(out[:3], ref[:3]):  # same samples: skipped calls were unused or unchanged
      np.testing.assert_array_equal(a, b)
    expected = _expected_calls(out.reveal_step, steps, reuse_pass1=not time_cond, num_levels=2)
    assert int(out.nfe) == expected == counter[0]
    assert expected < 2 * steps


def test_nfe_counts_mdlm():
  bsz, seq_len, steps, vocab = 2, 4, 40, 5
  key = jax.random.key(14)
  counter = [0]
  base_cfg = dict(num_steps=steps, num_levels=1, mask_id=vocab - 1)
  ref = sh.run_sampler(sh.hash_model(1, vocab, counter), key, sh.MDLM,
                       sh.sample_cfg(use_cache=False, **base_cfg), batch_size=bsz, seq_len=seq_len)
  assert int(ref.nfe) == steps and counter[0] == steps
  counter[0] = 0
  out = sh.run_sampler(sh.hash_model(1, vocab, counter), key, sh.MDLM,
                       sh.sample_cfg(use_cache=True, **base_cfg), batch_size=bsz, seq_len=seq_len)
  for a, b in zip(out[:3], ref[:3]):
    np.testing.assert_array_equal(a, b)
  expected = len(set(out.reveal_step.ravel().tolist()))
  assert int(out.nfe) == expected == counter[0] and expected < steps


def test_stale_cache_would_be_detected():
  """If the pass-1 cache were reused after a change, a model that reads (x, h) would notice.

  Guard for the equivalence test above: the hash model's hierarchy logits do change after every
  reveal, so equal outputs are not an accident of a constant model.
  """
  model = sh.hash_model(2, 5)
  x = jnp.full((1, 4), 4)
  h = jnp.full((1, 4), 2)
  a = model(x, h, jnp.ones(1), heads=('hier',))['hier']
  b = model(x.at[0, 1].set(2), h.at[0, 1].set(0), jnp.ones(1), heads=('hier',))['hier']
  assert not np.allclose(a, b)


# ---------------------------------------------------------------------------------------------
# Confidence ordering.


def _reference_confidence(hier, tok, schedule, steps, mask_id, given, prior_levels, weight=1.0):
  """numpy float64 replica of the confidence rule for a model that ignores its inputs."""
  bsz, seq_len, num_levels = hier.shape
  log_g = hier - np.logaddexp.reduce(hier, axis=-1, keepdims=True)
  logits = np.where(np.arange(tok.shape[-1]) == mask_id, -np.inf, tok)
  log_f = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  conf, best = log_f.max(-1), log_f.argmax(-1)
  masked = ~given.copy()
  reveal = np.where(given, steps + 1, 0)
  levels = np.where(given, prior_levels, num_levels)
  counts = np.zeros((steps + 1, bsz), int)
  for n in range(steps, 0, -1):
    t, s = n / steps, (n - 1) / steps
    g = np.exp(log_g)
    if n == 1:
      active = schedule.one_minus_alpha(t, np) > 0
      allowed = active if active.any() else np.ones_like(active)
      w = g * allowed
      w /= w.sum(-1, keepdims=True)
    else:
      w = g * schedule.reveal_prob(s, t, np)
    pi = np.where(masked, w.sum(-1), 0.0)
    cand = w.argmax(-1)
    eligible = masked & (pi > 0)
    for b in range(bsz):
      c = masked[b].sum() if n == 1 else max(int(np.round(pi[b].sum())), 1)
      c = min(c, eligible[b].sum())
      with np.errstate(divide='ignore', invalid='ignore'):
        score = np.where(eligible[b], weight * np.log(pi[b]) + conf[b], -np.inf)
      chosen = np.argsort(-score, kind='stable')[:c]
      reveal[b, chosen] = n
      levels[b, chosen] = cand[b, chosen]
      masked[b, chosen] = False
      counts[n, b] = c
  return reveal, levels, best, counts


@pytest.mark.parametrize('num_levels,weight', [(1, 1.0), (2, 1.0), (2, 0.3), (2, 0.0)])
def test_confidence_ordering_matches_reference(num_levels, weight):
  bsz, seq_len, vocab = 6, 12, 7
  steps = seq_len
  rng = np.random.default_rng(5 + num_levels)
  hier = rng.normal(size=(bsz, seq_len, num_levels)) * 2
  tok = rng.normal(size=(bsz, seq_len, vocab)) * 2
  given = rng.random((bsz, seq_len)) < 0.25
  glev = np.full((bsz, seq_len), num_levels - 1)
  gtok = np.argmax(np.where(np.arange(vocab) == vocab - 1, -np.inf, tok), -1)
  schedule = sh.LOGLINEAR if num_levels == 2 else sh.MDLM
  cfg = sh.sample_cfg(num_steps=steps, num_levels=num_levels, mask_id=vocab - 1,
                      ordering='confidence', greedy=True, hierarchy_weight=weight)
  run = lambda c: sh.run_sampler(sh.const_model(hier, tok), jax.random.key(15), schedule, c,
                                 batch_size=bsz, seq_len=seq_len, given_tokens=gtok,
                                 given_levels=glev, given_mask=given)
  out = run(cfg)
  reveal, levels, best, counts = _reference_confidence(hier, tok, schedule, steps, vocab - 1,
                                                       given, glev, weight)
  for n in range(1, steps + 1):  # the planned count per step
    np.testing.assert_array_equal((out.reveal_step == n).sum(-1), counts[n], err_msg=f'n={n}')
  np.testing.assert_array_equal(out.reveal_step, reveal)
  np.testing.assert_array_equal(out.levels, levels)
  np.testing.assert_array_equal(out.tokens, np.where(given, gtok, best))
  if num_levels == 1 or weight == 0:  # pure token confidence: by confidence
    logits = np.where(np.arange(vocab) == vocab - 1, -np.inf, tok)
    conf = np.max(logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True), -1)  # log max f
    for b in range(bsz):
      free = ~given[b]
      order = np.lexsort((-conf[b][free], -out.reveal_step[b][free]))  # by step, then conf
      assert np.all(np.diff(conf[b][free][order]) <= 0)


def _chain_model(num_levels: int, num_tokens: int) -> Callable[..., dict]:
  """A puzzle with a deterministic answer x_i = x_0 + i (mod V): position i is predictable only
  from a revealed neighbour (logit +8 on the implied token); otherwise its logits are flat."""
  mask_id = num_tokens

  def fn(tokens, levels, t, *, heads, token_levels=None):
    bsz, seq_len = tokens.shape
    left = jnp.concatenate([jnp.full((bsz, 1), mask_id), tokens[:, :-1]], axis=1)
    right = jnp.concatenate([tokens[:, 1:], jnp.full((bsz, 1), mask_id)], axis=1)
    v = jnp.arange(num_tokens + 1)
    from_left = (left[..., None] != mask_id) & (v == (left[..., None] + 1) % num_tokens)
    from_right = (right[..., None] != mask_id) & (v == (right[..., None] - 1) % num_tokens)
    out = {}
    if 'hier' in heads:
      out['hier'] = jnp.zeros((bsz, seq_len, num_levels))
    if 'token' in heads:
      out['token'] = 8.0 * (from_left | from_right).astype(jnp.float32)
    return out

  return fn


@pytest.mark.parametrize('num_levels', [1, 2])
def test_confidence_ordering_solves_a_deterministic_puzzle(num_levels):
  num_tokens, seq_len, steps, bsz = 5, 6, 10, 32
  schedule = sh.LOGLINEAR if num_levels == 2 else sh.MDLM
  clue = np.arange(bsz) % num_tokens
  answer = (clue[:, None] + np.arange(seq_len)) % num_tokens
  given = np.zeros((bsz, seq_len), bool)
  given[:, 0] = True
  kw = dict(batch_size=bsz, seq_len=seq_len, given_tokens=answer,
            given_levels=np.full((bsz, seq_len), num_levels - 1), given_mask=given)
  model = _chain_model(num_levels, num_tokens)
  cfg = sh.sample_cfg(num_steps=steps, num_levels=num_levels, mask_id=num_tokens,
                      ordering='confidence', greedy=True)
  for key in (16, 17):
    out = sh.run_sampler(model, jax.random.key(key), schedule, cfg, **kw)
    np.testing.assert_array_equal(out.tokens, answer)
    # One cell per step, along the chain (reveal steps strictly decreasing with the position).
    assert np.all(np.diff(out.reveal_step, axis=1) < 0)
  # The ancestral order (random) mostly fails on the same puzzle: the check has teeth.
  cfg = sh.sample_cfg(num_steps=steps, num_levels=num_levels, mask_id=num_tokens, greedy=True)
  out = sh.run_sampler(model, jax.random.key(18), schedule, cfg, **kw)
  assert np.mean(np.all(out.tokens == answer, axis=1)) < 0.5


# ---------------------------------------------------------------------------------------------
# Configuration, validation, jitting.


def test_sample_config_from_config():
  c = base_config.get_base_config()
  cfg = config_lib.SampleConfig.from_config(config_lib.resolve(c))
  assert cfg == config_lib.SampleConfig(
      num_steps=128, num_levels=2, mask_id=c.model.vocab_size - 1, temperature=1.0, greedy=False,
      ordering='ancestral', use_cache=True, prior_corrected=True, variant='two_pass',
      time_conditioning=False)
  hash(cfg)  # static jit argument
  c.model.mask_id = 7
  assert config_lib.SampleConfig.from_config(config_lib.resolve(c)).mask_id == 7


@pytest.mark.parametrize('section,field,value', [
    ('sample', 'ordering', 'random'), ('sample', 'temperature', 0.0),
    ('sample', 'temperature', -1.0), ('sample', 'num_steps', 0),
    ('sample', 'ordering', 'Confidence'), ('sample', 'level_context', 'gold'),
    ('sample', 'hierarchy_weight', -1.0),
    ('model', 'variant', 'three_pass'), ('model', 'num_levels', 0),
    ('model', 'mask_id', 10 ** 9)])
def test_sample_config_rejects_bad_values(section, field, value):
  c = base_config.get_base_config()
  with c.unlocked():
    c[section][field] = value
  with pytest.raises(ValueError, match=f'{section}.{field}|SampleConfig.{field}'):
    config_lib.resolve(c)


def test_sample_config_rejects_non_bool_flags():
  with pytest.raises(ValueError, match='greedy'):
    config_lib.SampleConfig(num_steps=4, num_levels=2, mask_id=3, greedy='yes')
  with pytest.raises(ValueError, match='time_conditioning'):
    config_lib.SampleConfig(num_steps=4, num_levels=2, mask_id=3, time_conditioning=1)


def test_sample_rejects_inconsistent_arguments():
  model = sh.const_model(np.zeros((2, 3, 2)), np.zeros((2, 3, 4)))
  cfg = sh.sample_cfg(num_steps=4, num_levels=2, mask_id=3)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match='levels'):
    hmdlm_sampler.sample(model, key, sh.MDLM, cfg, batch_size=2, seq_len=3)
  with pytest.raises(ValueError, match='given_levels'):
    hmdlm_sampler.sample(model, key, sh.LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.zeros((2, 3), int), given_mask=np.ones((2, 3), bool))
  with pytest.raises(ValueError, match='given_mask'):
    hmdlm_sampler.sample(model, key, sh.LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.zeros((2, 3), int))
  with pytest.raises(ValueError, match='given_tokens must be real tokens'):
    hmdlm_sampler.sample(model, key, sh.LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.full((2, 3), 3), given_levels=np.zeros((2, 3), int),
                    given_mask=np.ones((2, 3), bool))
  with pytest.raises(ValueError, match='given_levels must lie in 0..1'):
    hmdlm_sampler.sample(model, key, sh.LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.zeros((2, 3), int), given_levels=np.full((2, 3), 2),
                    given_mask=np.ones((2, 3), bool))


def test_make_sampler_jits_with_params_as_argument():
  bsz, seq_len = 3, 5
  schedule = sh.LOGLINEAR
  cfg = sh.sample_cfg(num_steps=4, num_levels=2, mask_id=4, greedy=True)

  def builder(params):
    return sh.const_model(params['hier'], params['tok'])

  run = base.make_sampler(sh.process_of(schedule, cfg), builder, cfg, batch_size=bsz,
                          seq_len=seq_len)
  rng = np.random.default_rng(6)
  for _ in range(2):  # new params, same compiled function; greedy tokens = argmax of the params
    params = {'hier': jnp.asarray(rng.normal(size=(bsz, seq_len, 2)), jnp.float32),
              'tok': jnp.asarray(rng.normal(size=(bsz, seq_len, 5)), jnp.float32)}
    out = run(params, jax.random.key(1))
    np.testing.assert_array_equal(out.tokens, np.argmax(np.asarray(params['tok'])[..., :4], -1))
    assert np.all((out.reveal_step >= 1) & (out.reveal_step <= 4))
  assert run._cache_size() == 1


def test_make_sampler_checks_the_reveal_ordering():
  """Offsets decreasing in the level violate Appendix D on the grid: rejected unless 'off'."""
  bad = Schedule('loglinear', (0.25, 0.0))
  cfg = sh.sample_cfg(num_steps=10, num_levels=2, mask_id=4)
  with pytest.raises(ValueError, match='Appendix D'):
    base.make_sampler(sh.process_of(bad, cfg), lambda p: p, cfg, batch_size=1, seq_len=2)
  base.make_sampler(sh.process_of(bad, cfg, check_ordering='off'), lambda p: p, cfg, batch_size=1,
                    seq_len=2)


def test_nan_logits_are_reported():
  bsz, seq_len = 2, 3
  hier = np.zeros((bsz, seq_len, 2))
  hier[0, 1, 0] = np.nan
  cfg = sh.sample_cfg(num_steps=5, num_levels=2, mask_id=3, use_cache=False)
  out = sh.run_sampler(sh.const_model(hier, np.zeros((bsz, seq_len, 4))), jax.random.key(0),
                       sh.LOGLINEAR, cfg, batch_size=bsz, seq_len=seq_len)
  assert int(out.nan_calls) == 5  # every pass-1 call
  with pytest.raises(FloatingPointError, match='5 of 10 network calls returned NaN'):
    base.check_finite(out)
  ok = sh.run_sampler(sh.const_model(np.zeros_like(hier), np.zeros((bsz, seq_len, 4))),
                      jax.random.key(0), sh.LOGLINEAR, cfg, batch_size=bsz, seq_len=seq_len)
  assert base.check_finite(ok) is ok


def test_inverse_cdf_draw_frequencies_and_zero_mass_classes():
  p = np.array([0.0, 0.2, 0.0, 0.7, 0.1, 0.0])
  log_p = np.log(np.where(p > 0, p, 1.0)) + np.where(p > 0, 0.0, -np.inf)
  n = 100_000
  draws = np.asarray(base.categorical_icdf(  # pylint: disable=protected-access
      jax.random.key(0), jnp.broadcast_to(jnp.asarray(log_p, jnp.float32), (n, 6))))
  freq = np.bincount(draws, minlength=6) / n
  assert np.all(freq[p == 0] == 0)
  for k in np.flatnonzero(p):
    sh.assert_fraction(float(freq[k]), float(p[k]), n, f'class {k}')


def test_level_disagreement():
  drawn = np.array([[0, 1, 1], [1, 1, 0]])
  recomputed = np.array([[0, 0, 1], [1, 1, 1]])
  assert float(hmdlm_sampler.level_disagreement(drawn, recomputed)) == pytest.approx(2 / 6)
  where = np.array([[True, False, True], [True, True, False]])
  assert float(hmdlm_sampler.level_disagreement(drawn, recomputed, where)) == 0.0
