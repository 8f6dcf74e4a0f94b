#!/usr/bin/env bash
# GPT W1 data-parallel training throughput on this machine: ctrain DDP beside PyTorch DDP
# and HuggingFace Accelerate, with ctrain's single process as the baseline, in one run.
#
#   bench/ddp/run.sh [--quick] [--out FILE] [--timeout S] [--no-install]
#
# The model and step are bench/gpt_cpu's W1 (vocab 256, block 256, 4 layers, 4 heads,
# width 256, batch 8 x 256 per process; forward, cross-entropy, backward,
# clip_grad_norm 1.0, AdamW, zero_grad). Configurations:
#   ctrain 1x1         gpt_cpu --config w1 --threads 1 (one process, one thread)
#   ctrain 1x2         gpt_cpu --config w1 --threads 2
#   ctrain DDP shm     gpt_ddp (the Accelerator) under ctrain launch --num_processes 2
#                      --num_cpu_threads_per_process 1, CTRAIN_TRANSPORT unset ("auto":
#                      shared memory between processes of one machine)
#   ctrain DDP tcp     the same with CTRAIN_TRANSPORT=tcp (127.0.0.1)
#                      (ctrain's DDP buckets: --bucket_kb K, default 25600 = DDP's usual 25 MiB)
#   PyTorch DDP        torch_ddp.py, DistributedDataParallel over gloo, 2 processes x 1
#                      thread started by ctrain launch, Debian's torch (/usr/bin/python3)
#   Accelerate         accelerate_gpt.py, Accelerator(cpu=True), 2 processes x 1 thread:
#                      ctrain launch starts the 2 ranks, each runs `accelerate launch --cpu
#                      --num_processes 2` with ctrain launch's rendezvous (Accelerate's own
#                      launcher starts one process for --cpu, and torchrun in Debian's
#                      torch 1.13 fails under Python 3.11; see accelerate_gpt.py)
# Accelerate comes from a venv, build/bench/ddp/venv, made here on first use with
# --system-site-packages over $PYTHON or /usr/bin/python3 (so it imports Debian's torch)
# and `pip install --no-deps accelerate==0.24.1` plus its other requirements (never
# torch; the script checks that the venv still imports the system's torch). Override the
# version with ACCELERATE_SPEC; --no-install skips the install. When accelerate cannot be
# installed or imported, its row says why and the rest of the run goes on.
#
# OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = threads per process everywhere; the Python
# runs with OMP_WAIT_POLICY=PASSIVE (PyTorch's best here, bench/gpt_cpu), ctrain with
# OMP_WAIT_POLICY unset (its best). W1 steps: 3 warm-up + 20 timed, median step; each
# configuration runs twice, interleaved (all six, then all six again), and keeps its best;
# --quick: 1 + 2 steps, once (a smoke test, not a measurement). tokens/s counts all
# processes: 2 x 8 x 256 tokens per step for the 2-process runs.
#
# Every run is bounded by --timeout seconds (default 600, 180 with --quick), ctrain's
# collectives by CTRAIN_TIMEOUT (60 unless set); gloo talks over loopback
# (GLOO_SOCKET_IFNAME=lo unless set). Interrupted or timed out, the run stops its ranks,
# and every rank dies with its launcher. Prints a markdown table (also written to FILE
# with --out); exits non-zero when a run other than Accelerate's fails or a first-step
# loss is not close to ln 256. Logs: build/bench/ddp/logs/.
# shellcheck source=bench/run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../run_lib.sh"

quick=0
out=""
limit=""
install=1
bucket_kb=25600
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; limit=$2; shift ;;
    --no-install) install=0 ;;
    --bucket_kb) [ $# -ge 2 ] || die "--bucket_kb needs a size in KiB"; bucket_kb=$2; shift ;;
    -h | --help) sed -n '2,42p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
