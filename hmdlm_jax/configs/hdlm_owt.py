"""HDLM-small-64 on OpenWebText: the paper's main run (docs/method.md §13.1).

Expected: not measured in this repository (no OpenWebText, GPT-2 tokenizer or MDLM-OWT checkpoint
here); the paper reports validation PPL 23.36 and Gen PPL 144.2 (T = 512, GPT-2 Large) for it.

The authors' small model and recipe: DiT 12 × 768 (dropout 0), L = 512 rows BOS + text + EOS, the
GPT-2 vocabulary with MASK at 50,257 and the 64 cluster tokens after it (vocab_size = 50,322),
n = 64, γ = 1, ξ = 1, weight clipping [0, 2] in training, t ∈ [1e-4, 1]; AdamW lr 5e-4, betas
(0.9, 0.99), eps 1e-9, weight decay 0.02, clip 1.0, 10k warm-up steps then cosine to 0.1 × lr,
batch 512, bf16, no EMA, 500k steps (131B tokens). Data: a corpus prepared once
(`python -m hmdlm_jax.data.prepare --tokenizer=gpt2 --output=DIR`, train/ and test/ splits) read by
the 'corpus' kind with MDLM's wrap packing (docs/method.md §6); set --config.data.corpus_dir=DIR.
The clusters come from the MDLM-OWT checkpoint's embedding (the authors used GIDD's); deviations:
docs/method.md §13.1. Commands for clusters, training and evaluation: docs/results/hdlm.md.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs.base import get_base_config

CLUSTERS = '/data/hdlm/gpt2_mdlm-owt_n64.npz'  # built by step 1 of the module docstring


def get_config() -> ml_collections.ConfigDict:
  c = get_base_config()

  c.process.kind = 'hdlm'
  h = c.process.hdlm
  h.num_clusters = 64
  h.clusters = CLUSTERS
  h.fallback = 'error'
  h.gamma = 1.0
  h.eps = 1e-4
  h.xi = 1.0
  h.force = 'auto'
  h.xi_loss = 'approx'  # only used if xi < 1 (the paper's ξ = 0.9 / 0.8 rows)
  h.clip_weights = True
  h.weight_min = 0.0
  h.weight_max = 2.0
  h.sampler = 'first_order'
  h.final_step = 'argmax'

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 1
  m.vocab_size = 50257 + 1 + 64
  m.mask_id = -1  # -> 50257, the appended MASK (MDLM-OWT's row)
  m.seq_len = 512
  m.num_layers = 12
  m.hidden_size = 768
  m.num_heads = 12
  m.mlp_dim = 3072
  m.cond_dim = 128
  m.dropout = 0.0
  m.time_conditioning = True
  m.position_embedding = 'rotary'
  m.tie_embeddings = False
  m.dtype = 'bfloat16'

  c.loss.t_min = 1e-4
  c.loss.antithetic = True

  d = c.data
  d.kind = 'corpus'
  d.corpus_dir = ''  # set on the command line: the folder `prepare` wrote
  d.packing = 'wrap'
  d.batch_size = 512
  d.eval_batch_size = 256
  d.tokenizer = 'gpt2'
  d.tokenizer_allow_download = False
  d.mask_token = 'append'
  d.hierarchy = 'none'
  d.seq_len = 512
  d.overlong = 'truncate'
  d.augment = False

  o = c.optim
  o.lr = 5e-4
  o.warmup_steps = 10_000
  o.decay = 'cosine'
  o.decay_floor = 0.1
  o.b1 = 0.9
  o.b2 = 0.99
  o.eps = 1e-9
  o.weight_decay = 0.02
  o.grad_clip = 1.0
  o.ema_decay = 0.0  # no EMA

  t = c.train
  t.num_steps = 500_000
  t.log_every = 1000
  t.eval_every = 50_000
  t.ckpt_every = 10_000
  t.keep_last = 3
  t.keep_period = 100_000

  c.mesh.data = -1

  c.sample.num_steps = 512
  c.sample.temperature = 1.0
  c.sample.num_samples = 256
  c.sample.seeds = (0,)

  c.eval.kind = 'perplexity'
  c.eval.use_ema = False
  c.eval.num_examples = 1_000_000
  c.eval.num_samples = 256
  c.eval.gen_ppl_model = 'gpt2-large'
  return c
