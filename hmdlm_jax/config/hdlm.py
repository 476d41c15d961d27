"""The HDLM section of the config (`process.hdlm.*`, docs/method.md §13.1): its frozen view.

A leaf of hmdlm_jax/config, which re-exports `HDLMConfig` and `hdlm_cluster_rows` and lists
`derived_model_fields` and `check_section` in its table of process kinds (so `config.resolve`
derives and validates the section with the rest of the config); `processes/hdlm.py` builds the
process from it.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from hmdlm_jax.config.checks import check_bool
from hmdlm_jax.config.checks import check_int
from hmdlm_jax.config.checks import check_number

HDLM_FORCE = ('auto', 'within', 'between', 'none')
HDLM_XI_LOSS = ('elbo', 'approx')
HDLM_SAMPLERS = ('first_order', 'posterior')
HDLM_FINAL_STEP = ('argmax', 'sample')
HDLM_FALLBACK = ('id', 'error')
HDLM_CLUSTER_DRAW = ('clean', 'perturbed', 'aux')


@dataclasses.dataclass(frozen=True)
class HDLMSection:
  """`process.hdlm`: HDLM (process.kind='hdlm'; needs model.num_levels=1). The token table is
  words, MASK, then the num_clusters cluster tokens as its LAST rows: model.vocab_size = words +
  1 + num_clusters (one cluster is identified with MASK: vocab_size = words + 1, exactly MDLM
  for gamma = 1)."""
  num_clusters: int = 64  # n; the paper's best are 64-128 for GPT-2's 50k tokens
  gamma: float = 1.0  # α_t = (1 - t)^γ (γ = 1: the paper's OWT runs)
  eps: float = 1e-4  # time floor: the process runs on τ = (1 - eps) t, so α(1) = eps^γ
  xi: float = 1.0  # stochastic perturbation: own cluster w.p. ξ, each other w.p. (1-ξ)/(n-1)
  clusters: str = ''  # token -> cluster .npz (python -m hmdlm_jax.data.clusters); '' = fallback
  fallback: str = 'id'  # without `clusters`: 'id' (contiguous id blocks) | 'error'
  force: str = 'auto'  # cluster positions: 'auto' (within for ξ = 1, between for ξ < 1) | 'within'
  #                   | 'between' | 'none'; 'within' with ξ < 1 samples within (the authors' ξ = 0.9
  #                   runs), its bound and 'elbo' loss use 'between' (within's is infinite there)
  xi_loss: str = 'elbo'  # ξ < 1 training loss: 'elbo' (exact) | 'approx' (the authors' simplified)
  hard_training: bool = False  # ablation: word CE instead of cluster CE at MASK positions
  clip_weights: bool = False  # training only: clip w_m, w_c to [weight_min, weight_max]
  weight_min: float = 0.0  # (γ = 1 with weight_max = 2: both weights are always 2)
  weight_max: float = 2.0
  sampler: str = 'first_order'  # 'first_order' (the authors' jumps) | 'posterior' (exact posterior)
  final_step: str = 'argmax'  # last reverse step: 'argmax' (the authors') | 'sample'
  cluster_draw: str = 'clean'  # MASK -> cluster from 'clean' P_θ (authors') | 'perturbed' Q_θ (ξ < 1)
  #                           | 'aux' the auxiliary cluster head (needs aux_weight > 0)
  aux_weight: float = 0.0  # > 0: an auxiliary cluster head [B, L, n] trained by this weight × its
  #                     cross-entropy at MASK positions (the authors' option; off in every config)


@dataclasses.dataclass(frozen=True)
class HDLMConfig:
  """Static settings of the HDLM process (`process.hdlm.*`, docs/method.md §13.1); hashable.

  Attributes:
    num_clusters: n cluster tokens (1 = MDLM: the single cluster is identified with MASK).
    gamma: γ > 0 of α_t = (1 - t)^γ.
    eps: the time floor: the process runs on τ = (1 - eps) t, so α(1) = eps^γ.
    xi: ξ in (0, 1], the probability that a token's cluster state is its own cluster.
    clusters: path of the token -> cluster artefact (hmdlm_jax/data/clusters.py); ''
      uses `fallback`.
    fallback: 'id' (contiguous blocks of token ids) | 'error' when `clusters` is ''.
    force: the parameterisation at cluster positions, resolved: 'within' (ξ = 1), 'between'
      (ξ < 1) or 'none' (the raw token head); 'auto' resolves to within / between
      (config.hdlm_config builds the view of a whole config). 'within' with ξ < 1 is the
      authors' sampling law; the bound then uses 'between' (hdlm.bound_force).
    xi_loss: ξ < 1 training loss: 'elbo' (the exact ELBO) | 'approx' (the authors' simplified one).
    hard_training: the word cross-entropy replaces the cluster one at MASK positions (ablation).
    clip_weights, weight_min, weight_max: training-only clipping of w_m and w_c.
    sampler: 'first_order' (the authors' jumps) | 'posterior' (exact per-position posterior).
    final_step: the last reverse step: 'argmax' (the authors') | 'sample'.
    cluster_draw: MASK -> cluster draws from 'clean' P_θ (the authors') | 'perturbed' Q_θ |
      'aux' the auxiliary cluster head's softmax (the authors' `use_auxiliary`).
    aux_weight: weight of the auxiliary cluster head's cross-entropy at MASK positions (0 = no
      head; > 0 adds the head, model.cluster_head = n, and the term to the training loss only).
    t_min, antithetic: t ~ U(t_min, 1), stratified across the batch (loss section).
    mask_id, vocab_size: resolved MASK id and the table size (words + MASK + clusters).
  """
  num_clusters: int = HDLMSection.num_clusters
  gamma: float = HDLMSection.gamma
  eps: float = HDLMSection.eps
  xi: float = HDLMSection.xi
  clusters: str = HDLMSection.clusters
  fallback: str = HDLMSection.fallback
  force: str = 'within'
  xi_loss: str = HDLMSection.xi_loss
  hard_training: bool = HDLMSection.hard_training
  clip_weights: bool = HDLMSection.clip_weights
  weight_min: float = HDLMSection.weight_min
  weight_max: float = HDLMSection.weight_max
  sampler: str = HDLMSection.sampler
  final_step: str = HDLMSection.final_step
  cluster_draw: str = HDLMSection.cluster_draw
  aux_weight: float = HDLMSection.aux_weight
  t_min: float = 1e-4
  antithetic: bool = True
  mask_id: int = 0
  vocab_size: int = 2

  def __post_init__(self) -> None:
    f = 'process.hdlm.'
    check_int(f + 'num_clusters', self.num_clusters, minimum=1)
    check_number(f + 'gamma', self.gamma, lo=0.0, lo_open=True)
    check_number(f + 'eps', self.eps, lo=0.0, hi=1.0)
    check_number(f + 'xi', self.xi, lo=0.0, hi=1.0, lo_open=True, hi_open=False)
    if self.num_clusters == 1 and self.xi != 1.0:
      raise ValueError(f'process.hdlm.xi={self.xi} needs at least 2 clusters (a wrong cluster '
                       'to go to); with num_clusters=1 set xi=1.')
    for name, allowed in (('fallback', HDLM_FALLBACK), ('force', HDLM_FORCE[1:]),
                          ('xi_loss', HDLM_XI_LOSS), ('sampler', HDLM_SAMPLERS),
                          ('final_step', HDLM_FINAL_STEP), ('cluster_draw', HDLM_CLUSTER_DRAW)):
      if getattr(self, name) not in allowed:
        raise ValueError(f'{f}{name}={getattr(self, name)!r} is not one of {allowed}.')
    for name in ('hard_training', 'clip_weights', 'antithetic'):
      check_bool(f + name, getattr(self, name))
    check_number(f + 'aux_weight', self.aux_weight, lo=0.0)
    if self.aux_weight > 0 and self.num_clusters == 1:
      raise ValueError(f'process.hdlm.aux_weight={self.aux_weight} trains a cluster head, but one '
                       'cluster is MASK itself (nothing to predict): set aux_weight=0.')
    if self.cluster_draw == 'aux' and self.aux_weight == 0:
      raise ValueError("process.hdlm.cluster_draw='aux' draws clusters from the auxiliary head, "
                       'which exists only when process.hdlm.aux_weight > 0.')
    check_number(f + 'weight_min', self.weight_min, lo=0.0)
    check_number(f + 'weight_max', self.weight_max, lo=self.weight_min, lo_open=True)
    check_number('loss.t_min', self.t_min, lo=0.0, hi=1.0)
    rows = self.cluster_rows
    if self.vocab_size < rows + 2:
      raise ValueError(f'model.vocab_size={self.vocab_size} must count the words, MASK and the '
                       f'{rows} cluster tokens of process.hdlm.num_clusters={self.num_clusters} '
                       f'(>= {rows + 2}).')
    if not 0 <= self.mask_id < self.vocab_size - rows:
      raise ValueError(f'model.mask_id={self.mask_id} must lie before the {rows} cluster rows, '
                       f'in [0, {self.vocab_size - rows}) (model.vocab_size={self.vocab_size}).')

  @property
  def cluster_rows(self) -> int:
    """Rows of the token table that are cluster tokens (0 for one cluster: it is MASK)."""
    return hdlm_cluster_rows(self.num_clusters)

  @classmethod
  def _view(cls, config: ml_collections.ConfigDict) -> HDLMConfig:
    h = config.process.hdlm
    force = h.force
    if force == 'auto':
      force = 'within' if float(h.xi) == 1.0 else 'between'
    elif force not in HDLM_FORCE:
      raise ValueError(f'process.hdlm.force={force!r} is not one of {HDLM_FORCE}.')
    return cls(num_clusters=h.num_clusters, gamma=h.gamma, eps=h.eps, xi=h.xi,
               clusters=str(h.clusters), fallback=h.fallback, force=force, xi_loss=h.xi_loss,
               hard_training=h.hard_training, clip_weights=h.clip_weights,
               weight_min=h.weight_min, weight_max=h.weight_max, sampler=h.sampler,
               final_step=h.final_step, cluster_draw=h.cluster_draw,
               aux_weight=h.aux_weight,
               t_min=config.loss.t_min, antithetic=config.loss.antithetic,
               mask_id=config.model.mask_id, vocab_size=config.model.vocab_size)


def hdlm_cluster_rows(num_clusters: int) -> int:
  """Cluster-token rows of an HDLM table: n, or 0 for n = 1 (the single cluster is MASK)."""
  return 0 if num_clusters == 1 else num_clusters


def derived_model_fields(config: ml_collections.ConfigDict) -> dict[str, int]:
  """The model fields HDLM derives: `extra_vocab_rows` = its cluster-token rows after MASK, and
  `cluster_head` = n outputs of the auxiliary cluster head when process.hdlm.aux_weight > 0."""
  h = config.process.hdlm
  check_int('process.hdlm.num_clusters', h.num_clusters, minimum=1)
  aux = check_number('process.hdlm.aux_weight', h.aux_weight, lo=0.0)
  return {'extra_vocab_rows': hdlm_cluster_rows(h.num_clusters),
          'cluster_head': h.num_clusters if aux > 0 else 0}


def check_section(config: ml_collections.ConfigDict) -> None:
  """Validates `process.hdlm` against the resolved model fields (ValueError naming the field)."""
  HDLMConfig._view(config)  # pylint: disable=protected-access
