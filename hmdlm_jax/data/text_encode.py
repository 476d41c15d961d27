"""A local text corpus tokenised once, with a per-file report of what `data.overlong` cuts.

The 'text' kind (data/text.py) reads the user's files; one line of them may be far longer than a
row (a minified JSON dump, a whole book on one line). `encode_examples` tokenises every example
once, up front, keeps the first `seq_len - 1` ids of each (enough for `text.build_row` to truncate
or drop it exactly as it would the whole example), and logs one line per file:

  INFO     <field>: <file> (<split> split): N examples, T tokens; all fit data.seq_len=L.
  WARNING  <field>: <file> (<split> split): n of N examples exceed data.seq_len=L (L - 2 tokens +
           BOS/EOS); data.overlong='truncate' cuts c of T tokens (p%); the longest is example #i
           (m tokens).                               (at most 300 characters: a long path is cut)

Overlong examples are a warning, never an error ('drop' skips such rows). Tokenising once also
keeps a very long line from being re-tokenised every epoch, which would slow training to a crawl.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from absl import logging

from hmdlm_jax.data import tokenizers as tokenizers_lib

CHUNK = 1024  # examples per tokenizer call
MAX_LINE = 300  # a log line (the project's rule for every message)


@dataclasses.dataclass
class FileStats:
  """What one file contributed to a split, and what the row length cut from it."""
  examples: int = 0
  tokens: int = 0
  overlong: int = 0
  overlong_tokens: int = 0
  longest: int = 0
  longest_index: int = 0

  def add(self, ids_len: int, room: int) -> None:
    self.examples += 1
    self.tokens += ids_len
    if ids_len > room:
      self.overlong += 1
      self.overlong_tokens += ids_len
    if ids_len > self.longest:
      self.longest, self.longest_index = ids_len, self.examples

  def message(self, label: str, split: str, seq_len: int, overlong: str) -> str:
    """The report line of this file (module docstring), at most MAX_LINE characters: a long
    label (the config field and its file) loses its middle."""
    if not self.overlong:
      body = f'{self.examples:,} examples, {self.tokens:,} tokens; all fit data.seq_len={seq_len}.'
    else:
      room = seq_len - 2
      lost = (self.overlong_tokens - self.overlong * room if overlong == 'truncate'
              else self.overlong_tokens)
      action = ('cuts' if overlong == 'truncate' else 'drops their rows:')
      body = (f'{self.overlong:,} of {self.examples:,} examples exceed data.seq_len={seq_len} '
              f"({room} tokens + BOS/EOS); data.overlong='{overlong}' {action} {lost:,} of "
              f'{self.tokens:,} tokens ({100.0 * lost / max(self.tokens, 1):.1f}%); the longest '
              f'is example #{self.longest_index} ({self.longest:,} tokens).')
    room = MAX_LINE - len(body) - len(f' ({split} split): ')
    if len(label) > room:
      keep = max(room - 1, 20)
      label = label[:keep // 3] + '…' + label[len(label) - (keep - keep // 3):]
    return f'{label} ({split} split): {body}'


def encode_examples(tok: tokenizers_lib.TextTokenizer, examples: Sequence[tuple[str, str]],
                    seq_len: int, overlong: str, *, split: str) -> list[np.ndarray]:
  """Token ids (int32, at most `seq_len - 1`) of `(file label, text)` examples, reported per file.

  Args:
    tok: the tokenizer.
    examples: (label naming the config field and the file, text) in corpus order.
    seq_len: data.seq_len (BOS and EOS included).
    overlong: data.overlong ('truncate' | 'drop'), for the report.
    split: 'train' | 'test', for the report.
  Returns:
    One id array per example, in order.
  """
  room = seq_len - 2
  stats: dict[str, FileStats] = {}
  out = []
  for start in range(0, len(examples), CHUNK):
    chunk = examples[start:start + CHUNK]
    for (label, _), ids in zip(chunk, tok.encode_batch([t for _, t in chunk])):
      stats.setdefault(label, FileStats()).add(len(ids), room)
      out.append(np.asarray(ids[:seq_len - 1], np.int32))
  for label, s in stats.items():
    log = logging.warning if s.overlong else logging.info
    log('%s', s.message(label, split, seq_len, overlong))
  return out
