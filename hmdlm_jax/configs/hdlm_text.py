r"""HDLM on the offline Shakespeare text: the twin of configs/text.py (docs/method.md §13.1).

Expected: with scripts/text_vs_unigram.py's 512-piece vocabulary and n = 16 clusters, a test bound
PPL of 122.0 (4.804 ± 0.059 nats/token, 3 seeds, 2,000 steps) against 138.5 for MDLM and 161.3 for
HMDLM (docs/results/hdlm.md).

`configs/text.py` with the forward process replaced: `process.kind='hdlm'` (word -> cluster ->
MASK), α_t = (1 - t)^γ with γ = 1, ξ = 1, force-within, the exact NELBO as the training loss (no
weight clipping), `model.num_levels=1` and `data.hierarchy='none'`; everything else is text.py's
(its data: the small-corpus shortcut, or --config.data.kind=corpus). Standalone: text.py's data,
the committed n = 64 MiniLM clusters (assets/hdlm_clusters/). For the script's vocabulary,
n = `NUM_CLUSTERS_WORDPIECE` = 16 clusters of all-MiniLM-L6-v2's embeddings mapped onto its pieces
(why: docs/results/hdlm.md). Reproduce:
  python -m scripts.text_vs_unigram --archive=/tmp/shk --data_dir=/tmp/shakespeare_text \
      --workdir=/tmp/hdlm_text --runs=hdlm,hmdlm,mdlm --seeds=0,1,2
"""

from __future__ import annotations

import os

import ml_collections

from hmdlm_jax.configs import text

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'assets',
                      'hdlm_clusters')
BERT_N64 = os.path.join(ASSETS, 'bert-base-uncased_minilm-l6_n64.npz')
NUM_CLUSTERS_WORDPIECE = 16


def to_hdlm(c: ml_collections.ConfigDict, *, words_and_mask: int, num_clusters: int,
            clusters: str) -> ml_collections.ConfigDict:
  """Turns a text config into its HDLM twin (in place; returns it).

  Args:
    c: a config of configs/text.py's kind.
    words_and_mask: the tokenizer's rows (words + the appended MASK).
    num_clusters: n.
    clusters: the token -> cluster artefact (hmdlm_jax/data/clusters.py).
  """
  c.process.kind = 'hdlm'
  h = c.process.hdlm
  h.num_clusters = num_clusters
  h.clusters = clusters
  h.fallback = 'error'
  h.gamma = 1.0
  h.eps = 1e-4
  h.xi = 1.0
  h.force = 'auto'
  h.clip_weights = False
  h.sampler = 'first_order'
  h.final_step = 'argmax'
  c.model.num_levels = 1
  c.model.variant = 'two_pass'  # irrelevant with one level
  c.model.hier_stop_gradient = False
  c.model.vocab_size = words_and_mask + (num_clusters if num_clusters > 1 else 0)
  c.model.mask_id = -1  # resolved to the row before the cluster tokens
  c.data.hierarchy = 'none'
  return c


def get_config() -> ml_collections.ConfigDict:
  return to_hdlm(text.get_config(), words_and_mask=30523, num_clusters=64, clusters=BERT_N64)