[ -n "$limit" ] || limit=$([ "$quick" = 1 ] && echo 180 || echo 600)
[[ "$limit" =~ ^[1-9][0-9]*$ ]] || die "--timeout: '$limit' is not a positive number of seconds"
case "$out" in "" | /*) ;; *) out=$start_dir/$out ;; esac # relative to where it was called from
[ -z "$out" ] || { mkdir -p "$(dirname "$out")" && : >"$out"; } || die "cannot write --out $out"

if [ "$quick" = 1 ]; then
    reps=1
    steps=(--warmup 1 --steps 2)
else
    reps=2
    steps=(--warmup 3 --steps 20)
fi

# ---- tools ----------------------------------------------------------------------------
for t in make timeout; do command -v "$t" >/dev/null 2>&1 || die "'$t' not found"; done
py=${PYTHON:-/usr/bin/python3}
[ -x "$py" ] || command -v "$py" >/dev/null 2>&1 || die "no Python at $py (install python3-torch, or set \$PYTHON)"
torch_version=$("$py" -c 'import sys, torch, torch.distributed as d
sys.exit(3) if not (d.is_available() and d.is_gloo_available()) else sys.stdout.write(torch.__version__)' 2>/dev/null) ||
    die "$py cannot import torch with gloo (install python3-torch, or set \$PYTHON to an interpreter that has it)"

# ---- build ----------------------------------------------------------------------------
ctrain=build/bin/ctrain
cpu_bin=build/bench/gpt_cpu/gpt_cpu
ddp_bin=build/bench/ddp/gpt_ddp
echo "run.sh: building $ctrain, $cpu_bin and $ddp_bin" >&2
make -s "$ctrain" "$cpu_bin" "$ddp_bin" >&2 || die "make $ctrain $cpu_bin $ddp_bin failed"
for b in "$ctrain" "$cpu_bin" "$ddp_bin"; do [ -x "$b" ] || die "$b was not built"; done

logs=build/bench/ddp/logs
rm -rf "$logs"
mkdir -p "$logs"
results=$logs/results.tsv
: >"$results"

# ---- Accelerate -----------------------------------------------------------------------
# Sets acc_bin (the venv's accelerate command) or acc_why (why there is none).
venv=build/bench/ddp/venv
vpy=$venv/bin/python3
acc_spec=${ACCELERATE_SPEC:-accelerate==0.24.1}
acc_bin=""
acc_why=""
acc_probe() { # the venv imports accelerate and the same torch as $py
    local v
    v=$("$vpy" -c 'import sys, torch, accelerate; sys.stdout.write(torch.__version__ + " " + accelerate.__version__)' \
        2>>"$logs/accelerate-install.log") || return 1
    [ "${v%% *}" = "$torch_version" ] || { echo "the venv imports torch ${v%% *}, not $torch_version" >>"$logs/accelerate-install.log"; return 1; }
    acc_version=${v#* }
}
acc_install() {
    echo "run.sh: installing $acc_spec into $venv (log: $logs/accelerate-install.log)" >&2
    {
        [ -x "$vpy" ] || timeout 300 "$py" -m venv --system-site-packages "$venv" || return 1
        # --no-deps: pip must not replace the system's torch with a new one from PyPI
        timeout 600 "$vpy" -m pip install --no-deps "$acc_spec" || return 1
        timeout 600 "$vpy" -m pip install numpy packaging psutil pyyaml "huggingface_hub<0.20" || return 1
    } >>"$logs/accelerate-install.log" 2>&1
}
: >"$logs/accelerate-install.log"
if acc_probe; then
    acc_bin=$venv/bin/accelerate
elif [ "$install" = 0 ]; then
    acc_why="accelerate is not installed in $venv (--no-install)"
elif ! acc_install; then
    acc_why="installing $acc_spec into $venv failed: $(grep -v '^ ' "$logs/accelerate-install.log" | tail -n 1)"
elif ! acc_probe; then
    acc_why="after installing $acc_spec, $vpy cannot import accelerate with torch $torch_version: $(tail -n 1 "$logs/accelerate-install.log")"
else
    acc_bin=$venv/bin/accelerate
fi
if [ -n "$acc_bin" ]; then
    echo "run.sh: Accelerate $acc_version via $acc_bin (torch $torch_version)" >&2
else
    echo "run.sh: no Accelerate column: $acc_why" >&2
fi

# ---- one bounded run -------------------------------------------------------------------
# bounded NAME OPTIONAL(0|1) CMD... ; stdout/stderr in $logs/NAME.{out,err}; the last JSON
# line (launcher prefix removed) appended to $results as "NAME\tJSON". An optional run
# that fails records "NAME\t{"failed": reason}" instead of ending the script.
bounded() {
    local name=$1 optional=$2
    shift 2
    run_logged "$name" "$@"
    local why=""
    if [ "$rc" -ne 0 ]; then
        why="exit status $rc"
        [ "$rc" -eq 124 ] && why="timed out after $limit s (--timeout)"
    fi
    local line=""
    [ -n "$why" ] || line=$(sed -n -e 's/^\[rank0\] //' -e '/^{.*}$/p' "$logs/$name.out" | tail -n 1)
    [ -n "$why" ] || [ -n "$line" ] || why="no JSON line (see $logs/$name.out)"
    if [ -n "$why" ]; then
        [ "$optional" = 1 ] || die "$name failed: $why (logs in $logs)"
        line=$("$py" -c 'import json, sys; print(json.dumps({"failed": sys.argv[1]}))' "$why")
    fi
    printf '%s\t%s\n' "${name%-[0-9]}" "$line" >>"$results"
    echo "run.sh: $name: $line" >&2
}

export CTRAIN_TIMEOUT=${CTRAIN_TIMEOUT:-60}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
launch=("$ctrain" launch --num_processes 2 --main_process_port 0 --num_cpu_threads_per_process 1)
# env(1) takes its -u options before the assignments
ctrain_env() { echo "-u OMP_WAIT_POLICY -u CTRAIN_TRANSPORT OPENBLAS_NUM_THREADS=$1 OMP_NUM_THREADS=$1"; }
py_env="-u CTRAIN_TRANSPORT OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1"
# each rank: accelerate launch with the rendezvous ctrain launch set for it
# shellcheck disable=SC2016 # expanded by each rank's sh, not here
acc_rank='exec "$0" launch --cpu --num_processes "$WORLD_SIZE" --num_machines 1 --mixed_precision no \
    --dynamo_backend no --num_cpu_threads_per_process 1 --main_process_ip "$MASTER_ADDR" \
    --main_process_port "$MASTER_PORT" "$@"'

for r in $(seq 1 "$reps"); do
    # shellcheck disable=SC2046
    bounded "ctrain-1x1-$r" 0 env $(ctrain_env 1) "$cpu_bin" --config w1 --threads 1 "${steps[@]}"
    # shellcheck disable=SC2046
    bounded "ctrain-1x2-$r" 0 env $(ctrain_env 2) "$cpu_bin" --config w1 --threads 2 "${steps[@]}"
    # shellcheck disable=SC2046
    bounded "ctrain-ddp-shm-$r" 0 env $(ctrain_env 1) "${launch[@]}" "$ddp_bin" "${steps[@]}" --bucket_kb "$bucket_kb"
    # shellcheck disable=SC2046
    bounded "ctrain-ddp-tcp-$r" 0 env $(ctrain_env 1) CTRAIN_TRANSPORT=tcp "${launch[@]}" "$ddp_bin" "${steps[@]}" --bucket_kb "$bucket_kb"
    # shellcheck disable=SC2086
    bounded "torch-ddp-$r" 0 env $py_env "${launch[@]}" "$py" bench/ddp/torch_ddp.py "${steps[@]}" \
        --timeout "$CTRAIN_TIMEOUT"
    if [ -n "$acc_bin" ]; then
        # shellcheck disable=SC2086
        bounded "accelerate-$r" 1 env $py_env "${launch[@]}" sh -c "$acc_rank" "$acc_bin" \
            bench/ddp/accelerate_gpt.py "${steps[@]}"
    fi
done

# ---- report ----------------------------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
ctrain_version=$("$ctrain" --version 2>/dev/null | head -n 1) || ctrain_version="ctrain (version unknown)"
report=$logs/table.md
"$py" - "$results" "$quick" "${cpu:-unknown CPU}" "$(nproc)" "$ctrain_version" "$torch_version" \
    "${acc_version:-}" "$acc_why" >"$report" <<'EOF' || die "the report failed (loss check or parsing; see above)"
import json, math, sys

path, quick, cpu, ncpu, ctrain_v, torch_v, acc_v, acc_why = sys.argv[1:9]
best, failed = {}, {}
with open(path) as f:
    for line in f:
        name, js = line.rstrip("\n").split("\t", 1)
        d = json.loads(js)
        if "failed" in d:
            failed.setdefault(name, d["failed"])
            continue
        if abs(d["loss0"] - math.log(256)) > 0.5:
            print(f"run.sh: loss0 {d['loss0']} of {name} is not near ln 256 = {math.log(256):.3f}", file=sys.stderr)
            sys.exit(1)
        if name not in best or d["tokens_per_s"] > best[name]["tokens_per_s"]:
            best[name] = d

rows = [("ctrain-1x1", "ctrain, 1 process", "1 x 1"), ("ctrain-1x2", "ctrain, 1 process", "1 x 2"),
        ("ctrain-ddp-shm", "ctrain DDP (Accelerator), shm", "2 x 1"),
        ("ctrain-ddp-tcp", "ctrain DDP (Accelerator), tcp", "2 x 1"),
        ("torch-ddp", f"PyTorch DDP (gloo), torch {torch_v}", "2 x 1"),
        ("accelerate", f"HF Accelerate {acc_v or ''} (gloo), torch {torch_v}".replace("  ", " "), "2 x 1")]

def num(d, k, nd):
    v = d.get(k)
    return "-" if v is None else f"{v:.{nd}f}"

def pct(d, k):
    v = d.get(k)
    return "-" if v is None else f"{100 * v:.0f}%"

print(f"GPT W1 training, {ncpu} CPUs ({cpu}); {ctrain_v}")
print("method: " + ("--quick (1 warm-up + 2 timed steps, one run: a smoke test, not a measurement)" if quick == "1"
      else "3 warm-up + 20 timed steps, median step (the slowest rank's), best of 2 interleaved runs")
      + "; tokens/s over all processes (2 x 8 x 256 tokens per step with 2 processes)")
if acc_why:
    print(f"HF Accelerate: not measured: {acc_why}")
print()
print("| configuration | processes x threads | tokens/s | step ms | DDP comm ms/step | exposed ms/step "
      "| exposed / comm | exposed / step | peak RSS MiB (rank 0) | loss0 |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for key, label, pxt in rows:
    d = best.get(key)
    if d is None:
        if key == "accelerate" and acc_why:
            continue
        why = failed.get(key, "no result")
        print(f"| {label} | {pxt} | n/a | n/a | - | - | - | - | - | {why} |")
        continue
    print(f"| {label} | {pxt} | {d['tokens_per_s']:.0f} | {d['step_ms']:.1f} | {num(d, 'comm_ms', 1)} "
          f"| {num(d, 'exposed_ms', 1)} | {pct(d, 'exposed_share')} | {pct(d, 'exposed_step_share')} "
          f"| {d['peak_rss_mb']:.0f} | {d['loss0']:.3f} |")

def ratio(a, b):
    if a in best and b in best:
        return best[a]["tokens_per_s"] / best[b]["tokens_per_s"]
    return None

print()
lines = []
for a, b, what, target in [("ctrain-ddp-shm", "torch-ddp", "ctrain DDP shm / PyTorch DDP", 1.3),
                           ("ctrain-ddp-tcp", "torch-ddp", "ctrain DDP tcp / PyTorch DDP", 1.3),
                           ("ctrain-ddp-shm", "ctrain-1x1", "ctrain DDP shm / ctrain 1 process 1 thread", 1.9),
                           ("ctrain-ddp-tcp", "ctrain-1x1", "ctrain DDP tcp / ctrain 1 process 1 thread", 1.9),
                           ("ctrain-ddp-shm", "ctrain-1x2", "ctrain DDP shm / ctrain 1 process 2 threads", None),
                           ("ctrain-ddp-shm", "accelerate", "ctrain DDP shm / HF Accelerate", None),
                           ("torch-ddp", "accelerate", "PyTorch DDP / HF Accelerate", None)]:
    v = ratio(a, b)
    if v is None:
        continue
    t = "" if target is None else f" (target >= {target}: {'met' if v >= target else 'not met'})"
    lines.append(f"- {what}: {v:.2f}{t}")
print("\n".join(lines))
EOF
cat "$report"
[ -z "$out" ] || cp "$report" "$out"
echo "run.sh: logs in $logs" >&2
