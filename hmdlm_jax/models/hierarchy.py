"""The parts of every backbone around its trunk, written once (docs/method.md §4, paper 4.3).

`HierarchicalBackbone` is the call contract shared by the DiT and GPT-2 backbones:
  x = E_tok[tokens] (+ W_lvl[levels] if K > 1) (+ W_cand · f(tokens)) (+ positions)  [B, L, H]
  x, c = trunk(x, t)                                backbone-specific: time conditioning, blocks
  'hier', 'hier_round_tokens' = pathway(x, c, ...)  the level pathway (models/pathway.py)
  'token' = token_head(x (+ W_tok_lvl[token_levels] if single pass and K > 1), c)
  'cluster' = cluster_head(x, c)                    HDLM's auxiliary head (cluster_head = n > 0)
  'anchor', 'token' = y_φ, x_ψ(y_φ)                 ADLM (denoiser_layers > 0, models/anchor.py)
f: the task's input features; positions: rotary, learned or the task's (models/features.py).
Input states (docs/design.md): levels 0..K-1, K = h_m (masked) and, with `given_state`, K+1 = h_g
(a given position), written by the process before each call (`processes.base.with_given_state`).
A backbone supplies `trunk`, `make_heads` and `block` (one block of its kind, for the pathway);
every submodule (pathway, denoiser) lives in the backbone's own scope: a flat parameter tree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import layers
from hmdlm_jax.models import token_head
from hmdlm_jax.models.anchor import Denoiser
from hmdlm_jax.models.features import ModelFeatures
from hmdlm_jax.models.features import feature_projection
from hmdlm_jax.models.pathway import BlockFn
from hmdlm_jax.models.pathway import HIER_PREFIX
from hmdlm_jax.models.pathway import Pathway
from hmdlm_jax.models.pathway import PathwaySettings

Array = jax.Array
# head(x [B, L, H], c [B, C] | None) -> float32 logits [B, L, K], [B, L, V] or [B, L, n].
HeadFn = Callable[[Array, Array | None], Array]
# token(x, c, query=None): HeadFn's logits, or with a token_head.TokenQuery its rows' NLL [B, L].
TokenHeadFn = Callable[..., Array]

HEADS = ('hier', 'token', 'token_nll', 'cluster', 'hier_round_tokens', 'anchor')
# The heads every model has ('cluster' exists only when the backbone's cluster_head > 0,
# 'hier_round_tokens' only with the pathway's round_tokens, 'anchor' only with ADLM's
# denoiser). 'token_nll' is the token head read as a loss at selected rows only (needs a
# token_query).
CORE_HEADS = ('hier', 'token')
# The heads that read the trunk's output (the level heads read it when the pathway's source is
# 'features').
TRUNK_HEADS = ('token', 'token_nll', 'cluster', 'anchor')


def is_hierarchy_param(top_level_name: str) -> bool:
  """Whether a top-level parameter belongs to the level pathway only (not the level table)."""
  return top_level_name.startswith(HIER_PREFIX)


class Heads(NamedTuple):
  """A backbone's output heads, built once per call by `make_heads` (only called ones get
  parameters)."""
  hier: HeadFn  # -> [B, L, K] raw hierarchy logits
  token: TokenHeadFn  # -> [B, L, V] raw token logits; with a query, the NLL [B, L] at its rows
  cluster: HeadFn  # -> [B, L, n] raw logits of HDLM's auxiliary cluster head (n = cluster_head)


@dataclasses.dataclass(frozen=True)
class Embedding:
  """The input embedding of one call, its tables built in the backbone's scope:
  (tokens, levels [B, L]) -> (x float32 [B, L, H], the input features [B, L, F] | None)."""
  token_table: layers.Embed
  level_table: layers.Embed | None  # K > 1
  feature_proj: layers.Dense | None  # the task's input features feed the trunk
  features_fn: Callable[[Array], Array] | None
  positions: Array | None  # [1, L, H]; None with rotary positions (applied in attention)
  rope: tuple[Array, Array] | None  # rotary cos, sin [L, head_dim], or None

  def __call__(self, tokens: Array, levels: Array) -> tuple[Array, Array | None]:
    x = self.token_table(tokens)
    if self.level_table is not None:
      x = x + self.level_table(levels)
    features = None
    if self.feature_proj is not None:
      features = self.features_fn(tokens)
      x = x + self.feature_proj(features)
    return (x if self.positions is None else x + self.positions), features


# ----------------------------------------------------------------------------- call-site checks


def check_heads(heads: Sequence[str]) -> tuple[str, ...]:
  """Validate the requested heads (a static Python tuple, non-empty, from HEADS, no repeats)."""
  heads = tuple(heads)
  if not heads or any(h not in HEADS for h in heads) or len(set(heads)) != len(heads):
    raise ValueError(f'heads={heads!r}: must be a non-empty tuple of distinct names from {HEADS}')
  return heads


def check_inputs(tokens: Array, levels: Array, t: Array, token_levels: Array | None, *,
                 single_pass: bool, num_levels: int, heads: tuple[str, ...]) -> None:
  """Shapes and dtypes of the apply_fn inputs (docs/design.md): tokens, levels [B, L] int; t [B].

  token_levels [B, L] int: required by the single-pass token head when K > 1 (for K = 1 the level
  carries no information and it may be omitted); rejected by the two-pass model.
  """
  chex.assert_rank(tokens, 2)
  chex.assert_equal_shape([tokens, levels])
  chex.assert_shape(t, (tokens.shape[0],))
  chex.assert_type([tokens, levels], int)
  if token_levels is not None:
    if not single_pass:
      raise ValueError("token_levels is only used by model.variant='single_pass'; the two-pass "
                       'model takes the levels through the `levels` input (pass 2)')
    chex.assert_equal_shape([tokens, token_levels])
    chex.assert_type(token_levels, int)
  elif single_pass and num_levels > 1 and ('token' in heads or 'token_nll' in heads):
    raise ValueError("model.variant='single_pass': the token head needs token_levels [B, L] "
                     "(each position's own level, docs/method.md §4)")


# ----------------------------------------------------------------------------- the backbone


class HierarchicalBackbone(nn.Module):
  """Input tables, level pathway and token head around a backbone-specific trunk.

  __call__(tokens [B,L] int, levels [B,L] int in 0..K (K = h_m), t [B] float,
           heads=('hier','token'), token_levels [B,L] | None, train) -> dict:
    'hier'  -> float32 [B, L, K] raw hierarchy logits (K = 1: zeros, log-prob 0 of the one level)
    'token' -> float32 [B, L, V] raw token logits (no SUBS)
    'token_nll' -> float32 [B, L]: -log softmax(token logits without column token_query.exclude)
               at token_query.targets, on token_query.rows only (0 elsewhere; the others are
               never computed: models/token_head.py)
    'cluster' -> float32 [B, L, n] raw auxiliary cluster logits (needs cluster_head = n > 0)
    'hier_round_tokens' -> float32 [B, L, R, V] raw token logits read from each of the R = K-1
               repeats of the pathway's blocks (needs pathway.round_tokens; models/pathway.py)
    'anchor' -> float32 [B, L, V] ADLM's anchor logits y_φ (needs denoiser_layers > 0; then
               'token' / 'token_nll' read the denoiser x_ψ(y_φ) instead: models/anchor.py)
  Only the requested heads are computed. train=True applies dropout (rng stream 'dropout').
  Subclasses set the defaults of the fields, `token_embed_name`, `embedding_std`, and implement
  `trunk`, `make_heads` and `block`.
  """
  vocab_size: int
  num_levels: int
  num_layers: int = 12
  hidden_size: int = 768
  num_heads: int = 12
  mlp_dim: int = 3072
  cond_dim: int = 128
  dropout: float = 0.1
  time_conditioning: bool = False
  single_pass: bool = False
  position_embedding: str = 'rotary'  # 'rotary' | 'learned' | a task's (features.positions)
  seq_len: int = 128
  tie_embeddings: bool = False
  dtype: str = 'float32'
  given_state: bool = False  # given positions carry the input state h_g = K+1 (K+2 table rows)
  cluster_head: int = 0  # n outputs of HDLM's auxiliary cluster head (0 = no such head)
  mask_id: int = -1  # the MASK token (the pathway's input features of the givens show it)
  pathway: PathwaySettings = PathwaySettings()  # the level pathway (models/pathway.py)
  denoiser_layers: int = 0  # ADLM: blocks of its denoiser on the anchor logits (0 = none)
  features: ModelFeatures = ModelFeatures()  # the task's positions, relations, input features

  # Parameter name of the input token table ('vocab_embed' in MDLM's DiT, 'wte' in GPT-2).
  token_embed_name: ClassVar[str] = 'vocab_embed'
  # Std of the N(0, std²) init of the token, position and token-level tables; None = the
  # layers.Embed default (torch's, as in MDLM).
  embedding_std: ClassVar[float | None] = None

  def trunk(self, x: Array, t: Array, rope: tuple[Array, Array] | None,
            train: bool) -> tuple[Array, Array | None]:
    """Embedded input x [B, L, H] -> (final hidden state [B, L, H], conditioning c [B, C] | None).

    rope: rotary cos, sin [L, head_dim] when position_embedding='rotary', else None.
    """
    raise NotImplementedError

  def conditioning(self, t: Array) -> Array | None:
    """The conditioning vector c [B, C] the heads and blocks read (None: the backbone has none);
    `trunk` returns the same c. Called on its own when no head reads the trunk's output."""
    del t
    return None

  def make_heads(self, token_table: layers.Embed) -> Heads:
    """The output heads; `token_table` is the input token table (for tied output weights); the
    cluster head has `cluster_head` outputs (built only if it is called)."""
    raise NotImplementedError

  def block(self, name: str, mlp_dim: int, num_heads: int) -> BlockFn:
    """One block of the backbone's kind named `name` (for the level pathway); its width is its
    input's, its MLP width `mlp_dim`, its attention heads `num_heads`."""
    raise NotImplementedError

  @property
  def available_heads(self) -> tuple[str, ...]:
    """The heads with parameters: 'hier', 'token', 'cluster' if cluster_head > 0 and
    'hier_round_tokens' if pathway.round_tokens ('token_nll' reads the token head)."""
    return (CORE_HEADS + (('cluster',) if self.cluster_head else ())
            + (('hier_round_tokens',) if self.pathway.round_tokens else ())
            + (('anchor',) if self.denoiser_layers else ()))

  @property
  def num_input_states(self) -> int:
    """Rows of the level tables: K levels, h_m, and h_g when `given_state`."""
    return self.num_levels + (2 if self.given_state else 1)

  @nn.compact
  def __call__(self, tokens: Array, levels: Array, t: Array,
               heads: tuple[str, ...] = CORE_HEADS, token_levels: Array | None = None,
               train: bool = False, token_query: token_head.TokenQuery | None = None
               ) -> dict[str, Array]:
    heads = self._check_call(tokens, levels, t, heads, token_levels, token_query)
    b, l = tokens.shape
    out: dict[str, Array] = {}
    if self.num_levels == 1 and 'hier' in heads:
      out['hier'] = jnp.zeros((b, l, 1), jnp.float32)  # one level: log g = 0 exactly
      if heads == ('hier',):
        return out
    embedding = self._embedding(l)
    x_in, features = embedding(tokens, levels)
    if self.pathway.reads_trunk or set(TRUNK_HEADS) & set(heads):
      x, c = self.trunk(x_in, t, embedding.rope, train)
    else:  # pass 1 of a pathway beside the trunk: no trunk to run
      x, c = None, self.conditioning(t)
    head = self.make_heads(embedding.token_table)
    if ('hier' in heads or 'hier_round_tokens' in heads) and self.num_levels > 1:
      hx = x if self.pathway.reads_trunk else x_in
      out.update(self._pathway()(hx, c, tokens, levels, t, embedding.rope, train, features,
                                 heads, head.hier))
    if self.denoiser_layers:  # ADLM: the trunk is the anchor network (models/anchor.py)
      out.update(self._anchored(x, c, t, embedding.rope, train, heads, head, token_query))
    elif 'token' in heads or 'token_nll' in heads:
      x = self._with_token_levels(x, token_levels)
      if 'token' in heads:
        out['token'] = head.token(x, c)
      if 'token_nll' in heads:
        out['token_nll'] = head.token(x, c, token_query)
    if 'cluster' in heads:  # reads the final features as the token head does (not level-aware)
      out['cluster'] = head.cluster(x, c)
    return out

  def _anchored(self, x: Array, c: Array | None, t: Array, rope: tuple[Array, Array] | None,
                train: bool, heads: tuple[str, ...], head: Heads,
                token_query: token_head.TokenQuery | None) -> dict[str, Array]:
    """ADLM's heads: 'anchor' = the trunk's token head y_φ, and 'token' / 'token_nll' = the
    denoiser x_ψ on those raw logits (docs/method.md §13.4)."""
    anchor = head.token(x, c)
    out = {'anchor': anchor} if 'anchor' in heads else {}
    if 'token' in heads or 'token_nll' in heads:
      denoiser = Denoiser(self.denoiser_layers, self.block, self.vocab_size, self.hidden_size,
                          self.mlp_dim, self.num_heads, self.cond_dim, self.time_conditioning,
                          self.compute_dtype, name='denoiser')
      nn.share_scope(self, denoiser)
      if 'token' in heads:
        out['token'] = denoiser(anchor, t, rope, train)
      if 'token_nll' in heads:
        out['token_nll'] = denoiser(anchor, t, rope, train, token_query)
    return out

  def _check_call(self, tokens: Array, levels: Array, t: Array, heads: Sequence[str],
                  token_levels: Array | None, token_query: token_head.TokenQuery | None
                  ) -> tuple[str, ...]:
    """The validated heads of a call, its inputs checked against the model."""
    heads = check_heads(heads)
    if 'cluster' in heads and not self.cluster_head:
      raise ValueError("heads include 'cluster' but the model has no auxiliary cluster head "
                       '(model.cluster_head=0; set process.hdlm.aux_weight > 0).')
    if 'hier_round_tokens' in heads and not (self.pathway.round_tokens and self.num_levels > 1):
      raise ValueError("heads include 'hier_round_tokens' but the model has no per-round token "
                       'head (set loss.beta_rounds > 0 with K > 1 and model.pathway.readout=rounds).')
    if 'anchor' in heads and not self.denoiser_layers:
      raise ValueError("heads include 'anchor' but the model has no ADLM denoiser "
                       "(model.denoiser_layers=0; set process.kind='adlm').")
    check_inputs(tokens, levels, t, token_levels, single_pass=self.single_pass,
                 num_levels=self.num_levels, heads=heads)
    if ('token_nll' in heads) != (token_query is not None):
      raise ValueError("the 'token_nll' head and token_query go together (heads="
                       f'{heads}, token_query given: {token_query is not None})')
    return heads

  def _embedding(self, length: int) -> Embedding:
    """The input embedding's tables, built in the backbone's scope, for inputs of `length`."""
    token_table = layers.Embed(self.vocab_size, self.hidden_size, ('vocab', 'embed'),
                               self.embedding_init, name=self.token_embed_name)
    # Zero-init: the network starts as its MDLM twin and learns to use the levels (dit.py).
    # (K+1) × H table, row K = h_m (paper section 4.3.2); row K+1 = h_g if given_state.
    level_table = (layers.Embed(self.num_input_states, self.hidden_size, ('levels', 'embed'),
                                layers.zeros_init, name='level_embed')
                   if self.num_levels > 1 else None)
    # Zero-init: the network starts as it would without the task's input features.
    inputs = self.features.inputs
    trunk_features = inputs is not None and inputs.trunk
    proj = (feature_projection(self.hidden_size, self.compute_dtype, 'candidate_proj')
            if trunk_features else None)
    rope = positions = None
    if self.position_embedding == 'rotary':  # applied to q, k inside the trunk's attention
      rope = layers.rotary_cos_sin(length, self.hidden_size // self.num_heads)
    else:
      positions = self._positions(length)[None]
    return Embedding(token_table, level_table, proj, inputs.fn if trunk_features else None,
                     positions, rope)

  def _pathway(self) -> Pathway:
    """The level pathway, in the backbone's own scope (its parameters are top-level 'hier_*')."""
    pathway = Pathway(
        settings=self.pathway, block=self.block, vocab_size=self.vocab_size,
        num_levels=self.num_levels, num_input_states=self.num_input_states,
        given_state=self.given_state, mask_id=self.mask_id, hidden_size=self.hidden_size,
        mlp_dim=self.mlp_dim, num_heads=self.num_heads, cond_dim=self.cond_dim,
        dtype=self.compute_dtype, inputs=self.features.inputs, name='pathway')
    nn.share_scope(self, pathway)
    return pathway

  def _with_token_levels(self, x: Array, token_levels: Array | None) -> Array:
    """Single pass with K > 1: the token head is told each position's own level (the level
    pathway reads the plain hidden state; docs/method.md §4). Else x itself."""
    if not (self.single_pass and self.num_levels > 1):
      return x
    return x + layers.Embed(self.num_input_states, self.hidden_size, ('levels', 'embed'),
                            self.embedding_init, name='token_level_embed')(token_levels)

  def _positions(self, length: int) -> Array:
    """The absolute position embedding 'position' -> float32 [length, H]."""
    make = self.features.positions
    if make is None and self.position_embedding == 'learned':
      make = layers.LearnedPositionEmbedding
    if make is None:
      raise ValueError(f'position embedding {self.position_embedding!r}: neither rotary nor '
                       "learned, and the task's features have none (models/features.py)")
    return make(self.seq_len, self.hidden_size, self.embedding_init, name='position')(length)

  @property
  def embedding_init(self) -> layers.Init | None:
    """Init of the token, position and token-level tables (`embedding_std`)."""
    return None if self.embedding_std is None else layers.normal_init(self.embedding_std)

  @property
  def compute_dtype(self) -> Any:
    """The jnp dtype of the matrix products (model.dtype)."""
    return layers.COMPUTE_DTYPES[self.dtype]
