#!/usr/bin/env bash
# Trains on every worker of a Cloud TPU VM slice (one host or a pod slice), from your machine.
#
#   export TPU_NAME=hmdlm ZONE=us-central2-b        # the TPU VM (gcloud compute tpus tpu-vm create)
#   launch/tpu_pod.sh setup                         # this checkout + jax[tpu] on every worker
#   launch/tpu_pod.sh run --config=configs/sudoku_25m.py --workdir=gs://BUCKET/runs/s25m [...]
#   launch/tpu_pod.sh logs [--worker=N|all] [--lines=N] [--follow]   # a worker's log (default 0)
#   launch/tpu_pod.sh stop                          # SIGTERM: every worker checkpoints and exits
#
# setup: packs this checkout (git's tracked and untracked, not ignored, files), copies it to
#   ~/hmdlm_jax on every worker (gcloud compute tpus tpu-vm scp --worker=all), makes the virtual
#   environment ~/hmdlm_venv there with WORKER_PYTHON (python3; it must be >= 3.11) unless it
#   exists, and installs JAX_PACKAGE (jax[tpu] at requirements.txt's jax pin) and the package into it.
# run: starts `python -m hmdlm_jax.main --config.distributed.enabled=True ARGS` on every worker,
#   detached from the ssh session (nohup, setsid), and returns at once. Each worker appends to its
#   own log ~/hmdlm_logs/run.log, which ends with "tpu_pod.sh: the run exited with status N".
#   jax.distributed.initialize() finds the slice's workers itself. --workdir must be storage all
#   workers share (gs://) unless the slice has one host. HMDLM_ALLOCATOR is passed on to every
#   worker (none unless set here; hmdlm_jax/runtime.py). Running it again resumes from the
#   workdir's last checkpoint.
# stop: SIGTERM to the run on every worker; each saves a checkpoint and exits, and stop waits for
#   that (at most STOP_TIMEOUT seconds, 600 by default).
# Optional: PROJECT (gcloud --project), WORKER_PYTHON, JAX_PACKAGE.
set -euo pipefail
fail() { echo "hmdlm_jax: error: launch/tpu_pod.sh: $*" >&2; exit 1; }
usage="usage: TPU_NAME=NAME ZONE=ZONE launch/tpu_pod.sh setup|run|logs|stop [ARGS]"
[[ $# -ge 1 ]] || fail "no subcommand; ${usage}"
cmd="$1"
shift
case "${cmd}" in setup|run|logs|stop) ;; *) fail "unknown subcommand '${cmd}'; ${usage}" ;; esac
[[ -n "${TPU_NAME:-}" ]] || fail "set TPU_NAME to the TPU VM's name; ${usage}"
[[ -n "${ZONE:-}" ]] || fail "set ZONE to the TPU VM's zone; ${usage}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
gcloud_tpu() {  # gcloud_tpu ssh|scp ARGS...
  local what="$1"
  shift
  gcloud compute tpus tpu-vm "${what}" "$@" --zone="${ZONE}" ${PROJECT:+--project="${PROJECT}"}
}
# On the workers, paths relative to the home folder.
PIDFILE=hmdlm_logs/run.pid
LOGFILE=hmdlm_logs/run.log
# Shell text that stops a worker's command when its run is alive.
refuse_if_running="if [ -f ${PIDFILE} ] && kill -0 \"\$(cat ${PIDFILE})\" 2>/dev/null; then
  echo \"hmdlm_jax: error: worker \$(hostname): a run is going (pid \$(cat ${PIDFILE})); launch/tpu_pod.sh stop first\" >&2; exit 1; fi"

