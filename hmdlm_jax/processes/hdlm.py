"""HDLM: the word -> cluster -> MASK forward process, its closed-form NELBO and training losses.

Paper: Zhou et al., "Next Semantic Scale Prediction via Hierarchical Diffusion Language Models"
(NeurIPS 2025, arXiv 2510.08632); the method, its derivation and our decisions are stated in
docs/method.md §13.1. Schedule, id layout and parameterisation: processes/hdlm_core.py; sampler:
processes/hdlm_sampler.py; the token -> cluster artefact (k-means): hmdlm_jax/data/clusters.py.

Per loss position the bound is w_m · KL(π_x ‖ Q_θ) in the MASK state, w_c · (-log Y_θ(x)) in a
cluster state and 0 as a word, normalised per loss position with MDLM's token-weighted batch
mean: the exact continuous-time ELBO for every ξ ∈ (0, 1] (tests/test_hdlm.py: bound = -log p(x)
with the exact denoiser). The training loss (`loss`) adds the options of docs/method.md §13.1:
weight clipping, the authors' approximate ξ < 1 loss, 'hard training' and the auxiliary cluster
head; the metrics report the unclipped exact bound of the same sample as 'nelbo'.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import storage
from hmdlm_jax.config import HDLMConfig
from hmdlm_jax.config import hdlm_config
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.data import clusters
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hdlm_core
from hmdlm_jax.processes import hdlm_sampler
from hmdlm_jax.processes.hdlm_core import ClusterLayout
from hmdlm_jax.processes.hdlm_core import HDLMSchedule

ApplyFn = base.ApplyFn


def corrupt(key: jax.Array, tokens: jax.Array, given: jax.Array, t: jax.Array,
            schedule: HDLMSchedule, layout: ClusterLayout, xi: float) -> jax.Array:
  """z_t ~ q(z_t | x) per position: MASK w.p. β_m, a cluster w.p. β_c, the word w.p. α.

  One uniform r per position decides the state (MASK if r < β_m, cluster if r < β_m + β_c): for
  one cluster (merged) this is HMDLM's K = 1 draw `r < 1 - α` with the same key, bit for bit. The
  cluster is c(x) w.p. ξ, else uniform over the other n - 1 (a second uniform, key fold 1).

  Args:
    key: PRNG key.
    tokens: int [B, L] clean words x.
    given: bool [B, L], never corrupted.
    t: [B] times.
  Returns:
    int32 [B, L] noisy tokens (words, MASK, cluster ids).
  """
  chex.assert_rank((tokens, given), 2)
  chex.assert_equal_shape((tokens, given))
  chex.assert_rank(t, 1)
  chex.assert_equal_shape_prefix((tokens, t), 1)
  m = schedule.marginals(t)
  beta_m, beta_c = m.beta_m[:, None], m.beta_c[:, None]
  r = jax.random.uniform(key, tokens.shape, beta_c.dtype)
  noisy = ~given.astype(bool)
  to_mask = noisy & (r < beta_m)
  to_cluster = noisy & ~to_mask & (r < beta_m + beta_c)
  own = jnp.maximum(layout.word_cluster(tokens), 0)
  if xi < 1.0:
    v = jax.random.uniform(jax.random.fold_in(key, 1), tokens.shape, beta_c.dtype)
    n = layout.num_clusters
    j = jnp.clip(jnp.floor((v - xi) / (1.0 - xi) * (n - 1)), 0, n - 2).astype(jnp.int32)
    own = jnp.where(v < xi, own, j + (j >= own))
  out = jnp.where(to_cluster, layout.cluster_token(own), tokens)
  return jnp.where(to_mask, layout.mask_id, out).astype(jnp.int32)


def bound_force(force: str, xi: float) -> str:
  """The law at cluster states that the bound and the 'elbo' loss use for a configured force.

  'within' with ξ < 1 gives a perturbed state's true word probability 0 (an infinite bound), so
  the bound uses 'between' there; the sampler keeps 'within', as the authors sample their ξ = 0.9
  runs (docs/method.md §13.1).
  """
  return 'between' if force == 'within' and xi < 1.0 else force


def position_terms(token_logits: jax.Array, tokens: jax.Array, state: jax.Array,
                   layout: ClusterLayout, *, xi: float, force: str, objective: str = 'elbo',
                   hard: bool = False) -> tuple[jax.Array, jax.Array]:
  """Unweighted per-position terms at MASK and at cluster positions: ([B, L], [B, L]).

  objective='elbo' gives the exact ELBO's terms (module docstring); 'approx' the authors'
  simplified ξ < 1 loss: MASK ξ (-log P̃), own cluster -log x̂(x) + log P̃, wrong cluster
  -log x̂(x), with P̃ = Q_θ(c(x)) / ξ. hard: the MASK term is the word cross-entropy -log x̂(x).
  Values off the respective states are meaningless (callers select).
  """
  chex.assert_equal_shape((tokens, state))
  force = bound_force(force, xi)
  is_c = layout.is_cluster(state)
  gold_c = jnp.maximum(layout.word_cluster(tokens), 0)
  state_c = layout.state_cluster(state)
  ref = jnp.where(is_c, state_c, gold_c)
  nll = hdlm_core.gold_nll(token_logits, tokens, ref, layout)
  n = layout.num_clusters
  if xi < 1.0:
    p = hdlm_core.cluster_probs(hdlm_core.word_log_probs(token_logits, layout), layout)
    log_q = jnp.log(hdlm_core.perturbed(p, xi, n))  # [B, L, n], Q >= min(ξ, κ) > 0
    log_q_gold = jnp.take_along_axis(log_q, gold_c[..., None], axis=-1)[..., 0]
  if hard:
    mask_term = nll.word
  elif xi == 1.0:
    mask_term = nll.cluster
  elif objective == 'approx':
    mask_term = xi * (np.log(xi) - log_q_gold)
  else:  # KL(π_x || Q) = CE(π_x, Q) - H(π_x)
    kappa = (1.0 - xi) / (n - 1)
    ce = -((xi - kappa) * log_q_gold + kappa * log_q.sum(-1))
    mask_term = ce + xi * np.log(xi) + (1.0 - xi) * np.log(kappa)
  own = state_c == gold_c
  if objective == 'approx' and xi < 1.0:
    cluster_term = jnp.where(own, nll.word + log_q_gold - np.log(xi), nll.word)
  elif force == 'none':
    cluster_term = nll.word
  elif force == 'within' or xi == 1.0:
    cluster_term = nll.within
  else:  # 'between': mass ξ inside the state's cluster, 1 - ξ outside
    log_p = -nll.cluster  # log P_θ(state cluster)
    cluster_term = jnp.where(own, nll.word - np.log(xi) + log_p,
                             nll.word - np.log1p(-xi) + hdlm_core.log1mexp(log_p))
  return mask_term, cluster_term


def weighted_terms(mask_term: jax.Array, cluster_term: jax.Array, state: jax.Array,
                   loss_mask: jax.Array, w_m: jax.Array, w_c: jax.Array,
                   layout: ClusterLayout) -> dict[str, jax.Array]:
  """Per-example 'cluster' (MASK positions) and 'word' (cluster positions) terms: [B] each.

  Sums over loss positions in the state, weights w [B] applied after selecting (a non-finite
  value at an unused position cannot leak), divided by max(#loss positions, 1).
  """
  chex.assert_rank((mask_term, cluster_term, state, loss_mask), 2)
  chex.assert_equal_shape((mask_term, cluster_term, state, loss_mask))
  loss_mask = loss_mask.astype(bool)
  n = jnp.maximum(loss_mask.sum(-1), 1).astype(w_c.dtype)
  sel_m = loss_mask & layout.is_mask(state)
  sel_c = loss_mask & layout.is_cluster(state)
  zero = jnp.zeros_like(mask_term)
  cluster = w_m[:, None] * jnp.where(sel_m, mask_term, zero)
  word = w_c[:, None] * jnp.where(sel_c, cluster_term, zero)
  return dict(cluster=cluster.sum(-1) / n, word=word.sum(-1) / n)


def aux_terms(cluster_logits: jax.Array, tokens: jax.Array, state: jax.Array,
              loss_mask: jax.Array, layout: ClusterLayout) -> jax.Array:
  """The auxiliary head's cross-entropy -log softmax(cluster_logits)[c(x)] per example: [B].

  cluster_logits [B, L, n]. Selected and normalised exactly as the bound's MASK term
  (`weighted_terms` with weight 1): summed over loss positions in the MASK state, divided by
  max(#loss positions, 1).
  """
  chex.assert_rank(cluster_logits, 3)
  gold = jnp.maximum(layout.word_cluster(tokens), 0)
  log_p = jax.nn.log_softmax(cluster_logits.astype(jnp.float32), axis=-1)
  ce = -jnp.take_along_axis(log_p, gold[..., None], axis=-1)[..., 0]
  one = jnp.ones(tokens.shape[:1], jnp.float32)
  return weighted_terms(ce, jnp.zeros_like(ce), state, loss_mask, one, one, layout)['cluster']


def layout_from_config(cfg: HDLMConfig) -> ClusterLayout:
  """The process's id layout: the artefact of `cfg.clusters` (or the fallback) over the words.

  Word ids are [0, vocab_size - cluster rows) without MASK; the artefact must cover every word id
  and no cluster row (its entry at MASK, if any, is ignored).
  """
  v, n = cfg.vocab_size, cfg.num_clusters
  r = v - cfg.cluster_rows  # ids before the cluster rows
  words = np.ones(r, bool)
  words[cfg.mask_id] = False
  need = int(np.flatnonzero(words).max()) + 1
  if n == 1:
    mapping = np.zeros(r, np.int32)
  elif cfg.clusters:
    if not storage.isfile(cfg.clusters):
      raise ValueError(f'process.hdlm.clusters={cfg.clusters!r} does not exist; build it with '
                       'python -m hmdlm_jax.data.clusters (its docstring).')
    art = clusters.load(cfg.clusters)
    if art.num_clusters != n:
      raise ValueError(f'process.hdlm.clusters={cfg.clusters!r} has {art.num_clusters} clusters '
                       f'but process.hdlm.num_clusters={n}.')
    mapping = art.token_to_cluster
    if not need <= len(mapping) <= r:
      raise ValueError(f'process.hdlm.clusters={cfg.clusters!r} maps {len(mapping)} tokens but '
                       f'the vocabulary has {need} word ids (model.vocab_size={v} with {n} '
                       'cluster rows): built for another tokenizer?')
  elif cfg.fallback == 'id':
    mapping = np.zeros(r, np.int32)
    mapping[words] = clusters.fallback_clusters(int(words.sum()), n, 'id')
  else:
    raise ValueError("process.hdlm.clusters is '' and process.hdlm.fallback='error'; build an "
                     'artefact with python -m hmdlm_jax.data.clusters.')
  cluster_of = np.full(v, -1, np.int32)
  ids = np.flatnonzero(words)
  cluster_of[ids] = mapping[ids]
  return ClusterLayout(cluster_of, n, cfg.mask_id)


@dataclasses.dataclass(frozen=True, eq=False)
class HDLM(base.Process):
  """HDLM behind the `Process` interface (identity-hashed: it holds the cluster layout).

  Attributes:
    cfg: the static settings (config.HDLMConfig; force already resolved from 'auto').
    layout: the word / MASK / cluster id layout with every word's cluster.
  """
  cfg: HDLMConfig
  layout: ClusterLayout
  name: ClassVar[str] = 'hdlm'

  def __post_init__(self) -> None:
    c, lay = self.cfg, self.layout
    if (lay.num_clusters, lay.vocab_size, lay.mask_id) != (c.num_clusters, c.vocab_size,
                                                           c.mask_id):
      raise ValueError(f'HDLM: the cluster layout ({lay.num_clusters} clusters, {lay.vocab_size} '
                       f'rows, MASK {lay.mask_id}) does not match the config ({c.num_clusters}, '
                       f'{c.vocab_size}, {c.mask_id}).')
    if c.force == 'auto':
      raise ValueError("HDLM: resolve process.hdlm.force='auto' first (config.hdlm_config).")

  @classmethod
  def from_config(cls, config: config_lib.Config) -> HDLM:
    """The process of an experiment config: settings, and the cluster artefact (or fallback)."""
    cfg = hdlm_config(config)
    return cls(cfg, layout_from_config(cfg))

  @property
  def schedule(self) -> HDLMSchedule:
    return HDLMSchedule(self.cfg.gamma, self.cfg.eps, merged=self.cfg.num_clusters == 1)

  @property
  def heads(self) -> tuple[str, ...]:
    return ('token', 'cluster') if self.cfg.aux_weight > 0 else ('token',)

  def appended_row_members(self) -> tuple[int, np.ndarray]:
    # The authors start the cluster rows at the k-means centroids of the embedding the clusters
    # were built from: each the mean of its member words' rows (docs/method.md §13.1).
    lay = self.layout
    member = (lay.cluster_of[None, :] == np.arange(lay.num_clusters)[:, None]).astype(np.float64)
    member /= member.sum(-1, keepdims=True)  # [n, V] rows average the members
    return lay.cluster_offset, member

  # ------------------------------------------------------------------------- forward process

  def corrupt(self, key: jax.Array, batch: base.Batch, t: jax.Array) -> base.NoisyState:
    tokens, levels, given, _ = base.unpack(batch)
    z = corrupt(key, tokens, given, t, self.schedule, self.layout, self.cfg.xi)
    return base.NoisyState(z, jnp.zeros_like(levels))

  def log_marginal(self, state: base.NoisyState, clean: base.NoisyState,
                   t: jax.Array) -> jax.Array:
    """log q(z^i | x^i): log α (the word), log β_m (MASK), log β_c + log π_x(c) (cluster c)."""
    m = self.schedule.marginals(jnp.asarray(t))
    lay, xi = self.layout, self.cfg.xi
    z, x = state.tokens, clean.tokens
    own = lay.state_cluster(z) == lay.word_cluster(x)
    if xi == 1.0:
      log_pi = jnp.where(own, 0.0, -jnp.inf)
    else:
      kappa = (1.0 - xi) / (lay.num_clusters - 1)
      log_pi = jnp.where(own, np.log(xi), np.log(kappa))
    lc = base.log0(m.beta_c)[..., None] + log_pi
    lm = base.log0(m.beta_m)[..., None]
    la = base.log0(m.alpha)[..., None]
    out = jnp.where(lay.is_cluster(z), lc, jnp.where(lay.is_mask(z), lm, -jnp.inf))
    return jnp.where(z == x, la, out)

  def state_candidates(self, clean: base.NoisyState) -> base.NoisyState:
    """Word, MASK (unless merged) and the own cluster (ξ = 1) or every cluster (ξ < 1)."""
    x, lay = clean.tokens, self.layout
    cands = [x]
    if not lay.merged:
      cands.append(jnp.full_like(x, lay.mask_id))
    if self.cfg.xi == 1.0:
      cands.append(lay.cluster_token(jnp.maximum(lay.word_cluster(x), 0)).astype(x.dtype))
    else:
      cands += [jnp.full_like(x, lay.cluster_offset + c) for c in range(lay.num_clusters)]
    tokens = jnp.stack(cands, -1)
    return base.NoisyState(tokens, jnp.zeros_like(tokens))

  # ------------------------------------------------------------------------ loss and bound

  def _logits(self, apply_fn: ApplyFn, z: jax.Array, t: jax.Array) -> jax.Array:
    return apply_fn(z, jnp.zeros_like(z), t, heads=('token',))['token']

  def bound_terms(self, token_logits: jax.Array, tokens: jax.Array, state: jax.Array,
                  loss_mask: jax.Array, t: jax.Array) -> dict[str, jax.Array]:
    """The exact bound's 'cluster' and 'word' terms [B] at a state (unclipped weights)."""
    mask_t, clus_t = position_terms(token_logits, tokens, state, self.layout, xi=self.cfg.xi,
                                    force=self.cfg.force)
    w_m, w_c = self.schedule.weights(t)
    return weighted_terms(mask_t, clus_t, state, loss_mask, w_m, w_c, self.layout)

  def training_terms(self, token_logits: jax.Array, tokens: jax.Array, state: jax.Array,
                     loss_mask: jax.Array, t: jax.Array) -> dict[str, jax.Array]:
    """The training loss's terms [B]: clipping, the ξ < 1 loss choice, hard training."""
    c = self.cfg
    mask_t, clus_t = position_terms(token_logits, tokens, state, self.layout, xi=c.xi,
                                    force=c.force, objective=c.xi_loss, hard=c.hard_training)
    w_m, w_c = self.schedule.weights(t)
    if c.clip_weights:
      w_m, w_c = (jnp.clip(w, c.weight_min, c.weight_max) for w in (w_m, w_c))
    return weighted_terms(mask_t, clus_t, state, loss_mask, w_m, w_c, self.layout)

  def loss(self, apply_fn: ApplyFn, batch: base.Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One network call on z_t ~ q; the key is split as HMDLM's (k_t, k_mask, unused).

    Metrics: 'loss', 'cluster', 'word' (training terms), 'nelbo' (the exact bound of the same
    sample), 'mask_rate', 'cluster_rate', 'num_loss_tokens', 'finite'; with aux_weight > 0 also
    'aux' (the auxiliary head's cross-entropy, before its weight).
    """
    del step, target_apply_fn
    tokens, _, given, loss_mask = base.unpack(batch)
    k_t, k_mask, _ = jax.random.split(key, 3)
    t = base.sample_times(k_t, tokens.shape[0], t_min=self.cfg.t_min,
                          antithetic=self.cfg.antithetic)
    z = corrupt(k_mask, tokens, given, t, self.schedule, self.layout, self.cfg.xi)
    out = apply_fn(z, jnp.zeros_like(z), t, heads=self.heads)
    logits = out['token']
    terms = self.training_terms(logits, tokens, z, loss_mask, t)
    bound = self.bound_terms(logits, tokens, z, loss_mask, t)
    mean = lambda v: base.token_weighted_mean(v, loss_mask)
    cluster, word = mean(terms['cluster']), mean(terms['word'])
    loss = cluster + word
    extra = {}
    if self.cfg.aux_weight > 0:
      extra['aux'] = mean(aux_terms(out['cluster'], tokens, z, loss_mask, self.layout))
      loss = loss + self.cfg.aux_weight * extra['aux']
    n_loss = jnp.maximum(loss_mask.sum(), 1).astype(jnp.float32)
    metrics = dict(
        loss=loss, cluster=cluster, word=word,
        nelbo=mean(bound['cluster']) + mean(bound['word']),
        mask_rate=(self.layout.is_mask(z) & loss_mask).sum().astype(jnp.float32) / n_loss,
        cluster_rate=(self.layout.is_cluster(z) & loss_mask).sum().astype(jnp.float32) / n_loss,
        num_loss_tokens=loss_mask.sum().astype(jnp.float32), **extra)
    metrics['finite'] = jnp.all(jnp.isfinite(jnp.stack([loss, cluster, word]))).astype(
        jnp.float32)
    return loss.astype(jnp.float32), {k: v.astype(jnp.float32) for k, v in metrics.items()}

  def bound_from_state(self, apply_fn: ApplyFn, batch: base.Batch, state: base.NoisyState,
                       t: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
    """The exact bound at z_t (deterministic; `key` unused): 'cluster', 'word', 'total',
    'num_tokens', each [B] (float64 if t is)."""
    del key
    tokens, _, _, loss_mask = base.unpack(batch)
    chex.assert_equal_shape((tokens, state.tokens))
    logits = self._logits(apply_fn, state.tokens, t)
    terms = self.bound_terms(logits, tokens, state.tokens, loss_mask, t)
    terms['total'] = terms['cluster'] + terms['word']
    terms['num_tokens'] = loss_mask.sum(-1).astype(terms['total'].dtype)
    return terms

  # --------------------------------------------------------------------------------- sampling

  def check_sampling(self, cfg: SampleConfig) -> None:
    hdlm_sampler.check_config(self.layout, cfg)

  def sampler_init(self, apply_fn: ApplyFn, cfg: SampleConfig, *, batch_size: int,
                   seq_len: int, given_tokens: jax.Array | None = None,
                   given_levels: jax.Array | None = None,
                   given_mask: jax.Array | None = None) -> base.SamplerState:
    del apply_fn, given_levels  # no levels: HDLM's hierarchy is on the vocabulary
    return hdlm_sampler.init(self.layout, cfg, batch_size=batch_size, seq_len=seq_len,
                             given_tokens=given_tokens, given_mask=given_mask)

  def reverse_step(self, apply_fn: ApplyFn, cfg: SampleConfig, key: jax.Array,
                   state: base.SamplerState, n: jax.Array) -> base.SamplerState:
    return hdlm_sampler.reverse_step(apply_fn, self.schedule, self.layout, self.cfg, cfg, key,
                                     state, n)


def from_config(config: config_lib.Config) -> HDLM:
  """The registry's builder (processes/__init__.py)."""
  return HDLM.from_config(config)


__all__ = ['HDLM', 'aux_terms', 'corrupt', 'from_config', 'layout_from_config',
           'position_terms', 'weighted_terms']
