"""`prepare`: tokenise a corpus ONCE into ArrayRecord shards for the 'corpus' kind (data/corpus.py).

    python -m hmdlm_jax.data.prepare --input=PATH_OR_GLOB --output=DIR --tokenizer=NAME \
        [--split=train|test] [--workers=N] [--text_field=text] [--text_unit=line] [--shard_mb=128]

Inputs: plain text (.txt, a document per line or paragraph), JSON lines (.jsonl/.json, objects
with a string --text_field), parquet (a Hugging Face export; column --text_field); a folder: its
files of those kinds. They are cut into work units (line-aligned byte ranges, runs of parquet row
groups); N worker processes each write whole shards DIR/SPLIT/shard-I-of-N.array_record (a record =
one document's ids, uint16 or uint32), atomically, then NAME.lengths.npy and NAME.json (finished).
A rerun skips finished shards and refuses another tokenizer or input list; last comes
DIR/SPLIT/manifest.json (documents, tokens, shards with their sizes and sha256, tokenizer name and
hash, sources). A gs:// output is staged locally and each finished shard uploaded there whole with
etils.epath; training reads it from there (data/corpus_cache.py).
"""

from __future__ import annotations

import argparse
import codecs
import concurrent.futures
import errno
import glob
import hashlib
import io
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from array_record.python import array_record_module
from etils import epath

from hmdlm_jax import parent_watch
from hmdlm_jax import storage
from hmdlm_jax.data import tokenizers as tokenizers_lib

FORMAT = 'hmdlm_jax.corpus/1'
MANIFEST_FILE = 'manifest.json'
PLAN_FILE = 'plan.json'
SHARD_SUFFIX = '.array_record'
LENGTHS_SUFFIX = '.lengths.npy'
SPLITS = ('train', 'test')
TEXT_UNITS = ('line', 'paragraph')
TEXT_SUFFIXES = ('.txt', '.text')
JSON_SUFFIXES = ('.jsonl', '.json')
PARQUET_SUFFIXES = ('.parquet',)
SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
CHUNK = 1024  # documents per tokenizer call
SNIFF_BYTES = 1 << 16  # of each text / JSON input, checked to be UTF-8 before anything is written


def input_files(spec: str) -> list[str]:
  """The files of `--input`: a file, a folder (its files of known kinds, recursively) or a glob."""
  p = os.path.expanduser(spec)
  if os.path.isdir(p):
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs
                   if f.endswith(SUFFIXES))
  elif os.path.isfile(p):
    files = [p]
  else:
    files = sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f))
  if not files:
    raise ValueError(f'--input={spec!r}: no such file, or no {"/".join(SUFFIXES)} files there.')
  bad = [f for f in files if not f.endswith(SUFFIXES)]
  if bad:
    raise ValueError(f'--input: {bad[0]} is not one of {SUFFIXES}; convert it or leave it out.')
  return files


def _line_ranges(path: str, chunk_bytes: int) -> list[tuple[int, int]]:
  """[start, stop) byte ranges of about `chunk_bytes`, each starting at the start of a line."""
  size = os.path.getsize(path)
  starts = [0]
  with open(path, 'rb') as f:
    while starts[-1] + chunk_bytes < size:
      f.seek(starts[-1] + chunk_bytes)
      f.readline()  # to the start of the next line
      if f.tell() >= size:
        break
      starts.append(f.tell())
  return list(zip(starts, starts[1:] + [size]))


def plan(files: Sequence[str], shard_mb: float, text_unit: str) -> list[dict[str, Any]]:
  """Work units in corpus order: {'source', 'kind', 'start', 'stop'} (bytes, or row groups)."""
  if not shard_mb > 0:
    raise ValueError(f'--shard_mb={shard_mb} must be > 0.')
  chunk = max(1, int(shard_mb * 2**20))
  units = []
  for f in files:
    if f.endswith(PARQUET_SUFFIXES):
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
      meta = pq.ParquetFile(f).metadata
      start, size = 0, 0
      for g in range(meta.num_row_groups):
        size += meta.row_group(g).total_byte_size
        if size >= chunk or g == meta.num_row_groups - 1:
          units.append({'source': f, 'kind': 'parquet', 'start': start, 'stop': g + 1})
          start, size = g + 1, 0
    elif f.endswith(TEXT_SUFFIXES) and text_unit == 'paragraph':  # paragraphs: the whole file
      units.append({'source': f, 'kind': 'paragraph', 'start': 0, 'stop': os.path.getsize(f)})
    else:
      kind = 'jsonl' if f.endswith(JSON_SUFFIXES) else 'line'
      units += [{'source': f, 'kind': kind, 'start': a, 'stop': b}
                for a, b in _line_ranges(f, chunk)]
  n = len(units)
  for i, u in enumerate(units):
    u['name'] = f'shard-{i:05d}-of-{n:05d}'
  return units


