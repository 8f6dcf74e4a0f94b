#!/usr/bin/env bash
# Every GPU check in one go, for a machine with an NVIDIA GPU (under 8 minutes on one
# H200): build for this GPU, the GPU conformance suite (make test-gpu), compute-sanitizer
# memcheck and racecheck on a short training run of the GPT example, and the GPU
# benchmark (bench/gpt_gpu/run.sh).
#
#   tests/gpu/run.sh [REPORT_DIR]
#
# REPORT_DIR (default $OUT when set, else build/gpu-report) receives test-gpu.log,
# memcheck.log, racecheck.log, bench.md and summary.txt. SKIP_BUILD=1 uses the binaries
# already in build/ (copied from a machine that built them). Exit status: 0 when every
# step passed, 1 when one failed (summary.txt says which), 3 when no GPU can be used.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
report=${1:-${OUT:-build/gpu-report}}
mkdir -p "$report" && report=$(cd "$report" && pwd)
summary=$report/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
failed=0
step() { # step NAME LIMIT CMD...: runs CMD with a time limit, logs to REPORT/NAME.log
    local name=$1 limit=$2 t0=$SECONDS rc=0
    shift 2
    echo "== $name: $*" >&2
    timeout -k 10 "$limit" "$@" >"$report/$name.log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then note "PASS $name ($((SECONDS - t0)) s)"
    else note "FAIL $name (exit $rc after $((SECONDS - t0)) s; last lines below)"; tail -25 "$report/$name.log" | tee -a "$summary"; failed=1; fi
    return "$rc"
}

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$report/gpus.txt" 2>&1; then
    note "no GPU: nvidia-smi is missing or sees no device ($(head -1 "$report/gpus.txt" 2>/dev/null))"
    exit 3
fi
note "$(cat "$report/gpus.txt")"
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
arch="-gencode arch=compute_${cc},code=sm_${cc}"
jobs=$(nproc 2>/dev/null || echo 4)

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    step build 420 make -j"$jobs" CUDA_ARCH="$arch" build/lib/libctrain.so build/tests/ctrain_tests build/bin/ctrain \
        build/examples/gpt_train build/examples/quickstart build/bench/gpt_gpu/gpt_gpu || { note "build failed: stopping"; exit 1; }
fi
build/bin/ctrain env >"$report/env.txt" 2>&1 || true
sed -n '/^gpu/,/^[a-z]/p' "$report/env.txt" | tee -a "$summary"

# the conformance suite: every op on the GPU against the CPU reference
step test-gpu 300 env CTRAIN_BIN="$root/build/bin/ctrain" CTRAIN_EXAMPLES="$root/build/examples" \
    CTRAIN_LIB="$root/build/lib/libctrain.so" CTRAIN_SRC="$root" \
    build/tests/ctrain_tests --filter 'gpu_*/*' --jobs 1 --verbose
grep -E "^\[====\] Synthesis|^\[FAIL\]" "$report/test-gpu.log" | tee -a "$summary"

# compute-sanitizer on a short training run: every kernel of a step, forward and backward
tiny=(--steps 2 --n_layer 2 --n_head 2 --n_embd 64 --block_size 64 --batch_size 2 --eval_every 2 --eval_batches 1
      --sample_tokens 16 --seq_warmup 0 --out_dir "$report/sanitized-run")
san=$CUDA_HOME/bin/compute-sanitizer
step memcheck 120 "$san" --tool memcheck --error-exitcode 9 build/examples/gpt_train "${tiny[@]}"
step racecheck 120 "$san" --tool racecheck --error-exitcode 9 build/examples/gpt_train "${tiny[@]}"
CTRAIN_MIXED_PRECISION=bf16 step memcheck-bf16 120 "$san" --tool memcheck --error-exitcode 9 build/examples/gpt_train "${tiny[@]}"

# the benchmark (PyTorch rows where this machine has a CUDA torch)
step bench 240 bench/gpt_gpu/run.sh --steps 5 --out "$report/bench.md" && cat "$report/bench.md" >>"$summary"

note "total $SECONDS s"
exit "$failed"
