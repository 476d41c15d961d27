r"""WikiHow (Koupaee & Wang 2018) for HMDLM fine-tuning (docs/method.md §6; paper §5.1.2, App. C).

Sources (`data.train_path` / `data.test_path`, or one path + `data.test_fraction`): the public
`wikihowAll.csv`, or a Hugging Face `datasets` export with the same three fields (JSON lines or
parquet); `read_articles` says how fields and malformed rows are handled. Row (GPT-2 tokenizer,
L ∈ {256, 512, 1024}):
  BOS title\n summary\n body EOS EOS...        (BOS = EOS = <|endoftext|>; padding = EOS)
  given:     BOS + title          (never corrupted, no loss)
  generated: summary + body + EOS (loss; padding corrupted but without loss)
Whitespace is normalised, overlong articles are dropped by default (`data.overlong='drop'`, the
paper's filtering), levels come from the 'position' (default) or 'frequency' rule, and a single
path is split by a hash of the title: docs/method.md §6 ("WikiHow").
"""

from __future__ import annotations

import csv
import io
import logging
import re
import sys
from typing import Any

from etils import epath
import grain

from hmdlm_jax import storage
from hmdlm_jax.data import pipeline
from hmdlm_jax.data import text as text_lib
from hmdlm_jax.data import tokenizers as tokenizers_lib

FIELDS = ('title', 'headline', 'text')  # title, summary, body
SEQ_LENS = (256, 512, 1024)  # the paper's context lengths


def normalise(s: str) -> str:
  return ' '.join(s.split())


def make_article(title: str, headline: str, body: str) -> dict[str, str] | None:
  """Normalised {'title', 'summary', 'body'}, or None when a field is empty."""
  summary = re.sub(r'\.,(?=\s*(\n|$))', '.', headline)  # the CSV's '.,\n' separators
  art = {'title': normalise(title), 'summary': normalise(summary), 'body': normalise(body)}
  return art if all(art.values()) else None


def _check_fields(row: Any, where: str) -> None:
  if not isinstance(row, dict):
    raise ValueError(f'{where}: expected an object with fields {FIELDS}, got {type(row).__name__}.')
  missing = [f for f in FIELDS if f not in row]
  if missing:
    raise ValueError(f'{where}: missing field(s) {missing}; WikiHow rows need {FIELDS}.')
  bad = [f for f in FIELDS if not isinstance(row[f], str)]
  if bad:
    raise ValueError(f'{where}: field(s) {bad} are not strings ({[row[f] for f in bad]!r}).')


def read_csv(path: epath.Path) -> tuple[list[dict[str, str]], int]:
  """wikihowAll.csv -> (articles, number of empty rows skipped)."""
  csv.field_size_limit(sys.maxsize)
  out, skipped = [], 0
  # epath's open() takes no newline=; csv needs newline='' (quoted fields may hold newlines).
  with io.TextIOWrapper(path.open('rb'), encoding='utf-8', newline='') as f:
    reader = csv.reader(f)
    try:
      header = next(reader)
    except StopIteration:
      raise ValueError(f'{path}:1: empty file; expected a header with {FIELDS}.') from None
    missing = [c for c in FIELDS if c not in header]
    if missing:
      raise ValueError(f'{path}:1: header {header} lacks column(s) {missing}.')
    cols = {c: header.index(c) for c in FIELDS}
    start = reader.line_num + 1
    while True:
      try:
        rec = next(reader)
      except StopIteration:
        break
      except csv.Error as e:
        raise ValueError(f'{path}:{start}: malformed CSV ({e}).') from e
      if not rec:  # a blank line
        start = reader.line_num + 1
        continue
      if len(rec) != len(header):
        raise ValueError(f'{path}:{start}: {len(rec)} fields, the header has {len(header)}.')
      skipped += not _append(out, make_article(rec[cols['title']], rec[cols['headline']],
                                                rec[cols['text']]))
      start = reader.line_num + 1
  return out, skipped


def _append(out: list[dict[str, str]], art: dict[str, str] | None) -> bool:
  """Appends a kept article; False for one `make_article` skipped."""
  if art is not None:
    out.append(art)
  return art is not None