def paragraphs(text: str) -> Iterator[str]:
  """Paragraphs (runs of non-blank lines, joined by spaces) of a plain text."""
  cur: list[str] = []
  for line in text.splitlines() + ['']:
    if line.strip():
      cur.append(line.strip())
    elif cur:
      yield ' '.join(cur)
      cur = []


def documents(unit: dict[str, Any], text_field: str) -> Iterator[str]:
  """The documents of one work unit, in file order."""
  path, kind = unit['source'], unit['kind']
  if kind == 'parquet':
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    f = pq.ParquetFile(path)
    if text_field not in f.schema_arrow.names:
      raise ValueError(f'{path}: no column {text_field!r} (columns: {f.schema_arrow.names}); '
                       'set --text_field.')
    for g in range(unit['start'], unit['stop']):
      for t in f.read_row_group(g, columns=[text_field]).column(0).to_pylist():
        if t is not None and not isinstance(t, str):
          raise ValueError(f'{path}: column {text_field!r} holds {type(t).__name__}, not text.')
        if t:
          yield t
    return
  with open(path, 'rb') as fh:
    fh.seek(unit['start'])
    raw = fh.read(unit['stop'] - unit['start'])
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    raise ValueError(f'--input: {path} is not UTF-8 text (byte {raw[e.start:e.start + 1]!r} at '
                     f'offset {unit["start"] + e.start:,}); convert it with iconv -t utf-8.'
                     ) from None
  if kind == 'paragraph':
    yield from paragraphs(text)
  elif kind == 'line':
    yield from (line.strip() for line in text.splitlines() if line.strip())
  else:
    where = f'{path} (lines counted from byte {unit["start"]})'
    for n, line in enumerate(text.split('\n'), start=1):  # '\n' only: JSON may hold U+2028
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{where}:{n}: not valid JSON ({e.msg}).') from None
      if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
        raise ValueError(f'{where}:{n}: expected an object with a string field {text_field!r}; '
                         'set --text_field.')
      if obj[text_field]:
        yield obj[text_field]


def tokenizer_hash(tok: tokenizers_lib.TextTokenizer) -> str:
  """sha256 of everything that decides the ids: the tokenizer's full JSON (vocabulary,
  normaliser, pre-tokeniser, model), or its class and vocabulary when it has no fast backend."""
  backend = getattr(tok.hf, 'backend_tokenizer', None)
  if backend is not None:
    blob = backend.to_str()
  else:
    blob = type(tok.hf).__name__ + json.dumps(sorted(tok.hf.get_vocab().items()))
  return hashlib.sha256(blob.encode('utf-8')).hexdigest()


def record_dtype(tok: tokenizers_lib.TextTokenizer) -> str:
  """'uint16' when every id fits (GPT-2, BERT), else 'uint32'."""
  return 'uint16' if tok.num_tokens <= 2**16 else 'uint32'



_TOKENIZERS: dict[str, tokenizers_lib.TextTokenizer] = {}  # one load per worker process


