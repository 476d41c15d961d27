"""Reverse-process samplers: Algorithm 2 (ancestral), confidence ordering, MDLM as K == 1 (SPEC 7).

State. Every position carries a token `x^i` and a level `h^i`; a masked position is `(mask_id, K)`
(`K` = the hierarchy-mask state h_m, design.md). The reverse process runs n = T..1 with t = n/T,
s = (n-1)/T inside ONE `jax.lax.scan`; everything is a pure function of the PRNG key, so the caller
jits the whole sampler, e.g.

  sample_fn = jax.jit(lambda params, key: sample(
      make_apply_fn(model, params, train=False), key, schedule, cfg, batch_size=B, seq_len=L))

(`make_sampler` below packages exactly this). `schedule` and `cfg` are frozen dataclasses (static).

Ancestral ordering (Algorithm 2; the paper's sampler).
  pass 1 on (x, h, t) -> g^i (`level_log_probs`, prior correction as configured; SPEC 4);
  every masked i draws from Cat(λ_0 g_0, …, λ_{K-1} g_{K-1}, 1 − Σ_k λ_k g_k), λ_k = λ_k(s,t)
  (Algorithm 2 line 11); a drawn level is written into h and i joins the reveal set R;
  pass 2 -> f^i (`token_log_probs`, SUBS) with temperature τ; each i ∈ R draws its token
      (or takes the argmax when greedy); the pair (x^i, h^i) is frozen.
  Pass-2 context. two_pass: the paper's model sees (x, h) with the freshly drawn levels at R
  (Algorithm 2 line 17). single_pass (SPEC 4 extension): the backbone sees the pass-1 inputs
  (x, h_t) and the token head receives each position's own level through `token_levels` (the
  drawn level at R, h_m elsewhere). The apply_fn contract has no way to hand a backbone from one
  call to the next, so single_pass also makes two apply_fn calls per step and `nfe` counts both;
  its saving is in training and in the bound (one pass), not in sampling.
  Last step (n = 1, s = 0): λ_k(0, t) = 1 for every level still active at t (α_k(t) < 1), so
  every masked position is revealed: it draws its level from g renormalised over the active levels
  (SPEC 7). Guards so that no position is ever left masked: if no level is active at t = 1/T (all
  offsets ≥ 1/T) every level is allowed; if g carries no mass on the allowed levels (underflow) the
  allowed levels are drawn uniformly.
  Greedy decoding takes the argmax token only; the reveal times and levels stay stochastic because
  they ARE the schedule (a greedy level draw would reveal nothing before the last step).

MDLM (K == 1). No pass 1 (g ≡ 1); each masked position is revealed with λ_0(s, t) and one network
call per step predicts its token; `variant` is irrelevant and the level state is 0 / 1 (= h_m).

Confidence ordering (Sudoku, typically T = L = 81; MDLM/MGDM-style top-k decoding).
  Per step the number of positions to reveal is the number Algorithm 2 expects,
      k_n = clip(round(Σ_{i masked} π_i), 1, #eligible),  π_i = Σ_k λ_k(s,t) g^i_k  (eq. 8)
  (all remaining masked positions at the last step). The positions are the k_n masked ones with the
  highest
      score_i = w · log π_i + log max_v f^i(v)      (w = `hierarchy_weight`, default 1),
  at w = 1 the log-probability of position i's single most likely move under the ancestral
  sampler (revealed now × its most likely token). Why this rule: log π_i carries the hierarchy (a
  position the head puts on a high level, whose λ is larger, comes first; λ_k ≤ λ_{k'} for
  k < k', Appendix D) and log max f carries the token confidence; for K == 1, π_i = λ(s, t) is
  the same for every i and the rule is exactly MDLM/MGDM top-k confidence decoding. A hierarchy
  head that predicts levels poorly spoils the order: on the Sudoku demo (level accuracy ~0.6)
  w = 1 / 0.3 / 0 gave 75.5 / 80.1 / 82.9% cell accuracy, hence w = 0 there (the count k_n and
  the eligibility still come from π). Eligible =
  masked with π_i > 0 (a position the head puts only on levels that cannot be revealed yet
  waits; the last step takes everyone). Ties go to the lower position index.
  Level context: a candidate's level is its most probable level GIVEN that it is revealed now,
  ĥ^i = argmax_k λ_k g^i_k (argmax g over the active levels at the last step). Pass 2 is run once
  for all candidates, each conditioned on its candidate level: two_pass writes ĥ at every masked
  position of h (predicted levels, so nothing leaks; this is Algorithm 2's context at its last
  step, where R = all masked positions); single_pass passes ĥ as `token_levels` over the pass-1
  inputs (exactly its training context). Caveat: Algorithm 1 trains the two-pass model with
  levels shown on a small reveal set only, so showing ĥ everywhere is a wider context than most
  of its training (the single-pass variant has no such gap). `level_context='none'` closes that
  gap instead: pass 2 sees h as it is (h_m at every masked position, Algorithm 1's context outside
  R), so the hierarchy only orders the reveals; pass 2's inputs are then pass 1's, and ONE call
  computes both heads (half the calls; measured on the Sudoku demo: +4.6 points of cell accuracy
  over 'candidates', README). A revealed position keeps ĥ^i as its level and takes the argmax
  token (greedy) or a draw from f^i at temperature τ. Confidence + greedy is fully deterministic.

Given positions (infilling prompts, Sudoku clues) start revealed with their tokens and levels and
are never resampled; their `reveal_step` is T + 1.

Cache (MDLM's idea, `use_cache`). With `use_cache=False` every pass is called at every step
(nfe = 2T two-pass/single-pass, T for K == 1). With `use_cache=True`
  * a call whose output would be unused is skipped: pass 2 when no position of the batch is
    revealed at this step, pass 1 when no position of the batch is masked any more. This is exact
    whatever the time conditioning (for K == 1 the network is only called on steps that reveal
    something).
  * pass 1 reuses the raw hierarchy logits of its last call when no position of the batch was
    revealed since that call, because then (x, h) are unchanged; only t moved, so this is done only
    when `time_conditioning` is False (the model ignores t). g is recomputed from the cached logits
    at the new t, since the prior correction depends on t.
  The decisions are batch-wide scalars inside `jax.lax.cond` (skip only if no sequence in the batch
  needs the call), and `nfe` counts the calls that ran. Under `jax.vmap` a cond with a batched
  predicate becomes a select that runs both branches: the samples are unchanged but the compute is
  not saved (`nfe` still reports the logical count); batch through `batch_size`, not vmap.

Levels. The returned levels are the drawn ones and can disagree with levels recomputed from the
tokens (SPEC 7; ~0.1% with an oracle at T = 1000): `level_disagreement` computes that share.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import parameterization
from hmdlm_jax import schedules
from hmdlm_jax.schedules import Schedule

ApplyFn = Callable[..., dict]

_ORDERINGS = ('ancestral', 'confidence')
_VARIANTS = ('two_pass', 'single_pass')
_LEVEL_CONTEXTS = ('candidates', 'none')


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  """Static sampler settings (hashable: a static jit argument).

  Attributes:
    num_steps: T, the number of reverse steps (t_n = n / T).
    num_levels: K (1 = MDLM); must equal the schedule's.
    mask_id: the MASK token id.
    temperature: τ > 0 for token draws (log f / τ); unused when greedy.
    greedy: argmax tokens instead of draws.
    ordering: 'ancestral' (Algorithm 2) | 'confidence' (top-k by score, module docstring).
    use_cache: skip unneeded calls and reuse unchanged pass-1 outputs (module docstring).
    prior_corrected: apply the prior correction to the hierarchy head (SPEC 4); False for an
      exact-posterior oracle.
    variant: 'two_pass' (paper) | 'single_pass' (SPEC 4 extension); ignored for K == 1.
    time_conditioning: whether the model reads t; the pass-1 cache is used only when False.
    level_context: confidence ordering only: 'candidates' (pass 2 sees ĥ at every masked
      position) | 'none' (pass 2 sees h_m there; one call computes both heads).
    hierarchy_weight: confidence ordering only: w >= 0 in score = w · log π + log max f.
  """
  num_steps: int
  num_levels: int
  mask_id: int
  temperature: float = 1.0
  greedy: bool = False
  ordering: str = 'ancestral'
  use_cache: bool = True
  prior_corrected: bool = True
  variant: str = 'two_pass'
  time_conditioning: bool = True
  level_context: str = 'candidates'
  hierarchy_weight: float = 1.0

  def __post_init__(self) -> None:
    _check_int('sample.num_steps', self.num_steps, minimum=1)
    _check_int('model.num_levels', self.num_levels, minimum=1)
    _check_int('model.mask_id', self.mask_id, minimum=0)
    for name in ('greedy', 'use_cache', 'prior_corrected', 'time_conditioning'):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f'SampleConfig.{name} must be a bool, got {getattr(self, name)!r}.')
    if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
        or not self.temperature > 0 or self.temperature == float('inf')):
      raise ValueError(f'sample.temperature must be a finite number > 0 (use sample.greedy=True '
                       f'for argmax decoding), got {self.temperature!r}.')
    if self.ordering not in _ORDERINGS:
      raise ValueError(f'sample.ordering must be one of {_ORDERINGS}, got {self.ordering!r}.')
    if self.level_context not in _LEVEL_CONTEXTS:
      raise ValueError(f'sample.level_context must be one of {_LEVEL_CONTEXTS}, got '
                       f'{self.level_context!r}.')
    w = self.hierarchy_weight
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < float('inf'):
      raise ValueError(f'sample.hierarchy_weight must be a finite number >= 0, got {w!r}.')
    if self.variant not in _VARIANTS:
      raise ValueError(f'model.variant must be one of {_VARIANTS}, got {self.variant!r}.')

  @classmethod
  def from_config(cls, config: Any) -> SampleConfig:
    """Builds the sampler settings from a full experiment config (`config.sample`, `config.model`).

    `model.mask_id == -1` means `model.vocab_size - 1` (configs/base.py).
    """
    for section in ('sample', 'model'):
      if not hasattr(config, section):
        raise ValueError(f'SampleConfig.from_config needs the full config with a `{section}` '
                         f'section; got {type(config).__name__} without it.')
    sm, m = config.sample, config.model
    mask_id = m.mask_id
    if mask_id == -1:
      _check_int('model.vocab_size', m.vocab_size, minimum=2)
      mask_id = m.vocab_size - 1
    elif (isinstance(mask_id, int) and hasattr(m, 'vocab_size')
          and not 0 <= mask_id < m.vocab_size):
      raise ValueError(f'model.mask_id must be -1 or in [0, model.vocab_size={m.vocab_size}), '
                       f'got {mask_id!r}.')
    return cls(
        num_steps=sm.num_steps,
        num_levels=m.num_levels,
        mask_id=mask_id,
        temperature=sm.temperature,
        greedy=sm.greedy,
        ordering=sm.ordering,
        use_cache=sm.use_cache,
        prior_corrected=m.prior_corrected_head,
        variant=m.variant,
        time_conditioning=m.time_conditioning,
        level_context=sm.get('level_context', 'candidates'),
        hierarchy_weight=float(sm.get('hierarchy_weight', 1.0)),
    )


class SampleOutput(NamedTuple):
  """What `sample` returns.

  tokens:      int32 [B, L], every position revealed (no mask_id left).
  levels:      int32 [B, L], the DRAWN levels in 0..K-1 (given positions: their given level).
  reveal_step: int32 [B, L], the n at which the position was revealed (1..T; T + 1 for given).
  nfe:         int32 [], apply_fn calls actually executed (whole batch = one call).
  nan_calls:   int32 [], executed calls that returned a NaN logit (the samples are then garbage;
               `check_finite` raises). Last, so the four design.md fields keep their positions.
  """
  tokens: jax.Array
  levels: jax.Array
  reveal_step: jax.Array
  nfe: jax.Array
  nan_calls: jax.Array


def check_finite(out: SampleOutput) -> SampleOutput:
  """Host-side: raises FloatingPointError if any network call of the run returned NaN logits."""
  bad = int(out.nan_calls)
  if bad:
    raise FloatingPointError(f'sampling: {bad} of {int(out.nfe)} network calls returned NaN '
                             'logits; the samples are invalid (check the checkpoint / dtype).')
  return out


def _check_int(field: str, value: Any, *, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f'{field} must be an integer >= {minimum}, got {value!r}.')


def _log(p: jax.Array) -> jax.Array:
  """log without warnings at 0 (-> -inf); negatives from round-off are treated as 0."""
  p = jnp.maximum(p, 0.0)
  return jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf)


def _step_level_weights(log_g: jax.Array, lam: jax.Array, active: jax.Array,
                        is_last: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Log reveal weights log(λ_k g^i_k) of one step and the log stay-masked mass.

  Args:
    log_g: [B, L, K] float32, log g (levels of a masked position).
    lam: [K], λ_k(s, t) (Algorithm 2 line 10).
    active: [K] bool, α_k(t) < 1 (level k can still be masked at t).
    is_last: [] bool, s == 0: everyone is revealed, g renormalised over the active levels (SPEC 7).

  Returns:
    log_w: [B, L, K] log reveal weight per level (sums to <= 1 over k; == 1 at the last step).
    log_stay: [B, L] log(1 - Σ_k w_k) (-inf at the last step).
  """

  def regular() -> tuple[jax.Array, jax.Array]:
    log_w = log_g + _log(lam)  # Algorithm 2 line 11
    pi = jnp.clip(jnp.sum(jnp.exp(log_w), axis=-1), 0.0, 1.0)
    return log_w, _log(1.0 - pi)

  def last() -> tuple[jax.Array, jax.Array]:
    # Allowed = active levels (all levels if none is active at t = 1/T).
    allowed = jnp.where(jnp.any(active), active, True)
    log_allowed = jnp.where(allowed, 0.0, -jnp.inf)
    log_w = log_g + log_allowed
    # All mass lost (g ≈ 0 on every allowed level): uniform over the allowed levels.
    lost = ~jnp.isfinite(jax.nn.logsumexp(log_w, axis=-1, keepdims=True))
    log_w = jnp.where(lost, log_allowed, log_w)
    log_w = log_w - jax.nn.logsumexp(log_w, axis=-1, keepdims=True)
    return log_w, jnp.full(log_w.shape[:-1], -jnp.inf, log_w.dtype)

  return jax.lax.cond(is_last, last, regular)


