"""Tests of hmdlm_jax/processes/hmdlm_sampler.py: Algorithm 2, MDLM (K = 1), confidence ordering,
cache (docs/method.md §7, §10).

References: the exact oracle of tests/oracle.py (the sampler must sample the data distribution),
closed forms of the reveal schedule (telescoping products of λ_k(s, t), numpy float64), a numpy
re-implementation of the confidence rule, and exact call counts from the reveal steps.
Statistical checks use 5 binomial standard errors unless stated.
"""

from __future__ import annotations

import dataclasses

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base as base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import hmdlm_sampler
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle

LOGLINEAR = Schedule('loglinear', (0.0, 0.25))
POWER = Schedule('power', (1.0, 2.0))
MDLM = Schedule('loglinear', (0.0,))
LOGLINEAR3 = Schedule('loglinear', (0.0, 0.1, 0.2))
NSE = 5.0  # tolerance in binomial standard errors


# ---------------------------------------------------------------------------------------------
# Helpers: models implementing the apply_fn contract.


def _toy_oracle(toy: oracle.Toy, schedule, probs=None, memo: bool = True) -> Callable[..., dict]:
  """The exact oracle of tests/oracle.py for HMDLM on `schedule` (memoised over all states)."""
  cfg = config_lib.LossConfig(mask_id=toy.mask_id, num_levels=toy.num_levels,
                              prior_corrected=False)
  fn = oracle.make_oracle(toy, hmdlm.HMDLM(schedule, cfg), probs=probs)
  if not memo:
    return fn
  return oracle.memoize(fn, vocab_size=toy.vocab_size, num_level_inputs=toy.num_levels + 1,
                        seq_len=toy.seq_len, num_levels=toy.num_levels)


def _const_model(hier_logits: np.ndarray | None, token_logits: np.ndarray) -> Callable[..., dict]:
  """A model that ignores its inputs: fixed hier logits [B, L, K] and token logits [B, L, V]."""

  def fn(tokens, levels, t, *, heads, token_levels=None):
    out = {}
    if 'hier' in heads:
      out['hier'] = jnp.asarray(hier_logits, jnp.float32)
    if 'token' in heads:
      out['token'] = jnp.asarray(token_logits, jnp.float32)
    return out

  return fn


def _hash_model(num_levels: int, vocab: int, counter: list[int] | None = None
                ) -> Callable[..., dict]:
  """A deterministic model whose outputs depend on (tokens, levels, token_levels) but not on t.

  `counter[0]` is incremented by a host callback at every call that actually executes.
  """

  def fn(tokens, levels, t, *, heads, token_levels=None):
    if counter is not None:
      jax.debug.callback(lambda: counter.__setitem__(0, counter[0] + 1))
    seq_len = tokens.shape[1]
    pos = jnp.arange(seq_len, dtype=jnp.float32)
    z = jnp.sum((0.37 * tokens + 1.3 * levels) * (pos + 1.0), axis=-1)  # [B]
    out = {}
    if 'hier' in heads:
      k = jnp.arange(num_levels, dtype=jnp.float32)
      out['hier'] = 2.0 * jnp.sin(z[:, None, None] + 0.7 * pos[None, :, None] + 1.9 * k)
    if 'token' in heads:
      own = 0.0 if token_levels is None else 0.5 * token_levels[..., None]
      v = jnp.arange(vocab, dtype=jnp.float32)
      out['token'] = 2.0 * jnp.cos(1.3 * z[:, None, None] + 0.4 * pos[None, :, None] + 0.9 * v
                                   + own)
    return out

  return fn


def _cfg(**kw) -> config_lib.SampleConfig:
  kw.setdefault('prior_corrected', False)
  return config_lib.SampleConfig(**kw)


# One compile per (model, schedule, config, shape): the model object is hashed by identity.
_sample_jit = jax.jit(hmdlm_sampler.sample, static_argnums=(0, 2, 3),
                      static_argnames=('batch_size', 'seq_len'))


