"""An enumerable toy problem and an exact-oracle harness for ANY forward process (tests only).

The toy: sequences of length L over V real tokens (ids 0..V-1) with a fixed law p(x) over all V^L
sequences (a Dirichlet draw). Levels follow the frequency rule (docs/method.md §6): a token that
occurs at most τ times in its own sequence gets level 1, otherwise 0 (all 0 when K = 1); h is a
function of x.

The harness needs nothing from a process but its interface (hmdlm_jax/processes/base.py):
`log_marginal` (the forward marginal q(z_t | x0) per position), `state_candidates` (the states a
position can take), `bound_from_state` and `sample`. A new process gets its exactness tests by
calling, for its own toy settings,

* `make_oracle(toy, process, vocab_size)`: the exact-posterior denoiser (the apply_fn contract of
  docs/design.md): 'token' logits are log P(x0^i = v | z_t) (log 0 = -inf off the words), 'hier'
  logits log P(h0^i = k | z_t); with `token_levels` a position's token logits are conditioned on
  its own level (HMDLM's own-level context), each position separately. Posterior:
      P(x0 | z_t) ∝ p(x0) · Π_i q(z_t^i | x0^i, h0^i; t)          (`log_marginal`)
  A state no x0 can produce (a sampler can create one: HMDLM's drawn levels that disagree with the
  drawn tokens) falls back to conditioning on the revealed words only, so it stays finite.
* `expected_bound(toy, process, apply_fn, t)`: E_{z_t ~ q(·|x)}[L · bound_from_state] for every
  sequence at each time, by enumerating the S^L states of `state_candidates` (exact; deterministic
  bounds only).
* `integrated_bound(...)`: ∫_{t_lo}^1 of it by tanh-sinh quadrature split at `process.kinks`, to be
  compared with -log p(x) (ε = 0 schedules: equality to ~1e-14).
* `sample_index` / `total_variation`: the sampler against the data law.

Everything follows the dtype of `t` (float64 under `jax.enable_x64(True)`), which exactness needs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.processes.base import NoisyState
from hmdlm_jax.processes.base import Process
from tests.conftest import OPTIMISED

ApplyFn = Callable[..., dict]
QUAD_STEP = 1.0 / 16  # tanh-sinh step (nodes ≈ 2 · 3.2 / step per segment)


def all_sequences(num_tokens: int, seq_len: int) -> np.ndarray:
  """All V^L sequences in lexicographic order: [V^L, L] int32."""
  return np.array(list(itertools.product(range(num_tokens), repeat=seq_len)), dtype=np.int32)


def frequency_levels(seqs: np.ndarray, tau: int = 1, num_levels: int = 2) -> np.ndarray:
  """Frequency rule: count(x_i in x) <= τ -> level 1, else 0; zeros when K = 1. [N, L]."""
  if num_levels == 1:
    return np.zeros_like(seqs, dtype=np.int32)
  counts = (seqs[:, :, None] == seqs[:, None, :]).sum(-1)  # [N, L]
  return (counts <= tau).astype(np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class Toy:
  """The enumerable problem: p over all sequences, with their levels."""
  probs: np.ndarray  # [N] float64, N = V^L
  seqs: np.ndarray  # [N, L] int32
  levels: np.ndarray  # [N, L] int32
  num_tokens: int  # V real tokens
  num_levels: int  # K
  tau: int

  @property
  def seq_len(self) -> int:
    return self.seqs.shape[1]

  @property
  def mask_id(self) -> int:
    """HMDLM's / MDLM's MASK id: the first id after the words."""
    return self.num_tokens

  @property
  def vocab_size(self) -> int:  # words + one MASK row (HMDLM / MDLM)
    return self.num_tokens + 1

  def neg_log_prob(self) -> np.ndarray:
    """-log p(x) for every sequence: [N] float64."""
    with np.errstate(divide='ignore'):
      return -np.log(self.probs)

  def entropy(self) -> float:
    """H(p) in nats."""
    p = self.probs[self.probs > 0]
    return float(-(p * np.log(p)).sum())

  def batch(self, idx: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The pipeline batch dict (docs/design.md) for sequences `idx` (default: all)."""
    idx = np.arange(len(self.probs)) if idx is None else np.asarray(idx)
    tokens = self.seqs[idx]
    return dict(tokens=tokens, levels=self.levels[idx], given=np.zeros(tokens.shape, bool),
                loss_mask=np.ones(tokens.shape, bool))

  def index(self, tokens: np.ndarray) -> np.ndarray:
    """Index of each row [..., L] of words in `seqs` (lexicographic order)."""
    w = self.num_tokens ** np.arange(self.seq_len - 1, -1, -1)
    return (np.asarray(tokens) * w).sum(-1)