def read_jsonl(path: epath.Path) -> tuple[list[dict[str, str]], int]:
  out, skipped = [], 0
  with path.open(encoding='utf-8') as f:  # a UnicodeDecodeError is named by read_articles
    raw = f.read()
  for n, row in pipeline.json_lines(raw, path):
    _check_fields(row, f'{path}:{n}')
    skipped += not _append(out, make_article(row['title'], row['headline'], row['text']))
  return out, skipped


def read_parquet(path: epath.Path) -> tuple[list[dict[str, str]], int]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(f'{path}: reading parquet needs pyarrow (pip install "pyarrow>=26").') from e
  with path.open('rb') as f:  # a file object: pyarrow would take a gs:// string to its own GCS
    table = pq.read_table(f)
  missing = [c for c in FIELDS if c not in table.column_names]
  if missing:
    raise ValueError(f'{path}: parquet columns {table.column_names} lack {missing}.')
  out, skipped = [], 0
  for i, row in enumerate(table.select(list(FIELDS)).to_pylist()):
    _check_fields(row, f'{path}: row {i}')
    skipped += not _append(out, make_article(row['title'], row['headline'], row['text']))
  return out, skipped


READERS = {'.csv': read_csv, '.jsonl': read_jsonl, '.json': read_jsonl, '.parquet': read_parquet}


def read_articles(path: str, field: str = 'data.train_path') -> list[dict[str, str]]:
  """Articles of a WikiHow file (.csv / .jsonl / .json / .parquet) or of a folder of them.

  The public `wikihowAll.csv` has the columns `headline` = summary, `title` and `text` = body
  (read with the stdlib csv module; extra columns are ignored); a Hugging Face `datasets` export
  has the same three fields as JSON lines (`.jsonl` / `.json`, stdlib) or parquet (`.parquet`,
  needs pyarrow). A row missing a field, with a non-string field, or unparsable raises ValueError
  naming the file and line (CSV: the line the record starts on; JSON lines: the line; parquet:
  the row index). Rows whose title, summary or body is empty after whitespace normalisation carry
  no example and are skipped; the number skipped is logged.
  """
  p = storage.as_path(path)
  if p.is_dir():
    files = sorted(f for f in p.iterdir() if f.suffix in READERS)
    if not files:
      raise ValueError(f'config.{field}={path!r}: folder holds no {sorted(READERS)} files.')
  elif p.is_file():
    if p.suffix not in READERS:
      raise ValueError(f'config.{field}={path!r}: unknown WikiHow file type {p.suffix!r}; '
                       f'allowed {sorted(READERS)}.')
    files = [p]
  else:
    raise ValueError(f'config.{field}={path!r}: no such file or folder.')
  out = []
  for f in files:
    try:
      arts, skipped = READERS[f.suffix](f)
    except UnicodeDecodeError:
      raise pipeline.not_utf8(f, prefix=f'config.{field}: {f} is ',
                              hint='convert it with iconv -t utf-8.') from None
    if skipped:
      logging.warning('%s: skipped %d rows with an empty title, summary or body.', f, skipped)
    out.extend(arts)
  return out


def wikihow_pieces(article: dict[str, str]) -> list[tuple[str, int]]:
  """Row pieces: title (given prompt), summary, body; '\\n' ends the first two (see above)."""
  return [(article['title'] + '\n', text_lib.SEG_PROMPT),
          (article['summary'] + '\n', text_lib.SEG_SUMMARY),
          (article['body'], text_lib.SEG_BODY)]


def check_wikihow_config(config: Any) -> tokenizers_lib.TextTokenizer:
  """What WikiHow checks before reading its files (fields, tokenizer, paths); the tokenizer."""
  tok = text_lib.text_tokenizer(config, allowed_rules=('position', 'frequency', 'none'))
  text_lib.check_local_paths(config)
  return tok


def make_wikihow_dataset(config: Any, split: str, *, seed: int, process_index: int,
                         process_count: int) -> grain.IterDataset:
  """WikiHow batches {tokens, levels, given, loss_mask} [B, L] (module docstring)."""
  tok = check_wikihow_config(config)
  records = text_lib.split_records(config, split, read_articles, lambda a: a['title'])
  encode = text_lib.EncodeRows(tok, wikihow_pieces, text_lib.data_seq_len(config),
                               config.data.overlong)
  return text_lib.batched_dataset(records, encode, config, split, seed=seed,
                                  process_index=process_index, process_count=process_count)
