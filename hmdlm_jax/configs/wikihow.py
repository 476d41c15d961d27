r"""HMDLM fine-tuned on WikiHow from MDLM-OWT (paper section 5.1.2, Appendix C; docs/method.md §6).

Expected: not measured in this repository (no WikiHow data or MDLM-OWT checkpoint here).

`--config=configs/wikihow.py:L,RULE` with L ∈ {256, 512, 1024} (default 512) and RULE 'position'
(HMDLM-P, default: summary = level 1, body = level 0) or 'frequency' (HMDLM-F, τ = 1). Rows: GPT-2
tokenizer, `BOS title\n summary\n body EOS`, the title given, articles longer than L dropped.
Power schedule ω = (1, 2). Backbone: MDLM's DiT 12 × 768 from the MDLM-OWT checkpoint
(`init.mdlm_checkpoint`: converted by `python -m hmdlm_jax.convert_mdlm`, or the safetensors /
.ckpt itself); vocab_size = 50,257 + MASK = 50,258. Budget: global batch 128, `train.num_steps`
from Appendix C, Table 7 (28,650 / 41,137 steps at L = 512 / 1024; L = 256 reuses L = 512's);
optimiser MDLM's (AdamW 3e-4, 2,500 warm-up steps, constant). Data: `data.train_path` /
`data.test_path` (wikihowAll.csv, or a Hugging Face export); one file splits by title hash.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs.base import get_base_config

SEQ_LENS = (256, 512, 1024)
RULES = ('position', 'frequency')
# Appendix C, Table 7: HMDLM steps (summary rule, τ = 1 rule) per L; 256 reuses 512's.
STEPS = {
    256: {'position': 30_955, 'frequency': 31_930},
    512: {'position': 30_955, 'frequency': 31_930},
    1024: {'position': 43_517, 'frequency': 45_225},
}


def parse(config_string: str) -> tuple[int, str]:
  """'L,RULE' -> (L, RULE); either part may be omitted ('', '1024', 'frequency')."""
  seq_len, rule = 512, 'position'
  for part in filter(None, (p.strip() for p in (config_string or '').split(','))):
    if part.isdigit():
      seq_len = int(part)
    else:
      rule = part
  if seq_len not in SEQ_LENS:
    raise ValueError(f'configs/wikihow.py: sequence length {seq_len} not in {SEQ_LENS}.')
  if rule not in RULES:
    raise ValueError(f'configs/wikihow.py: hierarchy {rule!r} not in {RULES}.')
  return seq_len, rule


def get_config(config_string: str = '') -> ml_collections.ConfigDict:
  seq_len, rule = parse(config_string)
  c = get_base_config()

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 2
  m.vocab_size = 50258  # GPT-2 (50,257) + appended MASK, = MDLM-OWT
  m.mask_id = -1
  m.seq_len = seq_len
  m.num_layers = 12
  m.hidden_size = 768
  m.num_heads = 12
  m.mlp_dim = 3072
  m.cond_dim = 128
  m.dropout = 0.1
  m.time_conditioning = False  # MDLM-OWT was trained without it
  m.variant = 'two_pass'
  m.prior_corrected_head = True
  m.position_embedding = 'rotary'
  m.dtype = 'bfloat16'

  s = c.schedule
  s.kind = 'power'
  s.exponents = (1.0, 2.0)
  s.eps = 1e-3

  d = c.data
  d.kind = 'wikihow'
  d.batch_size = 128
  d.eval_batch_size = 64
  d.tokenizer = 'gpt2'
  d.tokenizer_allow_download = False
  d.hierarchy = rule
  d.tau = 1
  d.seq_len = seq_len
  d.overlong = 'drop'
  d.test_fraction = 0.0
  d.augment = False

  o = c.optim
  o.lr = 3e-4
  o.warmup_steps = 2500
  o.decay = 'constant'
  o.weight_decay = 0.0
  o.grad_clip = 1.0
  o.ema_decay = 0.9999

  t = c.train
  t.num_steps = STEPS[seq_len][rule]
  t.log_every = 100
  t.eval_every = 5000
  t.ckpt_every = 2000

  c.mesh.data = -1

  # The pretrained MDLM backbone to start from ('' = train from scratch).
  c.init.mdlm_checkpoint = ''

  c.sample.num_steps = 256  # paper: 256 sampling steps at every length
  c.eval.kind = 'perplexity'
  c.eval.num_examples = 100_000  # the whole filtered test split
  return c
