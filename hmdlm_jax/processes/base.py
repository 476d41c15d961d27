"""The interface every forward process implements, and the pieces all processes share.

A *process* is a discrete diffusion forward process q(z_t | x0) together with everything that
depends on it: the training loss, the rigorous bound, the reverse (sampler) step and what the
network must output. Losses, samplers, evaluation and the exact-oracle tests (tests/oracle.py) only
ever talk to a `Process`; a new process is one module that subclasses it (docs/extending.md).

Shapes: B batch, L length, V the network's input vocabulary (words plus every noise state: MASK,
cluster tokens, mask tokens), S per-position states of the enumeration, K hierarchy levels.

The network (`apply_fn`, docs/design.md) sees a noisy state, `NoisyState`, as two int32 arrays
[B, L]: `tokens` (ids in 0..V-1, noise states included) and `levels` (HMDLM's level input 0..K,
K = h_m; zeros without levels). With `model.given_state` the given positions enter as level
K+1 = h_g (`with_given_state`, applied at the call only: states and outputs keep the data's levels).
"""

from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.config import SampleConfig

ApplyFn = Callable[..., Mapping[str, jax.Array]]
Batch = Mapping[str, Any]
BATCH_KEYS: tuple[str, ...] = ('tokens', 'levels', 'given', 'loss_mask')

_ICDF_MAX_CLASSES = 64


class NoisyState(NamedTuple):
  """A (noisy) state as the network sees it: tokens, levels int32 [..., L]."""
  tokens: jax.Array
  levels: jax.Array


class SamplerState(NamedTuple):
  """The carry of a reverse chain (`Process.reverse_step`).

  tokens:      int32 [B, L], the current state's tokens (noise states until revealed).
  levels:      int32 [B, L], the current level input (HMDLM; zeros otherwise).
  reveal_step: int32 [B, L], the step n at which a position reached a word (0 = not yet,
               T + 1 = given).
  nfe:         int32 [], network calls executed.
  nan_calls:   int32 [], executed calls that returned a NaN logit.
  extra:       process-specific carry (caches), any pytree.
  """
  tokens: jax.Array
  levels: jax.Array
  reveal_step: jax.Array
  nfe: jax.Array
  nan_calls: jax.Array
  extra: Any


class SampleOutput(NamedTuple):
  """What a sampler returns.

  tokens:      int32 [B, L], every position a word.
  levels:      int32 [B, L], HMDLM: the DRAWN levels in 0..K-1 (given positions: their level).
  reveal_step: int32 [B, L], the n at which the position was revealed (1..T; T + 1 for given).
  nfe:         int32 [], apply_fn calls actually executed (whole batch = one call).
  nan_calls:   int32 [], executed calls that returned a NaN logit (`check_finite` raises).
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


def raise_if_nonfinite(metrics: Mapping[str, Any], *, where: str = '') -> None:
  """Host-side check: raises FloatingPointError naming every NaN/Inf metric (e.g. 'hier=nan')."""
  bad = {k: float(v) for k, v in metrics.items()
         if np.ndim(v) == 0 and not np.isfinite(float(v))}
  if bad:
    detail = ', '.join(f'{k}={v}' for k, v in sorted(bad.items()))
    raise FloatingPointError(f'non-finite loss terms{" at " + where if where else ""}: {detail}')


def check_ordering(cfg: SampleConfig, orderings: tuple[str, ...], process: str) -> None:
  """sample.ordering must be one the process samples with (ValueError naming the field)."""
  if cfg.ordering not in orderings:
    raise ValueError(f"sample.ordering={cfg.ordering!r}: process.kind={process!r} samples with "
                     f'one of {orderings}.')


def unpack(batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(tokens, levels int [B, L], given, loss_mask bool [B, L]) of a batch, checked."""
  tokens = jnp.asarray(batch['tokens'])
  levels = jnp.asarray(batch['levels'])
  given = jnp.asarray(batch['given']).astype(bool)
  loss_mask = jnp.asarray(batch['loss_mask']).astype(bool)
  chex.assert_rank((tokens, levels, given, loss_mask), 2)
  chex.assert_equal_shape((tokens, levels, given, loss_mask))
  chex.assert_type((tokens, levels), int)
  return tokens, levels, given, loss_mask


