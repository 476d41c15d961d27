"""The perplexity evaluator (docs/method.md §8): the rigorous bound over a whole split.

`evaluate_perplexity(apply_fn, process, batches, time_seed=, num_t_samples=)` returns the bound per
token and PPL = exp(bound), split into the process's terms (HMDLM: lm / hier / cons), the
process's further estimates that are not bounds (HMDLM: Appendix E, `ppl_appendix_e_estimate`, not
comparable with MDLM's bound), token count and a standard error. It uses only the `Process`
interface (`corrupt`, `bound_from_state`, `estimates_from_state`), so every process is evaluated
the same way; MDLM (K = 1) reports MDLM's bound.

Protocol (docs/method.md §8.3): a fixed key per batch and t-sample; t stratified over the batch's
real rows, then permuted over them; per-example values weighted by their loss positions and
summed in numpy float64; a FloatingPointError naming batch, row, term and t for any non-finite
value; a conservative standard error (ratio estimator over independent examples).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import progress as progress_lib
from hmdlm_jax.evaluation import batches as batches_lib
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.processes import base as process_base


class NatsAccumulator:
  """Float64 host sums for a token-weighted corpus average and its standard error.

  `add(nats, tokens)` takes per-example totals (nats summed over the example's loss positions,
  float [N]) for each named term and the examples' token counts [N]. The corpus value of a term is
  Σ nats / Σ tokens; its standard error is the ratio estimator's
  `sqrt(N/(N-1) · Σ (nats_i - R tokens_i)^2) / Σ tokens` with examples as independent units.
  """

  def __init__(self, names: Sequence[str]) -> None:
    self.names = tuple(names)
    self.tokens = np.float64(0.0)
    self.tokens_sq = np.float64(0.0)
    self.count = 0
    self.sum = {n: np.float64(0.0) for n in self.names}
    self.sum_sq = {n: np.float64(0.0) for n in self.names}
    self.sum_cross = {n: np.float64(0.0) for n in self.names}

  def add(self, nats: Mapping[str, np.ndarray], tokens: np.ndarray) -> None:
    tok = np.asarray(tokens, np.float64)
    self.tokens += tok.sum()
    self.tokens_sq += (tok * tok).sum()
    self.count += tok.size
    for n in self.names:
      v = np.asarray(nats[n], np.float64)
      if v.shape != tok.shape:
        raise ValueError(f'NatsAccumulator: {n} has shape {v.shape}, tokens {tok.shape}')
      self.sum[n] += v.sum()
      self.sum_sq[n] += (v * v).sum()
      self.sum_cross[n] += (v * tok).sum()

  def mean(self, name: str) -> float:
    if self.tokens <= 0:
      raise ValueError('NatsAccumulator: no tokens accumulated (every loss_mask empty?)')
    return float(self.sum[name] / self.tokens)

  def stderr(self, name: str) -> float:
    if self.count < 2:
      return float('nan')
    r = self.sum[name] / self.tokens
    ss = self.sum_sq[name] - 2.0 * r * self.sum_cross[name] + r * r * self.tokens_sq
    return float(math.sqrt(max(ss, 0.0) * self.count / (self.count - 1)) / self.tokens)


def _perplexity_step(apply_fn: compiled.ApplyFn, process: process_base.Process
                     ) -> Callable[..., dict[str, jax.Array]]:
  """Jitted `(batch, key, t) -> {bound terms..., 'bound', estimates...}`, per-example [B].

  One noisy state z_t per example serves both the bound and the process's further estimates
  (common random numbers: their difference is less noisy than two independent draws); the pair
  (corruption key, process key) is split exactly as `Process.bound` splits its key.
  """

  def make(a: compiled.ApplyFn) -> Callable[..., dict[str, jax.Array]]:
    def run(batch, key, t):
      chex.assert_rank(batch['tokens'], 2)
      chex.assert_shape(t, (batch['tokens'].shape[0],))
      k_state, k_own = jax.random.split(key)
      state = process.corrupt(k_state, batch, t)
      bound = process.bound_from_state(a, batch, state, t, k_own)
      # The terms add up to the bound: summed on the host in float64 (`evaluate_perplexity`).
      out = {n: v for n, v in bound.items() if n not in ('total', 'num_tokens')}
      out.update(process.estimates_from_state(a, batch, state, t))
      chex.assert_shape(list(out.values()), t.shape)  # per-example values [B]
      return out
    return run

  return compiled.jit_apply(apply_fn, make, ('perplexity', process))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _stratified_valid_times(key: jax.Array, n: int, t_min: float) -> jax.Array:
  k_t, k_perm = jax.random.split(key)
  t = process_base.sample_times(k_t, n, t_min=t_min, antithetic=True)
  return jax.random.permutation(k_perm, t)


def _stratified_times(key: jax.Array, valid: np.ndarray, t_min: float) -> np.ndarray:
  """t [B] float32: stratified over the valid rows, randomly permuted over them (module doc)."""
  t = np.full(valid.shape, 0.5, np.float32)  # padded rows: any finite time, never counted
  t[valid] = np.asarray(_stratified_valid_times(key, int(valid.sum()), float(t_min)))
  return t


def _raise_non_finite(values: Mapping[str, np.ndarray], valid: np.ndarray, t: np.ndarray,
                      batch_index: int, r: int) -> None:
  bad = valid & ~np.all([np.isfinite(v) for v in values.values()], axis=0)  # [B]
  if bad.any():
    i = int(np.argmax(bad))
    terms = ', '.join(f'{n}={values[n][i]}' for n in values if not np.isfinite(values[n][i]))
    raise FloatingPointError(
        f'evaluate_perplexity: non-finite per-example value(s) {terms} for batch {batch_index}, '
        f'row {i} (t = {t[i]:.6g}, t-sample {r}); {int(bad.sum())} such rows in this batch. '
        'Refusing to average a NaN/Inf; check the model (e.g. a hierarchy head without prior '
        'correction near t = δ_k, docs/method.md §4) or the data.')


def _exp(x: float) -> float:
  """exp that overflows to inf (an untrained model's PPL can exceed float64) instead of raising."""
  return math.exp(x) if x < 709.0 else math.inf


def evaluate_perplexity(apply_fn: compiled.ApplyFn, process: process_base.Process,
                        batches: Iterable[batches_lib.Batch], *,
                        time_seed: int, num_t_samples: int = 1, t_min: float = 1e-3,
                        max_examples: int | None = None, progress: bool = True
                        ) -> dict[str, Any]:
  """Rigorous bound, PPL and the process's estimates over the whole split (module docstring).

  Args:
    apply_fn: denoiser (design.md); a `compiled.Bound` compiles once per network.
    process: the model's forward process (static: hashable).
    batches: pipeline batches (+ optional per-row validity field, batches.VALID_FIELDS).
    time_seed: fixed seed of t and of the masks (config.eval.time_seed).
    num_t_samples: t draws per example (config.eval.num_t_samples); averaged per example.
    t_min: lower end of t ~ U(t_min, 1) (config.loss.t_min).
    max_examples: only the first this many examples.
    progress: show a progress bar (hmdlm_jax/progress.py).

  Returns:
    dict: bound_nats_per_token, bound_stderr, ppl (= exp bound), lm/hier/cons_nats_per_token,
    appendix_e_nats_per_token_estimate, ppl_appendix_e_estimate, num_tokens, num_sequences,
    num_t_samples, time_seed, t_min, bound_kind ('mdlm' for K = 1, else 'hmdlm').
  """
  if isinstance(num_t_samples, bool) or not isinstance(num_t_samples, int) or num_t_samples < 1:
    raise ValueError(f'eval.num_t_samples must be an integer >= 1, got {num_t_samples!r}')
  step = _perplexity_step(apply_fn, process)
  acc = names = None
  base = jax.random.PRNGKey(int(time_seed))
  it = batches_lib.fixed_batches(batches, max_examples=max_examples, what='perplexity batches')
  for j, (batch, valid) in enumerate(progress_lib.bar(it, desc='perplexity', unit='batch',
                                                      enabled=progress, leave=False)):
    batch = process.prepare_batch(batch)
    device_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    n_tok = (batch['loss_mask'] & valid[:, None]).sum(-1).astype(np.float64)  # [B]
    batch_key = jax.random.fold_in(base, j)
    pending = []  # dispatch every t-sample of the batch before fetching any (async dispatch)
    for r in range(num_t_samples):
      k_t, k_mask = jax.random.split(jax.random.fold_in(batch_key, r))
      t = _stratified_times(k_t, valid, t_min)
      pending.append((t, step(device_batch, k_mask, jnp.asarray(t))))
    for r, (t, out) in enumerate(pending):
      values = {n: np.asarray(v, np.float64) for n, v in jax.device_get(out).items()}
      _raise_non_finite(values, valid, t, j, r)
      terms = [n for n in values if n not in process.estimate_names]
      values['bound'] = sum(values[n] for n in terms)
      if acc is None:
        names = tuple(values)
        acc = NatsAccumulator(names)
      if r == 0:
        totals = {n: np.zeros(valid.shape, np.float64) for n in names}
      for n in names:
        # Per-example value = nats / n_i (docs/method.md §5) -> nats; averaged over the t-samples.
        totals[n] += np.where(valid, values[n], 0.0) * n_tok / num_t_samples
    acc.add({n: v[valid] for n, v in totals.items()}, n_tok[valid])
  if acc is None or acc.count == 0:
    raise ValueError('evaluate_perplexity: no examples to evaluate (empty batches)')
  bound = acc.mean('bound')
  out = {'bound_nats_per_token': bound, 'bound_stderr': acc.stderr('bound'), 'ppl': _exp(bound)}
  terms = [n for n in names if n != 'bound' and n not in process.estimate_names]
  out.update({f'{n}_nats_per_token': acc.mean(n) for n in terms})
  for n in process.estimate_names:
    est = acc.mean(n)
    out[f'{n}_nats_per_token_estimate'] = est
    out[f'ppl_{n}_estimate'] = _exp(est)
  out.update(num_tokens=int(acc.tokens), num_sequences=acc.count, num_t_samples=num_t_samples,
             time_seed=int(time_seed), t_min=float(t_min), bound_kind=process.bound_kind)
  return out
