"""Rows of the language tasks from a user's texts: prompts to complete, texts to infill, to score.

A prompt is a prefix: the row is `BOS prompt`, given, and the rest is generated (the model ends it
with EOS). An infill text marks what to generate with `[MASK]` (one token) or `[MASK*n]` (n
tokens); the row is `BOS text EOS PAD...` with every other position given, the text between
markers tokenised piece by piece. The given tokens' levels are the data's rule
(`text.labelled_row`, config.data.hierarchy) over the given tokens alone, the generated ones not
being known; the position rule counts a prompt as the given title (level 1) and infill text as
body (level 0). A scored text is one row of the data (`build_row`), as the test split's rows
are; one longer than the model's row is refused unless cutting it is asked for (`score_batches`).
Every mistake is one ValueError naming the input. Text the tokenizer cannot represent becomes
`[UNK]`, which decodes to nothing: the row keeps the tokenized text, and a one-line
`UnknownPiecesWarning` names those pieces.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Sequence

import numpy as np

from hmdlm_jax.data import text as text_data
from hmdlm_jax.data import tokenizers as tokenizers_lib

MARKER = re.compile(r'\[MASK(?:\*(\d+))?\]')
MARKER_HELP = '[MASK] for one token to generate, [MASK*n] for n tokens'
_SHOWN_PIECES = 5  # pieces named in a warning; it stays one short line


class UnknownPiecesWarning(UserWarning):
  """Input text has pieces outside the tokenizer's vocabulary: they became `[UNK]`."""


@dataclasses.dataclass(frozen=True)
class GivenRows:
  """Sampler conditioning rows: `batch` (tokens, levels, given, loss_mask [N, L], weight [N]; the
  batch contract) and, per row, its kind ('prompt' | 'infill') and input text."""
  batch: dict[str, np.ndarray]
  kinds: tuple[str, ...]
  inputs: tuple[str, ...]

  def __len__(self) -> int:
    return len(self.inputs)


def _unknown_pieces(tok: tokenizers_lib.TextTokenizer, text: str, ids: Sequence[int]
                    ) -> list[str]:
  """The pieces of `text` that `ids` (its `tok.encode`) holds as `[UNK]`, in order; for a
  tokenizer without character offsets (a slow one), '?' for each."""
  unk = tok.hf.unk_token_id
  if unk is None or unk not in ids:
    return []
  if not getattr(tok.hf, 'is_fast', False):
    return ['?'] * list(ids).count(unk)
  offsets = tok.hf(text, add_special_tokens=False, truncation=False,
                   return_offsets_mapping=True)['offset_mapping']
  return [text[a:b] for i, (a, b) in zip(ids, offsets) if i == unk]


def _unknown_note(name: str, unknown: Sequence[str], what: str, kept: str) -> str:
  """One line naming the `[UNK]` pieces of input `name` and the text the row keeps instead."""
  shown = list(dict.fromkeys(unknown))[:_SHOWN_PIECES]
  more = ', ...' if len(set(unknown)) > len(shown) else ''
  kept = kept if len(kept) <= 60 else kept[:57] + '...'
  count = (f'{len(unknown)} pieces are' if len(unknown) > 1 else '1 piece is') + (
      " not in the tokenizer's vocabulary and become" + ('' if len(unknown) > 1 else 's'))
  return (f"{name}: {count} [UNK]: "
          f"{', '.join(repr(p[:20]) for p in shown)}{more}; {what} {kept!r}")


def _row(config: Any, tokens: np.ndarray, segments: np.ndarray, given: np.ndarray
         ) -> dict[str, np.ndarray]:
  """The contract fields of one row; the rule sees only the given tokens (the rest as padding)."""
  seen = np.where(given, segments, text_data.SEG_PAD).astype(np.int8)
  row = text_data.labelled_row(tokens, seen, config.data.hierarchy, int(config.data.tau))
  return dict(row, given=given, loss_mask=~given)


def _checked(items: Sequence[str], names: Sequence[str]) -> None:
  for s, name in zip(items, names):
    if not isinstance(s, str):
      raise ValueError(f'{name} is a {type(s).__name__}, not a string')
    if not s.strip():
      raise ValueError(f'{name} is empty: give some text')


def prompt_row(config: Any, tok: tokenizers_lib.TextTokenizer, prompt: str, name: str,
               notes: list[str] | None = None) -> dict[str, np.ndarray]:
  """`BOS prompt` given, the rest of the row generated; a note on `[UNK]` pieces is appended to
  `notes`."""
  seq_len = int(config.model.seq_len)
  ids = tok.encode(prompt)
  if not ids:
    raise ValueError(f'{name} ({prompt[:40]!r}) has no tokens: give some text')
  if len(ids) > seq_len - 2:
    raise ValueError(f'{name} ({prompt[:40]!r}...) is {len(ids)} tokens; model.seq_len={seq_len} '
                     f'holds at most {seq_len - 2} with BOS and EOS: shorten it')
  unknown = _unknown_pieces(tok, prompt, ids)
  if unknown and notes is not None:
    notes.append(_unknown_note(name, unknown, 'the completion starts from the tokenized prompt',
                               tok.decode(ids, cut=False)))
  n = len(ids) + 1
  tokens = np.full((seq_len,), tok.pad_id, np.int32)
  tokens[:n] = [tok.bos_id] + ids
  segments = np.full((seq_len,), text_data.SEG_PROMPT, np.int8)
  return _row(config, tokens, segments, np.arange(seq_len) < n)


