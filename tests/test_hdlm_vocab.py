"""HDLM's hierarchical vocabulary (hmdlm_jax/data/clusters.py): size-constrained k-means against a
brute-force search, the size constraint, the fallbacks, the artefact format, the committed
bert-base-uncased artefact and the layout the process builds from it."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from hmdlm_jax.configs import hdlm_text
from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax.data import clusters
from hmdlm_jax.processes import hdlm
from tests.config_helpers import resolved

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BERT_N64 = hdlm_text.BERT_N64


def _inertia(x: np.ndarray, labels: np.ndarray, n: int) -> float:
  return float(sum(((x[labels == c] - x[labels == c].mean(0)) ** 2).sum()
                   for c in range(n) if np.any(labels == c)))


def _brute_force(x: np.ndarray, n: int, lo: int, hi: int) -> tuple[float, np.ndarray]:
  """The minimum inertia over every labelling with all sizes in [lo, hi]."""
  best, arg = np.inf, None
  for lab in itertools.product(range(n), repeat=len(x)):
    lab = np.asarray(lab)
    sizes = np.bincount(lab, minlength=n)
    if sizes.min() < lo or sizes.max() > hi or lab[0] != 0:  # lab[0] = 0: fixes one relabelling
      continue
    v = _inertia(x, lab, n)
    if v < best:
      best, arg = v, lab
  return best, arg


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
  return np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :])


def _blobs(sizes, centres, seed=0, spread=0.3):
  rng = np.random.default_rng(seed)
  return np.concatenate([np.asarray(c) + spread * rng.normal(size=(s, 2))
                         for s, c in zip(sizes, centres)])


def test_kmeans_matches_brute_force_without_binding_constraint():
  x = _blobs((4, 3, 2), ((0, 0), (5, 0), (0, 5)))
  art = clusters.size_constrained_kmeans(x, 3, metric='euclidean', seed=0)
  lo, hi = clusters.size_bounds(len(x), 3, 0.1, 5.0)
  best, arg = _brute_force(x, 3, lo, hi)
  assert art.inertia == pytest.approx(best, rel=1e-9)
  assert _same_partition(art.token_to_cluster, arg)
  # The final assignment is the nearest centroid of every point (brute force over centroids).
  d2 = ((x[:, None, :] - art.centroids[None].astype(np.float64)) ** 2).sum(-1)
  np.testing.assert_array_equal(art.token_to_cluster, d2.argmin(-1))


def test_kmeans_matches_brute_force_with_binding_size_constraint():
  # 7 / 2 / 1 points; sizes must lie in [⌈0.6·10/3⌉, ⌊1.5·10/3⌋] = [2, 5].
  x = _blobs((7, 2, 1), ((0, 0), (6, 0), (0, 6)), seed=1, spread=0.8)
  art = clusters.size_constrained_kmeans(x, 3, metric='euclidean', seed=0, min_ratio=0.6,
                                         max_ratio=1.5)
  lo, hi = clusters.size_bounds(len(x), 3, 0.6, 1.5)
  assert (lo, hi) == (2, 5)
  sizes = art.sizes
  assert sizes.min() >= lo and sizes.max() <= hi
  best, arg = _brute_force(x, 3, lo, hi)
  print(f'constrained k-means inertia {art.inertia:.6f}, brute force {best:.6f}, sizes '
        f'{sorted(sizes.tolist())}')
  assert _inertia(x, art.token_to_cluster, 3) == pytest.approx(best, rel=1e-9)
  assert _same_partition(art.token_to_cluster, arg)


def test_enforce_sizes_moves_only_what_it_must():
  rng = np.random.default_rng(0)
  d2 = rng.random((500, 7))
  d2[:, 0] *= 0.05  # most points prefer cluster 0
  d2[:, 6] += 10.0  # and nobody prefers cluster 6
  labels = d2.argmin(-1)
  lo, hi = clusters.size_bounds(500, 7, 0.5, 2.0)
  out = clusters.enforce_sizes(d2, labels, lo, hi)
  sizes = np.bincount(out, minlength=7)
  assert sizes.min() >= lo and sizes.max() <= hi
  before = np.bincount(labels, minlength=7)
  needed = np.maximum(before - hi, 0).sum() + np.maximum(lo - before, 0).sum()
  assert (out != labels).sum() <= needed + lo  # the undersized ones may draw from moved points
  assert (out != labels).sum() >= np.maximum(before - hi, 0).sum()


def test_fallbacks_are_deterministic_and_balanced():
  ids = clusters.fallback_clusters(100, 8, 'id')
  assert np.all(np.diff(ids) >= 0) and sorted(np.bincount(ids).tolist()) == [12] * 4 + [13] * 4
  counts = np.arange(100)[::-1].astype(float)  # token 0 most frequent
  freq = clusters.fallback_clusters(100, 8, 'frequency', counts)
  np.testing.assert_array_equal(freq, ids)
  freq2 = clusters.fallback_clusters(100, 8, 'frequency', counts[::-1].copy())
  np.testing.assert_array_equal(freq2, ids[::-1])
  with pytest.raises(ValueError, match='needs counts'):
    clusters.fallback_clusters(100, 8, 'frequency')


def test_artefact_round_trip_and_version_check(tmp_path):
  x = _blobs((5, 5), ((0, 0), (4, 4)))
  art = clusters.size_constrained_kmeans(x, 2, seed=3)
  path = tmp_path / 'c.npz'
  clusters.save(path, art)
  back = clusters.load(path)
  np.testing.assert_array_equal(back.token_to_cluster, art.token_to_cluster)
  np.testing.assert_array_equal(back.centroids, art.centroids)
  assert (back.metric, back.seed, back.format_version) == ('cosine', 3, clusters.FORMAT_VERSION)
  with np.load(path) as z:
    stored = dict(z)
  stored['format_version'] = np.int32(99)
  np.savez(tmp_path / 'old.npz', **stored)
  with pytest.raises(ValueError, match='format 99'):
    clusters.load(tmp_path / 'old.npz')


def test_command_builds_an_artefact(tmp_path, capsys):
  table = _blobs((20, 20, 20), ((0, 0), (5, 0), (0, 5)))
  np.save(tmp_path / 'emb.npy', table)
  out = tmp_path / 'clusters.npz'
  assert clusters.main([f'--embeddings={tmp_path / "emb.npy"}', '--num_clusters=3',
                        f'--out={out}', '--metric=euclidean']) == 0
  art = clusters.load(out)
  assert art.num_clusters == 3 and sorted(art.sizes.tolist()) == [20, 20, 20]
  assert 'emb.npy' in art.source and 'sizes 20..20' in capsys.readouterr().out
  assert clusters.main(['--embeddings=/no/such.npz', '--num_clusters=3', f'--out={out}']) == 1


def test_committed_bert_artefact_respects_the_size_constraint():
  art = clusters.load(BERT_N64)
  assert art.token_to_cluster.shape == (30522,) and art.num_clusters == 64
  lo, hi = clusters.size_bounds(30522, 64, 0.1, 5.0)
  assert (lo, hi) == (48, 2384)
  sizes = art.sizes
  print(f'bert-base-uncased n=64 clusters: sizes {sizes.min()}..{sizes.max()} '
        f'(mean {sizes.mean():.1f}), {art.iterations} iterations')
  assert lo <= sizes.min() and sizes.max() <= hi
  assert art.centroids.shape == (64, 384) and 'MiniLM' in art.source and art.seed == 42


def test_map_vocabulary_uses_rows_and_wordpiece_splits():
  src = ['[PAD]', '[UNK]', 'the', 'king', '##s', 'mac', '##beth']
  table = np.arange(len(src) * 2, dtype=np.float32).reshape(-1, 2)
  out = clusters.map_vocabulary(table, src, ['the', 'kings', 'macbeth', '##beths', 'zzz'])
  np.testing.assert_array_equal(out[0], table[2])
  np.testing.assert_array_equal(out[1], table[[3, 4]].mean(0))  # king ##s
  np.testing.assert_array_equal(out[2], table[[5, 6]].mean(0))  # mac ##beth
  np.testing.assert_array_equal(out[3], table[[6, 4]].mean(0))  # ##beth ##s
  np.testing.assert_array_equal(out[4], table[1])  # [UNK]


@pytest.mark.parametrize('mask_token', ['append', 'tokenizer'])
def test_process_layout_from_the_bert_artefact(mask_token):
  c = get_base_config()
  c.process.kind = 'hdlm'
  c.model.num_levels = 1
  c.process.hdlm.num_clusters = 64
  c.process.hdlm.clusters = BERT_N64
  if mask_token == 'append':
    c.model.vocab_size, c.model.mask_id = 30523 + 64, -1
  else:
    c.model.vocab_size, c.model.mask_id = 30522 + 64, 103
  lay = hdlm.layout_from_config(config_lib.hdlm_config(resolved(c)))
  art = clusters.load(BERT_N64)
  words = lay.cluster_of >= 0
  assert words.sum() == 30522 - (mask_token == 'tokenizer')
  np.testing.assert_array_equal(lay.cluster_of[:30522][words[:30522]],
                                art.token_to_cluster[words[:30522]])
  assert np.all(lay.cluster_of[lay.cluster_offset:] == -1) and lay.cluster_of[lay.mask_id] == -1
  c.process.hdlm.num_clusters = 32
  c.model.vocab_size -= 32
  with pytest.raises(ValueError, match='has 64 clusters'):
    hdlm.layout_from_config(config_lib.hdlm_config(resolved(c)))
