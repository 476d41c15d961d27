"""The hierarchy parts of every backbone, written once (docs/method.md §4, paper section 4.3).

`HierarchicalBackbone` is the call contract shared by the DiT and GPT-2 backbones:

  x = E_tok[tokens] (+ W_lvl[levels] if K > 1) (+ absolute positions unless rotary)     [B, L, H]
  x += W_cand · f(tokens)                          if the task's input features f feed the
                                                   trunk (models/features.py; zero-init Linear)
  x, c = trunk(x, t)                               backbone-specific: time conditioning, blocks
  hx, hc = x, c                                    stop-gradient'ed if hier_stop_gradient
                                                   (hx = the embedded input, before the trunk,
                                                   if hier_source='input')
  hx += W_hin[levels]                              if hier_input_embed (own input-state table)
       (+ W_hcand · f(givens)                       and input features f that feed the pathway;
                                                    givens = all revealed positions unless
                                                    given_state)
  hx += Linear(SiLU(embedding of t))               if hier_time_conditioning (zero-init Linear)
  hx = (hier_blocks_0 .. hier_blocks_{N-1})^R (hx) hierarchy trunk: N = hier_layers, R = hier_repeats
                                                   (at width hier_width between two projections)
  'hier'  = hier_head(hx, hc)  or, hier_readout='rounds', stick-breaking over the R = K-1 repeats
  'hier_round_tokens' = Linear(LN(hx_r)), r = 1..R   token logits of each round, only with
                                                   hier_round_tokens (loss.beta_rounds > 0)
  'token' = token_head(x (+ W_tok_lvl[token_levels] if single pass and K > 1), c)
  'cluster' = cluster_head(x, c)                   HDLM's auxiliary cluster head, only when
                                                   cluster_head = n > 0 (the process's option)

Input states (docs/design.md): levels 0..K-1, K = h_m (masked) and, with `given_state`, K+1 = h_g
(a given position: a grid's clue, a prompt); the level tables then have K+2 rows instead of K+1. The
process writes h_g at given positions just before each network call
(`processes.base.with_given_state`), so noisy states and sampler outputs keep the data's levels.

A backbone subclasses it and supplies `trunk` (everything between the input embedding and the
final hidden state) and `make_heads` (the forms of its two output heads); the input level table
('level_embed', zero-init), the K = 1 shortcut, the stop-gradient of the hierarchy head's inputs,
the single-pass token-level table ('token_level_embed') and the choice of which heads run live
here, and so does the optional hierarchy trunk (docs/method.md §4.7): `block` is the one more
hook a backbone supplies (one block of its own kind). Every submodule is created inside the backbone's own compact `__call__` (the hooks run in
its scope), so the parameter tree stays flat: level_embed/embedding, token_level_embed/embedding,
position/..., next to the backbone's own top-level names.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import layers
from hmdlm_jax.models import token_head
from hmdlm_jax.models.features import ModelFeatures

Array = jax.Array
# head(x [B, L, H], c [B, C] | None) -> float32 logits [B, L, K], [B, L, V] or [B, L, n].
HeadFn = Callable[[Array, Array | None], Array]
# token(x, c, query=None): HeadFn's logits, or with a token_head.TokenQuery its rows' NLL [B, L].
TokenHeadFn = Callable[..., Array]

HEADS = ('hier', 'token', 'token_nll', 'cluster', 'hier_round_tokens')
# The heads every model has ('cluster' exists only when the backbone's cluster_head > 0,
# 'hier_round_tokens' only with hier_round_tokens). 'token_nll' is the token head read as a loss
# at selected rows only (needs a token_query).
CORE_HEADS = ('hier', 'token')
# The heads that read the trunk's output (the hierarchy heads read it when hier_source='features').
TRUNK_HEADS = ('token', 'token_nll', 'cluster')
# Top-level parameter names used only by the hierarchy pathway start with this prefix (the level
# head 'hier_layer' / 'hier_head', the trunk 'hier_blocks_i', 'hier_time_*', 'hier_level_embed',
# the round readout and token head 'hier_round_*');
# optim.py clips their gradient as a group of its own (optim.hier_grad_clip).
HIER_PREFIX = 'hier_'
# block(x [B, L, H], c [B, C] | None, rope, train) -> [B, L, H]: one backbone block.
BlockFn = Callable[[Array, Array | None, tuple[Array, Array] | None, bool], Array]


def pass1_heads(beta_rounds: float) -> tuple[str, ...]:
  """The heads a loss reads in pass 1: the level head, and the per-round token head beside it
  when its loss is on (loss.beta_rounds > 0; docs/method.md §5.1)."""
  return ('hier', 'hier_round_tokens') if beta_rounds > 0 else ('hier',)


def is_hierarchy_param(top_level_name: str) -> bool:
  """Whether a top-level parameter belongs to the hierarchy pathway only (not the level table)."""
  return top_level_name.startswith(HIER_PREFIX)


class Heads(NamedTuple):
  """A backbone's output heads, built once per call by `make_heads` (only called ones get
  parameters)."""
  hier: HeadFn  # -> [B, L, K] raw hierarchy logits
  token: TokenHeadFn  # -> [B, L, V] raw token logits; with a query, the NLL [B, L] at its rows
  cluster: HeadFn  # -> [B, L, n] raw logits of HDLM's auxiliary cluster head (n = cluster_head)


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
  """Input tables, level head and token head around a backbone-specific trunk.

  __call__(tokens [B,L] int, levels [B,L] int in 0..K (K = h_m), t [B] float,
           heads=('hier','token'), token_levels [B,L] | None, train) -> dict:
    'hier'  -> float32 [B, L, K] raw hierarchy logits (K = 1: zeros, log-prob 0 of the one level)
    'token' -> float32 [B, L, V] raw token logits (no SUBS)
    'token_nll' -> float32 [B, L]: -log softmax(token logits without column token_query.exclude)
               at token_query.targets, on token_query.rows only (0 elsewhere; the others are
               never computed: models/token_head.py)
    'cluster' -> float32 [B, L, n] raw auxiliary cluster logits (needs cluster_head = n > 0)
    'hier_round_tokens' -> float32 [B, L, R, V] raw token logits read from each of the R = K-1
               repeats of the hierarchy trunk (needs hier_round_tokens; `_round_features`)
  Only the requested heads are computed. train=True applies dropout (rng stream 'dropout').
  Subclasses set the defaults of the fields, `token_embed_name`, `embedding_std`, and implement
  `trunk` and `make_heads`.
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
  hier_stop_gradient: bool = False  # the hierarchy head reads detached backbone features
  # The hierarchy pathway (docs/method.md §4.7); all off = the paper's head on the final features.
  hier_layers: int = 0  # N blocks of the backbone's kind before the hierarchy head
  hier_repeats: int = 1  # R applications of those N blocks (weight-tied recurrence when R > 1)
  hier_time_conditioning: bool = False  # the hierarchy pathway reads its own embedding of t
  hier_input_embed: bool = False  # the hierarchy pathway adds its own input-state table
  given_state: bool = False  # given cells carry the input state h_g = K+1 (tables get K+2 rows)
  hier_readout: str = 'head'  # 'head' (the backbone's level head) | 'rounds' (_round_readout)
  hier_width: int = 0  # width of the trunk's blocks (0 = hidden_size); projections in and out
  hier_num_heads: int = 0  # attention heads of the trunk's blocks (0 = num_heads)
  cluster_head: int = 0  # n outputs of HDLM's auxiliary cluster head (0 = no such head)
  # A token head on each repeat's features (hier_readout='rounds'; the per-round token loss).
  hier_round_tokens: bool = False
  # What the hierarchy pathway reads: 'features' (the trunk's output, the paper); 'input' (the
  # embedded input before the trunk: the pathway is then a network of its own beside the trunk).
  hier_source: str = 'features'
  mask_id: int = -1  # the MASK token (the pathway's input features of the givens show it)
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
    """One block of the backbone's kind named `name` (for the hierarchy trunk); its width is its
    input's, its MLP width `mlp_dim`, its attention heads `num_heads`."""
    raise NotImplementedError

  @property
  def available_heads(self) -> tuple[str, ...]:
    """The heads with parameters: 'hier', 'token', 'cluster' if cluster_head > 0 and
    'hier_round_tokens' if hier_round_tokens ('token_nll' reads the token head)."""
    return (CORE_HEADS + (('cluster',) if self.cluster_head else ())
            + (('hier_round_tokens',) if self.hier_round_tokens else ()))

  @property
  def num_input_states(self) -> int:
    """Rows of the level tables: K levels, h_m, and h_g when `given_state`."""
    return self.num_levels + (2 if self.given_state else 1)

  @nn.compact
  def __call__(self, tokens: Array, levels: Array, t: Array,
               heads: tuple[str, ...] = CORE_HEADS, token_levels: Array | None = None,
               train: bool = False, token_query: token_head.TokenQuery | None = None
               ) -> dict[str, Array]:
    heads = check_heads(heads)
    if 'cluster' in heads and not self.cluster_head:
      raise ValueError("heads include 'cluster' but the model has no auxiliary cluster head "
                       '(model.cluster_head=0; set process.hdlm.aux_weight > 0).')
    if 'hier_round_tokens' in heads and not (self.hier_round_tokens and self.num_levels > 1):
      raise ValueError("heads include 'hier_round_tokens' but the model has no per-round token "
                       'head (set loss.beta_rounds > 0 with K > 1 and hier_readout=rounds).')
    check_inputs(tokens, levels, t, token_levels, single_pass=self.single_pass,
                 num_levels=self.num_levels, heads=heads)
    if ('token_nll' in heads) != (token_query is not None):
      raise ValueError("the 'token_nll' head and token_query go together (heads="
                       f'{heads}, token_query given: {token_query is not None})')
    b, l = tokens.shape
    k = self.num_levels
    out: dict[str, Array] = {}
    if k == 1 and 'hier' in heads:
      out['hier'] = jnp.zeros((b, l, 1), jnp.float32)  # one level: log g = 0 exactly
      if heads == ('hier',):
        return out

    token_table = layers.Embed(self.vocab_size, self.hidden_size, ('vocab', 'embed'),
                               self.embedding_init, name=self.token_embed_name)
    # Zero-init: the network starts as its MDLM twin and learns to use the levels (dit.py).
    # (K+1) × H table, row K = h_m (paper section 4.3.2); row K+1 = h_g if given_state.
    level_table = (layers.Embed(self.num_input_states, self.hidden_size, ('levels', 'embed'),
                                layers.zeros_init, name='level_embed') if k > 1 else None)
    # Zero-init: the network starts as it would without the task's input features.
    inputs = self.features.inputs
    cand_proj = (self._candidate_proj('candidate_proj')
                 if inputs is not None and inputs.trunk else None)
    rope = positions = None
    if self.position_embedding == 'rotary':  # applied to q, k inside the trunk's attention
      rope = layers.rotary_cos_sin(l, self.hidden_size // self.num_heads)
    else:
      positions = self._positions(l)[None]

    def embed(tok: Array, lev: Array) -> tuple[Array, Array | None]:
      """The embedded input [B, L, H] of (tokens, levels) and its candidate features."""
      x = token_table(tok)
      if level_table is not None:
        x = x + level_table(lev)
      cand = None
      if cand_proj is not None:
        cand = inputs.fn(tok)
        x = x + cand_proj(cand)
      return (x if positions is None else x + positions), cand

    x, cand = embed(tokens, levels)
    hier_heads = ('hier' in heads or 'hier_round_tokens' in heads) and k > 1
    x_in = x
    if self.hier_source != 'features' and not set(TRUNK_HEADS) & set(heads):
      x, c = None, self.conditioning(t)  # pass 1 of a pathway beside the trunk: no trunk to run
    else:
      x, c = self.trunk(x, t, rope, train)

    head = self.make_heads(token_table)
    if hier_heads:
      hx, hc = (x if self.hier_source == 'features' else x_in), c
      if self.hier_stop_gradient:
        # L_hier and L_cons then train the head only (and pass 1 needs no backward through the
        # backbone); the backbone learns from the token loss alone.
        hx, hc = jax.lax.stop_gradient(hx), jax.lax.stop_gradient(hc)
      hx, hc, per_round = self._hier_trunk(hx, hc, tokens, levels, t, rope, train, cand)
      if self.hier_readout == 'rounds':
        normed = self._round_features(per_round)
        if 'hier' in heads:
          out['hier'] = self._round_readout(normed)
        if 'hier_round_tokens' in heads:
          out['hier_round_tokens'] = self._round_tokens(normed)
      else:
        out['hier'] = head.hier(hx, hc)
    if 'token' in heads or 'token_nll' in heads:
      if self.single_pass and k > 1:
        # Single pass: the token head is told each position's own level; the hierarchy head
        # sees the plain hidden state (docs/method.md §4).
        x = x + layers.Embed(self.num_input_states, self.hidden_size, ('levels', 'embed'),
                             self.embedding_init, name='token_level_embed')(token_levels)
      if 'token' in heads:
        out['token'] = head.token(x, c)
      if 'token_nll' in heads:
        out['token_nll'] = head.token(x, c, token_query)
    if 'cluster' in heads:  # reads the final features as the token head does (not level-aware)
      out['cluster'] = head.cluster(x, c)
    return out

  def _hier_trunk(self, hx: Array, hc: Array | None, tokens: Array, levels: Array, t: Array,
                  rope: tuple[Array, Array] | None, train: bool, cand: Array | None = None
                  ) -> tuple[Array, Array | None, list[Array]]:
    """The hierarchy pathway between the backbone features and the level head (all optional).

    hx [B, L, H], hc [B, C] | None -> (hx, hc, [hx after each of the R repeats]). Every part starts as the identity (zero-init
    tables and projections, adaLN-zero / residual blocks), so switching one on keeps the head's
    initial output; its parameters are named 'hier_*' (`is_hierarchy_param`).
    """
    if self.hier_input_embed:  # the pathway's own view of the input states (given / masked / level)
      hx = hx + layers.Embed(self.num_input_states, self.hidden_size, ('levels', 'embed'),
                             layers.zeros_init, name='hier_level_embed')(levels)
      inputs = self.features.inputs
      if inputs is not None and inputs.pathway:  # and its own view of the input features:
        # of the givens alone when it knows them (a labeller computes the levels from them);
        # `cand`: the input's, if it computed them.
        if self.given_state:
          if self.mask_id < 0:  # build_model passes the config's resolved mask_id
            raise ValueError('the pathway shows the non-given positions as MASK: build the '
                             'model with models.build_model (mask_id >= 0).')
          cand = inputs.fn(jnp.where(levels == self.num_levels + 1, tokens, self.mask_id))
        elif cand is None:
          cand = inputs.fn(tokens)
        hx = hx + self._candidate_proj(f'{HIER_PREFIX}candidate_proj')(cand)
    if self.hier_time_conditioning:  # zero-init projection of its own time embedding, added
      ct = nn.silu(layers.TimestepEmbedder(self.cond_dim, name='hier_time_embed')(t))
      hx = hx + layers.Dense((self.hidden_size,), ('cond', 'embed'), kernel_init=layers.zeros_init,
                             bias_init=layers.zeros_init, dtype=self.compute_dtype,
                             out_dtype=jnp.float32, name='hier_time_proj')(ct)[:, None, :]
    width = self.hier_width or self.hidden_size
    if not self.hier_layers:
      return hx, hc, []
    mlp_dim = self.mlp_dim * width // self.hidden_size
    # Fewer heads cost the same matmul FLOPs but fewer [B, heads, L, L] softmax elements, which
    # dominate a narrow pathway's time on CPU (docs/hierarchy_results.md item 18).
    heads = self.hier_num_heads or self.num_heads
    blocks = [self.block(f'{HIER_PREFIX}blocks_{i}', mlp_dim, heads)
              for i in range(self.hier_layers)]
    z = hx
    if width != self.hidden_size:  # a narrower (cheaper) trunk between two projections
      z = layers.Dense((width,), ('embed', None), dtype=self.compute_dtype, out_dtype=jnp.float32,
                       name=f'{HIER_PREFIX}in_proj')(hx)
    if rope is not None and width // heads != self.hidden_size // self.num_heads:
      rope = layers.rotary_cos_sin(hx.shape[1], width // heads)
    per_round = []
    for _ in range(self.hier_repeats):
      for block in blocks:
        z = block(z, hc, rope, train)
      per_round.append(z)
    if width != self.hidden_size:  # residual, zero-init: the identity at init
      z = hx + layers.Dense((self.hidden_size,), (None, 'embed'), kernel_init=layers.zeros_init,
                            bias_init=layers.zeros_init, dtype=self.compute_dtype,
                            out_dtype=jnp.float32, name=f'{HIER_PREFIX}out_proj')(z)
    return z, hc, per_round

  def _round_features(self, per_round: list[Array]) -> list[Array]:
    """LN(hx_r) [B, L, H'] of each repeat r, one LayerNorm shared by the rounds (what the round
    readout and the per-round token head read)."""
    norm = layers.LayerNorm(name=f'{HIER_PREFIX}round_norm')
    return [norm(h) for h in per_round]

  def _round_tokens(self, normed: list[Array]) -> Array:
    """Token logits [B, L, R, V] of each round, one zero-init Linear shared by the rounds.

    Trained by the per-round token loss (processes/level_objectives.py `round_token_loss`): round
    r learns the tokens of the positions whose level the first r rounds decide, so each repeat is
    told what its round of propagation should know (docs/method.md §5.1).
    """
    head = layers.Dense((self.vocab_size,), ('embed', 'vocab'), kernel_init=layers.zeros_init,
                        bias_init=layers.zeros_init, dtype=self.compute_dtype,
                        out_dtype=jnp.float32, name=f'{HIER_PREFIX}round_token_head')
    return jnp.stack([head(h) for h in normed], axis=2)

  def _round_readout(self, normed: list[Array]) -> Array:
    """`hier_readout='rounds'`: level log-probabilities [B, L, K] by stick-breaking over rounds.

    Repeat r = 1..K-1 of the trunk reads a hazard p_r = σ(s_r), s_r = Linear(LN(hx_r)) (one
    readout shared by the rounds; `normed` = the LN(hx_r) of `_round_features`): the
    probability that the position is decided in round r if it was not before. Level K-r (higher
    = earlier) has probability p_r Π_{j<r} (1 − p_j) and level 0 the rest, Π_{j<K} (1 − p_j).
    The log-probabilities are valid logits for the head's log-softmax and prior correction.
    This mirrors a labeller whose levels are rounds of propagation (Sudoku, docs/method.md §6):
    the level loss reaches each round's readout directly. The readout bias starts at −2 (hazard
    0.12 per round, near the Sudoku labeller's ~0.13).
    """
    readout = layers.Dense((1,), ('embed', None), kernel_init=layers.zeros_init,
                           bias_init=nn.initializers.constant(-2.0), dtype=self.compute_dtype,
                           out_dtype=jnp.float32, name=f'{HIER_PREFIX}round_readout')
    s = jnp.concatenate([readout(h) for h in normed], axis=-1)  # [B, L, K-1]
    log_p, log_q = jax.nn.log_sigmoid(s), jax.nn.log_sigmoid(-s)
    survive = jnp.cumsum(log_q, axis=-1) - log_q  # Σ_{j<r} log(1 − p_j)
    decided = log_p + survive  # round r -> level K - r
    level0 = jnp.sum(log_q, axis=-1, keepdims=True)
    return jnp.concatenate([level0, decided[..., ::-1]], axis=-1)  # levels 0, 1, .., K-1

  def _candidate_proj(self, name: str) -> layers.Dense:
    """Zero-init Linear of the task's input features [B, L, F] -> float32 [B, L, H]."""
    return layers.Dense((self.hidden_size,), (None, 'embed'), kernel_init=layers.zeros_init,
                        bias_init=layers.zeros_init, dtype=self.compute_dtype,
                        out_dtype=jnp.float32, name=name)

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
