#!/usr/bin/env bash
# SLURM batch script: one task per node, all GPUs of a node visible to its task.
# With distributed.enabled and no coordinator address, jax.distributed.initialize() reads the
# SLURM environment (SLURM_NTASKS, SLURM_PROCID, node list) and picks the coordinator itself.
# The workdir must be on a filesystem shared by all nodes. Resubmitting resumes from the last
# checkpoint; SIGTERM (preemption, scancel, time limit with --signal) saves one and exits 0.
#
#   sbatch launch/slurm_gpu.sh --config=configs/sudoku_25m.py --workdir=/shared/runs/s25m
#
#SBATCH --job-name=hmdlm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --output=hmdlm_%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
PYTHON="${PYTHON:-python}"  # a venv with jax[cuda13]==0.10.2 and requirements.txt
# The host allocator of hmdlm_jax/runtime.py keeps XLA:CPU's buffers resident; on GPUs the step's
# buffers live on the device, so it is off here (HMDLM_ALLOCATOR=none, passed on to every task).
# HMDLM_ALLOCATOR=auto|glibc|tcmalloc turns it on (tcmalloc needs libtcmalloc-minimal4).
export HMDLM_ALLOCATOR="${HMDLM_ALLOCATOR:-none}"
if [[ "${HMDLM_ALLOCATOR}" != none ]]; then
  eval "$("${PYTHON}" -m hmdlm_jax.runtime "${HMDLM_ALLOCATOR}")"
fi
srun --kill-on-bad-exit=1 "${PYTHON}" -m hmdlm_jax.main \
  --config.distributed.enabled=True "$@"
