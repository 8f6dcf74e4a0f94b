#!/usr/bin/env bash
# Allreduce (sum, f32) bus bandwidth on 2 ranks of this machine: ctrain beside OpenMPI
# and gloo, in one run.
#
#   bench/collectives/run.sh [--quick] [--out FILE] [--sizes "1024 4096 ..."] [--timeout S]
#                            [--rounds N]
#
# For each message size (default 1 KiB, 4 KiB, ..., 64 MiB in steps of 4x) it measures
#   - ctrain shm       allreduce.c, ct_pg transport "shm", 2 ranks via ctrain launch
#   - ctrain tcp       allreduce.c, transport "tcp" (over 127.0.0.1)
#   - OpenMPI shm      allreduce_mpi.c (built here with mpicc), MPI_Allreduce under
#                      mpirun -np 2 --mca pml ob1 --mca btl self,vader
#   - OpenMPI tcp      the same with --mca btl self,tcp
#   - gloo             allreduce_gloo.py, torch.distributed "gloo" (env://) on 2 ranks
#                      via ctrain launch, with Debian's torch (/usr/bin/python3)
# ctrain launch runs its ranks with --num_cpu_threads_per_process 1; mpirun binds its
# two ranks to a core each (its default). Every program follows the same method: per
# size a correctness check, warm-up calls, then at least 0.2 s and 5 calls each
# timed alone, the median per call (the slowest rank's); busbw = bytes / time * 2(n-1)/n
# in GB/s (nccl-tests' definition; with n = 2 it equals algbw). The whole sweep runs
# --rounds times (default 3), each round every implementation once; the tables give
# each implementation's best round, and its slowest beside it.
# --quick: 1 KiB, 64 KiB and 1 MiB, 0.02 s per size, one round (a smoke test, not a
# measurement).
#
# Needs: make and the library's build tools, mpicc and mpirun (Debian: openmpi-bin,
# libopenmpi-dev; tools/setup.sh installs them), and $PYTHON or /usr/bin/python3 with
# torch and gloo (python3-torch). A missing one stops the run before anything is
# measured. Each run is bounded by --timeout seconds (default 600, 120 with --quick),
# ctrain's collectives by CTRAIN_TIMEOUT (60 unless set); gloo talks over loopback
# (GLOO_SOCKET_IFNAME=lo unless set). Interrupted or timed out, the run stops its
# ranks (and every rank dies with its launcher).
#
# Prints a markdown table (also written to FILE with --out). When ctrain's "shm"
# transport cannot be created, its column says n/a and a line gives the error; every
# other failure ends the run with a message. Logs: build/bench/collectives/logs/.
# shellcheck source=bench/run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../run_lib.sh"