def _process(schedule, cfg: config_lib.SampleConfig, **kw) -> hmdlm.HMDLM:
  """The HMDLM process of a schedule with the sampler's K, mask id and head settings."""
  loss_cfg = config_lib.LossConfig(mask_id=cfg.mask_id, num_levels=cfg.num_levels,
                                   prior_corrected=cfg.prior_corrected, variant=cfg.variant)
  return hmdlm.HMDLM(schedule, loss_cfg, **kw)


def _run(apply_fn, key, schedule, cfg, **kw) -> base.SampleOutput:
  return jax.tree.map(np.asarray, _sample_jit(apply_fn, key, schedule, cfg, **kw))


def _seq_index(tokens: np.ndarray, num_tokens: int) -> np.ndarray:
  """Index of each sequence in toy.all_sequences order (lexicographic)."""
  w = num_tokens ** np.arange(tokens.shape[-1] - 1, -1, -1)
  return (tokens * w).sum(-1)


def _tv(samples_idx: np.ndarray, probs: np.ndarray) -> float:
  emp = np.bincount(samples_idx, minlength=len(probs)) / len(samples_idx)
  return 0.5 * float(np.abs(emp - probs).sum())


def _assert_fraction(observed: float, expected: float, n: int, what: str) -> None:
  se = np.sqrt(max(expected * (1.0 - expected), 0.0) / n)
  assert abs(observed - expected) <= NSE * se + 1e-9, (
      f'{what}: observed {observed:.5f}, expected {expected:.5f} (n={n}, 5 SE = {NSE * se:.5f})')


# ---------------------------------------------------------------------------------------------
# The sampler samples the model (exact denoiser, T = 1000, 20k samples).


@pytest.mark.parametrize('schedule,variant', [(LOGLINEAR, 'two_pass'), (POWER, 'two_pass'),
                                              (LOGLINEAR, 'single_pass')],
                         ids=['loglinear-two_pass', 'power-two_pass', 'loglinear-single_pass'])
def test_algorithm2_samples_the_data_distribution(schedule, variant):
  toy = oracle.make_toy(0)
  denoiser = _toy_oracle(toy, schedule)
  # The oracle's outputs depend on t (the prior factor is part of the posterior): no pass-1 reuse.
  cfg = _cfg(num_steps=1000, num_levels=2, mask_id=toy.mask_id, variant=variant,
             time_conditioning=True)
  bsz, tol = (20_000, 0.03) if variant == 'two_pass' else (10_000, 0.04)
  out = _run(denoiser, jax.random.key(1), schedule, cfg, batch_size=bsz, seq_len=toy.seq_len)
  assert not np.any(out.tokens == toy.mask_id)
  tv = _tv(_seq_index(out.tokens, toy.num_tokens), toy.probs)
  assert tv < tol, f'TV(samples, data) = {tv:.4f}'
  recomputed = oracle.frequency_levels(out.tokens, toy.tau, 2)
  bad_seq = float(np.mean(np.any(recomputed != out.levels, axis=-1)))
  assert bad_seq < 0.005, f'{bad_seq:.4%} of samples have drawn levels != frequency-rule levels'
  bad_pos = float(hmdlm_sampler.level_disagreement(out.levels, recomputed))
  assert bad_pos <= bad_seq
  assert int(out.nfe) == 2 * 1000  # every step reveals something in a batch this large
  assert int(out.nan_calls) == 0


def test_mdlm_sampler_samples_the_data_distribution():
  toy = oracle.make_toy(3, num_levels=1)
  denoiser = _toy_oracle(toy, MDLM)
  cfg = _cfg(num_steps=1000, num_levels=1, mask_id=toy.mask_id, use_cache=False)
  out = _run(denoiser, jax.random.key(2), MDLM, cfg, batch_size=20_000, seq_len=toy.seq_len)
  tv = _tv(_seq_index(out.tokens, toy.num_tokens), toy.probs)
  assert tv < 0.03, f'TV(samples, data) = {tv:.4f}'
  assert np.all(out.levels == 0)
  assert int(out.nfe) == 1000  # one call per step, no pass 1