def write_shard(unit: dict[str, Any], tokenizer: str, text_field: str, dtype: str, out_dir: str,
                staging: str) -> dict[str, Any]:
  """Tokenises one unit into `out_dir`/NAME.array_record (+ NAME.json); returns the sidecar."""
  if tokenizer not in _TOKENIZERS:
    _TOKENIZERS[tokenizer] = tokenizers_lib.load_tokenizer(tokenizer)
  tok = _TOKENIZERS[tokenizer]
  name = unit['name']
  tmp = os.path.join(staging, f'{name}.array_record.tmp{os.getpid()}')
  writer = array_record_module.ArrayRecordWriter(tmp, 'group_size:1')
  lengths, batch = [], []

  def flush() -> None:
    if not batch:  # the tokenizer fails on an empty batch (an empty unit)
      return
    for ids in tok.encode_batch(batch):
      if ids:  # a document with no tokens adds nothing to the stream
        writer.write(np.asarray(ids, dtype).tobytes())
        lengths.append(len(ids))
    batch.clear()

  try:
    for doc in documents(unit, text_field):
      batch.append(doc)
      if len(batch) == CHUNK:
        flush()
    flush()
    writer.close()
  except BaseException as e:
    try:
      os.remove(tmp)  # no partial shard stays behind
    except OSError:
      pass
    refused = _refused_write(e, os.fspath(epath.Path(out_dir) / f'{name}{SHARD_SUFFIX}'))
    if refused is None:
      raise
    raise refused from None
  # Sizes and digests let a reader of a gs:// corpus check its local copies (data/corpus_cache.py).
  size, digest = storage.sha256_file(tmp)
  final = epath.Path(out_dir) / f'{name}{SHARD_SUFFIX}'
  if storage.is_url(out_dir):  # an upload appears whole or not at all: no rename (a slow copy)
    epath.Path(tmp).copy(final, overwrite=True)
    os.remove(tmp)
  else:
    os.replace(tmp, final)
  buf = io.BytesIO()
  np.save(buf, np.asarray(lengths, np.int64))
  storage.write_bytes(os.fspath(epath.Path(out_dir) / f'{name}{LENGTHS_SUFFIX}'), buf.getvalue())
  side = {'name': name, 'documents': len(lengths), 'tokens': int(sum(lengths)),
          'source': unit['source'], 'kind': unit['kind'], 'start': unit['start'],
          'stop': unit['stop'], 'bytes': size, 'sha256': digest,
          'lengths_bytes': len(buf.getvalue()),
          'lengths_sha256': hashlib.sha256(buf.getvalue()).hexdigest()}
  _write_json_atomic(epath.Path(out_dir) / f'{name}.json', side)  # written last: "finished"
  return side


def _refused_write(e: BaseException, path: str) -> OSError | None:
  """ArrayRecord's writer reports a refused write (disk full, quota, ...) as a RuntimeError with
  the system's message: the OSError it stands for, naming `path`; None for anything else."""
  if isinstance(e, OSError) or not isinstance(e, RuntimeError):
    return None
  for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EROFS):
    if os.strerror(code) in str(e):
      return OSError(code, os.strerror(code), path)
  return None


def _write_json_atomic(path: epath.Path, obj: Any) -> None:
  storage.write_text(os.fspath(path), json.dumps(obj, indent=1))  # whole or not at all


def _finished(out: epath.Path, name: str) -> dict[str, Any] | None:
  side = out / f'{name}.json'
  if side.exists() and (out / f'{name}{SHARD_SUFFIX}').exists():
    return json.loads(side.read_text())
  return None


def prepare(inputs: str, output: str, tokenizer: str, *, split: str = 'train', workers: int = 1,
            text_field: str = 'text', text_unit: str = 'line', shard_mb: float = 128.0,
            staging_dir: str = '') -> dict[str, Any]:
  """Writes (or finishes) the prepared corpus OUTPUT/SPLIT; returns its manifest (module doc)."""
  if split not in SPLITS:
    raise ValueError(f'--split={split!r}; allowed: {list(SPLITS)}.')
  if text_unit not in TEXT_UNITS:
    raise ValueError(f'--text_unit={text_unit!r}; allowed: {list(TEXT_UNITS)}.')
  if workers < 1:
    raise ValueError(f'--workers={workers} must be >= 1.')
  tok = tokenizers_lib.load_tokenizer(tokenizer)
  tok_hash = tokenizer_hash(tok)
  dtype = record_dtype(tok)
  files = input_files(inputs)
  check_inputs(files)
  units = plan(files, shard_mb, text_unit)
  out = epath.Path(output) / split
  # What this run creates is removed again when it fails before any shard is finished.
  created = _missing_folders(out)
  fresh = created or not (out / PLAN_FILE).exists()
  try:
    return _prepare(units, out, tokenizer, tok_hash, dtype, split=split, workers=workers,
                    text_field=text_field, text_unit=text_unit, staging_dir=staging_dir,
                    remote=storage.is_url(output))
  except BaseException:
    if fresh and not storage.is_url(output):
      _undo_fresh_start(out, created)
    raise


