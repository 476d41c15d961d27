"""Generative metrics of text samples (docs/method.md §8): entropy, generative PPL, MAUVE.

* Entropy: per-sequence unigram entropy of the sampled token ids (nats), averaged over sequences, as
  MDLM reports it (`entr(counts / counts.sum()).sum()` per sample). A collapsed, repetitive sampler
  has low entropy; read it next to gen PPL, which repetition lowers artificially.
* Generative perplexity: exp of the token-weighted mean NLL of the sample texts under an external
  autoregressive scorer (GPT-2 Large in the paper), on the torch CUDA device when there is one
  (`gen_ppl_device` says which). The scorer is pluggable (`ARScorer`): `TransformersGPT2Scorer`
  loads from the local Hugging Face cache only, unless HMDLM_HUB=1 allows a download (hub.py). When
  it cannot load, `gen_ppl` is `None` with `gen_ppl_unavailable_reason`, never a made-up number.
* MAUVE: via the `mauve-text` package, only when it is importable AND its featuriser (GPT-2 Large by
  default) loads as the scorer does. The features are computed here (last-token hidden state of the
  final layer, MAUVE's own featurisation) and handed to `mauve.compute_mauve`, so the package never
  downloads anything itself. Otherwise `mauve` is `None` with `mauve_unavailable_reason`.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from hmdlm_jax import hub

DEFAULT_SCORER = 'gpt2-large'
DEFAULT_FEATURIZER = 'gpt2-large'
# torch and mauve-text are the `eval` extra (pyproject.toml), not core dependencies.
EVAL_INSTALL = 'pip install "hmdlm_jax[eval]"'


# ----------------------------------------------------------------------------------------------
# Entropy.


def per_sequence_entropy(tokens: np.ndarray, valid: np.ndarray | None = None, *,
                         base: float = math.e) -> np.ndarray:
  """Unigram entropy of each sequence's token ids.

  Args:
    tokens: int `[N, L]` token ids.
    valid: bool `[N, L]` or None; only True positions are counted (e.g. the text before the first
      [SEP], or non-padding). None counts every position.
    base: logarithm base; e (nats) by default, as MDLM.

  Returns:
    float64 `[N]`: `-Σ_v p_v log p_v` with `p_v` = share of id v among the sequence's counted
    positions; NaN for a sequence with no counted position (entropy of nothing is undefined).
  """
  tokens = np.asarray(tokens)
  if tokens.ndim != 2:
    raise ValueError(f'per_sequence_entropy: tokens must be [N, L], got shape {tokens.shape}')
  if valid is None:
    valid = np.ones(tokens.shape, bool)
  valid = np.asarray(valid, bool)
  if valid.shape != tokens.shape:
    raise ValueError(f'per_sequence_entropy: valid shape {valid.shape} != tokens shape '
                     f'{tokens.shape}')
  if base <= 0 or base == 1:
    raise ValueError(f'per_sequence_entropy: base must be > 0 and != 1, got {base}')
  out = np.full(tokens.shape[0], np.nan, np.float64)
  for n in range(tokens.shape[0]):
    seq = tokens[n][valid[n]]
    if seq.size == 0:
      continue
    _, counts = np.unique(seq, return_counts=True)
    p = counts.astype(np.float64) / counts.sum()
    out[n] = float(-(p * np.log(p)).sum() / math.log(base))
  return out


def sample_entropy(tokens: np.ndarray, valid: np.ndarray | None = None, *,
                   base: float = math.e) -> float:
  """Mean over sequences of `per_sequence_entropy` (nats by default); empty sequences are skipped.

  Raises ValueError when no sequence has a counted position.
  """
  ent = per_sequence_entropy(tokens, valid, base=base)
  keep = ~np.isnan(ent)
  if not keep.any():
    raise ValueError('sample_entropy: every sequence is empty after masking; nothing to measure')
  return float(ent[keep].mean())


def entropy_report(tokens: np.ndarray, valid: np.ndarray | None = None) -> dict[str, Any]:
  """`{'entropy', 'entropy_num_sequences', 'entropy_num_empty'}` for a JSON report."""
  ent = per_sequence_entropy(tokens, valid)
  empty = int(np.isnan(ent).sum())
  return {
      'entropy': None if empty == len(ent) else float(np.nanmean(ent)),
      'entropy_num_sequences': int(len(ent) - empty),
      'entropy_num_empty': empty,
  }


# ----------------------------------------------------------------------------------------------
# Autoregressive scorers.


class ScorerUnavailableError(RuntimeError):
  """A scorer or featuriser cannot be used here (package missing, weights not cached locally)."""


class _NothingScored(ValueError):
  """No token of the texts could be scored: gen PPL is undefined."""


@runtime_checkable
class ARScorer(Protocol):
  """An autoregressive language model that scores texts.

  `score(texts)` returns, for every text, the float64 array of the NLLs (nats) of the text's scored
  tokens under the scorer's own tokenizer -- one entry per scored token, so callers can form both
  per-text means and the token-weighted corpus mean that MDLM reports.
  """

  name: str

  def score(self, texts: Sequence[str]) -> list[np.ndarray]:
    ...


def _require(module: str, purpose: str) -> Any:
  if importlib.util.find_spec(module) is None:
    raise ScorerUnavailableError(f'{purpose} needs the Python package {module!r}, which is not '
                                 f'installed: {EVAL_INSTALL}')
  return importlib.import_module(module)


def _load(loader: Any, name: str, what: str) -> Any:
  """`loader.from_pretrained(name)`: from the local cache only unless the Hub is enabled."""
  local = hub.local_files_only()
  try:
    return loader.from_pretrained(name, local_files_only=local)
  except (OSError, ValueError) as e:  # transformers raises OSError for files absent from the cache
    where = (f'not available locally (local_files_only=True; {hub.how_to_enable()})' if local else
             f'not loadable ({hub.ENV}=1: not cached and not fetched from the Hub)')
    raise ScorerUnavailableError(
        f'{what} {name!r} is {where}: {type(e).__name__}: {str(e).splitlines()[0]}') from e


def default_device(torch: Any) -> str:
  """The accelerator when torch sees one ('cuda'), else 'cpu'."""
  return 'cuda' if torch.cuda.is_available() else 'cpu'


class TransformersGPT2Scorer:
  """GPT-2 (PyTorch, `transformers`) as an `ARScorer`, from the local cache (or the Hub: `_load`).

  Scoring follows MDLM's `compute_generative_perplexity`: each text is tokenised without special
  tokens and cut into chunks of `max_length` tokens; within a chunk, token j > 0 is scored given
  tokens < j (the first token of a chunk has no context and is not scored, unless `prepend_bos`
  puts `<|endoftext|>` in front so that every token is scored).

  Raises:
    ScorerUnavailableError: torch/transformers missing, or `model_name` (a hub id or a local
      directory) not loadable (from the cache only unless HMDLM_HUB=1).
  """

  def __init__(self, model_name: str = DEFAULT_SCORER, *, batch_size: int = 8,
               max_length: int = 1024, device: str | None = None,
               prepend_bos: bool = False) -> None:
    if batch_size < 1 or max_length < 2:
      raise ValueError(f'TransformersGPT2Scorer: batch_size >= 1 and max_length >= 2 required, got '
                       f'{batch_size}, {max_length}')
    self._torch = _require('torch', 'the GPT-2 scorer')
    transformers = _require('transformers', 'the GPT-2 scorer')
    self.name = model_name
    self.tokenizer = _load(transformers.AutoTokenizer, model_name, 'scorer tokenizer')
    self.model = _load(transformers.AutoModelForCausalLM, model_name, 'scorer model')
    device = device or default_device(self._torch)  # None: the accelerator when there is one
    self.model.eval().to(device)
    self.device = device
    self.batch_size = batch_size
    self.max_length = max_length
    self.prepend_bos = prepend_bos
    if prepend_bos and self.tokenizer.bos_token_id is None:
      raise ValueError(f'TransformersGPT2Scorer: prepend_bos=True but {model_name!r} has no BOS '
                       'token')

  def _chunks(self, text: str) -> list[list[int]]:
    ids = list(self.tokenizer(text, add_special_tokens=False)['input_ids'])
    if self.prepend_bos:
      ids = [self.tokenizer.bos_token_id] + ids
    return [ids[i:i + self.max_length] for i in range(0, len(ids), self.max_length)]

  def score(self, texts: Sequence[str]) -> list[np.ndarray]:
    torch = self._torch
    # Flatten (text, chunk) pairs so batches are full regardless of text length.
    chunks: list[tuple[int, list[int]]] = []
    for n, text in enumerate(texts):
      chunks.extend((n, c) for c in self._chunks(text) if len(c) >= 2)
    per_text: list[list[np.ndarray]] = [[] for _ in texts]
    for b in range(0, len(chunks), self.batch_size):
      part = chunks[b:b + self.batch_size]
      width = max(len(c) for _, c in part)
      ids = torch.zeros((len(part), width), dtype=torch.long)
      attn = torch.zeros((len(part), width), dtype=torch.long)
      for r, (_, c) in enumerate(part):
        ids[r, :len(c)] = torch.tensor(c, dtype=torch.long)
        attn[r, :len(c)] = 1
      with torch.no_grad():
        logits = self.model(input_ids=ids.to(self.device),
                            attention_mask=attn.to(self.device)).logits.float()
      logp = torch.log_softmax(logits[:, :-1], dim=-1)
      nll = -logp.gather(-1, ids[:, 1:, None].to(self.device))[..., 0].double().cpu().numpy()
      for r, (n, c) in enumerate(part):
        per_text[n].append(nll[r, :len(c) - 1])
    return [np.concatenate(p) if p else np.zeros((0,), np.float64) for p in per_text]


def generative_perplexity(texts: Sequence[str], scorer: ARScorer) -> dict[str, Any]:
  """Token-weighted gen PPL: `exp(Σ_texts Σ_tokens nll / #scored tokens)`, summed in float64.

  Raises ValueError when nothing can be scored, FloatingPointError on a non-finite NLL.
  """
  nlls = scorer.score(list(texts))
  if len(nlls) != len(texts):
    raise ValueError(f'scorer {scorer.name!r} returned {len(nlls)} results for {len(texts)} texts')
  total, count = 0.0, 0
  for n, v in enumerate(nlls):
    v = np.asarray(v, np.float64)
    if not np.all(np.isfinite(v)):
      raise FloatingPointError(f'scorer {scorer.name!r}: non-finite NLL in text {n}: '
                               f'{texts[n]!r:.80}')
    total += float(v.sum())
    count += int(v.size)
  if count == 0:
    raise _NothingScored(f'scorer {scorer.name!r}: no token could be scored in {len(texts)} '
                         'texts (all empty or single-token)')
  mean = total / count
  out = {'gen_ppl': math.exp(mean), 'gen_nll_per_token': mean, 'gen_ppl_num_tokens': count,
         'gen_ppl_scorer': scorer.name}
  if getattr(scorer, 'device', None) is not None:  # where the scorer ran: 'cuda' or 'cpu'
    out['gen_ppl_device'] = str(scorer.device)
  return out


def gen_ppl_report(texts: Sequence[str], *, scorer: ARScorer | None = None,
                   model_name: str = DEFAULT_SCORER, unavailable_reason: str | None = None,
                   **scorer_kwargs: Any) -> dict[str, Any]:
  """Gen PPL with `scorer`, or with a locally cached `TransformersGPT2Scorer(model_name)`.

  When the scorer cannot be built (or `unavailable_reason` says so already, e.g. from
  `load_or_reason`) the result is `{'gen_ppl': None, 'gen_ppl_unavailable_reason': ...}`; so it is
  when no token of the texts can be scored (e.g. every sample empty: gen PPL is undefined). A
  non-finite NLL raises FloatingPointError.
  """
  if scorer is None and unavailable_reason is None:
    scorer, unavailable_reason = load_or_reason(TransformersGPT2Scorer, model_name,
                                                **scorer_kwargs)
  if scorer is None:
    return {'gen_ppl': None, 'gen_ppl_unavailable_reason': unavailable_reason,
            'gen_ppl_scorer': model_name}
  try:
    return generative_perplexity(texts, scorer)
  except _NothingScored as e:
    return {'gen_ppl': None, 'gen_ppl_unavailable_reason': str(e), 'gen_ppl_scorer': scorer.name}


def load_or_reason(factory: Any, *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
  """`(factory(*args, **kwargs), None)`, or `(None, reason)` on ScorerUnavailableError.

  Lets a caller load GPT-2 Large once for several sample sets (seeds).
  """
  try:
    return factory(*args, **kwargs), None
  except ScorerUnavailableError as e:
    return None, str(e)


# ----------------------------------------------------------------------------------------------
# MAUVE.


class TransformersFeaturizer:
  """MAUVE's featurisation: final-layer hidden state of the last token, GPT-2 loaded as the scorer.

  `features(texts) -> float32 [N, H]`; each text truncated to `max_length` tokens (MAUVE's
  `max_text_length`). An empty text (a sample that ended at once) is featurised as the
  tokenizer's EOS token, so it still counts as one sample.
  """

  def __init__(self, model_name: str = DEFAULT_FEATURIZER, *, max_length: int = 1024,
               device: str | None = None) -> None:
    self._torch = _require('torch', 'the MAUVE featuriser')
    transformers = _require('transformers', 'the MAUVE featuriser')
    self.name = model_name
    self.tokenizer = _load(transformers.AutoTokenizer, model_name, 'MAUVE featuriser tokenizer')
    self.model = _load(transformers.AutoModel, model_name, 'MAUVE featuriser model')
    device = device or default_device(self._torch)
    self.model.eval().to(device)
    self.device = device
    self.max_length = max_length

  def features(self, texts: Sequence[str]) -> np.ndarray:
    torch = self._torch
    feats = []
    for n, text in enumerate(texts):
      ids = list(self.tokenizer(text, add_special_tokens=False)['input_ids'])[:self.max_length]
      if not ids:
        if self.tokenizer.eos_token_id is None:
          raise ValueError(f'MAUVE featuriser: text {n} is empty and {self.name!r} has no EOS')
        ids = [self.tokenizer.eos_token_id]
      with torch.no_grad():
        out = self.model(input_ids=torch.tensor([ids], device=self.device),
                         output_hidden_states=True)
      feats.append(out.hidden_states[-1][0, -1].float().cpu().numpy())
    return np.stack(feats)


def mauve_unavailable() -> str | None:
  """Why MAUVE cannot run here (package missing), or None when `mauve` is importable."""
  if importlib.util.find_spec('mauve') is None:
    return f"the 'mauve-text' package (module 'mauve') is not installed: {EVAL_INSTALL}"
  return None


def mauve_report(samples: Sequence[str], references: Sequence[str] | Callable[[], Sequence[str]],
                 *, featurizer: TransformersFeaturizer | None = None,
                 featurize_model_name: str = DEFAULT_FEATURIZER,
                 unavailable_reason: str | None = None, seed: int = 25,
                 **mauve_kwargs: Any) -> dict[str, Any]:
  """MAUVE(samples, references) when `mauve-text` and the featuriser are available.

  `references` may be a callable, called only when MAUVE can run (reading a test split for
  nothing is avoided). Returns `{'mauve': float, ...}` or `{'mauve': None,
  'mauve_unavailable_reason': str}`.
  """
  reason = unavailable_reason or mauve_unavailable()
  if reason is None and featurizer is None:
    featurizer, reason = load_or_reason(TransformersFeaturizer, featurize_model_name)
  if reason is not None:
    return {'mauve': None, 'mauve_unavailable_reason': reason}
  refs = list(references() if callable(references) else references)
  if not samples or not refs:
    return {'mauve': None, 'mauve_unavailable_reason':
            f'need samples and reference texts, got {len(samples)} and {len(refs)}'}
  mauve = importlib.import_module('mauve')
  p = featurizer.features(samples)
  q = featurizer.features(refs)
  out = mauve.compute_mauve(p_features=p, q_features=q, seed=seed, verbose=False, **mauve_kwargs)
  return {'mauve': float(out.mauve), 'mauve_featurizer': featurizer.name,
          'mauve_device': str(featurizer.device), 'mauve_num_samples': len(samples),
          'mauve_num_references': len(refs)}
