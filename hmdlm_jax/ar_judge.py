r"""An offline judge for generative perplexity: a small causal transformer on the same train split.

Generative perplexity scores samples under an external autoregressive model, GPT-2 Large, whose
weights are not available everywhere. This judge stands in where they are missing: a small
GPT-style causal transformer trained on the SAME training split and tokenizer as the diffusion
models, implementing the `ARScorer` protocol of evaluation/generative.py, so GenPPL and entropy
are reported exactly as with GPT-2. Its numbers compare models judged by the same judge, not with
GPT-2 Large figures. Model, training, scoring and the cache: docs/method.md §13.2 ("Offline
judge"). One command trains it, or loads it from the cache:

  python -m hmdlm_jax.ar_judge --config=configs/multimdm_text.py --cache_dir=/tmp/judges \
      [--config.data.train_path=... --steps=2000]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hmdlm_jax import config as config_lib
from hmdlm_jax import convert_mdlm
from hmdlm_jax import tasks
from hmdlm_jax.data import tokenizers
from hmdlm_jax.evaluation import generative as generative_metrics

VERSION = 1  # bump when the model or the training changes (invalidates the cache)


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
  """Architecture and training of the judge (hashable; part of the cache key)."""
  num_layers: int = 2
  hidden_size: int = 128
  num_heads: int = 4
  mlp_dim: int = 512
  dropout: float = 0.1
  steps: int = 2000
  batch_size: int = 32
  lr: float = 1e-3
  warmup_steps: int = 100
  seed: int = 0


class _Block(nn.Module):
  num_heads: int
  mlp_dim: int
  dropout: float

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    causal = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
    h = nn.SelfAttention(num_heads=self.num_heads, dropout_rate=0.0,
                         deterministic=True)(nn.LayerNorm()(x), mask=causal)
    x = x + nn.Dropout(self.dropout, deterministic=not train)(h)
    h = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.mlp_dim)(nn.LayerNorm()(x))))
    return x + nn.Dropout(self.dropout, deterministic=not train)(h)


class CausalLM(nn.Module):
  """tokens [B, L] int -> next-token logits [B, L, V] (position j predicts token j + 1)."""
  vocab_size: int
  seq_len: int
  cfg: JudgeConfig

  @nn.compact
  def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
    embed = nn.Embed(self.vocab_size, self.cfg.hidden_size,
                     embedding_init=nn.initializers.normal(0.02))
    pos = self.param('position', nn.initializers.normal(0.02),
                     (self.seq_len, self.cfg.hidden_size))
    x = embed(tokens) + pos[None, :tokens.shape[1]]
    for _ in range(self.cfg.num_layers):
      x = _Block(self.cfg.num_heads, self.cfg.mlp_dim, self.cfg.dropout)(x, train)
    return embed.attend(nn.LayerNorm()(x))


def _nll(logits: jax.Array, tokens: jax.Array, weight: jax.Array) -> jax.Array:
  """Per-position NLL of tokens[:, 1:] under logits[:, :-1], times weight[:, 1:]: [B, L-1]."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  gold = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  return -gold * weight[:, 1:]


# ------------------------------------------------------------------------------ data and cache


def judge_data_config(config: config_lib.Config, judge: JudgeConfig) -> config_lib.Config:
  """The experiment config as the judge reads it: its data, the judge's batch, no levels, and
  one MASK row (MultiMDM's masks become the tokenizer's rows + its MASK row, never used here)."""
  vocab = config.model.vocab_size - config_lib.num_noise_rows(config) + 1
  return config.replace(**{
      'data.batch_size': judge.batch_size, 'data.hierarchy': 'none', 'model.num_levels': 1,
      'schedule.offsets': (0.0,), 'model.vocab_size': vocab,
      'model.mask_id': vocab - 1 - config.model.extra_vocab_rows, 'process.kind': 'mdlm'})


def _hash_path(h: Any, path: str) -> None:
  p = pathlib.Path(path)
  files = sorted(p.iterdir()) if p.is_dir() else [p]
  for f in files:
    if f.is_file():
      h.update(f.name.encode())
      h.update(f.read_bytes())


def fingerprint(config: config_lib.Config, judge: JudgeConfig) -> str:
  """sha256 of the training data files, the tokenizer file, the data config and the judge."""
  h = hashlib.sha256()
  d = config.data
  h.update(json.dumps({'v': VERSION, 'data': config_lib.to_dict(d),
                       'judge': dataclasses.asdict(judge)}, sort_keys=True).encode())
  for path in (d.train_path, d.test_path, d.tokenizer):
    if path and os.path.exists(path):
      _hash_path(h, path)
  return h.hexdigest()


# ---------------------------------------------------------------------------------- the judge