def infill_row(config: Any, tok: tokenizers_lib.TextTokenizer, text: str, name: str,
               notes: list[str] | None = None) -> dict[str, np.ndarray]:
  """`BOS text EOS PAD...` with the marked spans generated, everything else given; a note on
  `[UNK]` pieces is appended to `notes`."""
  seq_len = int(config.model.seq_len)
  ids: list[int] = []
  unknown: list[str] = []
  hidden: list[bool] = []
  pos, found = 0, False
  for m in list(MARKER.finditer(text)) + [None]:
    piece = text[pos:m.start() if m else len(text)]
    if piece.strip():
      new = tok.encode(piece)
      unknown += _unknown_pieces(tok, piece, new)
      ids += new
      hidden += [False] * len(new)
    if m is None:
      break
    count = int(m.group(1) or 1)
    if count < 1:
      raise ValueError(f'{name}: {m.group(0)} marks no token; write {MARKER_HELP}')
    ids += [tok.pad_id] * count
    hidden += [True] * count
    pos, found = m.end(), True
  if not found:
    raise ValueError(f'{name} ({text[:40]!r}) has no marker: write {MARKER_HELP}')
  if len(ids) > seq_len - 2:
    raise ValueError(f'{name} ({text[:40]!r}...) is {len(ids)} tokens with its markers; '
                     f'model.seq_len={seq_len} holds at most {seq_len - 2} with BOS and EOS: '
                     'shorten it')
  if unknown and notes is not None:
    kept = tok.decode([tok.mask_id if h else i for i, h in zip(ids, hidden)], cut=False)
    notes.append(_unknown_note(name, unknown, 'the infilled text keeps the tokenized text', kept))
  n = len(ids) + 2
  tokens = np.full((seq_len,), tok.pad_id, np.int32)
  tokens[:n] = [tok.bos_id] + ids + [tok.eos_id]
  segments = np.full((seq_len,), text_data.SEG_PAD, np.int8)
  segments[:n] = text_data.SEG_BODY
  given = np.ones((seq_len,), bool)
  given[1:n - 1] = ~np.asarray(hidden, bool)
  return _row(config, tokens, segments, given)


def given_rows(config: Any, tok: tokenizers_lib.TextTokenizer, prompts: Sequence[str] = (),
               infills: Sequence[str] = (), *, prompt_names: Sequence[str] | None = None,
               infill_names: Sequence[str] | None = None, stacklevel: int = 2) -> GivenRows:
  """The rows of `prompts` then `infills`; `*_names` name each input in error messages.

  Pieces outside the vocabulary become `[UNK]`, which decodes to nothing: each input holding any
  gets one `UnknownPiecesWarning` line naming them and the tokenized text its row keeps, issued
  once every row is valid, at `stacklevel` as the caller's own `warnings.warn` would take it
  (2: the caller's caller).
  """
  prompts, infills = list(prompts), list(infills)
  p_names = list(prompt_names or [f'prompts[{i}]' for i in range(len(prompts))])
  i_names = list(infill_names or [f'texts[{i}]' for i in range(len(infills))])
  _checked(prompts, p_names)
  _checked(infills, i_names)
  notes: list[str] = []
  rows = ([prompt_row(config, tok, p, n, notes) for p, n in zip(prompts, p_names)] +
          [infill_row(config, tok, t, n, notes) for t, n in zip(infills, i_names)])
  if not rows:
    raise ValueError('no prompt or text to condition on')
  for note in notes:
    warnings.warn(note, UnknownPiecesWarning, stacklevel=stacklevel + 1)
  batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
  return GivenRows(batch, ('prompt',) * len(prompts) + ('infill',) * len(infills),
                   tuple(prompts + infills))


def score_batches(config: Any, tok: tokenizers_lib.TextTokenizer, texts: Sequence[str],
                  name: str = 'texts', *, truncate: bool = False
                  ) -> list[dict[str, np.ndarray]]:
  """`texts` as the test split's rows (one body piece each), in batches of data.eval_batch_size,
  in order: dicts of tokens, levels, loss_mask... [B, L], L = model.seq_len.

  A text longer than a row holds (model.seq_len - 2 tokens with BOS and EOS) is refused, naming
  it: its bound would silently cover only the head. `truncate=True` cuts it to that head instead,
  as --mode=eval cuts the test split's rows under data.overlong='truncate'. Windows are not
  offered: each window's row opens with BOS and closes with EOS, so their sum is not the text's
  bound.
  """
  texts = list(texts)
  if not texts:
    raise ValueError(f'{name} is empty: give at least one text to score')
  _checked(texts, [f'{name}[{i}]' for i in range(len(texts))])
  seq_len = int(config.model.seq_len)
  rows = []
  for i, ids in enumerate(tok.encode_batch(texts)):
    if len(ids) > seq_len - 2 and not truncate:
      raise ValueError(f'{name}[{i}] is {len(ids)} tokens; model.seq_len={seq_len} holds at most '
                       f'{seq_len - 2} with BOS and EOS: split it into shorter texts, or pass '
                       f'truncate=True to score its first {seq_len - 2} tokens (what --mode=eval '
                       "does with data.overlong='truncate')")
    row = text_data.build_row(tok, text_data.ids_pieces(np.asarray(ids, np.int32)), seq_len,
                              overlong='truncate')
    rows.append(text_data.labelled_row(*row, config.data.hierarchy, int(config.data.tau)))
  size = int(config.data.eval_batch_size)
  return [{k: np.stack([r[k] for r in rows[i:i + size]]) for k in rows[0]}
          for i in range(0, len(rows), size)]
