"""Helpers of the sampler tests (tests/test_sampling*.py): schedules, exact-oracle and synthetic
models implementing the apply_fn contract, the jitted sampler, and the statistical checks."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import hmdlm_sampler
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle
from tests.conftest import OPTIMISED

LOGLINEAR = Schedule('loglinear', (0.0, 0.25))
POWER = Schedule('power', (1.0, 2.0))
MDLM = Schedule('loglinear', (0.0,))
LOGLINEAR3 = Schedule('loglinear', (0.0, 0.1, 0.2))
NSE = 5.0  # tolerance in binomial standard errors


# ---------------------------------------------------------------------------------------------
# Helpers: models implementing the apply_fn contract.


def toy_oracle(toy: oracle.Toy, schedule, probs=None, memo: bool = True) -> Callable[..., dict]:
  """The exact oracle of tests/oracle.py for HMDLM on `schedule` (memoised over all states)."""
  cfg = config_lib.LossConfig(mask_id=toy.mask_id, num_levels=toy.num_levels,
                              prior_corrected=False)
  fn = oracle.make_oracle(toy, hmdlm.HMDLM(schedule, cfg), probs=probs)
  if not memo:
    return fn
  return oracle.memoize(fn, vocab_size=toy.vocab_size, num_level_inputs=toy.num_levels + 1,
                        seq_len=toy.seq_len, num_levels=toy.num_levels)


def const_model(hier_logits: np.ndarray | None, token_logits: np.ndarray) -> Callable[..., dict]:
  """A model that ignores its inputs: fixed hier logits [B, L, K] and token logits [B, L, V]."""

  def fn(tokens, levels, t, *, heads, token_levels=None):
    out = {}
    if 'hier' in heads:
      out['hier'] = jnp.asarray(hier_logits, jnp.float32)
    if 'token' in heads:
      out['token'] = jnp.asarray(token_logits, jnp.float32)
    return out

  return fn


def hash_model(num_levels: int, vocab: int, counter: list[int] | None = None
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


def table_model(seed: int, vocab: int, *, seq_len: int, num_levels: int = 0, scale: float = 1.5
                ) -> tuple[Callable[..., dict], Callable[..., dict]]:
  """An imperfect denoiser: logits A[z] + t·B[z] from a fixed random table over every state z.

  A state is the tokens (and, with num_levels = K > 0, the level inputs 0..K) of all positions.
  Returns (apply_fn: 'token' [B, L, vocab] and with K > 0 'hier' [B, L, K] logits; its numpy
  float64 reference (tokens [L], levels [L] or None, t) -> {'token': [L, vocab], 'hier': [L, K]}).
  """
  rng = np.random.default_rng(seed)
  per_pos = vocab * (num_levels + 1)
  tabs = [rng.normal(0.0, scale, (per_pos ** seq_len, seq_len, vocab + num_levels))
          for _ in range(2)]
  weights = per_pos ** np.arange(seq_len - 1, -1, -1)

  def split(row: np.ndarray) -> dict:
    out = {'token': row[..., :vocab]}
    if num_levels:
      out['hier'] = row[..., vocab:]
    return out

  def reference(tokens, levels=None, t: float = 0.0) -> dict:
    lev = np.zeros(seq_len, int) if levels is None else np.asarray(levels)
    i = int(np.dot(np.asarray(tokens) * (num_levels + 1) + lev, weights))
    return split(tabs[0][i] + t * tabs[1][i])

  ja, jb = (jnp.asarray(x, jnp.float32) for x in tabs)
  jw = jnp.asarray(weights, jnp.int32)

  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    i = (tokens * (num_levels + 1) + levels) @ jw
    out = split(ja[i] + t[:, None, None] * jb[i])
    return {k: out[k] for k in heads}

  return apply_fn, reference


def final_law(prob: dict, num_words: int) -> np.ndarray:
  """The law [W^L] of words from an enumerated chain's final states (tuples of word ids ->
  probability, which must sum to 1), indexed lexicographically."""
  assert abs(sum(prob.values()) - 1.0) < 1e-12
  seq_len = len(next(iter(prob)))
  law = np.zeros(num_words ** seq_len)
  weights = num_words ** np.arange(seq_len - 1, -1, -1)
  for z, p in prob.items():
    assert max(z) < num_words, 'the reference left a noise state after the last step'
    law[int(np.dot(z, weights))] += p
  return law


def chi2_pvalue(idx: np.ndarray, law: np.ndarray) -> tuple[float, float]:
  """(Pearson χ² p-value, TV) of draws (indices) against a law; a draw of a zero-probability
  cell gives p = 0."""
  counts = np.bincount(idx, minlength=len(law)).astype(np.float64)
  tv = 0.5 * float(np.abs(counts / counts.sum() - law).sum())
  if np.any(counts[law == 0] > 0):
    return 0.0, tv
  keep = law > 0
  exp = law[keep] * counts.sum()
  chi2 = float(((counts[keep] - exp) ** 2 / exp).sum())
  return float(stats.chi2.sf(chi2, keep.sum() - 1)), tv


def sample_cfg(**kw) -> config_lib.SampleConfig:
  kw.setdefault('prior_corrected', False)
  return config_lib.SampleConfig(**kw)


# One compile per (model, schedule, config, shape): the model object is hashed by identity.
_sample_jit = jax.jit(hmdlm_sampler.sample, static_argnums=(0, 2, 3),
                      static_argnames=('batch_size', 'seq_len'), compiler_options=OPTIMISED)


def process_of(schedule, cfg: config_lib.SampleConfig, **kw) -> hmdlm.HMDLM:
  """The HMDLM process of a schedule with the sampler's K, mask id and head settings."""
  loss_cfg = config_lib.LossConfig(mask_id=cfg.mask_id, num_levels=cfg.num_levels,
                                   prior_corrected=cfg.prior_corrected, variant=cfg.variant)
  return hmdlm.HMDLM(schedule, loss_cfg, **kw)


def run_sampler(apply_fn, key, schedule, cfg, **kw) -> base.SampleOutput:
  return jax.tree.map(np.asarray, _sample_jit(apply_fn, key, schedule, cfg, **kw))


def seq_index(tokens: np.ndarray, num_tokens: int) -> np.ndarray:
  """Index of each sequence in toy.all_sequences order (lexicographic)."""
  w = num_tokens ** np.arange(tokens.shape[-1] - 1, -1, -1)
  return (tokens * w).sum(-1)


def total_variation(samples_idx: np.ndarray, probs: np.ndarray) -> float:
  emp = np.bincount(samples_idx, minlength=len(probs)) / len(samples_idx)
  return 0.5 * float(np.abs(emp - probs).sum())


def assert_fraction(observed: float, expected: float, n: int, what: str) -> None:
  se = np.sqrt(max(expected * (1.0 - expected), 0.0) / n)
  assert abs(observed - expected) <= NSE * se + 1e-9, (
      f'{what}: observed {observed:.5f}, expected {expected:.5f} (n={n}, 5 SE = {NSE * se:.5f})')
