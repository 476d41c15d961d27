"""Hierarchy diagnostics of every Sudoku evaluation (docs/method.md §8.6; levels §6, decoding §10).

For a model with K > 1 levels (nothing is computed for its MDLM twin): the level accuracy of the
learned head on blank cells (pass 1 at t ~ U(t_min, 1) and at fixed t, against the labeller's
levels, per gold level, beside the majority-level prior), and the same checkpoint decoded several
ways (`DECODING_MODES`): with the head ignored, the head ordering the reveals ('head_order'),
ordering them and feeding pass 2 ('head_context'), and the same with the head REPLACED by the
labeller's levels ('labeller_order', 'labeller_context', and 'labeller_order_at_<k>' on level
k's cells only). The labeller needs only the givens, so its decodings are legitimate references
that anyone can run on a new puzzle, but they are not the learned head's: they are reported under
their own names, never as the model's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.config import SampleConfig
from hmdlm_jax.data import sudoku
from hmdlm_jax.evaluation import batches as batches_lib
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.processes import base as process_base

_ALL = tuple(range(sudoku.NUM_LEVELS))
# name -> (hierarchy_weight, level_context, the labeller levels whose cells take the labeller's
# level instead of the head's: () = the head everywhere)
DECODING_MODES: dict[str, tuple[float, str, tuple[int, ...]]] = {
    'head_ignored': (0.0, 'none', ()),
    'head_order': (1.0, 'none', ()),
    'head_context': (1.0, 'candidates', ()),
    'labeller_order': (1.0, 'none', _ALL),
    'labeller_context': (1.0, 'candidates', _ALL),
    **{f'labeller_order_at_{k}': (1.0, 'none', (k,)) for k in _ALL},
}
LEVEL_TIMES: tuple[float | str, ...] = ('random', 1.0, 0.75, 0.5)


def check_modes(modes: Sequence[str]) -> tuple[str, ...]:
  bad = [m for m in modes if m not in DECODING_MODES]
  if bad:
    raise ValueError(f'eval.hierarchy_decodings: unknown mode(s) {bad}; allowed '
                     f'{tuple(DECODING_MODES)}')
  return tuple(modes)


def mode_config(cfg: SampleConfig, mode: str) -> tuple[SampleConfig, tuple[int, ...]]:
  """The sampler settings of a decoding mode and the labeller levels whose cells take the
  labeller's level (`greedy` is left to the caller: evaluate_sudoku sets it per decoding)."""
  w, ctx, labeller = DECODING_MODES[mode]
  return dataclasses.replace(cfg, ordering='confidence', hierarchy_weight=w,
                             level_context=ctx), labeller


def _pass1_program(apply_fn: compiled.ApplyFn, process: process_base.Process):
  """Jitted (batch, key, t) -> (argmax level [B, L], masked [B, L]) at a corruption z_t."""

  def make(a: compiled.ApplyFn):
    def run(batch, key, t):
      state = process.corrupt(key, batch, t)
      logp = process.level_log_probs(a, batch, state, t)
      return jnp.argmax(logp, -1), state.levels == process.num_levels
    return run

  return compiled.jit_apply(apply_fn, make, ('level_accuracy', process))


def level_accuracy(apply_fn: compiled.ApplyFn, process: process_base.Process,
                   batches: Iterable[batches_lib.Batch], *, t_min: float, seed: int = 1234,
                   times: Sequence[float | str] = LEVEL_TIMES,
                   max_examples: int | None = None) -> dict[str, Any]:
  """Level accuracy of the head on the masked blank cells of each t setting (docs/method.md §8.6).

  Returns:
    {'t=<t>': {'accuracy', 'prior' (majority-level accuracy on the same cells), 'majority_level',
    'per_level' [K] (recall; None where no cell has that level), 'precision' [K] (the share of
    the cells predicted at a level that are at it; None where none is predicted there),
    'confusion' [K][K] (cell counts, [gold][predicted]), 'cells'}}.
  """
  run = _pass1_program(apply_fn, process)
  num_levels = process.num_levels
  out: dict[str, Any] = {}
  data = list(batches_lib.fixed_batches(batches, max_examples=max_examples,
                                        what='sudoku batches'))
  for i, t0 in enumerate(times):
    confusion = np.zeros((num_levels, num_levels), np.int64)  # [gold, predicted]
    for j, (batch, valid) in enumerate(data):
      b = {k: jnp.asarray(v) for k, v in process.prepare_batch(batch).items()}
      key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), i), j)
      k_t, k_mask = jax.random.split(key)
      n = len(valid)
      if t0 == 'random':
        t = process_base.sample_times(k_t, n, t_min=t_min)
      else:
        t = jnp.full((n,), float(t0), jnp.float32)
      pred, masked = jax.device_get(run(b, k_mask, t))
      sel = masked & np.asarray(batch['loss_mask'], bool) & np.asarray(valid, bool)[:, None]
      np.add.at(confusion, (np.asarray(batch['levels'])[sel], pred[sel]), 1)
    gold, predicted = confusion.sum(1), confusion.sum(0)
    cells = int(gold.sum())
    out[f't={t0}'] = {
        'accuracy': float(np.trace(confusion) / cells) if cells else None,
        'prior': float(gold.max() / cells) if cells else None,
        'majority_level': int(np.argmax(gold)),
        'per_level': [float(confusion[k, k] / gold[k]) if gold[k] else None
                      for k in range(num_levels)],
        'precision': [float(confusion[k, k] / predicted[k]) if predicted[k] else None
                      for k in range(num_levels)],
        'confusion': confusion.tolist(),
        'cells': cells,
    }
  return out


def summary_lines(diag: dict[str, Any], kinds: Sequence[str]) -> list[str]:
  """Printable lines of `hierarchy` results: level accuracy, then each decoding mode once per
  decoding kind of `kinds` it holds (tasks/sudoku.py passes its DECODINGS, the one list)."""
  lines = []
  for name, r in diag.get('level_accuracy', {}).items():
    if r['accuracy'] is None:
      continue
    per, prec = (' '.join('-' if a is None else f'{100 * a:.0f}' for a in r[key])
                 for key in ('per_level', 'precision'))
    lines.append(f'  level accuracy {name:8s} {100 * r["accuracy"]:.1f}% (prior '
                 f'{100 * r["prior"]:.1f}%; per level 0..K-1: recall {per}, precision {prec})')
  for mode, r in diag.get('decodings', {}).items():
    at = DECODING_MODES[mode][2]
    tag = ('' if not at else
           ' [reference: labeller levels from the givens, not the learned head]' if at == _ALL
           else f' [diagnostic: labeller levels on level-{at[0]} cells, the head elsewhere]')
    for kind in kinds:
      if kind not in r:
        continue
      m = r[kind]['mean']
      lines.append(f'  decoding {mode:17s} {kind:10s} solve {100 * m["solve_rate"]:.1f}%  cell '
                   f'acc {100 * m["cell_accuracy"]:.1f}%  level-0 cells '
                   f'{100 * (m.get("cell_accuracy_level_0") or 0):.1f}%{tag}')
  return lines
