#!/usr/bin/env bash
# Checkpoint save / load throughput on GPT-2 124M with AdamW: ctrain's
# ct_accelerator_save_state / ct_accelerator_load_state beside HF Accelerate's
# save_state / load_state, and the disk's own sequential rates, measured in one run on
# the same file system.
#
#   bench/checkpoint/run.sh [--quick] [--reps R] [--passes P] [--work DIR] [--dd_mb N]
#                           [--out FILE] [--timeout S] [--no-install] [--no-deepspeed]
#
# Each pass runs, in this order (--passes, default 2; the figures are medians over the
# rounds of every pass, so a slow spell of the disk is seen by all of them):
#   dd             the disk (below), before every program, and once more at the end
#   ctrain 1 proc  build/bench/checkpoint/checkpoint (checkpoint.c), one process, ctrain's
#                  default threads, then the same with --threads 1 (the load's copies run
#                  in OpenMP regions, which stall when another program holds a core)
#   ctrain ZeRO-2  the same under `ctrain launch --num_processes 2 --use_deepspeed
#                  --zero_stage 2 --num_cpu_threads_per_process 1`
#   accelerate 1   accelerate_state.py, one process (Accelerator(cpu=True)), torch's
#                  default threads
#   accelerate 2   accelerate_state.py under `torchrun --standalone --nproc_per_node 2`
#                  (one thread each): DeepSpeed ZeRO-2 through Accelerate's plugin when
#                  DeepSpeed is installed, else DDP (the table says which)
# each program with R rounds (--reps, default 5) of save, load from disk, load from the
# page cache (the programs' headers say exactly what each time covers); right after each
# load from disk the program reads the same files raw from the device (plain read(2)
# calls), and the table sets the load against that read too: on a shared disk whose
# rate moves from second to second, the same bytes moments apart are a fairer ceiling.
#
# The disk: `dd if=SRC of=FILE bs=1M conv=fsync` (sequential write, to stable storage),
# then `dd if=FILE iflag=nocache count=0` (drops FILE from the page cache, as the programs
# drop their checkpoints: posix_fadvise DONTNEED on that file alone, the rest of the
# machine's cache untouched) and `dd if=FILE of=/dev/null bs=1M` (sequential read from
# the device), then the same read again (from the page cache). SRC is --dd_mb MiB
# (default 1500, about the size of a checkpoint) of /dev/urandom written once per run and
# kept cached: a VM's disk may store zeros faster than data (here /dev/zero wrote at about
# twice the rate), and a checkpoint is not zeros.
#
# The checkpoints and dd's files go to a fresh folder under --work DIR (default
# build/bench/checkpoint/work), removed at the end: to measure another file system, give
# a folder on it.
#
# Python: a venv at build/bench/checkpoint/venv, created on the first run from
# ${PYTHON:-/usr/bin/python3} (its own site-packages, not the system's torch), with
# torch 2.x, Accelerate 1.x and transformers from PyPI (TORCH_SPEC, ACCELERATE_SPEC,
# TRANSFORMERS_SPEC override the requirements; PyPI's Linux torch wheel pulls in the
# CUDA libraries: about 6 GB), and DeepSpeed (DEEPSPEED_SPEC; built against that torch
# with --no-build-isolation; --no-deepspeed leaves it out). Later runs reuse the venv;
# --no-install never installs (rows that need a missing package say so).
#
# Every program run is bounded by --timeout seconds (default 900, 300 with --quick).
# Output: a markdown table on stdout (also written to FILE with --out). Exits non-zero
# when a ctrain run fails; a failed Accelerate run is a row saying why.
# Logs: build/bench/checkpoint/logs/.
# shellcheck source=bench/run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../run_lib.sh"