def check_inputs(files: Sequence[str]) -> None:
  """Validate first: every input readable and, for text and JSON, UTF-8 in its first SNIFF_BYTES
  (a binary file is refused before anything is written); not every one of them empty."""
  sizes = []
  for f in files:
    try:
      with open(f, 'rb') as fh:
        head = fh.read(SNIFF_BYTES)
      sizes.append(os.path.getsize(f))
    except OSError as e:
      raise ValueError(f'--input: cannot read {f}: {_reason(e)}; fix its permissions or leave '
                       'it out.') from None
    if f.endswith(TEXT_SUFFIXES + JSON_SUFFIXES):
      try:
        codecs.getincrementaldecoder('utf-8')().decode(head, final=len(head) < SNIFF_BYTES)
      except UnicodeDecodeError as e:
        raise ValueError(f'--input: {f} is not UTF-8 text (byte {head[e.start:e.start + 1]!r} '
                         f'at offset {e.start:,}); convert it with iconv -t utf-8.') from None
  if not any(sizes):
    raise ValueError(f'--input: {", ".join(files[:3])}{" ..." if len(files) > 3 else ""} '
                     f'{"is" if len(files) == 1 else "are all"} empty: no documents to prepare.')


def _reason(e: OSError) -> str:
  """'permission denied (EACCES)' for an OSError with an errno, else its message."""
  if e.errno in errno.errorcode:
    return f'{os.strerror(e.errno).lower()} ({errno.errorcode[e.errno]})'
  return str(e)


def _missing_folders(out: epath.Path) -> list[epath.Path]:
  """`out` and those of its parents that do not exist yet, innermost first (local only)."""
  if storage.is_url(os.fspath(out)):
    return []
  missing, p = [], out
  while not p.exists() and p != p.parent:
    missing.append(p)
    p = p.parent
  return missing


def _undo_fresh_start(out: epath.Path, created: list[epath.Path]) -> None:
  """After a failure of a run that wrote `out`'s plan: when no shard was finished, the plan, any
  partial shard and the folders it created go again (a rerun after fixing an input is then not
  refused as 'prepared from other inputs'). Other files are never touched."""
  try:
    if not out.exists():
      return
    names = [p.name for p in out.iterdir()]
    if any(n.startswith('shard-') and n.endswith('.json') for n in names):
      return  # finished shards: the rerun resumes them
    for n in names:
      if n == PLAN_FILE or '.tmp' in n or storage.is_partial(n):
        (out / n).unlink()
    for d in created:
      d.rmdir()  # only when empty
  except OSError:
    pass


