#!/usr/bin/env bash
# SLURM batch script: one task per GPU on every node, all of them one jax.distributed cluster.
#
#   sbatch launch/slurm_gpu.sh --config=configs/sudoku_25m.py --workdir=DIR [--config.x.y=...]
#   sbatch --nodes=4 --gpus-per-node=8 --ntasks-per-node=8 launch/slurm_gpu.sh ...  # other shapes
#
# Submit from the checkout (or with the package installed), in an environment with
# jax[cuda13]==0.10.2 and requirements.txt: sbatch passes it on to every task. CUDA 13 wheels need
# an NVIDIA driver >= 580 (nvidia-smi shows it); with an older driver install jax[cuda12]==0.10.2
# instead (pyproject.toml's cuda12 extra: pip install -e ".[cuda12]"). DIR must be storage
# every node sees (a shared filesystem, or gs://); output: hmdlm_<jobid>.out in the submit folder.
# Each task drives one GPU: jax.distributed.initialize() reads SLURM's environment (coordinator =
# the first node, process id = SLURM_PROCID) and gives task SLURM_LOCALID the GPU of that index
# (hmdlm_jax/sharding.py checks that tasks and visible GPUs match). Keep --ntasks-per-node equal
# to --gpus-per-node. Resubmitting resumes from the last checkpoint.
#
# --signal=TERM@120: SIGTERM to every task 120 s before the time limit. Training checks for the
# signal at every step and then saves one checkpoint and exits 0, so the lead must cover one step
# (seconds here) plus one save of the full state (parameters, EMA, two Adam moments: 16 bytes
# per parameter, ~2.7 GB at 170M, tens of seconds to a shared filesystem or gs://), with room to
# spare; SLURM's timer may send it up to a minute earlier, never later. After the limit SLURM
# waits KillWait (30 s by default) before SIGKILL.
#
# Longer than one time limit: submit the next job now, to start when this one ends and resume
# from its checkpoint (same arguments): sbatch --dependency=afterany:JOBID launch/slurm_gpu.sh ...
# On clusters that preempt or lose nodes, turn the ##SBATCH --requeue line below into #SBATCH:
# SLURM then requeues the job (same id, same arguments), which resumes from the last checkpoint
# (sbatch --open-mode=append keeps the first attempt's lines in hmdlm_<jobid>.out).
#
#SBATCH --job-name=hmdlm
#SBATCH --nodes=2
#SBATCH --gpus-per-node=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --output=hmdlm_%j.out
##SBATCH --requeue
set -euo pipefail
fail() { echo "hmdlm_jax: error: launch/slurm_gpu.sh: $*" >&2; exit 1; }
[[ -n "${SLURM_JOB_ID:-}" ]] || fail "not inside a SLURM job: submit it with sbatch launch/slurm_gpu.sh ..."
workdir=""
for a in "$@"; do
  case "$a" in --workdir=*) workdir="${a#--workdir=}" ;; esac
done
[[ -n "$workdir" ]] || fail "pass --workdir=DIR on storage every node sees (a shared filesystem, or gs://)"
cd "${SLURM_SUBMIT_DIR:-.}"
PYTHON="${PYTHON:-python}"
# The host allocator of hmdlm_jax/runtime.py keeps XLA:CPU's buffers resident; on GPUs the step's
# buffers live on the device, so it is off here unless HMDLM_ALLOCATOR=auto|glibc|tcmalloc says
# otherwise (every task inherits it and applies it at start-up).
export HMDLM_ALLOCATOR="${HMDLM_ALLOCATOR:-none}"
echo "launch/slurm_gpu.sh: job ${SLURM_JOB_ID}: ${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NUM_NODES:-?} node(s), workdir ${workdir}" >&2
# distributed.enabled first, the user's flags after it (a later value of a field wins).
srun --kill-on-bad-exit=1 "${PYTHON}" -m hmdlm_jax.main --config.distributed.enabled=True "$@"