def make_toy(seed: int = 0, *, num_tokens: int = 3, seq_len: int = 3, num_levels: int = 2,
             tau: int = 1, concentration: float = 1.0) -> Toy:
  """A Dirichlet(concentration) distribution over the V^L sequences, with frequency levels."""
  seqs = all_sequences(num_tokens, seq_len)
  probs = np.random.default_rng(seed).dirichlet(np.full(len(seqs), concentration))
  return Toy(probs, seqs, frequency_levels(seqs, tau, num_levels), num_tokens, num_levels, tau)


# ------------------------------------------------------------------------------------------ oracle


def make_oracle(toy: Toy, process: Process, vocab_size: int | None = None,
                probs: np.ndarray | None = None) -> ApplyFn:
  """The exact-posterior denoiser of `process` on `toy` (module docstring).

  Args:
    toy: the data law (and levels).
    process: the forward process; only `log_marginal` is used.
    vocab_size: the network's input vocabulary (columns of the 'token' logits); default
      toy.vocab_size (words + one MASK).
    probs: another data law for a deliberately wrong denoiser (default toy.probs).
  Returns:
    apply_fn(tokens [B, L], levels [B, L], t [B], *, heads, token_levels=None) -> dict with
    'hier' [B, L, K] and/or 'token' [B, L, vocab_size] exact log posteriors.
  """
  vocab = toy.vocab_size if vocab_size is None else vocab_size
  p = np.asarray(toy.probs if probs is None else probs, np.float64)
  with np.errstate(divide='ignore'):
    logp_np = np.log(p)
  seq_x = jnp.asarray(toy.seqs)  # [N, L]
  seq_h = jnp.asarray(toy.levels)
  onehot_x = jax.nn.one_hot(seq_x, vocab, dtype=jnp.float32)  # [N, L, V]
  onehot_h = jax.nn.one_hot(seq_h, toy.num_levels, dtype=jnp.float32)  # [N, L, K]
  clean = NoisyState(seq_x[None], seq_h[None])  # [1, N, L]

  def apply_fn(tokens: jax.Array, levels: jax.Array, t: jax.Array, *,
               heads: tuple[str, ...] = ('hier', 'token'),
               token_levels: jax.Array | None = None) -> dict[str, jax.Array]:
    t = jnp.asarray(t)
    dtype = jnp.promote_types(t.dtype, jnp.float32)
    t = t.astype(dtype)
    tokens, levels = jnp.asarray(tokens), jnp.asarray(levels)
    logp = jnp.asarray(logp_np, dtype)  # [N]
    state = NoisyState(tokens[:, None, :], levels[:, None, :])  # [B, 1, L]
    lq = process.log_marginal(state, clean, t[:, None])  # [B, N, L]
    hard = lq.astype(dtype).sum(-1) + logp  # [B, N]
    word = tokens < toy.num_tokens
    soft = jnp.where(word[:, None, :] & (seq_x[None] != tokens[:, None, :]), -jnp.inf,
                     0.0).sum(-1) + logp  # revealed words only
    lse = jax.nn.logsumexp(hard, axis=-1, keepdims=True)
    logw = jnp.where(jnp.isfinite(lse), hard, soft)
    post = jnp.exp(logw - jax.nn.logsumexp(logw, axis=-1, keepdims=True))  # [B, N]
    out = {}
    if 'hier' in heads:
      out['hier'] = jnp.log(jnp.einsum('bn,nlk->blk', post, onehot_h.astype(dtype)))
    if 'token' in heads:
      ox = onehot_x.astype(dtype)
      marg = jnp.einsum('bn,nlv->blv', post, ox)  # [B, L, V]
      if token_levels is not None:
        cond = post[:, :, None] * (seq_h[None] == token_levels[:, None, :]).astype(dtype)
        num = jnp.einsum('bnl,nlv->blv', cond, ox)
        den = cond.sum(1)[..., None]  # [B, L, 1]
        marg = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), marg)
      out['token'] = jnp.log(marg)  # non-word columns: log 0 = -inf
    return out

  return apply_fn