def _prepare(units: list[dict[str, Any]], out: epath.Path, tokenizer: str, tok_hash: str,
             dtype: str, *, split: str, workers: int, text_field: str, text_unit: str,
             staging_dir: str, remote: bool) -> dict[str, Any]:
  """`prepare` once its inputs are checked: the plan, the shards, the manifest."""
  out.mkdir(parents=True, exist_ok=True)
  head = {'format': FORMAT, 'tokenizer': tokenizer, 'tokenizer_hash': tok_hash,
          'dtype': dtype, 'text_field': text_field, 'text_unit': text_unit,
          'units': [{k: u[k] for k in ('name', 'source', 'kind', 'start', 'stop')} for u in units]}
  plan_file = out / PLAN_FILE
  if plan_file.exists():
    old = json.loads(plan_file.read_text())
    if old.get('tokenizer_hash') != tok_hash:
      raise ValueError(f'{out} was prepared with tokenizer {old.get("tokenizer")!r} (hash '
                       f'{str(old.get("tokenizer_hash"))[:12]}), not {tokenizer!r} (hash '
                       f'{tok_hash[:12]}); give a new --output or the same --tokenizer.')
    if old != head:
      raise ValueError(f'{out} was prepared from other inputs or options ({plan_file}); give a '
                       'new --output, or the same --input, --text_field, --text_unit, --shard_mb.')
  else:
    _write_json_atomic(plan_file, head)
  for partial in out.iterdir():  # left by an interrupted run (one run per output at a time)
    if '.tmp' in partial.name or storage.is_partial(partial.name):
      partial.unlink()
  done = {u['name']: _finished(out, u['name']) for u in units}
  todo = [u for u in units if done[u['name']] is None]
  with tempfile.TemporaryDirectory(dir=staging_dir or None) as tmp:
    staging = tmp if remote else str(out)  # partial shards (*.tmpPID), renamed when complete
    args = (tokenizer, text_field, dtype, str(out), staging)
    if workers == 1 or len(todo) <= 1:
      for u in todo:
        done[u['name']] = write_shard(u, *args)
    else:
      ctx = multiprocessing.get_context('spawn')
      with concurrent.futures.ProcessPoolExecutor(min(workers, len(todo)), mp_context=ctx,
                                                  initializer=parent_watch.initializer(_quiet)
                                                  ) as pool:
        futures = {pool.submit(write_shard, u, *args): u['name'] for u in todo}
        for fut in concurrent.futures.as_completed(futures):
          done[futures[fut]] = fut.result()
  shards = [done[u['name']] for u in units]
  manifest = {'format': FORMAT, 'split': split, 'tokenizer': tokenizer,
              'tokenizer_hash': tok_hash, 'dtype': dtype,
              'documents': sum(s['documents'] for s in shards),
              'tokens': sum(s['tokens'] for s in shards),
              'shards': shards, 'skipped_shards': len(units) - len(todo),
              'sources': sorted({u['source'] for u in units})}
  _write_json_atomic(out / MANIFEST_FILE, manifest)
  return manifest


def _quiet() -> None:
  """Worker initialiser: one tokenizer thread per worker process (the workers are the cores)."""
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'
  os.environ['RAYON_NUM_THREADS'] = '1'


class _Parser(argparse.ArgumentParser):
  """argparse whose mistakes are ValueErrors (printed as one line by `main`)."""

  def error(self, message: str) -> None:  # type: ignore[override]
    raise ValueError(f'{self.prog}: {message}')


def main(argv: Sequence[str] | None = None) -> int:
  """The command line (module docstring); a mistake prints one `hmdlm_jax: error:` line, exit 1."""
  parser = _Parser(prog='python -m hmdlm_jax.data.prepare',
                   description='Tokenise a corpus once into ArrayRecord shards.')
  parser.add_argument('--input', required=True, help='file, folder or glob of inputs')
  parser.add_argument('--output', required=True,
                      help='corpus folder or gs:// URL (config data.corpus_dir)')
  parser.add_argument('--tokenizer', required=True, help='as config data.tokenizer')
  parser.add_argument('--split', default='train', help="'train' | 'test': OUTPUT/SPLIT")
  parser.add_argument('--workers', type=int, default=1, help='tokenising processes')
  parser.add_argument('--text_field', default='text', help='JSON field / parquet column')
  parser.add_argument('--text_unit', default='line', help="plain text: 'line' | 'paragraph'")
  parser.add_argument('--shard_mb', type=float, default=128.0, help='input MiB per shard')
  parser.add_argument('--staging_dir', default='', help='local folder for partial shards')
  try:
    args = parser.parse_args(argv)
    m = prepare(args.input, args.output, args.tokenizer, split=args.split, workers=args.workers,
                text_field=args.text_field, text_unit=args.text_unit, shard_mb=args.shard_mb,
                staging_dir=args.staging_dir)
  except ValueError as e:
    print(f'hmdlm_jax: error: {" ".join(str(e).split())}', file=sys.stderr, flush=True)
    return 1
  except OSError as e:  # a refused write (full disk, permissions), an input gone meanwhile
    path = e.filename or args.output
    print(f'hmdlm_jax: error: {path}: {_reason(e)}; free space or fix the permissions (or '
          'choose another --output), then rerun the same command (finished shards are kept).',
          file=sys.stderr, flush=True)
    return 1
  print(f'{epath.Path(args.output) / args.split}: {m["documents"]:,} documents, '
        f'{m["tokens"]:,} tokens in {len(m["shards"])} shards ({m["skipped_shards"]} already '
        'done).')
  return 0


if __name__ == '__main__':
  sys.exit(main())
