r"""Scaling: what sharding costs on fake CPU devices, and how step time grows with L.

  python -m benchmarks.scaling [--quick] [--json=OUT.json]

devices: the tiny HMDLM train step at a fixed global batch on 1, 2, 4 and 8 fake CPU devices
(`--xla_force_host_platform_device_count`, mesh data = N: pure data parallelism). The devices share
the same CPU cores, so the ideal is a constant step time; the growth is the cost of partitioning
(per-device programs, collectives for the gradient all-reduce, smaller per-device matmuls).
length: the tiny HMDLM step on one device at L ∈ {128, 256, 512, 1024} with a fixed batch; the
per-token cost grows with L through attention (4·L·H FLOPs per token per layer, benchmarks/flops.py).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks import common  # pylint: disable=g-import-not-at-top

DEVICES = (1, 2, 4, 8)
LENGTHS = (128, 256, 512, 1024)


def grid(quick: bool) -> dict[str, Any]:
  if quick:
    # Same batch for both sweeps: the 1-device record doubles as the L = 128 point.
    return {'devices': (1, 2), 'device_batch': 2, 'lengths': (128, 256), 'length_batch': 2,
            'steps': 2}
  return {'devices': DEVICES, 'device_batch': 32, 'lengths': LENGTHS, 'length_batch': 8,
          'steps': 5}


def run(quick: bool, xla_flags: str = '') -> list[dict[str, Any]]:
  g = grid(quick)
  recs = []
  for n in g['devices']:
    args = ['--shape=tiny', '--mode=hmdlm', f'--batch_size={g["device_batch"]}',
            f'--steps={g["steps"]}']
    rec = common.run_module('benchmarks.train_step', args, devices=n, xla_flags=xla_flags)
    rec['sweep'] = 'devices'
    recs.append(rec)
    print(f'  devices={n}: {rec["median_step_s"]:.3f}s/step', flush=True)
  for l in g['lengths']:
    reuse = [r for r in recs if r['devices'] == 1 and r['seq_len'] == l
             and r['batch_size'] == g['length_batch']]
    if reuse:
      recs.append(dict(reuse[0], sweep='length'))
      continue
    args = ['--shape=tiny', '--mode=hmdlm', f'--batch_size={g["length_batch"]}',
            f'--seq_len={l}', f'--steps={g["steps"]}']
    rec = common.run_module('benchmarks.train_step', args, devices=1, xla_flags=xla_flags)
    rec['sweep'] = 'length'
    recs.append(rec)
    print(f'  L={l}: {rec["median_step_s"]:.3f}s/step', flush=True)
  return recs


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--quick', action='store_true')
  p.add_argument('--json', default=None)
  a = p.parse_args(argv)
  t0 = time.perf_counter()
  recs = run(a.quick)
  print(f'scaling: {time.perf_counter() - t0:.0f}s')
  if a.json:
    with open(a.json, 'w', encoding='utf-8') as f:
      json.dump(recs, f, indent=2)
  return recs


if __name__ == '__main__':
  main()