def with_given_state(apply_fn: ApplyFn, given: jax.Array, num_levels: int) -> ApplyFn:
  """apply_fn whose `levels` (and `token_levels`) read h_g = K+1 at the given positions.

  given: bool [B, L] (clues, prompts); the wrapper calls `apply_fn` with the same arguments
  otherwise. The network must have been built with `model.given_state` (level tables of K+2 rows).
  """
  given = jnp.asarray(given, bool)
  h_g = num_levels + 1

  def wrapped(tokens: jax.Array, levels: jax.Array, t: jax.Array, *, heads: tuple[str, ...],
              token_levels: jax.Array | None = None, **kwargs: Any) -> Mapping[str, jax.Array]:
    chex.assert_equal_shape((given, levels))
    levels = jnp.where(given, jnp.asarray(h_g, levels.dtype), levels)
    if token_levels is not None:
      token_levels = jnp.where(given, jnp.asarray(h_g, token_levels.dtype), token_levels)
    return apply_fn(tokens, levels, t, heads=heads, token_levels=token_levels, **kwargs)

  return wrapped


def sample_times(key: jax.Array, batch_size: int, *, t_min: float = 1e-3,
                 antithetic: bool = True) -> jax.Array:
  """t ~ U(t_min, 1) per example: [B] float32 (docs/method.md §3).

  antithetic=True is MDLM's low-discrepancy (stratified) sampler: example i draws u_i ~ U(0, 1)
  inside its own stratum, ``v_i = (i + u_i) / B``, so the batch holds exactly one time per stratum
  of width 1/B. The batch mean of any f(t) stays unbiased for E_t f(t), with lower variance than
  i.i.d. draws. Then ``t = t_min + (1 - t_min) v``.
  """
  if not 0.0 <= t_min < 1.0:
    raise ValueError(f'loss.t_min={t_min} must lie in [0, 1).')
  u = jax.random.uniform(key, (batch_size,), jnp.float32)
  if antithetic:
    u = (jnp.arange(batch_size, dtype=jnp.float32) + u) / batch_size
    u = jnp.minimum(u, 1.0)  # guards (B-1+u)/B rounding up to 1 in float32
  return t_min + (1.0 - t_min) * u


def token_weighted_mean(values: jax.Array, loss_mask: jax.Array) -> jax.Array:
  """Σ_b N_b x_b / Σ_b N_b over [B] per-example values (N_b = loss positions): MDLM's batch mean."""
  n_b = loss_mask.sum(-1).astype(jnp.float32)
  return ((n_b / jnp.maximum(n_b.sum(), 1.0)) * values.astype(jnp.float32)).sum()


def log0(p: jax.Array) -> jax.Array:
  """log without warnings at 0 (-> -inf); negatives from round-off are treated as 0."""
  p = jnp.maximum(p, 0.0)
  return jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf)


def categorical_icdf(key: jax.Array, log_p: jax.Array) -> jax.Array:
  """One draw per row from a small categorical by inverse CDF: log_p [..., C] -> int32 [...].

  `log_p` may be unnormalised (finite maximum <= ~80 so that exp does not overflow). One uniform
  per row instead of C Gumbels (the draws run at every step on every position). Used for C <= 64
  classes, where the float32 cumsum is accurate to ~1e-6 relative. Zero-probability classes are
  never returned: if round-off puts u at the total, the last class with positive mass is taken.
  """
  p = jnp.exp(log_p.astype(jnp.float32))
  c = jnp.cumsum(p, axis=-1)
  u = jax.random.uniform(key, p.shape[:-1], jnp.float32) * c[..., -1]
  idx = jnp.sum(c <= u[..., None], axis=-1)
  num = p.shape[-1]
  last_pos = num - 1 - jnp.argmax(jnp.flip(p > 0, axis=-1), axis=-1)
  return jnp.where(idx >= num, last_pos, idx).astype(jnp.int32)