def _categorical_icdf(key: jax.Array, log_p: jax.Array) -> jax.Array:
  """One draw per row from a small categorical by inverse CDF: log_p [..., C] -> int32 [...].

  `log_p` may be unnormalised (finite maximum <= ~80 so that exp does not overflow).

  One uniform per row instead of C Gumbels (the draws run at every step on every position, and
  Gumbel noise dominated the sampler's cost). Used for C <= 64 classes (levels + stay; small
  vocabularies), where the float32 cumsum is accurate to ~1e-6 relative. Zero-probability
  classes are never returned: if round-off puts u at the total, the last class with positive mass
  is taken (so a zero 'stay' mass never leaves a position masked).
  """
  p = jnp.exp(log_p.astype(jnp.float32))
  c = jnp.cumsum(p, axis=-1)
  u = jax.random.uniform(key, p.shape[:-1], jnp.float32) * c[..., -1]
  idx = jnp.sum(c <= u[..., None], axis=-1)
  num = p.shape[-1]
  last_pos = num - 1 - jnp.argmax(jnp.flip(p > 0, axis=-1), axis=-1)
  return jnp.where(idx >= num, last_pos, idx).astype(jnp.int32)


_ICDF_MAX_CLASSES = 64


def _draw_tokens(key: jax.Array, token_logp: jax.Array, cfg: SampleConfig) -> jax.Array:
  """Tokens [B, L] from log f [B, L, V]: argmax (greedy) or a draw at temperature τ.

  Small vocabularies (V <= 64: toys, Sudoku) use the inverse CDF (one uniform per position); large
  ones use Gumbel-max, whose float32 accuracy does not degrade with V as a long cumsum would.
  """
  if cfg.greedy:
    return jnp.argmax(token_logp, axis=-1).astype(jnp.int32)
  logits = token_logp / cfg.temperature
  if logits.shape[-1] <= _ICDF_MAX_CLASSES:
    # Unnormalised is fine (the inverse CDF scales by the total); shift for exp's range.
    return _categorical_icdf(key, logits - jnp.max(logits, axis=-1, keepdims=True))
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _validate_given(given_tokens, given_levels, given_mask, batch_size: int, seq_len: int,
                    cfg: SampleConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Initial (x, h, given) [B, L]; all masked when nothing is given."""
  shape = (batch_size, seq_len)
  if given_mask is None:
    if given_tokens is not None or given_levels is not None:
      raise ValueError('sample: given_tokens/given_levels need given_mask [B, L] bool.')
    x = jnp.full(shape, cfg.mask_id, jnp.int32)
    h = jnp.full(shape, cfg.num_levels, jnp.int32)
    return x, h, jnp.zeros(shape, bool)
  if given_tokens is None:
    raise ValueError('sample: given_mask needs given_tokens [B, L] int32.')
  if given_levels is None:
    if cfg.num_levels > 1:
      raise ValueError('sample: given_mask with K > 1 needs given_levels [B, L] (the level '
                       'embedding of given positions, e.g. K-1 for Sudoku clues, SPEC 6).')
    given_levels = jnp.zeros(shape, jnp.int32)
  chex.assert_shape([given_tokens, given_levels, given_mask], shape)
  if not any(isinstance(a, jax.core.Tracer) for a in (given_tokens, given_levels, given_mask)):
    # Concrete inputs: check the values too (traced ones are the caller's responsibility).
    gm = np.asarray(given_mask, bool)
    gt, gl = np.asarray(given_tokens)[gm], np.asarray(given_levels)[gm]
    if np.any(gt == cfg.mask_id) or np.any(gt < 0):
      raise ValueError(f'sample: given_tokens must be real tokens (>= 0, != mask_id='
                       f'{cfg.mask_id}) at given positions.')
    if np.any((gl < 0) | (gl >= cfg.num_levels)):
      raise ValueError(f'sample: given_levels must lie in 0..{cfg.num_levels - 1} (model.num_levels'
                       f'={cfg.num_levels}) at given positions.')
  given_mask = jnp.asarray(given_mask, bool)
  x = jnp.where(given_mask, jnp.asarray(given_tokens, jnp.int32), cfg.mask_id)
  h = jnp.where(given_mask, jnp.asarray(given_levels, jnp.int32), cfg.num_levels)
  return x, h, given_mask


def sample(apply_fn: ApplyFn, key: jax.Array, schedule: Schedule, cfg: SampleConfig, *,
           batch_size: int, seq_len: int, given_tokens: jax.Array | None = None,
           given_levels: jax.Array | None = None, given_mask: jax.Array | None = None,
           mask_id: int | None = None, prior_corrected: bool | None = None) -> SampleOutput:
  """Draws `batch_size` sequences of length `seq_len` from the reverse process (SPEC 7).

  Args:
    apply_fn: the denoiser contract of docs/design.md (`heads`, `token_levels`).
    key: PRNG key.
    schedule: per-level schedule (SPEC 2) with `schedule.num_levels == cfg.num_levels`.
    cfg: `SampleConfig` (or a full experiment config, read with `SampleConfig.from_config`).
    batch_size, seq_len: B, L (static).
    given_tokens: int32 [B, L], tokens of the given positions (ignored elsewhere).
    given_levels: int32 [B, L], their levels (required when K > 1 and something is given).
    given_mask: bool [B, L], True where the position is given (never resampled).
    mask_id, prior_corrected: optional, for the design.md signature; must agree with `cfg`.

  Returns:
    SampleOutput (tokens, levels, reveal_step [B, L] int32; nfe, nan_calls [] int32).
  """
  if not isinstance(cfg, SampleConfig):
    cfg = SampleConfig.from_config(cfg)
  if mask_id is not None and mask_id != cfg.mask_id:
    raise ValueError(f'sample: mask_id={mask_id} disagrees with SampleConfig.mask_id='
                     f'{cfg.mask_id}.')
  if prior_corrected is not None and prior_corrected != cfg.prior_corrected:
    raise ValueError(f'sample: prior_corrected={prior_corrected} disagrees with '
                     f'SampleConfig.prior_corrected={cfg.prior_corrected}.')
  if schedule.num_levels != cfg.num_levels:
    raise ValueError(f'schedule has {schedule.num_levels} levels but model.num_levels='
                     f'{cfg.num_levels}.')
  _check_int('batch_size', batch_size, minimum=1)
  _check_int('seq_len', seq_len, minimum=1)

  num_steps, num_levels = cfg.num_steps, cfg.num_levels
  hier = num_levels > 1
  x0, h0, given = _validate_given(given_tokens, given_levels, given_mask, batch_size, seq_len, cfg)
  reveal0 = jnp.where(given, num_steps + 1, 0).astype(jnp.int32)

  def hier_out(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw hierarchy logits -> float32 [B, L, K] and whether any is NaN."""
    chex.assert_shape(logits, (batch_size, seq_len, num_levels))
    logits = logits.astype(jnp.float32)
    return logits, jnp.any(jnp.isnan(logits))

  def token_out(logits: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw token logits -> log f [B, L, V] (SUBS) and whether any logit is NaN."""
    chex.assert_rank(logits, 3)
    chex.assert_axis_dimension(logits, 0, batch_size)
    chex.assert_axis_dimension(logits, 1, seq_len)
    nan = jnp.any(jnp.isnan(logits))
    return parameterization.token_log_probs(logits, x, mask_id=cfg.mask_id), nan

  def pass1(x: jax.Array, h: jax.Array, t_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw hierarchy logits [B, L, K] float32 and whether any is NaN."""
    return hier_out(apply_fn(x, h, t_b, heads=('hier',))['hier'])

  def pass2(x: jax.Array, h_in: jax.Array, own_levels: jax.Array,
            t_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log f [B, L, V] (SUBS) and whether any logit is NaN.

    h_in: the backbone's levels; own_levels: h with the drawn / candidate levels (two_pass: the
    backbone input; single_pass: `token_levels` over the pass-1 inputs).
    """
    if hier and cfg.variant == 'single_pass':
      out = apply_fn(x, h_in, t_b, heads=('token',), token_levels=own_levels)
    else:
      out = apply_fn(x, own_levels if hier else h_in, t_b, heads=('token',))
    return token_out(out['token'], x)

  # Confidence ordering with level_context 'none': pass 2 sees exactly pass 1's inputs (x, h),
  # so ONE network call computes both heads (exact; half the calls of two separate passes).
  fused = hier and cfg.ordering == 'confidence' and cfg.level_context == 'none'

  def both_heads(x: jax.Array, h: jax.Array, t_b: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Raw hierarchy logits [B, L, K], log f [B, L, V] and NaN flag from one call on (x, h)."""
    extra = {'token_levels': h} if cfg.variant == 'single_pass' else {}
    out = apply_fn(x, h, t_b, heads=('hier', 'token'), **extra)
    logits, nan1 = hier_out(out['hier'])
    token_logp, nan2 = token_out(out['token'], x)
    return logits, token_logp, nan1 | nan2

  def step(carry, n):
    x, h, reveal, nfe, nan_calls, hier_cache, tok_cache, cache_valid = carry
    k_level, k_token = jax.random.split(jax.random.fold_in(key, n))
    t = n.astype(jnp.float32) / num_steps
    s = (n - 1).astype(jnp.float32) / num_steps
    t_b = jnp.full((batch_size,), t, jnp.float32)
    lam = schedule.reveal_prob(s, t).astype(jnp.float32)  # [K]
    active = schedule.one_minus_alpha(t) > 0  # [K]: α_k(t) < 1, as in reveal_prob
    is_last = n == 1
    masked = h == num_levels
    any_masked = jnp.any(masked)

    # Pass 1 -> log g [B, L, K] (K == 1: g ≡ 1, no call); fused: both heads in this call.
    if hier:
      if fused:
        call = lambda: both_heads(x, h, t_b)
      else:
        def call():
          logits, nan = pass1(x, h, t_b)
          return logits, tok_cache, nan
      cached = lambda: (hier_cache, tok_cache, jnp.zeros((), bool))
      if cfg.use_cache:
        reuse = cache_valid & (not cfg.time_conditioning)
        call1 = any_masked & ~reuse
        hier_logits, tok_cache, nan1 = jax.lax.cond(call1, call, cached)
        nfe = nfe + call1.astype(jnp.int32)
        cache_valid = cache_valid | call1
      else:
        hier_logits, tok_cache, nan1 = call()
        nfe = nfe + 1
      nan_calls = nan_calls + nan1.astype(jnp.int32)
      log_g = parameterization.level_log_probs(
          hier_logits, t_b, schedule, prior_corrected=cfg.prior_corrected)
    else:
      hier_logits = hier_cache
      log_g = jnp.zeros((batch_size, seq_len, 1), jnp.float32)
    log_w, log_stay = _step_level_weights(log_g, lam, active, is_last)

    if cfg.ordering == 'ancestral':
      # Algorithm 2 line 11: Cat(λ_0 g_0, …, λ_{K-1} g_{K-1}, stay) per masked position.
      logits = jnp.concatenate([log_w, log_stay[..., None]], axis=-1)
      drawn = _categorical_icdf(k_level, logits)
      reveal_now = masked & (drawn < num_levels)  # the set R
      pass2_levels = jnp.where(reveal_now, drawn, h)  # Algorithm 2 line 17: drawn levels at R
    else:
      pi = jnp.where(masked, jnp.sum(jnp.exp(log_w), axis=-1), 0.0)  # [B, L]
      cand = jnp.argmax(log_w, axis=-1).astype(jnp.int32)  # ĥ = argmax_k λ_k g_k
      eligible = masked & (pi > 0)
      n_elig = jnp.sum(eligible, axis=-1)
      planned = jnp.round(jnp.sum(pi, axis=-1)).astype(jnp.int32)
      count = jnp.where(is_last, jnp.sum(masked, axis=-1), jnp.maximum(planned, 1))
      count = jnp.minimum(count, n_elig)  # [B]
      reveal_now = None  # chosen after pass 2 (it needs the token confidence)
      pass2_levels = jnp.where(masked, cand, h)

    # Pass 2 -> tokens (and, for confidence ordering, the choice of positions).
    def tokens_and_reveal():
      if fused:
        token_logp, nan2 = tok_cache, jnp.zeros((), bool)
      else:
        token_logp, nan2 = pass2(x, h, pass2_levels, t_b)
      if cfg.ordering == 'ancestral':
        chosen = reveal_now
      else:
        conf = jnp.max(token_logp, axis=-1)  # log max_v f^i(v), untempered
        score = jnp.where(eligible, cfg.hierarchy_weight * _log(pi) + conf, -jnp.inf)
        order = jnp.argsort(-score, axis=-1, stable=True)
        rank = jnp.argsort(order, axis=-1)
        chosen = eligible & (rank < count[:, None])
      new_tok = _draw_tokens(k_token, token_logp, cfg)
      return jnp.where(chosen, new_tok, x), chosen, nan2

    if fused:  # no call of its own
      new_x, chosen, nan2 = tokens_and_reveal()
    elif cfg.use_cache:
      need2 = jnp.any(reveal_now) if cfg.ordering == 'ancestral' else jnp.any(count > 0)
      new_x, chosen, nan2 = jax.lax.cond(
          need2, tokens_and_reveal, lambda: (x, jnp.zeros_like(masked), jnp.zeros((), bool)))
      nfe = nfe + need2.astype(jnp.int32)
    else:
      new_x, chosen, nan2 = tokens_and_reveal()
      nfe = nfe + 1
    nan_calls = nan_calls + nan2.astype(jnp.int32)
    # Freeze the revealed pairs (Algorithm 2 line 21); pass2_levels: drawn / candidate levels.
    new_h = jnp.where(chosen, pass2_levels, h)
    reveal = jnp.where(chosen, n, reveal)
    # (x, h) changed -> the cached pass-1 logits are stale.
    cache_valid = cache_valid & ~jnp.any(chosen)
    return (new_x, new_h, reveal, nfe, nan_calls, hier_logits, tok_cache, cache_valid), None

  zero = jnp.zeros((), jnp.int32)
  # The token cache (fused calls only) needs the vocabulary size: read it off an abstract call.
  vocab = jax.eval_shape(lambda: both_heads(x0, h0, jnp.zeros((batch_size,), jnp.float32))
                         )[1].shape[-1] if fused else 1
  carry0 = (x0, h0, reveal0, zero, zero,
            jnp.zeros((batch_size, seq_len, num_levels), jnp.float32),
            jnp.zeros((batch_size, seq_len, vocab), jnp.float32), jnp.zeros((), bool))
  steps = jnp.arange(num_steps, 0, -1, dtype=jnp.int32)
  (x, h, reveal, nfe, nan_calls, _, _, _), _ = jax.lax.scan(step, carry0, steps)
  return SampleOutput(tokens=x, levels=h, reveal_step=reveal, nfe=nfe, nan_calls=nan_calls)


def make_sampler(apply_fn_builder: Callable[[Any], ApplyFn], schedule: Schedule,
                 cfg: SampleConfig, *, batch_size: int, seq_len: int,
                 check_ordering: str = 'error') -> Callable[..., SampleOutput]:
  """A jitted `fn(params, key, given_tokens=None, given_levels=None, given_mask=None)`.

  `apply_fn_builder(params)` returns the apply_fn, e.g.
  `functools.partial(make_apply_fn, model, train=False)` (params traced, so one compile serves
  every checkpoint). `check_ordering` (the config's `schedule.check_ordering`: 'error' | 'warn' |
  'off') validates Appendix D's reveal ordering on this sampling grid once, here (SPEC 2).
  """
  schedules.check_ordering(schedule, cfg.num_steps, check_ordering)

  @jax.jit
  def run(params, key, given_tokens=None, given_levels=None, given_mask=None) -> SampleOutput:
    return sample(apply_fn_builder(params), key, schedule, cfg, batch_size=batch_size,
                  seq_len=seq_len, given_tokens=given_tokens, given_levels=given_levels,
                  given_mask=given_mask)

  return run


def level_disagreement(drawn_levels: jax.Array, recomputed_levels: jax.Array,
                       where: jax.Array | None = None) -> jax.Array:
  """Share of positions whose drawn level differs from the level recomputed from the tokens.

  Args:
    drawn_levels, recomputed_levels: int [B, L].
    where: optional bool [B, L], positions to count (e.g. not given, not padding).

  Returns:
    float32 [] share in [0, 1] (0 when `where` selects nothing).
  """
  chex.assert_equal_shape([drawn_levels, recomputed_levels])
  diff = drawn_levels != recomputed_levels
  where = jnp.ones_like(diff) if where is None else jnp.asarray(where, bool)
  chex.assert_equal_shape([diff, where])
  return (jnp.sum(diff & where) / jnp.maximum(jnp.sum(where), 1)).astype(jnp.float32)
