"""Unigram baseline perplexity on exactly the tokens a diffusion evaluation scores.

A model that ignores all context can do no better, per token, than the unigram distribution of the
data, so a trained language model's test bound should sit well below the unigram perplexity of
the same test tokens. `unigram_perplexity` fits p(w) on the TRAIN split's loss tokens and scores
the TEST split's loss tokens, counting exactly the positions `perplexity.evaluate_perplexity`
counts (`loss_mask` of the real rows; eval padding rows count nowhere). Both splits must come from
the same tokenizer and row layout. Additive smoothing ('add-one', 'add-half' or 'none') over the
ids the model can emit, excluded ids (the MASK id) at probability 0, counts and logs in float64:
the formulas are in `unigram_log_probs` and docs/method.md §8.5.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from hmdlm_jax.evaluation import batches as batches_lib

# smoothing name -> pseudo-count a added to every emittable id.
SMOOTHING: dict[str, float] = {'add-one': 1.0, 'add-half': 0.5, 'none': 0.0}


@dataclasses.dataclass(frozen=True)
class UnigramResult:
  """Test-split unigram perplexity and what it was computed from.

  ppl: exp(nats_per_token); inf when smoothing='none' meets an unseen test token.
  nats_per_token: mean −log p(w) over the test loss tokens (float64).
  num_train_tokens / num_test_tokens: loss tokens counted in each split.
  num_unseen_test_tokens: test loss tokens whose id never occurs among the train loss tokens.
  vocab_size / num_excluded / smoothing: the model's support and its smoothing.
  """
  ppl: float
  nats_per_token: float
  num_train_tokens: int
  num_test_tokens: int
  num_unseen_test_tokens: int
  vocab_size: int
  num_excluded: int
  smoothing: str


def loss_token_counts(batches: Iterable[Mapping[str, np.ndarray]], vocab_size: int, *,
                      where: str = 'batches') -> np.ndarray:
  """Counts of every token id at the loss positions of the real rows.

  Args:
    batches: dicts with 'tokens' int [B, L] and 'loss_mask' bool [B, L], optionally 'weight' /
      'valid' [B] (0 = padding row, skipped).
    vocab_size: ids must lie in 0..vocab_size-1.
    where: name used in error messages.

  Returns:
    int64 [vocab_size].
  """
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
      or vocab_size < 1:
    raise ValueError(f'vocab_size must be an integer >= 1, got {vocab_size!r}.')
  counts = np.zeros((int(vocab_size),), np.int64)
  for j, batch in enumerate(batches):
    for name in ('tokens', 'loss_mask'):
      if name not in batch:
        raise ValueError(f'{where}[{j}] has no field {name!r} (fields: {sorted(batch)}).')
    tokens = np.asarray(batch['tokens'])
    loss_mask = np.asarray(batch['loss_mask'], bool)
    if tokens.ndim != 2 or loss_mask.shape != tokens.shape:
      raise ValueError(f'{where}[{j}]: tokens must be [B, L] and loss_mask the same shape, got '
                       f'{tokens.shape} and {loss_mask.shape}.')
    where_loss = loss_mask & batches_lib.row_validity(batch, f'{where}[{j}]')[:, None]
    ids = tokens[where_loss].astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
      raise ValueError(f'{where}[{j}]: loss token ids in [{ids.min()}, {ids.max()}] fall outside '
                       f'0..{vocab_size - 1} (vocab_size={vocab_size}).')
    counts += np.bincount(ids, minlength=int(vocab_size))
  return counts


def unigram_log_probs(train_counts: np.ndarray, *, smoothing: str = 'add-one',
                      excluded_ids: Sequence[int] = ()) -> np.ndarray:
  """float64 [V] log p(w) of the additively smoothed unigram model (docs/method.md §8.5).

  Over the V_eff = `V - len(excluded_ids)` ids the model can emit,
      p(w) = (c_train(w) + a) / (N_train + a · V_eff)
  with a = 1 ('add-one', Laplace), a = 1/2 ('add-half', Jeffreys / Krichevsky–Trofimov) or a = 0
  ('none', maximum likelihood). Excluded ids (the MASK id) get -inf, as the diffusion model's SUBS
  parameterisation gives MASK probability 0; so do unseen ids under smoothing='none', where a
  test token unseen in training makes the perplexity inf (reported, not hidden).
  """
  if smoothing not in SMOOTHING:
    raise ValueError(f'smoothing={smoothing!r}; allowed: {sorted(SMOOTHING)}.')
  counts = np.asarray(train_counts, np.float64)
  if counts.ndim != 1:
    raise ValueError(f'train_counts must be [V], got shape {counts.shape}.')
  v = counts.shape[0]
  support = np.ones((v,), bool)
  for i in excluded_ids:
    if not 0 <= int(i) < v:
      raise ValueError(f'excluded id {i} lies outside 0..{v - 1}.')
    support[int(i)] = False
  if counts[~support].any():
    bad = np.flatnonzero(~support & (counts > 0)).tolist()
    raise ValueError(f'excluded id(s) {bad} occur among the train loss tokens.')
  a = SMOOTHING[smoothing]
  total = counts.sum() + a * support.sum()
  if total <= 0:
    raise ValueError('No train loss tokens (every loss_mask empty?) and no smoothing: the unigram '
                     'model is undefined.')
  with np.errstate(divide='ignore'):
    return np.where(support, np.log(counts + a) - np.log(total), -np.inf)


def unigram_perplexity(train_batches: Iterable[Mapping[str, np.ndarray]],
                       test_batches: Iterable[Mapping[str, np.ndarray]], vocab_size: int, *,
                       smoothing: str = 'add-one',
                       excluded_ids: Sequence[int] = ()) -> UnigramResult:
  """Perplexity on the test split's loss tokens of a unigram model fit on the train split's.

  PPL = exp( -(1/N_test) Σ_{test loss tokens w} log p(w) ); rows whose 'weight' / 'valid' field is
  0 are the pipeline's eval padding and count nowhere; [CLS]/[SEP] carry loss and count like any
  token (docs/method.md §6).

  Args:
    train_batches, test_batches: pipeline batches ('tokens' [B, L], 'loss_mask' [B, L], optional
      'weight' / 'valid' [B]); use one pass over each split (e.g. the 'test' pipeline of a config
      whose test path is the train file).
    vocab_size: ids 0..vocab_size-1 (the model's vocabulary, MASK row included).
    smoothing: 'add-one' (default), 'add-half' or 'none' (`unigram_log_probs`).
    excluded_ids: ids with probability 0 (the MASK id: no data token and no model output).

  Returns:
    UnigramResult (float64 throughout).
  """
  if smoothing not in SMOOTHING:
    raise ValueError(f'smoothing={smoothing!r}; allowed: {sorted(SMOOTHING)}.')
  train = loss_token_counts(train_batches, vocab_size, where='train_batches')
  test = loss_token_counts(test_batches, vocab_size, where='test_batches')
  n_test = int(test.sum())
  if n_test == 0:
    raise ValueError('test_batches hold no loss tokens (every loss_mask empty?).')
  logp = unigram_log_probs(train, smoothing=smoothing, excluded_ids=excluded_ids)
  hit = test > 0
  if np.isneginf(logp[hit]).any():
    excluded = [i for i in excluded_ids if test[int(i)] > 0]
    if excluded:
      raise ValueError(f'excluded id(s) {excluded} occur among the test loss tokens.')
    nats = math.inf  # smoothing='none' and an unseen test token: the MLE gives it p = 0
  else:
    nats = float(-(test[hit] * logp[hit]).sum() / n_test)
  return UnigramResult(
      ppl=math.exp(nats) if nats < 709.0 else math.inf,
      nats_per_token=nats,
      num_train_tokens=int(train.sum()),
      num_test_tokens=n_test,
      num_unseen_test_tokens=int(test[train == 0].sum()),
      vocab_size=int(vocab_size),
      num_excluded=len(set(int(i) for i in excluded_ids)),
      smoothing=smoothing)
