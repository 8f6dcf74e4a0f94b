#!/usr/bin/env bash
# GPT training under each sharding strategy on this machine: tokens/s, per-rank memory by
# what it holds, and bytes on the wire, DDP beside ZeRO-1, ZeRO-2, ZeRO-3 and HYBRID.
#
#   bench/strategies/run.sh [--quick] [--configs LIST] [--ranks LIST] [--precisions LIST]
#                           [--strategies LIST] [--out FILE] [--png FILE] [--timeout S]
#
# Every cell of configs x ranks x precisions x strategies runs once, as
#   ctrain launch --num_processes N --main_process_port 0 --num_cpu_threads_per_process 1 \
#       strategies --config C --precision P --strategy S [--hybrid_group N/2] ...
# (bench/strategies/strategies.c; OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1 per rank,
# OMP_WAIT_POLICY unset, CTRAIN_TRANSPORT unset: shared memory between the ranks).
#   configs     w1 (vocab 256, 4 layers, 4 heads, width 256; 3.2M parameters) and
#               wide (vocab 256, 12 layers, 12 heads, width 768; 85M parameters)
#   ranks       2 and 4
#   precisions  f32 and bf16 (DDP: autocast over f32 parameters; the sharded strategies:
#               16-bit parameters and gradients beside f32 master slices)
#   strategies  NO_SHARD (DDP), OPTIMIZER (ZeRO-1), GRAD_OP (ZeRO-2), FULL (ZeRO-3),
#               HYBRID (FULL inside groups of N/2 ranks, replicated across the 2 groups)
#   LISTs are comma-separated; default all of them.
# The sharded strategies wrap one unit per transformer Block (transformer_based_wrap)
# plus the root unit (embeddings and the final LayerNorm).
# Steps (per rank, per step: B rows of T tokens; the same random tokens and initial
# weights under every strategy):
#   w1    T 64, B 4, 2 warm-up + 10 timed steps    (--quick: 1 + 2)
#   wide  T 64, B 2, 1 warm-up + 3 timed steps     (--quick: 1 + 1)
# so that all 80 cells take about 15 minutes on 2 cores. --quick is a smoke test, not
# a measurement.
#
# Output: build/bench/strategies/results.csv (one row per cell, every figure the
# program reports), a markdown table on stdout (also written to FILE with --out), and
# build/bench/strategies/strategies.png (or --png FILE; needs gnuplot): per strategy, the
# per-rank memory split as stacked bars and tokens/s, one row of panels per config, at
# 4 ranks (or the most ranks run) and f32.
#
# Every cell is bounded by --timeout seconds (default 600, 180 with --quick), ctrain's
# collectives by CTRAIN_TIMEOUT (120 unless set). A cell that fails (a rank's error, a
# timeout) is shown in the table as failed with its rank's message and the others still
# run; a first-step loss not near ln 256 is listed under the table; either makes the
# script exit non-zero.
# Logs: build/bench/strategies/logs/.
# shellcheck source=bench/run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../run_lib.sh"

