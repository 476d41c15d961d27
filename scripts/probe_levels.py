"""Can a hierarchy pathway learn the Sudoku labeller? Train it alone and measure (issue 11).

The Sudoku levels are a deterministic function of the givens (rounds of naked / hidden singles,
`data.sudoku.hierarchy_levels`), so predicting the level of a masked cell is a multi-round
constraint-propagation problem on the clues. This probe trains ONLY the level prediction of a
Sudoku config's model (`--config`, default configs/sudoku.py, with `--config.section.field=value`
overrides, as `python -m hmdlm_jax.main` reads them) by
cross-entropy on the levels of the masked cells of freshly augmented training puzzles at t ~
U(t_min, 1), and reports the held-out level accuracy on generated test puzzles against the prior
(the majority level among the same cells):

  nice -n 10 python -m scripts.probe_levels --steps 600 --config.model.given_state=True \
      --config.model.pathway.layers=2 --config.model.pathway.repeats=4 --out /tmp/probe.json
  python -m scripts.probe_levels --config=configs/sudoku_learned_hierarchy.py --train hier \
      --steps 2000 [--config.optim.hier_lr_scale=3.0]

(from the repository root)

`--train backbone` trains every parameter on the level loss (the backbone is the trunk);
`--config.loss.beta_rounds=W` (with model.pathway.readout='rounds') adds W x the package's per-round
token loss (`processes.level_objectives.round_token_loss`: the 'hier_round_tokens' head of repeat
r trained on the solution digit of every masked blank cell that rounds 1..r of the labeller determine,
level >= K - r), so each repeat gets a direct signal for what its round should know;
`--train hier` trains only the hierarchy pathway ('hier_*' parameters, the backbone frozen at its
initialisation, which is the identity for the DiT's adaLN-zero blocks: the pathway then reads the
input embedding; use with model.pathway.input_embed so it sees its own level/given table).
Optimiser: AdamW at --lr (default: the config's optim.lr) with 100 warm-up steps and a cosine
decay, global-norm clip 1; the 'hier_*' parameters' step is scaled by the config's
optim.hier_lr_scale as in training (hmdlm_jax/optim.py `scale_by_group`).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import common
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import optim
from hmdlm_jax import tasks
from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import level_objectives
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes import schedules

DEFAULT_CONFIG = 'configs/sudoku.py'  # relative to the repository root, where the tools run

EVAL_TIMES = (0.25, 0.5, 0.75, 1.0)


def _batch(quiz: np.ndarray, solution: np.ndarray) -> dict[str, np.ndarray]:
  given = quiz > 0
  return {'tokens': sudoku.to_tokens(solution), 'levels': sudoku.hierarchy_levels(quiz),
          'given': given, 'loss_mask': ~given}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--steps', type=int, default=600)
  ap.add_argument('--batch', type=int, default=64)
  ap.add_argument('--config', default=DEFAULT_CONFIG,
                  help='a Sudoku configs/*.py file; --config.section.field=value overrides it')
  ap.add_argument('--lr', type=float, default=None, help="default: the config's optim.lr")
  ap.add_argument('--train', choices=('backbone', 'hier'), default='backbone')
  ap.add_argument('--test_puzzles', type=int, default=500)
  ap.add_argument('--seed', type=int, default=0)
  ap.add_argument('--out', default='')
  args, overrides = common.parse_with_overrides(ap)

  try:
    config = config_lib.resolve(config_lib.load(args.config, overrides))
  except ValueError as e:  # one line naming the field, nothing written
    raise SystemExit(f'probe_levels.py: {e}') from None
  cfg_m = config_lib.ModelConfig.from_section(config.model)
  loss_cfg = config_lib.LossConfig.from_config(config)
  schedule = schedules.schedule_from_config(config.schedule, cfg_m.num_levels)
  model = tasks.build_model(config)
  params = models.init_params(model, jax.random.key(args.seed), 81)
  num_params = models.count_params({k: v for k, v in params.items()
                                    if args.train == 'backbone' or k.startswith('hier_')})

  d = config.data
  def read(count, split):
    path = sudoku_generator.generated_csv(d.gen_seed, count, split, cache_dir=d.cache_dir,
                                          progress=False)
    return sudoku_csv.read_puzzles(path, need_solution=True)

  tr_q, tr_s = read(d.num_train_puzzles, 'train')
  te_q, te_s = read(args.test_puzzles, 'test')
  test = _batch(te_q, te_s)

  lr = float(config.optim.lr) if args.lr is None else args.lr
  sched = optax.join_schedules([optax.linear_schedule(0.0, lr, 100),
                                optax.cosine_decay_schedule(lr, max(args.steps - 100, 1))],
                               [100])
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.0),
                   optim.scale_by_group({'hier': float(config.optim.hier_lr_scale)}))
  trainable = lambda p: {k: v for k, v in p.items() if args.train == 'backbone' or
                         k.startswith('hier_')}
  opt_state = tx.init(trainable(params))
  rounds = loss_cfg.beta_rounds > 0

  def level_logp(p, batch, t, key, heads=('hier',)):
    """(level log-probs [B, L, K], selected cells [B, L], round token logits [B, L, R, V] when
    'hier_round_tokens' is in heads, else None)."""
    tokens, levels, given, loss_mask = base.unpack(batch)
    xt, ht, masked = hmdlm.corrupt(key, tokens, levels, given, t, schedule,
                                   mask_id=loss_cfg.mask_id)
    apply_fn = models.make_apply_fn(model, p, train=False)
    if loss_cfg.given_state:
      apply_fn = base.with_given_state(apply_fn, given, loss_cfg.num_levels)
    out = apply_fn(xt, ht, t, heads=heads)
    logp = parameterization.level_log_probs(out['hier'], t, schedule,
                                            prior_corrected=loss_cfg.prior_corrected)
    return logp, masked & loss_mask, out.get('hier_round_tokens')

  @jax.jit
  def step(p, opt_state, batch, key):
    k_t, k_m = jax.random.split(key)

    def loss_fn(net):
      logp, sel, round_logits = level_logp({**p, **net}, batch, base.sample_times(k_t, args.batch),
                                           k_m, hmdlm.pass1_heads(loss_cfg.beta_rounds))
      loss = level_objectives.level_cross_entropy(logp, batch['levels'], sel)
      if rounds:
        loss = loss + loss_cfg.beta_rounds * level_objectives.round_token_loss(
            round_logits, batch['tokens'], batch['levels'], sel)
      return loss

    net = trainable(p)
    loss, grads = jax.value_and_grad(loss_fn)(net)
    updates, opt_state = tx.update(grads, opt_state, net)
    return {**p, **optax.apply_updates(net, updates)}, opt_state, loss, optax.global_norm(grads)

  @jax.jit
  def predict(p, batch, t, key):
    logp, sel, _ = level_logp(p, batch, t, key)
    return jnp.argmax(logp, -1), sel

  def evaluate(p) -> dict[str, float]:
    out = {}
    key = jax.random.key(1234)
    n = len(te_q)
    for i, t0 in enumerate(EVAL_TIMES + ('random',)):
      if t0 == 'random':
        t = np.asarray(base.sample_times(jax.random.fold_in(key, 99), n))
      else:
        t = np.full((n,), t0, np.float32)
      pred, sel = jax.device_get(predict(p, test, jnp.asarray(t), jax.random.fold_in(key, i)))
      gold = test['levels'][sel]
      counts = np.bincount(gold, minlength=cfg_m.num_levels)
      out[f'acc_t{t0}'] = float((pred[sel] == gold).mean())
      out[f'prior_t{t0}'] = float(counts.max() / counts.sum())
      if t0 == 1.0:  # every blank masked: accuracy per gold level
        out['acc_per_level_t1'] = [float((pred[sel][gold == k] == k).mean())
                                   for k in range(cfg_m.num_levels)]
    return out

  rng = np.random.default_rng(args.seed)
  start = time.time()
  log = []
  for s in range(1, args.steps + 1):
    idx = rng.integers(0, len(tr_q), args.batch)
    pairs = [sudoku.augment(tr_q[i], tr_s[i], rng) for i in idx]
    batch = _batch(np.stack([a for a, _ in pairs]), np.stack([b for _, b in pairs]))
    params, opt_state, loss, gnorm = step(
        params, opt_state, batch, jax.random.fold_in(jax.random.key(args.seed), s))
    if s % 100 == 0 or s == args.steps:
      rec = {'step': s, 'loss': float(loss), 'grad_norm': float(gnorm),
             'seconds': round(time.time() - start, 1)}
      if s % 300 == 0 or s == args.steps:
        rec.update(evaluate(params))
      log.append(rec)
      print(json.dumps(rec), flush=True)
  result = {'config': args.config, 'overrides': overrides, 'train': args.train,
            'steps': args.steps, 'batch': args.batch, 'lr': lr,
            'hier_lr_scale': float(config.optim.hier_lr_scale), 'beta_rounds': loss_cfg.beta_rounds, 'trained_params': num_params,
            'final': log[-1], 'log': log}
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()