def nucleus_logits(logits: jax.Array, top_p: float, exclusive: bool = False) -> jax.Array:
  """Nucleus (top-p) truncation of logits [..., V]: -inf outside the nucleus, else unchanged.

  The nucleus of p = softmax(logits) is every v whose more probable tokens (p_u > p_v) hold
  less than top_p of the mass: the smallest most-probable set reaching top_p, with its boundary
  ties kept whole, so the result does not depend on how a sort orders ties (docs/method.md §8.5).
  `exclusive` (ReMDM's and ADLM's rule): v is kept iff those tokens and v itself hold at most
  top_p, so the token crossing top_p is dropped; the most probable token is always kept.
  """
  if top_p >= 1.0:
    return logits
  logits = logits.astype(jnp.float32)  # the cut in float32 whatever the compute dtype
  desc = -jnp.sort(-logits, axis=-1)  # [..., V] descending
  cum = jnp.cumsum(jax.nn.softmax(desc, axis=-1), axis=-1)
  # The first sorted position whose cumulative mass reaches top_p (the last if round-off keeps
  # the total below it); its logit is the smallest kept.
  if exclusive:  # the last sorted position whose cumulative mass is within top_p (at least one)
    k = jnp.maximum(jnp.sum(cum <= top_p, axis=-1, keepdims=True) - 1, 0)
  else:
    k = jnp.minimum(jnp.sum(cum < top_p, axis=-1, keepdims=True), logits.shape[-1] - 1)
  floor = jnp.take_along_axis(desc, k, axis=-1)
  return jnp.where(logits >= floor, logits, -jnp.inf)


def draw_tokens(key: jax.Array, token_logp: jax.Array, cfg: SampleConfig) -> jax.Array:
  """Tokens [B, L] from log f [B, L, V]: argmax (greedy) or a draw at temperature τ, then from
  the top-p nucleus of the tempered law when cfg.top_p < 1 (`nucleus_logits`).

  Small vocabularies (V <= 64: toys, grids) use the inverse CDF (one uniform per position); large
  ones use Gumbel-max, whose float32 accuracy does not degrade with V as a long cumsum would.
  """
  if cfg.greedy:
    return jnp.argmax(token_logp, axis=-1).astype(jnp.int32)
  logits = nucleus_logits(token_logp / cfg.temperature, cfg.top_p, cfg.nucleus == 'exclusive')
  if logits.shape[-1] <= _ICDF_MAX_CLASSES:
    return categorical_icdf(key, logits - jnp.max(logits, axis=-1, keepdims=True))
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