case "${cmd}" in
setup)
  [[ $# -eq 0 ]] || fail "setup takes no arguments (got $*)"
  git -C "${REPO}" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
    || fail "${REPO} is not a git checkout: setup copies the checkout's files"
  jax_pin="$(sed -n 's/^jax==\([^ ]*\).*/\1/p' "${REPO}/requirements.txt")"
  JAX_PACKAGE="${JAX_PACKAGE:-jax[tpu]==${jax_pin}}"
  WORKER_PYTHON="${WORKER_PYTHON:-python3}"
  tmp="$(mktemp -d)"
  trap 'rm -rf "${tmp}"' EXIT
  (cd "${REPO}" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh \
    | tar --null -T - -czf "${tmp}/hmdlm_jax.tar.gz")
  echo "launch/tpu_pod.sh: copying $(du -h "${tmp}/hmdlm_jax.tar.gz" | cut -f1) of ${REPO} to every worker of ${TPU_NAME}" >&2
  gcloud_tpu scp "${tmp}/hmdlm_jax.tar.gz" "${TPU_NAME}:hmdlm_jax.tar.gz" --worker=all
  gcloud_tpu ssh "${TPU_NAME}" --worker=all --command="set -euo pipefail; cd ~
${refuse_if_running}
rm -rf hmdlm_jax.new && mkdir hmdlm_jax.new && tar -xzf hmdlm_jax.tar.gz -C hmdlm_jax.new
rm -rf hmdlm_jax && mv hmdlm_jax.new hmdlm_jax && rm -f hmdlm_jax.tar.gz
if [ ! -x hmdlm_venv/bin/python ]; then
  $(printf '%q' "${WORKER_PYTHON}") -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo \"hmdlm_jax: error: worker \$(hostname): $(printf '%q' "${WORKER_PYTHON}") is older than Python 3.11; set WORKER_PYTHON\" >&2; exit 1; }
  $(printf '%q' "${WORKER_PYTHON}") -m venv hmdlm_venv
fi
hmdlm_venv/bin/python -m pip install -q $(printf '%q' "${JAX_PACKAGE}") -e ./hmdlm_jax
echo \"worker \$(hostname): ~/hmdlm_jax installed in ~/hmdlm_venv\""
  ;;
run)
  workdir=""
  for a in "$@"; do
    case "$a" in --workdir=*) workdir="${a#--workdir=}" ;; esac
  done
  [[ -n "${workdir}" ]] || fail "pass --workdir=DIR, storage every worker shares (gs://...)"
  [[ "${workdir}" == gs://* || "${workdir}" == /* ]] \
    || fail "--workdir=${workdir}: give gs://... or an absolute path (a relative one would lie in the worker's ~/hmdlm_jax, which setup replaces)"
  [[ "${workdir}" == gs://* ]] || echo "launch/tpu_pod.sh: --workdir=${workdir} is not gs://: each worker writes its own disk, right for a one-host slice only" >&2
  # The host allocator of hmdlm_jax/runtime.py keeps XLA:CPU's buffers resident; the TPU's
  # buffers live on the chips, so it is off unless HMDLM_ALLOCATOR=auto|glibc|tcmalloc says so.
  allocator="export HMDLM_ALLOCATOR=$(printf '%q' "${HMDLM_ALLOCATOR:-none}")"
  # On each worker, bash -c WRAPPER starts python in the background, records its pid (SIGTERM
  # from `stop` reaches python itself), waits for it and appends its exit status to the log.
  # shellcheck disable=SC2016  # expanded on the worker
  wrapper='echo "=== tpu_pod.sh run on $(hostname) at $(date -u +%FT%TZ): $*"
"$@" & pid=$!; echo "${pid}" > "$HOME/'"${PIDFILE}"'"
wait "${pid}" && rc=0 || rc=$?
rm -f "$HOME/'"${PIDFILE}"'"; echo "tpu_pod.sh: the run exited with status ${rc}"; exit "${rc}"'
  args="$(printf ' %q' -m hmdlm_jax.main --config.distributed.enabled=True "$@")"
  gcloud_tpu ssh "${TPU_NAME}" --worker=all --command="set -euo pipefail; cd ~
[ -d hmdlm_jax ] && [ -x hmdlm_venv/bin/python ] || {
  echo \"hmdlm_jax: error: worker \$(hostname): no ~/hmdlm_jax or ~/hmdlm_venv: launch/tpu_pod.sh setup first\" >&2; exit 1; }
mkdir -p hmdlm_logs
${refuse_if_running}
${allocator}
cd hmdlm_jax
nohup setsid bash -c $(printf '%q' "${wrapper}") tpu_pod_run \"\$HOME/hmdlm_venv/bin/python\"${args} \\
  >> ~/${LOGFILE} 2>&1 < /dev/null &
echo \"worker \$(hostname): started; its log is ~/${LOGFILE}\""
  ;;
logs)
  worker=0 lines=100 follow=""
  for a in "$@"; do
    case "$a" in
      --worker=*) worker="${a#--worker=}" ;;
      --lines=*) lines="${a#--lines=}" ;;
      --follow) follow="-F" ;;
      *) fail "logs: unknown argument '$a' (--worker=N|all, --lines=N, --follow)" ;;
    esac
  done
  [[ "${worker}" == all || "${worker}" =~ ^[0-9]+$ ]] || fail "logs: --worker=${worker}: a number or all"
  [[ "${lines}" =~ ^[0-9]+$ ]] || fail "logs: --lines=${lines}: a number"
  gcloud_tpu ssh "${TPU_NAME}" --worker="${worker}" --command="cd ~
if [ -f ${PIDFILE} ] && kill -0 \"\$(cat ${PIDFILE})\" 2>/dev/null; then
  echo \"== worker \$(hostname): running (pid \$(cat ${PIDFILE})), ~/${LOGFILE}:\"
else echo \"== worker \$(hostname): not running, ~/${LOGFILE}:\"; fi
[ -f ${LOGFILE} ] || { echo '(no log: launch/tpu_pod.sh run first)'; exit 0; }
tail -n ${lines} ${follow} ${LOGFILE}"
  ;;
stop)
  [[ $# -eq 0 ]] || fail "stop takes no arguments (got $*)"
  timeout_s="${STOP_TIMEOUT:-600}"
  [[ "${timeout_s}" =~ ^[0-9]+$ ]] || fail "STOP_TIMEOUT=${timeout_s}: a number of seconds"
  gcloud_tpu ssh "${TPU_NAME}" --worker=all --command="cd ~
if ! { [ -f ${PIDFILE} ] && kill -0 \"\$(cat ${PIDFILE})\" 2>/dev/null; }; then
  echo \"worker \$(hostname): no run going\"; exit 0; fi
pid=\$(cat ${PIDFILE}); kill -TERM \"\$pid\"
echo \"worker \$(hostname): SIGTERM sent to pid \$pid; waiting for its checkpoint\"
for _ in \$(seq ${timeout_s}); do kill -0 \"\$pid\" 2>/dev/null || break; sleep 1; done
if kill -0 \"\$pid\" 2>/dev/null; then
  echo \"hmdlm_jax: error: worker \$(hostname): pid \$pid still runs after ${timeout_s} s; see ~/${LOGFILE}\" >&2; exit 1; fi
sleep 1; tail -n 1 ${LOGFILE}"
  ;;
esac