quick=0
reps=""
passes=""
work=build/bench/checkpoint/work
dd_mb=1500
out=""
limit=""
install=1
use_ds=1
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --reps) [ $# -ge 2 ] || die "--reps needs a number"; reps=$2; shift ;;
    --passes) [ $# -ge 2 ] || die "--passes needs a number"; passes=$2; shift ;;
    --work) [ $# -ge 2 ] || die "--work needs a folder"; work=$2; shift ;;
    --dd_mb) [ $# -ge 2 ] || die "--dd_mb needs a size in MiB"; dd_mb=$2; shift ;;
    --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; limit=$2; shift ;;
    --no-install) install=0 ;;
    --no-deepspeed) use_ds=0 ;;
    -h | --help) sed -n '2,53p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
[ -n "$reps" ] || reps=$([ "$quick" = 1 ] && echo 1 || echo 5)
[ -n "$passes" ] || passes=$([ "$quick" = 1 ] && echo 1 || echo 2)
[ -n "$limit" ] || limit=$([ "$quick" = 1 ] && echo 300 || echo 900)
for v in reps passes limit dd_mb; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$v: '${!v}' is not a positive number"
done
[ "$reps" -le 100 ] || die "--reps: at most 100"
case "$out" in "" | /*) ;; *) out=$start_dir/$out ;; esac # relative to where it was called from
case "$work" in /*) ;; *) [ "$work" = build/bench/checkpoint/work ] || work=$start_dir/$work ;; esac
[ -z "$out" ] || { mkdir -p "$(dirname "$out")" && : >"$out"; } || die "cannot write --out $out"

# ---- tools --------------------------------------------------------------------------------
for t in make timeout dd head findmnt; do command -v "$t" >/dev/null 2>&1 || die "'$t' not found"; done
py=${PYTHON:-/usr/bin/python3}
command -v "$py" >/dev/null 2>&1 || die "no Python at $py (install python3 and python3-venv, or set \$PYTHON)"

dir=build/bench/checkpoint
logs=$dir/logs
rm -rf "$logs"
mkdir -p "$logs"
results=$logs/results.tsv
: >"$results"

# ---- build --------------------------------------------------------------------------------
ctrain=build/bin/ctrain
bin=$dir/checkpoint
echo "run.sh: building $ctrain and $bin" >&2
make -s "$ctrain" "$bin" >&2 || die "make $ctrain $bin failed"
for b in "$ctrain" "$bin"; do [ -x "$b" ] || die "$b was not built"; done

# ---- Python: torch 2.x, Accelerate 1.x, transformers, DeepSpeed -------------------------
# Sets acc_ok (1 when the venv has the three) or acc_why; ds_ok or ds_why.
venv=$dir/venv
vpy=$venv/bin/python3
torch_spec=${TORCH_SPEC:-torch>=2,<3}
acc_spec=${ACCELERATE_SPEC:-accelerate>=1,<2}
tf_spec=${TRANSFORMERS_SPEC:-transformers}
ds_spec=${DEEPSPEED_SPEC:-deepspeed}
ilog=$logs/install.log
: >"$ilog"
acc_probe() {
    versions=$("$vpy" -c 'import sys, torch, accelerate, transformers
t, a = torch.__version__, accelerate.__version__
sys.exit(3) if int(t.split(".")[0]) < 2 or int(a.split(".")[0]) < 1 else print(t, a, transformers.__version__)' \
        2>>"$ilog")
}
ds_probe() { ds_version=$("$vpy" -c 'import deepspeed; print(deepspeed.__version__)' 2>>"$ilog" | tail -n 1); }
acc_ok=0 acc_why="" ds_ok=0 ds_why=""
if acc_probe; then
    acc_ok=1
elif [ "$install" = 0 ]; then
    acc_why="torch 2.x, Accelerate 1.x and transformers are not in $venv (--no-install)"
else
    echo "run.sh: installing $torch_spec, $acc_spec, $tf_spec into $venv (log: $ilog; a few minutes)" >&2
    if { [ -x "$vpy" ] || timeout 300 "$py" -m venv "$venv"; } >>"$ilog" 2>&1 &&
        timeout 1800 "$vpy" -m pip install "$torch_spec" "$acc_spec" "$tf_spec" >>"$ilog" 2>&1 && acc_probe; then
        acc_ok=1
    else
        acc_why="installing $torch_spec, $acc_spec, $tf_spec into $venv failed: $(grep -v '^ ' "$ilog" | tail -n 1)"
    fi
fi
if [ "$acc_ok" = 1 ]; then
    read -r torch_version acc_version tf_version <<<"$versions"
    if [ "$use_ds" = 0 ]; then
        ds_why="--no-deepspeed"
    elif ds_probe; then
        ds_ok=1
    elif [ "$install" = 0 ]; then
        ds_why="DeepSpeed is not in $venv (--no-install)"
    else
        echo "run.sh: installing $ds_spec into $venv (log: $ilog)" >&2
        # DeepSpeed's setup.py imports torch: build it against the venv's
        if timeout 900 "$vpy" -m pip install --no-build-isolation "$ds_spec" >>"$ilog" 2>&1 && ds_probe; then
            ds_ok=1
        else
            ds_why="installing $ds_spec failed: $(grep -v '^ ' "$ilog" | tail -n 1)"
        fi
    fi
    echo "run.sh: torch $torch_version, Accelerate $acc_version, transformers $tf_version, DeepSpeed" \
        "${ds_version:-none ($ds_why)}" >&2
else
    echo "run.sh: no Accelerate rows: $acc_why" >&2
fi

# ---- the folder measured -------------------------------------------------------------------
mkdir -p "$work" || die "cannot make --work $work"
ckdir=$(mktemp -d "$work/run.XXXXXX") || die "cannot make a folder under $work"
trap 'stop_job; rm -rf "$ckdir"' EXIT
fs=$(findmnt -no FSTYPE,SOURCE,OPTIONS -T "$ckdir" | head -n 1)
src=$ckdir/dd-src.bin
echo "run.sh: measuring in $ckdir ($fs); writing $dd_mb MiB of random data for dd" >&2
{ head -c $((dd_mb * 1048576)) /dev/urandom >"$src" && sync "$src"; } || die "cannot write $src"
# other programs on the machine share its cores and its disk: the table says how busy it was
load_start=$(cut -d ' ' -f 1-3 /proc/loadavg)

# ---- one bounded run ------------------------------------------------------------------------
# bounded NAME OPTIONAL(0|1) CMD...: as bench/ddp/run.sh's: the last JSON line of its stdout
# (launcher prefix removed) appended to $results as "NAME\tJSON"; an optional run that
# fails records {"failed": reason} instead of ending the script.
bounded() {
    local name=$1 optional=$2
    shift 2
    run_logged "$name" "$@"
    local why=""
    if [ "$rc" -ne 0 ]; then
        why="exit status $rc"
        [ "$rc" -eq 124 ] && why="timed out after $limit s (--timeout)"
        local msg
        msg=$(grep -m 1 -E '(checkpoint|accelerate_state)( \(rank [0-9]+\))?: ' "$logs/$name.err" | sed 's/^\[rank[0-9]*\] //' || true)
        [ -z "$msg" ] || why="$why: $msg"
    fi
    local line=""
    [ -n "$why" ] || line=$(sed -n -e 's/^\[rank0\] //' -e '/^{.*}$/p' "$logs/$name.out" | tail -n 1)
    [ -n "$why" ] || [ -n "$line" ] || why="no JSON line (see $logs/$name.out)"
    if [ -n "$why" ]; then
        [ "$optional" = 1 ] || die "$name failed: $why (logs in $logs)"
        line=$("$py" -c 'import json, sys; print(json.dumps({"failed": sys.argv[1]}))' "$why")
    fi
    printf '%s\t%s\n' "${name%-[0-9]*}" "$line" >>"$results"
    echo "run.sh: $name: $line" >&2
}

# dd_round NAME: the disk's write, cold read and cached read of $dd_mb MiB, one JSON line
# into $results as "dd\t{...}" (seconds from dd's own report).
dd_secs() { LC_ALL=C sed -n 's/^\([0-9]*\) bytes .* copied, \([0-9.e+-]*\) s, .*/\1 \2/p' "$1" | tail -n 1; }
dd_round() {
    local name=$1 f=$ckdir/dd.bin w r c
    rc=0
    {
        LC_ALL=C dd if="$src" of="$f" bs=1M conv=fsync 2>"$logs/$name.write" &&
            LC_ALL=C dd if="$f" iflag=nocache count=0 2>/dev/null &&
            LC_ALL=C dd if="$f" of=/dev/null bs=1M 2>"$logs/$name.read" &&
            LC_ALL=C dd if="$f" of=/dev/null bs=1M 2>"$logs/$name.cached"
    } || rc=$?
    rm -f "$f"
    sync -f "$ckdir"
    [ "$rc" -eq 0 ] || die "dd failed (see $logs/$name.*)"
    read -r bytes w <<<"$(dd_secs "$logs/$name.write")"
    read -r _ r <<<"$(dd_secs "$logs/$name.read")"
    read -r _ c <<<"$(dd_secs "$logs/$name.cached")"
    { [ -n "$w" ] && [ -n "$r" ] && [ -n "$c" ]; } || die "cannot read dd's times (see $logs/$name.*)"
    printf 'dd\t{"bytes":%s,"write_s":%s,"read_cold_s":%s,"read_warm_s":%s}\n' "$bytes" "$w" "$r" "$c" >>"$results"
    echo "run.sh: $name: $bytes bytes, write $w s, read $r s (from the device), $c s (cached)" >&2
}

