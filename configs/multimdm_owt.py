r"""MultiMDM on OpenWebText: the paper's 170M DiT, M = 50, batch 1024, lr 3e-4, 200K steps.

OWT is not downloaded here: point `data.train_path` to your export (a JSON-lines file of
{"text": ...} documents, or a folder of .jsonl / .txt files; the 'text' data kind) and tokenise
with GPT-2's tokenizer from the local Hugging Face cache (`data.tokenizer='gpt2'`).

  # MultiMDM-rand: 200K steps from random initialisation
  python -m hmdlm_jax.main --config=configs/multimdm_owt.py:rand --workdir=DIR_RAND \
      --config.data.train_path=/data/owt/train.jsonl
  # MultiMDM-cont: 150K MDLM steps, then 50K MultiMDM steps from its EMA weights
  python -m hmdlm_jax.main --config=configs/multimdm_owt.py:mdlm --workdir=DIR_MDLM \
      --config.data.train_path=/data/owt/train.jsonl
  python -m hmdlm_jax.main --config=configs/multimdm_owt.py:cont --workdir=DIR_CONT \
      --config.data.train_path=/data/owt/train.jsonl --config.init.workdir=DIR_MDLM
  # consistency distillation (Algorithm 3), and the MDLM-with-shared-Gumbel-paths baseline
  python -m hmdlm_jax.main --config=configs/multimdm_owt.py:distill --workdir=DIR_CD \
      --config.data.train_path=/data/owt/train.jsonl --config.init.workdir=DIR_CONT
  python -m hmdlm_jax.main --config=configs/multimdm_owt.py:mdlm_distill --workdir=DIR_MCD \
      --config.data.train_path=/data/owt/train.jsonl --config.init.workdir=DIR_MDLM
  # or start the MultiMDM run from MDLM's released OWT checkpoint (converted, MASK = 50257):
  #   --config.init.mdlm_checkpoint=mdlm_owt.npz   (python -m hmdlm_jax.convert_mdlm)

Model and optimiser as configs/multimdm_lm1b.py (App. C.2.2). Rows: one document per row of
L = 1,024 GPT-2 tokens (`<|endoftext|>` text `<|endoftext|>` ...), truncated; the paper packs the
concatenated stream instead, which this project's 'text' kind does not do. Vocabulary: 50,257
GPT-2 ids, then MDLM's appended MASK (50,257) for the MDLM stage, or the 50 masks 50,257..50,306
for MultiMDM. Held-out split: `data.test_fraction` of the documents (by hash), or
`data.test_path`. Batch 1,024 × 1,024 tokens needs `train.grad_accum` on small meshes.
"""

from __future__ import annotations

import ml_collections

from configs import lm1b
from configs import multimdm_lm1b

GPT2_WORDS = 50257
OPTIONS = multimdm_lm1b.OPTIONS


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  if arg not in OPTIONS:
    raise ValueError(f'configs/multimdm_owt.py:{arg}: the option must be one of {OPTIONS}.')
  c = lm1b.get_config()
  c.model.num_levels = 1
  c.schedule.offsets = (0.0,)
  c.model.seq_len = 1024
  d = c.data
  d.kind = 'text'
  d.tokenizer = 'gpt2'
  d.mask_token = 'append'
  d.hierarchy = 'none'
  d.seq_len = 1024
  d.train_path = ''
  d.test_path = ''
  d.test_fraction = 0.0005
  d.text_unit = 'line'
  multimdm_lm1b.paper_settings(c)
  c.eval.kind = 'perplexity'
  c.eval.num_samples = 128
  c.eval.num_examples = 5000
  c.train.eval_every = 0
  if arg == 'mdlm':
    c.process.kind = 'mdlm'
    c.model.vocab_size = GPT2_WORDS + 1
    c.model.mask_id = -1
    c.train.num_steps = 150_000
    return c
  multimdm_lm1b.multimdm_settings(c, arg, GPT2_WORDS, 200_000)
  return c
