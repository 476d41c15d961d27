"""Explicit FLOP count of one training step (the numerator of model FLOP utilisation).

Counted: matrix products only (2 FLOPs per multiply-add); element-wise work (norms, softmax,
GELU, the loss, AdamW) is left out, as in the usual "6·N·D" model-FLOP convention.

Per token, one forward pass of the backbone with a set of heads costs

    F_tok = 2·(N_blocks + N_heads) + N_layers · 4·L·H

  N_blocks = N_layers · (3H² + H² + 2·H·M)     qkv, attention output, MLP in and out (per token)
  N_heads  = H·V (token head, tied or not)  +  H·K (hierarchy head, K > 1)   (heads requested)
  4·L·H    = attention per layer: Q·Kᵀ (2·L·H) and A·V (2·L·H)

and per sequence (applied to the conditioning vector c, not to every token; DiT only, or the GPT-2
backbone with time conditioning)

    F_seq = 2·(256·C + C² + N_layers·6HC + 2HC per adaLN head)       (DiT)
    F_seq = 2·(256·C + C² + C·H)                                    (GPT-2, time conditioning)

with H the width, M the MLP width, C the conditioning width, V the vocabulary (MASK row included),
K the number of levels, L the sequence length. A training step (forward + backward: the backward
pass costs two matrix products per forward one) over B sequences costs

    F_step = 3 · Σ_passes (B·L·F_tok(pass) + B·F_seq(pass))

with the passes of the loss (hmdlm_jax/losses.py):
  MDLM (K = 1)          one pass, heads ('token',)
  HMDLM two-pass        pass 1 heads ('hier',) then pass 2 heads ('token',): two backbone passes
  HMDLM single-pass     one pass, heads ('hier', 'token')

Cross-checks: `jaxpr_matmul_flops` counts the dot_general FLOPs of a traced function exactly (the
forward pass must match the formula exactly; tests/test_flops.py), and the benchmarks also print
XLA's own cost analysis (which counts element-wise operations too, so it is larger).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax

from hmdlm_jax import config as config_lib

TIME_FREQ_DIM = 256  # layers.TimestepEmbedder.frequency_dim


@dataclasses.dataclass(frozen=True)
class StepFlops:
  """FLOPs of one train step and its parts (all integers, FLOPs = 2 × multiply-adds)."""
  per_token_forward: tuple[int, ...]  # F_tok of each backbone pass
  per_sequence_forward: tuple[int, ...]  # F_seq of each backbone pass
  forward: int  # Σ_passes B·L·F_tok + B·F_seq
  train_step: int  # 3 · forward
  num_passes: int
  matmul_params_per_token: tuple[int, ...]  # N_blocks + N_heads of each pass

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def loss_passes(cfg_model: Any) -> tuple[tuple[str, ...], ...]:
  """The heads of each backbone pass of the training loss (see the module docstring)."""
  cfg = config_lib.ModelConfig.from_section(cfg_model)
  if cfg.num_levels == 1:
    return (('token',),)
  if cfg.variant == 'single_pass':
    return (('hier', 'token'),)
  return (('hier',), ('token',))


def block_matmul_params(cfg_model: Any) -> int:
  """N_blocks: matrix parameters applied to every token by the transformer blocks."""
  c = config_lib.ModelConfig.from_section(cfg_model)
  h, m = c.hidden_size, c.mlp_dim
  return c.num_layers * (3 * h * h + h * h + 2 * h * m)


def head_matmul_params(cfg_model: Any, heads: tuple[str, ...]) -> int:
  """N_heads: matrix parameters of the requested heads applied to every token."""
  c = config_lib.ModelConfig.from_section(cfg_model)
  n = 0
  if 'token' in heads:
    n += c.hidden_size * c.vocab_size
  if 'hier' in heads and c.num_levels > 1:
    n += c.hidden_size * c.num_levels
  return n


def per_token_forward_flops(cfg_model: Any, seq_len: int, heads: tuple[str, ...]) -> int:
  """F_tok = 2·(N_blocks + N_heads) + N_layers·4·L·H."""
  c = config_lib.ModelConfig.from_section(cfg_model)
  attention = c.num_layers * 4 * seq_len * c.hidden_size
  return 2 * (block_matmul_params(c) + head_matmul_params(c, heads)) + attention


def per_sequence_forward_flops(cfg_model: Any, heads: tuple[str, ...]) -> int:
  """F_seq: matrix products on the conditioning vector (once per sequence)."""
  c = config_lib.ModelConfig.from_section(cfg_model)
  h, cd = c.hidden_size, c.cond_dim
  if c.backbone == 'dit':
    time_embed = TIME_FREQ_DIM * cd + cd * cd  # sigma_map: always built (MDLM feeds σ = 0)
    n_adaln_heads = ('token' in heads) + ('hier' in heads and c.num_levels > 1)
    return 2 * (time_embed + c.num_layers * 6 * h * cd + n_adaln_heads * 2 * h * cd)
  if c.backbone == 'gpt2':
    if not c.time_conditioning:
      return 0
    return 2 * (TIME_FREQ_DIM * cd + cd * cd + cd * h)
  raise ValueError(f'model.backbone={c.backbone!r}: no FLOP formula (allowed dit, gpt2)')


def forward_flops(cfg_model: Any, batch_size: int, seq_len: int, heads: tuple[str, ...]) -> int:
  """FLOPs of one backbone pass with `heads` over [batch_size, seq_len] tokens.

  K = 1 with heads ('hier',) makes no network call (the model returns zeros): 0 FLOPs.
  """
  c = config_lib.ModelConfig.from_section(cfg_model)
  if c.num_levels == 1 and tuple(heads) == ('hier',):
    return 0
  return (batch_size * seq_len * per_token_forward_flops(c, seq_len, heads)
          + batch_size * per_sequence_forward_flops(c, heads))


def train_step_flops(cfg_model: Any, batch_size: int, seq_len: int | None = None) -> StepFlops:
  """F_step of one training step (loss + gradient) over a [batch_size, seq_len] batch."""
  c = config_lib.ModelConfig.from_section(cfg_model)
  seq_len = c.seq_len if seq_len is None else int(seq_len)
  passes = loss_passes(c)
  per_tok = tuple(per_token_forward_flops(c, seq_len, p) for p in passes)
  per_seq = tuple(per_sequence_forward_flops(c, p) for p in passes)
  fwd = sum(forward_flops(c, batch_size, seq_len, p) for p in passes)
  return StepFlops(
      per_token_forward=per_tok, per_sequence_forward=per_seq, forward=fwd, train_step=3 * fwd,
      num_passes=len(passes),
      matmul_params_per_token=tuple(block_matmul_params(c) + head_matmul_params(c, p)
                                    for p in passes))


# ----------------------------------------------------------------------------- jaxpr cross-check


def _dot_flops(eqn: Any) -> int:
  """2 · |output| · |contracted dims| of one dot_general equation."""
  (lhs_contract, _), _ = eqn.params['dimension_numbers']
  lhs = eqn.invars[0].aval
  out = eqn.outvars[0].aval
  k = math.prod(int(lhs.shape[d]) for d in lhs_contract)
  return 2 * math.prod(int(d) for d in out.shape) * k


def _sub_jaxprs(value: Any) -> list[Any]:
  if isinstance(value, jax.extend.core.ClosedJaxpr):
    return [value.jaxpr]
  if isinstance(value, jax.extend.core.Jaxpr):
    return [value]
  if isinstance(value, (tuple, list)):
    return [j for v in value for j in _sub_jaxprs(v)]
  return []


def _count(jaxpr: Any) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == 'dot_general':
      total += _dot_flops(eqn)
      continue
    if name == 'while':
      raise ValueError('jaxpr_matmul_flops: a while loop has no static trip count')
    if name == 'cond':  # the most expensive branch (an upper bound)
      total += max(_count(b.jaxpr) for b in eqn.params['branches'])
      continue
    inner = sum(_count(j) for v in eqn.params.values() for j in _sub_jaxprs(v))
    if name == 'scan':
      inner *= int(eqn.params['length'])
    total += inner
  return total


def jaxpr_matmul_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
  """Exact dot_general FLOPs of `fn(*args, **kwargs)` as traced by JAX (2 per multiply-add).

  Sub-jaxprs (jit, custom_jvp/vjp, remat, scan × length) are counted; for `cond` the most
  expensive branch is counted.
  """
  closed = jax.make_jaxpr(fn)(*args, **kwargs)
  return _count(closed.jaxpr)


def xla_flops(compiled: Any) -> float | None:
  """XLA's cost analysis 'flops' of a compiled executable (element-wise work included)."""
  try:
    ca = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except  (backend without cost analysis)
    return None
  if isinstance(ca, (list, tuple)):
    ca = ca[0] if ca else None
  if not ca or 'flops' not in ca:
    return None
  return float(ca['flops'])