def test_sampler_from_a_wrong_model_is_detected():
  """The TV check can fail: an oracle of another distribution is > 0.03 away from the data."""
  toy = oracle.make_toy(0)
  other = oracle.make_toy(7).probs
  denoiser = _toy_oracle(toy, POWER, probs=other, memo=False)
  cfg = _cfg(num_steps=50, num_levels=2, mask_id=toy.mask_id)
  out = _run(denoiser, jax.random.key(3), POWER, cfg, batch_size=4000, seq_len=toy.seq_len)
  assert _tv(_seq_index(out.tokens, toy.num_tokens), toy.probs) > 0.1


def test_infilling_samples_the_conditional_distribution():
  """Given position 1 = (token a, level b): samples follow p(x | x_1 = a, h_1 = b)."""
  toy = oracle.make_toy(0)
  a, b = 2, 1
  keep = (toy.seqs[:, 1] == a) & (toy.levels[:, 1] == b)
  cond = np.where(keep, toy.probs, 0.0)
  cond /= cond.sum()
  denoiser = _toy_oracle(toy, LOGLINEAR)
  cfg = _cfg(num_steps=200, num_levels=2, mask_id=toy.mask_id)
  bsz = 10_000
  given = np.zeros((bsz, 3), bool)
  given[:, 1] = True
  out = _run(denoiser, jax.random.key(4), LOGLINEAR, cfg, batch_size=bsz, seq_len=3,
             given_tokens=np.full((bsz, 3), a), given_levels=np.full((bsz, 3), b),
             given_mask=given)
  assert np.all(out.tokens[:, 1] == a) and np.all(out.levels[:, 1] == b)
  assert np.all(out.reveal_step[:, 1] == 201)
  tv = _tv(_seq_index(out.tokens, toy.num_tokens), cond)
  assert tv < 0.04, f'TV(samples, conditional) = {tv:.4f}'


# ---------------------------------------------------------------------------------------------
# Reveal order follows the schedules.


@pytest.mark.parametrize('schedule', [LOGLINEAR, POWER], ids=['loglinear', 'power'])
def test_reveal_times_follow_each_level_schedule(schedule):
  """g one-hot at the true level: P(level k revealed by step n) = 1 - (1-α_k(s_n)) / (1-α_k(1)).

  (The product of (1 - λ_k(s_m, t_m)) over m = T..n telescopes.)
  """
  bsz, seq_len, steps = 1000, 8, 20
  true_level = np.tile(np.arange(seq_len) % 2, (bsz, 1))
  hier = np.where(true_level[..., None] == np.arange(2), 30.0, 0.0)
  tok = np.random.default_rng(0).normal(size=(bsz, seq_len, 5))
  cfg = _cfg(num_steps=steps, num_levels=2, mask_id=4)
  out = _run(_const_model(hier, tok), jax.random.key(5), schedule, cfg, batch_size=bsz,
             seq_len=seq_len)
  np.testing.assert_array_equal(out.levels, true_level)
  om1 = schedule.one_minus_alpha(1.0, np)
  for n in range(1, steps + 1):
    expected = 1.0 - schedule.one_minus_alpha((n - 1) / steps, np) / om1  # [K]
    for k in range(2):
      sel = true_level == k
      observed = float(np.mean(out.reveal_step[sel] >= n))
      _assert_fraction(observed, expected[k], int(sel.sum()), f'level {k}, step {n}')