export CTRAIN_TIMEOUT=${CTRAIN_TIMEOUT:-300}
run_args=(--dir "$ckdir" --reps "$reps")
ds_flag=()
[ "$ds_ok" = 1 ] && ds_flag=(--deepspeed)
for p in $(seq 1 "$passes"); do
    dd_round "dd-$p-a"
    bounded "ctrain-1-$p" 0 env -u OMP_WAIT_POLICY -u CTRAIN_TRANSPORT "$bin" "${run_args[@]}"
    bounded "ctrain-1t-$p" 0 env -u OMP_WAIT_POLICY -u CTRAIN_TRANSPORT "$bin" "${run_args[@]}" --threads 1
    dd_round "dd-$p-b"
    bounded "ctrain-zero2-$p" 0 env -u OMP_WAIT_POLICY -u CTRAIN_TRANSPORT OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        "$ctrain" launch --num_processes 2 --main_process_port 0 --num_cpu_threads_per_process 1 \
        --use_deepspeed --zero_stage 2 "$bin" "${run_args[@]}"
    if [ "$acc_ok" = 1 ]; then
        dd_round "dd-$p-c"
        bounded "accelerate-1-$p" 1 env -u OMP_NUM_THREADS "$vpy" bench/checkpoint/accelerate_state.py "${run_args[@]}"
        dd_round "dd-$p-d"
        bounded "accelerate-2-$p" 1 env OMP_NUM_THREADS=1 "$venv/bin/torchrun" --standalone --nproc_per_node 2 \
            bench/checkpoint/accelerate_state.py "${run_args[@]}" "${ds_flag[@]}"
    fi
