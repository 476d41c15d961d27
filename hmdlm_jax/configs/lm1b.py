"""HMDLM on LM1B (docs/method.md §4, §6, §9; paper section 5.1.1): the paper's run, for an accelerator pod.

Expected: not measured in this repository (no LM1B, no accelerator). Compiled for 8 devices with
data parallelism, its step needs 27.7 GB per device at batch 512, so it fits 8×A100-80GB
(docs/results/performance.md).

DiT 12 × 768 (12 heads, MLP 3072, cond 128, dropout 0.1, rotary), K = 2 frequency levels (τ = 1)
on bert-base-uncased rows of L = 128, log-linear offsets δ = (0, 0.25), batch 512, AdamW lr 3e-4,
2,500 warm-up steps then constant, clip 1.0, EMA 0.9999, 1.25M steps (≈ 33B tokens), bfloat16;
`--config.train.num_steps=2500000` for the 65B-token run. Data: TFDS lm1b (array_record) under
`data.tfds_data_dir` (hmdlm_jax/data/lm1b.py prepares it); offline tokenizer:
`--config.data.tokenizer=offline:bert-base-uncased`. MASK = BERT's [MASK] (id 103), MDLM's
convention. Mesh: data parallelism over every device (`mesh.data = -1`); `--config.mesh.fsdp=N`
if memory is tight; multi-host: `--config.distributed.enabled=True`.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs.base import get_base_config


def get_config() -> ml_collections.ConfigDict:
  c = get_base_config()

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 2
  # MDLM's LM1B convention: BERT's own [MASK] (id 103) is the MASK token, V = 30522, which gives
  # MDLM's exact 139,292,986 backbone parameters (docs/method.md §4).
  m.vocab_size = 30522
  m.mask_id = 103
  m.seq_len = 128
  m.num_layers = 12
  m.hidden_size = 768
  m.num_heads = 12
  m.mlp_dim = 3072
  m.cond_dim = 128
  m.dropout = 0.1
  m.time_conditioning = False
  m.variant = 'two_pass'
  m.prior_corrected_head = True
  m.position_embedding = 'rotary'
  m.tie_embeddings = False
  m.dtype = 'bfloat16'

  s = c.schedule
  s.kind = 'loglinear'
  s.offsets_max = 0.25  # δ = (0, 0.25); with --config.model.num_levels=1 (the MDLM twin) δ = (0,)
  s.offsets = (0.0, 0.25)  # as derived, for readers
  s.eps = 1e-3

  d = c.data
  d.kind = 'lm1b'
  d.batch_size = 512
  d.eval_batch_size = 512
  d.tokenizer = 'bert-base-uncased'
  d.tokenizer_allow_download = False
  d.mask_token = 'tokenizer'  # reuse [MASK] = 103, as MDLM does
  d.hierarchy = 'frequency'
  d.tau = 1
  d.seq_len = 128
  d.overlong = 'truncate'
  d.tfds_data_dir = ''
  d.augment = False

  o = c.optim
  o.lr = 3e-4
  o.warmup_steps = 2500
  o.decay = 'constant'
  o.b1 = 0.9
  o.b2 = 0.999
  o.weight_decay = 0.0
  o.grad_clip = 1.0
  o.ema_decay = 0.9999

  t = c.train
  t.num_steps = 1_250_000
  t.log_every = 1000
  t.eval_every = 50_000
  t.ckpt_every = 10_000
  t.keep_last = 3
  t.keep_period = 250_000

  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1

  c.sample.num_steps = 256  # paper section 5.1.1: 128 tokens, 256 steps
  c.sample.num_samples = 1000
  c.sample.seeds = (0, 1, 2)

  c.eval.kind = 'perplexity'
  c.eval.num_examples = 1_000_000  # the whole LM1B test split (306,688 sentences)
  return c