def test_uniform_hierarchy_reveal_fraction_and_level_shares():
  """Uniform g: P(still masked after step n) = Π_{m>=n} (1 - mean_k λ_k(m)); levels ∝ λ_k."""
  bsz, seq_len, steps = 1000, 8, 20
  schedule = LOGLINEAR
  tok = np.random.default_rng(1).normal(size=(bsz, seq_len, 5))
  cfg = _cfg(num_steps=steps, num_levels=2, mask_id=4)
  out = _run(_const_model(np.zeros((bsz, seq_len, 2)), tok), jax.random.key(6), schedule, cfg,
             batch_size=bsz, seq_len=seq_len)
  n_pos = bsz * seq_len
  still, share1 = 1.0, 0.0
  for n in range(steps, 0, -1):
    lam = schedule.reveal_prob((n - 1) / steps, n / steps, np)
    if n == 1:  # renormalised over the active levels: only level 0 at t = 0.05 < δ_1
      assert schedule.one_minus_alpha(1 / steps, np)[1] == 0
      w = np.array([1.0, 0.0])
    else:
      w = lam / 2.0
    share1 += still * w[1]
    still *= 1.0 - w.sum()
    observed = float(np.mean(out.reveal_step < n))
    _assert_fraction(observed, still, n_pos, f'masked after step {n}')
  assert still == 0.0
  _assert_fraction(float(np.mean(out.levels == 1)), share1, n_pos, 'share of level 1')


@pytest.mark.parametrize('boost', [30.0, 1000.0], ids=['renormalised', 'mass-lost'])
def test_last_step_reveals_everything_on_active_levels(boost):
  """At t = 1/T the head puts (almost) all mass on level 1, which cannot be masked at t < δ_1."""
  bsz, seq_len, steps = 250, 8, 10

  def fn(tokens, levels, t, *, heads, token_levels=None):
    last = (t[:, None, None] <= 1.0 / steps + 1e-6)
    out = {}
    if 'hier' in heads:
      out['hier'] = jnp.where(last, jnp.asarray([0.0, boost]), 0.0) * jnp.ones(
          tokens.shape + (2,))
    if 'token' in heads:
      out['token'] = jnp.zeros(tokens.shape + (4,))
    return out

  cfg = _cfg(num_steps=steps, num_levels=2, mask_id=3)
  out = _run(fn, jax.random.key(7), LOGLINEAR, cfg, batch_size=bsz, seq_len=seq_len)
  assert not np.any(out.tokens == 3)
  assert np.all((out.reveal_step >= 1) & (out.reveal_step <= steps))
  at_last = out.reveal_step == 1
  assert at_last.sum() > 20  # the last step is exercised (expected ≈ 0.075 · 2000)
  assert np.all(out.levels[at_last] == 0)


def test_last_step_when_no_level_is_active():
  """Offsets (0.5, 0.75), T = 4: no level is active at t = 1/4; every position is still revealed."""
  schedule = Schedule('loglinear', (0.5, 0.75))
  bsz, seq_len = 200, 6
  hier = np.random.default_rng(2).normal(size=(bsz, seq_len, 2)) * 3
  cfg = _cfg(num_steps=4, num_levels=2, mask_id=3)
  out = _run(_const_model(hier, np.zeros((bsz, seq_len, 4))), jax.random.key(8), schedule, cfg,
             batch_size=bsz, seq_len=seq_len)
  assert not np.any(out.tokens == 3)
  assert np.all(out.levels < 2)
  assert np.any(out.reveal_step == 1)  # positions the head put on level 1 waited until the end


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
  cfg = _cfg(num_steps=steps, num_levels=2, mask_id=toy.mask_id, ordering=ordering)
  out = _run(_toy_oracle(toy, POWER, memo=False), jax.random.key(9), POWER, cfg, batch_size=bsz,
             seq_len=3, given_tokens=gtok, given_levels=glev, given_mask=given)
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
  model = _const_model(rng.normal(size=(bsz, seq_len, num_levels)), tok)
  schedule = LOGLINEAR if num_levels == 2 else MDLM
  best = np.argmax(np.where(np.arange(vocab) == 5, -np.inf, tok), -1)
  cfg = _cfg(num_steps=16, num_levels=num_levels, mask_id=5, greedy=True)
  steps = []
  for key in (10, 11):
    out = _run(model, jax.random.key(key), schedule, cfg, batch_size=bsz, seq_len=seq_len)
    np.testing.assert_array_equal(out.tokens, best)
    steps.append(out.reveal_step)
  assert not np.array_equal(*steps)  # the reveal order is still random; the tokens are not


