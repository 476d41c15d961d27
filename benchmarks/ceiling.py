r"""The floor under the MDLM train step on this machine: its matrix products at the measured GEMM
rate, plus its optimizer update, against the reference step timed in the same run.

  python -m benchmarks.ceiling --shape=small [--reference_tree=mdlm:PATH] [--rounds=2] \
      [--allocator=mallopt] [--json=benchmarks/results/ceiling_small.json]

Issue 14 asks for ≥ 1.3× the tokens/s of the faster reference. This script says whether any
implementation of our step on XLA:CPU could get there, from three measurements made in one run:

  1. every matrix product of the step (`gemms`: forward, input gradient, weight gradient of each
     layer, the attention products, the token head at its expected half of the rows with the
     backward recompute of models/token_head.py), each timed alone as a plain row-major float32
     product in `jax.jit` (best of `--reps`), and the same list in PyTorch (MKL) in a child
     process when torch is installed;
  2. the package's optimizer update on the real parameter tree (optim.make_optimizer: global-norm
     clip + AdamW, then optim.ema_update), jitted with donation as in the train step;
  3. (with `--reference_tree=mdlm:PATH`) the reference step and ours (`benchmarks.side_by_side`
     children), interleaved over `--rounds`.

The floor is (1) + (2): everything else the step does (LayerNorm, GELU, softmax, dropout, adaLN,
the loss) counted as free, and each product as fast as it runs alone at its best. A target above
the floor's tokens/s cannot be met by this step on this machine in float32.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from typing import Any

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from benchmarks import machine  # pylint: disable=g-import-not-at-top
from benchmarks import side_by_side as sbs

Gemm = tuple[int, int, int, int]  # (batch, m, k, n): batch × [m, k] @ [k, n]


def gemms(shape: str) -> dict[Gemm, int]:
  """The step's matrix products (MDLM mode, selected-rows head) -> how many times each runs."""
  n_layers, h, heads, mlp, cond, vocab, b, length = sbs.SHAPES[shape]
  rows, d = b * length, h // heads
  out: collections.Counter[Gemm] = collections.Counter()

  def linear(m: int, k: int, n: int, times: int = 1, recompute: bool = False) -> None:
    out[(1, m, k, n)] += times * (2 if recompute else 1)  # forward (+ backward recompute)
    out[(1, m, n, k)] += times  # input gradient
    out[(1, k, m, n)] += times  # weight gradient

  for k, n in ((h, 3 * h), (h, h), (h, mlp), (mlp, h)):  # qkv, attention out, MLP in / out
    linear(rows, k, n, n_layers)
  linear(b, cond, 6 * h, n_layers)  # adaLN modulation of the blocks (per sequence)
  linear(b, cond, 2 * h)  # the final layer's adaLN
  linear(b, 256, cond)  # sigma map: sinusoidal features -> cond -> cond
  linear(b, cond, cond)
  bh = b * heads
  for m, k, n in ((length, d, length), (length, length, d)):  # scores, probs @ v
    out[(bh, m, k, n)] += n_layers
    out[(bh, m, n, k)] += n_layers
    out[(bh, k, m, n)] += n_layers
  linear(rows // 2, h, vocab, recompute=True)  # token head at the masked half of the rows
  return dict(out)


def gemm_key(g: Gemm) -> str:
  """'batchxmxkxn': a product's name in the per-product time dicts (and their JSON)."""
  return 'x'.join(str(v) for v in g)


def gemm_flops(table: dict[Gemm, int]) -> int:
  return sum(2 * bt * m * k * n * c for (bt, m, k, n), c in table.items())


def _best(fn: Any, reps: int) -> float:
  fn()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def time_gemms_jax(table: dict[Gemm, int], reps: int) -> dict[str, float]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  mm = jax.jit(jnp.matmul)
  out = {}
  for (bt, m, k, n) in table:
    x = jnp.ones((bt, m, k) if bt > 1 else (m, k), jnp.float32)
    y = jnp.ones((bt, k, n) if bt > 1 else (k, n), jnp.float32)
    run = lambda x=x, y=y: mm(x, y).block_until_ready()
    out[gemm_key((bt, m, k, n))] = _best(run, reps)
  return out


def time_gemms_torch(table: dict[Gemm, int], reps: int) -> dict[str, float]:
  import torch  # pylint: disable=g-import-not-at-top
  out = {}
  for (bt, m, k, n) in table:
    x = torch.ones((bt, m, k) if bt > 1 else (m, k))
    y = torch.ones((bt, k, n) if bt > 1 else (k, n))
    run = lambda x=x, y=y: torch.matmul(x, y)
    out[gemm_key((bt, m, k, n))] = _best(run, reps)
  return out


def time_optimizer(shape: str, reps: int) -> dict[str, Any]:
  """The real optimizer update + EMA on the real parameter tree of the shape's MDLM model."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step as ts  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import models, optim, tasks  # pylint: disable=g-import-not-at-top
  config = ts.shape_config(shape, 'mdlm', 'float32', batch_size=sbs.SHAPES[shape][6])
  model = tasks.build_model(config)
  shapes = models.abstract_params(model, int(config.model.seq_len))
  params = jax.tree.map(lambda s: jnp.full(s.shape, 0.01, s.dtype), shapes)
  tx = optim.make_optimizer(config.optim, int(config.train.num_steps))
  state = {'params': params, 'ema': jax.tree.map(jnp.copy, params), 'opt': tx.init(params)}
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e-3, p.dtype), params)

  def update_fn(st: Any, g: Any) -> Any:
    upd, opt = tx.update(g, st['opt'], st['params'])
    new = optax.apply_updates(st['params'], upd)
    ema = optim.ema_update(st['ema'], new, jnp.float32(0.9999))
    return {'params': new, 'ema': ema, 'opt': opt}

  update = jax.jit(update_fn, donate_argnums=0)
  holder = {'s': state}

  def one() -> None:
    holder['s'] = update(holder['s'], grads)
    jax.block_until_ready(holder['s'])

  n = sum(int(p.size) for p in jax.tree.leaves(params))
  return {'num_params': n, 'seconds': _best(one, reps)}


def _run_torch_child(table: dict[Gemm, int], reps: int) -> dict[str, float] | None:
  """PyTorch's GEMM times in a child process (JAX and PyTorch never share one), or None."""
  cmd = [sys.executable, '-m', 'benchmarks.ceiling', '--child=torch_gemms', f'--reps={reps}',
         f'--table={json.dumps([[*k, c] for k, c in table.items()])}']
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
  proc = subprocess.run(cmd, cwd=_REPO, env=env, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    print(f'torch GEMMs skipped (child exit {proc.returncode}): '
          f'{proc.stderr.strip().splitlines()[-1:]}')
    return None
  return json.loads(proc.stdout.strip().splitlines()[-1])


def summarise(table: dict[Gemm, int], times: dict[str, float]) -> dict[str, float]:
  seconds = sum(times[gemm_key(g)] * c for g, c in table.items())
  return {'seconds': seconds, 'gflop_per_s': gemm_flops(table) / seconds / 1e9}


def per_product_lines(table: dict[Gemm, int], jax_s: dict[str, float],
                      torch_s: dict[str, float], top: int) -> list[str]:
  """Where JAX's products lose to PyTorch's: one line per shape, by count × time difference."""
  rows = sorted(((c * (jax_s[gemm_key(g)] - torch_s[gemm_key(g)]), gemm_key(g), c)
                 for g, c in table.items()), reverse=True)
  return [f'  {key} x{c}: {jax_s[key] * 1e3:.2f} / {torch_s[key] * 1e3:.2f} ms, {d:+.3f} s'
          for d, key, c in rows[:top]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--shape', default='small', choices=sorted(sbs.SHAPES))
  p.add_argument('--reps', type=int, default=5)
  p.add_argument('--rounds', type=int, default=2)
  p.add_argument('--steps', type=int, default=3)
  p.add_argument('--reference_tree', action='append', default=[],
                 help='mdlm:PATH (kuleshov-group/mdlm) and/or md4:PATH: time those steps too')
  p.add_argument('--allocator', default='default', choices=sbs.ALLOCATORS,
                 help="the step children's allocator ('mallopt' = what hmdlm_jax.main applies)")
  p.add_argument('--json', default=None)
  p.add_argument('--child', default=None, help=argparse.SUPPRESS)
  p.add_argument('--table', default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.allocator == 'mallopt':  # the torch child inherits the request
    from hmdlm_jax import runtime  # pylint: disable=g-import-not-at-top  (no JAX import)
    os.environ[runtime.MARKER] = 'mallopt'
  # This process's GEMMs and optimizer (and the torch child's) under the setting too, so that no
  # product's time includes faulting in its output: the floor stays a floor.
  sbs.apply_requested_allocator()
  if a.child == 'torch_gemms':
    table = {tuple(r[:4]): r[4] for r in json.loads(a.table)}
    print(json.dumps(time_gemms_torch(table, a.reps)))
    return {}
  trees = dict(t.split(':', 1) for t in a.reference_tree)
  refs = [r for r in ('md4', 'mdlm_compile') if r.split('_')[0] in trees]
  table = gemms(a.shape)
  tokens = sbs.SHAPES[a.shape][6] * sbs.SHAPES[a.shape][7]
  result: dict[str, Any] = {'machine': machine.machine_info(_REPO), 'shape': a.shape,
                            'dims': sbs.SHAPES[a.shape], 'allocator': a.allocator,
                            'gemm_gflop_per_step': gemm_flops(table) / 1e9, 'rounds': []}
  for rnd in range(a.rounds):
    row: dict[str, Any] = {'round': rnd}
    jax_times = time_gemms_jax(table, a.reps)
    row['jax_gemm'] = summarise(table, jax_times)
    row['jax_gemm_s'] = jax_times
    torch_times = _run_torch_child(table, a.reps)
    if torch_times is not None:
      row['torch_gemm'] = summarise(table, torch_times)
      row['torch_gemm_s'] = torch_times
    row['optimizer'] = time_optimizer(a.shape, a.reps)
    row['floor_s'] = row['jax_gemm']['seconds'] + row['optimizer']['seconds']
    row['floor_tokens_per_s'] = tokens / row['floor_s']
    for runner in ['ours_mdlm'] + refs:
      rec = sbs.spawn(runner, a.shape, 1, a.steps, trees, a.allocator, 3600)
      row[runner] = (tokens / rec['median_step_s']) if 'error' not in rec else rec['error']
    result['rounds'].append(row)
    print(json.dumps(row))
  lines = [f'{a.shape}: {result["gemm_gflop_per_step"]:.0f} GFLOP of matrix products per step']
  for row in result['rounds']:
    msg = (f'round {row["round"]}: JAX GEMMs {row["jax_gemm"]["seconds"]:.2f} s '
           f'({row["jax_gemm"]["gflop_per_s"]:.0f} GFLOP/s)')
    if 'torch_gemm' in row:
      msg += (f', PyTorch GEMMs {row["torch_gemm"]["seconds"]:.2f} s '
              f'({row["torch_gemm"]["gflop_per_s"]:.0f} GFLOP/s)')
    msg += (f'; optimizer {row["optimizer"]["seconds"]:.2f} s; floor {row["floor_s"]:.2f} s = '
            f'{row["floor_tokens_per_s"]:.0f} tokens/s')
    for r in ['ours_mdlm'] + refs:
      if not isinstance(row[r], float):  # the child's error, e.g. 'exit 1'
        msg += f'; {r} failed: {row[r]}'
      elif r == 'ours_mdlm':
        msg += f'; ours {row[r]:.0f} tokens/s'
      else:
        msg += (f'; {r} {row[r]:.0f} tokens/s (1.3x = {1.3 * row[r]:.0f}; floor / {r} = '
                f'{row["floor_tokens_per_s"] / row[r]:.2f})')
    lines.append(msg)
  last = result['rounds'][-1]
  if 'torch_gemm_s' in last:
    lines.append(f'round {last["round"]}, per product (batch x m x k x n, count: JAX / PyTorch ms '
                 'each, count x difference), the five costliest differences:')
    lines += per_product_lines(table, last['jax_gemm_s'], last['torch_gemm_s'], top=5)
  print('\n'.join(lines))
  if a.json:
    with open(a.json, 'w', encoding='utf-8') as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == '__main__':
  main()
