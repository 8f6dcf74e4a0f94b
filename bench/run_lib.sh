# shellcheck shell=bash disable=SC2034,SC2154  # start_dir is the callers'; logs and limit are set by them
# Sourced by the benchmark scripts that run ranks (bench/collectives/run.sh,
# bench/ddp/run.sh): strict mode, failing with the line that failed, stopping the
# measurement in flight on a signal or on exit, and the repository root as the
# working directory (start_dir keeps where the script was called from).
set -euo pipefail

die() { echo "run.sh: $*" >&2; exit 1; }
trap 'echo "run.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

# A measurement runs in the background (run_logged) so that a signal to the script
# reaches the trap at once; timeout(1) passes a TERM on to its child (mpirun or ctrain
# launch, which stop their ranks) and sends KILL 10 s later.
job=""
stop_job() {
    [ -n "$job" ] || return 0
    kill -TERM "$job" 2>/dev/null || true
    wait "$job" 2>/dev/null || true
    job=""
}
trap 'stop_job; echo "run.sh: interrupted" >&2; exit 130' INT TERM
trap 'stop_job' EXIT

start_dir=$PWD
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# run_logged NAME CMD...: CMD under `timeout -k 10 $limit`, in the background; the
# command line and CMD's stderr go to $logs/NAME.err, its stdout to $logs/NAME.out.
# Sets rc to CMD's exit status (124: timed out); on failure shows the end of the log.
run_logged() {
    local name=$1
    shift
    rc=0
    echo "run.sh: $name: $*" | tee "$logs/$name.err" >&2
    timeout -k 10 "$limit" "$@" >"$logs/$name.out" 2>>"$logs/$name.err" &
    job=$!
    wait "$job" || rc=$?
    job=""
    [ "$rc" -eq 0 ] || tail -n +2 "$logs/$name.err" | tail -n 20 >&2
}