def memoize(apply_fn: ApplyFn, *, vocab_size: int, num_level_inputs: int, seq_len: int,
            num_levels: int | None = None) -> ApplyFn:
  """`apply_fn` evaluated once per call on EVERY input state and looked up (exact, faster).

  A position's input is (token in 0..vocab_size-1, level in 0..num_level_inputs-1), so there are
  (vocab_size · num_level_inputs)^L states, fewer than a sampler's batch of 20,000 rows for the
  toys. The call's t must be one value for the batch (as in the samplers). With `token_levels`
  (single-pass own level, values 0..num_levels) the token head is evaluated once per level value
  and picked per position.
  """
  n_state = vocab_size * num_level_inputs
  weights = n_state ** np.arange(seq_len - 1, -1, -1)
  digits = (np.arange(n_state ** seq_len)[:, None] // weights) % n_state  # [S, L]
  tok_all = jnp.asarray(digits // num_level_inputs, jnp.int32)
  lvl_all = jnp.asarray(digits % num_level_inputs, jnp.int32)
  weights = jnp.asarray(weights, jnp.int32)

  def fn(tokens, levels, t, *, heads, token_levels=None):
    t_all = jnp.full((tok_all.shape[0],), t[0])
    code = jnp.sum((tokens * num_level_inputs + levels) * weights, axis=-1)  # [B]
    if token_levels is None:
      out = apply_fn(tok_all, lvl_all, t_all, heads=heads)
      return {k: v[code] for k, v in out.items()}
    out = {}
    if 'hier' in heads:
      out['hier'] = apply_fn(tok_all, lvl_all, t_all, heads=('hier',))['hier'][code]
    if 'token' in heads:
      per_level = jnp.stack([
          apply_fn(tok_all, lvl_all, t_all, heads=('token',),
                   token_levels=jnp.full_like(tok_all, k))['token'][code]
          for k in range((num_levels or num_level_inputs - 1) + 1)])  # [K+1, B, L, V]
      out['token'] = jnp.take_along_axis(per_level, token_levels[None, ..., None], axis=0)[0]
    return out

  return fn


# -------------------------------------------------------------------------------- exact bounds


def tanh_sinh(a: float, b: float, h: float = QUAD_STEP) -> tuple[np.ndarray, np.ndarray]:
  """Tanh-sinh nodes and weights on [a, b] (float64); nodes that round onto an end are dropped.

  Tanh-sinh, not Gauss-Legendre, because bound integrands have integrable endpoint singularities
  (e.g. ~ -log(t - δ) next to an HMDLM offset), which Gauss-Legendre resolves only algebraically.
  """
  n = int(np.ceil(3.2 / h))
  x = np.arange(-n, n + 1) * h
  y = 0.5 * np.pi * np.sinh(x)
  u = 1.0 / (1.0 + np.exp(-2.0 * y))  # (1 + tanh y) / 2 without cancellation near a
  w = h * 0.25 * np.pi * np.cosh(x) / np.cosh(y) ** 2 * (b - a)
  t = a + (b - a) * u
  keep = (t > a) & (t < b)
  return t[keep], w[keep]


def quadrature(t_lo: float, kinks: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
  """Nodes/weights on [t_lo, 1] split at the kinks inside (t_lo, 1)."""
  cuts = [t_lo] + sorted(k for k in set(kinks) if t_lo < k < 1.0) + [1.0]
  parts = [tanh_sinh(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
  return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def enumerate_states(toy: Toy, process: Process) -> tuple[NoisyState, np.ndarray]:
  """Every noisy state of every sequence: (states [N, S^L, L], sequence index [N, S^L]).

  Per position the candidates of `process.state_candidates` (which must be distinct), combined
  over the L positions.
  """
  cand = process.state_candidates(NoisyState(jnp.asarray(toy.seqs), jnp.asarray(toy.levels)))
  n_seq, seq_len, n_cand = cand.tokens.shape
  codes = np.array(list(itertools.product(range(n_cand), repeat=seq_len)))  # [C, L]
  pos = np.arange(seq_len)
  tokens = np.asarray(cand.tokens)[:, pos, codes]  # [N, C, L]
  levels = np.asarray(cand.levels)[:, pos, codes]
  xi = np.broadcast_to(np.arange(n_seq)[:, None], tokens.shape[:2])
  return NoisyState(tokens, levels), xi


def expected_per_state(toy: Toy, process: Process, value_fn: Callable[..., jax.Array],
                       t_nodes: np.ndarray) -> np.ndarray:
  """E_{z ~ q(·|x, t)}[value_fn(batch, state, t)] for every node and sequence: [T, N] float64.

  value_fn(batch, state, t) -> [B] is traced under float64; zero-probability states contribute 0
  (their value is never looked at, so it may be non-finite).
  """
  states, xi = enumerate_states(toy, process)
  n_seq, n_st, _ = states.tokens.shape
  flat_x = xi.reshape(-1)
  batch = toy.batch(flat_x)
  st = NoisyState(states.tokens.reshape(n_seq * n_st, -1), states.levels.reshape(n_seq * n_st, -1))
  clean = NoisyState(jnp.asarray(batch['tokens']), jnp.asarray(batch['levels']))
  out = np.zeros((len(t_nodes), n_seq))
  with jax.enable_x64(True):

    @functools.partial(jax.jit, compiler_options=OPTIMISED)
    def at(t_scalar):
      t = jnp.full((n_seq * n_st,), t_scalar, jnp.float64)
      logq = process.log_marginal(NoisyState(jnp.asarray(st.tokens), jnp.asarray(st.levels)),
                                  clean, t).sum(-1)
      val = value_fn({k: jnp.asarray(v) for k, v in batch.items()},
                     NoisyState(jnp.asarray(st.tokens), jnp.asarray(st.levels)), t)
      q = jnp.exp(logq)
      return jnp.where(q > 0, q * jnp.where(q > 0, val, 0.0), 0.0)

    for i, t in enumerate(t_nodes):
      out[i] = np.asarray(at(jnp.float64(t))).reshape(n_seq, n_st).sum(-1)
  return out


def integrated_bound(toy: Toy, process: Process, apply_fn: ApplyFn, *, t_lo: float = 0.0,
                     extra_kinks: Sequence[float] = ()) -> np.ndarray:
  """∫_{t_lo}^1 E_q[L · bound_from_state] dt per sequence: [N] float64 (compare to -log p(x))."""
  t_nodes, w = quadrature(t_lo, tuple(process.kinks) + tuple(extra_kinks))

  def value(batch, state, t):
    out = process.bound_from_state(apply_fn, batch, state, t, jax.random.key(0))
    return out['total'] * out['num_tokens']

  return w @ expected_per_state(toy, process, value, t_nodes)


def total_variation(toy: Toy, tokens: np.ndarray) -> float:
  """TV distance between the empirical law of sampled rows [S, L] and the toy's p."""
  emp = np.bincount(toy.index(tokens), minlength=len(toy.probs)) / len(tokens)
  return 0.5 * float(np.abs(emp - toy.probs).sum())


def sampler_total_variation(toy: Toy, process: Process, apply_fn: ApplyFn, cfg: Any, *,
                            num_samples: int, seed: int = 0) -> tuple[float, Any]:
  """(TV of `num_samples` draws of `process.sample` against p, the SampleOutput)."""
  run = jax.jit(lambda key: process.sample(apply_fn, key, cfg, batch_size=num_samples,
                                           seq_len=toy.seq_len), compiler_options=OPTIMISED)
  out = jax.tree.map(np.asarray, run(jax.random.key(seed)))
  words = out.tokens < toy.num_tokens
  assert words.all(), 'the sampler left noise states in its output'
  return total_variation(toy, out.tokens), out
