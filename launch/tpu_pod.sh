#!/usr/bin/env bash
# Runs the same training command on every worker of a Cloud TPU VM pod slice.
# jax.distributed.initialize() auto-detects the pod (coordinator, process ids) when
# distributed.enabled is set and no coordinator address is given; each host feeds its own
# share of the global batch (data pipeline sharded by process index). The workdir must be
# shared by all hosts (a gs:// bucket), since Orbax checkpoints are written collectively.
#
#   TPU_NAME=my-v4-32 ZONE=us-central2-b WORKDIR=gs://bucket/runs/sudoku25m \
#       launch/tpu_pod.sh --config=configs/sudoku_25m.py [--config.x.y=...]
#
# Assumes the repository is checked out at $REPO_DIR on every worker with the requirements
# installed (jax[tpu]==0.10.2 instead of the CPU jax). Rerunning resumes from the checkpoint.
# The host allocator settings of hmdlm_jax/runtime.py (for XLA:CPU's buffers) are off on the TPU
# workers (HMDLM_ALLOCATOR=none, passed on to each worker); HMDLM_ALLOCATOR=auto|glibc|tcmalloc
# applies them on every worker first (tcmalloc if installed, else glibc malloc tunables).
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR (shared, e.g. gs://...)}"
REPO_DIR="${REPO_DIR:-~/hmdlm_jax}"
PYTHON="${PYTHON:-python3}"
ALLOCATOR="${HMDLM_ALLOCATOR:-none}"
ARGS=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" --worker=all --command="
  cd ${REPO_DIR} && export HMDLM_ALLOCATOR=${ALLOCATOR} && if [ ${ALLOCATOR} != none ]; then eval \"\$(${PYTHON} -m hmdlm_jax.runtime ${ALLOCATOR})\"; fi && ${PYTHON} -m hmdlm_jax.main --workdir=${WORKDIR} \
    --config.distributed.enabled=True ${ARGS}"