class ARJudge:
  """A trained judge as an `ARScorer` (evaluation/generative.py): `score(texts)` -> token NLLs."""

  def __init__(self, params: Any, tokenizer: tokenizers.TextTokenizer, vocab_size: int,
               seq_len: int, cfg: JudgeConfig, name: str) -> None:
    self.params, self.tokenizer, self.cfg, self.name = params, tokenizer, cfg, name
    self.model = CausalLM(vocab_size, seq_len, cfg)
    self.seq_len = seq_len
    self._nll = jax.jit(lambda p, t, w: _nll(self.model.apply({'params': p}, t), t, w))

  def score_ids(self, rows: np.ndarray, weight: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """NLL [N, L-1] of rows [N, L] (BOS first) at positions 1.. where weight [N, L] is 1."""
    out = []
    for i in range(0, len(rows), batch_size):
      t, w = rows[i:i + batch_size], weight[i:i + batch_size]
      pad = batch_size - len(t)  # one compiled shape
      t = np.pad(t, ((0, pad), (0, 0)))
      w = np.pad(w, ((0, pad), (0, 0)))
      out.append(np.asarray(self._nll(self.params, jnp.asarray(t), jnp.asarray(w)))[:len(t) - pad])
    return np.concatenate(out).astype(np.float64)

  def score(self, texts: Sequence[str]) -> list[np.ndarray]:
    rows = np.zeros((len(texts), self.seq_len), np.int32)
    weight = np.zeros((len(texts), self.seq_len), np.float32)
    for n, text in enumerate(texts):
      ids = [self.tokenizer.bos_id] + self.tokenizer.encode(text)[:self.seq_len - 1]
      rows[n, :len(ids)] = ids
      weight[n, 1:len(ids)] = 1.0
    nll = self.score_ids(rows, weight) if len(texts) else np.zeros((0, self.seq_len - 1))
    return [nll[n][weight[n, 1:] > 0] for n in range(len(texts))]


def train_judge(config: config_lib.Config, cfg: JudgeConfig, *, log_every: int = 200
                ) -> tuple[Any, list[dict[str, float]]]:
  """Trains the judge on the config's train split: (params, log of {'step', 'loss'})."""
  c = judge_data_config(config, cfg)
  vocab, seq_len = int(c.model.vocab_size), int(c.model.seq_len)
  model = CausalLM(vocab, seq_len, cfg)
  key = jax.random.key(cfg.seed)
  params = model.init(key, jnp.zeros((1, seq_len), jnp.int32))['params']
  warmup = min(cfg.warmup_steps, cfg.steps // 2)
  sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup, max(cfg.steps, warmup + 1))
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, tokens, mask, k):
    def loss_fn(p):
      logits = model.apply({'params': p}, tokens, train=True, rngs={'dropout': k})
      return _nll(logits, tokens, mask).sum() / jnp.maximum(mask[:, 1:].sum(), 1.0)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    upd, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, upd), opt_state, loss

  data = iter(tasks.get(c).dataset(c, 'train', seed=cfg.seed, process_index=0, process_count=1))
  log, run = [], []
  for i in range(cfg.steps):
    b = next(data)
    params, opt_state, loss = step(params, opt_state, jnp.asarray(b['tokens']),
                                   jnp.asarray(b['loss_mask'], jnp.float32),
                                   jax.random.fold_in(key, i))
    run.append(float(loss))
    if (i + 1) % log_every == 0 or i + 1 == cfg.steps:
      log.append({'step': i + 1, 'loss': float(np.mean(run))})
      run = []
  return params, log


def load_or_train(config: config_lib.Config, cfg: JudgeConfig = JudgeConfig(), *,
                  cache_dir: str) -> ARJudge:
  """The judge of `config`'s data from `cache_dir`, trained there first if absent."""
  c = judge_data_config(config, cfg)
  key = fingerprint(c, cfg)[:16]
  path = os.path.join(cache_dir, f'ar_judge_{key}.npz')
  if os.path.isfile(path):
    params = convert_mdlm.load_params(path)
  else:
    params, log = train_judge(config, cfg)
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + '.tmp'
    convert_mdlm.save_params(tmp, jax.tree.map(np.asarray, params))
    os.replace(tmp, path)
    with open(path[:-4] + '.json', 'w', encoding='utf-8') as f:
      json.dump({'fingerprint': key, 'judge': dataclasses.asdict(cfg), 'train_log': log,
                 'data': config_lib.to_dict(c.data)}, f, indent=2)
  tok = tokenizers.tokenizer_from_config(c.data)
  return ARJudge(params, tok, int(c.model.vocab_size), int(c.model.seq_len), cfg,
                 name=f'ar_judge:{key[:8]}')


def judge_report(texts: Sequence[str], judge: ARJudge) -> dict[str, Any]:
  """Generative perplexity of `texts` under the judge (evaluation/generative.py report keys)."""
  return generative_metrics.gen_ppl_report(list(texts), scorer=judge)


def test_split_perplexity(judge: ARJudge, config: config_lib.Config) -> dict[str, float]:
  """The judge's own perplexity on the config's test split (a sanity figure for its quality)."""
  c = judge_data_config(config, judge.cfg)
  total, count = 0.0, 0
  for b in tasks.get(c).dataset(c, 'test', seed=0, process_index=0, process_count=1):
    w = np.asarray(b['loss_mask'], np.float32) * np.asarray(b.get('weight', 1.0),
                                                           np.float32).reshape(-1, 1)
    nll = judge.score_ids(np.asarray(b['tokens']), w)
    total += float(nll.sum())
    count += int(w[:, 1:].sum())
  return {'test_nats_per_token': total / max(count, 1),
          'test_ppl': float(np.exp(total / max(count, 1))), 'test_tokens': count}


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', required=True, help='experiment config file (its data section)')
  parser.add_argument('--cache_dir', required=True, help='where trained judges are kept')
  for f in dataclasses.fields(JudgeConfig):
    parser.add_argument(f'--{f.name}', type=type(f.default), default=f.default)
  args, rest = parser.parse_known_args(argv)
  config = config_lib.resolve(config_lib.load(args.config, rest))
  judge_cfg = JudgeConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(JudgeConfig)})
  judge = load_or_train(config, judge_cfg, cache_dir=args.cache_dir)
  print(json.dumps({'judge': judge.name, **test_split_perplexity(judge, config)}))


__all__ = ['ARJudge', 'CausalLM', 'JudgeConfig', 'judge_report', 'load_or_train',
           'test_split_perplexity', 'train_judge']

if __name__ == '__main__':
  main()
