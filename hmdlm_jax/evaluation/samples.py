"""Rows from the reverse process (docs/method.md §7), unconditional or conditioned on given positions.

`sampler` compiles `process.sample` once per (network, process, settings, shape); `sample_rows`
draws any number of rows in fixed-shape batches; `given_inputs` turns a pipeline batch into the
sampler's conditioning, hiding everything that is not given.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import progress as progress_lib
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.evaluation import batches as batches_lib
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.processes import base as process_base


def with_fixed_levels(apply_fn: compiled.ApplyFn, levels: jax.Array, num_levels: int,
                      where: jax.Array | None = None) -> compiled.ApplyFn:
  """apply_fn whose hierarchy head returns the given levels [B, L] (log one-hot logits).

  A reference decoding, not the learned head: e.g. Sudoku levels computed by the labeller from the
  givens alone (docs/method.md §10). Non-level logits are -1e4 (finite: the prior correction then
  never leaves a row without mass). With `where` (bool [B, L]) only those positions take the given
  levels and the head's own logits stay elsewhere (a per-cell mix: every use of the logits
  normalises over the K levels of one position).
  """
  levels = jnp.asarray(levels)

  def wrapped(tokens, lv, t, *, heads, token_levels=None):
    out = dict(apply_fn(tokens, lv, t, heads=heads, token_levels=token_levels))
    if 'hier' in heads:
      onehot = levels[..., None] == jnp.arange(num_levels)
      fixed = jnp.where(onehot, 0.0, -1e4).astype(jnp.float32)
      if where is not None:
        fixed = jnp.where(jnp.asarray(where)[..., None], fixed, out['hier'].astype(jnp.float32))
      out['hier'] = fixed
    return out

  return wrapped


def sampler(apply_fn: compiled.ApplyFn, process: process_base.Process, cfg: SampleConfig, *,
            batch_size: int, seq_len: int,
            fixed_levels: bool = False) -> Callable[..., process_base.SampleOutput]:
  """Jitted `(key[, given_tokens, given_levels, given_mask]) -> SampleOutput` for [B, L] rows.

  The process validates the settings first (`check_sampling`). With `fixed_levels` the program
  takes levels int32 [B, L], which replace the hierarchy head's output, and optionally `where` bool
  [B, L], the positions they replace it at (default: all; `with_fixed_levels`).
  """
  process.check_sampling(cfg)

  def make(a: compiled.ApplyFn) -> Callable[..., process_base.SampleOutput]:
    def run(key, given_tokens=None, given_levels=None, given_mask=None, levels=None,
            where=None):
      if fixed_levels:
        a_run = with_fixed_levels(a, levels, cfg.num_levels, where)
      else:
        a_run = a
      return process.sample(a_run, key, cfg, batch_size=batch_size, seq_len=seq_len,
                            given_tokens=given_tokens, given_levels=given_levels,
                            given_mask=given_mask)
    return run

  return compiled.jit_apply(apply_fn, make, ('sample', process, cfg, batch_size, seq_len,
                                             fixed_levels))


def given_inputs(batch: batches_lib.Batch, process: process_base.Process, cfg: SampleConfig
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Sampler conditioning int32/int32/bool [B, L]: the given tokens and levels (levels as the
  process sees them, `prepare_batch`); MASK / h_m elsewhere, so no answer leaks."""
  given = np.asarray(batch['given'], bool)
  tokens = np.where(given, batch['tokens'], cfg.mask_id).astype(np.int32)
  levels = np.where(given, process.prepare_batch(batch)['levels'], cfg.num_levels)
  return tokens, levels.astype(np.int32), given


@dataclasses.dataclass
class SampledRows:
  """Generated rows on the host: tokens/levels/reveal_step int [N, L], given bool [N, L]; nfe
  int [N], the network calls the sampler made for each row's batch (measured, not configured:
  a cached call with nothing revealed is not made, docs/method.md §7)."""
  tokens: np.ndarray
  levels: np.ndarray
  reveal_step: np.ndarray
  given: np.ndarray
  nfe: np.ndarray


def sample_rows(apply_fn: compiled.ApplyFn, key: jax.Array, process: process_base.Process,
                cfg: SampleConfig, *, num_samples: int, seq_len: int, batch_size: int,
                prompts: Iterable[batches_lib.Batch] | None = None,
                progress: bool = False) -> SampledRows:
  """`num_samples` rows from the reverse process, in batches of `batch_size` (one compilation).

  With `prompts` (pipeline batches whose `given` positions are e.g. WikiHow titles), sample n is
  conditioned on the given positions of the n-th valid prompt row; otherwise sampling is
  unconditional. Batch j uses `fold_in(key, j)`.
  """
  if num_samples < 1 or batch_size < 1:
    raise ValueError(f'sample_rows: num_samples and batch_size must be >= 1, got {num_samples}, '
                     f'{batch_size}')
  run = sampler(apply_fn, process, cfg, batch_size=batch_size, seq_len=seq_len)
  prompt_iter = None if prompts is None else batches_lib.rebatch(prompts, batch_size)
  parts: dict[str, list[np.ndarray]] = {'tokens': [], 'levels': [], 'reveal_step': [], 'given': [],
                                       'nfe': []}
  done, j = 0, 0
  bar = progress_lib.bar(desc='sampling', unit='batch', enabled=progress, leave=False,
                         total=-(-num_samples // batch_size))
  while done < num_samples:
    k = jax.random.fold_in(key, j)
    if prompt_iter is not None:
      try:
        batch, valid = next(prompt_iter)
      except StopIteration:
        raise ValueError(f'sample_rows: only {done} prompt rows for {num_samples} '
                         'samples') from None
      take = int(valid.sum())
      gt, gl, given = given_inputs(batch, process, cfg)
      out = jax.device_get(run(k, gt, gl, given))
    else:
      take = batch_size
      out = jax.device_get(run(k))
      given = np.zeros((batch_size, seq_len), bool)
    take = min(take, num_samples - done)
    for name, arr in (('tokens', out.tokens), ('levels', out.levels),
                      ('reveal_step', out.reveal_step), ('given', given)):
      parts[name].append(np.asarray(arr)[:take])
    parts['nfe'].append(np.full(take, int(out.nfe), np.int64))
    done += take
    j += 1
    bar.update()
  bar.close()
  return SampledRows(**{n: np.concatenate(v) for n, v in parts.items()})