def test_temperature_scales_the_token_distribution():
  """P(draw != argmax) = 1 - max softmax(logits / τ); τ -> 0 approaches greedy."""
  bsz, seq_len, vocab = 200, 6, 6
  rng = np.random.default_rng(5)
  tok = _permuted_logits(rng, bsz, seq_len, vocab)
  model = _const_model(rng.normal(size=(bsz, seq_len, 2)), tok)
  logits = np.where(np.arange(vocab) == 5, -np.inf, tok)
  best = np.argmax(logits, -1)
  for tau in (0.3, 0.02):
    cfg = _cfg(num_steps=16, num_levels=2, mask_id=5, temperature=tau)
    out = _run(model, jax.random.key(12), LOGLINEAR, cfg, batch_size=bsz, seq_len=seq_len)
    p = np.exp(logits / tau - np.logaddexp.reduce(logits / tau, axis=-1, keepdims=True))
    expected = float(np.mean(1.0 - p.max(-1)))
    observed = float(np.mean(out.tokens != best))
    _assert_fraction(observed, expected, bsz * seq_len, f'non-argmax share at τ={tau}')
    if tau == 0.02:  # P(non-argmax) ≈ 4 e^-50 per position
      assert observed == 0.0


def test_confidence_greedy_is_deterministic():
  toy = oracle.make_toy(0)
  cfg = _cfg(num_steps=3, num_levels=2, mask_id=toy.mask_id, ordering='confidence', greedy=True)
  denoiser = _toy_oracle(toy, LOGLINEAR, memo=False)
  outs = [_run(denoiser, jax.random.key(k), LOGLINEAR, cfg, batch_size=4, seq_len=3)
          for k in (0, 1, 2)]
  for o in outs[1:]:
    for a, b in zip(o, outs[0]):
      np.testing.assert_array_equal(a, b)
  # ...while the ancestral sampler at the same settings is random.
  cfg = _cfg(num_steps=3, num_levels=2, mask_id=toy.mask_id, greedy=True)
  anc = [_run(denoiser, jax.random.key(k), LOGLINEAR, cfg, batch_size=64, seq_len=3).reveal_step
         for k in (0, 1)]
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

  cfg = _cfg(num_steps=steps, num_levels=k, mask_id=v - 1, ordering='confidence', greedy=True,
             level_context=level_context)
  out = hmdlm_sampler.sample(apply_fn, jax.random.key(0), LOGLINEAR3, cfg, batch_size=2, seq_len=l)
  assert seen
  for masked, levels in seen:
    if level_context == 'none':
      assert np.all(levels[masked] == k)
    else:
      assert np.all(levels[masked] < k)
  assert np.all(np.asarray(out.levels) < k) and np.all(np.asarray(out.tokens) != v - 1)
  ref = hmdlm_sampler.sample(apply_fn, jax.random.key(0), LOGLINEAR3,
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

  outs = [hmdlm_sampler.sample(apply_fn, jax.random.key(3), LOGLINEAR,
                          _cfg(num_steps=4, num_levels=k, mask_id=v - 1, level_context=lc),
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
  ref = _run(_hash_model(2, vocab, counter), key, LOGLINEAR, _cfg(use_cache=False, **base_cfg),
             **kw)
  assert int(ref.nfe) == 2 * steps and counter[0] == 2 * steps
  for time_cond in (False, True):
    counter[0] = 0
    cfg = _cfg(use_cache=True, time_conditioning=time_cond, **base_cfg)
    out = _run(_hash_model(2, vocab, counter), key, LOGLINEAR, cfg, **kw)
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
  ref = _run(_hash_model(1, vocab, counter), key, MDLM, _cfg(use_cache=False, **base_cfg),
             batch_size=bsz, seq_len=seq_len)
  assert int(ref.nfe) == steps and counter[0] == steps
  counter[0] = 0
  out = _run(_hash_model(1, vocab, counter), key, MDLM, _cfg(use_cache=True, **base_cfg),
             batch_size=bsz, seq_len=seq_len)
  for a, b in zip(out[:3], ref[:3]):
    np.testing.assert_array_equal(a, b)
  expected = len(set(out.reveal_step.ravel().tolist()))
  assert int(out.nfe) == expected == counter[0] and expected < steps


def test_stale_cache_would_be_detected():
  """If the pass-1 cache were reused after a change, a model that reads (x, h) would notice.

  Guard for the equivalence test above: the hash model's hierarchy logits do change after every
  reveal, so equal outputs are not an accident of a constant model.
  """
  model = _hash_model(2, 5)
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
  schedule = LOGLINEAR if num_levels == 2 else MDLM
  cfg = _cfg(num_steps=steps, num_levels=num_levels, mask_id=vocab - 1, ordering='confidence',
             greedy=True, hierarchy_weight=weight)
  out = _run(_const_model(hier, tok), jax.random.key(15), schedule, cfg, batch_size=bsz,
             seq_len=seq_len, given_tokens=gtok, given_levels=glev, given_mask=given)
  reveal, levels, best, counts = _reference_confidence(hier, tok, schedule, steps, vocab - 1,
                                                       given, glev, weight)
  for n in range(1, steps + 1):  # the planned count per step
    np.testing.assert_array_equal((out.reveal_step == n).sum(-1), counts[n], err_msg=f'n={n}')
  np.testing.assert_array_equal(out.reveal_step, reveal)
  np.testing.assert_array_equal(out.levels, levels)
  np.testing.assert_array_equal(out.tokens, np.where(given, gtok, best))
  if num_levels == 1 or weight == 0:  # pure token confidence: by decreasing confidence
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
  schedule = LOGLINEAR if num_levels == 2 else MDLM
  clue = np.arange(bsz) % num_tokens
  answer = (clue[:, None] + np.arange(seq_len)) % num_tokens
  given = np.zeros((bsz, seq_len), bool)
  given[:, 0] = True
  kw = dict(batch_size=bsz, seq_len=seq_len, given_tokens=answer,
            given_levels=np.full((bsz, seq_len), num_levels - 1), given_mask=given)
  model = _chain_model(num_levels, num_tokens)
  cfg = _cfg(num_steps=steps, num_levels=num_levels, mask_id=num_tokens, ordering='confidence',
             greedy=True)
  for key in (16, 17):
    out = _run(model, jax.random.key(key), schedule, cfg, **kw)
    np.testing.assert_array_equal(out.tokens, answer)
    # One cell per step, along the chain (reveal steps strictly decreasing with the position).
    assert np.all(np.diff(out.reveal_step, axis=1) < 0)
  # The ancestral order (random) mostly fails on the same puzzle: the check has teeth.
  cfg = _cfg(num_steps=steps, num_levels=num_levels, mask_id=num_tokens, greedy=True)
  out = _run(model, jax.random.key(18), schedule, cfg, **kw)
  assert np.mean(np.all(out.tokens == answer, axis=1)) < 0.5


# ---------------------------------------------------------------------------------------------
# Configuration, validation, jitting.


def test_sample_config_from_config():
  c = base_config.get_base_config()
  cfg = config_lib.SampleConfig.from_config(c)
  assert cfg == config_lib.SampleConfig(
      num_steps=128, num_levels=2, mask_id=c.model.vocab_size - 1, temperature=1.0, greedy=False,
      ordering='ancestral', use_cache=True, prior_corrected=True, variant='two_pass',
      time_conditioning=False)
  hash(cfg)  # static jit argument
  c.model.mask_id = 7
  assert config_lib.SampleConfig.from_config(c).mask_id == 7


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
    config_lib.SampleConfig.from_config(c)


def test_sample_config_rejects_non_bool_flags():
  with pytest.raises(ValueError, match='greedy'):
    config_lib.SampleConfig(num_steps=4, num_levels=2, mask_id=3, greedy='yes')
  with pytest.raises(ValueError, match='time_conditioning'):
    config_lib.SampleConfig(num_steps=4, num_levels=2, mask_id=3, time_conditioning=1)


def test_sample_rejects_inconsistent_arguments():
  model = _const_model(np.zeros((2, 3, 2)), np.zeros((2, 3, 4)))
  cfg = _cfg(num_steps=4, num_levels=2, mask_id=3)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match='levels'):
    hmdlm_sampler.sample(model, key, MDLM, cfg, batch_size=2, seq_len=3)
  with pytest.raises(ValueError, match='given_levels'):
    hmdlm_sampler.sample(model, key, LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.zeros((2, 3), int), given_mask=np.ones((2, 3), bool))
  with pytest.raises(ValueError, match='given_mask'):
    hmdlm_sampler.sample(model, key, LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.zeros((2, 3), int))
  with pytest.raises(ValueError, match='given_tokens must be real tokens'):
    hmdlm_sampler.sample(model, key, LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.full((2, 3), 3), given_levels=np.zeros((2, 3), int),
                    given_mask=np.ones((2, 3), bool))
  with pytest.raises(ValueError, match='given_levels must lie in 0..1'):
    hmdlm_sampler.sample(model, key, LOGLINEAR, cfg, batch_size=2, seq_len=3,
                    given_tokens=np.zeros((2, 3), int), given_levels=np.full((2, 3), 2),
                    given_mask=np.ones((2, 3), bool))


def test_make_sampler_jits_with_params_as_argument():
  bsz, seq_len = 3, 5
  schedule = LOGLINEAR
  cfg = _cfg(num_steps=4, num_levels=2, mask_id=4, greedy=True)

  def builder(params):
    return _const_model(params['hier'], params['tok'])

  run = base.make_sampler(_process(schedule, cfg), builder, cfg, batch_size=bsz, seq_len=seq_len)
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
  cfg = _cfg(num_steps=10, num_levels=2, mask_id=4)
  with pytest.raises(ValueError, match='Appendix D'):
    base.make_sampler(_process(bad, cfg), lambda p: p, cfg, batch_size=1, seq_len=2)
  base.make_sampler(_process(bad, cfg, check_ordering='off'), lambda p: p, cfg, batch_size=1,
                    seq_len=2)


def test_nan_logits_are_reported():
  bsz, seq_len = 2, 3
  hier = np.zeros((bsz, seq_len, 2))
  hier[0, 1, 0] = np.nan
  cfg = _cfg(num_steps=5, num_levels=2, mask_id=3, use_cache=False)
  out = _run(_const_model(hier, np.zeros((bsz, seq_len, 4))), jax.random.key(0), LOGLINEAR, cfg,
             batch_size=bsz, seq_len=seq_len)
  assert int(out.nan_calls) == 5  # every pass-1 call
  with pytest.raises(FloatingPointError, match='5 of 10 network calls returned NaN'):
    base.check_finite(out)
  ok = _run(_const_model(np.zeros_like(hier), np.zeros((bsz, seq_len, 4))), jax.random.key(0),
            LOGLINEAR, cfg, batch_size=bsz, seq_len=seq_len)
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
    _assert_fraction(float(freq[k]), float(p[k]), n, f'class {k}')


def test_level_disagreement():
  drawn = np.array([[0, 1, 1], [1, 1, 0]])
  recomputed = np.array([[0, 0, 1], [1, 1, 1]])
  assert float(hmdlm_sampler.level_disagreement(drawn, recomputed)) == pytest.approx(2 / 6)
  where = np.array([[True, False, True], [True, True, False]])
  assert float(hmdlm_sampler.level_disagreement(drawn, recomputed, where)) == 0.0