quick=0
rounds=""
out=""
sizes=""
limit=""
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift ;;
    --sizes) [ $# -ge 2 ] || die "--sizes needs a list of byte counts, e.g. \"1024 65536\""; sizes=$2; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; limit=$2; shift ;;
    --rounds) [ $# -ge 2 ] || die "--rounds needs a count"; rounds=$2; shift ;;
    -h | --help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
if [ -z "$sizes" ]; then
    if [ "$quick" = 1 ]; then sizes="1024 65536 1048576"; else
        sizes="1024 4096 16384 65536 262144 1048576 4194304 16777216 67108864"
    fi
fi
for s in $sizes; do
    if ! [[ "$s" =~ ^[1-9][0-9]*$ ]] || [ $((s % 4)) -ne 0 ]; then
        die "--sizes: '$s' is not a positive multiple of 4 bytes"
    fi
done
read -r -a size_list <<<"$sizes"
size_csv=$(IFS=,; echo "${size_list[*]}")
[ -n "$rounds" ] || rounds=$([ "$quick" = 1 ] && echo 1 || echo 3)
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds: '$rounds' is not a positive count"
[ -n "$limit" ] || limit=$([ "$quick" = 1 ] && echo 120 || echo 600)
[[ "$limit" =~ ^[1-9][0-9]*$ ]] || die "--timeout: '$limit' is not a positive number of seconds"
case "$out" in "" | /*) ;; *) out=$start_dir/$out ;; esac # relative to where it was called from
[ -z "$out" ] || { mkdir -p "$(dirname "$out")" && : >"$out"; } || die "cannot write --out $out"

if [ "$quick" = 1 ]; then
    method=(--min-time 0.02 --min-iters 5 --warmup 2)
else
    method=(--min-time 0.2 --min-iters 5 --warmup 5)
fi

# ---- tools ----------------------------------------------------------------------------
for t in make timeout mpicc mpirun; do
    hint=""
    [ "${t#mpi}" = "$t" ] || hint="; install openmpi-bin and libopenmpi-dev (tools/setup.sh does)"
    command -v "$t" >/dev/null 2>&1 || die "'$t' not found$hint"
done
py=${PYTHON:-/usr/bin/python3}
[ -x "$py" ] || command -v "$py" >/dev/null 2>&1 || die "no Python at $py (install python3-torch, or set \$PYTHON)"
torch_version=$("$py" -c 'import sys, torch, torch.distributed as d
sys.exit(3) if not (d.is_available() and d.is_gloo_available()) else sys.stdout.write(torch.__version__)' 2>/dev/null) ||
    die "$py cannot import torch with gloo (install python3-torch, or set \$PYTHON to an interpreter that has it)"
mpi_version=$(mpirun --version 2>/dev/null | head -n 1) || die "mpirun --version failed"
case "$mpi_version" in *"Open MPI"*) ;; *) die "mpirun is not Open MPI ('$mpi_version'); this script passes Open MPI's --mca options" ;; esac

# ---- build ----------------------------------------------------------------------------
ctrain=build/bin/ctrain
bin=build/bench/collectives/allreduce
mpibin=build/bench/collectives/allreduce_mpi-openmpi # built with mpicc, not by the Makefile
echo "run.sh: building $ctrain, $bin and $mpibin" >&2
make -s "$ctrain" "$bin" >&2 || die "make $ctrain $bin failed"
for b in "$ctrain" "$bin"; do [ -x "$b" ] || die "$b was not built"; done
mkdir -p "$(dirname "$mpibin")"
mpicc -std=c11 -D_GNU_SOURCE -O3 -march=native -Wall -Wextra -Werror -I. \
    -o "$mpibin" bench/collectives/allreduce_mpi.c -lm >&2 || die "mpicc bench/collectives/allreduce_mpi.c failed"

logs=build/bench/collectives/logs
rm -rf "$logs"
mkdir -p "$logs"
results=$logs/results.jsonl
: >"$results"

# ---- one bounded run -------------------------------------------------------------------
# bounded NAME CMD... ; stdout/stderr in $logs/NAME.{out,err}; rank 0's JSON lines
# (launcher prefix removed) appended to $results
bounded() {
    local name=$1
    run_logged "$@"
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && die "$name: timed out after $limit s (--timeout; logs in $logs)"
        die "$name failed (exit status $rc; logs in $logs)"
    fi
    local lines
    lines=$(sed -n -e 's/^\[rank0\] //' -e '/^{.*}$/p' "$logs/$name.out")
    [ -n "$lines" ] || die "$name: no JSON line from rank 0 (see $logs/$name.out)"
    printf '%s\n' "$lines" >>"$results"
    printf '%s\n' "$lines" | sed "s/^/run.sh: $name: /" >&2
}

launch=("$ctrain" launch --num_processes 2 --main_process_port 0 --num_cpu_threads_per_process 1)
export CTRAIN_TIMEOUT=${CTRAIN_TIMEOUT:-60}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
mpirun_args=(-np 2 --oversubscribe --mca pml ob1)
[ "$(id -u)" -ne 0 ] || mpirun_args+=(--allow-run-as-root)

# Rounds interleave the implementations, so that a slow spell of this shared machine
# (seen here: every shared-memory transfer 3-4x slower for a few seconds, OpenMPI's as
# much as ctrain's) hits each of them in some round rather than one of them in all.
for r in $(seq 1 "$rounds"); do
    bounded ctrain-shm-r$r "${launch[@]}" "$bin" --transport shm --unavailable-ok --sizes "$size_csv" "${method[@]}"
    bounded ctrain-tcp-r$r "${launch[@]}" "$bin" --transport tcp --sizes "$size_csv" "${method[@]}"
    bounded openmpi-shm-r$r mpirun "${mpirun_args[@]}" --mca btl self,vader \
        "$mpibin" --label openmpi-shm --sizes "$size_csv" "${method[@]}"
    bounded openmpi-tcp-r$r mpirun "${mpirun_args[@]}" --mca btl self,tcp \
        "$mpibin" --label openmpi-tcp --sizes "$size_csv" "${method[@]}"
    bounded gloo-r$r "${launch[@]}" "$py" bench/collectives/allreduce_gloo.py --sizes "$size_csv" "${method[@]}" \
        --timeout "$CTRAIN_TIMEOUT"
done

# ---- report ----------------------------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
ctrain_version=$("$ctrain" --version 2>/dev/null | head -n 1) || ctrain_version="ctrain (version unknown)"
report=$logs/table.md
"$py" - "$results" "$size_csv" "$quick" "${cpu:-unknown CPU}" "$(nproc)" "$ctrain_version" "$mpi_version" \
    "$torch_version" "$rounds" >"$report" <<'EOF' || die "the report failed (see above)"
import json, sys

path, size_csv, quick, cpu, ncpu, ctrain_v, mpi_v, torch_v, rounds = sys.argv[1:10]
sizes = [int(s) for s in size_csv.split(",")]
impls = ["ctrain-shm", "ctrain-tcp", "openmpi-shm", "openmpi-tcp", "gloo"]
res, worst, unavailable = {}, {}, {}
with open(path) as f:
    for line in f:
        d = json.loads(line)
        if "unavailable" in d:
            unavailable[d["impl"]] = d["unavailable"]
            continue
        k = (d["impl"], d["bytes"])  # the best round is reported, the slowest kept for its own table
        if k not in res or d["median_us"] < res[k]["median_us"]:
            res[k] = d
        if k not in worst or d["median_us"] > worst[k]["median_us"]:
            worst[k] = d
missing = [f"{i} at {b} bytes" for i in impls if i not in unavailable for b in sizes if (i, b) not in res]
if missing:
    print("run.sh: no result for " + ", ".join(missing), file=sys.stderr)
    sys.exit(1)

def size_name(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"

def bw(i, b):
    return "n/a" if i in unavailable else f"{res[(i, b)]['busbw_gbs']:.3f}"

def ratio(i, j, b):
    if i in unavailable or j in unavailable:
        return "n/a"
    return f"{res[(i, b)]['busbw_gbs'] / res[(j, b)]['busbw_gbs']:.2f}"

print(f"allreduce sum f32, 2 ranks on this machine ({ncpu} CPUs, {cpu}); {ctrain_v}, {mpi_v}, torch {torch_v} (gloo)")
print("method: " + ("--quick (smoke test, not a measurement)" if quick == "1" else
      "per size 5 warm-up calls, then >= 0.2 s and >= 5 calls each timed alone; median per call of the slowest rank")
      + f"; the best of {rounds} rounds (each round runs every implementation once)"
      + "; busbw = bytes / time * 2(n-1)/n, GB/s = 1e9 B/s")
for i, e in unavailable.items():
    print(f"{i.replace('-', ' ')} unavailable: {e}")
print()
print("| size | ctrain shm busbw | ctrain tcp busbw | OpenMPI shm busbw | OpenMPI tcp busbw | gloo busbw "
      "| ctrain shm / OpenMPI shm | ctrain shm / gloo |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for b in sizes:
    print(f"| {size_name(b)} | " + " | ".join(bw(i, b) for i in impls)
          + f" | {ratio('ctrain-shm', 'openmpi-shm', b)} | {ratio('ctrain-shm', 'gloo', b)} |")
print()
print("median time per call, us (timed calls per size in parentheses):")
print()
print("| size | ctrain shm | ctrain tcp | OpenMPI shm | OpenMPI tcp | gloo |")
print("|---|---:|---:|---:|---:|---:|")
for b in sizes:
    cells = ["n/a" if i in unavailable else f"{res[(i, b)]['median_us']:.1f} ({res[(i, b)]['iters']})" for i in impls]
    print(f"| {size_name(b)} | " + " | ".join(cells) + " |")
if int(rounds) > 1:
    print()
    print("median time per call, us, in the best and the slowest round (the machine's noise):")
    print()
    print("| size | ctrain shm best / slowest | OpenMPI shm best / slowest | gloo best / slowest |")
    print("|---|---:|---:|---:|")
    for b in sizes:
        cells = ["n/a" if i in unavailable else f"{res[(i, b)]['median_us']:.1f} / {worst[(i, b)]['median_us']:.1f}"
                 for i in ("ctrain-shm", "openmpi-shm", "gloo")]
        print(f"| {size_name(b)} | " + " | ".join(cells) + " |")
if "ctrain-shm" not in unavailable:
    big = [b for b in sizes if b >= 64 << 10]
    vs_mpi = [b for b in big if res[("ctrain-shm", b)]["busbw_gbs"] >= res[("openmpi-shm", b)]["busbw_gbs"]]
    vs_gloo = [b for b in sizes if res[("ctrain-shm", b)]["busbw_gbs"] >= 3 * res[("gloo", b)]["busbw_gbs"]]
    print()
    print(f"targets: ctrain shm >= OpenMPI shm from 64 KiB up: {len(vs_mpi)} of {len(big)} sizes; "
          f"ctrain shm >= 3x gloo: {len(vs_gloo)} of {len(sizes)} sizes")
EOF
cat "$report"
[ -z "$out" ] || cp "$report" "$out"
echo "run.sh: logs in $logs" >&2
