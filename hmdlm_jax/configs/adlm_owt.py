"""ADLM on OpenWebText (Rout et al., NeurIPS 2025, Table 1b; docs/method.md §13.4): the main run.

Expected: not measured in this repository (no OpenWebText, no accelerator); the paper reports test
PPL 20.62 at 1M steps (262B tokens; 21.79 with γ = 0) and 20.14 at 2M (524B,
`--config.train.num_steps=2000000`), and Gen PPL 32.9 with the locked-in sampler at T = 1000.

The authors' recipe: DiT 12 × 768 (12 heads, MLP 3072, cond 128, dropout 0.1, rotary, no time
conditioning) as the anchor network and a 6-block denoiser on its raw logits (293.2M parameters),
GPT-2 vocabulary with an appended MASK (id 50257, V = 50,258), documents packed into rows of
L = 1024 (`<|endoftext|>` between them), batch 512, AdamW lr 3e-4 (β 0.9, 0.999, eps 1e-8, no
weight decay), 2,500 warm-up steps then constant, clip 1.0, EMA 0.9999, bfloat16, t ∈ [1e-3, 1];
γ = 3e-3 with the ramp min(γ, k / num_steps), τ = 5. Data: `--config.data.corpus_dir=DIR` (prepared
by hmdlm_jax.data.prepare --tokenizer=gpt2). The authors' checkpoints (adlm-medium/large.ckpt) start
it via `--config.init.adlm_checkpoint` (hmdlm_jax.convert_adlm, docs/usage.md). `:remdm`: the
paper's remasking rows (Tables 2, 3, 7, 8): ReMDM 'loop' (§13.5), exclusive top-p 0.9, T = 4096.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs.adlm_text import to_adlm
from hmdlm_jax.configs.base import get_base_config


OPTIONS = ('', 'remdm')


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/adlm_owt.py:{arg}: the option must be one of {OPTIONS}.')
  c = get_base_config()
  m = c.model
  m.backbone = 'dit'
  m.vocab_size = 50258  # GPT-2 (50,257) + appended MASK
  m.mask_id = -1  # -> 50257
  m.seq_len = 1024
  m.num_layers = 12
  m.hidden_size = 768
  m.num_heads = 12
  m.mlp_dim = 3072
  m.cond_dim = 128
  m.dropout = 0.1
  m.time_conditioning = False
  m.position_embedding = 'rotary'
  m.tie_embeddings = False
  m.dtype = 'bfloat16'

  c.schedule.eps = 1e-3
  c.loss.t_min = 1e-3
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
  d.seq_len = 1024
  d.overlong = 'truncate'
  d.augment = False

  o = c.optim
  o.lr = 3e-4
  o.warmup_steps = 2500
  o.decay = 'constant'
  o.b1 = 0.9
  o.b2 = 0.999
  o.eps = 1e-8
  o.weight_decay = 0.0
  o.grad_clip = 1.0
  o.ema_decay = 0.9999

  t = c.train
  t.num_steps = 1_000_000  # 262B loss tokens (steps × 512 × 1024 / 2)
  t.log_every = 1000
  t.eval_every = 50_000
  t.ckpt_every = 10_000
  t.keep_last = 3
  t.keep_period = 100_000

  c.mesh.data = -1
  c.sample.num_steps = 1000  # the locked-in sampler's T of Table 7
  c.sample.num_samples = 256
  c.eval.kind = 'perplexity'
  c.eval.num_examples = 1_000_000
  c.eval.num_samples = 256
  c.eval.gen_ppl_model = 'gpt2-large'
  if arg == 'remdm':
    c.sample.ordering = 'remdm'  # sample.remdm_* keep their defaults: the paper's loop
    c.sample.top_p = 0.9
    c.sample.nucleus = 'exclusive'  # ReMDM's code drops the token that crosses top_p
    c.sample.num_steps = 4096
  return to_adlm(c, tau=5)