done
dd_round "dd-end"

# ---- report -----------------------------------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
ctrain_version=$("$ctrain" --version 2>/dev/null | head -n 1) || ctrain_version="ctrain (version unknown)"
load_end=$(cut -d ' ' -f 1-3 /proc/loadavg)
report=$logs/table.md
"$py" - "$results" "$quick" "${cpu:-unknown CPU}" "$(nproc)" "$(uname -r)" "$ctrain_version" "$fs" "$reps" \
    "$passes" "$acc_why" "$ds_why" "$load_start" "$load_end" >"$report" <<'EOF' || die "the report failed (see above)"
import json, statistics, sys

path, quick, cpu, ncpu, kernel, ctrain_v, fs, reps, passes, acc_why, ds_why, load0, load1 = sys.argv[1:14]
runs, failed = {}, {}
for line in open(path):
    name, js = line.rstrip("\n").split("\t", 1)
    d = json.loads(js)
    if "failed" in d:
        failed.setdefault(name, d["failed"])
    else:
        runs.setdefault(name, []).append(d)

def merged(name):
    """One record per configuration: the medians over the rounds of every pass."""
    rs = runs.get(name)
    if not rs:
        return None
    d = dict(rs[-1])
    if name == "dd":
        for k in ("write_s", "read_cold_s", "read_warm_s"):
            d[k] = statistics.median(r[k] for r in rs)
            d[k + "_range"] = (min(r[k] for r in rs), max(r[k] for r in rs))
        d["rounds"] = len(rs)
        return d
    for k in ("save", "durable", "load_cold", "load_warm"):
        if k + "_all" in d:
            allv = [v for r in rs for v in r[k + "_all"]]
            d[k + "_s"] = statistics.median(allv)
            d[k + "_range"] = (min(allv), max(allv))
    d["durable_s"] = d.get("durable_s", d["save_s"])  # ctrain's save returns once on disk
    d["raw_over_load"] = statistics.median(v for r in rs for v in r["raw_over_load_all"])
    d["cold_resident"] = max(r["cold_resident"] for r in rs)
    d["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rs)
    d["resume"] = "exact" if all(r["resume"] == "exact" for r in rs) else \
        "differs (rel. %.2g)" % max(r["resume_rel_diff"] for r in rs)
    return d

MB = 1e6
disk = merged("dd")
w_rate = disk["bytes"] / disk["write_s"] / MB
r_rate = disk["bytes"] / disk["read_cold_s"] / MB
acc1 = merged("accelerate-1")
acc2 = merged("accelerate-2")
acc_v = (acc1 or acc2 or {}).get("accelerate", "")
torch_v = (acc1 or acc2 or {}).get("torch", "")
ds_v = (acc2 or {}).get("deepspeed")
two = f"DeepSpeed {ds_v} ZeRO-2" if ds_v else "DDP"
rows = [("ctrain-1", "ctrain, 1 process"),
        ("ctrain-1t", "ctrain, 1 process, 1 thread"),
        ("ctrain-zero2", "ctrain, 2 ranks ZeRO-2 (--use_deepspeed --zero_stage 2)"),
        ("accelerate-1", f"Accelerate {acc_v}, 1 process"),
        ("accelerate-2", f"Accelerate {acc_v}, 2 processes, {two}")]

print(f"Checkpoint save / load of GPT-2 124M + AdamW; {ncpu} CPUs ({cpu}), Linux {kernel}; {ctrain_v}")
print(f"file system: {fs}")
print(f"load average (1, 5, 15 min) at the start: {load0}; at the end: {load1}")
if acc_v:
    print(f"PyTorch side: torch {torch_v}, Accelerate {acc_v}, transformers {(acc1 or acc2)['transformers']}"
          + (f", DeepSpeed {ds_v}" if ds_v else f"; no DeepSpeed ({ds_why}): 2 processes are DDP"))
else:
    print(f"Accelerate: not measured: {acc_why}")
print("method: " + ("--quick (1 round, 1 pass: a smoke test, not a measurement)" if quick == "1" else
      f"median of {reps} rounds x {passes} passes per row (the slowest rank's time per round); "
      f"dd: median of {disk['rounds']} rounds taken between the programs"))
print()
print("| configuration | files | bytes | save s (returns) | save s (on disk) | save MB/s | save % of disk write "
      "| load s (from disk) | load MB/s | load % of disk read | load % of raw read, same files | "
      "load s (page cache) | peak RSS MiB (rank 0) | resume check |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for key, label in rows:
    d = merged(key)
    if d is None:
        if key.startswith("accelerate") and acc_why:
            continue
        print(f"| {label} | n/a | | | | | | | | | | | | {failed.get(key, 'no result').replace('|', '/')} |")
        continue
    b = d["bytes"]
    sr, lr = b / d["durable_s"] / MB, b / d["load_cold_s"] / MB
    print(f"| {label} | {d['files']} | {b:,} | {d['save_s']:.2f} | {d['durable_s']:.2f} | {sr:.0f} "
          f"| {100 * sr / w_rate:.0f}% | {d['load_cold_s']:.2f} | {lr:.0f} | {100 * lr / r_rate:.0f}% "
          f"| {100 * d['raw_over_load']:.0f}% | {d['load_warm_s']:.2f} | {d['peak_rss_mb']:.0f} | {d['resume']} |")
print(f"| disk: dd, 1 MiB blocks | 1 | {disk['bytes']:,} | - | {disk['write_s']:.2f} | {w_rate:.0f} | 100% "
      f"| {disk['read_cold_s']:.2f} | {r_rate:.0f} | 100% | - | {disk['read_warm_s']:.2f} | - | - |")
print()
print("save s (returns): until save_state returned; (on disk): until every file and the folder were "
      "fsynced (ctrain's save_state fsyncs before it returns: the two are the same call; Accelerate's does "
      "not: the time of an fsync of its files after it returned is added). save MB/s and % use the on-disk "
      "time. load from disk: the checkpoint's files dropped from the page cache first (posix_fadvise "
      "DONTNEED, per file); load from the page cache: the same load again, every file cached. load % of raw read: in "
      "every round, right after the load, the same files dropped again and read with plain 16 MiB read(2) "
      "calls; the load's rate as a share of that read's (median of the rounds): the device's rate for these "
      "bytes at that moment (the disk's rate moves too much for dd's median to be a fair ceiling; a cache "
      "below the VM can help whichever reads second, the raw read, so this share errs low). MB = 10^6 bytes.")
lo, hi = disk["write_s_range"]
rlo, rhi = disk["read_cold_s_range"]
print(f"- the disk moved during the run: dd write {disk['bytes'] / hi / MB:.0f}-{disk['bytes'] / lo / MB:.0f} MB/s, "
      f"read {disk['bytes'] / rhi / MB:.0f}-{disk['bytes'] / rlo / MB:.0f} MB/s over its {disk['rounds']} rounds")
for key, label in rows:
    d = merged(key)
    if d and d["cold_resident"] > 0.01:
        print(f"- {label}: up to {100 * d['cold_resident']:.0f}% of the checkpoint's pages stayed cached after "
              "the drop: its load from disk was partly from memory")
    if d:
        s0, s1 = d["durable_range"] if "durable_range" in d else d["save_range"]
        l0, l1 = d["load_cold_range"]
        print(f"- {label}: save {s0:.2f}-{s1:.2f} s, load from disk {l0:.2f}-{l1:.2f} s over its rounds")

# the project's goals: within 80% of the disk's rate, faster than Accelerate
print()
for key, label, other in [("ctrain-1", "ctrain, 1 process", "accelerate-1"),
                          ("ctrain-zero2", "ctrain, 2 ranks ZeRO-2", "accelerate-2")]:
    d = merged(key)
    if not d:
        continue
    sr, lr = d["bytes"] / d["durable_s"] / MB, d["bytes"] / d["load_cold_s"] / MB
    ok = lambda v: "met" if v >= 0.8 else "not met"
    print(f"- {label}: save at {100 * sr / w_rate:.0f}% of the disk's write rate (dd), load at "
          f"{100 * lr / r_rate:.0f}% of its read rate (dd) and {100 * d['raw_over_load']:.0f}% of a raw read of "
          f"the same files in the same round (goal >= 80%: save {ok(sr / w_rate)}, load {ok(d['raw_over_load'])} "
          f"against the raw read, {ok(lr / r_rate)} against dd)")
    o = merged(other)
    if o:
        f = lambda a, b: f"{a / b:.2f}x" if a >= b else f"{b / a:.2f}x slower"
        print(f"  against {other.replace('-', ' ')}: save on disk {f(o['durable_s'], d['durable_s'])} "
              f"({d['durable_s']:.2f} s vs {o['durable_s']:.2f} s; vs its return: {o['save_s']:.2f} s), load from "
              f"disk {f(o['load_cold_s'], d['load_cold_s'])}, load from the page cache "
              f"{f(o['load_warm_s'], d['load_warm_s'])} (goal: faster; "
              f"{'met' if d['durable_s'] < o['durable_s'] and d['load_cold_s'] < o['load_cold_s'] else 'not met'})")
EOF
cat "$report"
[ -z "$out" ] || cp "$report" "$out"
echo "run.sh: logs in $logs" >&2
