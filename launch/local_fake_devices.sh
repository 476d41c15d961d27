#!/usr/bin/env bash
# Runs hmdlm_jax on N fake CPU devices (one process), to exercise the sharded code paths
# (data / FSDP / tensor mesh) on a laptop or CI machine without accelerators.
# XLA fixes the device count when JAX starts, hence the environment variable.
#
#   launch/local_fake_devices.sh 8 --config=configs/tiny_test.py --workdir=/tmp/fake8 \
#       --config.mesh.data=4 --config.mesh.fsdp=2
#
# Arguments after N are passed to `python -m hmdlm_jax.main` unchanged.
set -euo pipefail
N="${1:?usage: $0 NUM_DEVICES [main.py flags...]}"
shift
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
# CPU devices: keep XLA's large host buffers resident instead of mmap/munmap + page faults every
# step (hmdlm_jax/runtime.py, benchmarks/README.md "Kernel time"): tcmalloc (LD_PRELOAD,
# TCMALLOC_RELEASE_RATE=0) when installed (apt-get install libtcmalloc-minimal4), else glibc malloc
# tunables. Chosen here, explicitly: HMDLM_ALLOCATOR=auto (default) | glibc | tcmalloc | none.
export HMDLM_ALLOCATOR="${HMDLM_ALLOCATOR:-auto}"
if [[ "${HMDLM_ALLOCATOR}" != none ]]; then
  eval "$("${PYTHON}" -m hmdlm_jax.runtime "${HMDLM_ALLOCATOR}")"
  echo "launch: allocator ${HMDLM_ALLOCATOR} for XLA:CPU's buffers (HMDLM_ALLOCATOR=none turns it off)" >&2
fi
export XLA_FLAGS="--xla_force_host_platform_device_count=${N} ${XLA_FLAGS:-}"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
exec "${PYTHON}" -m hmdlm_jax.main "$@"