quick=0
out=""
png=""
limit=""
configs=w1,wide
ranks_list=2,4
precisions=f32,bf16
strategies=NO_SHARD,OPTIMIZER,GRAD_OP,FULL,HYBRID
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --configs) [ $# -ge 2 ] || die "--configs needs a list (w1,wide)"; configs=$2; shift ;;
    --ranks) [ $# -ge 2 ] || die "--ranks needs a list (2,4)"; ranks_list=$2; shift ;;
    --precisions) [ $# -ge 2 ] || die "--precisions needs a list (f32,bf16)"; precisions=$2; shift ;;
    --strategies) [ $# -ge 2 ] || die "--strategies needs a list (NO_SHARD,OPTIMIZER,GRAD_OP,FULL,HYBRID)"
        strategies=$2; shift ;;
    --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift ;;
    --png) [ $# -ge 2 ] || die "--png needs a file name"; png=$2; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; limit=$2; shift ;;
    -h | --help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done

# check_list OPTION ALLOWED-REGEX WHAT ITEM...: there is an item, and every one matches
check_list() {
    local opt=$1 allowed=$2 what=$3 x
    shift 3
    [ $# -gt 0 ] || die "$opt: empty list; expected $what, comma-separated"
    for x in "$@"; do [[ "$x" =~ ^($allowed)$ ]] || die "$opt: '$x' is not $what"; done
}
IFS=, read -r -a configs <<<"$configs"
IFS=, read -r -a ranks <<<"$ranks_list"
IFS=, read -r -a precisions <<<"$precisions"
IFS=, read -r -a strategies <<<"$strategies"
check_list --configs 'w1|wide' "w1 or wide" "${configs[@]}"
check_list --ranks '[1-9][0-9]*' "a positive number of ranks" "${ranks[@]}"
check_list --precisions 'f32|bf16' "f32 or bf16" "${precisions[@]}"
check_list --strategies 'NO_SHARD|OPTIMIZER|GRAD_OP|FULL|HYBRID' "NO_SHARD, OPTIMIZER, GRAD_OP, FULL or HYBRID" \
    "${strategies[@]}"
for n in "${ranks[@]}"; do
    [ "$n" -ge 2 ] || die "--ranks: $n; each rank count must be at least 2 (strategies across ranks)"
    [ $((n % 2)) -eq 0 ] || [[ " ${strategies[*]} " != *" HYBRID "* ]] ||
        die "--ranks: $n is odd; HYBRID uses groups of ranks/2 (leave it out with --strategies)"
done
[ -n "$limit" ] || limit=$([ "$quick" = 1 ] && echo 180 || echo 600)
[[ "$limit" =~ ^[1-9][0-9]*$ ]] || die "--timeout: '$limit' is not a positive number of seconds"
case "$out" in "" | /*) ;; *) out=$start_dir/$out ;; esac # relative to where it was called from
case "$png" in "" | /*) ;; *) png=$start_dir/$png ;; esac
[ -z "$out" ] || { mkdir -p "$(dirname "$out")" && : >"$out"; } || die "cannot write --out $out"
[ -n "$png" ] || png=build/bench/strategies/strategies.png
mkdir -p "$(dirname "$png")" || die "cannot make the folder of --png $png"
rm -f "$png" # no stale figure when this run draws none

# per config: tokens per row, rows per rank, warm-up and timed steps
cell_args() {
    case "$1,$quick" in
    w1,0) echo "--seq 64 --batch 4 --warmup 2 --steps 10" ;;
    w1,1) echo "--seq 64 --batch 4 --warmup 1 --steps 2" ;;
    wide,0) echo "--seq 64 --batch 2 --warmup 1 --steps 3" ;;
    wide,1) echo "--seq 64 --batch 2 --warmup 1 --steps 1" ;;
    esac
}

# ---- tools and build --------------------------------------------------------------------
for t in make timeout; do command -v "$t" >/dev/null 2>&1 || die "'$t' not found"; done
py=${PYTHON:-python3}
command -v "$py" >/dev/null 2>&1 || die "no Python at $py (install python3, or set \$PYTHON)"
ctrain=build/bin/ctrain
bin=build/bench/strategies/strategies
echo "run.sh: building $ctrain and $bin" >&2
make -s "$ctrain" "$bin" >&2 || die "make $ctrain $bin failed"
for b in "$ctrain" "$bin"; do [ -x "$b" ] || die "$b was not built"; done

dir=build/bench/strategies
logs=$dir/logs
rm -rf "$logs"
rm -f "$dir"/plot-*.dat "$dir"/plot-vars.gp
mkdir -p "$logs"
csv=$dir/results.csv
failures=$logs/failures.tsv
: >"$failures"

# the CSV's columns: the program's RESULT keys, in this order
keys=(config ranks precision strategy wrap group units seq batch steps warmup threads transport params
    tokens_per_s step_ms params_bytes grads_bytes optimizer_bytes activations_bytes step_peak_bytes
    gathered_peak_bytes peak_rss_bytes sent_bytes gathers comm_ms exposed_ms loss0 loss)
(IFS=,; echo "${keys[*]}") >"$csv"

# ---- one cell ---------------------------------------------------------------------------
# cell CONFIG RANKS PRECISION STRATEGY: runs it; appends its RESULT to $csv as a row, or
# the reason it failed (the rank's message) to $failures.
cell() {
    local config=$1 n=$2 prec=$3 strat=$4
    local name="$config-$n-$prec-$strat" extra=()
    [ "$strat" != HYBRID ] || extra=(--hybrid_group $((n / 2)))
    # shellcheck disable=SC2046 # cell_args is a list of flags
    run_logged "$name" env -u OMP_WAIT_POLICY -u CTRAIN_TRANSPORT OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        "$ctrain" launch --num_processes "$n" --main_process_port 0 --num_cpu_threads_per_process 1 \
        "$bin" --config "$config" --precision "$prec" --strategy "$strat" --threads 1 \
        $(cell_args "$config") "${extra[@]}"
    local why="" line=""
    if [ "$rc" -ne 0 ]; then
        # the first rank's message (the program's own, not the launcher's summary)
        why=$(grep -m 1 -E '^\[rank[0-9]+\] strategies' "$logs/$name.err" ||
            grep -v '^run.sh:' "$logs/$name.err" | grep -m 1 . || true)
        [ -n "$why" ] || why="exit status $rc"
        [ "$rc" -ne 124 ] || why="timed out after $limit s (--timeout)"
    else
        line=$(sed -n -e 's/^\[rank0\] //' -e '/^RESULT /p' "$logs/$name.out" | tail -n 1)
        [ -n "$line" ] || why="no RESULT line (see $logs/$name.out)"
    fi
    if [ -z "$why" ]; then
        local row
        row=$(awk -v keys="${keys[*]}" '{
                for (i = 2; i <= NF; i++) { k = substr($i, 1, index($i, "=") - 1); v[k] = substr($i, index($i, "=") + 1) }
                n = split(keys, ks, " ")
                for (i = 1; i <= n; i++) {
                    if (!(ks[i] in v)) { print "missing key " ks[i] > "/dev/stderr"; exit 1 }
                    printf "%s%s", v[ks[i]], i < n ? "," : "\n"
                }
            }' <<<"$line") || why="the RESULT line lacks a key: $line"
        [ -n "$why" ] || echo "$row" >>"$csv"
        echo "run.sh: $name: $line" >&2
    fi
    if [ -n "$why" ]; then
        printf '%s\t%s\t%s\t%s\t%s\n' "$config" "$n" "$prec" "$strat" "$why" >>"$failures"
        echo "run.sh: $name FAILED: $why (log: $logs/$name.err)" >&2
    fi
}

export CTRAIN_TIMEOUT=${CTRAIN_TIMEOUT:-120}
for config in "${configs[@]}"; do
    for n in "${ranks[@]}"; do
        for prec in "${precisions[@]}"; do
            for strat in "${strategies[@]}"; do
                cell "$config" "$n" "$prec" "$strat"
            done
        done
    done
done

# ---- report -----------------------------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
ctrain_version=$("$ctrain" --version 2>/dev/null | head -n 1) || ctrain_version="ctrain (version unknown)"
report=$logs/table.md
# exit status 3: the table is written, but a first-step loss is off
report_rc=0
"$py" - "$csv" "$failures" "$quick" "${cpu:-unknown CPU}" "$(nproc)" "$ctrain_version" "$dir" \
    >"$report" <<'EOF' || report_rc=$?
import csv, math, sys

path, failures, quick, cpu, ncpu, ctrain_v, outdir = sys.argv[1:8]
MiB = 1024.0 * 1024.0
label = {"NO_SHARD": "DDP", "OPTIMIZER": "ZeRO-1", "GRAD_OP": "ZeRO-2", "FULL": "ZeRO-3", "HYBRID": "HYBRID"}
order = list(label)
rows = list(csv.DictReader(open(path)))
failed = [line.rstrip("\n").split("\t") for line in open(failures) if line.strip()]
bad = []
for r in rows:
    if abs(float(r["loss0"]) - math.log(256)) > 0.5:
        bad.append(f"{r['config']} {r['ranks']} ranks {r['precision']} {r['strategy']}: first-step loss "
                   f"{float(r['loss0']):.4f} is not near ln 256 = {math.log(256):.3f}")

def key(r):
    return (r["config"], int(r["ranks"]), r["precision"])

ddp = {key(r): r for r in rows if r["strategy"] == "NO_SHARD"}
cells = [(r["config"], int(r["ranks"]), r["precision"], r["strategy"], r) for r in rows]
cells += [(c, int(n), p, s, why) for c, n, p, s, why in failed]
cfg_rank = {"w1": 0, "wide": 1}
cells.sort(key=lambda c: (cfg_rank.get(c[0], 9), c[1], c[2] != "f32", order.index(c[3])))

method = ("--quick (a smoke test, not a measurement)" if quick == "1" else "one run per cell")
print(f"GPT training by sharding strategy, {ncpu} CPUs ({cpu}); {ctrain_v}")
print(f"method: {method}; 1 thread per rank; tokens/s over all ranks and the timed steps; memory, sent "
      "bytes and times are per rank (the largest rank), per step")
seen = set()
for c, n, p, s, r in cells:
    if isinstance(r, dict) and c not in seen:
        seen.add(c)
        print(f"- {c}: {int(r['params']):,} parameters, {r['batch']} x {r['seq']} tokens per rank per step, "
              f"{r['warmup']} warm-up + {r['steps']} timed steps")
print()
print("| config | ranks | precision | strategy | tokens/s | vs DDP | params MiB | grads MiB | optimizer MiB "
      "| activations MiB | peak RSS MiB | MiB sent/step | comm ms/step | exposed ms/step | loss |")
print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
warn = []
for c, n, p, s, r in cells:
    group = r["group"] if isinstance(r, dict) else n // 2
    name = label[s] + (f" (G={group})" if s == "HYBRID" else f" ({s})")
    if not isinstance(r, dict):
        print(f"| {c} | {n} | {p} | {name} | failed | - | - | - | - | - | - | - | - | - | {r.replace('|', '/')} |")
        continue
    tps = float(r["tokens_per_s"])
    d = ddp.get(key(r))
    ratio = f"{tps / float(d['tokens_per_s']):.2f}" if d else "-"
    if d and p == "f32" and s != "NO_SHARD":
        rel = abs(float(r["loss"]) - float(d["loss"])) / abs(float(d["loss"]))
        if rel > 1e-4:
            warn.append(f"- {c}, {n} ranks, f32, {label[s]}: last loss {float(r['loss']):.6f} differs from DDP's "
                        f"{float(d['loss']):.6f} by {rel:.1e} relative (same tokens and weights)")
    m = lambda k: f"{float(r[k]) / MiB:.1f}"
    print(f"| {c} | {n} | {p} | {name} | {tps:.0f} | {ratio} | {m('params_bytes')} | {m('grads_bytes')} "
          f"| {m('optimizer_bytes')} | {m('activations_bytes')} | {float(r['peak_rss_bytes']) / MiB:.0f} "
          f"| {m('sent_bytes')} | {float(r['comm_ms']):.1f} | {float(r['exposed_ms']):.1f} | {float(r['loss']):.4f} |")
print()
print("params, grads, optimizer: storage kept between steps (the sharding engine's accounting; DDP: 4, 4 "
      "and 8 bytes per parameter). activations: ctrain's peak live storage during the step minus those "
      "three, so everything transient: activations, gathered parameters (ZeRO-3, HYBRID), DDP's gradient "
      "buckets, full gradients before they are reduced, bf16 weight copies. MiB sent: as ring algorithms "
      "send (all-reduce 2 (N-1)/N, reduce-scatter and all-gather (N-1)/N of the buffer). comm: collectives "
      "in flight; exposed: the part the training thread waited for. loss: the last step's, mean over ranks.")
for line in warn + [f"- {b}" for b in bad]:
    print(line)
for c, n, p, s, why in failed:
    print(f"- FAILED {c}, {n} ranks, {p}, {s}: {why}")

# the plot's data: per config, 4 ranks (or the most run) at f32 (or the first precision run)
configs = []
for c in sorted({r["config"] for r in rows}, key=lambda c: cfg_rank.get(c, 9)):
    mine = [r for r in rows if r["config"] == c]
    n = 4 if any(int(r["ranks"]) == 4 for r in mine) else max(int(r["ranks"]) for r in mine)
    precs = sorted({r["precision"] for r in mine if int(r["ranks"]) == n}, key=lambda p: p != "f32")
    with open(f"{outdir}/plot-{c}.dat", "w") as f:
        f.write("# strategy params grads optimizer activations (MiB per rank, " + precs[0] + ") tokens/s by "
                + " ".join(precs) + "\n")
        for s in order:
            by = {r["precision"]: r for r in mine if int(r["ranks"]) == n and r["strategy"] == s}
            if not by:
                continue
            r = by.get(precs[0])
            mem = ["?"] * 4 if r is None else [
                f"{max(0.0, float(r[k])) / MiB:.3f}"
                for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")]
            tps = [by[p]["tokens_per_s"] if p in by else "?" for p in precs]
            f.write(f"\"{label[s]}\" " + " ".join(mem + tps) + "\n")
    configs.append((c, n, precs))
with open(f"{outdir}/plot-vars.gp", "w") as f:
    f.write(f"n = {len(configs)}\narray cfg[{max(1, len(configs))}]\narray mem_title[{max(1, len(configs))}]\n"
            f"array tps_title[{max(1, len(configs))}]\narray precs[{max(1, len(configs))}]\n")
    for i, (c, n, precs) in enumerate(configs, 1):
        f.write(f"cfg[{i}] = '{c}'\nmem_title[{i}] = '{c}: memory per rank, {n} ranks, {precs[0]}'\n"
                f"tps_title[{i}] = '{c}: tokens/s, {n} ranks'\nprecs[{i}] = '{' '.join(precs)}'\n")
sys.exit(3 if bad else 0)
EOF
[ "$report_rc" -eq 0 ] || [ "$report_rc" -eq 3 ] || die "the report failed (see above)"
cat "$report"
[ -z "$out" ] || cp "$report" "$out"
echo "run.sh: results in $csv" >&2

if ! command -v gnuplot >/dev/null 2>&1; then
    echo "run.sh: gnuplot not found (Debian: gnuplot-nox): no $png; the CSV has the figures" >&2
elif [ "$(wc -l <"$csv")" -le 1 ]; then
    echo "run.sh: no results to plot" >&2
else
    gnuplot -e "datadir='$dir'; out='$png'" bench/strategies/plot.gp 2>"$logs/gnuplot.err" ||
        die "gnuplot failed: $(tail -n 3 "$logs/gnuplot.err")"
    echo "run.sh: wrote $png" >&2
fi
echo "run.sh: logs in $logs" >&2
status=0
if [ -s "$failures" ]; then
    echo "run.sh: $(wc -l <"$failures") cell(s) failed:" >&2
    sed 's/^/run.sh:   /' "$failures" >&2
    status=1
fi
[ "$report_rc" -eq 0 ] || { echo "run.sh: a first-step loss is not near ln 256 (see the table)" >&2; status=1; }
exit "$status"