class Process(abc.ABC):
  """A forward process q(z_t | x0) and what depends on it (module docstring).

  Subclasses are frozen dataclasses (hashable or identity-hashed), built by
  `hmdlm_jax.processes.build(config)`.
  """

  name: ClassVar[str]

  # ------------------------------------------------------------------ what the network outputs

  @property
  @abc.abstractmethod
  def heads(self) -> tuple[str, ...]:
    """The apply_fn heads the process reads: 'token' ([B, L, V] logits), 'hier' ([B, L, K])."""

  @property
  def bound_kind(self) -> str:
    """What the bound is called in reports (HMDLM with K = 1 reports 'mdlm')."""
    return self.name

  @property
  def estimate_names(self) -> tuple[str, ...]:
    """The keys `estimates_from_state` returns (estimates that are not bounds)."""
    return ()

  @property
  def extra_batch_keys(self) -> Mapping[str, Any]:
    """Per-position batch arrays [B, L] beyond BATCH_KEYS that `prepare_batch` adds and `loss`
    reads, name -> dtype (ADLM's 'anchors'); the train step passes them on. Empty by default."""
    return {}

  @property
  def kinks(self) -> tuple[float, ...]:
    """Times in (0, 1) where the bound's integrand is not smooth (quadrature splits there)."""
    return ()

  def appended_row_members(self) -> tuple[int, np.ndarray] | None:
    """The vocabulary rows the process appends after its noise rows, as a warm start from a
    one-MASK source fills them (warm_start.py): (first row, float64 [n, V] weights, each row
    averaging its member words' rows), or None when it appends none (HDLM's cluster tokens)."""
    return None

  # ------------------------------------------------------------------------- forward process

  def prepare_batch(self, batch: Batch) -> dict[str, np.ndarray]:
    """Host side: the contract keys of a pipeline batch, adapted to the process (numpy).

    Default: processes without hierarchy levels see level 0 everywhere.
    """
    out = {k: np.asarray(batch[k]) for k in BATCH_KEYS}
    out['levels'] = np.zeros_like(out['levels'])
    return out

  @abc.abstractmethod
  def corrupt(self, key: jax.Array, batch: Batch, t: jax.Array) -> NoisyState:
    """z_t ~ q(z_t | x0) for t [B]: the noisy state [B, L] (given positions stay clean)."""

  @abc.abstractmethod
  def log_marginal(self, state: NoisyState, clean: NoisyState, t: jax.Array) -> jax.Array:
    """Per position log q(z_t^i = state^i | x0^i = clean^i) at time t: [..., L].

    `state` and `clean` broadcast against each other ([..., L]); t has the broadcast leading
    shape [...]. Exact oracles use this to build posteriors (tests/oracle.py); a state outside
    the forward process's support has log-probability -inf.
    """

  @abc.abstractmethod
  def state_candidates(self, clean: NoisyState) -> NoisyState:
    """Every state position i can take under q(· | x0): clean [..., L] -> [..., L, S]."""

  # ------------------------------------------------------------------------ loss and bound

  def for_devices(self, num_devices: int) -> Process:
    """The process as the train step on a mesh of `num_devices` devices runs it (settings that
    depend on the mesh are resolved here; e.g. HMDLM's `loss.token_rows`). Default: itself."""
    del num_devices
    return self

  @property
  def uses_target(self) -> bool:
    """Whether `loss` reads a target network θ̄ (e.g. consistency distillation); the train step
    then passes `target_apply_fn`, the network at `target_params`, without gradient."""
    return False

  def target_params(self, params: Any, ema_params: Any, opt_state: Any) -> Any:
    """θ̄, the parameters of the target network the next update's loss reads (`uses_target`),
    from the train state's params, their EMA and the optimiser state (traced in the step).
    Default: the EMA."""
    del params, opt_state
    return ema_params

  @abc.abstractmethod
  def loss(self, apply_fn: ApplyFn, batch: Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The training loss (float32 scalar) and float32 scalar metrics ('loss', 'finite', ...).

    step: the optimiser step (int32 []) for losses with a schedule over training (curricula,
    step sizes); target_apply_fn: the network at `target_params`, without gradient
    (`uses_target`).
    """

  @abc.abstractmethod
  def bound_from_state(self, apply_fn: ApplyFn, batch: Batch, state: NoisyState, t: jax.Array,
                       key: jax.Array) -> dict[str, jax.Array]:
    """One-sample rigorous bound at a given noisy state, per example.

    Returns a dict of [B]: 'total' (nats per loss position; its expectation over z_t ~ q and
    t ~ U(0, 1) upper-bounds -log p(x) / N), the terms that add up to it, and 'num_tokens' (N_b,
    loss positions; aggregate a data set as Σ total·N / Σ N).
    """

  def bound(self, apply_fn: ApplyFn, batch: Batch, key: jax.Array, t: jax.Array
            ) -> dict[str, jax.Array]:
    """`bound_from_state` at z_t ~ q(· | x0); key split as (corruption, the process's own)."""
    k_state, k_own = jax.random.split(key)
    return self.bound_from_state(apply_fn, batch, self.corrupt(k_state, batch, t), t, k_own)

  def estimates_from_state(self, apply_fn: ApplyFn, batch: Batch, state: NoisyState,
                           t: jax.Array) -> dict[str, jax.Array]:
    """Further per-example nats estimates at a noisy state that are NOT bounds, [B] each.

    Evaluation reports them beside the bound from the same z_t (common random numbers). None by
    default; HMDLM reports Appendix E's estimate.
    """
    del apply_fn, batch, state, t
    return {}

  # --------------------------------------------------------------------------------- sampling

  def check_sampling(self, cfg: SampleConfig) -> None:
    """Validates the sampler settings against the process (e.g. a schedule on its grid)."""
    del cfg

  @abc.abstractmethod
  def sampler_init(self, apply_fn: ApplyFn, cfg: SampleConfig, *, batch_size: int,
                   seq_len: int, given_tokens: jax.Array | None = None,
                   given_levels: jax.Array | None = None,
                   given_mask: jax.Array | None = None) -> SamplerState:
    """The terminal state z_1 of the reverse chain (given positions already revealed)."""

  @abc.abstractmethod
  def reverse_step(self, apply_fn: ApplyFn, cfg: SampleConfig, key: jax.Array,
                   state: SamplerState, n: jax.Array) -> SamplerState:
    """One reverse step from t_n = n/T to s = (n-1)/T; `key` is the run's key (fold in n)."""

  def sample(self, apply_fn: ApplyFn, key: jax.Array, cfg: SampleConfig, *, batch_size: int,
             seq_len: int, given_tokens: jax.Array | None = None,
             given_levels: jax.Array | None = None,
             given_mask: jax.Array | None = None) -> SampleOutput:
    """Runs the reverse chain n = T..1 in one `jax.lax.scan` (jit it in the caller)."""
    state = self.sampler_init(apply_fn, cfg, batch_size=batch_size, seq_len=seq_len,
                              given_tokens=given_tokens, given_levels=given_levels,
                              given_mask=given_mask)
    return run_chain(lambda st, n: self.reverse_step(apply_fn, cfg, key, st, n), state,
                     cfg.num_steps)


def run_chain(step: Callable[[SamplerState, jax.Array], SamplerState], state: SamplerState,
              num_steps: int) -> SampleOutput:
  """`state = step(state, n)` for n = T..1 in one `jax.lax.scan`; the final state's output."""

  def body(carry: SamplerState, n: jax.Array) -> tuple[SamplerState, None]:
    return step(carry, n), None

  steps = jnp.arange(num_steps, 0, -1, dtype=jnp.int32)
  state, _ = jax.lax.scan(body, state, steps)
  return SampleOutput(tokens=state.tokens, levels=state.levels, reveal_step=state.reveal_step,
                      nfe=state.nfe, nan_calls=state.nan_calls)


def make_sampler(process: Process, apply_fn_builder: Callable[[Any], ApplyFn],
                 cfg: SampleConfig, *, batch_size: int, seq_len: int
                 ) -> Callable[..., SampleOutput]:
  """A jitted `fn(params, key, given_tokens=None, given_levels=None, given_mask=None)`.

  `apply_fn_builder(params)` returns the apply_fn, e.g.
  `functools.partial(make_apply_fn, model, train=False)` (params traced, so one compile serves
  every checkpoint). The process validates the settings first (`check_sampling`).
  """
  process.check_sampling(cfg)

  @jax.jit
  def run(params, key, given_tokens=None, given_levels=None, given_mask=None) -> SampleOutput:
    return process.sample(apply_fn_builder(params), key, cfg, batch_size=batch_size,
                          seq_len=seq_len, given_tokens=given_tokens, given_levels=given_levels,
                          given_mask=given_mask)

  return run
