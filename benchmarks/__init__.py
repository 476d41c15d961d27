"""Performance benchmarks (scripts, not tests): `python -m benchmarks.run [--quick]`.

Modules: `flops` (explicit FLOP count of a train step), `train_step` (train-step throughput, model
FLOP utilisation, memory), `sampling` (sampler throughput), `scaling` (fake-device sharding cost and
growth with L), `machine` (machine peak: large float32 matmuls), `run` (orchestration, tables,
JSON in benchmarks/results/). Figures and method: benchmarks/README.md.
"""
