"""The level pathway's section of the config, `model.pathway` (docs/method.md §4.7), and its checks.

The defaults build no pathway: the paper's level head on the backbone's features. Its settings
reach the network in one place (models/pathway.py `settings`); `check_pathway` raises one
ValueError naming the field and what to set.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hmdlm_jax.config.checks import check_bool
from hmdlm_jax.config.checks import check_int

READOUTS = ('head', 'rounds')
SOURCES = ('features', 'input')


@dataclasses.dataclass(frozen=True)
class PathwayConfig:
  """`model.pathway`: blocks between the features and the level head; all its parameters are
  named 'hier_*' and only the hierarchy terms train them."""
  layers: int = 0  # N blocks of the backbone's own kind (the hierarchy trunk); 0 = none
  repeats: int = 1  # apply the N blocks R times with tied weights (R > 1: recurrent, RRN-style)
  time_conditioning: bool = False  # the pathway reads its own embedding of t
  input_embed: bool = False  # the pathway adds its own table of input states (level, h_m, h_g)
  # 'head': the backbone's level head on the pathway's output; 'rounds': one hazard readout per
  # repeat, levels by stick-breaking (needs repeats = num_levels - 1; models/pathway.py).
  readout: str = 'head'
  width: int = 0  # width of the trunk's blocks (0 = hidden_size); narrower = cheaper pass 1
  num_heads: int = 0  # attention heads of the trunk's blocks (0 = num_heads); fewer = cheaper
  # What the pathway reads: 'features' (the backbone's final hidden state, the paper) | 'input'
  # (the embedded input before the backbone's blocks: a level network of its own beside it).
  source: str = 'features'
  round_tokens: bool = False  # derived: loss.beta_rounds > 0 (a token head on each round)


def check_pathway(p: PathwayConfig, model: dict[str, Any]) -> None:
  """Raises ValueError for an invalid or inconsistent `model.pathway` given the `model` values
  (num_levels, hidden_size, num_heads, position_embedding)."""
  f = 'model.pathway.'
  check_int(f + 'layers', p.layers, minimum=0)
  check_int(f + 'repeats', p.repeats, minimum=1)
  check_int(f + 'width', p.width, minimum=0)
  check_int(f + 'num_heads', p.num_heads, minimum=0)
  for name in ('time_conditioning', 'input_embed', 'round_tokens'):
    check_bool(f + name, getattr(p, name))
  width = p.width or model['hidden_size']
  heads = p.num_heads or model['num_heads']
  own = p.width or p.num_heads  # else the trunk's, checked with it
  if own and width % heads:
    raise ValueError(f"{f}width={p.width} (0 = hidden_size = {model['hidden_size']}) must be "
                     f"divisible by the pathway's heads, {f}num_heads={p.num_heads} (0 = "
                     f"num_heads = {model['num_heads']}).")
  if own and model['position_embedding'] == 'rotary' and (width // heads) % 2:
    raise ValueError(f'{f}num_heads={heads}: rotary embeddings need an even head dimension in '
                     f'the hierarchy pathway (width {width} / {heads} heads).')
  if p.repeats > 1 and p.layers == 0:
    raise ValueError(f'{f}repeats={p.repeats} repeats the hierarchy trunk, which has no blocks: '
                     f'set {f}layers >= 1 (or repeats=1).')
  if p.readout not in READOUTS:
    raise ValueError(f'{f}readout={p.readout!r} is not one of {READOUTS}.')
  k = model['num_levels']
  if p.readout == 'rounds' and k > 1 and (p.layers == 0 or p.repeats != k - 1):
    raise ValueError(f"{f}readout='rounds' reads one hazard per round: it needs {f}layers >= 1 "
                     f'and {f}repeats = model.num_levels - 1 = {k - 1} (got {p.layers}, '
                     f'{p.repeats}).')
  if p.source not in SOURCES:
    raise ValueError(f'{f}source={p.source!r} is not one of {SOURCES}.')
  if p.round_tokens and (p.readout != 'rounds' or k == 1):
    raise ValueError(f"loss.beta_rounds > 0 ({f}round_tokens) reads the token of each round: it "
                     f"needs {f}readout='rounds' and model.num_levels > 1 (got {p.readout!r}, "
                     f'{k}).')
