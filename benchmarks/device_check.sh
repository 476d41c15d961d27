#!/usr/bin/env bash
# The accelerator check of issue 14: LM1B train step at batch 512 (bf16 compute, float32 loss)
# for MDLM and HMDLM with MFU, the Sudoku 25M step, and Algorithm 2 sampling throughput.
# No downloads; about 3-5 minutes on one H100/A100-class GPU. Writes device_check.json.
#
#   bash benchmarks/device_check.sh [OUT_DIR]        # accelerator; OUT_DIR defaults to $OUT or .
#   bash benchmarks/device_check.sh --dry [OUT_DIR]  # CPU, tiny shapes, same code paths (< 1 min)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
DRY=()
if [[ "${1:-}" == "--dry" ]]; then
  DRY=(--dry)
  shift
  export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
fi
OUT_DIR="${1:-${OUT:-.}}"
# Keep XLA's large host buffers resident (hmdlm_jax/runtime.py): glibc malloc tunables.
GLIBC_TUNABLES="$("${PYTHON}" -c 'from hmdlm_jax import runtime; print(runtime.allocator_env("glibc").get("GLIBC_TUNABLES", ""))')"
export GLIBC_TUNABLES
export HMDLM_JAX_ALLOCATOR=glibc
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-true}"
exec "${PYTHON}" -m benchmarks.device_check --out="${OUT_DIR}" "${DRY[@]}"
